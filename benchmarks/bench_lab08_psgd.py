"""Lab 08's section 1 at P = 1 .. 8 workers on a machine with a core for each: the recorded runs the
lab shows beside its own live run.

    python benchmarks/bench_lab08_psgd.py --workers 1 2 4 8 --out benchmarks/results/lab08_psgd_NAME.json
    python benchmarks/bench_lab08_psgd.py --quick --out /tmp/lab08.json     # a tiny run (shape only)

The same settings as the lab's full mode (6,000 'shapes' images, the CNN without dropout, 2,000 SGD
steps of 32 samples per worker, each worker on its own shard, the same seeds for every
configuration): lr 0.1 for local SGD and one-shot; at K = 1, sqrt(P) x 0.1 (--k1-rule linear: P x 0.1)
reached by a linear warm-up from 0.1 over the first quarter of the steps (Goyal et al. 2017). Every 200 steps the test accuracy
of the average of the workers' current weights is measured (for one-shot and local SGD a copy
averaged for measurement only), outside the training time: every configuration's time to a target
is read the same way. One process per worker with one torch thread, torch.distributed (gloo) for
the averages instead of MPI (the same arithmetic: utils.parallel_sgd.average_parameters_torch).
Configurations run one after another, seed by seed, and the file is rewritten after each, so a run
cut short by --budget-s keeps what it finished. Schema 2 (settings["schema"]); files without it were
recorded with the old settings (K = 1 without warm-up, one-shot measured at the end only).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import machine  # noqa: E402
from spawn import run_world  # noqa: E402


def _worker(rank, world_size, port, settings, results):
    import datetime
    import traceback

    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        from utils import data, models, parallel_sgd

        s = settings
        shapes = data.load("shapes", train_size=s["train_size"], test_size=s["test_size"])
        k, p = s["k"], world_size
        torch.manual_seed(s["seed"])
        model = models.CNN(shapes.input_shape, dropout=0.0)
        history = parallel_sgd.local_sgd(
            model, shapes.x_train, shapes.y_train, steps=s["steps"], batch_size=s["batch"], lr=s["lr"],
            peak_lr=k1_peak(s, p) if k == "1" else s["lr"], warmup_steps=s["warmup_steps"] if k == "1" and p > 1 else 0,
            sync_every=s["steps"] if k == "one-shot" else int(k),
            average=parallel_sgd.average_parameters_torch, rank=rank, world_size=p, seed=s["seed"],
            x_test=shapes.x_test, y_test=shapes.y_test, eval_every=max(1, s["steps"] // s["evals"]))
        seconds = torch.tensor([history.wall_time, history.averaging_time], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)          # the slowest worker sets the pace
        report = dict(seconds=seconds[0].item(), averaging=seconds[1].item(), accuracy=history.test_accuracy[-1],
                      steps=history.eval_steps, accuracies=history.test_accuracy, times=history.eval_seconds)
        dist.destroy_process_group()
        results.put(("ok", rank, report))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def k1_peak(settings: dict, p: int) -> float:
    """K = 1's rate after its warm-up: sqrt(P) x lr (the lab's rule) or P x lr (linear, which ends at
    chance from P = 4 on for this CNN: lab08_psgd_linear_warmup_*.json)."""
    return settings["lr"] * (p ** 0.5 if settings["k1_rule"] == "sqrt" else p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--periods", nargs="+", default=["1", "16", "one-shot"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--budget-s", type=float, default=1800.0, help="start no configuration after this")
    parser.add_argument("--k1-rule", choices=["sqrt", "linear"], default="sqrt",
                        help="K = 1's rate: sqrt(P) x lr (the lab's) or P x lr, both after the warm-up")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    settings = dict(schema=2, train_size=6000, test_size=2000, steps=2000, evals=10, batch=32, lr=0.1, warmup_steps=500,
                    k1_rule=args.k1_rule)
    if args.quick:
        settings.update(train_size=600, test_size=200, steps=20, evals=2, warmup_steps=5)
    start, runs = time.monotonic(), []
    result = dict(benchmark="lab08_psgd", machine=machine.describe(), date=time.strftime("%Y-%m-%d"),
                  settings=settings, runs=runs, complete=False)
    plan = [(seed, p, k) for seed in args.seeds for p in args.workers for k in (args.periods if p > 1 else ["1"])]
    for seed, p, k in plan:
        if time.monotonic() - start > args.budget_s:
            break
        if p > (os.cpu_count() or 1):
            raise SystemExit(f"{p} workers on {os.cpu_count()} cores would take turns; use a larger machine")
        report = run_world(_worker, p, (dict(settings, seed=seed, k=k),), deadline_s=900)
        runs.append(dict(workers=p, period=k, seed=seed, lr=k1_peak(settings, p) if k == "1" else settings["lr"],
                         warmup_steps=settings["warmup_steps"] if k == "1" and p > 1 else 0, **report))
        print(f"seed {seed}, P = {p}, K = {k}: {report['accuracy']:.1%} in {report['seconds']:.1f} s", flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    result["complete"] = len(runs) == len(plan)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Lab 06's section 3 (scaling the CNN and the wide CNN over workers) with one process per worker, each
pinned to a core of its own: the recorded runs the lab shows beside its live run, and deck 06's figure.

    .venv/bin/python benchmarks/bench_lab06_scaling.py --workers 1 2 4 8
    .venv/bin/python benchmarks/bench_lab06_scaling.py --workers 1 2 --quick --out /tmp/s.json   # tiny (shape only)

The lab's own settings (utils.labs.lab06: global batch 64 for strong scaling, 64 per worker for weak
scaling, the CNN and the CNN with FC1 of 2048 units on 'shapes' images, full mode's 5 warm-up and 20
timed steps of each, DDP step and bare step in turns) at each k given, one k after another: k gloo
processes with one torch thread each, rank r pinned to core r, all of them in the group (no idle
engines waiting at a barrier, as the lab's live run has). Each k fits its own alpha and beta (lab 03's
sweep, 4 KiB .. 4 MiB). A k larger than the machine's cores is refused: its processes would take turns.
The file (default benchmarks/results/lab06_scaling_<cores>core.json, the machine described by
benchmarks/machine.py, with the load average as each k started) is rewritten after every k, so a run
cut short keeps what it finished. Draw deck 06's figure from it with
`.venv/bin/python benchmarks/lab_figures.py --lab06-scaling`.
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
    import functools
    import traceback

    import torch
    import torch.distributed as dist

    try:
        if hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=300))
        from utils import collectives, models
        from utils.labs import lab06

        s = settings
        alpha = beta = None
        if world_size > 1:
            sweep = collectives.sweep(dist.all_reduce, s["sweep_bytes"], repeats=s["repeats"])
            alpha, beta = collectives.fit_alpha_beta([r["n_bytes"] for r in sweep], [r["seconds"] for r in sweep],
                                                     world_size)
        shape, k = tuple(s["input_shape"]), world_size
        batches = {"strong": lambda k: s["global_batch"] // k, "weak": lambda k: s["per_rank"]}
        report = dict(workers=k, alpha=alpha, beta=beta, load_average=s["load_average"], models={})
        for name, options in s["models"].items():
            build = functools.partial(models.CNN, shape, **options)
            mine = lab06.time_scaling(build, shape, 10, batches, torch.device("cpu"), warmup=s["warmup"],
                                        repeats=s["repeats"], ks=[k])
            every = [None] * world_size
            dist.all_gather_object(every, mine)
            merged = lab06.slowest_steps(every)
            grad_bytes = [q.numel() * q.element_size() for q in reversed(list(build().parameters()))]
            report["models"][name] = dict(grad_bytes=grad_bytes, **{
                mode: dict(per_rank=batches[mode](k), ddp_steps=merged[(mode, k)]["ddp_steps"],
                           compute_steps=merged[(mode, k)]["compute_steps"],
                           same_run_as=mine[(mode, k)].get("same_run_as")) for mode in batches})
        dist.destroy_process_group()
        results.put(("ok", rank, report))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def main() -> None:
    from utils import data
    from utils.labs import lab06

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", required=True, help="the k to time, e.g. 1 2 4 8")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/lab06_scaling_<cores>core.json")
    parser.add_argument("--quick", action="store_true", help="the lab's quick-mode repeats (a shape check)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for k in args.workers:
        if k > cores:
            raise SystemExit(f"{k} workers on {cores} cores would take turns: their times would measure that; "
                             f"use a machine with {k} cores or more")
        if lab06.GLOBAL_BATCH % k:
            raise SystemExit(f"{k} workers do not divide the global batch {lab06.GLOBAL_BATCH}")
    if 1 not in args.workers:
        raise SystemExit("give 1 among the workers: every speed-up and prediction is relative to one worker")
    out = args.out or ROOT / "benchmarks" / "results" / f"lab06_scaling_{cores}core.json"
    shapes = data.load("shapes", train_size=64, test_size=16)
    settings = dict(input_shape=list(shapes.input_shape), global_batch=lab06.GLOBAL_BATCH,
                    per_rank=lab06.PER_RANK_BATCH, models=lab06.MODELS, sweep_bytes=lab06.SWEEP_BYTES,
                    warmup=2 if args.quick else 5, repeats=4 if args.quick else 20)
    runs = []
    result = dict(benchmark="lab06_scaling", machine=machine.describe(), date=time.strftime("%Y-%m-%d"),
                  settings=settings, runs=runs, complete=False)
    for k in sorted(set(args.workers)):
        load = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
        started = time.monotonic()
        report = run_world(_worker, k, (dict(settings, load_average=load),), deadline_s=900)
        runs.append(dict(report, seconds=round(time.monotonic() - started, 1)))
        rates = {name: k * m["weak"]["per_rank"] * 1e3 / sorted(m["weak"]["ddp_steps"])[len(m["weak"]["ddp_steps"]) // 2]
                 for name, m in report["models"].items()}
        print(f"k = {k} (load average {load}): weak scaling " + ", ".join(f"{n} {r:,.0f} img/s" for n, r in rates.items())
              + f" ({runs[-1]['seconds']:.0f} s)", flush=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    result["complete"] = True
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

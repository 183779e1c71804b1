"""The cost of one step of the assessment's job, per process, as the speed rule models it.

The speed rule (``assessment.criteria.modelled_seconds``) prices a run that counts at its optimizer steps times
the cost of one step at its per-rank batch: the step's compute (the CNN's forward, loss, backward and an SGD step
on one thread, at the assessment's image size and dropout) plus the all-reduce of its gradients between
``settings.WORKERS`` processes, from lab 03's alpha-beta model of the ring. This script measures both on this
machine and writes the table the rule reads, ``assessment/step_cost.json``:

- compute: for each per-rank batch, ``--rounds`` rounds of ``--steps`` timed steps (after warm-up steps), the
  batches taking turns within a round; the fastest step of each round, then the median over the rounds (the
  rule interpolates between the batches);
- communication: gloo's ``all_reduce`` between ``WORKERS`` spawned processes of one thread each, timed at message
  sizes around the gradients' size (``utils.collectives.sweep``), fitted to the ring's alpha-beta model
  (``utils.collectives.fit_alpha_beta``).

Measure on an idle machine: the table fixes every grade's time to the target until it is measured again.

    .venv/bin/python benchmarks/bench_assessment_step_cost.py [--rounds 15] [--steps 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

TABLE = ROOT / "assessment" / "step_cost.json"
PER_RANK_BATCHES = (16, 32, 64, 128, 256, 512, 1024)
MESSAGE_BYTES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)


def compute_seconds(batches, rounds: int, steps: int) -> dict:
    """{batch: seconds}: for each batch, the median over ``rounds`` of the fastest of ``steps`` timed training steps
    (one thread). The batches take turns within each round, and the order flips every round, so that a slow
    spell of the machine hits every batch alike."""
    import torch

    from assessment import settings
    from utils import data, models
    from utils.train import train_step
    dataset = data.shapes(num_samples=10 * (max(batches) // 5 + 20), seed=0, difficulty=settings.DIFFICULTY)
    steppers = {}
    for batch in batches:
        torch.manual_seed(0)
        model = models.CNN(dataset.input_shape, dropout=settings.COUNTED_RUN["dropout"])
        optimizer = torch.optim.SGD(model.parameters(), lr=settings.BASE_LR, momentum=settings.MOMENTUM)
        x, y = dataset.x_train[:batch], dataset.y_train[:batch]

        def step(model=model, optimizer=optimizer, x=x, y=y):
            train_step(model, optimizer, x, y)
        for _ in range(3):
            step()
        steppers[batch] = step
    medians = {batch: [] for batch in batches}
    for round_ in range(rounds):
        for batch in (batches if round_ % 2 == 0 else batches[::-1]):
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                steppers[batch]()
                times.append(time.perf_counter() - start)
            medians[batch].append(min(times))    # noise only ever adds time: a round's fastest step is its cost
    return {batch: statistics.median(values) for batch, values in medians.items()}


def _all_reduce_worker(rank, world_size, port, sizes, repeats, results):
    import traceback

    import torch
    import torch.distributed as dist
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        from utils import collectives
        rows = collectives.sweep(dist.all_reduce, sizes, warmup=3, repeats=repeats)
        dist.destroy_process_group()
        results.put(("ok", rank, rows))
    except Exception:  # noqa: BLE001 - reported to the parent, which stops the benchmark
        results.put(("error", rank, traceback.format_exc()))


def measure(rounds: int, steps: int, repeats: int, progress=print) -> dict:
    import torch

    import machine
    from assessment import settings
    from bench_assessment_strategies import machine_name
    from spawn import run_world
    from utils import collectives, models
    torch.set_num_threads(1)
    compute = compute_seconds(list(PER_RANK_BATCHES), rounds, steps)
    for batch, seconds in compute.items():
        progress(f"per-rank batch {batch:>5}: {seconds * 1e3:8.2f} ms per step")
    rows = run_world(_all_reduce_worker, settings.WORKERS, (list(MESSAGE_BYTES), repeats), deadline_s=600)
    alpha, beta = collectives.fit_alpha_beta([r["n_bytes"] for r in rows], [r["seconds"] for r in rows],
                                             world_size=settings.WORKERS)
    for r in rows:
        progress(f"all_reduce {r['n_bytes']:>8} bytes on {settings.WORKERS} processes: {r['seconds'] * 1e3:7.3f} ms")
    from utils import data
    shape = data.shapes(num_samples=100, seed=0, difficulty=settings.DIFFICULTY).input_shape
    grad_bytes = 4 * sum(p.numel() for p in models.CNN(shape).parameters())
    return {"machine": machine_name(), "date": datetime.date.today().isoformat(), "details": machine.describe(),
            "threads_per_process": 1, "workers": settings.WORKERS,
            "step": "the CNN's forward, cross_entropy, zero_grad, backward and SGD step with momentum, on "
                    f"{settings.DIFFICULTY} shapes, dropout {settings.COUNTED_RUN['dropout']}",
            "compute_seconds": {str(b): round(s, 6) for b, s in compute.items()},
            "all_reduce": {"backend": "gloo", "seconds": {str(r["n_bytes"]): round(r["seconds"], 7) for r in rows},
                           "alpha_s": alpha, "beta_s_per_byte": beta, "gradient_bytes": grad_bytes},
            "settings": {"rounds": rounds, "steps": steps, "all_reduce_repeats": repeats}}


def summary(report: dict) -> str:
    """The README's table (Markdown), from the step-cost table's contents."""
    ring = report["all_reduce"]
    lines = [f"{report['machine']}, {report['date']}: one thread per process; {report['step']}; all_reduce of "
             f"{ring['gradient_bytes']} bytes of gradients between {report['workers']} processes ({ring['backend']}): "
             f"alpha {ring['alpha_s'] * 1e6:.1f} us, beta {ring['beta_s_per_byte'] * 1e9:.3f} ns/byte.", "",
             "| images per process | compute per step (ms) | per image (ms) |", "|---|---|---|"]
    for batch, seconds in sorted((int(b), s) for b, s in report["compute_seconds"].items()):
        lines.append(f"| {batch} | {seconds * 1e3:.1f} | {seconds * 1e3 / batch:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and batch")
    parser.add_argument("--repeats", type=int, default=30, help="timed all_reduce calls per size")
    parser.add_argument("--json", default=str(TABLE), metavar="PATH", help=f"where to write the table ({TABLE})")
    parser.add_argument("--table", nargs="?", const=str(TABLE), metavar="PATH",
                        help="print the README's table from a step-cost file and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(summary(json.loads(Path(args.table).read_text())))
        return
    os.environ["COURSE_QUICK"] = "0"   # the full assessment's images, before assessment.settings is first imported
    report = measure(args.rounds, args.steps, args.repeats, progress=lambda line: print(line, flush=True))
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"all_reduce alpha {report['all_reduce']['alpha_s'] * 1e6:.1f} us, beta "
          f"{report['all_reduce']['beta_s_per_byte'] * 1e9:.3f} ns/byte; wrote {args.json}")


if __name__ == "__main__":
    main()

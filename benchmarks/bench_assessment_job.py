"""The assessment's run that counts, measured as the grader judges it: the real data-parallel job (the
instructor edition's script under torchrun, ``assessment.settings.WORKERS`` processes of one thread each)
at the counted run's settings (``settings.counted_run``), at seeds drawn as the grader draws them. Each
checkpoint is evaluated on fresh held-out images (``grade.accuracy_on_fresh_images``, a fresh draw per
run) and the series judged by the grader's rule (``criteria.target_held``): whether the run held the
target, and the epoch ending its first held pair (what the speed rule counts).

Strategies: ``solution`` runs the script as written; any strategy of bench_assessment_strategies.py
(``none``, ``sqrt``, ``linear``, ``half-linear``, ``lr=<rate>``, each with or without ``+warmup``) runs the
same script with its ``make_optimizer`` replaced by ``--optimizer`` (SGD with momentum, or the course's LARS
or LAMB) at that strategy's rate, stepped as the script steps its scheduler (once per optimizer step),
warm-up over ``WARMUP_EPOCHS``. ``--global-batch`` runs every strategy at another global batch than the
assessment's (the solution then takes its own rate for that batch). A strategy run with LARS or LAMB is
named ``lars:<strategy>`` in the results.

Runs go one at a time (each takes ``WORKERS`` cores). Results: benchmarks/results/assessment_job.json;
``--table`` prints the README's table from a results file.

    .venv/bin/python benchmarks/bench_assessment_job.py [--seeds 6] [--strategies solution none] [--json PATH]
    .venv/bin/python benchmarks/bench_assessment_job.py --global-batch 1024 --optimizer lars --strategies lr=32+warmup
    .venv/bin/python benchmarks/bench_assessment_job.py --quick --seeds 1 --json /tmp/q.json   # about a minute
    .venv/bin/python benchmarks/bench_assessment_job.py --table [PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "assessment_job.json"
WARMUP_EPOCHS = 2      # the "+warmup" strategies' ramp
# Runs the job script with another make_optimizer:
#   python STRATEGY_RUNNER SCRIPT STRATEGY OPTIMIZER WARMUP_EPOCHS ARGS...
STRATEGY_RUNNER = '''
import math, runpy, sys
import torch
import torch.distributed as dist
sys.path.insert(0, {benchmarks!r})
from bench_assessment_strategies import learning_rate, make_optimizer as build_optimizer
from assessment import settings

script, strategy, optimizer_name, warmup_epochs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sys.argv = [script] + sys.argv[5:]
job = runpy.run_path(script, run_name="train_job")      # its definitions; its main block is the one below


def make_optimizer(parameters, global_batch, steps_per_epoch, epochs):
    scale, warmup = global_batch // settings.BASE_BATCH, round(warmup_epochs * steps_per_epoch)
    optimizer = build_optimizer(optimizer_name, parameters, dict(base_lr=settings.BASE_LR, momentum=settings.MOMENTUM))
    rate = lambda step: learning_rate(strategy, step, settings.BASE_LR, scale, warmup) / settings.BASE_LR
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, rate)


job["train"].__globals__["make_optimizer"] = make_optimizer
args = job["parse_args"]()
rank, world_size, device = job["setup"]()
try:
    job["train"](args, rank, world_size, device)
finally:
    dist.destroy_process_group()
'''


def run_name(strategy: str, optimizer: str) -> str:
    """A strategy's name in the results: the optimizer first where it is not SGD."""
    return strategy if optimizer == "sgd" or strategy == "solution" else f"{optimizer}:{strategy}"


def one_run(strategy: str, seed: int, eval_seed: int, folder: Path, global_batch: int, optimizer: str = "sgd") -> dict:
    """One run that counts: each checkpoint's accuracy on fresh images, the grader's verdict, its time."""
    import torch

    from assessment import criteria, settings
    from assessment.grader import grade
    from utils import export

    name = run_name(strategy, optimizer)
    out = folder / f"out-{name.replace(':', '-')}-{seed}"
    options = {**settings.counted_run(seed), "global_batch": global_batch, "out": str(out)}
    arguments = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    if strategy == "solution":
        program = [str(folder / settings.JOB_FILE), *arguments]
    else:
        program = [str(folder / "strategy_job.py"), str(folder / settings.JOB_FILE), strategy, optimizer,
                   str(WARMUP_EPOCHS), *arguments]
    start = time.perf_counter()
    result = export.run(program, settings.WORKERS, cwd=str(folder), threads=1, timeout=4 * 3600,
                        env={"PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - start
    if result.code != 0:
        raise RuntimeError(f"{strategy} seed {seed}: the job exited with {result.code}:\n{result.output[-3000:]}")
    accuracy = []
    for epoch in range(1, settings.EPOCHS + 1):
        state = torch.load(out / settings.checkpoint_name(epoch), map_location="cpu", weights_only=True)
        accuracy.append(round(grade.accuracy_on_fresh_images(state, eval_seed), 4))
    first, _ = criteria.target_held(accuracy, settings.TARGET, settings.FLOOR)
    return dict(strategy=name, seed=seed, eval_seed=eval_seed, accuracy=accuracy, first=first,
                seconds=round(seconds, 1))


def summary(runs: list[dict]) -> dict:
    runs = sorted(runs, key=lambda r: r["seed"])
    return dict(seeds=len(runs), passed=sum(r["first"] is not None for r in runs),
                final=[r["accuracy"][-1] for r in runs], curves=[r["accuracy"] for r in runs],
                held_by_epoch=[None if r["first"] is None else r["first"] + 1 for r in runs],
                seconds=[r["seconds"] for r in runs], seed_list=[r["seed"] for r in runs],
                eval_seeds=[r["eval_seed"] for r in runs])


def measure(strategies: list[str], seeds: list[int], progress=print, global_batch: int | None = None,
            optimizer: str = "sgd") -> dict:
    import nbformat

    import machine
    from assessment import settings
    from assessment.grader import grade
    from assessment.grader.submission import INSTRUCTOR
    from bench_assessment_strategies import machine_name

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-assessment-job-") as work:
        folder = Path(work)
        (folder / settings.JOB_FILE).write_text(grade.job_script(nbformat.read(INSTRUCTOR, as_version=4)))
        (folder / "strategy_job.py").write_text(STRATEGY_RUNNER.format(benchmarks=str(ROOT / "benchmarks")))
        start = time.perf_counter()
        global_batch = global_batch or settings.GLOBAL_BATCH
        for seed in seeds:
            for strategy in strategies:
                run = one_run(strategy, seed, secrets.randbelow(2**31), folder, global_batch, optimizer)
                runs.append(run)
                progress(f"{run['strategy']:>14} seed {seed}: accuracy per epoch {' '.join(f'{a:.3f}' for a in run['accuracy'])}"
                         f"  held by epoch {run['first'] + 1 if run['first'] is not None else '-'}  {run['seconds']:.0f} s")
        wall = time.perf_counter() - start
    return {"machine": machine_name(), "date": datetime.date.today().isoformat(), "target": settings.TARGET,
            "floor": settings.FLOOR,
            "rule": "criteria.target_held on the checkpoints' accuracy on fresh held-out images (the grader's "
                    "evaluation); held_by_epoch: the epoch that ends the first held pair (the speed rule's count)",
            "settings": dict(settings.counted_run(0), global_batch=global_batch, seed="drawn per run",
                             workers=settings.WORKERS,
                             threads_per_process=1, eval_size=settings.EVAL_SIZE, warmup_epochs=WARMUP_EPOCHS,
                             quick=os.environ.get("COURSE_QUICK") == "1", job="the instructor edition's script "
                             "(assessment.ipynb), real torchrun processes"),
            "strategies": {name: summary([r for r in runs if r["strategy"] == name])
                           for name in (run_name(s, optimizer) for s in strategies)},
            "wall_s": round(wall, 1), "details": machine.describe()}


def table(report: dict) -> str:
    """The README's table (Markdown), from a results file's contents."""
    s = report["settings"]
    lines = [f"{report['machine']}, {report['date']}: the real {s['workers']}-process job, global batch "
             f"{s['global_batch']}, {s['epochs']} epochs of {s['train_size']} {s['difficulty']} images; target "
             f"{report['target']:.2f} at two checkpoints in a row and the last at {report['floor']:.2f} or above, on "
             f"{s['eval_size']} fresh images; seeds drawn; {report['wall_s'] / 60:.1f} min in all.", "",
             "| strategy | held the target | held by epoch, per seed | final accuracy per seed |", "|---|---|---|---|"]
    for name, r in report["strategies"].items():
        epochs = ", ".join("-" if e is None else str(e) for e in r["held_by_epoch"])
        lines.append(f"| {name} | {r['passed']} / {r['seeds']} | {epochs} | {', '.join(f'{a:.3f}' for a in r['final'])} |")
    return "\n".join(lines)


def times_to_target(report: dict, name: str) -> list[float | None]:
    """Each recorded seed's modelled time to the target (``criteria.modelled_seconds`` of the optimizer steps up to
    its first held pair, at its batch per process), or None where it did not hold the target: the speed rule's
    measure, with the step-cost table the grader uses now."""
    from assessment import criteria
    s = report["settings"]
    batch, workers = s["global_batch"], s["workers"]
    return [None if end is None else
            criteria.modelled_seconds(criteria.steps_to_target(end - 1, batch, s["train_size"], workers), batch // workers)
            for end in report["strategies"][name]["held_by_epoch"]]


def peak_rate(name: str, global_batch: int) -> float:
    """The learning rate a recorded strategy reaches after its warm-up, at ``global_batch``."""
    from assessment import settings
    from bench_assessment_strategies import learning_rate
    return learning_rate(name.split(":", 1)[-1], 10**9, settings.BASE_LR, global_batch // settings.BASE_BATCH, 1)


def choices(reports: list[dict]) -> str:
    """The README's comparison of the learner's choices (Markdown): per global batch and strategy, the seeds that
    held the target and the modelled time to it; then, per batch, the fastest strategy that held it at every seed."""
    lines = ["| global batch | strategy | peak lr | held the target | modelled time to the target per seed (s) | median (s) |",
             "|---|---|---|---|---|---|"]
    best = {}
    for report in sorted(reports, key=lambda r: r["settings"]["global_batch"]):
        batch = report["settings"]["global_batch"]
        for name, r in report["strategies"].items():
            times = times_to_target(report, name)
            held = sorted(t for t in times if t is not None)
            median = statistics.median(held) if held else None
            lines.append(f"| {batch} | {name} | {peak_rate(name, batch):g} | {r['passed']} / {r['seeds']} | "
                         f"{', '.join('-' if t is None else f'{t:.0f}' for t in times)} | "
                         f"{'-' if median is None else f'{median:.0f}'} |")
            if r["passed"] == r["seeds"] and (batch not in best or median < best[batch][1]):
                best[batch] = (name, median)
    lines.append("")
    if best:
        fastest = min(best, key=lambda b: best[b][1])
        batches = [r["settings"]["global_batch"] for r in reports]
        where = ("the smallest batch recorded" if fastest == min(batches) else "the largest batch recorded"
                 if fastest == max(batches) else "neither the smallest nor the largest batch recorded")
        lines.append("Held at every recorded seed, the fastest per batch: " + "; ".join(
            f"{b}: {name} ({seconds:.0f} s)" for b, (name, seconds) in sorted(best.items())) +
            f". Fastest of all: {fastest}, {best[fastest][0]}, {where}.")
    else:
        lines.append("No strategy held the target at every recorded seed.")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick-mode run (3 short epochs): checks the code")
    parser.add_argument("--seeds", type=int, default=6, help="seeds drawn (default 6)")
    parser.add_argument("--seed-list", type=int, nargs="+", metavar="SEED", help="these seeds instead of drawn ones")
    parser.add_argument("--strategies", nargs="+", default=["solution"], metavar="NAME",
                        help="solution (the default) and any of bench_assessment_strategies.py's")
    parser.add_argument("--global-batch", type=int, metavar="N", help="the global batch (default: the assessment's)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "lars", "lamb"),
                        help="the optimizer of every strategy but the solution (default sgd)")
    parser.add_argument("--json", metavar="PATH", help=f"where to write the results (full mode: {RESULTS})")
    parser.add_argument("--table", nargs="?", const=str(RESULTS), metavar="PATH",
                        help="print the README's table from a results file and exit")
    parser.add_argument("--choices", nargs="+", metavar="PATH",
                        help="print the README's comparison of global batches from results files and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    if args.choices:
        os.environ["COURSE_QUICK"] = "0"
        print(choices([json.loads(Path(path).read_text()) for path in args.choices]))
        return
    os.environ["COURSE_QUICK"] = "1" if args.quick else "0"   # before assessment.settings is first imported
    from bench_assessment_strategies import learning_rate
    for name in args.strategies:
        if name != "solution":
            learning_rate(name, 0, 1.0, 1, 1)  # an unknown name fails here, before any run
    seeds = args.seed_list or [secrets.randbelow(2**31) for _ in range(args.seeds)]
    report = measure(args.strategies, seeds, progress=lambda line: print(line, flush=True),
                     global_batch=args.global_batch, optimizer=args.optimizer)
    print(table(report))
    path = args.json or (None if args.quick else str(RESULTS))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

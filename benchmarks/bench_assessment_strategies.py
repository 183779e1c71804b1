"""The assessment's learning-rate decision, measured: each strategy for a large global batch,
over seeds, on the hard shapes set (issue 22).

One process simulates the data-parallel job: a step on a global batch of B images is what DDP's
averaged gradients give on B / world_size images per rank, so the learning-rate question does
not need the ranks. Every run trains the assessment's model (``utils.models.CNN``, 43k
parameters) with SGD, momentum ``assessment.settings.MOMENTUM``, for the same epochs on the same
images (``utils.data.shapes(difficulty="hard")``, data seed 0); a seed sets the initial weights
and the order of the batches. The strategies differ only in the learning rate at global batch
``SCALE * BASE_BATCH``:

- ``none``: the baseline's ``BASE_LR``, unchanged;
- ``sqrt``: ``BASE_LR * sqrt(SCALE)`` (square-root scaling);
- ``linear``: ``BASE_LR * SCALE`` from the first step (linear scaling, Goyal et al., 2017);
- ``linear+warmup``: ``BASE_LR * SCALE`` reached by a linear ramp over the first warm-up steps;
- ``solution`` (only with ``--strategies``): the instructor edition's own ``make_optimizer``
  (assessment/assessment.ipynb), run as written, its scheduler stepped after every optimizer step as
  the notebook's ``train`` does. Its rates are those of ``sqrt`` at every step (a test checks it), so
  the ``sqrt`` rows are the solution's measurements in this one-process simulation (the real job's, at
  drawn seeds: bench_assessment_job.py).

The learning rate stays constant after that, as the assessment's baseline keeps its own, so the
only difference between ``linear`` and ``linear+warmup`` is the warm-up. The baseline itself (one
process, ``BASE_BATCH``, ``BASE_LR``) runs too, to show that the target is within its reach.
A run reaches the target when the test accuracy, evaluated after every epoch, is at or above it
at two evaluations in a row (the rule of the NVIDIA course's assessment, where training may stop
there); the results also count the runs that hold it at the last two evaluations, which is what a
grader of the final saved model sees. A run whose loss stops being finite is stopped and counted as
diverged (its accuracy is then its last evaluation's, chance or near it).

Runs go to ``--jobs`` worker processes (default: one per core), one torch thread each; every
worker draws the images itself once. Results: benchmarks/results/assessment_strategies.json,
and ``--table`` prints the README's table from that file.

    .venv/bin/python benchmarks/bench_assessment_strategies.py [--seeds 3] [--jobs N] [--json PATH]
    .venv/bin/python benchmarks/bench_assessment_strategies.py --quick --json /tmp/q.json   # well under a minute
    .venv/bin/python benchmarks/bench_assessment_strategies.py --table [PATH]
    # fresh seeds, another strategy: the README's second table
    .venv/bin/python benchmarks/bench_assessment_strategies.py --first-seed 3 --baseline-seeds 0 \
        --strategies none sqrt linear linear+warmup half-linear --json benchmarks/results/assessment_strategies_seeds3-5.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "assessment_strategies.json"
STRATEGIES = ("none", "sqrt", "linear", "linear+warmup")
# The peak learning rate's factor over BASE_LR, for a batch SCALE times the baseline's; a name
# "<scaling>+warmup" ramps up to it. "half-linear" is not in the default set: --strategies adds it.
SCALINGS = {"none": lambda scale: 1.0, "sqrt": math.sqrt, "linear": float, "half-linear": lambda scale: scale / 2}

# The full run's settings, chosen on the 2-core machine (benchmarks/README.md says how).
FULL = dict(difficulty="hard", train_size=9600, test_size=2400, scale=16, epochs=20, warmup_epochs=6,
            target=0.60, seeds=3, baseline_seeds=1)
# Quick mode: the same code on a few hundred images; its outcomes mean nothing.
QUICK = dict(difficulty="hard", train_size=640, test_size=200, scale=4, epochs=3, warmup_epochs=1,
             target=0.15, seeds=3, baseline_seeds=1)


def learning_rate(strategy: str, step: int, base_lr: float, scale: int, warmup_steps: int) -> float:
    """The learning rate of ``strategy`` at optimizer step ``step`` (0 = the first)."""
    if strategy == "baseline":
        return base_lr
    if strategy == "solution":   # its peak: the rate the notebook's optimizer is built with
        import torch

        from assessment import settings
        weight = torch.zeros(1, requires_grad=True)
        return solution_optimizer([weight], settings.BASE_BATCH * scale, 1, 1)[0].defaults["lr"]
    scaling, warmup = strategy.removesuffix("+warmup"), strategy.endswith("+warmup")
    if scaling.startswith("lr="):          # a peak rate given as it is (for LARS and LAMB, whose rates mean otherwise)
        ramp = min(1.0, (step + 1) / max(1, warmup_steps)) if warmup else 1.0
        return float(scaling.removeprefix("lr=")) * ramp
    if scaling not in SCALINGS:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(SCALINGS)}, each with or "
                         f"without '+warmup'")
    ramp = min(1.0, (step + 1) / max(1, warmup_steps)) if warmup else 1.0
    return base_lr * SCALINGS[scaling](scale) * ramp


def solution_optimizer(parameters, global_batch: int, steps_per_epoch: int, epochs: int):
    """The instructor edition's ``make_optimizer``, taken from the notebook's job script and run as written."""
    import nbformat

    from assessment.grader import grade
    script = grade.job_script(nbformat.read(ROOT / "assessment" / "assessment.ipynb", as_version=4))
    names = {"__name__": "train_job"}                     # the script's definitions, not its main block
    exec(compile(script, "assessment.ipynb:train_job.py", "exec"), names)
    return names["make_optimizer"](parameters, global_batch, steps_per_epoch, epochs)


def reached(accuracies: list[float], target: float) -> bool:
    """At or above ``target`` at two evaluations in a row (the issue's rule: training may stop there)."""
    return any(a >= target and b >= target for a, b in zip(accuracies, accuracies[1:]))


def held(accuracies: list[float], target: float) -> bool:
    """At or above ``target`` at the last two evaluations: what a grader of the final model sees."""
    return len(accuracies) >= 2 and min(accuracies[-2:]) >= target


_DATA = None  # each worker's images, drawn once by _load


def _load(settings: dict) -> None:
    import torch

    from utils import data

    global _DATA
    torch.set_num_threads(1)
    total = settings["train_size"] + settings["test_size"]
    _DATA = data.shapes(total, test_fraction=settings["test_size"] / total, seed=settings["data_seed"],
                        difficulty=settings["difficulty"])


OPTIMIZERS = {"sgd": "SGD with momentum", "lars": "utils.optim.LARS with momentum (trust coefficient 0.001)",
              "lamb": "utils.optim.LAMB"}


def make_optimizer(name: str, parameters, settings: dict):
    """SGD with the assessment's momentum, or the course's LARS or LAMB (utils.optim, lab 07) with their defaults;
    every step's rate is set from the strategy."""
    import torch

    from utils import optim
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=settings["base_lr"], momentum=settings["momentum"])
    if name == "lars":
        return optim.LARS(parameters, lr=settings["base_lr"], momentum=settings["momentum"])
    if name == "lamb":
        return optim.LAMB(parameters, lr=settings["base_lr"])
    raise ValueError(f"unknown optimizer {name!r}: sgd, lars or lamb")


def train_run(strategy: str, seed: int, settings: dict) -> dict:
    """One run: per-epoch test accuracy and train loss, its time, and whether it diverged."""
    import torch

    from utils import models
    from utils.train import train_step

    d = _DATA
    batch = settings["base_batch"] if strategy == "baseline" else settings["global_batch"]
    scale = batch // settings["base_batch"]
    steps_per_epoch = len(d.y_train) // batch
    warmup_steps = round(settings["warmup_epochs"] * steps_per_epoch)
    torch.manual_seed(seed)
    model = models.CNN(d.input_shape)
    optimizer = make_optimizer(settings.get("optimizer", "sgd"), model.parameters(), settings)
    schedule = None
    if strategy == "solution":
        optimizer, schedule = solution_optimizer(model.parameters(), batch, steps_per_epoch, settings["epochs"])
    generator = torch.Generator().manual_seed(seed)
    accuracy, train_loss, diverged, step = [], [], False, 0
    start = time.perf_counter()
    for epoch in range(settings["epochs"]):
        model.train()
        order = torch.randperm(len(d.y_train), generator=generator)
        total = torch.zeros(())
        for i in range(steps_per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            if schedule is None:
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(strategy, step, settings["base_lr"], scale, warmup_steps)
            loss = train_step(model, optimizer, d.x_train[idx], d.y_train[idx])
            if schedule is not None:
                schedule.step()
            total += loss.detach()
            step += 1
        train_loss.append(float(total) / steps_per_epoch)
        model.eval()
        with torch.no_grad():
            accuracy.append(round((model(d.x_test).argmax(1) == d.y_test).float().mean().item(), 4))
        if not math.isfinite(train_loss[-1]):
            diverged = True
            break
    seconds = time.perf_counter() - start
    # A diverged run keeps its last accuracy for the epochs it did not train.
    accuracy += accuracy[-1:] * (settings["epochs"] - len(accuracy))
    return dict(strategy=strategy, seed=seed, accuracy=accuracy, train_loss=train_loss, diverged=diverged,
                seconds=round(seconds, 1), steps=step)


def _run(task):
    return train_run(*task)


def machine_name() -> str:
    """``lscpu``'s model name and the core count, e.g. "AMD EPYC, 2 cores"."""
    model = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                     None)
    except (OSError, subprocess.SubprocessError):
        pass
    if not model:
        import machine

        model = machine.cpu_model()
    return f"{model}, {os.cpu_count()} cores"


def summary(runs: list[dict], target: float, lr: float) -> dict:
    runs = sorted(runs, key=lambda r: r["seed"])
    return dict(lr=round(lr, 6), seeds=len(runs), passed=sum(reached(r["accuracy"], target) for r in runs),
                held_at_end=sum(held(r["accuracy"], target) for r in runs),
                final=[r["accuracy"][-1] for r in runs], best=[max(r["accuracy"]) for r in runs],
                diverged=sum(r["diverged"] for r in runs), seconds=[r["seconds"] for r in runs],
                curves=[r["accuracy"] for r in runs])


def measure(options: dict, jobs: int, progress=print, strategies=STRATEGIES, first_seed: int = 0) -> dict:
    from assessment import settings as assessment

    settings = dict(options)
    seeds, baseline_seeds = settings.pop("seeds"), settings.pop("baseline_seeds")
    target = settings.pop("target")
    settings.update(base_batch=assessment.BASE_BATCH, base_lr=assessment.BASE_LR, momentum=assessment.MOMENTUM,
                    data_seed=0)
    settings["global_batch"] = settings["scale"] * settings["base_batch"]
    settings["steps_per_epoch"] = settings["train_size"] // settings["global_batch"]
    settings["warmup_steps"] = round(settings["warmup_epochs"] * settings["steps_per_epoch"])
    # The slowest runs (batch 32) first, so that no worker is left alone with one at the end.
    seed_list = list(range(first_seed, first_seed + seeds))
    tasks = [("baseline", seed, settings) for seed in seed_list[:baseline_seeds]]
    tasks += [(strategy, seed, settings) for seed in seed_list for strategy in strategies]
    start = time.perf_counter()
    runs = []
    context = multiprocessing.get_context("spawn")  # no fork of a process with torch's threads running
    with context.Pool(jobs, initializer=_load, initargs=(settings,)) as pool:
        for run in pool.imap_unordered(_run, tasks):
            runs.append(run)
            progress(f"{run['strategy']:>14} seed {run['seed']}: accuracy per epoch "
                     f"{' '.join(f'{a:.3f}' for a in run['accuracy'])}{'  DIVERGED' if run['diverged'] else ''}  "
                     f"{run['seconds']:.0f} s")
    wall = time.perf_counter() - start
    lr_of = lambda name: learning_rate(name, 10**9, settings["base_lr"], settings["scale"], 1)
    import machine

    return {"machine": machine_name(), "date": datetime.date.today().isoformat(), "target": target,
            "rule": "passed: test accuracy at or above the target at two per-epoch evaluations in a row; "
                    "held_at_end: at the last two",
            "settings": dict(settings, seeds=seed_list, jobs=jobs, threads_per_run=1,
                             model="utils.models.CNN", optimizer=OPTIMIZERS[settings.get("optimizer", "sgd")] + ", constant lr after warm-up"),
            "strategies": {name: summary([r for r in runs if r["strategy"] == name], target, lr_of(name))
                           for name in strategies},
            "baseline": summary([r for r in runs if r["strategy"] == "baseline"], target, settings["base_lr"]),
            "wall_s": round(wall, 1), "details": machine.describe()}


def table(report: dict) -> str:
    """The README's table (Markdown), from a results file's contents."""
    s = report["settings"]
    lines = [f"{report['machine']}, {report['date']}: hard shapes ({s['train_size']} train / {s['test_size']} test), "
             f"global batch {s['global_batch']} ({s['scale']}x the baseline's {s['base_batch']}), {s['epochs']} epochs "
             f"({s['steps_per_epoch']} steps each), warm-up {s['warmup_steps']} steps; target {report['target']:.2f} "
             f"at two evaluations in a row; seeds {s['seeds'][0]}-{s['seeds'][-1]}; "
             + ("" if s.get("optimizer", "SGD").startswith("SGD") else f"optimizer {s['optimizer']}; ") +
             f"{report['wall_s'] / 60:.1f} min in all on {s['jobs']} worker(s).", "",
             "| strategy | lr | reached the target | held at the end | diverged | final accuracy per seed "
             "| best per seed |",
             "|---|---|---|---|---|---|---|"]
    rows = [(name, report["strategies"][name]) for name in report["strategies"]]
    if report["baseline"]["seeds"]:
        rows.append((f"baseline (batch {s['base_batch']})", report["baseline"]))
    for name, r in rows:
        fmt = lambda values: ", ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {name} | {r['lr']:g} | {r['passed']} / {r['seeds']} | {r['held_at_end']} / {r['seeds']} "
                     f"| {r['diverged']} | {fmt(r['final'])} | {fmt(r['best'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred images: checks the code, not the design")
    parser.add_argument("--seeds", type=int, help="seeds per strategy (full: 3)")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--scale", type=int, help="the global batch over the baseline's (full: 16)")
    parser.add_argument("--optimizer", choices=("sgd", "lars", "lamb"), help="default sgd (with momentum)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, first-seed + 1, ... (default 0)")
    parser.add_argument("--baseline-seeds", type=int, help="seeds of the batch-32 baseline (full: 1; 0: none)")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), metavar="NAME",
                        help=f"default: {' '.join(STRATEGIES)}; also half-linear, lr=<peak rate>, any of them with "
                             f"+warmup, and solution (the instructor edition's make_optimizer)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="worker processes (default: the cores)")
    parser.add_argument("--json", metavar="PATH", help=f"where to write the results (full mode: {RESULTS})")
    parser.add_argument("--table", nargs="?", const=str(RESULTS), metavar="PATH",
                        help="print the README's table from a results file and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    options = dict(QUICK if args.quick else FULL)
    for name in ("seeds", "epochs", "baseline_seeds", "scale", "optimizer"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    path = args.json or (None if args.quick else str(RESULTS))
    print(f"{machine_name()}; {options}; {args.jobs} worker(s)", flush=True)
    for name in args.strategies:
        learning_rate(name, 0, 1.0, 1, 1)  # an unknown name fails here, before any run
    report = measure(options, args.jobs, progress=lambda line: print(line, flush=True), strategies=args.strategies,
                     first_seed=args.first_seed)
    report["settings"]["quick"] = args.quick
    print(table(report))
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

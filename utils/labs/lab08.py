"""Lab 08's figures and printed verdicts: model averaging and local SGD against one worker (section 1),
the same sweep recorded on larger machines, and every method of the lab side by side (section 5).

A run is the dict a worker of the lab's sweep returns: ``steps``, ``accuracies`` and ``times`` (its
measurements during training, evaluation time left out), ``accuracy`` (final), ``seconds`` (training),
``averaging`` (seconds of it spent averaging), ``lr``, ``warmup`` and, for one-shot averaging,
``workers`` (each worker's own accuracy before the average). Every comparison is printed through
``utils.outcomes``, so a sentence never says more than the seeds' spread allows.
"""
from __future__ import annotations

import json
import platform

import numpy as np

from utils import outcomes
from utils.config import COURSE_ROOT

SAYS = {"higher": "higher, beyond the seeds' spread", "lower": "lower, beyond the seeds' spread",
        "within the spread": "within the seeds' spread: no difference shown", "not judged": "one seed: not judged"}


def averaging_runs(psgd: dict, seeds):
    """``runs(p, k)``: the runs of P = p workers averaging every k steps, one per seed (P = 1: the
    baseline), from the sweep's ``{(p, str(k), seed): run}``."""
    def runs(p, k):
        return [psgd[(p, str(k) if p > 1 else "1", seed)] for seed in seeds]
    return runs


def final_accuracies(runs) -> list[float]:
    return [r["accuracy"] for r in runs]


def accuracy_at(run, step) -> float:
    return run["accuracies"][int(np.argmin([abs(s - step) for s in run["steps"]]))]


def seconds_to(run, target) -> float | None:
    """Training seconds until the first measurement at or above ``target`` (None: never)."""
    return next((t for t, a in zip(run["times"], run["accuracies"]) if a >= target), None)


def measurement_interval(run) -> float:
    """The mean training time between two measurements: the finest time this run can show."""
    return float(np.mean(np.diff([0.0] + list(run["times"]))))


def spread_text(values) -> str:
    mean, spread = outcomes.mean_spread(values)
    return f"{mean:.1%} +- {spread:.1%}" if len(values) > 1 else f"{mean:.1%} (one seed)"


def report_baseline(base, steps: int, seeds) -> float:
    """Print the P = 1 baseline at half, three quarters and all of its steps, and whether it still rose
    over its last quarter; return the target the times are measured to (90% of its final accuracy)."""
    base_acc, _ = outcomes.mean_spread(final_accuracies(base))
    target = 0.9 * base_acc
    print(f"P = 1 baseline: {np.mean([accuracy_at(r, steps // 2) for r in base]):.1%} at step {steps // 2}, "
          f"{np.mean([accuracy_at(r, 3 * steps // 4) for r in base]):.1%} at step {3 * steps // 4}, "
          f"{spread_text(final_accuracies(base))} at step {steps} (mean +- half-range over seeds {seeds}); "
          f"target for the times below: 90% of it, {target:.1%}")
    plateau = outcomes.compare("baseline at the last step", final_accuracies(base), f"at step {3 * steps // 4}",
                               [accuracy_at(r, 3 * steps // 4) for r in base], percent=True)
    print("over its last quarter of steps the baseline's accuracy: " + {
        "not judged": "one seed, so its plateau is not judged",
        "within the spread": "no change beyond the seeds' spread, so no gain is visible at this length",
        "higher": "rose beyond the seeds' spread: it is still rising, and the methods below are compared before its plateau",
        "lower": "fell beyond the seeds' spread"}[plateau])
    return target


def plot_averaging(runs, p_list, k_list, steps: int, seeds, target: float):
    """Accuracy against steps and against training time (the first seed), and final accuracy against P."""
    import matplotlib.pyplot as plt

    p_max = max(p_list)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    baseline = runs(1, 1)[0]
    axes[0].plot(baseline["steps"], baseline["accuracies"], "k.-", label="P = 1 (baseline)")
    axes[1].plot(baseline["times"], baseline["accuracies"], "k.-", label="P = 1 (baseline)")
    for k in k_list:
        run = runs(p_max, k)[0]
        axes[0].plot(run["steps"], run["accuracies"], "o-", label=f"P = {p_max}, K = {k}")
        axes[1].plot(run["times"], run["accuracies"], "o-", label=f"P = {p_max}, K = {k}")
        by_p = [final_accuracies(runs(p, k)) for p in p_list]
        axes[2].errorbar(p_list, [np.mean(f) for f in by_p], yerr=[outcomes.mean_spread(f)[1] for f in by_p],
                         fmt="o-", capsize=3, label=f"K = {k}")
    axes[1].axhline(target, color="gray", ls=":", label=f"target {target:.0%}")
    for ax, (xlabel, title) in zip(axes, (("SGD steps per worker", f"seed {seeds[0]}"),
                                          ("training time (s)", f"seed {seeds[0]}"),
                                          ("workers P", f"after {steps} steps per worker, mean and range over seeds"))):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    axes[2].set_xticks(p_list)
    fig.tight_layout()
    return fig


def report_averaging(runs, p_list, k_list, lr: float, target: float, n_classes: int, test_size: int,
                     times_compared: bool, real_cores: int) -> None:
    """One line per (P, K): accuracy against P = 1, training and averaging time, time to the target; for
    K = 1 each seed's accuracy against chance; then whether the times are claims on this machine."""
    base = runs(1, 1)
    base_time = np.mean([seconds_to(r, target) or np.nan for r in base])
    for p in p_list[1:]:
        for k in k_list:
            rs = runs(p, k)
            said = outcomes.compare(f"P = {p}, K = {k}", final_accuracies(rs), "P = 1", final_accuracies(base),
                                    percent=True)
            reach = [seconds_to(r, target) for r in rs]
            when = (f"target after {np.mean(reach):.1f} s (baseline {base_time:.1f} s)"
                    if all(t is not None for t in reach) else "target not reached by every seed")
            rate = (f"lr {lr} rising to {rs[0]['lr']:g} over {rs[0]['warmup']} steps" if rs[0]["warmup"]
                    else f"lr {rs[0]['lr']:g}")
            print(f"P = {p}, K = {k!s:>8} ({rate}): accuracy {spread_text(final_accuracies(rs))} against P = 1: "
                  f"{SAYS[said]}; {np.mean([r['seconds'] for r in rs]):.1f} s of training "
                  f"({np.mean([r['seconds'] for r in base]):.1f} s at P = 1), "
                  f"averaging {np.mean([r['averaging'] / r['seconds'] for r in rs]):.0%} of it; {when}; "
                  f"measured every {np.mean([measurement_interval(r) for r in rs]):.1f} s")
            if k == 1:
                print(f"   K = 1 at P = {p}, seed by seed: " + "; ".join(
                    outcomes.accuracy_verdict(a, n_classes, test_size) for a in final_accuracies(rs)))
    if not times_compared:
        print(f"(the {max(p_list)} workers took turns on {real_cores} cores: these times measure the turns, "
              f"not the methods)")


def report_one_shot(shots, p: int, seeds) -> None:
    """One-shot averaging: the average against its best worker alone, seed by seed."""
    said = outcomes.compare("one-shot average", final_accuracies(shots), "its best worker alone",
                            [max(r["workers"]) for r in shots], percent=True)
    print(f"one-shot, P = {p}: the average scored " + ", ".join(
        f"{r['accuracy']:.1%} (its workers alone {min(r['workers']):.1%}-{max(r['workers']):.1%})" for r in shots)
        + f" over seeds {seeds}; against its best worker: {SAYS[said]}")


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def show_runs(by_pk: dict, steps: int, n_classes: int) -> None:
    """One line per K: for each P, the final accuracy of each seed and the mean training time."""
    for k in ("1", "16", "one-shot"):
        cells = []
        for p in sorted({p for p, _ in by_pk}):
            rs = by_pk.get((p, "1" if p == 1 else k), [])
            if rs:
                cells.append(f"P = {p} (lr {rs[0]['lr']:g}" + (f", warm-up {rs[0]['warmup']}" if rs[0].get("warmup") else "")
                             + ") " + ", ".join(f"{r['accuracy']:.1%}" + (" (chance)" if r["accuracy"] < 1.5 / n_classes else "")
                                                for r in rs) + f" in {np.mean([r['seconds'] for r in rs]):.0f} s")
        if len(cells) > 1:
            print(f"  K = {k:>8}: " + "; ".join(cells))
    print(f"  ({steps} steps per worker; one accuracy per seed)")


def show_live_and_recorded(psgd: dict, steps: int, n_classes: int, machine: str, folder=None) -> None:
    """This machine's sweep next to every recording of benchmarks/bench_lab08_psgd.py (``folder``:
    benchmarks/results), each with its machine and settings."""
    live = {}
    for (p, k, seed), r in sorted(psgd.items(), key=lambda item: (item[0][0], item[0][2])):
        live.setdefault((p, k), []).append(r)
    print(f"live, this machine: {machine}")
    show_runs(live, steps, n_classes)
    recorded = sorted((folder or COURSE_ROOT / "benchmarks" / "results").glob("lab08_psgd_*.json"))
    for path in recorded:
        record = json.loads(path.read_text())
        machine, done, settings = record["machine"], record["runs"], record["settings"]
        old = settings.get("schema", 1) < 2
        print(f"recorded, {path.name}: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}, {record['date']}; "
              f"seed(s) {sorted({r['seed'] for r in done})}"
              + ("" if record["complete"] else "; the run stopped before its last configurations")
              + ("\n  recorded with the OLD settings: K = 1 at P x lr without warm-up, one-shot measured at the end only"
                 if old else f"; K = 1 at {settings.get('k1_rule', 'linear')} scaling, warmed up over {settings['warmup_steps']} steps"))
        if record.get("note"):
            print(f"  note: {record['note']}")
        by_pk = {}
        for r in done:
            by_pk.setdefault((r["workers"], r["period"]), []).append(dict(r, warmup=r.get("warmup_steps", 0)))
        show_runs(by_pk, settings["steps"], n_classes)
    if not recorded:
        print("No recorded runs: `python benchmarks/bench_lab08_psgd.py --workers 1 2 4 8 --out "
              "benchmarks/results/lab08_psgd_NAME.json` on a machine with 8 cores or more records them, and this cell shows them.")


def methods_table(table: dict, rates: dict, default_rate: str, target: float, heading: str, seed):
    """Section 5: ``heading`` and the finest time the runs can show, then one line per method (rate, seeds,
    accuracy, training time, time to the target); returns the figure of the first seed's curves and
    that time (for ``methods_verdicts``)."""
    import matplotlib.pyplot as plt

    resolution = max(measurement_interval(r) for rs in table.values() for r in rs)   # the coarsest time between measurements
    print(f"{heading}; measured about every {resolution:.1f} s of training at most")
    print(f"{'method':<26} {'lr':>11} {'seeds':>5} {'test accuracy':>20} {'training (s)':>13} {'to target (s)':>14}")
    fig, ax = plt.subplots(figsize=(8, 4))
    for method, rs in table.items():
        reach = [seconds_to(r, target) for r in rs]
        when = f"{np.mean(reach):.1f}" if all(t is not None for t in reach) else "not reached"
        print(f"{method:<26} {rates.get(method, default_rate):>11} {len(rs):>5} {spread_text(final_accuracies(rs)):>20} "
              f"{np.mean([r['seconds'] for r in rs]):>13.1f} {when:>14}")
        ax.plot(rs[0]["times"], rs[0]["accuracies"], "o-", label=method)
    ax.axhline(target, color="gray", ls=":", label="target")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"seed {seed}; every method measured during training, evaluation time left out", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, resolution


def methods_verdicts(table: dict, target: float, resolution: float, times_compared: bool, not_compared: str) -> None:
    """The best final accuracy and, where the workers had a core each, the first to the target (otherwise
    ``not_compared`` says why not)."""
    print(outcomes.best({m: final_accuracies(rs) for m, rs in table.items()}, what="final test accuracy")[1])
    if times_compared:
        print(outcomes.first_to_target({m: [seconds_to(r, target) for r in rs] for m, rs in table.items()}, resolution)[1])
    else:
        print(f"first to the target: not judged, {not_compared}")

"""Verdicts printed from a cell's own numbers, so the sentence under a plot always matches it.

Taught alongside labs/01_mlp_cpu.ipynb and labs/02_single_gpu.ipynb: where prose states an outcome
(the test loss rose, the accuracy is at chance, throughput levelled off), the cell prints it from
these functions instead of asserting it in the text.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from typing import Mapping, Sequence


def chance_band(n_classes: int, n_samples: int, sigmas: float = 3.0) -> tuple[float, float]:
    """The accuracies a random guesser reaches on ``n_samples`` balanced samples, within ``sigmas`` sd."""
    if n_classes < 2 or n_samples < 1:
        raise ValueError(f"need n_classes >= 2 and n_samples >= 1, got {n_classes} and {n_samples}")
    p = 1 / n_classes
    spread = sigmas * math.sqrt(p * (1 - p) / n_samples)
    return max(0.0, p - spread), min(1.0, p + spread)


def accuracy_verdict(accuracy: float, n_classes: int, n_samples: int) -> str:
    """Whether ``accuracy`` on ``n_samples`` test samples can be told apart from guessing."""
    low, high = chance_band(n_classes, n_samples)
    if accuracy <= high:
        return (f"{accuracy:.1%} is at chance level (a guesser lands in {low:.1%}-{high:.1%} "
                f"on {n_samples} samples)")
    return f"{accuracy:.1%} is above chance (a guesser stays below {high:.1%} on {n_samples} samples)"


def trend(values: Sequence[float], rel: float = 0.02) -> str:
    """'rose', 'fell' or 'stayed flat': the last value against the first, within ``rel``."""
    first, last = values[0], values[-1]
    if last > first * (1 + rel):
        return "rose"
    if last < first * (1 - rel):
        return "fell"
    return "stayed flat"


def levels_off_at(xs: Sequence[float], ys: Sequence[float], min_gain: float = 1.3) -> float | None:
    """The first x after which y grows by less than ``min_gain`` times per step, or None if it never does."""
    for x, y, y_next in zip(xs, ys, ys[1:]):
        if y_next < y * min_gain:
            return x
    return None


def rises_after_minimum(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, bool]:
    """(x of the smallest y, whether y grows at every step after it)."""
    best = min(range(len(ys)), key=ys.__getitem__)
    return xs[best], all(b > a for a, b in zip(ys[best:], ys[best + 1:]))


# Verdicts that compare numbers. Each returns its conclusion (and its sentence, where it writes one) and,
# when COURSE_VERDICTS names a file, appends the sentence's kind, numbers and conclusion to it as one JSON line: the test suite re-reads
# every conclusion a lab printed and checks it against those numbers with rules of its own
# (tests/library/verdict_rules.py), at the worker counts of a 2-core machine and of an 8-core laptop.

def record(kind: str, conclusion, text: str, **numbers) -> None:
    """Append one verdict to the file ``COURSE_VERDICTS`` names (nothing when it is unset)."""
    path = os.environ.get("COURSE_VERDICTS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(dict(kind=kind, conclusion=conclusion, text=text, numbers=numbers)) + "\n")


def mean_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half the range: the spread over seeds within which differences are called noise."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (max(values) - min(values)) / 2


def compare(name_a: str, a: Sequence[float], name_b: str, b: Sequence[float], *, unit: str = "",
            margin: float = 0.0, percent: bool = False) -> str:
    """'higher', 'lower' or 'within the spread': ``a`` against ``b``, one value per seed each.

    A difference counts only beyond the sum of both spreads plus ``margin`` (a resolution, such as
    an evaluation interval); with one value each and no margin it is 'not judged (one seed)'.
    """
    (ma, sa), (mb, sb) = mean_spread(a), mean_spread(b)
    if len(a) < 2 and len(b) < 2 and margin == 0:
        conclusion = "not judged"
    elif abs(ma - mb) <= sa + sb + margin:
        conclusion = "within the spread"
    else:
        conclusion = "higher" if ma > mb else "lower"
    fmt = (lambda v: f"{v:.1%}") if percent else (lambda v: f"{v:.3g}{unit}")
    text = (f"{name_a} {fmt(ma)} against {name_b} {fmt(mb)}: " +
            {"not judged": "one seed, not judged",
             "within the spread": f"within the spread (+-{fmt(sa + sb + margin)})",
             "higher": "higher, beyond the spread", "lower": "lower, beyond the spread"}[conclusion])
    record("compare", conclusion, text, a=list(map(float, a)), b=list(map(float, b)), margin=margin)
    return conclusion


def first_to_target(seconds: Mapping[str, Sequence[float | None]], resolution: float) -> tuple[str | None, str]:
    """The method that reached a target first, by a gap larger than ``resolution`` and the seeds' spread.

    ``seconds`` maps each method to its time to the target per seed (None: not reached). A method
    wins only if every seed reached the target and its mean plus both spreads plus ``resolution``
    (the time between two evaluations, the finest time a run can show) stays below the next one's
    mean, and if it ran two seeds or more (one run has no spread to set against the gap); otherwise
    there is 'no clear winner'. Returns (winner or None, sentence).
    """
    reached = {m: mean_spread(t) for m, t in seconds.items() if t and all(v is not None for v in t)}
    ranked = sorted(reached, key=lambda m: reached[m][0])
    winner = None
    if ranked and len(seconds[ranked[0]]) >= 2:
        best, (mb, sb) = ranked[0], reached[ranked[0]]
        rivals = [reached[m] for m in ranked[1:]]
        if all(mr - mb > sb + sr + resolution for mr, sr in rivals):
            winner = best
    if not ranked:
        text = "no method reached the target"
    elif winner:
        nxt = f"; next: {ranked[1]} at {reached[ranked[1]][0]:.1f} s" if len(ranked) > 1 else ""
        text = f"first to the target: {winner} ({reached[winner][0]:.1f} s{nxt}; resolution {resolution:.1f} s)"
    elif len(seconds[ranked[0]]) < 2:
        text = (f"no clear winner to the target from one seed: "
                f"{', '.join(f'{m} {reached[m][0]:.1f} s' for m in ranked[:3])} (run more seeds to tell)")
    else:
        text = (f"no clear winner to the target: {', '.join(f'{m} {reached[m][0]:.1f} s' for m in ranked[:3])} "
                f"differ by less than the evaluation interval ({resolution:.1f} s) plus the seeds' spread")
    record("first_to_target", winner, text, resolution=resolution,
           seconds={m: [None if v is None else float(v) for v in t] for m, t in seconds.items()})
    return winner, text


def best(values: Mapping[str, Sequence[float]], *, higher_is_better: bool = True,
         what: str = "value") -> tuple[str | None, str]:
    """The method with the best mean, or None when it is within the spread of the runner-up."""
    stats = {m: mean_spread(v) for m, v in values.items()}
    ranked = sorted(stats, key=lambda m: stats[m][0], reverse=higher_is_better)
    winner = ranked[0] if ranked else None
    if len(ranked) > 1:
        (m0, s0), (m1, s1) = stats[ranked[0]], stats[ranked[1]]
        if abs(m0 - m1) <= s0 + s1 or all(len(values[m]) < 2 for m in ranked[:2]):
            winner = None
    text = (f"best {what}: {winner}" if winner else
            f"no clear best {what}: {ranked[0]} and {ranked[1]} are within the seeds' spread (or one seed)"
            if len(ranked) > 1 else "nothing to rank")
    record("best", winner, text, higher_is_better=higher_is_better,
           values={m: list(map(float, v)) for m, v in values.items()})
    return winner, text

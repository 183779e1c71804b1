"""Verdicts printed from a cell's own numbers, so the sentence under a plot always matches it.

Taught alongside labs/01_mlp_cpu.ipynb and labs/02_single_gpu.ipynb: where prose states an outcome
(the test loss rose, the accuracy is at chance, throughput levelled off), the cell prints it from
these functions instead of asserting it in the text.
"""
from __future__ import annotations

import math
from typing import Sequence


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

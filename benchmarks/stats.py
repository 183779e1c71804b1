"""Paired ratios with a bootstrap interval, shared by the benchmarks that compare two loops run in turns."""
from __future__ import annotations

import random
import statistics


def paired_ratio(a: list[float], b: list[float], seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Median of a[i] / b[i] over interleaved pairs, and its 95% bootstrap interval: how far the machine's
    noise leaves the ratio uncertain (robust to the machine's speed drifting between pairs)."""
    ratios = [x / y for x, y in zip(a, b)]
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return statistics.median(ratios), (boot[49], boot[1950])

"""Figures the labs draw. Each function returns the matplotlib Figure so tests can inspect it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt


def _axes(ax, figsize=(6, 4)):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    return ax.figure, ax


def plot_losses(histories, x: str = "logged_step", ax=None, title: str | None = None):
    """Train (dashed) and test (solid) loss of one ``History`` or a ``{label: History}`` dict.

    ``x`` picks the horizontal axis: ``logged_step`` or ``samples_seen``.
    """
    if not isinstance(histories, Mapping):
        histories = {"": histories}
    fig, ax = _axes(ax)
    for label, history in histories.items():
        xs = getattr(history, x)
        line, = ax.plot(xs, history.test_loss, label=f"{label} test".strip())
        ax.plot(xs, history.train_loss, "--", color=line.get_color(), label=f"{label} train".strip())
    ax.set_xlabel({"logged_step": "step", "samples_seen": "training samples seen"}.get(x, x))
    ax.set_ylabel("cross-entropy loss")
    ax.set_title(title or "Loss")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_throughput(batch_sizes: Sequence[int], samples_per_s: Mapping[str, Sequence[float]] | Sequence[float],
                    ax=None, title: str | None = None):
    """Samples per second against batch size (log-log), one line per label."""
    if not isinstance(samples_per_s, Mapping):
        samples_per_s = {"": samples_per_s}
    fig, ax = _axes(ax)
    for label, values in samples_per_s.items():
        ax.plot(batch_sizes, values, "o-", label=label or None)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(title or "Throughput against batch size")
    if any(samples_per_s):
        ax.legend()
    fig.tight_layout()
    return fig


def plot_against_batch_size(batch_sizes: Sequence[int], values: Sequence[float], ylabel: str,
                            ax=None, title: str | None = None, logy: bool = False):
    """One measured quantity (final loss, GFLOP/s...) against batch size."""
    fig, ax = _axes(ax)
    ax.plot(batch_sizes, values, "o-")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{ylabel} against batch size")
    fig.tight_layout()
    return fig


_TIMELINE_KINDS = ("zero_grad", "forward", "backward", "wait", "step", "all_reduce")


def plot_timeline(spans: Sequence[tuple[str, str, float, float]], ax=None, title: str | None = None):
    """A Gantt chart of one step: ``(lane, label, start s, end s)`` spans (``utils.ddp.Timeline``),
    one row per lane, times in milliseconds from the earliest start. Lab 05 draws it."""
    if not spans:
        raise ValueError("no spans to draw: record a step with a utils.ddp.Timeline first")
    lanes = list(dict.fromkeys(lane for lane, *_ in spans))
    origin = min(start for *_, start, _ in spans)
    fig, ax = _axes(ax, figsize=(10, 0.9 + 0.7 * len(lanes)))
    colours = {kind: f"C{i}" for i, kind in enumerate(_TIMELINE_KINDS)}   # the same in every figure
    for lane, label, start, end in spans:
        kind = label.split()[0]                     # "bucket 3" and "bucket 4" share a colour
        colour = colours.setdefault(kind, f"C{len(colours) % 10}")
        row = lanes.index(lane)
        ax.barh(row, (end - start) * 1e3, left=(start - origin) * 1e3, height=0.6, color=colour,
                edgecolor="black", linewidth=0.5, alpha=0.85)
        ax.text((start + end - 2 * origin) / 2 * 1e3, row, label, ha="center", va="center", fontsize=7, clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel("time from the start of the step (ms)")
    ax.set_title(title or "One training step")
    fig.tight_layout()
    return fig

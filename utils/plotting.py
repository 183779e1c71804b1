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

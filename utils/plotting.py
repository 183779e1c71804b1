"""Figures the labs draw. Each function returns the matplotlib Figure so tests can inspect it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt

from .collectives import fit_alpha_beta, ring_all_reduce_seconds


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


# ---- Figures for the lab slides (slides/build.py draws them; recorded runs name their machine) ----

def _machine_note(fig, machine: str) -> None:
    """Name the machine a recorded figure comes from, under the axes."""
    fig.text(0.01, 0.01, f"Recorded on {machine}", fontsize=7, color="0.35", ha="left", va="bottom")


def ring_allreduce_states(world_size: int):
    """Which ranks' data every (rank, chunk) cell holds after each step of the ring all-reduce.

    Returns a list of ``(phase, sends, state)``: ``sends`` are the ``(rank, chunk)`` each rank sends
    to its right neighbour in that step, ``state[r][c]`` the set of ranks summed into rank r's chunk c.
    The first entry is the start (no sends); then p - 1 reduce-scatter and p - 1 all-gather steps.
    """
    p = world_size
    state = [[{r} for _ in range(p)] for r in range(p)]
    steps = [("start", [], [[set(c) for c in row] for row in state])]
    for phase, offset in (("reduce-scatter", 0), ("all-gather", 1)):
        for k in range(p - 1):
            sends = [(r, (r + offset - k) % p) for r in range(p)]
            incoming = [(r, c, set(state[r][c])) for r, c in sends]
            for r, c, data in incoming:
                right = (r + 1) % p
                state[right][c] = state[right][c] | data if phase == "reduce-scatter" else data
            steps.append((phase, sends, [[set(c) for c in row] for row in state]))
    return steps


def plot_ring_allreduce_step(world_size: int, step: int, ax=None):
    """One step of the ring all-reduce on ``world_size`` ranks as a grid (rows: ranks, columns: chunks);
    each cell names the ranks summed into it, arrows show this step's sends. Step 0 is the start."""
    steps = ring_allreduce_states(world_size)
    if not 0 <= step < len(steps):
        raise ValueError(f"step must be in 0..{len(steps) - 1} for {world_size} ranks, got {step}")
    phase, sends, state = steps[step]
    p = world_size
    fig, ax = _axes(ax, figsize=(7, 1.1 + 0.9 * p))
    letters = "abcdefghijklmnop"
    for r in range(p):
        for c in range(p):
            shade = len(state[r][c]) / p
            ax.add_patch(plt.Rectangle((c, r), 0.92, 0.8, facecolor=plt.cm.Blues(0.15 + 0.7 * shade),
                                       edgecolor="black", linewidth=0.6))
            text = "+".join(f"{letters[s]}{c}" for s in sorted(state[r][c]))
            ax.text(c + 0.46, r + 0.4, text, ha="center", va="center", fontsize=9 if p <= 4 else 7,
                    color="white" if shade > 0.6 else "black")
    for r, c in sends:
        right = (r + 1) % p
        if right > r:
            ax.annotate("", xy=(c + 0.46, right + 0.05), xytext=(c + 0.46, r + 0.75),
                        arrowprops=dict(arrowstyle="->", color="C3", lw=2))
        else:                                        # the wrap-around send, last rank to rank 0
            ax.annotate("", xy=(c + 0.88, 0.1), xytext=(c + 0.88, r + 0.7),
                        arrowprops=dict(arrowstyle="->", color="C3", lw=1.5, ls="--",
                                        connectionstyle="arc3,rad=-0.35"))
    ax.set_xlim(-0.1, p + 0.1)
    ax.set_ylim(p, -0.1)
    ax.set_xticks([c + 0.46 for c in range(p)], [f"chunk {c}" for c in range(p)])
    ax.set_yticks([r + 0.4 for r in range(p)], [f"rank {r}" for r in range(p)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    total = 2 * (p - 1)
    title = "start: every rank holds its own vector" if step == 0 else \
        f"step {step} of {total} ({phase}): every rank sends one chunk to its right neighbour"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_alpha_beta(rows: Sequence[Mapping], machine: str, key: str = "gloo_seconds", ax=None):
    """Measured all-reduce time against message size, one colour per world size, with the fitted
    alpha-beta line (rows as ``benchmarks/bench_allreduce.py`` records them)."""
    import numpy as np

    fig, ax = _axes(ax, figsize=(7, 4.2))
    for i, p in enumerate(sorted({row["world_size"] for row in rows})):
        mine = [row for row in rows if row["world_size"] == p]
        n = np.array([row["n_bytes"] for row in mine], dtype=float)
        t = np.array([row[key] for row in mine], dtype=float)
        alpha, beta = fit_alpha_beta(n, t, world_size=p)   # the ring's model, as the labs fit it
        ax.loglog(n, t * 1e3, "o", color=f"C{i}", label=f"{p} ranks measured")
        grid = np.geomspace(n.min(), n.max(), 50)
        rate = f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "unbounded"
        ax.loglog(grid, [ring_all_reduce_seconds(g, p, alpha, beta) * 1e3 for g in grid], "-", color=f"C{i}",
                  label=f"{p} ranks: alpha = {alpha * 1e6:.0f} us, 1/beta = {rate}")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce time (ms)")
    ax.set_title("t = alpha + beta * n: latency for small messages, bandwidth for large ones")
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _machine_note(fig, machine)
    return fig


def plot_ddp_variants(rows: Sequence[Mapping], model: str, machine: str, ax=None):
    """Throughput of each data-parallel variant, one group of bars per world size
    (rows as ``benchmarks/bench_ddp.py`` records them)."""
    mine = [row for row in rows if row["model"] == model]
    if not mine:
        raise ValueError(f"no rows for model {model!r}; models recorded: {sorted({r['model'] for r in rows})}")
    variants = list(dict.fromkeys(row["variant"] for row in mine))
    sizes = sorted({row["world_size"] for row in mine})
    fig, ax = _axes(ax, figsize=(8, 4.2))
    width = 0.8 / len(sizes)
    for i, p in enumerate(sizes):
        values = {row["variant"]: row["samples_per_s"] for row in mine if row["world_size"] == p}
        ax.bar([v + i * width for v in range(len(variants))], [values.get(name, 0) for name in variants],
               width=width, label=f"{p} ranks")
    ax.set_xticks([v + width * (len(sizes) - 1) / 2 for v in range(len(variants))], variants)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(f"Data-parallel variants, model '{model}' (no-comm: the step without communication)")
    ax.legend()
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _machine_note(fig, machine)
    return fig


def plot_speedup(workers: Sequence[int], curves: Mapping[str, Sequence[float]], machine: str,
                 measured: Mapping[str, tuple[Sequence[int], Sequence[float]]] | None = None, ax=None):
    """Speed-up against workers: the ideal line, predicted curves, and measured points."""
    fig, ax = _axes(ax, figsize=(7, 4.2))
    ax.plot(workers, workers, "k:", label="ideal")
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(workers, values, "-", color=f"C{i}", label=f"{label}: predicted")
        if measured and label in measured:
            ax.plot(*measured[label], "o", color=f"C{i}", label=f"{label}: measured")
    ax.set_xlabel("workers p")
    ax.set_ylabel("speed-up")
    ax.set_title("Speed-up against workers: communication takes a growing share")
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _machine_note(fig, machine)
    return fig


def _diagram(fig, ax, xlabel: str = "time"):
    """A diagram has no measured scale: hide the numbers on the time axis."""
    ax.set_xticks([])
    ax.set_xlabel(xlabel)
    return fig


def plot_bucket_overlap(n_layers: int = 6, per_bucket: int = 2, compute: float = 1.0, comm: float = 0.7):
    """Diagram: backward then one all-reduce, against buckets all-reduced while backward runs.

    Durations are in arbitrary units (``compute`` per layer, ``comm`` per bucket of ``per_bucket``
    layers, plus a fixed latency per call); the time axis has no numbers."""
    latency = 0.3 * comm
    spans = []
    backward_end = n_layers * compute
    n_buckets = -(-n_layers // per_bucket)
    for lane in ("no overlap", "buckets"):           # backward runs from the last layer to the first
        spans += [(f"{lane}: compute", f"grad L{n_layers - layer}", layer * compute, (layer + 1) * compute)
                  for layer in range(n_layers)]
        if lane == "no overlap":
            spans.append(("no overlap: all-reduce", "all-reduce", backward_end,
                          backward_end + latency + comm * n_buckets))
    free = 0.0
    for b in range(n_buckets):
        ready = min(n_layers, (b + 1) * per_bucket) * compute
        start = max(ready, free)
        free = start + latency + comm
        spans.append(("buckets: all-reduce", f"bucket {b}", start, free))
    fig = plot_timeline([(lane, label, s / 10, e / 10) for lane, label, s, e in spans],
                        title="Buckets start their all-reduce as soon as their gradients are ready")
    return _diagram(fig, fig.axes[0])


def plot_local_sgd(workers: int = 3, period: int = 4, rounds: int = 2):
    """Diagram: local SGD, each worker takes ``period`` steps alone, then the weights are averaged."""
    spans = []
    t = 0.0
    for _ in range(rounds):
        for w in range(workers):
            for k in range(period):
                spans.append((f"worker {w}", "step", t + k, t + k + 0.9))
        t += period
        for w in range(workers):
            spans.append((f"worker {w}", "average", t, t + 1.2))
        t += 1.3
    fig = plot_timeline([(lane, label, s / 10, e / 10) for lane, label, s, e in spans],
                        title=f"Local SGD: {period} local steps, then one weight average (K = {period})")
    return _diagram(fig, fig.axes[0])


def plot_sync_points():
    """Diagram: a host that reads the loss every step waits for the device; one that does not stays ahead."""
    spans = []
    for s in range(3):                               # .item() every step: launch, wait, read
        base = s * 3.2
        spans += [("host, .item() per step", "launch", base, base + 0.6),
                  ("host, .item() per step", "wait", base + 0.6, base + 2.8),
                  ("device, .item() per step", "step", base + 0.6, base + 2.8)]
    for s in range(3):                               # no sync: launches queue up, the device never idles
        spans += [("host, no sync point", "launch", s * 0.7, s * 0.7 + 0.6),
                  ("device, no sync point", "step", 0.6 + s * 2.2, 0.6 + (s + 1) * 2.2)]
    fig = plot_timeline([(lane, label, s / 10, e / 10) for lane, label, s, e in spans],
                        title="A sync point per step makes the host wait and leaves gaps on the device")
    return _diagram(fig, fig.axes[0])


def plot_critical_batch(noise_scale: float = 1024.0, min_steps: float = 1000.0, ax=None):
    """McCandlish et al. (2018): steps S = S_min (1 + B_noise / B) and examples E = E_min (1 + B / B_noise)
    to reach a target, against batch size B; the critical batch B_crit = E_min / S_min = B_noise."""
    import numpy as np

    batches = np.geomspace(noise_scale / 64, noise_scale * 64, 200)
    steps = min_steps * (1 + noise_scale / batches)
    examples = min_steps * noise_scale * (1 + batches / noise_scale)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8)) if ax is None else (ax.figure, [ax, ax.twinx()])
    axes[0].loglog(batches, steps, "C0")
    axes[0].axhline(min_steps, color="C0", ls=":")
    axes[0].set_ylabel("steps to target")
    axes[1].loglog(batches, examples, "C1")
    axes[1].axhline(min_steps * noise_scale, color="C1", ls=":")
    axes[1].set_ylabel("examples to target")
    for a, text in zip(axes, ("S_min", "E_min")):
        a.axvline(noise_scale, color="k", ls="--", lw=1)
        a.set_xlabel("batch size B")
        a.set_xticks([noise_scale], ["B_crit"])
        a.set_yticks([], minor=True)
        a.set_yticks([])
        a.set_title(f"{'twice' if a is axes[0] else 'and twice'} {text} at B_crit", fontsize=10)
    fig.suptitle("Below B_crit a bigger batch saves steps; above it, it mostly costs examples", fontsize=11)
    fig.tight_layout()
    return fig


def plot_lr_schedule(lrs: Sequence[float], warmup_steps: int, title: str | None = None, ax=None):
    """Learning rate against optimizer step, with the end of the warm-up marked."""
    fig, ax = _axes(ax, figsize=(7, 3.6))
    ax.plot(range(len(lrs)), lrs, "C0")
    ax.axvline(warmup_steps, color="k", ls="--", lw=1, label=f"end of warm-up (step {warmup_steps})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(title or "Linear warm-up, then the schedule")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_mlp(layer_sizes: Sequence[int], ax=None):
    """Diagram of a fully connected network: one box per layer, its width on top."""
    fig, ax = _axes(ax, figsize=(8, 3))
    top = max(layer_sizes)
    for i, size in enumerate(layer_sizes):
        height = 0.3 + 0.7 * size / top
        ax.add_patch(plt.Rectangle((i * 2, -height / 2), 0.6, height, facecolor=f"C{min(i, 1)}", alpha=0.6))
        ax.text(i * 2 + 0.3, height / 2 + 0.08, str(size), ha="center", fontsize=10)
        if i:
            ax.annotate("", xy=(i * 2, 0), xytext=(i * 2 - 1.4, 0), arrowprops=dict(arrowstyle="->"))
            ax.text(i * 2 - 0.7, 0.08, "Linear" + (" + tanh" if i < len(layer_sizes) - 1 else ""),
                    ha="center", fontsize=8)
    ax.set_xlim(-0.5, 2 * len(layer_sizes) - 1)
    ax.set_ylim(-0.8, 0.9)
    ax.axis("off")
    ax.set_title("input -> hidden layers -> class scores")
    fig.tight_layout()
    return fig


def plot_lab_times(labs: Sequence[Mapping], ax=None):
    """Minutes per lab in quick and full mode (``benchmarks/results/lab_times.json``'s labs),
    each bar labelled with the machine it was measured on."""
    fig, ax = _axes(ax, figsize=(8, 4))
    names = [lab["notebook"][:2] for lab in labs]
    for i, (mode, label) in enumerate((("quick_s", "quick mode"), ("full_s", "full mode"))):
        ax.bar([x + 0.4 * i for x in range(len(labs))], [(lab.get(mode) or 0) / 60 for lab in labs],
               width=0.4, label=label)
    ax.set_xticks([x + 0.2 for x in range(len(labs))], [f"lab {n}" for n in names])
    ax.set_ylabel("minutes")
    ax.set_title("Run time of each lab")
    ax.legend()
    machines = sorted({lab.get("machine", "") for lab in labs})
    fig.tight_layout(rect=(0, 0.04 * len(machines), 1, 1))
    for i, machine in enumerate(machines):
        fig.text(0.01, 0.01 + 0.035 * i, f"labs {', '.join(l['notebook'][:2] for l in labs if l.get('machine', '') == machine)}:"
                 f" {machine}", fontsize=7, color="0.35")
    return fig


def plot_gpu_settings(rows: Sequence[Mapping], machine: str, ax=None):
    """Images per second of a training step for each GPU setting (``utils.labs.lab06.wrn_settings``'s
    rows, e.g. a recorded ``benchmarks/results/wrn_gpu_*.json``), relative to the first (fp32)."""
    fig, ax = _axes(ax, figsize=(8, 3.6))
    import textwrap

    names = ["\n".join(textwrap.wrap(row["setting"].split(", ")[-1], 30)) for row in rows]
    speeds = [row["images_per_s"] for row in rows]
    bars = ax.barh(range(len(rows)), speeds, color="tab:green")
    for bar, speed in zip(bars, speeds):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {speed / speeds[0]:.2f}x",
                va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(speeds) * 1.15)
    ax.set_xlabel("images per second")
    ax.set_title(rows[0]["setting"].rsplit(", ", 1)[0] + ": one training step")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.text(0.01, 0.01, machine, fontsize=7, color="0.35")
    return fig


# --- lab 07: batch size and learning rate -----------------------------------------------------------

def plot_steps_to_target(batch_sizes: Sequence[int], steps: Sequence[float], ylabel: str,
                         fit: tuple[float, float] | None = None, marks: Mapping[str, float] | None = None, ax=None):
    """Steps to a target against batch size (log-log): the measured points, the line of perfect
    scaling through the smallest batch, McCandlish et al.'s S_min (1 + B_crit / B) for ``fit =
    (S_min, B_crit)``, and a vertical line per ``marks`` entry (label: batch size)."""
    import numpy as np

    fig, ax = _axes(ax, figsize=(6.5, 4))
    ax.plot(batch_sizes, steps, "o", label="measured")
    ax.plot(batch_sizes, [steps[0] * batch_sizes[0] / b for b in batch_sizes], ":", color="gray",
            label="perfect scaling")
    if fit is not None and all(v > 0 for v in fit):
        grid = np.geomspace(min(batch_sizes), max(batch_sizes) * 2, 100)
        s_min, b_crit = fit   # McCandlish et al.'s S(B), as utils.labs.lab07.fit_critical_batch fits it
        ax.plot(grid, s_min * (1 + b_crit / grid), "-", label=f"S_min (1 + B_crit / B), B_crit = {fit[1]:.0f}")
    for i, (label, batch) in enumerate((marks or {}).items()):
        ax.axvline(batch, color=f"C{i + 2}", linestyle=("--", "-.", ":")[i % 3], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_over_seeds(xs: Sequence[float], values: Mapping[str, Sequence[Sequence[float | None]]], xlabel: str,
                    ylabel: str, title: str | None = None, logx: bool = True, ax=None):
    """One line per label: at each x the mean over seeds, with a bar from the worst to the best seed;
    ``values[label][i]`` holds one number per seed at ``xs[i]``, None (or nan) for a failed seed,
    drawn as a red x at the bottom of the axes."""
    import math

    fig, ax = _axes(ax, figsize=(6.5, 4))
    for label, per_x in values.items():
        finite = [[float(v) for v in seeds if v is not None and math.isfinite(v)] for seeds in per_x]
        mean = [sum(f) / len(f) if f else math.nan for f in finite]
        low = [m - min(f) if f else 0.0 for m, f in zip(mean, finite)]
        high = [max(f) - m if f else 0.0 for m, f in zip(mean, finite)]
        ax.errorbar(xs, mean, yerr=[low, high], fmt="o-", capsize=3, label=label)
        failed = [x for x, f, seeds in zip(xs, finite, per_x) if len(f) < len(seeds)]
        if failed:
            ax.plot(failed, [0.0] * len(failed), "x", color="red", markersize=9, clip_on=False,
                    transform=ax.get_xaxis_transform())
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{ylabel}: mean and range over seeds (x: a seed failed)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_step_losses(curves: Mapping[str, Sequence[float]], mark_step: int | None = None, title: str | None = None,
                     ax=None):
    """The training loss of every step (log scale), one line per label, with ``mark_step`` marked."""
    fig, ax = _axes(ax, figsize=(6.5, 4))
    for label, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=label)
    if mark_step is not None:
        ax.axvline(mark_step, color="gray", linestyle=":")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title or "Training loss, step by step", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig


_HISTORY_AXES = {"step": "step", "epochs": "epochs trained", "samples": "training samples seen", "train_loss": "training loss",
                 "test_loss": "test loss", "test_accuracy": "test accuracy"}


def plot_histories(runs: Mapping[str, Sequence[Sequence[Mapping]]], metrics: Sequence[str] = ("test_accuracy",),
                   x: str = "step", logx: bool = False, title: str | None = None):
    """Run histories (lists of dicts, such as ``utils.labs.lab07.train_run``'s ``history``), one panel
    per metric, one colour per label and one line per history under it (one per seed)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, (label, histories) in enumerate(runs.items()):
            for j, history in enumerate(histories):
                points = [(h[x], h[metric]) for h in history if not logx or h[x] > 0]   # a log axis has no 0
                ax.plot([p[0] for p in points], [p[1] for p in points], color=f"C{i}", alpha=0.75,
                        label=label if j == 0 else None)
        if logx:
            ax.set_xscale("log")
        if metric.endswith("loss"):
            ax.set_yscale("log")
        ax.set_xlabel(_HISTORY_AXES.get(x, x))
        ax.set_ylabel(_HISTORY_AXES.get(metric, metric))
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_landscapes(alphas: Sequence[float], line: Mapping[str, Sequence[float]], ends: tuple[str, str],
                    coords: Sequence[float], surfaces: Mapping[str, "object"]):
    """Li et al.'s pictures: left, the loss on the line ``(1 - a) A + a B`` (one curve per data split,
    ``ends`` names A and B); then the loss on a plane around each solution (``surfaces[label]``, rows
    along the second direction, as ``utils.labs.lab07.surface_2d`` returns), contoured at the same levels."""
    import torch

    fig, axes = plt.subplots(1, 1 + len(surfaces), figsize=(5.3 * (1 + len(surfaces)), 4.2))
    for name, losses in line.items():
        axes[0].plot(alphas, losses, label=name)
    for a, text in ((0.0, ends[0]), (1.0, ends[1])):
        axes[0].axvline(a, color="gray", linestyle=":", linewidth=1)
    axes[0].set_yscale("log")
    axes[0].set_xlabel(f"a (0: {ends[0]}, 1: {ends[1]})")
    axes[0].set_ylabel("loss")
    axes[0].legend()
    stacked = torch.stack([torch.as_tensor(s, dtype=torch.float64) for s in surfaces.values()]).flatten()
    levels = sorted(set(torch.quantile(stacked, torch.linspace(0.02, 0.98, 12, dtype=torch.float64)).tolist()))
    for ax, (label, surface) in zip(axes[1:], surfaces.items()):
        contours = ax.contour(coords, coords, torch.as_tensor(surface).numpy(), levels=levels)
        ax.clabel(contours, fontsize=6)
        ax.plot([0], [0], "k+")
        ax.set_title(f"training loss around the {label} solution", fontsize=10)
        ax.set_xlabel("direction 1")
        ax.set_ylabel("direction 2")
    fig.tight_layout()
    return fig


def plot_power_law(sizes: Sequence[float], values: Sequence[float], slope: float, intercept: float,
                   xlabel: str = "training samples n", ylabel: str = "test loss", ax=None):
    """Measured points and the fitted power law ``exp(intercept) n ** slope`` on log-log axes."""
    import math

    fig, ax = _axes(ax)
    ax.plot(sizes, values, "o", label="measured")
    ax.plot(sizes, [math.exp(intercept) * n ** slope for n in sizes], "-",
            label=f"fit: {math.exp(intercept):.2f} n^({slope:.3f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_examples(x, y, class_names: Sequence[str], per_class: int = 2, title: str | None = None):
    """The first ``per_class`` images of each class (``x``: (n, channels, height, width), grey or colour), one column
    per class, named above it."""
    fig, axes = plt.subplots(per_class, len(class_names), figsize=(1.2 * len(class_names), 1.4 * per_class), squeeze=False)
    for label, column in enumerate(axes.T):
        picks = (y == label).nonzero().flatten()[:per_class]
        for ax, index in zip(column, picks):
            image = x[index].permute(1, 2, 0)
            ax.imshow(image.squeeze(-1) if image.shape[-1] == 1 else (image - image.min()) / (image.max() - image.min()),
                      cmap="gray")
        for ax in column:
            ax.set_axis_off()
        column[0].set_title(class_names[label], fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_accuracy_and_epoch_times(runs: Mapping[str, Sequence[Mapping]], target: float,
                                  timed_only: Mapping[str, float] | None = None):
    """Left: test accuracy per epoch of each run, against the target; right: each run's mean seconds per
    epoch, then ``timed_only``'s (runs timed but not plotted on the left, such as one epoch at another
    batch). Each run is a list of ``{"epoch": 0-based, "test_accuracy", "seconds"}`` (the assessment's logs)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, run in runs.items():
        left.plot([r["epoch"] + 1 for r in run], [r["test_accuracy"] for r in run], marker="o", label=name)
        right.bar(name, sum(r["seconds"] for r in run) / len(run))
    for name, seconds in (timed_only or {}).items():
        right.bar(name, seconds)
    left.axhline(target, color="grey", linestyle="--", label="target")
    left.set(xlabel="epoch", ylabel="test accuracy", title="accuracy per epoch")
    left.legend()
    right.set(ylabel="seconds per epoch", title="time per epoch")
    right.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return fig

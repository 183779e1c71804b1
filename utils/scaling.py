"""How a data-parallel step scales with the number of workers: measured on the engines, and predicted.
Taught in lab 06 (section 3).

``time_scaling`` runs on every engine at once. For each k asked for (``worker_counts``: every k up to
the cores, at most 8, that divides the global batch) it times, on ranks 0 .. k-1 together (the others
wait at a barrier), one training step of a DDP model on a subgroup of k ranks and the same step of the
bare model (the computation alone), in turns, for each per-rank batch asked for; a step that two
series share (k = 1 of strong and weak scaling) is timed once. ``time_ddp_against_bare`` does that
timing, for lab 04's ``utils.ddp_costs`` too. ``ddp_bucket_bytes`` and ``predicted_comm_seconds``
predict the communication from lab 03's alpha-beta model and DDP's buckets, ``predicted_step_ms`` the
step; ``speedup_verdict`` judges a speed-up through ``utils.outcomes``. ``recorded_runs`` and
``plot_recorded`` read and draw benchmarks/bench_lab06_scaling.py's recordings (a core per worker).
"""
from __future__ import annotations

import statistics
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .collectives import ring_all_reduce_seconds
from .perf import elapsed_ms

# Lab 06 section 3's experiment, shared by the lab and benchmarks/bench_lab06_scaling.py (which records it).
GLOBAL_BATCH = 64                  # strong scaling: k workers take GLOBAL_BATCH // k each
PER_RANK_BATCH = 64                # weak scaling: every worker keeps this batch (at k = 1 the same step)
MODELS = {"CNN": {}, "CNN, FC1 2048": dict(hidden=2048)}      # utils.models.CNN settings
SWEEP_BYTES = [2 ** e for e in range(12, 23, 2)]            # the alpha-beta fit's all-reduces: 4 KiB .. 4 MiB
MAX_WORKERS = 8


def worker_counts(cores: int, global_batch: int = GLOBAL_BATCH, most: int = MAX_WORKERS) -> list[int]:
    """The k section 3 times on ``cores`` cores: every k up to min(cores, ``most``) that divides the global batch."""
    return [k for k in range(1, min(cores, most) + 1) if global_batch % k == 0]


FIRST_BUCKET_BYTES = 2 ** 20    # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DEFAULT_CAP_MB = 25             # DDP's bucket_cap_mb when none is given (MiB: torch's _MB_TO_BYTES is 2**20)


def ddp_bucket_bytes(param_bytes, bucket_cap_mb: float | None = None) -> list[int]:
    """Sizes of DDP's gradient buckets, in the order they are all-reduced.

    ``param_bytes``: each parameter's gradient size, in the order backward produces them (the last
    layer first). A bucket is closed as soon as it holds at least its limit. With ``bucket_cap_mb``
    left at None (DDP's default) the first bucket's limit is 1 MiB and every later one's 25 MiB; a
    cap given is every bucket's limit, the first one's too (``_BucketCapacityConfig`` in
    torch/nn/parallel/distributed.py), as DDP applies them once it has rebuilt its buckets after the
    first step. Lab 06 has learners write it; tests/test_scaling.py compares it with a real DDP.
    """
    if bucket_cap_mb is None:
        limits = [FIRST_BUCKET_BYTES, DEFAULT_CAP_MB * 2 ** 20]
    else:
        limits = [int(bucket_cap_mb * 2 ** 20)] * 2
    buckets, size = [], 0
    for nbytes in param_bytes:
        size += nbytes
        if size >= limits[min(len(buckets), 1)]:
            buckets.append(size)
            size = 0
    return buckets + ([size] if size else [])


def predicted_comm_seconds(param_bytes, world_size: int, alpha: float, beta: float,
                           bucket_cap_mb: float | None = None) -> float:
    """Seconds of all-reduce in one DDP step if no bucket overlapped with anything: the sum over
    buckets of the ring's ``2(p-1) alpha + 2(p-1)/p n beta``."""
    return sum(ring_all_reduce_seconds(n, world_size, alpha, beta) for n in ddp_bucket_bytes(param_bytes, bucket_cap_mb))


def train_step(model, optimizer, x, y) -> None:
    """One SGD step of ``model`` on the batch (x, y) with cross-entropy."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


class Workload(NamedTuple):
    """One thing ``time_ddp_against_bare`` times: its model (built afresh from seed 0 for each k), the shape
    of one sample, the number of classes, and the per-rank batch for k ranks (None: not timed at that k)."""
    build_model: Callable[[], torch.nn.Module]
    input_shape: tuple
    n_classes: int
    per_rank_batch: Callable[[int], int | None]


def paired_steps_ms(ddp_step, bare_step, device, group, *, warmup: int = 3, repeats: int = 10):
    """(DDP step ms, bare step ms), ``repeats`` of each, taken in turns after ``warmup`` untimed pairs,
    each started at a barrier of ``group``: a slow spell of the machine hits both series alike, so the
    i-th difference is the i-th step's communication and bookkeeping, not a change of load."""
    ddp_ms, bare_ms = [], []
    for i in range(warmup + repeats):
        for fn, out in ((ddp_step, ddp_ms), (bare_step, bare_ms)):
            dist.barrier(group=group)
            took = elapsed_ms(fn, device)
            if i >= warmup:
                out.append(took)
    return ddp_ms, bare_ms


def time_ddp_against_bare(workloads: dict, device, *, warmup: int = 3, repeats: int = 10, more=None,
                          ks=None) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, "ddp_steps": [...], "compute_steps": [...],
    **more(...)}}`` for this rank, for each ``Workload`` in ``workloads`` and each k this rank took part in.

    For each k in ``ks`` (default 1 .. world size), ranks 0 .. k-1 form a process group (the others wait
    at a barrier) and each times, on random samples of its own, a training step of the model wrapped in
    DDP on that group and the same step of the bare model (the computation alone: no hooks, no
    all-reduce), in turns (``paired_steps_ms``); "ddp" and "compute" are the medians. ``more(label,
    group, model, x, y)``, if given, then measures what a lab adds and returns it as a dict. Every rank
    must call it, with the same arguments.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(device)
    ks = list(ks or range(1, world_size + 1))
    groups = {k: dist.new_group(list(range(k))) for k in ks}   # every rank, same order
    results = {}
    for k, group in groups.items():
        if rank < k:
            for label, workload in workloads.items():
                b = workload.per_rank_batch(k)
                if b is None:
                    continue
                g = torch.Generator().manual_seed(rank)
                x = torch.randn(b, *workload.input_shape, generator=g).to(device)
                y = torch.randint(0, workload.n_classes, (b,), generator=g).to(device)
                torch.manual_seed(0)
                model = workload.build_model().to(device)
                wrapped = DistributedDataParallel(model, process_group=group,
                                                  device_ids=[device] if device.type == "cuda" else None)
                optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
                ddp_ms, bare_ms = paired_steps_ms(lambda: train_step(wrapped, optimizer, x, y),
                                                  lambda: train_step(model, optimizer, x, y),
                                                  device, group, warmup=warmup, repeats=repeats)
                results[(label, k)] = {"ddp": statistics.median(ddp_ms), "compute": statistics.median(bare_ms),
                                       "ddp_steps": ddp_ms, "compute_steps": bare_ms,
                                       **(more(label, group, model, x, y) if more else {})}
        dist.barrier()                                   # the ranks outside the group wait here
    return results


def time_scaling(build_model, input_shape, n_classes: int, per_rank_batches: dict, device, *,
                 warmup: int = 3, repeats: int = 10, ks=None) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, "ddp_steps": [...], "compute_steps": [...],
    "per_rank": b}}`` for this rank, for each k in ``ks`` (default 1 .. world size).

    ``per_rank_batches[label]`` maps k to the per-rank batch (e.g. strong scaling ``G // k``, weak
    scaling a constant). A step the same as an earlier label's at that k (the same per-rank batch: at
    k = 1 strong and weak scaling run the same step when ``G = b``) is timed once and shared, its entry
    saying ``"same_run_as": label``: both series then divide by the same one-worker time. Times are
    this rank's; the step of k ranks is as slow as the slowest, so merge ranks with ``slowest_steps``.
    Every rank must call it, with the same arguments.
    """
    labels = list(per_rank_batches)

    def first_with(label, k):            # the first label that runs this label's step at k
        b = per_rank_batches[label](k)
        return next(other for other in labels if per_rank_batches[other](k) == b)

    workloads = {label: Workload(build_model, input_shape, n_classes,
                                 lambda k, label=label: per_rank_batches[label](k) if first_with(label, k) == label else None)
                 for label in labels}
    results = time_ddp_against_bare(workloads, device, warmup=warmup, repeats=repeats, ks=ks,
                                    more=lambda label, group, model, x, y: {"per_rank": len(x)})
    for (label, k) in [key for key in results]:
        for other in labels:
            if other != label and first_with(other, k) == label:
                results[(other, k)] = dict(results[(label, k)], same_run_as=label)
    return results


def slowest_steps(per_rank: list[dict]) -> dict:
    """``time_scaling``'s results of every rank merged: per (label, k) the slowest rank's ``ddp`` and
    ``compute`` medians (a step of k ranks ends when the slowest rank's does) and, where recorded, each
    timed step's slowest rank (``ddp_steps``, ``compute_steps``: the steps started together at a barrier)."""
    merged = {}
    for key in per_rank[0]:
        ranks = [t[key] for t in per_rank if key in t]
        merged[key] = {what: max(t[what] for t in ranks) for what in ("ddp", "compute")}
        for what in ("ddp_steps", "compute_steps"):
            if all(what in t for t in ranks):
                merged[key][what] = [max(steps) for steps in zip(*(t[what] for t in ranks))]
    return merged


def predicted_step_ms(compute_ms_one: float, k: int, grad_bytes, alpha: float, beta: float, *,
                      strong: bool) -> float:
    """The compute + communication model of a step of k workers: one worker's computation (divided by k
    under strong scaling: at best k times less work each) plus the predicted all-reduce of DDP's buckets
    (``predicted_comm_seconds``, no overlap). ``grad_bytes`` in the order backward produces them."""
    return compute_ms_one / (k if strong else 1) + 1e3 * predicted_comm_seconds(grad_bytes, k, alpha, beta)


def speedup_verdict(label: str, k: int, rates_one, rates_k) -> str:
    """A sentence on the throughput of k workers against k times one worker's, from each timed step's
    images/s (``rates_one``, ``rates_k``), through ``utils.outcomes.compare``: an efficiency only when
    it is below 100% beyond the steps' spread; above it, no efficiency is printed (not a speed-up)."""
    from . import outcomes

    ideal = [k * r for r in rates_one]
    conclusion = outcomes.compare(f"{label}: {k} workers", rates_k, f"{k} x one worker", ideal, unit=" img/s")
    mean_k, mean_ideal = statistics.fmean(rates_k), statistics.fmean(ideal)
    head = f"{label}: {mean_k:,.0f} images/s at {k} workers against {mean_ideal:,.0f} ideal ({k} x one worker)"
    if conclusion == "lower":
        return f"{head}: efficiency {mean_k / mean_ideal:.0%}, below 100% beyond the steps' spread"
    if conclusion == "higher":
        return f"{head}: above 100%: not a speed-up; measurement noise or contention (no efficiency printed)"
    return f"{head}: not told apart from 100% within the steps' spread (no efficiency printed)"


def plot_scaling(ks, throughput: dict, predicted: dict, communication: dict, title: str):
    """Throughput against workers, measured (``throughput[label]``: images/s per k) beside the compute +
    communication model's (``predicted[label]``, dashed), then per model the communication per step,
    measured (DDP step - computation) beside the prediction (``communication[model] = (measured ms per k,
    predicted ms per k)``). No efficiency panel: an efficiency is printed only where the steps' spread
    bears it out (``speedup_verdict``)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(communication), figsize=(5.5 * (1 + len(communication)), 4))
    for label, rates in throughput.items():
        line, = axes[0].plot(ks, rates, "o-", label=f"{label}, measured")
        if label in predicted:
            axes[0].plot(ks, predicted[label], "--", color=line.get_color(), label=f"{label}, predicted")
    axes[0].set(ylabel="images / s", title="Throughput (dashed: compute + alpha-beta model)")
    for ax, (model, (measured, expected)) in zip(axes[1:], communication.items()):
        ax.bar([k - 0.2 for k in ks], measured, width=0.4, label="measured: DDP step - computation")
        ax.bar([k + 0.2 for k in ks], expected, width=0.4, label="predicted: buckets x alpha-beta")
        ax.set(ylabel="ms per step", title=f"Communication, {model}")
    for ax in axes:
        ax.set(xlabel="workers", xticks=list(ks))
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# Recorded runs of section 3 (benchmarks/bench_lab06_scaling.py: one process per worker, each on a core
# of its own), which lab 06 shows beside its live run and deck 06 shows as its figure.

def recorded_runs(folder=None) -> list[dict]:
    """Every ``lab06_scaling_*.json`` in ``folder`` (default benchmarks/results), fewest cores first."""
    import json
    from pathlib import Path

    from .config import COURSE_ROOT

    folder = Path(folder) if folder else COURSE_ROOT / "benchmarks" / "results"
    records = [dict(json.loads(path.read_text()), file=path.name) for path in folder.glob("lab06_scaling_*.json")]
    return sorted(records, key=lambda r: (r["machine"]["cores"], r["date"]))


def recorded_curves(record: dict):
    """(ks, throughput, predicted, communication) of a recorded file, as ``plot_scaling`` takes them:
    images/s from each run's median step (slowest rank), the model's prediction from the one-worker run's
    computation and each run's own alpha-beta fit, and per model the communication (median of the paired
    differences DDP step - computation) beside the buckets' predicted all-reduce time."""
    runs = sorted(record["runs"], key=lambda r: r["workers"])
    ks = [r["workers"] for r in runs]
    one = runs[0]["models"]
    throughput, predicted, communication = {}, {}, {}
    for name in one:
        compute_one = statistics.median(one[name]["weak"]["compute_steps"])
        for mode in ("strong", "weak"):
            label = f"{name}, {mode}"
            throughput[label], predicted[label] = [], []
            for run in runs:
                entry, k = run["models"][name][mode], run["workers"]
                samples = k * entry["per_rank"]
                throughput[label].append(samples / statistics.median(entry["ddp_steps"]) * 1e3)
                model_ms = predicted_step_ms(compute_one, k, run["models"][name]["grad_bytes"], run["alpha"] or 0.0,
                                             run["beta"] or 0.0, strong=mode == "strong")
                predicted[label].append(samples / model_ms * 1e3)
        communication[name] = (
            [max(statistics.median([d - c for d, c in zip(r["models"][name]["weak"]["ddp_steps"],
                                                          r["models"][name]["weak"]["compute_steps"])]), 0.0)
             for r in runs],
            [1e3 * predicted_comm_seconds(r["models"][name]["grad_bytes"], r["workers"], r["alpha"] or 0.0,
                                          r["beta"] or 0.0) for r in runs])
    return ks, throughput, predicted, communication


def contended(record: dict) -> bool:
    """Whether some k of a recorded file started with fewer idle cores than workers (1-minute load average
    + k > cores): its times then measure the machine's other load too, and draw no verdict."""
    cores = record["machine"]["cores"]
    return any(r.get("load_average") is None or r["load_average"][0] + r["workers"] > cores for r in record["runs"])


def describe_record(record: dict, *, date: bool = True) -> str:
    """The machine, its load and (``date``) the date of a recorded file, in one line."""
    m = record["machine"]
    loads = [r.get("load_average") for r in record["runs"] if r.get("load_average")]
    load = f"load average {min(l[0] for l in loads):.1f}-{max(l[0] for l in loads):.1f} as its runs started" if loads else "load not recorded"
    return (f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}{', ' + record['date'] if date else ''}; one process per worker, "
            f"each pinned to a core of its own, {load}"
            + (": contended, fewer idle cores than workers, so its times measure that load too" if contended(record) else ""))


def plot_recorded(record: dict):
    """``plot_scaling`` of a recorded file, titled with its machine and load."""
    ks, throughput, predicted, communication = recorded_curves(record)
    return plot_scaling(ks, throughput, predicted, communication, f"recorded: {describe_record(record)}")

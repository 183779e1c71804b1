"""How a data-parallel step scales with the number of workers: measured on the engines, and predicted.
Taught in lab 06 (section 3).

``time_scaling`` runs on every engine at once. For each k = 1 .. world size it times, on ranks
0 .. k-1 together (the others wait at a barrier), one training step of a DDP model on a subgroup of k
ranks, and the same step of the bare model (the computation alone), for each per-rank batch asked
for. ``time_ddp_against_bare`` does that timing, for lab 04's ``utils.ddp_costs`` too.
``ddp_bucket_bytes`` and ``predicted_comm_seconds`` predict the communication from lab 03's
alpha-beta model and DDP's buckets.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .collectives import ring_all_reduce_seconds
from .perf import median_ms

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
    of one sample, the number of classes, and the per-rank batch for k ranks."""
    build_model: Callable[[], torch.nn.Module]
    input_shape: tuple
    n_classes: int
    per_rank_batch: Callable[[int], int]


def time_ddp_against_bare(workloads: dict, device, *, warmup: int = 3, repeats: int = 10, more=None) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, **more(...)}}`` for this rank, for each
    ``Workload`` in ``workloads`` and each k this rank took part in.

    For k = 1 .. world size, ranks 0 .. k-1 form a process group (the others wait at a barrier) and each
    times, on random samples of its own, a training step of the model wrapped in DDP on that group and the
    same step of the bare model (the computation alone: no hooks, no all-reduce), each the median of
    ``repeats`` barrier-started steps. ``more(label, group, model, x, y)``, if given, then measures what a
    lab adds and returns it as a dict. Every rank must call it, with the same arguments.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(device)
    groups = {k: dist.new_group(list(range(k))) for k in range(1, world_size + 1)}   # every rank, same order
    timing = dict(warmup=warmup, repeats=repeats)
    results = {}
    for k, group in groups.items():
        if rank < k:
            for label, workload in workloads.items():
                b = workload.per_rank_batch(k)
                g = torch.Generator().manual_seed(rank)
                x = torch.randn(b, *workload.input_shape, generator=g).to(device)
                y = torch.randint(0, workload.n_classes, (b,), generator=g).to(device)
                torch.manual_seed(0)
                model = workload.build_model().to(device)
                wrapped = DistributedDataParallel(model, process_group=group,
                                                  device_ids=[device] if device.type == "cuda" else None)
                optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
                results[(label, k)] = {
                    "ddp": median_ms(lambda: train_step(wrapped, optimizer, x, y), device, group=group, **timing),
                    "compute": median_ms(lambda: train_step(model, optimizer, x, y), device, group=group, **timing),
                    **(more(label, group, model, x, y) if more else {})}
        dist.barrier()                                   # the ranks outside the group wait here
    return results


def time_scaling(build_model, input_shape, n_classes: int, per_rank_batches: dict, device, *,
                 warmup: int = 3, repeats: int = 10) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, "per_rank": b}}`` for this rank.

    ``per_rank_batches[label]`` maps k to the per-rank batch (e.g. strong scaling ``G // k``, weak
    scaling a constant). Times are this rank's medians; the step of k ranks is as slow as the slowest,
    so take the maximum over ranks. Every rank must call it, with the same arguments.
    """
    workloads = {label: Workload(build_model, input_shape, n_classes, batch_of)
                 for label, batch_of in per_rank_batches.items()}
    return time_ddp_against_bare(workloads, device, warmup=warmup, repeats=repeats,
                                 more=lambda label, group, model, x, y: {"per_rank": len(x)})


def slowest_steps(per_rank: list[dict]) -> dict:
    """``time_scaling``'s results of every rank merged: per (label, k) the slowest rank's ``ddp`` and
    ``compute`` times (a step of k ranks ends when the slowest rank's does)."""
    return {key: {what: max(t[key][what] for t in per_rank if key in t) for what in ("ddp", "compute")}
            for key in per_rank[0]}


def plot_scaling(ks, throughput: dict, communication: dict, title: str):
    """Throughput and parallel efficiency against workers (``throughput[label]``: images/s per k), then
    per model the communication per step, measured (DDP step - computation) beside the prediction
    (``communication[model] = (measured ms per k, predicted ms per k)``)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 + len(communication), figsize=(5 * (2 + len(communication)), 4))
    for label, rates in throughput.items():
        line, = axes[0].plot(ks, rates, "o-", label=label)
        axes[0].plot(ks, [rates[0] * k for k in ks], ":", color=line.get_color())
        axes[1].plot(ks, [r / rates[0] / k for r, k in zip(rates, ks)], "o-", label=label)
    axes[0].set(ylabel="images / s", title="Throughput (dotted: ideal, k x 1 worker)")
    axes[1].set(ylabel="speed-up / workers", title="Parallel efficiency")
    axes[1].axhline(1.0, color="gray", linewidth=0.5)
    for ax, (model, (measured, predicted)) in zip(axes[2:], communication.items()):
        ax.bar([k - 0.2 for k in ks], measured, width=0.4, label="measured: DDP step - computation")
        ax.bar([k + 0.2 for k in ks], predicted, width=0.4, label="predicted: buckets x alpha-beta")
        ax.set(ylabel="ms per step", title=f"Communication, {model}")
    for ax in axes:
        ax.set(xlabel="workers", xticks=list(ks))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

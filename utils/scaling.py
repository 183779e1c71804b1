"""How a data-parallel step scales with the number of workers: measured on the engines, and predicted.
Taught in lab 06 (section 3).

``time_scaling`` runs on every engine at once. For each k = 1 .. world size it times, on ranks
0 .. k-1 together (the others wait at a barrier), one training step of a DDP model on a subgroup of k
ranks, and the same step of the bare model (the computation alone), for each per-rank batch asked
for. ``ddp_bucket_bytes`` and ``predicted_comm_seconds`` predict the communication from lab 03's
alpha-beta model and DDP's buckets.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .collectives import ring_all_reduce_seconds

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


def _median_step_ms(model, x, y, group, device, warmup: int, repeats: int) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for i in range(warmup + repeats):
        dist.barrier(group=group)                      # start together: a step waits for the slowest rank
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_scaling(build_model, input_shape, n_classes: int, per_rank_batches: dict, device, *,
                 warmup: int = 3, repeats: int = 10) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, "per_rank": b}}`` for this rank.

    ``per_rank_batches[label]`` maps k to the per-rank batch (e.g. strong scaling ``G // k``, weak
    scaling a constant). Times are this rank's medians; the step of k ranks is as slow as the slowest,
    so take the maximum over ranks. Every rank must call it, with the same arguments.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    groups = {k: dist.new_group(list(range(k))) for k in range(1, world_size + 1)}   # every rank, same order
    timings = {}
    for label, batch_of in per_rank_batches.items():
        for k, group in groups.items():
            if rank < k:
                b = batch_of(k)
                g = torch.Generator().manual_seed(rank)
                x = torch.randn(b, *input_shape, generator=g).to(device)
                y = torch.randint(0, n_classes, (b,), generator=g).to(device)
                torch.manual_seed(0)
                model = build_model().to(device)
                ddp = DistributedDataParallel(model, process_group=group,
                                              device_ids=[device] if device.type == "cuda" else None)
                timings[(label, k)] = {"ddp": _median_step_ms(ddp, x, y, group, device, warmup, repeats),
                                       "compute": _median_step_ms(model, x, y, group, device, warmup, repeats),
                                       "per_rank": b}
                del ddp
            dist.barrier()
    return timings

"""What a DDP step costs in communication: DDP's gradient buckets, their predicted all-reduce time, and a
DDP step measured against the same step without DDP.

``ddp_bucket_bytes`` gives the sizes of the buckets DDP all-reduces (learners write it in lab 06; labs 04
and 05 use it), ``predicted_comm_seconds`` their all-reduce time from lab 03's alpha-beta model
(``utils.collectives``) if nothing overlapped. ``time_ddp_against_bare`` times a DDP step and the bare
step (the computation alone) in turns on subgroups of k ranks, for lab 04's step costs
(``utils.labs.lab04``) and lab 06's scaling (``utils.labs.lab06``).
"""
from __future__ import annotations

import statistics
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils.collectives import ring_all_reduce_seconds
from utils.perf import elapsed_ms
from utils.train import train_step


FIRST_BUCKET_BYTES = 2 ** 20    # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DEFAULT_CAP_MB = 25             # DDP's bucket_cap_mb when none is given (MiB: torch's _MB_TO_BYTES is 2**20)


def ddp_bucket_bytes(param_bytes, bucket_cap_mb: float | None = None) -> list[int]:
    """Sizes of DDP's gradient buckets, in the order they are all-reduced.

    ``param_bytes``: each parameter's gradient size, in the order backward produces them (the last
    layer first). A bucket is closed as soon as it holds at least its limit. With ``bucket_cap_mb``
    left at None (DDP's default) the first bucket's limit is 1 MiB and every later one's 25 MiB; a
    cap given is every bucket's limit, the first one's too (``_BucketCapacityConfig`` in
    torch/nn/parallel/distributed.py), as DDP applies them once it has rebuilt its buckets after the
    first step. Lab 06 has learners write it; tests/library/test_lab06_scaling.py compares it with a real DDP.
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

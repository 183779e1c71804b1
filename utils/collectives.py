"""Collectives by hand: a ring all-reduce, its alpha-beta cost model, and bandwidth measurements.

Taught in labs/03_collectives.ipynb. ``ring_all_reduce`` is the bandwidth-optimal algorithm
(Patarasuk and Yuan, 2009) that NCCL and gloo use for large messages, written with nothing but
``dist.isend`` / ``dist.irecv`` so every step can be read. Unlike the lab's exercise it is
pipelined, as gloo's and NCCL's rings are: each chunk travels in pieces, and a piece is forwarded
to the next rank as soon as it has arrived (and been added), so additions and steps overlap the
transfers (benchmarks/README.md measures the difference). The timing helpers report nccl-tests'
algorithm and bus bandwidth, so the lab's numbers compare with published ones.
"""
from __future__ import annotations

import math
import numbers
import statistics
import time

import torch
import torch.distributed as dist

from .perf import synchronize

# nccl-tests' bus-bandwidth factors as functions of the world size p (see bus_bandwidth).
_BUS_FACTORS = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each rank's chunk of ``numel`` elements, as ``torch.tensor_split`` cuts.

    The first ``numel % world_size`` chunks get one element more, so sizes differ by at most
    one. With fewer elements than ranks the last chunks are empty: ``(k, k)``.
    """
    _check_whole("numel", numel, 0)
    _check_whole("world_size", world_size, 1)
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _check_whole(name: str, value, least: int, why: str = "") -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}{why}, got {value!r}")


def _require_process_group(group=None) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("no torch.distributed process group is initialised: "
                         "call utils.cluster.start() or dist.init_process_group first")
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError("this rank is not a member of `group`: call the collective only on the "
                         "ranks that dist.new_group(ranks) was given")


SEGMENT_BYTES = 1 << 20   # a chunk travels in pieces of 1 MiB, so additions overlap transfers
_receive_buffers: dict = {}


def _receive_buffer(numel: int, dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
    """A scratch tensor of ``numel`` elements, reused by later calls (grown when too small).

    Kept between calls: allocating and page-faulting a fresh one cost as much as the transfer.
    """
    key = (dtype, device, slot)
    buffer = _receive_buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = _receive_buffers[key] = torch.empty(numel, dtype=dtype, device=device)
    return buffer[:numel]


def _wait_all(requests: list) -> None:
    """Wait for each request once, emptying the list: waiting twice on a gloo send waits for another send."""
    while requests:
        requests.pop(0).wait()


def _pieces(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks of ``group`` (default: the default group), in place; returns it.

    The flattened tensor is cut into p chunks (``chunk_bounds``). Reduce-scatter: in each of p-1
    steps every rank sends one chunk to its right neighbour and adds the chunk arriving from its
    left one; then rank r holds the full sum of chunk (r+1) % p. All-gather: p-1 more steps pass
    the finished chunks round the ring. Each rank sends 2(p-1)/p of the tensor whatever p is:
    the least any all-reduce can send, hence "bandwidth-optimal".
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise ValueError(f"ring_all_reduce needs a dense tensor, got layout {tensor.layout}: call .to_dense() first")
    _require_process_group(group)
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    if p == 1 or tensor.numel() == 0:
        return tensor  # the sum over one rank is the tensor itself; an empty tensor has nothing to send
    # isend/irecv take ranks in the default group; a subgroup's rank i may be another global rank.
    right = dist.get_global_rank(group, (rank + 1) % p) if group is not None else (rank + 1) % p
    left = dist.get_global_rank(group, (rank - 1) % p) if group is not None else (rank - 1) % p

    # Work on a flat view when the memory is contiguous (the sum lands in `tensor` directly);
    # otherwise on a contiguous copy that is copied back at the end. detach(): communication is
    # not part of the autograd graph, as with dist.all_reduce.
    contiguous = tensor.is_contiguous()
    flat = (tensor.detach() if contiguous else tensor.detach().contiguous()).view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    incoming = [_receive_buffer(bounds[0][1] - bounds[0][0], flat.dtype, flat.device, slot) for slot in (0, 1)]
    piece = max(1, SEGMENT_BYTES // flat.element_size())
    steps = 2 * (p - 1)
    pieces = [_pieces(start, stop, piece) for start, stop in bounds]
    n_pieces = max(len(cut) for cut in pieces)

    # Step t (0 .. 2p-3) sends chunk (r - t) % p to the right and receives chunk (r - t - 1) % p
    # from the left: the first p-1 steps add what arrives (reduce-scatter; after them chunk
    # (r+1) % p holds the full sum), the last p-1 store it (all-gather). The chunk received in
    # step t is the one sent in step t+1, so each piece is forwarded as soon as it has arrived
    # (and been added): the steps overlap, as in gloo's and NCCL's pipelined rings.
    def send_chunk(t: int) -> int:
        return (rank - t) % p

    def tag(t: int, i: int) -> int:
        return t * n_pieces + i  # unique per message: receives of two steps may be pending at once

    sends: list[list] = [[] for _ in range(steps)]

    def post_sends(t: int, chunk_pieces) -> None:
        for i, (a, b) in chunk_pieces:
            sends[t].append(dist.isend(flat[a:b], right, group=group, tag=tag(t, i)))

    def post_receives(t: int) -> list:
        chunk = send_chunk(t + 1)
        start = bounds[chunk][0]
        if t < p - 1:
            # Hazard: an irecv writes its buffer until wait() returns. Receiving into the chunk
            # being reduced would let incoming bytes overwrite our own contribution before it is
            # added, so the reduce-scatter receives into a scratch buffer (two, alternating: the
            # next step's receives are posted while this step's are being added).
            target = incoming[t % 2]
            return [(a, b, dist.irecv(target[a - start:b - start], left, group=group, tag=tag(t, i)))
                    for i, (a, b) in enumerate(pieces[chunk])]
        # The all-gather receives straight into the tensor, but chunk c was sent, as a partial
        # sum, p steps earlier: that send must have finished reading it before it is overwritten.
        earlier = t + 1 - p
        if earlier >= 0:
            _wait_all(sends[earlier])
        return [(a, b, dist.irecv(flat[a:b], left, group=group, tag=tag(t, i)))
                for i, (a, b) in enumerate(pieces[chunk])]

    # Every message is posted before any wait: blocking send-then-recv on every rank at once can
    # deadlock (each rank waits for a receiver that is itself still sending). Sender and receiver
    # cut the same chunk_bounds into the same pieces, so they agree on every message.
    post_sends(0, enumerate(pieces[send_chunk(0)]))
    receives = post_receives(0)
    for t in range(steps):
        following = post_receives(t + 1) if t + 1 < steps else []
        start = bounds[send_chunk(t + 1)][0]
        for i, (a, b, request) in enumerate(receives):
            request.wait()
            if t < p - 1:
                flat[a:b] += incoming[t % 2][a - start:b - start]
            if t + 1 < steps:
                post_sends(t + 1, [(i, (a, b))])
        receives = following
    for step_sends in sends:
        _wait_all(step_sends)

    if not contiguous:
        tensor.detach().copy_(flat.view_as(tensor))
    return tensor


def algorithm_bandwidth(n_bytes: float, seconds: float) -> float:
    """Bytes per second as the user sees it: message size over time (nccl-tests' ``algbw``)."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}: time at least one call")
    return n_bytes / seconds


def bus_bandwidth(n_bytes: float, seconds: float, world_size: int, op: str = "all_reduce") -> float:
    """Bytes per second through the busiest link (nccl-tests' ``busbw``), comparable across p.

    ``busbw = algbw * factor(p)``: 2(p-1)/p for all_reduce, (p-1)/p for all_gather, reduce_scatter
    and all_to_all, 1 for broadcast and reduce: the share of the message each rank must move with
    an optimal algorithm, so busbw nears the link's bandwidth whatever p is. ``n_bytes`` is the
    full message (all_gather: the gathered output; reduce_scatter: the input). Definitions from
    https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
    """
    if op not in _BUS_FACTORS:
        raise ValueError(f"unknown op {op!r}: use one of {', '.join(_BUS_FACTORS)}")
    _check_whole("world_size", world_size, 1)
    return algorithm_bandwidth(n_bytes, seconds) * _BUS_FACTORS[op](world_size)


def ring_all_reduce_seconds(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Alpha-beta model of the ring: ``2(p-1) * alpha + 2(p-1)/p * n_bytes * beta``.

    2(p-1) steps each pay the latency ``alpha`` (seconds per message); each step moves n/p
    bytes at ``beta`` seconds per byte. The reduction's arithmetic is left out.
    """
    _check_whole("world_size", world_size, 1)
    if n_bytes < 0 or alpha < 0 or beta < 0:
        raise ValueError(f"n_bytes, alpha and beta must be >= 0, got {n_bytes!r}, {alpha!r}, {beta!r}")
    p = world_size
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta


def predicted_speedup(workers, compute_s: float, grad_bytes: float, alpha: float, beta: float) -> list[float]:
    """Weak-scaling speed-up of p workers when each step adds one ring all-reduce of the gradients
    (``ring_all_reduce_seconds``) to ``compute_s`` of computation, without overlap: p t_c / (t_c + t_ring)."""
    return [p * compute_s / (compute_s + ring_all_reduce_seconds(grad_bytes, p, alpha, beta)) for p in workers]


def fit_alpha_beta(n_bytes, seconds, world_size: int | None = None, *, relative: bool = True) -> tuple[float, float]:
    """Least-squares ``(alpha, beta)`` of ``t = alpha + beta * n``, both >= 0.

    With ``world_size`` the ring model is fitted instead: ``t = 2(p-1) alpha + 2(p-1)/p n beta``.
    ``relative=True`` (default) minimises relative residuals ``(t - model) / t``: timing noise
    grows with the time, and plain residuals (``relative=False``) let the largest message's noise
    decide alpha. Non-negative least squares, exactly: with two unknowns the best fit has both
    > 0 or one at 0, so the three candidates are tried and the best feasible one is kept.
    """
    n, t = [float(v) for v in n_bytes], [float(v) for v in seconds]
    if len(n) != len(t):
        raise ValueError(f"n_bytes and seconds must have the same length, got {len(n)} and {len(t)}")
    if len(set(n)) < 2:
        raise ValueError("fitting two parameters needs measurements at two or more different sizes")
    if any(not math.isfinite(v) or v < 0 for v in n + t):
        raise ValueError("n_bytes and seconds must be finite and >= 0")
    if relative and min(t) <= 0:
        raise ValueError("relative=True divides by each time: every time must be > 0 (or use relative=False)")
    if world_size is None:
        c_alpha, c_beta = 1.0, 1.0
    else:
        _check_whole("world_size", world_size, 2, " (one rank sends nothing)")
        c_alpha, c_beta = 2.0 * (world_size - 1), 2.0 * (world_size - 1) / world_size
    # Fit y = a + b x with x = c_beta n; then alpha = a / c_alpha, beta = b.
    x = [c_beta * v for v in n]
    w = [1.0 / v ** 2 for v in t] if relative else [1.0] * len(t)

    def error(a: float, b: float) -> float:
        return sum(wi * (yi - a - b * xi) ** 2 for wi, xi, yi in zip(w, x, t))

    sw = sum(w)
    x_mean = sum(wi * xi for wi, xi in zip(w, x)) / sw
    y_mean = sum(wi * yi for wi, yi in zip(w, t)) / sw
    # Centred normal equations: stable although sizes span many orders of magnitude.
    sxx = sum(wi * (xi - x_mean) ** 2 for wi, xi in zip(w, x))
    sxy = sum(wi * (xi - x_mean) * (yi - y_mean) for wi, xi, yi in zip(w, x, t))
    b = sxy / sxx
    through_origin = sum(wi * xi * yi for wi, xi, yi in zip(w, x, t)) / sum(wi * xi * xi for wi, xi in zip(w, x))
    candidates = [(y_mean - b * x_mean, b), (0.0, through_origin), (y_mean, 0.0)]
    a, b = min((c for c in candidates if c[0] >= 0 and c[1] >= 0), key=lambda c: error(*c))
    return a / c_alpha, b


def time_collective(fn, *, warmup: int = 2, repeats: int = 10) -> float:
    """Median seconds of ``fn()`` on this rank; every rank must call it at the same time.

    ``warmup`` untimed calls first (connections, allocations); then each timed call starts
    after a ``dist.barrier()``, so no rank's clock includes waiting for a late neighbour.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, e.g. lambda: dist.all_reduce(x), got {fn!r}")
    _check_whole("warmup", warmup, 0)
    _check_whole("repeats", repeats, 1)
    _require_process_group()
    for _ in range(warmup):
        fn()
    synchronize()  # CUDA collectives return before the GPU has finished
    times = []
    for _ in range(repeats):
        dist.barrier()
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sweep(op, sizes_bytes, *, warmup: int = 2, repeats: int = 10, dtype: torch.dtype = torch.float32,
          device=None) -> list[dict]:
    """Time ``op(tensor)`` (e.g. ``dist.all_reduce`` or ``ring_all_reduce``) at each message size.

    Returns one dict per size with ``n_bytes``, ``seconds`` (the slowest rank's median: a
    collective is finished only when every rank is), ``algbw`` and ``busbw`` in bytes per
    second (all-reduce factors). Every rank returns the same list. ``device`` defaults to the
    current GPU with nccl and to the CPU otherwise.
    """
    _require_process_group()
    item = torch.empty((), dtype=dtype).element_size()
    sizes = list(sizes_bytes)
    for n in sizes:
        if not isinstance(n, numbers.Integral) or n < 0 or n % item:
            raise ValueError(f"each size must be a whole number of bytes >= 0 and a multiple of {item} "
                             f"(the size of {dtype}), got {n!r}")
    if device is None:
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    p = dist.get_world_size()
    results = []
    for n in sizes:
        # Zeros stay zeros under repeated in-place sums: no overflow to inf however many repeats.
        tensor = torch.zeros(n // item, dtype=dtype, device=device)
        median = time_collective(lambda: op(tensor), warmup=warmup, repeats=repeats)
        slowest = torch.tensor([median], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.item()
        results.append(dict(n_bytes=int(n), seconds=seconds, algbw=algorithm_bandwidth(n, seconds),
                            busbw=bus_bandwidth(n, seconds, p, "all_reduce")))
    return results

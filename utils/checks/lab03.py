"""Checks for labs/03_collectives.ipynb.

The exercises are functions defined in the notebook that run on every engine at once; the
machinery that ships them there and reports per rank is in ``engines``.
"""
from __future__ import annotations

import torch

from . import exercise
from ..collectives import chunk_bounds
from .engines import _POINT_TO_POINT, _Wrong, _prepare, _run_cases, _spy

def _fmt(t: torch.Tensor, limit: int = 8) -> str:
    values = t.detach().flatten().tolist()
    text = ", ".join(f"{v:g}" for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"


def _matrices(n: int, k: int, m: int, seed: int):
    """The same small integer-valued A (n, k) and B (k, m) on every rank: products are exact."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, (n, k), generator=g).float(), torch.randint(-3, 4, (k, m), generator=g).float())


def _rows_job(matmul_by_rows, n, k, m, seed):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    A, B = _matrices(n, k, m, seed)
    with _spy(torch.float32) as calls:
        out = matmul_by_rows(A.clone(), B.clone()) if rank == 0 else matmul_by_rows(None, None)
    case = f"A of shape ({n}, {k}) @ B of shape ({k}, {m}) on {p} ranks"
    if sum(v for name, v in calls.items() if name != "elements_sent") == 0:
        raise _Wrong(f"rank {rank} made no torch.distributed call for {case}: broadcast B, scatter the rows "
                     f"of A, gather the results (every rank takes part)")
    if rank != 0:
        return
    expected = A @ B
    if out is None:
        raise _Wrong(f"rank 0 returned None for {case}: return the gathered product A @ B on rank 0")
    if not isinstance(out, torch.Tensor):
        raise _Wrong(f"rank 0 returned a {type(out).__name__} for {case}; return a tensor")
    if tuple(out.shape) != (n, m):
        extra = (f": the {out.shape[0] - n} padding row(s) must be cut off (result[:{n}])"
                 if out.dim() == 2 and out.shape[0] > n and out.shape[1] == m else "")
        raise _Wrong(f"rank 0 returned shape {tuple(out.shape)} for {case}, expected ({n}, {m}){extra}")
    out = out.detach().to("cpu", torch.float32)
    if not torch.allclose(out, expected, atol=1e-4):
        bad = [i for i in range(n) if not torch.allclose(out[i], expected[i], atol=1e-4)]
        raise _Wrong(f"rank 0 got wrong rows {bad[:10]}{' ...' if len(bad) > 10 else ''} of A @ B for {case}: "
                     f"row {bad[0]} should be "
                     f"{_fmt(expected[bad[0]])}, got {_fmt(out[bad[0]])}")


def _reduction_job(matmul_by_reduction, n, k, m, seed):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    A, B = _matrices(n, k, m, seed)
    with _spy(torch.float32) as calls:
        out = matmul_by_reduction(A.clone(), B.clone())
    case = f"A of shape ({n}, {k}) @ B of shape ({k}, {m}) on {p} ranks"
    expected = A @ B
    if out is None or not isinstance(out, torch.Tensor):
        raise _Wrong(f"rank {rank} returned {type(out).__name__} for {case}: every rank returns A @ B")
    if tuple(out.shape) != (n, m):
        raise _Wrong(f"rank {rank} returned shape {tuple(out.shape)} for {case}, expected ({n}, {m})")
    out = out.detach().to("cpu", torch.float32)
    if torch.allclose(out, expected, atol=1e-4):
        if sum(v for name, v in calls.items() if name != "elements_sent") == 0:
            raise _Wrong(f"rank {rank} computed all of A @ B itself for {case}: multiply only its slice of the "
                         f"inner dimension and all_reduce the partial products")
        return
    start, stop = chunk_bounds(k, p)[rank]
    hints = []
    if torch.allclose(out, A[:, start:stop] @ B[start:stop], atol=1e-4):
        hints.append(f"this is rank {rank}'s own partial product A[:, {start}:{stop}] @ B[{start}:{stop}]: "
                     f"sum the partial products of all ranks with dist.all_reduce")
    elif torch.allclose(out, expected * p, atol=1e-4):
        hints.append(f"this is {p} x A @ B: every rank multiplied the whole inner dimension; multiply only "
                     f"your slice (chunk_bounds({k}, world_size)[rank])")
    elif torch.allclose(out * p, expected, atol=1e-4):
        hints.append("this is A @ B / world_size: all_reduce with the default op, SUM, not AVG")
    else:
        width = k // p
        floor = sum((A[:, r * width:(r + 1) * width] @ B[r * width:(r + 1) * width] for r in range(p)),
                    torch.zeros(n, m))
        if k % p and torch.allclose(out, floor, atol=1e-4):
            hints.append(f"the inner size {k} does not divide by {p} ranks, and {k} // {p} = {width} columns "
                         f"per rank drop the last {k % p}: use chunk_bounds({k}, world_size)[rank]")
    raise _Wrong(f"rank {rank} got a wrong product for {case}: first row should be {_fmt(expected[0])}, got "
                 f"{_fmt(out[0])}" + (f"; {hints[0]}" if hints else ""))


def _ring_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(numel) % 7 + 1) * (rank + 1) + rank).to(dtype)


def _ring_job(ring_all_reduce, shape, dtype_name):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    numel = 1
    for size in shape:
        numel *= size
    x = _ring_input(rank, numel, dtype).reshape(shape)
    expected = x.clone()
    dist.all_reduce(expected)  # the built-in all-reduce is the reference
    tensor = x.clone()
    with _spy(dtype) as calls:
        returned = ring_all_reduce(tensor)
    article = "an" if dtype_name[0] in "aeiou" else "a"
    case = f"{article} {dtype_name} tensor of shape {tuple(shape)} ({numel} elements) on {p} ranks"
    collectives = sorted(name for name in calls if name not in _POINT_TO_POINT and name != "elements_sent")
    if collectives:
        raise _Wrong(f"rank {rank} called dist.{', dist.'.join(collectives)} for {case}: build the ring from "
                     f"point-to-point messages only (dist.isend / dist.irecv, or send / recv)")
    if not torch.equal(tensor, expected):
        if isinstance(returned, torch.Tensor) and returned is not tensor and torch.equal(returned, expected):
            raise _Wrong(f"rank {rank} returned the right sum for {case} but left `tensor` unchanged: sum in "
                         f"place, like dist.all_reduce (work on flat = tensor.view(-1), a view of it)")
        if torch.equal(tensor, x):
            raise _Wrong(f"rank {rank}'s tensor is unchanged after your ring for {case}: the sum must be "
                         f"written into `tensor` itself (flat = tensor.view(-1) is a view: writing into flat "
                         f"writes into tensor)")
        flat, want = tensor.reshape(-1), expected.reshape(-1)
        bounds = chunk_bounds(numel, p)
        complete = [c for c, (a, b) in enumerate(bounds) if b > a and torch.equal(flat[a:b], want[a:b])]
        wrong = [i for i in range(numel) if flat[i] != want[i]]
        first = wrong[0]
        chunk = next(c for c, (a, b) in enumerate(bounds) if a <= first < b)
        message = (f"rank {rank} got a wrong sum for {case}: element {first} (in chunk {chunk}, elements "
                   f"{bounds[chunk][0]}:{bounds[chunk][1]}) should be {want[first].item():g}, got "
                   f"{flat[first].item():g} (wrong elements: {len(wrong)} of {numel})")
        if numel % p == 0 and len(complete) == 1:
            message += (f". Only chunk {complete[0]} holds the full sum: that is where the reduce-scatter "
                        f"phase ends; the all-gather phase (p-1 more steps that pass the finished chunks "
                        f"on and copy them) is missing or wrong")
        raise _Wrong(message)
    largest = -(-numel // p)
    if p > 2 and numel >= p and calls["elements_sent"] > 2 * (p - 1) * largest:
        raise _Wrong(f"rank {rank} sent {calls['elements_sent']} elements for {case}; a bandwidth-optimal ring "
                     f"sends 2(p-1) chunks of about n/p elements, {2 * (p - 1) * largest} at most: send one "
                     f"chunk per step, not the whole tensor")



def check_matmul_by_rows(workers, matmul_by_rows) -> None:
    """Exercise 3.1: ``matmul_by_rows(A, B)``: rows of A scattered, B broadcast, rows gathered on rank 0."""
    name = "Exercise 3.1 (matmul by rows)"
    with exercise(name):
        _prepare(workers, matmul_by_rows, name)
        p = workers.n
        shapes = [(2 * p, 3, 4), (7, 5, 3), (1, 4, 2), (2 * p + 1, 3, 3), (5, 1, 6)]
        cases = [((n, k, m, 10 + i), f"A ({n}, {k}) @ B ({k}, {m})") for i, (n, k, m) in enumerate(shapes)]
        _run_cases(workers, name, _rows_job, matmul_by_rows, cases,
                   lambda args, passed: (f" ({args[0]} rows on {p} ranks: sizes that do not divide by the world "
                                         f"size need uneven chunks: pad A to {p} * ceil({args[0]}/{p}) rows for "
                                         f"scatter and cut the padding off the result, or send each rank its "
                                         f"chunk_bounds({args[0]}, {p}) rows)" if args[0] % p else ""))
    print(f"  checked on {p} ranks: {'; '.join(label for _, label in cases)}")


def check_matmul_by_reduction(workers, matmul_by_reduction) -> None:
    """Exercise 3.2: ``matmul_by_reduction(A, B)``: inner dimension split, partial products all-reduced."""
    name = "Exercise 3.2 (matmul by reduction)"
    with exercise(name):
        _prepare(workers, matmul_by_reduction, name)
        p = workers.n
        shapes = [(4, 2 * p, 3), (7, 5, 3), (2, 3, 4), (3, 1, 2), (6, 2 * p + 1, 5)]
        cases = [((n, k, m, 20 + i), f"A ({n}, {k}) @ B ({k}, {m})") for i, (n, k, m) in enumerate(shapes)]
        _run_cases(workers, name, _reduction_job, matmul_by_reduction, cases,
                   lambda args, passed: (f" (inner size {args[1]} on {p} ranks: use chunk_bounds, some slices are "
                                         f"shorter{', some empty' if args[1] < p else ''})" if args[1] % p else ""))
    print(f"  checked on {p} ranks: {'; '.join(label for _, label in cases)}")


def check_ring_all_reduce(workers, ring_all_reduce) -> None:
    """Exercise 3.3: ``ring_all_reduce(tensor)``: in-place sum by reduce-scatter + all-gather over a ring."""
    name = "Exercise 3.3 (ring all-reduce)"
    with exercise(name):
        _prepare(workers, ring_all_reduce, name)
        p = workers.n
        shapes = [((3 * p,), "float32"), ((1000 * p,), "float32"), ((7,), "float32"), ((2 * p + 1,), "float64"),
                  ((1,), "float32"), ((3, 5), "float32"), ((p + 3,), "int64")]
        cases = [((shape, dtype), f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {shape}")
                 for shape, dtype in shapes]

        def hint(args, passed):
            shape, dtype = args
            numel = 1
            for size in shape:
                numel *= size
            hints = []
            if numel % p and all(len(s) == 1 and s[0] % p == 0 for s, _ in passed):
                hints.append(f"{numel} elements on {p} ranks: sizes that do not divide by the world size need "
                             f"uneven chunks (chunk_bounds(numel, world_size))")
            if numel < p:
                hints.append("fewer elements than ranks: some chunks are empty, and both neighbours must agree "
                             "on whether such a message is sent")
            if len(shape) > 1:
                hints.append("a 2-D tensor: work on flat = tensor.view(-1)")
            return f" ({'; '.join(hints)})" if hints else ""

        _run_cases(workers, name, _ring_job, ring_all_reduce, cases, hint)
    print(f"  checked against dist.all_reduce on {p} ranks: {'; '.join(label for _, label in cases)}")

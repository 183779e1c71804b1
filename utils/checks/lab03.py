"""Checks for labs/03_collectives.ipynb.

The exercises are functions defined in the notebook that run on every engine at once; the
machinery that ships them there and reports per rank is in ``engines``. Besides the result, each
check watches how the work is done, because that is what the exercise teaches: how many
multiply-adds each rank does (its share of the product), how many elements each rank receives
(3.1) or sends (3.3), and to whom a ring rank talks. Collectives are checked before they run: every
rank must call the same one with a tensor of the same size and dtype (gloo moves raw bytes, so a
mismatch arrives as garbage or aborts an engine). Run the checks on 3 ranks or more: at 2 ranks the
left and the right neighbour are the same rank, and many wrong schedules give the right sum.
"""
from __future__ import annotations

import functools
import inspect
import math
from contextlib import contextmanager

import torch

from . import Incorrect, exercise, expect, hint_for
from ..collectives import chunk_bounds
from .engines import POINT_TO_POINT, Wrong, prepare, replaced_in_dist, run_case, spy

HINTS = {
    "3.1": """Step by step (every rank runs the same function; only rank 0 has A and B):
1. rank, p = dist.get_rank(), dist.get_world_size().
2. Shapes: rank 0 makes torch.tensor([n, k, m]); the others torch.zeros(3, dtype=torch.int64) (the SAME
   dtype as rank 0's: gloo moves raw bytes). dist.broadcast(shape, src=0); n, k, m = shape.tolist().
3. B: the other ranks allocate torch.empty(k, m); every rank calls dist.broadcast(B, src=0).
4. rows = ceil(n / p). Rank 0 copies A into torch.zeros(rows * p, k) and splits it into p chunks of
   `rows` rows (padded.split(rows)); the others pass None. Every rank allocates torch.empty(rows, k)
   and calls dist.scatter(mine, chunks, src=0).
5. result = mine @ B (only your rows: your share of the work).
6. Rank 0 allocates p tensors torch.empty(rows, m) to gather into, the others pass None;
   dist.gather(result, gathered, dst=0). Rank 0 returns torch.cat(gathered)[:n]; the others None.""",
    "3.2": """Step by step:
1. a, b = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]: your slice of the inner dimension.
2. partial = A[:, a:b] @ B[a:b]: shape (n, m), a matrix of zeros when the slice is empty.
3. dist.all_reduce(partial) sums the partial products in place on every rank (the default op is SUM;
   dist.reduce would leave the sum on one rank only). Return partial.""",
    "3.3": """Step by step:
1. rank, p = dist.get_rank(), dist.get_world_size(); right, left = (rank + 1) % p, (rank - 1) % p.
2. flat = tensor.view(-1) (a view: writing into flat writes into tensor); bounds = chunk_bounds(flat.numel(), p);
   buffer = torch.empty(largest chunk size, dtype=flat.dtype).
3. One step: s0, s1 = bounds[chunk to send]; r0, r1 = bounds[chunk to receive];
   requests = [dist.isend(flat[s0:s1], right), dist.irecv(buffer[:r1 - r0], left)]; wait on both.
4. Reduce-scatter, for s in range(p - 1): send chunk (rank - s) % p, receive chunk (rank - s - 1) % p,
   then flat[r0:r1] += buffer[:r1 - r0].
5. All-gather, for s in range(p - 1): send chunk (rank + 1 - s) % p, receive chunk (rank - s) % p,
   then flat[r0:r1].copy_(buffer[:r1 - r0]). Return tensor.""",
}


hint = hint_for(HINTS)  # lab03.hint("3.1") prints that exercise's step-by-step hint


# --- on the engines ------------------------------------------------------------------------

_PRODUCTS = {"matmul", "__matmul__", "mm", "addmm", "linear", "bmm", "baddbmm", "mv", "addmv",
             "einsum", "tensordot", "dot", "inner", "vdot", "outer"}
# Collectives compared across ranks before they run: the tensor every rank passes (argument name).
_COLLECTIVES = {"broadcast": "tensor", "all_reduce": "tensor", "reduce": "tensor", "scatter": "tensor",
                "gather": "tensor", "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
                "reduce_scatter_tensor": "output", "all_to_all_single": None, "barrier": None}  # None: sizes may differ
_COLLECTIVE_CODES = {name: i + 1 for i, name in enumerate(_COLLECTIVES)}
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _multiply_adds(name: str, args, out) -> int:
    """Multiply-adds of one product: for einsum the product of every index's size, else the output's
    elements times the inner size."""
    if not isinstance(out, torch.Tensor):
        return 0
    if name == "einsum":
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = operands[0]
        sizes = {}
        for letters, operand in zip(equation.replace(" ", "").split("->")[0].split(","), operands):
            if "..." in letters:
                return out.numel() * operand.shape[-1]
            sizes.update(zip(letters, operand.shape))
        return math.prod(sizes.values())
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("addmm", "baddbmm", "addmv"):
        tensors = tensors[1:]  # the first is the term added
    if not tensors:
        return 0
    if name in ("tensordot", "outer") and len(tensors) >= 2:
        # every index appears in two of a, b and the output: sqrt(|a| |b| |out|) multiply-adds
        return int(round(math.sqrt(tensors[0].numel() * tensors[1].numel() * out.numel())))
    return out.numel() * (tensors[0].shape[-1] if tensors[0].dim() else 1)


@contextmanager
def _count_products():
    """Count the multiply-adds of the matrix products computed inside the block (``torch`` calls,
    ``@``, ``nn.functional.linear``, ``einsum``), in ``counted["multiply_adds"]``."""
    from torch.overrides import TorchFunctionMode

    counted = {"multiply_adds": 0}

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in _PRODUCTS:
                counted["multiply_adds"] += _multiply_adds(name, args, out)
            return out

    with Count():
        yield counted


def _describe(dtype_code: int, numel: int) -> str:
    dtype = _DTYPES[dtype_code - 1] if 0 < dtype_code <= len(_DTYPES) else "other"
    return f"a {dtype if dtype_code else 'non-tensor'} tensor of {numel} element(s)"


@contextmanager
def _traffic(rank: int):
    """Inside the block, on this rank: record the elements this rank receives and sends, the ranks it
    sends to and receives from, and, before each collective runs, compare it across ranks: every rank must
    call the same collective with a tensor of the same size and dtype, else every rank raises the
    same clear Wrong (gloo would deliver garbage, abort an engine or wait for ever).

    Enter it before ``engines.spy``: the spy then adds the check's group to each call, and this
    wrapper sees it."""
    import torch.distributed as dist

    log = {"received": 0, "sent": 0, "sent_to": set(), "received_from": set()}
    depth = [0]
    watched = set(_COLLECTIVES) | POINT_TO_POINT - {"batch_isend_irecv"}
    saved = {name: getattr(dist, name) for name in watched if hasattr(dist, name)}
    gather = saved.get("all_gather")

    def agree(name, bound):
        group = bound.arguments.get("group")
        p = dist.get_world_size(group)
        argument = _COLLECTIVES[name]
        tensor = bound.arguments.get(argument) if argument else None
        fine = 1
        if name == "scatter" and bound.arguments.get("scatter_list") is not None and isinstance(tensor, torch.Tensor):
            chunks = bound.arguments["scatter_list"]
            fine = int(len(chunks) == p and all(isinstance(c, torch.Tensor) and c.numel() == tensor.numel()
                                                and c.dtype == tensor.dtype for c in chunks))
        if isinstance(tensor, torch.Tensor):
            code = _DTYPES.index(tensor.dtype) + 1 if tensor.dtype in _DTYPES else len(_DTYPES) + 1
            mine = torch.tensor([_COLLECTIVE_CODES[name], tensor.numel(), code, fine], dtype=torch.int64)
        else:
            mine = torch.tensor([_COLLECTIVE_CODES[name], 0, 0, fine], dtype=torch.int64)
        everyone = [torch.empty(4, dtype=torch.int64) for _ in range(p)]
        gather(everyone, mine, group=group)
        rows = [t.tolist() for t in everyone]
        names = {r: next(n for n, c in _COLLECTIVE_CODES.items() if c == row[0]) for r, row in enumerate(rows)}
        if len(set(names.values())) > 1:
            calls = ", ".join(f"rank {r} dist.{n}" for r, n in names.items())
            raise Wrong(f"the ranks called different collectives at the same point ({calls}): every rank must "
                         f"call the same collectives in the same order")
        if argument and len({(row[1], row[2]) for row in rows}) > 1:
            shown = "; ".join(f"rank {r}: {_describe(row[2], row[1])}" for r, row in enumerate(rows))
            dtypes = {row[2] for row in rows}
            why = (" (torch.tensor([n, k, m]) is int64, torch.zeros(3) float32: give the tensor one dtype on "
                   "every rank, e.g. dtype=torch.int64)" if len(dtypes) > 1 else "")
            raise Wrong(f"dist.{name} was given tensors that differ between ranks ({shown}): every rank must "
                         f"pass a tensor of the same size and dtype{why}; gloo moves raw bytes, so a mismatch "
                         f"arrives as garbage or aborts the receiving engine")
        if not all(row[3] for row in rows):
            raise Wrong(f"dist.scatter's list on the source rank must hold {p} tensors, each of the size and "
                         f"dtype of the tensor every rank receives into: pad the rows so the chunks are equal")

    def received(name, bound):
        src = bound.arguments.get("src", bound.arguments.get("dst"))
        tensor = bound.arguments.get("tensor")
        if name == "broadcast" and src != rank:
            return tensor.numel()
        if name == "scatter" and src != rank:
            return tensor.numel()
        if name == "gather" and bound.arguments.get("dst") == rank and bound.arguments.get("gather_list"):
            return sum(t.numel() for t in bound.arguments["gather_list"]) - tensor.numel()
        if name == "all_gather":
            return sum(t.numel() for t in bound.arguments["tensor_list"]) - tensor.numel()
        if name == "all_gather_into_tensor":
            return bound.arguments["output_tensor"].numel() - bound.arguments["input_tensor"].numel()
        if name in ("all_reduce", "reduce", "all_to_all_single", "reduce_scatter_tensor"):
            first = next(v for v in bound.arguments.values() if isinstance(v, torch.Tensor))
            return first.numel()
        if name in ("recv", "irecv"):
            return tensor.numel()
        return 0

    def wrap(name, original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def watch(*args, **kwargs):
            # Without the product-counting mode: under a TorchFunctionMode torch.distributed takes
            # another path (functional collectives) that would call these wrappers again. And only
            # the learner's own call counts: dist.send calls dist.isend, dist.recv dist.irecv.
            with torch._C.DisableTorchFunction():
                if depth[0]:
                    return original(*args, **kwargs)
                depth[0] += 1
                try:
                    return observed(*args, **kwargs)
                finally:
                    depth[0] -= 1

        def observed(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)
            if name in _COLLECTIVES:
                agree(name, bound)
            peer = next((bound.arguments[key] for key in ("dst", "src", "group_dst", "group_src")
                         if bound.arguments.get(key) is not None), None)
            if name in ("send", "isend"):
                log["sent_to"].add(peer)
                log["sent"] += bound.arguments["tensor"].numel()
            if name in ("recv", "irecv"):
                log["received_from"].add(peer)
            if name != "barrier":
                log["received"] += received(name, bound)
            return original(*args, **kwargs)
        return watch

    with replaced_in_dist({name: wrap(name, original) for name, original in saved.items()}):
        yield log


def _fmt(t: torch.Tensor, limit: int = 6) -> str:
    values = t.detach().flatten().tolist()
    text = ", ".join(f"{v:.4g}" for v in values[:limit])
    return f"[{text}{', ...' if len(values) > limit else ''}]"


def _matrices(n: int, k: int, m: int, seed: int):
    """The same A (n, k) and B (k, m) on every rank: random floats of mixed signs, which bfloat16 or
    float16 would round (small integers would hide a wrong dtype), with values in every position."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), torch.randn(k, m, generator=g)


def _close(out: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal up to float32 rounding of a sum of products (another summation order)."""
    return (out - expected).abs() <= 1e-5 + 1e-4 * expected.abs()


def _first_wrong(out: torch.Tensor, expected: torch.Tensor) -> str:
    """Where the first wrong element is, and that row as it should be and as it is."""
    wrong = (~_close(out, expected)).nonzero().tolist()
    i, j = wrong[0]
    rows = sorted({row for row, _ in wrong})
    return (f"{len(wrong)} of {expected.numel()} elements wrong, in row(s) {rows[:8]}{' ...' if len(rows) > 8 else ''}; "
            f"first at [{i}, {j}]: row {i} should be {_fmt(expected[i])}, got {_fmt(out[i])}")


def _rows_job(matmul_by_rows, n, k, m, seed):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    A, B = _matrices(n, k, m, seed)
    # recv_dtype None: the shape may travel by send / recv as int64 while the matrices are float32
    with _traffic(rank) as log, spy(None) as calls, _count_products() as work:
        out = matmul_by_rows(A.clone(), B.clone()) if rank == 0 else matmul_by_rows(None, None)
    case = f"A of shape ({n}, {k}) @ B of shape ({k}, {m}) on {p} ranks"
    if sum(v for name, v in calls.items() if name != "elements_sent") == 0:
        raise Wrong(f"rank {rank} made no torch.distributed call for {case}: broadcast B, scatter the rows "
                     f"of A, gather the results (every rank takes part)")
    if rank != 0 and out is not None:
        raise Wrong(f"rank {rank} returned a {type(out).__name__} for {case}: only rank 0 holds the product; "
                     f"return None on the other ranks")
    if rank == 0:
        expected = A @ B
        if out is None:
            raise Wrong(f"rank 0 returned None for {case}: return the gathered product A @ B on rank 0")
        if not isinstance(out, torch.Tensor):
            raise Wrong(f"rank 0 returned a {type(out).__name__} for {case}; return a tensor")
        if tuple(out.shape) != (n, m):
            extra = (f": the {out.shape[0] - n} padding row(s) must be cut off (result[:{n}])"
                     if out.dim() == 2 and out.shape[0] > n and out.shape[1] == m else "")
            raise Wrong(f"rank 0 returned shape {tuple(out.shape)} for {case}, expected ({n}, {m}){extra}")
        if out.dtype != torch.float32:
            raise Wrong(f"rank 0 returned a {out.dtype} product for {case}: A and B are float32, keep float32")
        out = out.detach().cpu()
        if not _close(out, expected).all():
            raise Wrong(f"rank 0 got a wrong A @ B for {case}: {_first_wrong(out, expected)}")
    share = -(-n // p)
    if work["multiply_adds"] > share * k * m:
        rows = work["multiply_adds"] // max(k * m, 1)
        raise Wrong(f"rank {rank} multiplied {rows} rows of A by B for {case} ({work['multiply_adds']} "
                     f"multiply-adds); its share is ceil({n}/{p}) = {share} rows: each rank multiplies only the "
                     f"rows it was sent" + (", rank 0 included (not all of A @ B)" if rank == 0 else ""))
    allowed = k * m + share * k + 16  # B, my rows of A, the shapes and a few more numbers
    if rank != 0 and log["received"] > allowed:
        raise Wrong(f"rank {rank} received {log['received']} elements for {case}, more than B ({k * m}) and its "
                     f"{share} rows of A ({share * k}): send each rank only its rows (dist.scatter), not the whole "
                     f"of A, and gather the results on rank 0 only (dist.gather, not all_gather)")
    return work["multiply_adds"], log["received"]


def _reduction_job(matmul_by_reduction, n, k, m, seed):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    A, B = _matrices(n, k, m, seed)
    with _traffic(rank), spy(torch.float32) as calls, _count_products() as work:
        out = matmul_by_reduction(A.clone(), B.clone())
    case = f"A of shape ({n}, {k}) @ B of shape ({k}, {m}) on {p} ranks"
    expected = A @ B
    if out is None or not isinstance(out, torch.Tensor):
        raise Wrong(f"rank {rank} returned {type(out).__name__} for {case}: every rank returns A @ B")
    if tuple(out.shape) != (n, m):
        raise Wrong(f"rank {rank} returned shape {tuple(out.shape)} for {case}, expected ({n}, {m})")
    start, stop = chunk_bounds(k, p)[rank]
    width = -(-k // p)
    if work["multiply_adds"] > n * width * m:
        columns = work["multiply_adds"] // max(n * m, 1)
        raise Wrong(f"rank {rank} multiplied {columns} of the {k} inner columns for {case} "
                     f"({work['multiply_adds']} multiply-adds); its share is chunk_bounds({k}, {p})[{rank}] = "
                     f"({start}, {stop}): multiply only A[:, {start}:{stop}] @ B[{start}:{stop}] and let the "
                     f"all-reduce add the other ranks' partial products")
    if out.dtype != torch.float32:
        raise Wrong(f"rank {rank} returned a {out.dtype} product for {case}: A and B are float32, keep float32")
    out = out.detach().cpu()
    if _close(out, expected).all():
        if sum(v for name, v in calls.items() if name != "elements_sent") == 0:
            raise Wrong(f"rank {rank} computed all of A @ B itself for {case}: multiply only its slice of the "
                         f"inner dimension and all_reduce the partial products")
        return work["multiply_adds"], 0
    hints = []
    if calls.get("reduce") and not calls.get("all_reduce"):
        hints.append("you called dist.reduce, which leaves the sum on its dst rank only (and the other ranks' "
                     "tensors undefined): every rank needs A @ B, so use dist.all_reduce")
    elif torch.allclose(out, A[:, start:stop] @ B[start:stop], atol=1e-4):
        hints.append(f"this is rank {rank}'s own partial product A[:, {start}:{stop}] @ B[{start}:{stop}]: "
                     f"sum the partial products of all ranks with dist.all_reduce")
    elif torch.allclose(out, expected * p, atol=1e-4):
        hints.append(f"this is {p} x A @ B: every rank multiplied the whole inner dimension; multiply only "
                     f"your slice (chunk_bounds({k}, world_size)[rank])")
    elif torch.allclose(out * p, expected, atol=1e-4):
        hints.append("this is A @ B / world_size: all_reduce with the default op, SUM, not AVG")
    else:
        floor = k // p
        dropped = sum((A[:, r * floor:(r + 1) * floor] @ B[r * floor:(r + 1) * floor] for r in range(p)),
                      torch.zeros(n, m))
        if k % p and torch.allclose(out, dropped, atol=1e-4):
            hints.append(f"the inner size {k} does not divide by {p} ranks, and {k} // {p} = {floor} columns "
                         f"per rank drop the last {k % p}: use chunk_bounds({k}, world_size)[rank]")
    raise Wrong(f"rank {rank} got a wrong product for {case}: {_first_wrong(out, expected)}"
                 + (f"; {hints[0]}" if hints else ""))


def _ring_input(rank: int, shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Whole numbers of mixed sign up to 2^20, different on every rank and in every case: sums are exact in
    float32 and float64 (so any order of addition gives the same bits) but not in float16 or bfloat16, and
    totals cancel here and there."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-(1 << 20), 1 << 20, shape, generator=g).to(dtype)


def _ring_job(ring_all_reduce, shape, dtype_name, seed):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    numel = math.prod(shape)
    x = _ring_input(rank, shape, dtype, seed)
    expected = x.clone()
    dist.all_reduce(expected)  # the built-in all-reduce is the reference
    tensor = x.clone()
    with _traffic(rank) as log, spy(dtype) as calls:
        returned = ring_all_reduce(tensor)
    article = "an" if dtype_name[0] in "aeiou" else "a"
    case = f"{article} {dtype_name} tensor of shape {tuple(shape)} ({numel} elements) on {p} ranks"
    collectives = sorted(name for name in calls if name not in POINT_TO_POINT and name != "elements_sent"
                         and not name.endswith(" async"))
    if collectives:
        raise Wrong(f"rank {rank} called dist.{', dist.'.join(collectives)} for {case}: build the ring from "
                     f"point-to-point messages only (dist.isend / dist.irecv, or send / recv)")
    right, left = (rank + 1) % p, (rank - 1) % p
    strangers = sorted(log["sent_to"] - {right}) + sorted(log["received_from"] - {left})
    if strangers:
        raise Wrong(f"rank {rank} sent to rank(s) {sorted(log['sent_to'])} and received from rank(s) "
                     f"{sorted(log['received_from'])} for {case}: in a ring each rank sends only to its right "
                     f"neighbour, (rank + 1) % p = {right}, and receives only from its left one, "
                     f"(rank - 1) % p = {left}")
    if not torch.equal(tensor, expected):
        if isinstance(returned, torch.Tensor) and returned is not tensor and torch.equal(returned, expected):
            raise Wrong(f"rank {rank} returned the right sum for {case} but left `tensor` unchanged: sum in "
                         f"place, like dist.all_reduce (work on flat = tensor.view(-1), a view of it)")
        if torch.equal(tensor, x):
            raise Wrong(f"rank {rank}'s tensor is unchanged after your ring for {case}: the sum must be "
                         f"written into `tensor` itself (flat = tensor.view(-1) is a view: writing into flat "
                         f"writes into tensor)")
        flat, want = tensor.reshape(-1), expected.reshape(-1)
        bounds = chunk_bounds(numel, p)
        complete = [c for c, (a, b) in enumerate(bounds) if b > a and torch.equal(flat[a:b], want[a:b])]
        wrong = (flat != want).nonzero().flatten().tolist()
        first = wrong[0]
        chunk = next(c for c, (a, b) in enumerate(bounds) if a <= first < b)
        message = (f"rank {rank} got a wrong sum for {case}: element {first} (in chunk {chunk}, elements "
                   f"{bounds[chunk][0]}:{bounds[chunk][1]}) should be {want[first].item():g}, got "
                   f"{flat[first].item():g} (wrong elements: {len(wrong)} of {numel}, in chunk(s) "
                   f"{sorted({c for c, (a, b) in enumerate(bounds) for i in wrong if a <= i < b})})")
        if numel % p == 0 and len(complete) == 1:
            message += (f". Only chunk {complete[0]} holds the full sum: that is where the reduce-scatter "
                        f"phase ends; the all-gather phase (p-1 more steps that pass the finished chunks "
                        f"on and copy them) is missing or wrong")
        raise Wrong(message)
    largest = -(-numel // p)
    if numel and log["sent"] > 2 * (p - 1) * largest:
        raise Wrong(f"rank {rank} sent {log['sent']} elements for {case}; a bandwidth-optimal ring "
                     f"sends 2(p-1) chunks of about n/p elements, {2 * (p - 1) * largest} at most: send one "
                     f"chunk per step, not the whole tensor")
    return log["sent"]


# --- in the notebook -----------------------------------------------------------------------

@contextmanager
def _pointing_to_hint(number: str):
    """A wrong answer's message ends by pointing to the step-by-step hint."""
    try:
        yield
    except Incorrect as error:
        raise Incorrect(f"{error}\n  Stuck? lab03.hint(\"{number}\") prints a step-by-step hint.") from error.__cause__


def _few_ranks(p: int) -> str:
    return (f"\n  Only {p} rank(s): at 2 ranks the left and right neighbour are the same rank and many wrong "
            f"schedules still add up. Check again on 3 or more (cluster.stop(); workers = cluster.start(3))."
            if p < 3 else "")


def check_matmul_by_rows(workers, matmul_by_rows) -> None:
    """Exercise 3.1: ``matmul_by_rows(A, B)``: rows of A scattered, B broadcast, rows gathered on rank 0."""
    name = "Exercise 3.1 (matmul by rows)"
    with exercise(name), _pointing_to_hint("3.1"):
        prepare(workers, matmul_by_rows, name)
        p = workers.n
        shapes = [(2 * p, 3, 4), (7, 5, 3), (2 * p + 1, 3, 3), (1, 4, 2), (5, 1, 6), (3 * p - 1, 6, 5)]
        for i, (n, k, m) in enumerate(shapes):
            label = f"A ({n}, {k}) @ B ({k}, {m})"
            hint = (f" ({n} rows on {p} ranks: sizes that do not divide by the world size need uneven chunks: pad A "
                    f"to {p} * ceil({n}/{p}) rows for scatter and cut the padding off the result, or send each rank "
                    f"its chunk_bounds({n}, {p}) rows)" if n % p else "")
            per_rank = run_case(workers, name, _rows_job, matmul_by_rows, (n, k, m, 10 + i), label, hint)
            done = sum(work for work, _ in per_rank)
            expect(done >= n * k * m,
                   f"{name}: for {label} on {p} ranks the ranks did {done} multiply-adds together, fewer than the "
                   f"{n * k * m} of A @ B: every row of the result must be computed by some rank (multiply the "
                   f"rows you received with @ or torch.matmul)")
            idle = [r for r, (work, _) in enumerate(per_rank) if work == 0 and r < n]
            expect(not idle,
                   f"{name}: for {label} rank(s) {idle} multiplied nothing: every rank multiplies its own rows")
    print(f"  checked on {p} ranks: each rank multiplied at most its ceil(n/p) rows and received only B and its "
          f"rows; shapes {', '.join(f'({n}, {k}) @ ({k}, {m})' for n, k, m in shapes)}" + _few_ranks(p))


def check_matmul_by_reduction(workers, matmul_by_reduction) -> None:
    """Exercise 3.2: ``matmul_by_reduction(A, B)``: inner dimension split, partial products all-reduced."""
    name = "Exercise 3.2 (matmul by reduction)"
    with exercise(name), _pointing_to_hint("3.2"):
        prepare(workers, matmul_by_reduction, name)
        p = workers.n
        shapes = [(4, 2 * p, 3), (7, 5, 3), (6, 2 * p + 1, 5), (2, p - 1, 4), (3, 1, 2), (5, 3 * p + 2, 4)]
        for i, (n, k, m) in enumerate(shapes):
            label = f"A ({n}, {k}) @ B ({k}, {m})"
            hint = (f" (inner size {k} on {p} ranks: use chunk_bounds, some slices are shorter"
                    f"{', some empty' if k < p else ''})" if k % p else "")
            per_rank = run_case(workers, name, _reduction_job, matmul_by_reduction, (n, k, m, 20 + i), label, hint)
            done = sum(work for work, _ in per_rank)
            expect(done >= n * k * m,
                   f"{name}: for {label} on {p} ranks the ranks did {done} multiply-adds together, fewer than the "
                   f"{n * k * m} of A @ B: every inner column must be multiplied by some rank")
    print(f"  checked on {p} ranks: every rank returns A @ B and multiplied at most its chunk_bounds slice; "
          f"shapes {', '.join(f'({n}, {k}) @ ({k}, {m})' for n, k, m in shapes)}" + _few_ranks(p))


def check_ring_all_reduce(workers, ring_all_reduce) -> None:
    """Exercise 3.3: ``ring_all_reduce(tensor)``: in-place sum by reduce-scatter + all-gather over a ring."""
    name = "Exercise 3.3 (ring all-reduce)"
    with exercise(name), _pointing_to_hint("3.3"):
        prepare(workers, ring_all_reduce, name)
        p = workers.n
        shapes = [((3 * p,), "float32"), ((1000 * p,), "float32"), ((7,), "float32"), ((2 * p + 1,), "float64"),
                  ((1,), "float32"), ((p - 1,), "float32"), ((3, 5), "float32"), ((p + 3,), "int64")]
        passed = []
        for seed, (shape, dtype) in enumerate(shapes):
            numel = math.prod(shape)
            label = f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} tensor of shape {shape}"
            hints = []
            if numel % p and all(len(s) == 1 and s[0] % p == 0 for s in passed):
                hints.append(f"{numel} elements on {p} ranks: sizes that do not divide by the world size need "
                             f"uneven chunks (chunk_bounds(numel, world_size))")
            if numel < p:
                hints.append("fewer elements than ranks: some chunks are empty, and both neighbours must agree "
                             "on whether such a message is sent")
            if len(shape) > 1:
                hints.append("a 2-D tensor: work on flat = tensor.view(-1)")
            run_case(workers, name, _ring_job, ring_all_reduce, (shape, dtype, 30 + seed), label,
                      f" ({'; '.join(hints)})" if hints else "")
            passed.append(shape)
    print(f"  checked against dist.all_reduce on {p} ranks, messages to the right neighbour only, at most "
          f"2(p-1) chunks sent per rank: {'; '.join(f'{d} {s}' for s, d in shapes)}" + _few_ranks(p))

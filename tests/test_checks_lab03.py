"""The checks of lab 03 (collectives): right answers pass, the mistakes learners make fail with a message
naming the fix.

One 3-engine cluster serves the whole module: at 2 ranks the left and right neighbour are the same rank,
and several wrong rings give the right sum there. The solutions run on the engines: ``@interactive``
makes ipyparallel send them by value, and their global names (torch, dist, chunk_bounds) are looked up
in the engines' namespace, as for functions defined in a notebook.
"""
from __future__ import annotations

import nbformat
import pytest
from ipyparallel import interactive

from notebook_runner import ROOT
from utils import cluster
from tooling import release
from utils.checks import Incorrect, NotSolved, lab03

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def workers():
    started = cluster.start(3, backend="gloo", activate=False)
    yield started
    cluster.stop()


def fails(check, workers, solution, *needles):
    with pytest.raises(Incorrect) as info:
        check(workers, solution)
    message = str(info.value)
    assert "lab03.hint(" in message, message
    for needle in needles:
        assert needle in message, message
    return message


@interactive
def stub(*args, **kwargs):
    raise NotImplementedError("Hint: x")


def test_stubs_are_not_solved(workers):
    for check in (lab03.check_matmul_by_rows, lab03.check_matmul_by_reduction, lab03.check_ring_all_reduce):
        with pytest.raises(NotSolved) as info:
            check(workers, stub)
        assert "not solved yet" in str(info.value) and "Hint: x" in str(info.value)


def test_step_by_step_hints_exist_and_stay_out_of_the_learner_edition(capsys):
    for name in ("3.1", "3.2", "3.3"):
        lab03.hint(name)
        assert "Step by step" in capsys.readouterr().out
    with pytest.raises(ValueError, match="3.1"):
        lab03.hint("3.9")
    learner = release.learner_notebook(nbformat.read(ROOT / "labs" / "03_collectives.ipynb", as_version=4))
    cells = "\n".join(cell.source for cell in learner.cells)
    for name, text in lab03.HINTS.items():
        steps = [line.strip() for line in text.splitlines()[1:] if len(line.strip()) > 20]
        leaked = [line for line in steps if line in cells]
        assert not leaked, f"the step-by-step hint of {name} is in the learner edition: {leaked}"
        assert f'lab03.hint("{name}")' in cells, f"the learner edition never says lab03.hint(\"{name}\") exists"


# --- 3.1 matmul by rows -------------------------------------------------------------------

@interactive
def rows_padded(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(B, src=0)
    rows = -(-n // p)
    chunks = None
    if rank == 0:
        padded = torch.zeros(rows * p, k)
        padded[:n] = A
        chunks = list(padded.split(rows))
    mine = torch.empty(rows, k)
    dist.scatter(mine, chunks, src=0)
    gathered = [torch.empty(rows, m) for _ in range(p)] if rank == 0 else None
    dist.gather(mine @ B, gathered, dst=0)
    return torch.cat(gathered)[:n] if rank == 0 else None


@interactive
def rows_point_to_point(A, B):
    # Each rank gets exactly its chunk_bounds rows by send / recv; the shapes travel as int64.
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(B, src=0)
    bounds = chunk_bounds(n, p)
    if rank == 0:
        for r in range(1, p):
            dist.send(A[bounds[r][0]:bounds[r][1]].contiguous(), dst=r)
        parts = [A[bounds[0][0]:bounds[0][1]] @ B]
        for r in range(1, p):
            part = torch.empty(bounds[r][1] - bounds[r][0], m)
            dist.recv(part, src=r)
            parts.append(part)
        return torch.cat(parts)
    mine = torch.empty(bounds[rank][1] - bounds[rank][0], k)
    dist.recv(mine, src=0)
    dist.send(mine @ B, dst=0)
    return None


@interactive
def rows_rank0_does_it_all(A, B):
    dist.barrier()
    return A @ B if dist.get_rank() == 0 else None


@interactive
def rows_everyone_gets_all_of_A(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    A = A.contiguous() if rank == 0 else torch.empty(n, k)
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(A, src=0)
    dist.broadcast(B, src=0)
    rows = -(-n // p)
    padded = torch.zeros(rows * p, k)
    padded[:n] = A
    gathered = [torch.empty(rows, m) for _ in range(p)] if rank == 0 else None
    dist.gather(padded[rank * rows:(rank + 1) * rows] @ B, gathered, dst=0)
    return torch.cat(gathered)[:n] if rank == 0 else None


@interactive
def rows_shape_dtypes_differ(A, B):
    rank = dist.get_rank()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]]) if rank == 0 else torch.zeros(3)
    dist.broadcast(shape, src=0)
    return None


@interactive
def rows_padding_kept(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(B, src=0)
    rows = -(-n // p)
    chunks = None
    if rank == 0:
        padded = torch.zeros(rows * p, k)
        padded[:n] = A
        chunks = list(padded.split(rows))
    mine = torch.empty(rows, k)
    dist.scatter(mine, chunks, src=0)
    gathered = [torch.empty(rows, m) for _ in range(p)] if rank == 0 else None
    dist.gather(mine @ B, gathered, dst=0)
    return torch.cat(gathered) if rank == 0 else None


@interactive
def rows_in_bfloat16(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(B, src=0)
    rows = -(-n // p)
    chunks = None
    if rank == 0:
        padded = torch.zeros(rows * p, k)
        padded[:n] = A
        chunks = list(padded.split(rows))
    mine = torch.empty(rows, k)
    dist.scatter(mine, chunks, src=0)
    gathered = [torch.empty(rows, m) for _ in range(p)] if rank == 0 else None
    dist.gather((mine.bfloat16() @ B.bfloat16()).float(), gathered, dst=0)  # "faster", but rounds
    return torch.cat(gathered)[:n] if rank == 0 else None


@interactive
def rows_every_rank_returns(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    shape = torch.tensor([A.shape[0], A.shape[1], B.shape[1]] if rank == 0 else [0, 0, 0])
    dist.broadcast(shape, src=0)
    n, k, m = shape.tolist()
    B = B.contiguous() if rank == 0 else torch.empty(k, m)
    dist.broadcast(B, src=0)
    rows = -(-n // p)
    chunks = None
    if rank == 0:
        padded = torch.zeros(rows * p, k)
        padded[:n] = A
        chunks = list(padded.split(rows))
    mine = torch.empty(rows, k)
    dist.scatter(mine, chunks, src=0)
    gathered = [torch.empty(rows, m) for _ in range(p)] if rank == 0 else None
    dist.gather(mine @ B, gathered, dst=0)
    return torch.cat(gathered)[:n] if rank == 0 else mine @ B


@pytest.mark.parametrize("right", [rows_padded, rows_point_to_point])
def test_rows_right(workers, right, capsys):
    lab03.check_matmul_by_rows(workers, right)
    out = capsys.readouterr().out
    assert "\u2713 Exercise 3.1 (matmul by rows): passed" in out and "checked on 3 ranks" in out


@pytest.mark.parametrize("wrong, needles", [
    (rows_rank0_does_it_all, ("rank 0 multiplied", "its share is ceil(", "rank 0 included")),
    (rows_everyone_gets_all_of_A, ("received", "not the whole of A")),
    (rows_shape_dtypes_differ, ("differ between ranks", "one dtype on every rank")),
    (rows_padding_kept, ("padding row(s) must be cut off",)),
    (rows_in_bfloat16, ("wrong A @ B", "should be")),
    (rows_every_rank_returns, ("return None on the other ranks",)),
])
def test_rows_wrong(workers, wrong, needles):
    fails(lab03.check_matmul_by_rows, workers, wrong, *needles)


# --- 3.2 matmul by reduction ------------------------------------------------------------------

@interactive
def reduction_right(A, B):
    start, stop = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]
    partial = A[:, start:stop] @ B[start:stop]
    dist.all_reduce(partial)
    return partial


@interactive
def reduction_whole_product_averaged(A, B):
    out = A @ B
    dist.all_reduce(out)
    return out / dist.get_world_size()


@interactive
def reduction_to_rank_0(A, B):
    start, stop = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]
    partial = A[:, start:stop] @ B[start:stop]
    dist.reduce(partial, dst=0)
    return partial


@interactive
def reduction_floor_slices(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    width = A.shape[1] // p
    partial = A[:, rank * width:(rank + 1) * width] @ B[rank * width:(rank + 1) * width]
    dist.all_reduce(partial)
    return partial


@interactive
def reduction_divided(A, B):
    start, stop = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]
    partial = A[:, start:stop] @ B[start:stop]
    dist.all_reduce(partial)
    return partial / dist.get_world_size()


@interactive
def reduction_no_communication(A, B):
    start, stop = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]
    return A[:, start:stop] @ B[start:stop]


@interactive
def reduction_remainder_to_last(A, B):
    rank, p = dist.get_rank(), dist.get_world_size()
    width = A.shape[1] // p
    stop = A.shape[1] if rank == p - 1 else (rank + 1) * width
    partial = A[:, rank * width:stop] @ B[rank * width:stop]
    dist.all_reduce(partial)
    return partial


@interactive
def reduction_in_half(A, B):
    start, stop = chunk_bounds(A.shape[1], dist.get_world_size())[dist.get_rank()]
    partial = (A[:, start:stop].bfloat16() @ B[start:stop].bfloat16()).float()
    dist.all_reduce(partial)
    return partial


def test_reduction_right(workers, capsys):
    lab03.check_matmul_by_reduction(workers, reduction_right)
    assert "\u2713 Exercise 3.2 (matmul by reduction): passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, needles", [
    (reduction_whole_product_averaged, ("inner columns", "its share is chunk_bounds")),
    (reduction_to_rank_0, ("rank 1 got a wrong product", "dist.reduce", "use dist.all_reduce")),
    (reduction_floor_slices, ("drop the last",)),
    (reduction_divided, ("A @ B / world_size",)),
    (reduction_no_communication, ("own partial product",)),
    (reduction_remainder_to_last, ("rank 2 multiplied", "its share is chunk_bounds")),
    (reduction_in_half, ("wrong product", "should be")),
])
def test_reduction_wrong(workers, wrong, needles):
    fails(lab03.check_matmul_by_reduction, workers, wrong, *needles)


def test_two_ranks_are_flagged_as_too_few():
    assert "3 or more" in lab03._few_ranks(2) and lab03._few_ranks(3) == ""


def test_reduction_message_shows_the_wrong_row_not_the_first():
    import torch

    expected = torch.arange(12.).reshape(4, 3)
    out = expected.clone()
    out[2, 1] = -5
    message = lab03._first_wrong(out, expected)
    assert "first at [2, 1]" in message and "row 2 should be [6, 7, 8], got [6, -5, 8]" in message


# --- 3.3 ring all-reduce ------------------------------------------------------------------------

def _ring(reversed_ring=False, whole_tensor=False, all_gather=True, floor_chunks=False, in_place=True,
          direct=False, blocking=False, batched=False, gather_forwards=False):
    # @interactive functions see the engines' globals and take no closure: the settings are defaults
    @interactive
    def ring(tensor, reversed_ring=reversed_ring, whole_tensor=whole_tensor, all_gather=all_gather,
             floor_chunks=floor_chunks, in_place=in_place, direct=direct, blocking=blocking, batched=batched,
             gather_forwards=gather_forwards):
        rank, p = dist.get_rank(), dist.get_world_size()
        right, left = ((rank - 1) % p, (rank + 1) % p) if reversed_ring else ((rank + 1) % p, (rank - 1) % p)
        flat = tensor.view(-1) if in_place else tensor.clone().view(-1)
        n = flat.numel()
        if whole_tensor:  # pass the whole running sum round the ring: p-1 messages of n elements
            total, passing, buffer = flat.clone(), flat.clone(), torch.empty_like(flat)
            for _ in range(p - 1):
                requests = [dist.isend(passing, right), dist.irecv(buffer, left)]
                for request in requests:
                    request.wait()
                passing = buffer.clone()
                total += passing
            flat.copy_(total)
            return tensor
        if direct:  # every rank sends each other rank its chunk, then the sums back: no ring
            bounds = chunk_bounds(n, p)
            a, b = bounds[rank]
            mine = flat[a:b].clone()
            buffers = {r: torch.empty(b - a, dtype=flat.dtype) for r in range(p) if r != rank}
            requests = [dist.isend(flat[bounds[r][0]:bounds[r][1]].clone(), r) for r in range(p) if r != rank]
            requests += [dist.irecv(buffers[r], r) for r in buffers]
            for request in requests:
                request.wait()
            for r in buffers:
                mine += buffers[r]
            parts = {r: torch.empty(bounds[r][1] - bounds[r][0], dtype=flat.dtype) for r in range(p) if r != rank}
            requests = [dist.isend(mine, r) for r in range(p) if r != rank]
            requests += [dist.irecv(parts[r], r) for r in parts]
            for request in requests:
                request.wait()
            flat[a:b] = mine
            for r, part in parts.items():
                flat[bounds[r][0]:bounds[r][1]] = part
            return tensor
        if floor_chunks:
            width = n // p
            bounds = [(r * width, (r + 1) * width) for r in range(p)]
        else:
            bounds = chunk_bounds(n, p)
        buffer = torch.empty(max(b - a for a, b in bounds), dtype=flat.dtype)

        def exchange(send_chunk, recv_chunk):
            (s0, s1), (r0, r1) = bounds[send_chunk], bounds[recv_chunk]
            if blocking:  # even ranks send first, odd ranks receive first: no deadlock
                for step in ((0, 1) if rank % 2 == 0 else (1, 0)):
                    if step == 0:
                        dist.send(flat[s0:s1], right)
                    else:
                        dist.recv(buffer[:r1 - r0], left)
                return flat[r0:r1], buffer[:r1 - r0]
            if batched:
                operations = [dist.P2POp(dist.isend, flat[s0:s1], right), dist.P2POp(dist.irecv, buffer[:r1 - r0], left)]
                for request in dist.batch_isend_irecv(operations):
                    request.wait()
                return flat[r0:r1], buffer[:r1 - r0]
            requests = [dist.isend(flat[s0:s1], right), dist.irecv(buffer[:r1 - r0], left)]
            for request in requests:
                request.wait()
            return flat[r0:r1], buffer[:r1 - r0]

        for s in range(p - 1):
            mine, arrived = exchange((rank - s) % p, (rank - s - 1) % p)
            mine += arrived
        if all_gather:
            for s in range(p - 1):
                if gather_forwards:  # chunk indices that count up: the same as counting down at 2 ranks only
                    mine, arrived = exchange((rank + 1 + s) % p, (rank + s) % p)
                    mine.copy_(arrived)
                    continue
                mine, arrived = exchange((rank + 1 - s) % p, (rank - s) % p)
                mine.copy_(arrived)
        return tensor if in_place else flat.view_as(tensor)
    return ring


@interactive
def ring_with_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


@pytest.mark.parametrize("right", [_ring(), _ring(blocking=True), _ring(batched=True), "reference"])
def test_ring_right(workers, right, capsys):
    if right == "reference":
        @interactive
        def right(tensor):
            from utils.collectives import ring_all_reduce

            return ring_all_reduce(tensor)  # pipelined, several tagged messages per step
    lab03.check_ring_all_reduce(workers, right)
    out = capsys.readouterr().out
    assert "\u2713 Exercise 3.3 (ring all-reduce): passed" in out and "on 3 ranks" in out


@pytest.mark.parametrize("wrong, needles", [
    (_ring(reversed_ring=True), ("sends only to its right neighbour",)),
    (_ring(direct=True), ("sends only to its right neighbour",)),
    (_ring(whole_tensor=True), ("send one chunk per step",)),
    (_ring(all_gather=False), ("all-gather phase", "is missing or wrong")),
    (_ring(gather_forwards=True), ("got a wrong sum", "element")),
    (_ring(floor_chunks=True), ("wrong sum", "uneven chunks")),
    (_ring(in_place=False), ("but left `tensor` unchanged",)),
    (ring_with_all_reduce, ("called dist.all_reduce", "point-to-point")),
])
def test_ring_wrong(workers, wrong, needles):
    fails(lab03.check_ring_all_reduce, workers, wrong, *needles)

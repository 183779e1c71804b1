"""Checks for labs/04_ddp.ipynb.

Each check ships the learner's function to the engines and runs it on every rank at once, with the
machinery of lab 03's checks (``utils.checks.lab03``): the learner's torch.distributed calls run on a
process group of the check's own with a short timeout, so a rank that skips a collective costs a few
seconds and a message naming the rank, never the cluster. Each case builds its own inputs on every
rank and compares the answer with the library (``torch.utils.data.DistributedSampler``,
``utils.replicas``) or with values computed by hand; typical mistakes get a message that names the fix.
The learner's function may not call the library it rewrites (a profiler sees it), and the inputs are
awkward on purpose: 3 or more ranks in the tests, differences planted on a different rank and element
in each case, totals that float32 gets wrong, a checkpoint written slowly over an older one.
``lab04.hint("4.N")`` prints an exercise's step-by-step hint (``HINTS``), which the notebook never shows.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import tempfile
import time

import torch

from . import exercise, expect, hint_for
from .engines import Wrong, prepare, run_cases, spy

HINTS = {
    "4.1": """Step by step:
1. g = torch.Generator().manual_seed(seed + epoch): a generator of your own, seeded the same on every rank
   (reseeding torch's global generator would change every other random number of the training).
2. order = torch.randperm(n, generator=g).tolist()
3. Without drop_last: total = world_size * ceil(n / world_size); pad `order` with its own first indices up
   to `total` (repeat it whole while it is shorter: (order * math.ceil(total / n))[:total]).
   With drop_last: total = world_size * (n // world_size); order = order[:total].
4. Rank r takes every world_size-th index starting at r: return order[rank:total:world_size].""",
    "4.2": """Step by step:
1. tensors = list(model.parameters()) + list(model.buffers())  (BatchNorm's statistics are buffers).
2. For each tensor t: copies = [torch.empty_like(t) for _ in range(dist.get_world_size())], then
   dist.all_gather(copies, t.detach().contiguous()): every rank now holds every rank's copy, and the
   model is left untouched.
3. Compare each copy with t using torch.equal (exact: correct DDP training leaves identical bytes).
4. Combine the answers of all tensors into one bool; since every rank saw every copy, every rank
   reaches the same answer. Return it.""",
    "4.3": """Step by step:
1. both = torch.tensor([float(total), float(count)], dtype=torch.float64): float64, because float32
   keeps only about 7 digits (totals that nearly cancel, or counts above 2**24, come out wrong).
2. dist.all_reduce(both): the default op sums over the ranks, and every rank receives the sums.
3. return (both[0] / both[1]).item(): a Python float, the same on every rank.""",
    "4.5": """Step by step:
save_checkpoint(ddp_model, optimizer, path):
1. if dist.get_rank() == 0: torch.save({"model": ddp_model.module.state_dict(),
   "optimizer": optimizer.state_dict()}, path)
2. then, on every rank (outside the if): dist.barrier(), so that no rank goes on (and reads the file)
   before rank 0 has finished writing it.
load_checkpoint(ddp_model, optimizer, path):
1. state = torch.load(path, map_location=device) on every rank;
2. ddp_model.module.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"]).""",
    "4.4": """Step by step:
1. buckets = ddp_bucket_bytes(grad_bytes): DDP's buckets, in bytes (utils.ddp_timing; lab 06 has you write it).
2. For each bucket of n bytes, lab 03's ring on k ranks takes 2(k-1) alpha + 2(k-1)/k n beta seconds:
   2(k-1) steps, each paying the latency alpha and moving n/k bytes at beta seconds per byte.
3. Nothing overlaps in this prediction: add the buckets' times, and multiply by 1000 for milliseconds.
4. return len(buckets), total_ms  (on k = 1 the formula gives 0: one rank sends nothing).""",
}


hint = hint_for(HINTS)  # lab04.hint("4.1") prints that exercise's step-by-step hint


@contextlib.contextmanager
def _calls_into(*file_endings: str):
    """Record the Python functions defined in files ending with ``file_endings`` that run inside the block
    (on this thread): how a check sees that the learner called a library function the exercise rewrites."""
    seen: list[str] = []
    endings = tuple(e.replace("/", os.sep) for e in file_endings)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(endings):
            seen.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)

def _prepare_all(workers, functions, name: str) -> None:
    """lab 03's preparation for each learner function, and the check's own group for its collectives."""
    for i, fn in enumerate(functions):
        prepare(workers, fn, name, own_collectives=i == len(functions) - 1)


# --- Exercise 4.1: DistributedSampler's indices ------------------------------------------


def _sampler_indices(n: int, rank: int, world_size: int, epoch: int, seed: int, drop_last: bool) -> list[int]:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _as_index_list(value, who: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    if not isinstance(value, (list, tuple, range)):
        raise Wrong(f"{who} returned {type(value).__name__}; return a list of sample indices (ints)")
    try:
        return [int(i) for i in value]
    except (TypeError, ValueError):
        raise Wrong(f"{who} returned a list whose items are not whole numbers; return the sample indices") from None


def _diagnose_shard(got: list[int], n: int, rank: int, p: int, epoch: int, seed: int, drop_last: bool) -> str:
    want = _sampler_indices(n, rank, p, epoch, seed, drop_last)
    if epoch and got == _sampler_indices(n, rank, p, 0, seed, drop_last):
        return ("this is epoch 0's order again: every epoch must reshuffle, with the generator seeded by "
                "seed + epoch (that is all sampler.set_epoch(epoch) changes; without it every epoch repeats "
                "the same order)")
    total = p * (n // p if drop_last else math.ceil(n / p))
    if len(got) != len(want):
        if not drop_last and len(got) == len(range(rank, n, p)) and n % p:
            return (f"{n} samples do not divide by {p} ranks, so DistributedSampler pads the permutation "
                    f"with its own first {total - n} indices up to {total} = {p} x ceil({n}/{p}): every rank "
                    f"gets {len(want)} indices, the same number of steps (a rank with fewer steps would leave the "
                    f"others waiting in DDP's all-reduce)")
        if drop_last and len(got) == math.ceil(n / p):
            return (f"with drop_last=True cut the permutation to {total} = {p} x ({n} // {p}) indices instead of "
                    f"padding it: every rank gets {len(want)}")
        return f"expected {len(want)} indices on rank {rank}, got {len(got)}"
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    padded = (order * math.ceil(total / n))[:total] if total else []
    if got == padded[rank * len(want):(rank + 1) * len(want)]:
        return (f"rank {rank} got a contiguous block of the permutation; DistributedSampler deals the indices out "
                f"like cards: rank r takes positions r, r + world_size, r + 2 world_size, ... "
                f"(indices[rank:total_size:world_size])")
    plain = list(range(n)) + list(range(n)) * math.ceil(total / max(n, 1))
    if got == plain[:total][rank:total:p]:
        return ("these are the indices in their stored order: shuffle them first with "
                "torch.randperm(n, generator=g), g = torch.Generator().manual_seed(seed + epoch)")
    if sorted(got) == sorted(want):
        return ("the right samples in the wrong order: draw the permutation with torch.randperm(n, generator=g) "
                "where g = torch.Generator().manual_seed(seed + epoch), pad it, then take "
                "indices[rank:total_size:world_size]")
    return (f"expected {want[:8]}{' ...' if len(want) > 8 else ''}, got {got[:8]}{' ...' if len(got) > 8 else ''} "
            f"(permutation: torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)))")


def _shard_job(shard_indices, n, epoch, seed, drop_last, extra_world_sizes):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    worlds = [(rank, p)] + ([(r, q) for q in extra_world_sizes for r in range(q)] if rank == 0 else [])
    for r, q in worlds:
        who = f"shard_indices(n={n}, rank={r}, world_size={q}, epoch={epoch}, seed={seed}, drop_last={drop_last})"
        rng_before = torch.random.get_rng_state()
        with _calls_into("torch/utils/data/distributed.py") as library:
            answer = shard_indices(n, r, q, epoch, seed=seed, drop_last=drop_last)
        if library:
            raise Wrong(f"on rank {rank}, {who} used DistributedSampler itself ({library[0]}): the exercise is "
                         f"to compute its indices yourself, with torch.randperm and list slicing; the check "
                         f"compares your list with DistributedSampler's")
        if not torch.equal(torch.random.get_rng_state(), rng_before):
            raise Wrong(f"on rank {rank}, {who} changed torch's global random generator (torch.manual_seed, or "
                         f"torch.randperm without generator=): in training that would change the model's "
                         f"initialisation, dropout and everything else drawn after it. Draw the permutation "
                         f"from a generator of your own: torch.Generator().manual_seed(seed + epoch)")
        got = _as_index_list(answer, who)
        if got != _sampler_indices(n, r, q, epoch, seed, drop_last):
            raise Wrong(f"on rank {rank}, {who}: {_diagnose_shard(got, n, r, q, epoch, seed, drop_last)}")


def run_case(workers, name, job, fn, args, case):
    run_cases(workers, name, job, fn, [(args, case)], lambda args, passed: "")


def check_shard(workers, shard_indices) -> None:
    """Exercise 4.1: ``shard_indices(n, rank, world_size, epoch, seed=0, drop_last=False)`` gives exactly
    the indices of ``DistributedSampler(..., shuffle=True)`` after ``set_epoch(epoch)``."""
    name = "Exercise 4.1 (shard_indices)"
    with exercise(name):
        _prepare_all(workers, [shard_indices], name)
        p = workers.n
        cases = [(4 * p, 0, 0, False), (4 * p, 1, 0, False), (4 * p + 1, 2, 7, False), (4 * p + 1, 3, 0, True),
                 (p - 1 or 1, 0, 0, False), (3 * p + 2, 5, 1, True)]
        for n, epoch, seed, drop_last in cases:
            run_case(workers, name, _shard_job, shard_indices, (n, epoch, seed, drop_last, (3, 5)),
                      f"n={n}, epoch={epoch}, seed={seed}, drop_last={drop_last}")
    print(f"  checked against DistributedSampler on {p} ranks (and world sizes 3, 5 on rank 0): "
          f"{len(cases)} cases, n from {min(c[0] for c in cases)} to {max(c[0] for c in cases)}, "
          f"padding and drop_last, epochs 0 to {max(c[1] for c in cases)}")
    _warn_few_ranks(workers)


# --- Exercise 4.2: are the replicas equal? ----------------------------------------------


def _replica_model():
    from torch import nn

    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3))
    model.train()
    model(torch.randn(8, 5))  # fills running_mean / running_var / num_batches_tracked
    return model


_PERTURBATIONS = {
    # case: (tensor name, what is changed, advice if the learner's function missed it)
    "equal": (None, "nothing: every rank holds the same model", ""),
    "first weight": ("0.weight", "one element of the first weight, by 0.01",
                     "compare every rank's copy with every other's, not only the first and the last rank's"),
    "last weight": ("3.weight", "one element of the last layer's weight (not the first parameter), by 0.01",
                    "compare every tensor, not one: loop over all of model.named_parameters()"),
    "float buffer": ("1.running_mean", "one element of the BatchNorm buffer running_mean, by 0.01",
                     "buffers are part of the replica too (BatchNorm's running statistics are used at "
                     "evaluation): compare model.named_buffers() as well as the parameters, or the whole "
                     "model.state_dict()"),
    "swapped elements": ("3.weight", "two elements of the last weight, which trade places",
                         "compare every element (torch.equal): a sum, a norm, a mean or the sorted values of a "
                         "tensor stay the same when two of its elements trade places"),
    "integer buffer": ("1.num_batches_tracked", "the integer buffer num_batches_tracked, by 1",
                       "every buffer, also the integer ones (num_batches_tracked is int64): compare "
                       "model.named_buffers() or model.state_dict(), whatever the dtype"),
    "one ulp": ("0.weight", "one element of the first weight, by the smallest step a float32 can take",
                "compare exactly (torch.equal), not with torch.allclose or in a lower precision: after "
                "DDP's all-reduce every rank receives the same bytes, so replicas of correct training are "
                "bit-identical and any difference is a bug"),
}


def _planted(case: str, p: int) -> tuple[int, int]:
    """(rank, element) where ``case`` changes the model: a different rank and element for each case, the
    middle rank first (on 3 or more ranks, comparing only the first and last copies misses it)."""
    index = list(_PERTURBATIONS).index(case)
    return index % p, 1 + 3 * index


def _replicas_job(replicas_equal, case):
    import torch.distributed as dist

    from . import engines
    from ..replicas import replica_differences

    rank, p = dist.get_rank(), dist.get_world_size()
    group = engines.verify_group
    model = _replica_model()
    target, what, advice = _PERTURBATIONS[case]
    changed_rank, element = _planted(case, p)
    if target is not None and rank == changed_rank:
        tensor = dict(model.state_dict(keep_vars=True))[target]
        with torch.no_grad():
            flat = tensor.view(-1)
            i = element % flat.numel()
            if case == "one ulp":
                flat[i] = torch.nextafter(flat[i], flat[i] + 1)
            elif case == "swapped elements":
                j = (i + 1) % flat.numel()
                flat[i], flat[j] = flat[j].clone(), flat[i].clone()
            else:
                flat[i] += 0.01 if tensor.dtype.is_floating_point else 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with spy(), _calls_into("utils/replicas.py") as library:
        answer = replicas_equal(model)
    problem = None
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = bool(answer.item())
    if not isinstance(answer, bool):
        problem = f"rank {rank} returned {type(answer).__name__}; return True or False (the same on every rank)"
    if library:
        problem = (f"on rank {rank} replicas_equal called utils.replicas ({library[0]}), the library version of "
                   f"this exercise: write the comparison yourself, with torch.distributed's collectives")
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    if changed:
        problem = (f"on rank {rank} replicas_equal changed the model ({', '.join(changed)}): dist.all_reduce and "
                   f"dist.broadcast overwrite the tensor they are given; all_gather copies of the tensors "
                   f"(t.detach().clone()) instead")
    # Every rank reaches this all_gather, so a problem on one rank is reported, not a hang on the others.
    answers = [torch.zeros(2) for _ in range(p)]
    dist.all_gather(answers, torch.tensor([float(answer is True), float(problem is not None)]), group=group)
    if problem:
        raise Wrong(problem)
    if any(a[1] for a in answers):
        return  # another rank reports its problem
    answers = [bool(a[0]) for a in answers]
    truth = target is None
    differences = replica_differences(model, group=group)
    assert all(d == 0 for d in differences.values()) == truth, differences  # the check's own premise
    if len(set(answers)) > 1:
        raise Wrong(f"the ranks disagree ({', '.join(f'rank {r}: {a}' for r, a in enumerate(answers))}) when rank "
                     f"{changed_rank} changed {what}: every rank must see every rank's copy (dist.all_gather) and "
                     f"return the same answer")
    if answers[0] != truth:
        if truth:
            raise Wrong("every rank holds exactly the same model, yet your function returned False: it must not "
                         "cry wolf (compare each tensor with the other ranks' copies of the same tensor, "
                         "in the same order on every rank)")
        raise Wrong(f"rank {changed_rank} of {p} changed {what} ({target}), and your function returned True: "
                     + (advice or "compare every parameter and buffer of every rank, with all_gather"))


def check_replicas_equal(workers, replicas_equal) -> None:
    """Exercise 4.2: ``replicas_equal(model)``: True on every rank iff every parameter and buffer is
    bit-identical on all ranks."""
    name = "Exercise 4.2 (replicas_equal)"
    with exercise(name):
        _prepare_all(workers, [replicas_equal], name)
        for case in _PERTURBATIONS:
            where = "" if case == "equal" else f" on rank {_planted(case, workers.n)[0]}"
            run_case(workers, name, _replicas_job, replicas_equal, (case,), f"{case} differing{where}")
    print(f"  checked on {workers.n} ranks: equal replicas, and one rank differing in {len(_PERTURBATIONS) - 1} "
          f"ways ({', '.join(list(_PERTURBATIONS)[1:])}), on ranks "
          f"{sorted({_planted(c, workers.n)[0] for c in list(_PERTURBATIONS)[1:]})}")
    _warn_few_ranks(workers)


def _warn_few_ranks(workers) -> None:
    if workers.n < 3:
        print(f"  note: on {workers.n} ranks some mistakes cannot show (every other rank is the neighbour, the "
              f"first or the last); start 3 or more engines to check those too")


# --- Exercise 4.3: a metric over all ranks -----------------------------------------------


_METRIC_CASES = {
    # case: each rank's (total, count) on p ranks. Totals carry more digits than float16, bfloat16 or
    # float32 keep; the odd rank out (empty, big) moves between cases.
    "equal counts": lambda r, p: (2.3456789012345 * (r + 1) * 10 + 0.1 * r, 10),
    "uneven counts": lambda r, p: (1.5137294518 * (r + 1) * (r + 1) * 3 + math.pi, (r + 1) * 3),
    "a rank with no sample": lambda r, p: (0.0, 0) if r == 1 % p else (4.1234567891 * (r + 1) * 7, 7 * (r + 1)),
    "one big rank": lambda r, p: (0.2468013579 * 1000, 1000) if r == p // 2 else (3.1415926536 * 5, 5),
    # (1e8 + x) + 0 + ... + (-1e8) is exact in float64 in any order; float32 rounds 1e8 + x to 1e8
    "totals that nearly cancel": lambda r, p: ((1e8 + 0.7310585786, 3) if r == 0 else
                                               (-1e8, 3) if r == p - 1 else (0.0, 3)),
    "counts above 2**24": lambda r, p: (0.5 * (2 ** 24 + 1 + 2 * r) + 0.123, 2 ** 24 + 1 + 2 * r),
}


def _metric_job(global_mean, case):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    shares = [_METRIC_CASES[case](r, p) for r in range(p)]
    total, count = shares[rank]
    want = math.fsum(t for t, _ in shares) / sum(c for _, c in shares)
    with spy(), _calls_into("utils/replicas.py") as library:
        got = global_mean(total, count)
    where = f"rank {rank} (case: {case}; per-rank (total, count) = {shares})"
    if library:
        raise Wrong(f"{where} called utils.replicas ({library[0]}), the library version of this exercise: "
                     f"write the reduction yourself, with torch.distributed")
    if got is None:
        raise Wrong(f"{where} returned None: every rank returns the mean (use all_reduce, not reduce)")
    if isinstance(got, torch.Tensor):
        raise Wrong(f"{where} returned a tensor; return a Python float (.item())")
    try:
        got = float(got)
    except (TypeError, ValueError):
        raise Wrong(f"{where} returned {type(got).__name__}; return a Python float") from None
    if math.isclose(got, want, rel_tol=1e-9):
        return
    means = [t / c for t, c in shares if c]
    hints = [(sum(means) / len(means), "the mean of the per-rank means: ranks with few samples weigh as much as "
                                       "ranks with many. Sum the totals and the counts over the ranks, then "
                                       "divide"),
             (sum(means) / p, "the per-rank means averaged over all ranks: weight by the counts instead (sum "
                              "totals and counts over the ranks, then divide)"),
             (total / count if count else float("nan"), "this rank's own mean: combine the ranks with a collective"),
             (math.fsum(t for t, _ in shares), "the sum of the totals: divide by the sum of the counts"),
             (math.fsum(t for t, _ in shares) / p, "the summed totals divided by the number of ranks: divide by "
                                                   "the summed counts"),
             (want * p, "world_size times the mean: all_reduce sums; divide the summed total by the summed count")]
    for value, hint in hints:
        if math.isclose(got, value, rel_tol=1e-6) and not math.isclose(value, want, rel_tol=1e-6):
            raise Wrong(f"{where} returned {got:.12g}, expected {want:.12g}: that is {hint}")
    if math.isclose(got, want, rel_tol=1e-2) or case in ("totals that nearly cancel", "counts above 2**24"):
        raise Wrong(f"{where} returned {got:.12g}, expected {want:.12g}: digits were lost, as float32 (about 7 "
                     f"significant digits), float16 or bfloat16 lose them. Totals that nearly cancel, and counts "
                     f"above 2**24, need float64 all the way: the tensor you all-reduce, and the division")
    raise Wrong(f"{where} returned {got:.12g}, expected sum(totals) / sum(counts) = {want:.12g}")


def check_global_mean(workers, global_mean) -> None:
    """Exercise 4.3: ``global_mean(total, count)``: sum of totals over sum of counts, on every rank."""
    name = "Exercise 4.3 (global_mean)"
    with exercise(name):
        _prepare_all(workers, [global_mean], name)
        for case in _METRIC_CASES:
            run_case(workers, name, _metric_job, global_mean, (case,), case)
    print(f"  checked on {workers.n} ranks against sum(totals) / sum(counts), to 9 significant digits: "
          f"{', '.join(_METRIC_CASES)}")
    _warn_few_ranks(workers)


# --- Exercise 4.5: checkpoints ------------------------------------------------------------


@contextlib.contextmanager
def _spy_checkpoint_io(delay_s: float, done_marker: str):
    """Count torch.save / torch.load calls on this rank. Rank 0's save is slow, as on a busy disk: it starts
    ``delay_s / 2`` late, writes half the file, waits ``delay_s / 2``, writes the rest, and only then
    creates ``done_marker``; a load that starts before the marker exists read the file too early."""
    import torch.distributed as dist

    calls = {"save": 0, "load": 0, "no_map_location": 0, "early": 0}
    save, load = torch.save, torch.load

    def slow_save(obj, f, *args, **kwargs):
        calls["save"] += 1
        if dist.get_rank() != 0:
            return save(obj, f, *args, **kwargs)
        time.sleep(delay_s / 2)
        if isinstance(f, (str, os.PathLike)):
            buffer = io.BytesIO()
            save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            with open(f, "wb") as out:
                out.write(data[:len(data) // 2])
                out.flush()
                time.sleep(delay_s / 2)        # a reader now finds half a file
                out.write(data[len(data) // 2:])
        else:                                  # an open file: written as the learner asked
            save(obj, f, *args, **kwargs)
        open(done_marker, "w").close()
        return None

    def counted_load(*args, **kwargs):
        calls["load"] += 1
        calls["early"] += not os.path.exists(done_marker)
        location = args[1] if len(args) > 1 else kwargs.get("map_location")
        calls["no_map_location"] += location is None
        return load(*args, **kwargs)

    torch.save, torch.load = slow_save, counted_load
    try:
        yield calls
    finally:
        torch.save, torch.load = save, load


_EARLY = ("rank {rank} read the checkpoint before rank 0 had finished writing it{what}: end save_checkpoint with "
          "dist.barrier() on every rank (after rank 0's torch.save), so that no rank goes on to read the file "
          "while it is incomplete, or while an older checkpoint still lies at that path")


def _checkpoint_model():
    from torch import nn

    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _checkpoint_job(save_checkpoint, load_checkpoint, path, delay_s):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import engines
    from ..replicas import replica_differences

    rank, p = dist.get_rank(), dist.get_world_size()
    group = engines.verify_group
    ddp_model = DDP(_checkpoint_model(), process_group=group)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):  # momentum buffers exist from the first step on
        loss = F.cross_entropy(ddp_model(torch.randn(4, 6, generator=g)), torch.randint(0, 3, (4,), generator=g))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    saved_model = {k: v.clone() for k, v in ddp_model.module.state_dict().items()}
    saved_momentum = [optimizer.state[q]["momentum_buffer"].clone() for q in ddp_model.parameters()]

    # 1. save, then load straight away, as a training script would resume. An older checkpoint (the
    # initial weights) lies at the path already, as when a run saves every epoch to the same file.
    done_marker = path + ".complete"
    if rank == 0:
        for stale in (path, done_marker):
            if os.path.exists(stale):
                os.remove(stale)
        torch.save({"model": _checkpoint_model().state_dict(), "optimizer": optimizer.state_dict()}, path)
    dist.barrier(group=group)
    failure = None
    with _spy_checkpoint_io(delay_s, done_marker) as calls, spy():
        save_checkpoint(ddp_model, optimizer, path)
        try:
            load_checkpoint(ddp_model, optimizer, path)
        except Exception as error:  # a half-written file fails to load: reported below if read too early
            failure = error
    early = bool(calls["early"])
    # Every rank reaches this all_gather, so one rank's problem is reported, not a hang on the others.
    counts = [torch.zeros(4) for _ in range(p)]
    dist.all_gather(counts, torch.tensor([float(calls["save"]), float(calls["load"]), float(early),
                                          float(failure is not None)]), group=group)
    if early:
        what = (f" (its torch.load then failed: {type(failure).__name__})" if failure is not None
                else " (it loaded the older checkpoint that was still there, or half of the new one)")
        raise Wrong(_EARLY.format(rank=rank, what=what))
    if failure is not None:
        raise failure
    if any(c[2] or c[3] for c in counts):
        return  # another rank reports it
    dist.barrier(group=group)      # every rank is done with the file before rank 0's checks below
    saves = [int(c[0]) for c in counts]
    if saves[0] == 0:
        raise Wrong("rank 0 never called torch.save: rank 0 writes the checkpoint")
    if any(saves[1:]):
        raise Wrong(f"torch.save was called on ranks {[r for r, s in enumerate(saves) if s]}: save on rank 0 only "
                     f"(if dist.get_rank() == 0: ...). The replicas are identical, so one copy is enough, and "
                     f"several processes writing one file at once can leave it corrupt")
    if not os.path.exists(done_marker):  # the check's engines share one machine
        raise Wrong(f"rank 0 saved the checkpoint somewhere else than the path it was given ({path})")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "optimizer" not in state:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise Wrong(f"the checkpoint should be a dict with keys 'model' and 'optimizer', got {keys}")
    model_keys = list(state["model"])
    if any(k.startswith("module.") for k in model_keys):
        raise Wrong("the saved model's keys start with 'module.' (DDP's wrapper): save ddp_model.module.state_dict(), "
                     "so that the checkpoint loads into a plain model too (evaluation, a torchrun script, "
                     "another world size), and load it into ddp_model.module")
    if sorted(model_keys) != sorted(saved_model):
        raise Wrong(f"the saved model has the keys {model_keys}, expected {sorted(saved_model)} "
                     f"(ddp_model.module.state_dict())")
    if calls["no_map_location"]:
        raise Wrong(f"rank {rank} called torch.load without map_location (or with None): pass "
                     f"map_location=device, or every rank's copy of a checkpoint saved from cuda:0 lands on GPU 0")

    # 2. every rank drifts away from the checkpoint, then loads it
    with torch.no_grad():
        for q in ddp_model.parameters():
            q.add_(rank + 1.0)
    optimizer.state.clear()
    with _spy_checkpoint_io(0.0, done_marker) as calls, spy():
        load_checkpoint(ddp_model, optimizer, path)
    problem = None
    wrong = [k for k, v in ddp_model.module.state_dict().items() if not torch.equal(v.cpu(), saved_model[k])]
    if calls["load"] == 0:
        problem = f"rank {rank} did not call torch.load in load_checkpoint: every rank loads the checkpoint"
    elif wrong:
        problem = (f"after load_checkpoint, rank {rank}'s model does not hold the checkpoint's values "
                   f"({', '.join(wrong)}): load state['model'] into ddp_model.module on every rank")
    flags = [torch.zeros(1) for _ in range(p)]
    dist.all_gather(flags, torch.tensor([float(problem is not None)]), group=group)
    if problem:
        raise Wrong(problem)
    if any(f.item() for f in flags):
        return  # another rank reports it
    if any(d != 0 for d in replica_differences(ddp_model.module, group=group).values()):
        raise Wrong("after load_checkpoint the replicas differ: every rank must load the same checkpoint")
    momentum = [optimizer.state.get(q, {}).get("momentum_buffer") for q in ddp_model.parameters()]
    if any(m is None for m in momentum) or not all(torch.equal(m.cpu(), s) for m, s in zip(momentum, saved_momentum)):
        raise Wrong(f"after load_checkpoint rank {rank}'s optimizer lost its momentum buffers: save "
                     f"optimizer.state_dict() as 'optimizer' and restore it with optimizer.load_state_dict(...); "
                     f"without it, training resumes with a different update rule than it stopped with")


def check_checkpoint(workers, save_checkpoint, load_checkpoint, delay_s: float = 1.0) -> None:
    """Exercise 4.5: ``save_checkpoint`` writes on rank 0 only then waits at a barrier;
    ``load_checkpoint`` restores model and optimizer on every rank, with map_location."""
    name = "Exercise 4.5 (save_checkpoint, load_checkpoint)"
    with exercise(name):
        _prepare_all(workers, [load_checkpoint, save_checkpoint], name)
        folder = tempfile.mkdtemp(prefix="lab04-check-")
        try:
            path = os.path.join(folder, "checkpoint.pt")
            run_case(workers, name, _checkpoint_job, save_checkpoint, (load_checkpoint, path, delay_s),
                      "a DDP model and an SGD optimizer with momentum, after 2 steps")
        finally:
            for entry in os.listdir(folder):
                os.remove(os.path.join(folder, entry))
            os.rmdir(folder)
    print(f"  checked on {workers.n} ranks: one writer, no rank reading before the file is complete (rank 0's "
          f"disk made {delay_s:g} s slow, an older checkpoint at the same path), plain keys, map_location, model "
          f"and momentum restored on every rank")
    _warn_few_ranks(workers)


# --- Exercise 4.4: predict a step's all-reduce ---------------------------------------------


_PREDICTION_CASES = [
    # (gradient bytes, last layer first; k; alpha in s; beta in s/byte)
    ([4000, 40000, 16000], 3, 7.3e-4, 3.1e-10),                        # lab 04's MNIST-1D MLP: one bucket
    ([2 ** 19, 2 ** 19, 3 * 2 ** 20, 2 ** 21, 4 * 10 ** 6, 36], 3, 2.9e-5, 1.7e-9),   # several buckets
    ([2 ** 20, 26 * 2 ** 20, 100, 5 * 2 ** 20], 5, 1.3e-5, 4.1e-10),   # a bucket closed past its limit
    ([32768, 262144, 262144, 1048576], 1, 5e-4, 1e-9),                  # one rank: nothing to send
    ([], 4, 1e-4, 1e-9),                                                # nothing to all-reduce
]


def _ring_ms(n_bytes: float, k: int, alpha: float, beta: float) -> float:
    return 1e3 * (2 * (k - 1) * alpha + 2 * (k - 1) / k * n_bytes * beta)


def _diagnose_prediction(got_ms: float, want_ms: float, buckets: list[int], k: int, alpha: float, beta: float) -> str:
    total = sum(buckets)
    known = [
        (1e-3 * want_ms, "that is the prediction in seconds: return milliseconds"),
        (_ring_ms(total, k, alpha, beta) if buckets else 0.0,
         f"that is one all-reduce of all {total:,} bytes at once: DDP all-reduces each of its {len(buckets)} "
         f"buckets separately, and each pays the latency alpha again"),
        (sum(1e3 * ((k - 1) * alpha + (k - 1) / k * n * beta) for n in buckets),
         "that is half of the ring: an all-reduce is a reduce-scatter and an all-gather, 2(p-1) steps of n/p bytes"),
        (sum(1e3 * (alpha + 2 * (k - 1) / k * n * beta) for n in buckets),
         "alpha is paid at each of the ring's 2(p-1) steps, not once per all-reduce"),
        (sum(1e3 * (2 * (k - 1) * alpha + n * beta) for n in buckets),
         "each of the ring's 2(p-1) steps sends n/p bytes: the bytes term is 2(p-1)/p n beta"),
    ]
    for value, message in known:
        if math.isclose(got_ms, value, rel_tol=1e-6) and not math.isclose(value, want_ms, rel_tol=1e-6):
            return message
    return "add up lab 03's 2(p-1) alpha + 2(p-1)/p n beta over DDP's buckets, in milliseconds"


def check_predict_comm(predict_comm) -> None:
    """Exercise 4.4: ``predict_comm(grad_bytes, k, alpha, beta)`` returns ``(number of buckets, ms)``: DDP's
    buckets for these gradients and the ring all-reduce time of all of them on k ranks, nothing overlapped."""
    from utils.ddp_timing import ddp_bucket_bytes

    name = "Exercise 4.4 (predict_comm)"
    with exercise(name):
        expect(callable(predict_comm), f"{name}: pass your function itself, got a {type(predict_comm).__name__}")
        for grad_bytes, k, alpha, beta in _PREDICTION_CASES:
            buckets = ddp_bucket_bytes(grad_bytes)
            want_ms = sum(_ring_ms(n, k, alpha, beta) for n in buckets) if k > 1 else 0.0
            call = f"predict_comm({grad_bytes}, k={k}, alpha={alpha:g}, beta={beta:g})"
            with _calls_into("utils/ddp_timing.py", "utils/labs/lab04.py") as library:
                answer = predict_comm(list(grad_bytes), k, alpha, beta)
            copied = [f for f in library if f in ("predicted_comm_seconds", "predict")]
            expect(not copied, f"{name}: {call} called the library's prediction ({copied[0] if copied else ''}): "
                               f"ddp_bucket_bytes is yours to use, the time is yours to compute")
            expect(isinstance(answer, tuple) and len(answer) == 2,
                   f"{name}: {call} returned {answer!r}; return a pair (number of buckets, milliseconds)")
            n_buckets, got_ms = answer
            expect(n_buckets == len(buckets),
                   f"{name}: {call} counted {n_buckets} bucket(s), DDP makes {len(buckets)} of {buckets} bytes: "
                   + ("one per gradient is what DDP avoids (buckets gather many gradients, 1 MiB first, then "
                      "25 MiB); use utils.ddp_timing.ddp_bucket_bytes" if n_buckets == len(grad_bytes) else
                      "use utils.ddp_timing.ddp_bucket_bytes(grad_bytes)"))
            try:
                got_ms = float(got_ms)
            except (TypeError, ValueError):
                expect(False, f"{name}: {call} returned {got_ms!r} as the time; return a number of milliseconds")
            expect(math.isclose(got_ms, want_ms, rel_tol=1e-9, abs_tol=1e-12),
                   f"{name}: {call} predicted {got_ms:.6g} ms, expected {want_ms:.6g} ms: "
                   f"{_diagnose_prediction(got_ms, want_ms, buckets, k, alpha, beta)}")
    print(f"  checked on {len(_PREDICTION_CASES)} cases: 0 to {max(len(ddp_bucket_bytes(c[0])) for c in _PREDICTION_CASES)} "
          f"buckets, k = {sorted({c[1] for c in _PREDICTION_CASES})}")

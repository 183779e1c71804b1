"""Checks for labs/04_ddp.ipynb.

Each check ships the learner's function to the engines and runs it on every rank at once, with the
machinery of lab 03's checks (``utils.checks.lab03``): the learner's torch.distributed calls run on a
process group of the check's own with a short timeout, so a rank that skips a collective costs a few
seconds and a message naming the rank, never the cluster. Each case builds its own inputs on every
rank and compares the answer with the library (``torch.utils.data.DistributedSampler``,
``utils.replicas``) or with values computed by hand; typical mistakes get a message that names the fix.
"""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time

import torch

from . import exercise, expect
from .engines import _Wrong, _prepare, _renew_group, _run_cases, _spy

GROUP_TIMEOUT = 10.0  # seconds a rank of the check's own groups waits for the others
_RESTART = ("Start a fresh cluster: run `cluster.stop()`, then re-run the Setup cell and the cells after it "
            "up to your exercise (they import what the engines need).")

_verify_group = None  # on an engine: the process group of the check's own collectives


def _fresh_verify_group(timeout_s: float) -> bool:
    """On every engine: a new group for the check's own collectives, apart from the one the learner's
    calls run on, so that a learner who skips a collective cannot pair it with one of the check's."""
    global _verify_group
    old, _verify_group = _verify_group, None
    _verify_group = _renew_group(old, timeout_s)
    return True


def _prepare_all(workers, functions, name: str) -> None:
    """lab 03's preparation for each learner function, plus the check's own process group."""
    for fn in functions:
        _prepare(workers, fn, name)
    timeout = min(float(workers.timeout), GROUP_TIMEOUT)
    ready = workers.view.apply_async(_fresh_verify_group, timeout)
    if not ready.wait(timeout + 10):
        expect(False, f"{name}: the check's own process group could not be created in time. {_RESTART}")
    ready.get(0)

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
        raise _Wrong(f"{who} returned {type(value).__name__}; return a list of sample indices (ints)")
    try:
        return [int(i) for i in value]
    except (TypeError, ValueError):
        raise _Wrong(f"{who} returned a list whose items are not whole numbers; return the sample indices") from None


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
        got = _as_index_list(shard_indices(n, r, q, epoch, seed=seed, drop_last=drop_last), who)
        if got != _sampler_indices(n, r, q, epoch, seed, drop_last):
            raise _Wrong(f"on rank {rank}, {who}: {_diagnose_shard(got, n, r, q, epoch, seed, drop_last)}")


def _run_case(workers, name, job, fn, args, case):
    _run_cases(workers, name, job, fn, [(args, case)], lambda args, passed: "")


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
            _run_case(workers, name, _shard_job, shard_indices, (n, epoch, seed, drop_last, (3, 5)),
                      f"n={n}, epoch={epoch}, seed={seed}, drop_last={drop_last}")
    print(f"  checked against DistributedSampler on {p} ranks (and world sizes 3, 5 on rank 0): "
          f"{len(cases)} cases, n from {min(c[0] for c in cases)} to {max(c[0] for c in cases)}, "
          f"padding and drop_last, epochs 0 to {max(c[1] for c in cases)}")


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
    "first weight": ("0.weight", "one element of the first weight, by 0.01", ""),
    "last weight": ("3.weight", "one element of the last layer's weight (not the first parameter), by 0.01",
                    "compare every tensor, not one: loop over all of model.named_parameters()"),
    "float buffer": ("1.running_mean", "one element of the BatchNorm buffer running_mean, by 0.01",
                     "buffers are part of the replica too (BatchNorm's running statistics are used at "
                     "evaluation): compare model.named_buffers() as well as the parameters, or the whole "
                     "model.state_dict()"),
    "integer buffer": ("1.num_batches_tracked", "the integer buffer num_batches_tracked, by 1",
                       "every buffer, also the integer ones (num_batches_tracked is int64): compare "
                       "model.named_buffers() or model.state_dict(), whatever the dtype"),
    "one ulp": ("0.weight", "one element of the first weight, by the smallest step a float32 can take",
                "compare exactly (torch.equal), not with torch.allclose: after DDP's all-reduce every rank "
                "receives the same bytes, so replicas of correct training are bit-identical and any "
                "difference is a bug"),
}


def _replicas_job(replicas_equal, case):
    import torch.distributed as dist

    from . import lab04
    from ..replicas import replica_differences

    rank, p = dist.get_rank(), dist.get_world_size()
    group = lab04._verify_group
    model = _replica_model()
    target, what, advice = _PERTURBATIONS[case]
    if target is not None and rank == p - 1:
        tensor = dict(model.state_dict(keep_vars=True))[target]
        with torch.no_grad():
            flat = tensor.view(-1)
            if case == "one ulp":
                flat[0] = torch.nextafter(flat[0], flat[0] + 1)
            else:
                flat[0] += 0.01 if tensor.dtype.is_floating_point else 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with _spy():
        answer = replicas_equal(model)
    problem = None
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = bool(answer.item())
    if not isinstance(answer, bool):
        problem = f"rank {rank} returned {type(answer).__name__}; return True or False (the same on every rank)"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    if changed:
        problem = (f"on rank {rank} replicas_equal changed the model ({', '.join(changed)}): dist.all_reduce and "
                   f"dist.broadcast overwrite the tensor they are given; all_gather copies of the tensors "
                   f"(t.detach().clone()) instead")
    # Every rank reaches this all_gather, so a problem on one rank is reported, not a hang on the others.
    answers = [torch.zeros(2) for _ in range(p)]
    dist.all_gather(answers, torch.tensor([float(answer is True), float(problem is not None)]), group=group)
    if problem:
        raise _Wrong(problem)
    if any(a[1] for a in answers):
        return  # another rank reports its problem
    answers = [bool(a[0]) for a in answers]
    truth = target is None
    differences = replica_differences(model, group=group)
    assert all(d == 0 for d in differences.values()) == truth, differences  # the check's own premise
    if len(set(answers)) > 1:
        raise _Wrong(f"the ranks disagree ({', '.join(f'rank {r}: {a}' for r, a in enumerate(answers))}) when rank "
                     f"{p - 1} changed {what}: every rank must see every rank's copy (dist.all_gather) and "
                     f"return the same answer")
    if answers[0] != truth:
        if truth:
            raise _Wrong("every rank holds exactly the same model, yet your function returned False: it must not "
                         "cry wolf (compare each tensor with the other ranks' copies of the same tensor, "
                         "in the same order on every rank)")
        raise _Wrong(f"rank {p - 1} changed {what} ({target}), and your function returned True: "
                     + (advice or "compare every parameter and buffer of every rank, with all_gather"))


def check_replicas_equal(workers, replicas_equal) -> None:
    """Exercise 4.2: ``replicas_equal(model)``: True on every rank iff every parameter and buffer is
    bit-identical on all ranks."""
    name = "Exercise 4.2 (replicas_equal)"
    with exercise(name):
        _prepare_all(workers, [replicas_equal], name)
        for case in _PERTURBATIONS:
            _run_case(workers, name, _replicas_job, replicas_equal, (case,), f"{case} differing on the last rank")
    print(f"  checked on {workers.n} ranks: equal replicas, and one rank differing in {len(_PERTURBATIONS) - 1} "
          f"ways ({', '.join(list(_PERTURBATIONS)[1:])})")


# --- Exercise 4.3: a metric over all ranks -----------------------------------------------


_METRIC_CASES = {
    "equal counts": lambda r, p: (2.0 * (r + 1) * 10, 10),
    "uneven counts": lambda r, p: (1.5 * (r + 1) * (r + 1) * 3, (r + 1) * 3),
    "a rank with no sample": lambda r, p: (0.0, 0) if r == 0 else (4.0 * r * 7, 7 * r),
    "one big rank": lambda r, p: (0.25 * 1000, 1000) if r == p - 1 else (3.0 * 5, 5),
}


def _metric_job(global_mean, case):
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    shares = [_METRIC_CASES[case](r, p) for r in range(p)]
    total, count = shares[rank]
    want = sum(t for t, _ in shares) / sum(c for _, c in shares)
    with _spy():
        got = global_mean(total, count)
    where = f"rank {rank} (case: {case}; per-rank (total, count) = {shares})"
    if got is None:
        raise _Wrong(f"{where} returned None: every rank returns the mean (use all_reduce, not reduce)")
    if isinstance(got, torch.Tensor):
        raise _Wrong(f"{where} returned a tensor; return a Python float (.item())")
    try:
        got = float(got)
    except (TypeError, ValueError):
        raise _Wrong(f"{where} returned {type(got).__name__}; return a Python float") from None
    if math.isclose(got, want, rel_tol=1e-6):
        return
    means = [t / c for t, c in shares if c]
    hints = [(sum(means) / len(means), "the mean of the per-rank means: ranks with few samples weigh as much as "
                                       "ranks with many. Sum the totals and the counts over the ranks "
                                       "(all_reduce of [total, count]) and divide"),
             (sum(means) / p, "the per-rank means averaged over all ranks: weight by the counts instead (all_reduce "
                              "of [total, count], then divide)"),
             (total / count if count else float("nan"), "this rank's own mean: combine the ranks with all_reduce"),
             (sum(t for t, _ in shares), "the sum of the totals: divide by the sum of the counts"),
             (sum(t for t, _ in shares) / p, "the summed totals divided by the number of ranks: divide by the "
                                             "summed counts"),
             (want * p, "world_size times the mean: all_reduce sums; divide the summed total by the summed count")]
    for value, hint in hints:
        if math.isclose(got, value, rel_tol=1e-6) and not math.isclose(value, want, rel_tol=1e-6):
            raise _Wrong(f"{where} returned {got:.6g}, expected {want:.6g}: that is {hint}")
    raise _Wrong(f"{where} returned {got:.6g}, expected sum(totals) / sum(counts) = {want:.6g}")


def check_global_mean(workers, global_mean) -> None:
    """Exercise 4.3: ``global_mean(total, count)``: sum of totals over sum of counts, on every rank."""
    name = "Exercise 4.3 (global_mean)"
    with exercise(name):
        _prepare_all(workers, [global_mean], name)
        for case in _METRIC_CASES:
            _run_case(workers, name, _metric_job, global_mean, (case,), case)
    print(f"  checked on {workers.n} ranks against sum(totals) / sum(counts): {', '.join(_METRIC_CASES)}")


# --- Exercise 4.4: checkpoints ------------------------------------------------------------


@contextlib.contextmanager
def _spy_checkpoint_io(delay_s: float):
    """Count torch.save / torch.load calls on this rank; rank 0's save starts ``delay_s`` late."""
    import torch.distributed as dist

    calls = {"save": 0, "load": 0, "map_location": 0}
    save, load = torch.save, torch.load

    def slow_save(*args, **kwargs):
        calls["save"] += 1
        if dist.get_rank() == 0:
            time.sleep(delay_s)  # a slow disk: another rank that does not wait for the file will not find it
        return save(*args, **kwargs)

    def counted_load(*args, **kwargs):
        calls["load"] += 1
        if len(args) > 1 or "map_location" in kwargs:
            calls["map_location"] += 1
        return load(*args, **kwargs)

    torch.save, torch.load = slow_save, counted_load
    try:
        yield calls
    finally:
        torch.save, torch.load = save, load


def _checkpoint_model():
    from torch import nn

    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _checkpoint_job(save_checkpoint, load_checkpoint, path, delay_s):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from . import lab04
    from ..replicas import replica_differences

    rank, p = dist.get_rank(), dist.get_world_size()
    group = lab04._verify_group
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

    # 1. save, then load straight away, as a training script would resume
    missing = False
    with _spy_checkpoint_io(delay_s) as calls, _spy():
        save_checkpoint(ddp_model, optimizer, path)
        try:
            load_checkpoint(ddp_model, optimizer, path)
        except FileNotFoundError:
            missing = True
    # Every rank reaches this all_gather, so one rank's problem is reported, not a hang on the others.
    counts = [torch.zeros(3) for _ in range(p)]
    dist.all_gather(counts, torch.tensor([float(calls["save"]), float(calls["load"]), float(missing)]),
                    group=group)
    if missing:
        raise _Wrong(f"rank {rank} could not find the checkpoint right after save_checkpoint returned (rank 0 "
                     f"was still writing it): end save_checkpoint with dist.barrier() on every rank, so that "
                     f"no rank reads the file before rank 0 has finished writing it")
    if any(c[2] for c in counts):
        return  # another rank reports it
    saves = [int(c[0]) for c in counts]
    if saves[0] == 0:
        raise _Wrong("rank 0 never called torch.save: rank 0 writes the checkpoint")
    if any(saves[1:]):
        raise _Wrong(f"torch.save was called on ranks {[r for r, s in enumerate(saves) if s]}: save on rank 0 only "
                     f"(if dist.get_rank() == 0: ...). The replicas are identical, so one copy is enough, and "
                     f"several processes writing one file at once can leave it corrupt")
    if not os.path.exists(path):  # the check's engines share one machine
        raise _Wrong(f"rank 0 saved the checkpoint somewhere else than the path it was given ({path})")
    dist.barrier(group=group)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "optimizer" not in state:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise _Wrong(f"the checkpoint should be a dict with keys 'model' and 'optimizer', got {keys}")
    model_keys = list(state["model"])
    if any(k.startswith("module.") for k in model_keys):
        raise _Wrong("the saved model's keys start with 'module.' (DDP's wrapper): save ddp_model.module.state_dict(), "
                     "so that the checkpoint loads into a plain model too (evaluation, a torchrun script, "
                     "another world size), and load it into ddp_model.module")
    if sorted(model_keys) != sorted(saved_model):
        raise _Wrong(f"the saved model has the keys {model_keys}, expected {sorted(saved_model)} "
                     f"(ddp_model.module.state_dict())")
    if calls["load"] and not calls["map_location"]:
        raise _Wrong(f"rank {rank} called torch.load without map_location: pass map_location=device, or every rank's "
                     f"copy of a checkpoint saved from cuda:0 lands on GPU 0")

    # 2. every rank drifts away from the checkpoint, then loads it
    with torch.no_grad():
        for q in ddp_model.parameters():
            q.add_(rank + 1.0)
    optimizer.state.clear()
    with _spy_checkpoint_io(0.0) as calls, _spy():
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
        raise _Wrong(problem)
    if any(f.item() for f in flags):
        return  # another rank reports it
    if any(d != 0 for d in replica_differences(ddp_model.module, group=group).values()):
        raise _Wrong("after load_checkpoint the replicas differ: every rank must load the same checkpoint")
    momentum = [optimizer.state.get(q, {}).get("momentum_buffer") for q in ddp_model.parameters()]
    if any(m is None for m in momentum) or not all(torch.equal(m.cpu(), s) for m, s in zip(momentum, saved_momentum)):
        raise _Wrong(f"after load_checkpoint rank {rank}'s optimizer lost its momentum buffers: save "
                     f"optimizer.state_dict() as 'optimizer' and restore it with optimizer.load_state_dict(...); "
                     f"without it, training resumes with a different update rule than it stopped with")


def check_checkpoint(workers, save_checkpoint, load_checkpoint, delay_s: float = 1.0) -> None:
    """Exercise 4.4: ``save_checkpoint`` writes on rank 0 only then waits at a barrier;
    ``load_checkpoint`` restores model and optimizer on every rank, with map_location."""
    name = "Exercise 4.4 (save_checkpoint, load_checkpoint)"
    with exercise(name):
        _prepare_all(workers, [load_checkpoint, save_checkpoint], name)
        folder = tempfile.mkdtemp(prefix="lab04-check-")
        try:
            path = os.path.join(folder, "checkpoint.pt")
            _run_case(workers, name, _checkpoint_job, save_checkpoint, (load_checkpoint, path, delay_s),
                      "a DDP model and an SGD optimizer with momentum, after 2 steps")
        finally:
            for entry in os.listdir(folder):
                os.remove(os.path.join(folder, entry))
            os.rmdir(folder)
    print(f"  checked on {workers.n} ranks: one writer, a barrier before anyone reads (rank 0's disk made "
          f"{delay_s:g} s slow), plain keys, map_location, model and momentum restored on every rank")

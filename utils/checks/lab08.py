"""Checks for labs/08_beyond_sync_sgd.ipynb.

8.1 runs the learner's weight average on the MPI engines, every rank at once, with a model whose
weights differ by rank (two dtypes, float buffers, a BatchNorm's integer step counter), on all ranks
and on a sub-communicator, and refuses mpi4py's pickle-based lower-case methods.

8.2 runs the learner's PSGD loop on the MPI engines, every rank at once (all ranks with K = 3 and K = 1,
then one-shot on a sub-communicator), on a model that records the samples of every step, with an ``average`` that
records when it is called, while every communicating call the loop makes is recorded: on the communicator given,
on MPI.COMM_WORLD and through torch.distributed (barriers and extra collectives are refused; rank and size
queries of the world are noted). It compares the weights with ``utils.parallel_sgd.local_sgd`` and names the usual
mistakes: averages at the wrong steps, gradients averaged, the wrong shard or all the data, the world's rank and
size instead of the communicator's, another learning rate.

8.3 runs the learner's Hogwild worker twice: alone in this process against a reference with the
same random order (and torch's global random state left untouched), then in two spawned processes
on one model in shared memory, where each process's shard touches weights of its own and the model
records every forward pass. So the check sees that each process trained the shared model itself
(not a copy whose change is added later), that both processes' updates reached it, and that the
processes ran at the same time (no lock around the steps).

8.4 gives the learner's ``hogwild_train`` a worker that records, in shared memory, each process's
rank, process id, shard and labels, whether all processes ran at once, and whether it was forked; it
marks the model, so the check sees a copy trained instead of the shared model, processes never joined,
run one after another or in this process, shards that are equal, overlap, miss samples, are consecutive
blocks or strided or come without their own labels, a number of processes other than the one asked (5
processes on 12 samples, where torch.chunk gives 4 pieces), and (in a second run of 3 processes, where
the middle one dies and the last lives until it is joined) a failure passed over in silence, raised
without naming the process, or raised before the others were joined. While the learner's function runs,
Process.start, join and is_alive are watched in this process: a join (or is_alive) before all processes
started ends their wait for one another, and a join with a short timeout holds its process alive past
the timeout, so a process still running is not taken for one that ended. Forked processes are named last.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from . import exercise, expect, hint_for
from .engines import prepare, run_case, Wrong

HINTS = {
    "8.1": """Step by step:
1. p = comm.Get_size() (the communicator you are given, which need not be MPI.COMM_WORLD).
2. For every tensor of list(model.parameters()) + list(model.buffers()) that is floating point:
   values = tensor.detach().numpy() shares the tensor's memory;
   comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM) sums it over the ranks, on every rank;
   values /= p makes the sum a mean (still in the tensor's memory).""",
    "8.2": """Step by step:
1. size, me = comm.Get_size(), comm.Get_rank(); batches = parallel_sgd.worker_batches(len(x), me, size, batch_size, seed)
   gives this worker's own shard, a new order each epoch; take one batch of indices with next(batches) per step.
2. optimizer = torch.optim.SGD(model.parameters(), lr=lr), the lr as given.
3. for step in range(1, steps + 1): zero_grad, cross_entropy(model(x[idx]), y[idx]), backward, step;
   then, if step % sync_every == 0 or step == steps: average(model, comm).""",
    "8.3": """Step by step:
1. optimizer = torch.optim.SGD(model.parameters(), lr=lr): this process's own optimizer on the shared weights.
2. g = torch.Generator().manual_seed(seed); for each epoch: order = torch.randperm(len(x), generator=g).
3. For each batch of indices in order.split(batch_size): zero_grad, cross_entropy(model(x[idx]), y[idx]),
   backward, step; count the updates. Return the count.""",
    "8.4": """Step by step:
1. model.share_memory() moves its weights to shared memory; shards = parallel_sgd.shard_indices(len(x), processes).
2. ctx = torch.multiprocessing.get_context("spawn"); for each rank r and shard s:
   ctx.Process(target=worker, args=(r, model, x[s], y[s])). Start them all, then join them all.
3. Every process's exitcode must be 0: if one is not, raise an error that names the process and its code.""",
    "8.5": """Step by step:
1. The proximal term gamma/2 |y - x|^2 has the gradient gamma * (y - x) with respect to y: inner = grad + gamma * (y - x).
2. At a synchronisation x is pulled towards the replica's own average z with strength gamma and towards the
   replicas' mean z_mean with strength rho: sync = gamma * (x - z) + rho * (x - z_mean).""",
}


hint = hint_for(HINTS)  # lab08.hint("8.1") prints that exercise's step-by-step hint


# --- 8.1 the weight average with Allreduce ----------------------------------------------------------

_PICKLING = ("allreduce", "reduce", "bcast", "allgather", "gather", "scatter", "alltoall", "sendrecv", "send",
             "recv", "isend", "irecv")


class _Replica(nn.Module):
    """Weights that depend on the rank: a float32 layer, a float64 parameter, a float buffer, and a
    BatchNorm whose step counter (an integer buffer) differs by rank too."""

    def __init__(self, rank: int):
        super().__init__()
        generator = torch.Generator().manual_seed(100 + rank)
        self.layer = nn.Linear(3, 4)
        self.scale = nn.Parameter(torch.randn(5, dtype=torch.float64, generator=generator))
        self.register_buffer("running", torch.randn(2, generator=generator))
        self.norm = nn.BatchNorm1d(4)
        with torch.no_grad():
            self.layer.weight.copy_(torch.randn(4, 3, generator=generator) * (rank + 1))
            self.layer.bias.copy_(torch.randn(4, generator=generator) - rank)
            self.norm.running_mean.copy_(torch.randn(4, generator=generator))
            self.norm.num_batches_tracked.fill_(7 + 3 * rank)


def _watched(comm):
    """``comm`` itself (the same MPI communicator, an mpi4py Intracomm), with its pickle-based
    lower-case methods counted: they copy every array through pickle instead of reducing in place."""
    from mpi4py import MPI

    used = []

    class Watched(MPI.Intracomm):
        pass

    def counting(name):
        def call(self, *args, **kwargs):
            used.append(name)
            return getattr(MPI.Intracomm, name)(self, *args, **kwargs)
        return call

    for name in _PICKLING:
        setattr(Watched, name, counting(name))
    return Watched(comm), used


def _average_job(average_weights, world_size_expected, split):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    if p != world_size_expected:
        raise Wrong(f"MPI.COMM_WORLD has {p} rank(s) on this engine, the cluster {world_size_expected}: start the "
                    f"engines with cluster.start(P, engines=\"mpi\")")
    color = (lambda r: r % 2 if p >= 3 else r) if split else (lambda r: 0)   # 2 ranks: one rank per group
    members = [r for r in range(p) if color(r) == color(rank)]
    comm = world.Split(color(rank), rank)
    try:
        states = {r: {name: t.clone() for name, t in _Replica(r).state_dict().items()} for r in range(p)}
        mine = _Replica(rank)
        watched, used = _watched(comm)
        average_weights(mine, watched)
        where = (f"on a communicator of ranks {members} of {p} (comm.Split)" if split else f"on all {p} ranks")
        if used:
            raise Wrong(f"rank {rank}: you called comm.{used[0]}, mpi4py's lower-case method, which pickles each "
                        f"array and sends copies; use the buffer-based Allreduce, which reduces in the tensor's own "
                        f"memory")
        for name, got in mine.state_dict().items():
            before = states[rank][name]
            if not got.is_floating_point():
                if not torch.equal(got, before):
                    raise Wrong(f"rank {rank}: {name} (an integer buffer, {got.dtype}) changed from {before.item()} "
                                f"to {got.item()}: integer buffers count steps; leave them as they are")
                continue
            group = torch.stack([states[r][name].double() for r in members])
            everyone = torch.stack([states[r][name].double() for r in range(p)])
            close = lambda want: torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6)
            if close(group.mean(0)):
                continue
            if len(members) < p and close(everyone.mean(0)):
                raise Wrong(f"rank {rank}: {name} holds the mean over all {p} ranks of MPI.COMM_WORLD, but the "
                            f"communicator you were given, {where}, has {len(members)}: average over `comm`")
            if close(group.sum(0)):
                raise Wrong(f"rank {rank}: {name} holds the sum over the ranks, not the mean: divide by comm.Get_size(), "
                            f"in place (values /= size; values = values / size makes a new array the model never sees)")
            ratio = (group.sum(0) / got.double()).flatten()
            divisor = ratio[0].item() if torch.isfinite(ratio).all() else float("nan")
            whole = abs(divisor - round(divisor)) < 1e-6 and torch.allclose(ratio, ratio[0])
            if whole and round(divisor) == p != len(members):
                raise Wrong(f"rank {rank}: {name} holds the sum over `comm`, {where}, divided by MPI.COMM_WORLD's size, "
                            f"{p}: divide by the size of the communicator you reduced over, comm.Get_size()")
            if whole and round(divisor) != len(members):
                raise Wrong(f"rank {rank}: {name} holds the sum divided by {round(divisor)}, {where}, whose size is "
                            f"{len(members)}: divide by comm.Get_size(), not by a number")
            averaged = lambda key: torch.allclose(mine.state_dict()[key].double(), torch.stack(
                [states[r][key].double() for r in members]).mean(0), rtol=1e-6, atol=1e-6)
            floats = {key: t for key, t in mine.state_dict().items() if t.is_floating_point()}
            others = [key for key, t in floats.items() if t.dtype != got.dtype]
            alike_unchanged = all(torch.equal(t, states[rank][key]) for key, t in floats.items() if t.dtype == got.dtype)
            if alike_unchanged and others and all(averaged(key) for key in others):     # chosen by dtype
                raise Wrong(f"rank {rank}: {name} ({got.dtype}) is unchanged, while {others[0]} "
                            f"({mine.state_dict()[others[0]].dtype}) "
                            f"is averaged: you picked the tensors by their dtype. Every floating-point dtype counts: "
                            f"test tensor.is_floating_point()")
            if torch.equal(got, before):
                raise Wrong(f"rank {rank}: {name} is unchanged ({where}). Every rank must end with the mean of every "
                            f"parameter and floating-point buffer: Allreduce leaves the result on every rank (Reduce "
                            f"only on the root), and the result must land in the model's own tensors (a numpy view "
                            f"that shares their memory, not a copy).")
            raise Wrong(f"rank {rank}: {name} is {got.flatten()[:3].tolist()}..., the mean {where} is "
                        f"{group.mean(0).flatten()[:3].tolist()}...")
    finally:
        comm.Free()
    return True


def check_average(workers, average_weights) -> None:
    """Exercise 8.1: the learner's ``average_weights(model, comm)`` on every MPI engine at once, on
    all ranks and on a sub-communicator (2 engines: one rank each; 3 or more: even and odd ranks)."""
    name = "8.1"
    integers = (" (Integer buffers such as BatchNorm's num_batches_tracked cannot be divided in place as "
                "floats: skip the tensors that are not floating point.)")
    with exercise(name):
        prepare(workers, average_weights, name)
        run_case(workers, name, _average_job, average_weights, (workers.n, False),
                 f"{workers.n} ranks, float32 and float64 parameters, buffers and a BatchNorm", integers)
        run_case(workers, name, _average_job, average_weights, (workers.n, True),
                 "a sub-communicator made by comm.Split", integers)


# --- 8.2 the PSGD loop ------------------------------------------------------------------------------


class _Recorder(nn.Module):
    """A linear model (float64) whose inputs carry each sample's index in their first column: in
    training mode it records the indices of every batch it sees, so its length is the number of
    steps taken so far. The index column is not an input of the layer."""

    def __init__(self, features: int, classes: int):
        super().__init__()
        self.layer = nn.Linear(features, classes).double()
        self.batches: list[list[int]] = []

    def forward(self, x):
        if self.training:
            self.batches.append(x[:, 0].long().tolist())
        return self.layer(x[:, 1:])


def _indexed_problem(n: int, features: int, classes: int, seed: int):
    generator = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, features + 1, generator=generator, dtype=torch.float64)
    x[:, 0] = torch.arange(n, dtype=torch.float64)
    return x, torch.randint(0, classes, (n,), generator=generator)


def _address(buffer):
    """Where an mpi4py buffer argument (an array, or [array, datatype]) or a tensor lives in memory; None if unknown."""
    import numpy as np

    if isinstance(buffer, torch.Tensor):
        return buffer.data_ptr()
    if isinstance(buffer, (list, tuple)) and buffer:
        buffer = buffer[0]
    try:
        return np.asarray(buffer).__array_interface__["data"][0]
    except Exception:
        return None


# mpi4py communicator methods that communicate nothing: every other method is recorded
_LOCAL = {"Abort", "Ack_failed", "Attach_buffer", "Call_errhandler", "Cart_map", "Compare", "Create_errhandler",
          "Create_keyval", "Delete_attr", "Detach_buffer", "Free", "Free_keyval", "Get_failed", "Get_parent",
          "Graph_map", "f2py", "free", "fromhandle", "fromint", "py2f", "toint"}
_QUERIES = ("Get_rank", "Get_size")


def _communicating(cls) -> list[str]:
    import inspect

    names = []
    for name in dir(cls):
        found = inspect.getattr_static(cls, name)
        if name.startswith(("_", "Get_", "Set_", "Is_")) or name in _LOCAL or not callable(found) \
                or isinstance(found, (classmethod, staticmethod)):
            continue
        names.append(name)
    return names


def _recording(comm, calls: list, gradients, label: str = "comm", asked: list | None = None):
    """``comm`` itself, with every communicating method the learner's loop calls on it recorded as
    (label.name, whether one of its buffers is a gradient's memory: ``gradients()`` gives their
    addresses at that moment); with ``asked``, its rank and size queries are recorded there too."""
    from mpi4py import MPI

    class Recorded(MPI.Intracomm):
        pass

    def recording(name):
        def call(self, *args, **kwargs):
            addresses = {_address(a) for a in list(args) + list(kwargs.values())}
            calls.append((f"{label}.{name}", bool(addresses & gradients())))
            return getattr(MPI.Intracomm, name)(self, *args, **kwargs)
        return call

    def asking(name):
        def call(self, *args, **kwargs):
            asked.append(label)
            return getattr(MPI.Intracomm, name)(self, *args, **kwargs)
        return call

    for name in _communicating(MPI.Intracomm):
        setattr(Recorded, name, recording(name))
    if asked is not None:
        for name in _QUERIES:
            setattr(Recorded, name, asking(name))
        Recorded.rank = property(lambda self: self.Get_rank())
        Recorded.size = property(lambda self: self.Get_size())
    return Recorded(comm)


def _dist_recorders(calls: list, gradients, asked: list) -> dict:
    """torch.distributed's communicating functions, and its rank and size queries, recorded."""
    import torch.distributed as dist

    from .engines import _COMMUNICATION

    def recording(name, original):
        def call(*args, **kwargs):
            addresses = {_address(a) for a in list(args) + list(kwargs.values())}
            calls.append((f"torch.distributed.{name}", bool(addresses & gradients())))
            return original(*args, **kwargs)
        return call

    def asking(original):
        def call(*args, **kwargs):
            asked.append("torch.distributed")
            return original(*args, **kwargs)
        return call

    wrapped = {name: recording(name, getattr(dist, name)) for name in _COMMUNICATION if hasattr(dist, name)}
    wrapped.update({name: asking(getattr(dist, name)) for name in ("get_rank", "get_world_size")})
    return wrapped


def _batches_of(n: int, rank: int, size: int, batch_size: int, seed: int, steps: int):
    """The first ``steps`` batches of worker_batches(n, rank, size, ...), None where it refuses them."""
    from utils import parallel_sgd

    try:
        batches = parallel_sgd.worker_batches(n, rank, size, batch_size, seed)
        return [next(batches).tolist() for _ in range(steps)]
    except ValueError:
        return None


def _communication_message(calls: list, steps: int) -> str:
    """What the loop's own communication (none is wanted) says, worst first."""
    on_gradient = [name for name, gradient in calls if gradient]
    if on_gradient:
        return (f"your loop called {on_gradient[0]} on the gradients: that is synchronous SGD's all-reduce of "
                f"gradients. Parallel SGD averages the weights: every worker takes its own optimizer steps, and "
                f"after every sync_every-th step and the last, average(model, comm) averages the model itself")
    name = calls[0][0]
    count = sum(1 for called, _ in calls if called == name)
    times = f"{count} time(s) in {steps} steps"
    if name.startswith("MPI.COMM_WORLD"):
        return (f"your loop called {name} {times}: MPI.COMM_WORLD holds every engine, not only your workers. Use "
                f"only the comm you were given, and communicate only through average(model, comm)")
    if "arrier" in name:
        return (f"your loop called {name} {times}: parallel SGD's workers communicate only in average(model, "
                f"comm), and each average already waits for every worker; a barrier between averages makes every "
                f"step wait for the slowest worker, which is what averaging rarely saves. Remove it")
    return (f"your loop called {name} {times} itself: parallel SGD's only communication is average(model, comm), "
            f"after every sync_every-th step and the last; any other collective (a loss for a progress line, a "
            f"second average written out) is extra communication. Remove it")


def _world_message(where: str, asked: list) -> str:
    source = asked[0] if asked else "the world (MPI.COMM_WORLD, torch.distributed, or the engine's rank and world_size)"
    return (f"{where}: you took this worker's rank and size from {source}, not from the communicator you were "
            f"given: on a sub-communicator they differ. Use comm.Get_rank() and comm.Get_size()")


def _wanted_averages(steps: int, sync_every: int) -> list[int]:
    return sorted(set(range(sync_every, steps + 1, sync_every)) | {steps})


def _averages_message(got: list, steps: int, sync_every: int) -> str | None:
    want = _wanted_averages(steps, sync_every)
    if got == want:
        return None
    every = f"every {sync_every} steps" + (" (one-shot: sync_every = steps)" if sync_every >= steps else "")
    twice = sorted({s for s in got if got.count(s) > 1})
    if twice:
        return (f"you averaged more than once after step(s) {twice} (after steps {got}): average once after every "
                f"sync_every-th step and once after the last, after steps {want}; when sync_every divides the steps "
                f"the last step is one of them, and a second average only repeats the all-reduces.")
    if not got:
        return (f"your loop never called average(model, comm) ({every}, {steps} steps): it must average after "
                f"steps {want}" + (", once, after the last step" if sync_every >= steps else "")
                + ". Call the average you are given (the lab times your averages through it).")
    if sync_every > 1 and got == list(range(1, steps + 1)):
        return (f"you averaged after every step, but sync_every = {sync_every}: average only after every "
                f"{sync_every}-th step, and after the last, i.e. after steps {want}.")
    if got == want[:-1] or (steps not in got and set(got) <= set(want)):
        return (f"you averaged after steps {got} but not after the last one, step {steps}: every worker must end "
                f"with the averaged model, so the last step is always followed by an average (after steps {want}).")
    shifted = {m + d for m in range(sync_every, steps + 1, sync_every) for d in (-1, 1)} | {1, steps}
    if set(got) <= shifted:       # e.g. a loop over range(steps) that tests step % sync_every
        return (f"you averaged after steps {got}, {every} means after steps {want}: off by one. Count steps "
                f"from 1 (the first step is step 1) and average after step s when s is a multiple of sync_every, "
                f"and after the last.")
    return f"you averaged after steps {got}; {every} with {steps} steps means after steps {want}."


def _waited(request, what: str, timeout_s: float = 10.0) -> None:
    """Wait for a non-blocking MPI request, at most ``timeout_s``: MPI's blocking collectives wait
    forever for a rank that never comes (one that raised, or skipped a collective)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not request.Test():
        if time.monotonic() > deadline:
            raise Wrong(f"{what}: the other workers did not join within {timeout_s:g} s (a worker that raised, or "
                        f"that averaged a different number of times, leaves the others waiting)")
        time.sleep(0.001)


def _average_timed(model: nn.Module, comm, what: str) -> None:
    """``utils.parallel_sgd.average_parameters`` with non-blocking all-reduces that give up after a while."""
    from mpi4py import MPI

    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            _waited(comm.Iallreduce(MPI.IN_PLACE, values, op=MPI.SUM), what)
            values /= comm.Get_size()


def _psgd_job(psgd, n, steps, batch_size, lr, sync_every, seed, split):
    import copy

    from mpi4py import MPI

    from utils import parallel_sgd

    from .engines import replaced_in_dist

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    color = (lambda r: r % 2 if p >= 3 else r) if split else (lambda r: 0)
    comm = world.Split(color(rank), rank)
    try:
        size, me = comm.Get_size(), comm.Get_rank()
        where = (f"worker {me} of {size} on a communicator made by comm.Split (rank {rank} of {p} in "
                 f"MPI.COMM_WORLD)" if split else f"worker {me} of {size}")
        x, y = _indexed_problem(n, 4, 3, seed)
        torch.manual_seed(seed)
        start = _Recorder(4, 3)
        model, calls, averaged_at, wrong_comm, asked = copy.deepcopy(start), [], [], [], []
        gradients = lambda: {q.grad.data_ptr() for q in model.parameters() if q.grad is not None}
        recorded = _recording(comm, calls, gradients)

        def average(m, c):          # never raises: the other ranks would wait in their average
            if m is not model or not (c is recorded or c == comm):
                wrong_comm.append(c)
            averaged_at.append(len(model.batches))
            _average_timed(m, comm, f"{where}, the average after step {len(model.batches)}")

        # MPI.COMM_WORLD and torch.distributed, recorded too while the loop runs
        MPI.COMM_WORLD = _recording(world, calls, gradients, "MPI.COMM_WORLD", asked)
        try:
            with replaced_in_dist(_dist_recorders(calls, gradients, asked)):
                psgd(model, x, y, recorded, average, steps, batch_size, lr, sync_every, seed)
        except Exception as error:
            if split and asked:
                raise Wrong(_world_message(where, asked)) from error
            raise
        finally:
            MPI.COMM_WORLD = world

        # The references, every rank in the same order (they are collectives), before any verdict.
        references = {}
        for label, rate in (("right", lr), ("lr x size", lr * size), ("lr / size", lr / size), ("0.1", 0.1),
                            ("summed", lr * batch_size)):
            reference = copy.deepcopy(start)
            parallel_sgd.local_sgd(reference, x, y, steps=steps, batch_size=batch_size, lr=rate, sync_every=sync_every,
                                   average=lambda m: _average_timed(m, comm, f"{where}, the check's reference"), rank=me,
                                   world_size=size, seed=seed)
            references[label] = (rate, reference)

        if wrong_comm:
            raise Wrong(f"{where}: call average(model, comm) with the model you train and the comm your function "
                        f"received, not another model or communicator")
        if calls:
            raise Wrong(f"{where}: {_communication_message(calls, steps)}")
        shards = parallel_sgd.shard_indices(n, size, seed)
        mine, seen = set(shards[me].tolist()), {i for batch in model.batches for i in batch}
        taken = len(model.batches)
        off = taken > 0 and model.batches != _batches_of(n, me, size, batch_size, seed, taken)
        as_world = off and ((split and bool(asked)) or any(model.batches == _batches_of(n, r, s, batch_size, seed, taken)
                                               for r, s in ((rank, p), (me, p))))
        _waited(comm.Ibarrier(), f"{where}, after your loop")
        gathered = comm.allgather((seen, as_world))         # every rank is here: no wait
        everyone = [theirs for theirs, _ in gathered]
        if any(world_like for _, world_like in gathered):    # the same verdict on every rank
            raise Wrong(_world_message(where, asked))
        within = lambda r, partition_seed: everyone[r] <= set(parallel_sgd.shard_indices(n, size, partition_seed)[r].tolist())
        for r in range(size):             # every rank gives the same verdict on worker r
            if within(r, seed):
                continue
            if seed != 0 and within(r, 0):
                raise Wrong(f"{where}: worker {r} trained on its shard of another partition, the one of seed 0: pass "
                            f"the seed you were given (seed = {seed}) to worker_batches; it makes the partition, the "
                            f"same on every worker")
            if r != 0 and within(r, seed + r):
                raise Wrong(f"{where}: worker {r}'s shard comes from the seed {seed + r} (the seed plus its rank): every "
                            f"worker must pass the same seed to worker_batches, so that they cut the data into one "
                            f"partition (it gives each worker its own order from its rank itself); with a seed per "
                            f"worker the shards overlap")
        if not seen <= mine:
            raise Wrong(f"{where}: {len(seen - mine)} of the samples you trained on belong to other workers' shards "
                        f"(all the data?): each worker reads only its own shard, a random 1/P of the data "
                        f"(parallel_sgd.worker_batches with this worker's rank and the communicator's size)")
        same = [r for r, theirs in enumerate(everyone) if r != me and theirs & seen]
        if same:
            raise Wrong(f"{where}: you and worker(s) {same} trained on the same samples: every worker reads its "
                        f"own shard, the one for its rank in comm (comm.Get_rank(), comm.Get_size())")
        if len(model.batches) != steps:
            raise Wrong(f"{where}: your loop took {len(model.batches)} SGD steps; the caller asked for steps = {steps}")
        message = _averages_message(averaged_at, steps, sync_every)
        if message:
            raise Wrong(f"{where}: {message}")
        want_batches = references["right"][1].batches
        if model.batches != want_batches:
            first = next(i for i, (a, b) in enumerate(zip(model.batches, want_batches)) if a != b)
            raise Wrong(f"{where}: your batches are not those of parallel_sgd.worker_batches(len(x), rank, size, "
                        f"batch_size, seed): step {first + 1} took samples {model.batches[first]}, it gives "
                        f"{want_batches[first]}. Make one worker_batches for the whole loop (it reshuffles the shard "
                        f"every epoch itself) and take one batch of indices from it per step, for the inputs and the "
                        f"labels together, in its order, with the seed you were given")
        got = model.layer.weight.detach()
        close = lambda ref: torch.allclose(got, ref.layer.weight.detach(), rtol=0, atol=1e-10) and \
            torch.allclose(model.layer.bias.detach(), ref.layer.bias.detach(), rtol=0, atol=1e-10)
        if close(references["right"][1]):
            return True
        for label, (rate, reference) in references.items():
            if label == "summed" and close(reference):
                raise Wrong(f"{where}: your weights are those of SGD on the loss summed over the batch, which is "
                            f"batch_size = {batch_size} times the mean (as if lr were {rate:g}): use cross_entropy's "
                            f"mean over the batch (its default reduction), as the lr given assumes")
            if label != "right" and close(reference):
                raise Wrong(f"{where}: your weights are those of SGD with learning rate {rate:g} ({label}), but the "
                            f"caller asked for lr = {lr:g}: use the lr you are given, as it is (the lab scales it "
                            f"for K = 1 itself)")
        gap = (got - references["right"][1].layer.weight.detach()).abs().max().item()
        raise Wrong(f"{where}: your averages come at the right steps and your batches are right, but the weights "
                    f"differ from plain SGD (torch.optim.SGD at lr {lr:g}, cross_entropy, the average after the "
                    f"optimizer's step) by up to {gap:.3g}")
    finally:
        comm.Free()


def check_psgd(workers, psgd) -> None:
    """Exercise 8.2: the learner's ``psgd_loop(model, x, y, comm, average, steps, batch_size, lr, sync_every, seed)``
    on every MPI engine at once: a period that does not divide the steps, on all ranks; one-shot on a
    sub-communicator (2 engines: one rank each; 3 or more: even and odd ranks); synchronous SGD
    (sync_every = 1) on all ranks; shards of unequal sizes, a batch size other than the number of ranks."""
    name = "8.2"
    with exercise(name):
        prepare(workers, psgd, name)
        # sample counts that no rank count divides, with every shard at least one batch at 8 or 16 ranks
        # (a rank whose shard is shorter than a batch raises in worker_batches while the others wait in MPI)
        n_period, n_sync, n_oneshot = max(29, 4 * workers.n + 5), max(17, 2 * workers.n + 3), max(23, workers.n + 7)
        run_case(workers, name, _psgd_job, psgd, (n_period, 7, 4, 0.037, 3, 4, False),
                 f"{workers.n} ranks, {n_period} samples, 7 steps of 4 samples, an average every 3 steps")
        run_case(workers, name, _psgd_job, psgd, (n_sync, 3, 2, 0.05, 1, 2, False),
                 f"{workers.n} ranks, synchronous SGD (sync_every = 1), 3 steps of 2 samples")
        run_case(workers, name, _psgd_job, psgd, (n_oneshot, 5, 2, 0.05, 5, 1, True),
                 "one-shot averaging (sync_every = steps = 5) on a sub-communicator made by comm.Split")


# --- 8.3 the Hogwild worker -------------------------------------------------------------------------


def _reference_worker(model, x, y, epochs, batch_size, lr, seed, reshuffle=True, shuffle=True, drop_last=False):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=generator)
    updates = 0
    for epoch in range(epochs):
        if epoch and reshuffle:
            order = torch.randperm(len(x), generator=generator)
        for idx in (order if shuffle else torch.arange(len(x))).split(batch_size):
            if drop_last and len(idx) < batch_size:
                continue
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
            updates += 1
    return updates


def _block_problem(blocks: int, per_block: int = 12, features: int = 4, seed: int = 0):
    """Samples whose inputs are zero outside their block of features: shard r's gradients touch only
    the weight columns of block r (a model without bias)."""
    generator = torch.Generator().manual_seed(seed)
    shards = []
    for block in range(blocks):
        x = torch.zeros(per_block, blocks * features, dtype=torch.float64)
        x[:, block * features:(block + 1) * features] = torch.randn(per_block, features, generator=generator,
                                                                     dtype=torch.float64)
        shards.append((x, torch.randint(0, 3, (per_block,), generator=generator)))
    return shards


class _Watcher(nn.Module):
    """A linear model (no bias) on ``_block_problem(2)`` that records, in shared memory, every forward
    pass of each process (the block its inputs fill tells which) and whether the other process was
    inside forward at the same time. A forward pass waits up to ``wait_s`` for the other process to
    come in too: two processes that take no lock meet at once; a lock held around each step keeps
    the other out, and the wait runs out."""

    def __init__(self, features: int = 4, wait_s: float = 0.15):
        super().__init__()
        self.features, self.wait_s = features, wait_s
        self.weight = nn.Parameter(torch.zeros(3, 2 * features, dtype=torch.float64))
        self.register_buffer("inside", torch.zeros(2, dtype=torch.int64))
        self.register_buffer("count", torch.zeros(2, dtype=torch.int64))
        self.register_buffer("met", torch.zeros(2, dtype=torch.int64))

    def forward(self, x):
        import time

        mine = 0 if x[:, :self.features].abs().sum() > 0 else 1
        self.inside[mine] = 1
        deadline = time.monotonic() + self.wait_s
        while not int(self.inside[1 - mine]) and time.monotonic() < deadline:
            time.sleep(0.001)
        if int(self.inside[1 - mine]):
            self.met[mine] += 1
        out = x @ self.weight.t()
        self.count[mine] += 1
        self.inside[mine] = 0
        return out


def _by_value(rank, parent, payload, model, x, y, epochs, batch_size, lr, seed):
    """Run a function from the notebook in a spawned process: it travels pickled by value."""
    import cloudpickle

    return cloudpickle.loads(payload)(model, x, y, epochs, batch_size, lr, seed)


def check_hogwild_worker(hogwild_worker) -> None:
    """Exercise 8.3: ``hogwild_worker(model, x, y, epochs, batch_size, lr, seed)`` trains the model it is
    given, in place, on (x, y), with its own SGD and a new random order every epoch; returns its updates."""
    import cloudpickle

    from utils.hogwild import run_processes

    with exercise("8.3"):
        (x, y), = _block_problem(1, per_block=10)
        settings = dict(epochs=3, batch_size=4, lr=0.1, seed=5)
        torch.manual_seed(0)
        start = nn.Linear(4, 3, bias=False).double()
        models = {kind: nn.Linear(4, 3, bias=False).double()
                  for kind in ("yours", "right", "once", "unshuffled", "full batches")}
        for model in models.values():
            model.load_state_dict(start.state_dict())
        rng_before = torch.random.get_rng_state()
        updates = hogwild_worker(models["yours"], x, y, **settings)
        expect(torch.equal(rng_before, torch.random.get_rng_state()),
               "8.3: your worker changed torch's global random state (torch.manual_seed, or a draw without "
               "generator=...). Each process takes its order from a torch.Generator of its own, seeded with seed: "
               "the global one also drives dropout and initialisation, which the worker must leave alone.")
        want = _reference_worker(models["right"], x, y, **settings)
        _reference_worker(models["once"], x, y, **settings, reshuffle=False)
        _reference_worker(models["unshuffled"], x, y, **settings, shuffle=False)
        _reference_worker(models["full batches"], x, y, **settings, drop_last=True)
        yours = models["yours"].weight.detach()
        expect(not torch.equal(yours, start.weight), "8.3: the model you were given did not change: train it in "
                                                     "place (a copy of it never reaches the shared memory).")
        for kind, message in (("unshuffled", "you walked the samples in their order: shuffle with "
                                             "torch.randperm(len(x), generator=g) every epoch"),
                              ("once", "you shuffled once and reused that order: draw a new permutation every "
                                       "epoch from the same generator"),
                              ("full batches", "you left out each epoch's last, smaller batch: train on every sample "
                                               "each epoch (Tensor.split keeps the remainder as a last batch)")):
            expect(not torch.allclose(yours, models[kind].weight.detach(), rtol=0, atol=1e-12), f"8.3: {message}.")
        expect(torch.allclose(yours, models["right"].weight.detach(), rtol=0, atol=1e-12),
               f"8.3: after {settings['epochs']} epochs the weights differ from plain SGD (lr {settings['lr']}, batches "
               f"of {settings['batch_size']} in the order of torch.randperm(len(x), generator="
               f"torch.Generator().manual_seed(seed)), a new permutation each epoch) by up to "
               f"{(yours - models['right'].weight.detach()).abs().max().item():.3g}.")
        expect(updates == want, f"8.3: return the number of updates this process made: {want}, not {updates!r}.")

        shards = _block_problem(2)
        shared = _Watcher().share_memory()
        payload = cloudpickle.dumps(hogwild_worker)
        counts = run_processes(_by_value, [(payload, shared, sx, sy, 3, 2, 0.1, r) for r, (sx, sy) in enumerate(shards)],
                               timeout=120)
        weight, ran = shared.weight.detach(), shared.count.tolist()
        expect(min(ran) > 0, f"8.3: in two processes sharing one model, process(es) {[r for r in (0, 1) if not ran[r]]} "
                             f"never ran the model they were given: each process must train the shared model itself, "
                             f"not a copy (a copy's changes, added at the end or not, are not Hogwild).")
        moved = [bool(weight[:, 4 * r:4 * (r + 1)].abs().sum() > 0) for r in range(2)]
        expect(all(moved), f"8.3: in two processes sharing one model, the weights that only process(es) "
                           f"{[r for r, m in enumerate(moved) if not m]} update did not change: each process must "
                           f"update the shared model it is given, not a copy.")
        expect(counts == [18, 18], f"8.3: in two processes each should make 18 updates (3 epochs of 12 samples in "
                                   f"batches of 2); they reported {counts}.")
        expect(int(shared.met.sum()) > 0,
               "8.3: the two processes never ran a forward pass at the same time: they took turns, as with a lock "
               "around each step. Hogwild takes no lock: each process reads and writes the shared weights whenever "
               "it is ready.")


# --- 8.4 the Hogwild processes ----------------------------------------------------------------------

HOGWILD_WAIT_S = 300.0  # the longest a process of the check waits for the others to start, where nothing else
#                         tells it to stop (your function joins a process before it has started them all)
HOLD_S = 120.0          # the longest a process of the check stays alive, held, waiting to be joined
TIMED_JOIN_S = 15.0     # a join(timeout=...) up to this long holds its process past the timeout


class _Probe:
    """The worker the check gives the learner's ``hogwild_train``: in each process it records, in shared
    memory, the rank it was given, its process id, the samples of its shard (the inputs' first column
    holds each sample's index), whether its labels are those of its inputs (the labels hold the same
    indices), whether it came by pickling (spawn, forkserver) or was inherited by a forked process, and
    whether all processes were running at once; it adds 1 to row ``rank`` of the model's weight, so the
    model shows which processes trained the model given rather than a copy. ``fail`` names a rank that
    dies (exit code 3); ``hold`` a rank that stays alive until it is joined. A process also stays alive
    while the check holds it (``held``: its pid, set when it is joined with a short timeout). Waits end
    on events that ``_watching`` sets in the check's process (a join before all processes started, the
    learner's function returned), on the parent's end, or after a long bound. A first argument that is
    not a rank is described in ``complaint`` (the process's own error goes to its stderr, which a
    notebook does not show)."""

    def __init__(self, processes: int, n: int, fail: int | None = None, hold: int | None = None):
        import os

        self.parent, self.fail, self.hold = os.getpid(), fail, hold
        self.wait_s, self.hold_s = HOGWILD_WAIT_S, HOLD_S
        shared = lambda *shape, dtype=torch.int32: torch.zeros(*shape, dtype=dtype).share_memory_()
        self.ready, self.calls, self.met, self.done = (shared(processes) for _ in range(4))
        self.pids = shared(processes, dtype=torch.int64)
        self.seen = shared(processes, n)
        self.labels = shared(processes)          # 1: its own, 2: others'
        self.forked = shared(processes)
        self.complaint = shared(400, dtype=torch.uint8)
        self.stop_waiting, self.over = shared(1), shared(1)
        self.held = shared(1, dtype=torch.int64)
        self.joined = shared(64, dtype=torch.int64)
        self.travelled = False       # set in the copy a process unpickles; a forked process inherits this one

    def __getstate__(self):
        return dict(self.__dict__, travelled=True)

    def complained(self) -> str:
        return bytes(self.complaint.tolist()).rstrip(b"\0").decode(errors="replace")

    def _until(self, free, limit_s: float) -> bool:
        """Wait until ``free()``; False if the learner's function returned, the parent is gone or the time ran out."""
        import os
        import time

        deadline = time.monotonic() + limit_s
        while not free():
            if int(self.over[0]) or os.getppid() != self.parent or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def __call__(self, rank, model, x, y):
        import os
        import time

        if not isinstance(rank, int) or not 0 <= rank < len(self.calls):
            message = (f"a process called worker({', '.join(type(a).__name__ for a in (rank, model, x, y))}) with "
                       f"{str(rank)[:40]!r} first: the worker's arguments are (rank, model, x_r, y_r), the rank "
                       f"0 to {len(self.calls) - 1}").encode()[:len(self.complaint)]
            self.complaint[:len(message)] = torch.tensor(list(message), dtype=torch.uint8)
            raise ValueError(message.decode(errors="replace"))
        self.calls[rank] += 1
        self.pids[rank] = os.getpid()
        self.seen[rank, x[:, 0].long()] = 1
        self.labels[rank] = 1 if len(y) == len(x) and torch.equal(y, x[:, 0].long()) else 2
        self.forked[rank] = int(not self.travelled)
        if os.getpid() == self.parent:           # called in the check's own process: no one to wait for
            return
        self.ready[rank] = 1
        self.met[rank] = int(self._until(lambda: int(self.ready.sum()) == len(self.ready) or
                                         int(self.stop_waiting[0]), self.wait_s) and not int(self.stop_waiting[0]))
        with torch.no_grad():
            model.weight[rank] += 1.0
        time.sleep(0.2)
        if rank == self.fail:
            os._exit(3)                          # dies without a word, as a process killed for memory does
        me = os.getpid()
        self._until(lambda: int(self.held[0]) != me and (rank != self.hold or me in self.joined.tolist()), self.hold_s)
        self.done[rank] = 1


@contextmanager
def _watching(probe: _Probe):
    """While the learner's function runs, in this process: the processes it starts are counted, and each
    join tells the probe's processes what they wait for. A join before every process has started ends
    their wait for one another (they cannot all run at once); a join lets a process held until joined go;
    the first join with a short timeout holds its process alive past that timeout (``state["timed"]``: its
    pid), and the next join of that process lets it go. is_alive before every process has started ends the
    wait as a join does. Yields ``state``."""
    from multiprocessing.process import BaseProcess

    start, join, is_alive = BaseProcess.start, BaseProcess.join, BaseProcess.is_alive
    state = {"started": 0, "timed": None}

    def starting(self):
        state["started"] += 1
        return start(self)

    def asking(self):
        if state["started"] < len(probe.calls):      # waiting for one before all started
            probe.stop_waiting[0] = 1
        return is_alive(self)

    def joining(self, timeout=None):
        if state["started"] < len(probe.calls):
            probe.stop_waiting[0] = 1
        if self.pid is not None:
            slots = (probe.joined == 0).nonzero().flatten()
            if len(slots):
                probe.joined[slots[0]] = self.pid
            if int(probe.held[0]) == self.pid:
                probe.held[0] = -1
            elif timeout is not None and timeout <= TIMED_JOIN_S and state["timed"] is None and is_alive(self):
                state["timed"] = self.pid
                probe.held[0] = self.pid
        return join(self, timeout)

    BaseProcess.start, BaseProcess.join, BaseProcess.is_alive = starting, joining, asking
    try:
        yield state
    finally:
        BaseProcess.start, BaseProcess.join, BaseProcess.is_alive = start, join, is_alive


def _ranks_of(probe: _Probe, pids) -> list:
    return [r for r in range(len(probe.pids)) if int(probe.pids[r]) in pids]


def _end_children(probe: _Probe) -> None:
    """Let every process of the probe go, and wait for them to end (ending those that do not)."""
    import multiprocessing
    import time

    probe.over[0] = 1
    deadline = time.monotonic() + 60
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)


def _still_running_message(probe: _Probe, state: dict, alive: set, raised: bool) -> str | None:
    """The message for processes left running when the learner's function returned (or raised)."""
    if not alive:
        return None
    ranks = _ranks_of(probe, alive) or f"{len(alive)} of them"
    if state["timed"] in alive:
        return (f"8.4: process {_ranks_of(probe, {state['timed']}) or ''} was still running when your function "
                f"{'raised' if raised else 'returned'}: join(timeout=...) returns when the time runs out, ended or "
                f"not (the exit code is then None, neither success nor failure). Wait until every process has "
                f"ended (join() without a timeout, or join again while is_alive()) before reading exit codes")
    if raised:
        return (f"8.4: your function raised while process(es) {ranks} were still running: they are left behind, "
                f"orphaned, still training the model. Join every process first, then raise an error that names "
                f"the failed one(s)")
    return (f"8.4: your function returned while process(es) {ranks} were still running: wait for every process to "
            f"end (join) before returning, or the caller reads a model that is still changing")


def _hogwild_verdict(probe: _Probe, model: nn.Module, before: torch.Tensor, n: int) -> list:
    """Fails the check on a mistake of this run; returns the ranks of the processes that were forked (named
    after every other mistake of every run)."""
    import os

    processes = len(probe.calls)
    if int(probe.calls.sum()) and all(int(pid) in (0, os.getpid()) for pid in probe.pids):
        expect(False, "8.4: the worker ran in this process: start one process per shard (torch.multiprocessing, "
                      "spawn method) and let each call the worker; calling it here runs the shards one after another")
    ranks = probe.calls.tolist()
    shards = [set(torch.nonzero(probe.seen[r]).flatten().tolist()) for r in range(processes)]
    pieces = [len(piece) for piece in torch.arange(n).chunk(processes)]
    ran = sorted(len(shards[r]) for r in range(processes) if ranks[r])
    if len(pieces) < processes and sum(ranks) == len(pieces) and ran == sorted(pieces):
        expect(False, f"8.4: only {len(pieces)} processes ran, for processes = {processes}: chunk cuts {n} samples "
                      f"into pieces of ceil({n}/{processes}) = {pieces[0]}, which makes {len(pieces)} pieces, not "
                      f"{processes} (it gives fewer pieces than asked for some sizes). Split with "
                      f"utils.parallel_sgd.shard_indices, which always gives {processes} shards")
    expect(ranks == [1] * processes, f"8.4: the worker was called {sum(ranks)} time(s), with ranks "
                                     f"{[r for r in range(processes) for _ in range(ranks[r])]}: start {processes} "
                                     f"processes, process r calling worker(r, model, x_r, y_r) once, r = 0 to "
                                     f"{processes - 1}")
    changed = [r for r in range(processes) if torch.allclose(model.weight[r] - before[r], torch.ones_like(before[r]))]
    expect(len(changed) == processes,
           f"8.4: the model you were given shows the updates of process(es) {changed} only, of {processes}: each "
           f"process must train that model itself, in shared memory (nn.Module.share_memory), not a copy of it")
    mixed = [r for r in range(processes) if probe.labels[r] != 1]
    expect(not mixed, f"8.4: process(es) {mixed} got labels that are not those of their inputs (all of y, or "
                      f"another shard's): give process r x[s] and y[s] with the same shard s")
    if all(s == shards[0] for s in shards):
        expect(False, f"8.4: all {processes} processes got the same " + ("samples, all of them" if len(shards[0]) == n
               else f"{len(shards[0])} samples") + ": give each process its own shard of the data, a random "
               f"1/P of it (utils.parallel_sgd.shard_indices), as the workers of section 1 have")
    overlap = [(a, b) for a in range(processes) for b in range(a + 1, processes) if shards[a] & shards[b]]
    expect(not overlap, f"8.4: processes {overlap[0] if overlap else ''} share samples: the shards must not overlap")
    missing = set(range(n)) - set().union(*shards)
    expect(not missing, f"8.4: {len(missing)} of the {n} samples reached no process: the shards must cover the data")
    sizes = [len(s) for s in shards]
    blocks = [sorted(s) == list(range(min(s), max(s) + 1)) for s in shards if s]
    expect(not all(blocks), f"8.4: each process got a block of consecutive samples ({[f'{min(s)}-{max(s)}' for s in shards]}): "
                            f"a data set stored in some order (by class, by source) would give each process a "
                            f"different part of the problem; take a random 1/P with "
                            f"utils.parallel_sgd.shard_indices, as section 1 does")
    strided = all(len({i % processes for i in s}) == 1 for s in shards if s)
    expect(not strided, f"8.4: process r got every {processes}-th sample from sample r on (x[r::P]): a data set "
                        f"stored in some order (a pattern that repeats, classes in turn) would give each process a "
                        f"biased part of it; take a random 1/P with utils.parallel_sgd.shard_indices, as section 1 "
                        f"does")
    expect(max(sizes) - min(sizes) <= 1, f"8.4: the shards hold {sizes} samples: split the data into {processes} "
                                         f"nearly equal parts")
    expect(bool(probe.met.all()), "8.4: the processes did not all run at the same time: your function waited for "
                                  "(joined) a process before it had started them all, so they ran one after another. "
                                  "Start them all first, then wait for each: Hogwild's processes train together")
    return [r for r in range(processes) if probe.forked[r]]


def check_hogwild_train(hogwild_train) -> None:
    """Exercise 8.4: ``hogwild_train(model, x, y, processes, worker)`` puts the model in shared memory,
    starts one process per shard, process r running ``worker(r, model, x_r, y_r)``, waits for all of them
    and raises an error that names a failed one. Run with 5 processes on 12 samples (shards of 3, 3, 2, 2
    and 2; torch.chunk would give 4 pieces of 3), then with 3 processes where the middle one dies and the
    last one lives until it is joined (so reading only the first or the last exit code, or raising before
    joining them all, is seen)."""
    import copy
    import multiprocessing
    import re

    with exercise("8.4"):
        forked = []
        for processes, n, fail in ((5, 12, None), (3, 12, 1)):
            x, _ = _indexed_problem(n, 2, 3, 0)
            y = torch.arange(n)                               # the labels hold the samples' indices too
            model = nn.Linear(2, processes, bias=False).double()
            before = copy.deepcopy(model.weight.detach())
            probe = _Probe(processes, n, fail, hold=None if fail is None else processes - 1)
            error = None
            try:
                with _watching(probe) as state:
                    hogwild_train(model, x, y, processes, probe)
            except NotImplementedError:
                raise
            except Exception as raised:
                error = raised
            finally:
                alive = {child.pid for child in multiprocessing.active_children()}
                _end_children(probe)
            if error is not None:
                expect(not probe.complained(), f"8.4: {probe.complained()} (your function then raised "
                                               f"{type(error).__name__}: {error})")
                running = _still_running_message(probe, state, alive, raised=True)
                expect(running is None, f"{running} (your function raised {type(error).__name__}: {error})")
                if fail is None:
                    raise error
                named = {str(fail), str(int(probe.pids[fail])), "3"} & set(re.findall(r"\d+", str(error)))
                expect(bool(named), f"8.4: process {fail} died (exit code 3) and your function raised "
                                    f"{type(error).__name__}({str(error)!r}), which does not say which process: name "
                                    f"its rank and exit code, so that the reader knows where to look")
                continue                                      # a process died and the learner's code said so
            running = _still_running_message(probe, state, alive, raised=False)
            expect(running is None, running)
            if fail is not None:
                expect(False, f"8.4: process {fail} died (exit code 3) and your function returned as if all went "
                              f"well: after waiting for each process, look at its exit code and raise an error "
                              f"that names the process when it is not 0")
            forked = forked or _hogwild_verdict(probe, model, before, n)
        expect(not forked, f"8.4: process(es) {forked} were forked (multiprocessing's default start method on Linux "
                           f"before Python 3.14, or get_context('fork')): a forked child inherits the notebook's "
                           f"threads and locks, unsafe with torch's thread pools (Python itself starts with spawn on "
                           f"macOS); use torch.multiprocessing.get_context('spawn') and its Process")


# --- 8.5 Parle's two directions ---------------------------------------------------------------------


def check_parle_directions(parle_directions) -> None:
    """Exercise 8.5: the inner step's and the synchronisation's gradients of Parle, for one tensor."""
    with exercise("8.5"):
        generator = torch.Generator().manual_seed(11)
        grad, y, x, z, z_mean = (torch.randn(3, 4, generator=generator, dtype=torch.float64) for _ in range(5))
        for gamma, rho in ((0.03, 0.5), (0.0, 0.2), (0.7, 0.0)):
            got = parle_directions(grad.clone(), y.clone(), x.clone(), z.clone(), z_mean.clone(), gamma, rho)
            expect(isinstance(got, tuple) and len(got) == 2, f"8.5: return the pair (inner, sync), got {type(got).__name__}")
            inner, sync = got
            expect(all(isinstance(t, torch.Tensor) and t.dtype == grad.dtype and t.shape == grad.shape for t in got),
                   f"8.5: return two tensors of the inputs' dtype and shape ({grad.dtype}, {tuple(grad.shape)}), got "
                   + ", ".join(f"{t.dtype}, {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                               for t in got) + " (a conversion, or a reduction such as .sum(), changes them)")
            want_inner = grad + gamma * (y - x)
            want_sync = gamma * (x - z) + rho * (x - z_mean)
            if not torch.allclose(inner, want_inner):
                flipped = torch.allclose(inner, grad + gamma * (x - y))
                no_loss = torch.allclose(inner, gamma * (y - x))
                expect(False, f"8.5 (gamma {gamma}): the inner direction " + (
                    "pulls away from x: the gradient of gamma/2 |y - x|^2 with respect to y is gamma (y - x)."
                    if flipped else "leaves out the loss's gradient, grad: the inner steps follow the loss plus the "
                    "proximal term." if no_loss else
                    "should be grad + gamma (y - x): the loss's gradient plus the proximal term's."))
            if not torch.allclose(sync, want_sync):
                wrong = {
                    "pulls towards the replica's own average z twice: the elastic term pulls towards the mean over "
                    "the replicas, z_mean.": gamma * (x - z) + rho * (x - z),
                    "pushes x away from z_mean: the gradient of rho/2 |x - z_mean|^2 with respect to x is "
                    "rho (x - z_mean).": gamma * (x - z) + rho * (z_mean - x),
                    "pushes x away from z: the gradient of gamma/2 |x - z|^2 with respect to x is gamma (x - z).":
                        gamma * (z - x) + rho * (x - z_mean),
                    "swaps the strengths: gamma pulls towards the replica's own z, rho towards the mean z_mean.":
                        rho * (x - z) + gamma * (x - z_mean)}
                said = [message for message, value in wrong.items() if torch.allclose(sync, value)]
                expect(False, f"8.5 (gamma {gamma}, rho {rho}): the synchronisation direction "
                       + (said[0] if said else "should be gamma (x - z) + rho (x - z_mean)."))

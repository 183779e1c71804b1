"""Checks for labs/08_beyond_sync_sgd.ipynb.

8.1 runs the learner's weight average on the MPI engines, every rank at once, with a model whose
weights differ by rank (two dtypes, float buffers, a BatchNorm's integer step counter), on all ranks
and on a sub-communicator, and refuses mpi4py's pickle-based lower-case methods.

8.2 runs the learner's Hogwild worker twice: alone in this process against a reference with the
same random order (and torch's global random state left untouched), then in two spawned processes
on one model in shared memory, where each process's shard touches weights of its own and the model
records every forward pass. So the check sees that each process trained the shared model itself
(not a copy whose change is added later), that both processes' updates reached it, and that the
processes ran at the same time (no lock around the steps).
"""
from __future__ import annotations

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
1. optimizer = torch.optim.SGD(model.parameters(), lr=lr): this process's own optimizer on the shared weights.
2. g = torch.Generator().manual_seed(seed); for each epoch: order = torch.randperm(len(x), generator=g).
3. For each batch of indices in order.split(batch_size): zero_grad, cross_entropy(model(x[idx]), y[idx]),
   backward, step; count the updates. Return the count.""",
    "8.3": """Step by step:
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
                raise Wrong(f"rank {rank}: {name} holds the sum over the ranks, not the mean: divide by comm.Get_size()")
            ratio = (group.sum(0) / got.double()).flatten()
            divisor = ratio[0].item() if torch.isfinite(ratio).all() else float("nan")
            if abs(divisor - round(divisor)) < 1e-6 and torch.allclose(ratio, ratio[0]) and round(divisor) != len(members):
                raise Wrong(f"rank {rank}: {name} holds the sum divided by {round(divisor)}, {where}, whose size is "
                            f"{len(members)}: divide by comm.Get_size(), not by a number")
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


# --- 8.2 the Hogwild worker -------------------------------------------------------------------------


def _reference_worker(model, x, y, epochs, batch_size, lr, seed, reshuffle=True, shuffle=True):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=generator)
    updates = 0
    for epoch in range(epochs):
        if epoch and reshuffle:
            order = torch.randperm(len(x), generator=generator)
        for idx in (order if shuffle else torch.arange(len(x))).split(batch_size):
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
    """Exercise 8.2: ``hogwild_worker(model, x, y, epochs, batch_size, lr, seed)`` trains the model it is
    given, in place, on (x, y), with its own SGD and a new random order every epoch; returns its updates."""
    import cloudpickle

    from utils.hogwild import run_processes

    with exercise("8.2"):
        (x, y), = _block_problem(1, per_block=10)
        settings = dict(epochs=3, batch_size=4, lr=0.1, seed=5)
        torch.manual_seed(0)
        start = nn.Linear(4, 3, bias=False).double()
        models = {kind: nn.Linear(4, 3, bias=False).double() for kind in ("yours", "right", "once", "unshuffled")}
        for model in models.values():
            model.load_state_dict(start.state_dict())
        rng_before = torch.random.get_rng_state()
        updates = hogwild_worker(models["yours"], x, y, **settings)
        expect(torch.equal(rng_before, torch.random.get_rng_state()),
               "8.2: your worker changed torch's global random state (torch.manual_seed, or a draw without "
               "generator=...). Each process takes its order from a torch.Generator of its own, seeded with seed: "
               "the global one also drives dropout and initialisation, which the worker must leave alone.")
        want = _reference_worker(models["right"], x, y, **settings)
        _reference_worker(models["once"], x, y, **settings, reshuffle=False)
        _reference_worker(models["unshuffled"], x, y, **settings, shuffle=False)
        yours = models["yours"].weight.detach()
        expect(not torch.equal(yours, start.weight), "8.2: the model you were given did not change: train it in "
                                                     "place (a copy of it never reaches the shared memory).")
        for kind, message in (("unshuffled", "you walked the samples in their order: shuffle with "
                                             "torch.randperm(len(x), generator=g) every epoch"),
                              ("once", "you shuffled once and reused that order: draw a new permutation every "
                                       "epoch from the same generator")):
            expect(not torch.allclose(yours, models[kind].weight.detach(), rtol=0, atol=1e-12), f"8.2: {message}.")
        expect(torch.allclose(yours, models["right"].weight.detach(), rtol=0, atol=1e-12),
               f"8.2: after {settings['epochs']} epochs the weights differ from plain SGD (lr {settings['lr']}, batches "
               f"of {settings['batch_size']} in the order of torch.randperm(len(x), generator="
               f"torch.Generator().manual_seed(seed)), a new permutation each epoch) by up to "
               f"{(yours - models['right'].weight.detach()).abs().max().item():.3g}.")
        expect(updates == want, f"8.2: return the number of updates this process made: {want}, not {updates!r}.")

        shards = _block_problem(2)
        shared = _Watcher().share_memory()
        payload = cloudpickle.dumps(hogwild_worker)
        counts = run_processes(_by_value, [(payload, shared, sx, sy, 3, 2, 0.1, r) for r, (sx, sy) in enumerate(shards)],
                               timeout=120)
        weight, ran = shared.weight.detach(), shared.count.tolist()
        expect(min(ran) > 0, f"8.2: in two processes sharing one model, process(es) {[r for r in (0, 1) if not ran[r]]} "
                             f"never ran the model they were given: each process must train the shared model itself, "
                             f"not a copy (a copy's changes, added at the end or not, are not Hogwild).")
        moved = [bool(weight[:, 4 * r:4 * (r + 1)].abs().sum() > 0) for r in range(2)]
        expect(all(moved), f"8.2: in two processes sharing one model, the weights that only process(es) "
                           f"{[r for r, m in enumerate(moved) if not m]} update did not change: each process must "
                           f"update the shared model it is given, not a copy.")
        expect(counts == [18, 18], f"8.2: in two processes each should make 18 updates (3 epochs of 12 samples in "
                                   f"batches of 2); they reported {counts}.")
        expect(int(shared.met.sum()) > 0,
               "8.2: the two processes never ran a forward pass at the same time: they took turns, as with a lock "
               "around each step. Hogwild takes no lock: each process reads and writes the shared weights whenever "
               "it is ready.")


# --- 8.3 Parle's two directions ---------------------------------------------------------------------


def check_parle_directions(parle_directions) -> None:
    """Exercise 8.3: the inner step's and the synchronisation's gradients of Parle, for one tensor."""
    with exercise("8.3"):
        generator = torch.Generator().manual_seed(11)
        grad, y, x, z, z_mean = (torch.randn(3, 4, generator=generator, dtype=torch.float64) for _ in range(5))
        for gamma, rho in ((0.03, 0.5), (0.0, 0.2), (0.7, 0.0)):
            got = parle_directions(grad.clone(), y.clone(), x.clone(), z.clone(), z_mean.clone(), gamma, rho)
            expect(isinstance(got, tuple) and len(got) == 2, f"8.3: return the pair (inner, sync), got {type(got).__name__}")
            inner, sync = got
            want_inner = grad + gamma * (y - x)
            want_sync = gamma * (x - z) + rho * (x - z_mean)
            if not torch.allclose(inner, want_inner):
                flipped = torch.allclose(inner, grad + gamma * (x - y))
                expect(False, f"8.3 (gamma {gamma}): the inner direction " + (
                    "pulls away from x: the gradient of gamma/2 |y - x|^2 with respect to y is gamma (y - x)."
                    if flipped else "should be grad + gamma (y - x): the loss's gradient plus the proximal term's."))
            if not torch.allclose(sync, want_sync):
                own = torch.allclose(sync, gamma * (x - z) + rho * (x - z))
                expect(False, f"8.3 (gamma {gamma}, rho {rho}): the synchronisation direction " + (
                    "pulls towards the replica's own average z twice: the elastic term pulls towards the mean "
                    "over the replicas, z_mean." if own else "should be gamma (x - z) + rho (x - z_mean)."))

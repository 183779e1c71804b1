"""The checks of lab 08: right answers pass, the typical wrong ones fail with their own message.

8.1 and 8.2 run on a cluster of 3 MPI engines (mpiexec from the mpich wheel): a divisor written as 2, or a
sum over MPI.COMM_WORLD instead of the communicator given, would pass on 2 ranks of COMM_WORLD alone. The functions
sent there are @interactive: ipyparallel sends them by value, as it does functions of a notebook.
"""
from __future__ import annotations

import copy
import types

import pytest
import torch
from ipyparallel import interactive

from check_helpers import fails
from utils import cluster
from utils.checks import Incorrect, NotSolved, lab08

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


# --- 8.1 the weight average -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mpi_workers():
    started = cluster.start(3, engines="mpi", backend="gloo", activate=False)
    yield started
    cluster.stop()


@interactive
def right_average(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= comm.Get_size()


@interactive
def summed(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            comm.Allreduce(MPI.IN_PLACE, tensor.detach().numpy(), op=MPI.SUM)


@interactive
def divided_by_two(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= 2


@interactive
def over_comm_world(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= MPI.COMM_WORLD.Get_size()


@interactive
def integers_too(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        values = tensor.detach().numpy()
        comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        if tensor.is_floating_point():
            values /= comm.Get_size()
        else:
            values //= comm.Get_size()


@interactive
def pickled(model, comm):
    import torch as t
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            total = comm.allreduce(tensor.detach().numpy(), op=MPI.SUM)
            with t.no_grad():
                tensor.copy_(t.from_numpy(total / comm.Get_size()))


@interactive
def reduced_to_root(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            if comm.Get_rank() == 0:
                comm.Reduce(MPI.IN_PLACE, values, op=MPI.SUM, root=0)
                values /= comm.Get_size()
            else:
                comm.Reduce(values, None, op=MPI.SUM, root=0)


@interactive
def parameters_only(model, comm):
    from mpi4py import MPI
    for tensor in model.parameters():
        values = tensor.detach().numpy()
        comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        values /= comm.Get_size()


@interactive
def into_a_copy(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy().copy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= comm.Get_size()


@interactive
def float32_only(model, comm):
    import torch as t
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.dtype == t.float32:
            values = tensor.detach().numpy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= comm.Get_size()


@interactive
def divided_into_a_new_array(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values = values / comm.Get_size()


@interactive
def divided_by_world_size(model, comm):
    from mpi4py import MPI
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.is_floating_point():
            values = tensor.detach().numpy()
            comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
            values /= MPI.COMM_WORLD.Get_size()


@interactive
def stub_average(model, comm):
    raise NotImplementedError("Hint: x")


def test_average_right_passes(mpi_workers):
    lab08.check_average(mpi_workers, right_average)


@pytest.mark.parametrize("wrong, message", [
    (summed, "holds the sum over the ranks, not the mean"),
    (divided_by_two, "holds the sum divided by 2"),
    (over_comm_world, "holds the mean over all 3 ranks of MPI.COMM_WORLD"),
    (integers_too, "num_batches_tracked (an integer buffer"),
    (pickled, "you called comm.allreduce, mpi4py's lower-case method"),
    (reduced_to_root, "rank 1: scale is unchanged"),
    (parameters_only, "running is unchanged"),
    (into_a_copy, "rank 0: scale is unchanged ("),
    (float32_only, "you picked the tensors by their dtype"),     # found in review: it was told of copies and Reduce
    (divided_into_a_new_array, "in place (values /= size; values = values / size makes a new array"),
    (divided_by_world_size, "divided by MPI.COMM_WORLD's size, 3: divide by the size of the communicator"),
], ids=["sum", "divisor 2", "COMM_WORLD", "integer buffer", "pickled allreduce", "Reduce", "no buffers", "a copy",
        "float32 only", "a new array", "world's size"])
def test_average_mistakes(mpi_workers, wrong, message):
    assert message in fails(lambda fn: lab08.check_average(mpi_workers, fn), wrong, Incorrect)


def test_average_stub(mpi_workers):
    assert "Hint: x" in fails(lambda fn: lab08.check_average(mpi_workers, fn), stub_average, NotSolved)


# --- 8.2 the PSGD loop --------------------------------------------------------------------------------

@interactive
def psgd_variant(model, x, y, comm, average, steps, batch_size, lr, sync_every, seed, mistake=None):
    import torch as t
    from mpi4py import MPI

    from utils import parallel_sgd as ps
    rank, size = comm.Get_rank(), comm.Get_size()
    if mistake == "world rank":                            # the world's, not the communicator's
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if mistake == "dist rank":
        import torch.distributed as d
        rank, size = d.get_rank(), d.get_world_size()
    if mistake == "engine rank":                           # the names utils.cluster sets on each engine
        rank, size = globals()["rank"], globals()["world_size"]
    if mistake == "fails on rank 1" and MPI.COMM_WORLD.Get_rank() == 1:
        raise ValueError("only on rank 1")
    own_seed = {"seed per rank": seed + rank, "seed left out": 0}.get(mistake, seed)
    batches = ps.worker_batches(len(x), 0 if mistake == "same shard" else rank, size, batch_size, own_seed,
                                shard=mistake != "all data")
    optimizer = t.optim.SGD(model.parameters(), lr=lr * size if mistake == "lr x size" else lr)
    first = 0 if mistake == "off by one" else 1             # a loop over range(steps), tested with step % K
    for step in range(first, steps + first):
        if mistake == "two batches a step":                # x[next(batches)], y[next(batches)]
            xb, yb = x[next(batches)], y[next(batches)]
        else:
            idx = next(batches)
            xb, yb = x[idx], y[idx]
        optimizer.zero_grad()
        t.nn.functional.cross_entropy(model(xb), yb, reduction="sum" if mistake == "summed loss" else "mean").backward()
        if mistake == "K = 1 as gradients" and sync_every == 1:   # "K = 1 is synchronous SGD": no average called
            for q in model.parameters():
                comm.Allreduce(MPI.IN_PLACE, q.grad.numpy(), op=MPI.SUM)
                q.grad /= size
            optimizer.step()
            continue
        due = {"K ignored": True, "not after the last": step % sync_every == 0,
               "again after the loop": step % sync_every == 0}.get(mistake, step % sync_every == 0 or step == steps)
        if mistake == "no one-shot":                       # "one-shot means no communication"
            due = due and sync_every < steps
        if mistake == "gradients":                         # synchronous SGD's all-reduce, every K steps
            if due:
                for q in model.parameters():
                    comm.Allreduce(MPI.IN_PLACE, q.grad.numpy(), op=MPI.SUM)
                    q.grad /= size
            optimizer.step()
            continue
        optimizer.step()
        if mistake == "barrier every step":
            comm.Barrier()
        if mistake == "Ibarrier every step":
            comm.Ibarrier().Wait()
        if mistake == "world barrier":
            MPI.COMM_WORLD.Barrier()
        if mistake == "dist barrier":
            import torch.distributed as d
            d.barrier()
        if mistake == "loss all-reduced":                  # a mean loss for a progress line
            comm.Allreduce(MPI.IN_PLACE, t.ones(1).numpy(), op=MPI.SUM)
        if due:
            average(model, comm)
    if mistake == "again after the loop":                  # twice after the last step when K divides the steps
        average(model, comm)


def psgd_with(mistake):
    """psgd_variant with its mistake set: a plain function, which ipyparallel sends by value."""
    return interactive(types.FunctionType(psgd_variant.__code__, psgd_variant.__globals__, "psgd", (mistake,)))


@interactive
def stub_psgd(model, x, y, comm, average, steps, batch_size, lr, sync_every, seed):
    raise NotImplementedError("Hint: y")


def test_psgd_right_passes(mpi_workers):
    lab08.check_psgd(mpi_workers, psgd_variant)


@pytest.mark.parametrize("mistake, message", [
    ("off by one", "off by one"),
    ("K ignored", "you averaged after every step, but sync_every = 3"),
    ("not after the last", "but not after the last one, step 7"),
    ("no one-shot", "never called average(model, comm) (every 5 steps (one-shot"),
    ("gradients", "called comm.Allreduce on the gradients"),
    ("all data", "belong to other workers' shards"),
    ("same shard", "you and worker(s) [1, 2] trained on the same samples"),
    ("lr x size", "SGD with learning rate 0.111 (lr x size), but the caller asked for lr = 0.037"),
    # found by an outside review: each passed, or failed with a message that named another mistake
    ("summed loss", "the loss summed over the batch"),       # at batch 3 on 3 ranks it read as "lr x size"
    ("seed per rank", "worker 1's shard comes from the seed 5 (the seed plus its rank)"),
    ("seed left out", "the one of seed 0: pass the seed you were given (seed = 4)"),
    ("two batches a step", "step 2 took samples"),           # the message named step 1, whose samples were right
    ("again after the loop", "you averaged more than once after step(s) [3]"),   # it said "off by one"
    ("K = 1 as gradients", "called comm.Allreduce on the gradients"),            # sync_every = 1 was never run
    # found by testers: each passed (the communication was not counted) or named another mistake
    ("barrier every step", "your loop called comm.Barrier 7 time(s) in 7 steps: parallel SGD"),
    ("Ibarrier every step", "your loop called comm.Ibarrier 7 time(s)"),
    ("world barrier", "your loop called MPI.COMM_WORLD.Barrier 7 time(s)"),
    ("dist barrier", "your loop called torch.distributed.barrier 7 time(s)"),
    ("loss all-reduced", "your loop called comm.Allreduce 7 time(s) in 7 steps itself"),
    ("world rank", "took this worker's rank and size from MPI.COMM_WORLD"),
    ("dist rank", "took this worker's rank and size from torch.distributed"),
    ("engine rank", "took this worker's rank and size from the world"),
])
def test_psgd_mistakes(mpi_workers, mistake, message):
    assert message in fails(lambda fn: lab08.check_psgd(mpi_workers, fn), psgd_with(mistake), Incorrect)


def test_psgd_that_fails_on_one_rank_does_not_hang_the_others(mpi_workers):
    # MPI's blocking collectives would wait forever for rank 1; the check's averages give up after 10 s
    message = fails(lambda fn: lab08.check_psgd(mpi_workers, fn), psgd_with("fails on rank 1"), Incorrect)
    assert "on rank 1" in message and "ValueError: only on rank 1" in message
    lab08.check_psgd(mpi_workers, psgd_variant)            # and the engines still work


def test_psgd_stub(mpi_workers):
    assert "Hint: y" in fails(lambda fn: lab08.check_psgd(mpi_workers, fn), stub_psgd, NotSolved)


# --- 8.3 the Hogwild worker --------------------------------------------------------------------------

def worker(copy_model=False, reshuffle=True, shuffle=True, count=True, add_at_end=False, lock=None, global_seed=False,
           drop_last=False):
    def hogwild_worker(model, x, y, epochs, batch_size, lr, seed):
        import copy as copying

        import torch as t
        shared = model
        if copy_model or add_at_end:
            model = copying.deepcopy(model)
        start = [p.detach().clone() for p in model.parameters()]
        optimizer = t.optim.SGD(model.parameters(), lr=lr)
        if global_seed:
            t.manual_seed(seed)
            draw = lambda: t.randperm(len(x))
        else:
            generator = t.Generator().manual_seed(seed)
            draw = lambda: t.randperm(len(x), generator=generator)
        order, updates = draw(), 0
        for epoch in range(epochs):
            if epoch and reshuffle:
                order = draw()
            for idx in (order if shuffle else t.arange(len(x))).split(batch_size):
                if drop_last and len(idx) < batch_size:
                    continue
                if lock:
                    import fcntl
                    handle = open(lock, "w")
                    fcntl.flock(handle, fcntl.LOCK_EX)
                optimizer.zero_grad()
                t.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                optimizer.step()
                if lock:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                    handle.close()
                updates += 1
        if add_at_end:               # a private copy's change, added to the shared model at the end
            with t.no_grad():
                for p, q, p0 in zip(shared.parameters(), model.parameters(), start):
                    p.add_(q - p0)
        return updates if count else None
    return hogwild_worker


def test_hogwild_worker_right_passes():
    lab08.check_hogwild_worker(worker())


@pytest.mark.parametrize("wrong, message", [
    (worker(copy_model=True), "did not change: train it in place"),
    (worker(shuffle=False), "you walked the samples in their order"),
    (worker(reshuffle=False), "you shuffled once and reused that order"),
    (worker(count=False), "return the number of updates"),
    (worker(global_seed=True), "changed torch's global random state"),
    (worker(add_at_end=True), "never ran the model they were given"),
    (worker(drop_last=True), "you left out each epoch's last, smaller batch"),
], ids=["a copy", "no shuffle", "shuffled once", "no count", "global seed", "copy added at the end", "full batches"])
def test_hogwild_worker_mistakes(wrong, message):
    assert message in fails(lab08.check_hogwild_worker, wrong, Incorrect)


def test_hogwild_worker_that_locks_every_step_fails(tmp_path):
    locked = worker(lock=str(tmp_path / "one-lock"))
    assert "never ran a forward pass at the same time" in fails(lab08.check_hogwild_worker, locked, Incorrect)


# --- 8.4 the Hogwild processes --------------------------------------------------------------------------

def hogwild_train_with(mistake=None, start="spawn"):
    """``start``: the start method of the processes; the mistakes found in review run forked, which takes
    well under a second where spawning three processes (each importing torch) takes several; the check
    names the fork last, after every other mistake."""
    def hogwild_train(model, x, y, processes, worker):
        import copy as copying

        import torch.multiprocessing as multiprocessing

        from utils import parallel_sgd
        if mistake != "fork, not shared":
            model.share_memory()
        if mistake == "two processes":                     # written for a 2-core laptop
            processes = 2
        if mistake == "all data":                          # torch's spawn helper: process i calls worker(i, ...)
            multiprocessing.spawn(worker, args=(model, x, y), nprocs=processes)
            return
        shards = parallel_sgd.shard_indices(len(x), processes)
        if mistake == "consecutive blocks":
            shards = list(torch.arange(len(x)).tensor_split(processes))
        if mistake == "strided":                           # x[r::P]
            shards = [torch.arange(r, len(x), processes) for r in range(processes)]
        if mistake == "chunk":                             # 12 samples into 5: 4 pieces of 3
            shards = list(torch.randperm(len(x)).chunk(processes))
        if mistake == "same shard":
            shards = [shards[0]] * processes
        if mistake == "in this process":
            for rank, s in enumerate(shards):
                worker(rank, model, x[s], y[s])
            return
        context = multiprocessing.get_context("fork" if mistake == "fork, not shared" else start)

        def args(rank, s):
            if mistake == "arguments in another order":
                return model, rank, x[s], y[s]
            return (rank, copying.deepcopy(model) if mistake == "copies" else model, x[s],
                    y if mistake == "all the labels" else y[s])
        running = [context.Process(target=worker, args=args(rank, s)) for rank, s in enumerate(shards)]
        for process in running:
            process.start()
            if mistake == "one after another":
                process.join()
        if mistake == "not joined":
            return
        if mistake in ("timed join", "timed join, None failed"):
            for process in running:
                process.join(timeout=2)
            failed = [rank for rank, process in enumerate(running)
                      if (process.exitcode if mistake == "timed join" else process.exitcode != 0)]
            if failed:
                raise RuntimeError(f"process(es) {failed} failed")
            return
        if mistake == "raise at the first failure":
            for rank, process in enumerate(running):
                process.join()
                if process.exitcode != 0:
                    raise RuntimeError(f"process {rank} failed with exit code {process.exitcode}")
            return
        if mistake == "polling join":                      # right: join again while it runs
            for process in running:
                while process.is_alive():
                    process.join(timeout=0.5)
        for process in running:
            process.join()
        if mistake == "last exit code only":               # the loop's variable after the loop: the last process
            if process.exitcode != 0:
                raise RuntimeError(f"a process failed with exit code {process.exitcode}")
            return
        failed = [rank for rank, process in enumerate(running) if process.exitcode != 0]
        if failed and mistake == "error names no process":
            raise RuntimeError("Hogwild failed")
        if failed and mistake != "failure ignored":
            raise RuntimeError(f"process(es) {failed} failed")
    return hogwild_train


def test_hogwild_train_right_passes():
    lab08.check_hogwild_train(hogwild_train_with())


@pytest.mark.parametrize("mistake, start, message", [
    # start: the mistakes that do not depend on the start method run forked (well under a second; spawning
    # three processes that each import torch takes several); the check names a fork after all else
    ("copies", "fork", "shows the updates of process(es) [] only, of 5"),
    ("fork, not shared", "fork", "shows the updates of process(es) [] only, of 5"),   # each child a private copy
    ("not joined", "fork", "your function returned while process(es)"),
    ("failure ignored", "fork", "process 1 died (exit code 3) and your function returned as if all went well"),
    ("same shard", "fork", "all 5 processes got the same 3 samples"),
    ("all data", "spawn", "all 5 processes got the same samples, all of them"),
    ("in this process", "spawn", "the worker ran in this process"),
])
def test_hogwild_train_mistakes(mistake, start, message):
    assert message in fails(lab08.check_hogwild_train, hogwild_train_with(mistake, start), Incorrect)


@pytest.mark.parametrize("mistake, message", [
    # found by an outside review, each passed: the check ran 2 processes, the second one dying
    ("last exit code only", "process 1 died (exit code 3) and your function returned as if all went well"),
    ("all the labels", "process(es) [0, 1, 2, 3, 4] got labels that are not those of their inputs"),
    ("consecutive blocks", "each process got a block of consecutive samples"),
    ("error names no process", "which does not say which process"),
    (None, "process(es) [0, 1, 2, 3, 4] were forked"),             # share_memory() right, but the default start method
    # failed with the learner's own error only, the process's error being on its stderr
    ("arguments in another order", "a process called worker(Linear, int, Tensor, Tensor)"),
    # found by testers, each passed: a join that timed out read as success, shards that are not random or run
    # short at 5 processes (12 samples: chunk gives 4 pieces), a raise that leaves the other processes running
    ("timed join", "was still running when your function returned: join(timeout=...) returns"),
    ("timed join, None failed", "was still running when your function raised: join(timeout=...) returns"),
    ("strided", "process r got every 5-th sample from sample r on (x[r::P])"),
    ("chunk", "only 4 processes ran, for processes = 5: chunk cuts 12 samples into pieces of ceil(12/5) = 3"),
    ("raise at the first failure", "your function raised while process(es) [2] were still running"),
])
def test_hogwild_train_mistakes_found_in_review(mistake, message):
    assert message in fails(lab08.check_hogwild_train, hogwild_train_with(mistake, start="fork"), Incorrect)


def test_hogwild_train_for_two_processes_only_fails():
    # the processes stop waiting for the missing ones when the function joins one: no wait for a timeout
    message = fails(lab08.check_hogwild_train, hogwild_train_with("two processes", start="fork"), Incorrect)
    assert "called 2 time(s), with ranks [0, 1]: start 5 processes" in message


def test_hogwild_train_one_process_after_another_fails():
    message = fails(lab08.check_hogwild_train, hogwild_train_with("one after another", start="fork"), Incorrect)
    assert "they ran one after another" in message


def test_hogwild_train_that_joins_again_while_alive_passes():
    # forked, to be quick: the fork is named after every other mistake, so nothing else was found
    message = fails(lab08.check_hogwild_train, hogwild_train_with("polling join", start="fork"), Incorrect)
    assert "were forked" in message


def test_hogwild_train_stub():
    assert "Hint: z" in fails(lab08.check_hogwild_train, lambda *args: stub_hint("z"), NotSolved)


def stub_hint(text):
    raise NotImplementedError(f"Hint: {text}")


# --- 8.5 Parle's directions ---------------------------------------------------------------------------

def test_parle_directions_right_passes():
    lab08.check_parle_directions(lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), gamma * (x - z) + rho * (x - zm)))


@pytest.mark.parametrize("wrong, message", [
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (x - y), gamma * (x - z) + rho * (x - zm)), "pulls away from x"),
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), gamma * (x - z) + rho * (x - z)), "own average z twice"),
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), (x - z) + rho * (x - zm)), "should be gamma (x - z)"),
    (lambda g, y, x, z, zm, gamma, rho: g + gamma * (y - x), "return the pair"),
    (lambda g, y, x, z, zm, gamma, rho: ((g + gamma * (y - x)).float(), (gamma * (x - z) + rho * (x - zm)).float()),
     "return two tensors of the inputs' dtype and shape (torch.float64, (3, 4)), got torch.float32"),   # found in review
    (lambda g, y, x, z, zm, gamma, rho: (gamma * (y - x), gamma * (x - z) + rho * (x - zm)), "leaves out the loss's"),
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), gamma * (x - z) + rho * (zm - x)), "away from z_mean"),
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), gamma * (z - x) + rho * (x - zm)), "away from z:"),
    (lambda g, y, x, z, zm, gamma, rho: (g + gamma * (y - x), rho * (x - z) + gamma * (x - zm)), "swaps the strengths"),
], ids=["proximal sign", "elastic to own z", "no gamma at sync", "one direction", "float32", "no loss gradient",
        "elastic sign", "own z sign", "strengths swapped"])
def test_parle_directions_mistakes(wrong, message):
    assert message in fails(lab08.check_parle_directions, wrong, Incorrect)


def test_step_by_step_hints():
    assert sorted(lab08.HINTS) == ["8.1", "8.2", "8.3", "8.4", "8.5"]
    with pytest.raises(ValueError, match="there is one for"):
        lab08.hint("8.6")

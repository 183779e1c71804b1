"""Parameter averaging: one-shot (SimuParallelSGD) and periodic (local SGD). Taught in lab 08.

Each of P workers runs plain SGD on its own random 1/P of the training set and, every K steps,
replaces its weights by the average of all workers' weights:

    K = 1       equals synchronous SGD with averaged gradients (for plain SGD: the average of
                w - lr * g_r over the ranks is w - lr * mean(g_r)); one collective per step.
    K = steps   one-shot averaging, Zinkevich et al. 2010, "Parallelized stochastic gradient
                descent" (SimuParallelSGD): no communication until the end.
    in between  local SGD: Stich 2018, "Local SGD converges fast and communicates little";
                Lin et al. 2018, "Don't use large mini-batches, use local SGD".

On MPI engines (``cluster.start(P, engines="mpi")``), as seed 003 asks:

    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    history = parallel_sgd.local_sgd(model, x, y, steps=600, batch_size=32, lr=0.05, sync_every=50,
                                     average=lambda m: parallel_sgd.average_parameters(m, comm),
                                     rank=comm.Get_rank(), world_size=comm.Get_size())

and the same algorithm with torch.distributed where MPI is missing:
``average=lambda m: parallel_sgd.average_parameters_torch(m, group)``. Every rank must start from
the same weights (build the model under the same ``torch.manual_seed``). The averaging functions
are collectives: every rank of the communicator or group calls them, in the same order.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .train import evaluate, train_step


def _averaged_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter and floating-point buffer. Integer buffers (BatchNorm's
    num_batches_tracked) count steps, which are the same on every rank: nothing to average."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return [(name, t) for name, t in named if t.is_floating_point()]


def average_parameters(model: nn.Module, comm) -> None:
    """Replace every parameter and floating-point buffer of ``model`` by its mean over the MPI
    communicator ``comm`` (mpi4py), in place: one ``comm.Allreduce`` per tensor, as seed 003 asks.

    The tensor's numpy view shares its memory, so MPI sums straight into the model's weights
    (``MPI.IN_PLACE``: no copy) and the division by the communicator's size follows in place.
    CPU tensors of float32 or float64 only (numpy has no bfloat16, and MPI's float16 support
    varies); on a GPU use ``average_parameters_torch``.
    """
    tensors = _averaged_tensors(model)
    for name, tensor in tensors:   # every check before any communication: no half-averaged model
        if tensor.device.type != "cpu":
            raise ValueError(f"average_parameters averages numpy views of CPU tensors, but {name!r} is on "
                             f"{tensor.device}; move the model to the CPU or use average_parameters_torch")
        if tensor.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name!r} is {tensor.dtype}; average_parameters handles float32 and float64 "
                             f"(convert with model.float() or model.double())")
        if not tensor.is_contiguous():
            raise ValueError(f"{name!r} is not contiguous, so its numpy view is not one buffer MPI can reduce "
                             f"into; make it contiguous (tensor.data = tensor.data.contiguous())")
    from mpi4py import MPI  # imported here: the rest of the course runs without MPI

    size = comm.Get_size()
    for _, tensor in tensors:
        values = tensor.detach().numpy()          # shares memory with the model's tensor
        comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        values /= size


def all_reduce_mean(tensors: list[torch.Tensor], group=None) -> None:
    """Replace each tensor by its mean over the ranks of ``group`` (torch.distributed), in place.

    The tensors of one dtype travel flattened in one ``all_reduce``: one collective's latency
    instead of one per tensor, which matters when averaging after every step.
    """
    size = dist.get_world_size(group)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in same])
        dist.all_reduce(flat, group=group)
        flat /= size
        start = 0
        with torch.no_grad():
            for t in same:
                t.copy_(flat[start:start + t.numel()].view_as(t))
                start += t.numel()


def average_parameters_torch(model: nn.Module, group=None) -> None:
    """``average_parameters`` with torch.distributed: every parameter and floating-point buffer
    of ``model`` replaced by its mean over ``group`` (default: all ranks). Works with gloo and nccl."""
    all_reduce_mean([t for _, t in _averaged_tensors(model)], group)


def shard_indices(n: int, parts: int, seed: int = 0) -> list[torch.Tensor]:
    """A random partition of ``range(n)`` into ``parts`` disjoint shards of nearly equal size.

    The same ``seed`` gives the same partition on every worker, so worker r takes shard r and
    no sample is seen by two workers (Zinkevich et al.'s "random 1/P of the data").
    """
    if not isinstance(parts, int) or parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} samples into {parts!r} shards; use between 1 and {n} workers")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return list(order.tensor_split(parts))


def worker_batches(n: int, rank: int, world_size: int, batch_size: int, seed: int = 0, shard: bool = True):
    """Endless mini-batch indices of worker ``rank``: a fresh shuffle of its shard each epoch,
    full batches only (every worker's batch has ``batch_size`` samples, so the mean of the
    workers' mean losses is the global batch's mean loss). ``shard=False``: all n samples,
    each worker in its own order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be between 0 and world_size - 1 = {world_size - 1}, got {rank}")
    mine = shard_indices(n, world_size, seed)[rank] if shard else torch.arange(n)
    if not 1 <= batch_size <= len(mine):
        raise ValueError(f"batch_size {batch_size} does not fit worker {rank}'s {len(mine)} samples "
                         f"({n} samples over {world_size} workers); use a batch size between 1 and {len(mine)}")
    generator = torch.Generator().manual_seed(seed * 65537 + rank + 1)   # each worker its own order
    while True:
        order = mine[torch.randperm(len(mine), generator=generator)]
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def warmup_lr(step: int, lr: float, peak_lr: float, warmup_steps: int) -> float:
    """The learning rate of step ``step`` (counted from 1) under Goyal et al.'s (2017) gradual warm-up:
    ``lr`` at step 1, rising linearly to ``peak_lr`` at step ``warmup_steps + 1``, then ``peak_lr``.
    ``warmup_steps=0``: ``peak_lr`` from the first step. Lab 08 ramps synchronous SGD (K = 1) from the
    one-worker rate to sqrt(P) times it (P times it ended at chance on some seeds from P = 4 on)."""
    if warmup_steps < 0 or step < 1:
        raise ValueError(f"need step >= 1 and warmup_steps >= 0, got step {step} and warmup_steps {warmup_steps}")
    if warmup_steps == 0:
        return peak_lr
    return lr + (peak_lr - lr) * min(1.0, (step - 1) / warmup_steps)


@dataclass
class LocalSGDHistory:
    """What one worker saw. ``losses[i]``: its mini-batch loss at step i + 1; ``test_accuracy[j]``
    of the average of the workers' current weights after step ``eval_steps[j]``, after
    ``eval_seconds[j]`` of training; times in seconds, ``wall_time`` without the evaluations
    (``eval_time``, which includes the averages taken for measurement only), so that speed-ups and
    times to a target accuracy compare training alone."""
    losses: list = field(default_factory=list)
    eval_steps: list = field(default_factory=list)
    eval_seconds: list = field(default_factory=list)
    test_loss: list = field(default_factory=list)
    test_accuracy: list = field(default_factory=list)
    wall_time: float = 0.0
    averaging_time: float = 0.0
    eval_time: float = 0.0
    n_averages: int = 0


def local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int, lr: float,
              sync_every: int, average, rank: int = 0, world_size: int = 1, seed: int = 0, shard: bool = True,
              momentum: float = 0.0, x_test=None, y_test=None, eval_every: int = 1, peak_lr: float | None = None,
              warmup_steps: int = 0) -> LocalSGDHistory:
    """Train ``model`` in place by local SGD on this worker; returns its ``LocalSGDHistory``.

    Runs ``steps`` SGD steps of ``batch_size`` samples of its shard of ``(x, y)`` (see
    ``worker_batches``) and calls ``average(model)`` after every ``sync_every``-th step and after
    the last one, so every worker ends with the same averaged model: ``sync_every=1`` is
    synchronous SGD, ``sync_every=steps`` one-shot averaging. ``average`` is the collective, e.g.
    ``lambda m: average_parameters(m, comm)``; ``lambda m: None`` trains this worker alone.
    ``peak_lr`` with ``warmup_steps``: the rate rises linearly from ``lr`` to ``peak_lr`` over the
    first ``warmup_steps`` steps (``warmup_lr``); without ``peak_lr`` it stays ``lr``.

    With test data, every ``eval_every`` steps (and after the last) the *average of the workers'
    current weights* is evaluated: the model itself right after an average, otherwise a copy
    averaged for measurement only (one extra collective, every rank takes part; the workers keep
    their own weights). So one-shot averaging is measured during training as the others are, and
    the evaluation time (the measurement's average included) is not training time. Momentum
    buffers stay local, as in Lin et al.
    """
    for name, value in (("steps", steps), ("sync_every", sync_every), ("eval_every", eval_every)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}; pass matching inputs and labels")
    batches = worker_batches(len(x), rank, world_size, batch_size, seed, shard)
    peak = lr if peak_lr is None else peak_lr
    optimizer = torch.optim.SGD(model.parameters(), lr=warmup_lr(1, lr, peak, warmup_steps), momentum=momentum)
    history = LocalSGDHistory()
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = warmup_lr(step, lr, peak, warmup_steps)
        idx = next(batches)
        loss = train_step(model, optimizer, x[idx], y[idx])
        history.losses.append(loss.item())
        synced = step % sync_every == 0 or step == steps
        if synced:
            began = time.perf_counter()
            average(model)
            history.averaging_time += time.perf_counter() - began
            history.n_averages += 1
        if x_test is not None and (step % eval_every == 0 or step == steps):
            began = time.perf_counter()
            history.eval_seconds.append(began - start - history.eval_time)
            probe = model
            if not synced:                        # the workers' average, for measurement only
                probe = copy.deepcopy(model)
                average(probe)
            test_loss, accuracy = evaluate(probe, x_test, y_test)   # restores train() mode
            history.eval_time += time.perf_counter() - began
            history.eval_steps.append(step)
            history.test_loss.append(test_loss)
            history.test_accuracy.append(accuracy)
    history.wall_time = time.perf_counter() - start - history.eval_time
    return history

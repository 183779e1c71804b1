"""Checks that data-parallel replicas agree, and metrics combined over ranks. Taught in lab 04.

Data parallelism is correct only if every rank holds the same model after every step. Looking at
one weight on two ranks proves little; these functions compare every parameter and buffer of a
module on every rank, in one collective:

    replicas.assert_replicas_equal(model)        # raises, naming each tensor that differs
    loss = replicas.mean_over_ranks(loss_sum, count)   # a metric over the whole global batch

All of them are collectives: every rank of the group must call them, in the same order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def gather_from_ranks(tensor: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every rank's copy of ``tensor`` (same shape and dtype on every rank), in rank order."""
    tensor = tensor.detach().contiguous()
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, tensor, group=group)
    return copies


def _named_tensors(module: nn.Module, grads: bool) -> list[tuple[str, torch.Tensor]]:
    if grads:
        return [(name, p.grad) for name, p in module.named_parameters() if p.grad is not None]
    return list(module.named_parameters()) + list(module.named_buffers())


def replica_differences(module: nn.Module, group=None, grads: bool = False) -> dict[str, float]:
    """Largest difference of each parameter and buffer (or, with ``grads``, each gradient)
    between this rank's copy and any other rank's, by name. All zeros means the replicas agree.

    The tensors of one dtype travel flattened in one all_gather. Every rank must hold the same
    names and shapes (the same model); a rank whose tensors differ in number raises a ValueError.
    """
    named = _named_tensors(module, grads)
    sizes = torch.tensor([len(named), sum(t.numel() for _, t in named)], device=_device(module))
    for other in gather_from_ranks(sizes, group):
        if not torch.equal(other, sizes):
            what = "gradients" if grads else "parameters and buffers"
            raise ValueError(f"the ranks hold different {what} (count and elements per rank differ: "
                             f"{sizes.tolist()} here, {other.tolist()} elsewhere); is it the same model everywhere?")
    differences = {}
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in named:
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    for dtype, items in by_dtype.items():
        flat = torch.cat([t.detach().reshape(-1) for _, t in items])
        copies = gather_from_ranks(flat, group)
        worst = torch.zeros_like(flat, dtype=torch.float64)
        for copy in copies:
            worst = torch.maximum(worst, (copy.double() - flat.double()).abs())
        start = 0
        for name, tensor in items:
            stop = start + tensor.numel()
            differences[name] = worst[start:stop].max().item() if stop > start else 0.0
            start = stop
    return differences


def assert_replicas_equal(module: nn.Module, group=None, grads: bool = False, atol: float = 0.0) -> None:
    """Raise an AssertionError naming every tensor whose copies differ across ranks by more than ``atol``.

    After an all-reduce every rank receives the same bytes, so correct data-parallel training keeps
    the replicas *exactly* equal: the default tolerance is zero.
    """
    differences = replica_differences(module, group, grads)
    wrong = {name: d for name, d in differences.items() if d > atol}
    if wrong:
        what = "gradients" if grads else "tensors"
        listing = ", ".join(f"{name} (by {d:.3g})" for name, d in wrong.items())
        raise AssertionError(f"rank {dist.get_rank()}: {len(wrong)} of {len(differences)} {what} differ "
                             f"across ranks: {listing}")


def mean_over_ranks(total: float, count: int = 1, group=None) -> float:
    """``sum(total) / sum(count)`` over all ranks: the mean of a metric over the whole global batch.

    Pass each rank's *sum* (e.g. of per-sample losses) and its number of samples, so ranks with
    fewer samples (the last, uneven batch) weigh less; the mean of the per-rank means would not.
    """
    both = torch.tensor([float(total), float(count)], dtype=torch.float64, device=_backend_device(group))
    dist.all_reduce(both, group=group)
    if both[1] == 0:
        raise ValueError("no rank counted any sample: pass count > 0 on at least one rank")
    return (both[0] / both[1]).item()


def _device(module: nn.Module) -> torch.device:
    first = next(iter(module.parameters()), None)
    return first.device if first is not None else _backend_device(None)


def _backend_device(group) -> torch.device:
    # nccl moves only CUDA tensors; gloo only CPU ones (for these collectives).
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

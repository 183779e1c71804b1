"""Is a data-parallel wrapper right? Train it and compare with one process on the whole batch.

Data-parallel SGD on ``p`` ranks, each taking an equal shard of a global batch, must end at the
same weights as one process taking the whole batch (the mean of the shards' mean gradients is the
whole batch's mean gradient). So, after a few steps on the same data from the same start:

    differences = lab05.compare_with_single_process(lambda m: BucketedDDP(m, 0.001))
    assert max(differences.values()) < 1e-9

The model is ``AwkwardNet`` unless another is given: the cases that break hand-written DDPs in one
module (a frozen parameter, tied weights, a parameter forward never uses, a buffer, parameters of
very different sizes). Everything runs in float64 so that a wrong answer stands out of rounding.
Used by lab 05's checks, tests/library/test_ddp.py and benchmarks. Every rank must call it.
"""
from __future__ import annotations

import contextlib
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils import replicas


class AwkwardNet(nn.Module):
    """Small, and awkward for a DDP: frozen, tied, unused, a buffer, a large and a tiny parameter."""

    def __init__(self, d_in: int = 12, d_hidden: int = 16, n_classes: int = 5):
        super().__init__()
        self.frozen = nn.Linear(d_in, d_hidden)           # requires_grad=False: no gradient, no reduction
        self.frozen.requires_grad_(False)
        self.wide = nn.Linear(d_hidden, 4 * d_hidden)     # the largest parameter
        self.narrow = nn.Linear(4 * d_hidden, d_hidden)
        self.tied = nn.Linear(d_hidden, d_hidden, bias=False)
        self.unused = nn.Linear(d_hidden, d_hidden)       # never called in forward: its gradient stays None
        self.head = nn.Linear(d_hidden, n_classes)
        self.gain = nn.Parameter(torch.ones(1))           # a one-element parameter
        self.register_buffer("scale", torch.rand(d_hidden) + 0.5)   # different on each rank until broadcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.frozen(x)) * self.scale
        h = torch.tanh(self.narrow(torch.relu(self.wide(h))))
        h = torch.tanh(self.tied(h))
        h = torch.tanh(self.tied(h))                     # the same weight used twice: its gradients add up
        return self.head(h) * self.gain


def global_batches(steps: int, global_batch: int, d_in: int = 12, n_classes: int = 5, seed: int = 1,
                   dtype: torch.dtype = torch.float64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same ``steps`` batches on every rank that calls it (a fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(global_batch, d_in, generator=g, dtype=dtype),
             torch.randint(0, n_classes, (global_batch,), generator=g)) for _ in range(steps)]


def _train(model, batches, lr: float, finish=None, rank: int = 0, world_size: int = 1, device=None,
           micro_batches: int = 1, set_to_none: bool = True) -> None:
    """SGD with momentum (a wrong gradient in one step shows in every later one). Each step takes
    ``micro_batches`` batches, accumulating their gradients; all but the last backward run inside
    the model's ``no_sync()`` when it has one."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    for step in range(0, len(batches), micro_batches):
        optimizer.zero_grad(set_to_none=set_to_none)
        for i, (x, y) in enumerate(batches[step:step + micro_batches]):
            shard = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
            x, y = x[shard].to(device), y[shard].to(device)
            last = i == micro_batches - 1
            with contextlib.nullcontext() if last else no_sync():
                F.cross_entropy(model(x), y).backward()
        if finish is not None:
            finish()
        optimizer.step()


def start_models(make_model=AwkwardNet, group=None, device=None) -> tuple[nn.Module, nn.Module]:
    """(this rank's model, the single-process reference), in float64. The group's rank 0 and the
    reference start from the same weights; every other rank starts elsewhere, so a wrapper that
    forgets to broadcast rank 0's weights cannot pass."""
    rank = dist.get_rank(group)
    torch.manual_seed(1000)
    reference = make_model().double().to(device)
    torch.manual_seed(1000 + rank)
    return make_model().double().to(device), reference


def train_data_parallel(wrap, model: nn.Module, batches, *, lr: float = 0.1, group=None, device=None,
                        micro_batches: int = 1, set_to_none: bool = True) -> nn.Module:
    """Train ``wrap(model)`` on this rank's shard of each global batch; returns the wrapper.
    ``set_to_none=False`` zeroes the gradients in place between steps instead of dropping them."""
    wrapped = wrap(model)
    finish = getattr(wrapped, "finish_gradient_synchronization", None)
    _train(wrapped, batches, lr, finish, dist.get_rank(group), dist.get_world_size(group), device, micro_batches,
           set_to_none)
    return wrapped


def train_single_process(model: nn.Module, batches, *, lr: float = 0.1, device=None,
                         micro_batches: int = 1) -> nn.Module:
    """Train ``model`` on the whole of each global batch, in this process alone."""
    _train(model, batches, lr, device=device, micro_batches=micro_batches)
    return model


def differences(model: nn.Module, other: nn.Module) -> dict[str, float]:
    """Largest absolute difference per parameter between two models of the same class."""
    theirs = dict(other.named_parameters())
    return {name: (param - theirs[name]).abs().max().item() for name, param in model.named_parameters()}


def compare_with_single_process(wrap, make_model=AwkwardNet, *, steps: int = 4, per_rank_batch: int = 3,
                                lr: float = 0.1, micro_batches: int = 1, group=None, device=None) -> dict[str, float]:
    """Largest absolute difference, per parameter, between ``wrap(model)`` trained on this rank's
    shards and one process trained on the whole batches. Also checks that the ranks agree.

    ``wrap`` returns the wrapper; its ``finish_gradient_synchronization()`` (if it has one) runs
    after each step's backward passes, before the optimizer step. With ``micro_batches`` > 1 each
    step accumulates that many batches, all but the last inside ``no_sync()``.
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    batches = global_batches(steps * micro_batches, per_rank_batch * dist.get_world_size(group))
    model, reference = start_models(make_model, group, device)
    train_data_parallel(wrap, model, batches, lr=lr, group=group, device=device, micro_batches=micro_batches)
    train_single_process(reference, batches, lr=lr, device=device, micro_batches=micro_batches)
    replicas.assert_replicas_equal(model, group)
    return differences(reference, model)


# --- section 7: the bucket-size sweep, its figure and what it resolved ----------------------------------------------

def say_bucket_sweep(caps_mb: list, rounds: dict, wrappers: list) -> list[str]:
    """Lab 05's verdicts on its sweep, each through ``utils.outcomes`` (so that tests re-derive them from the
    numbers): at each bucket size, the learner's wrapper (``wrappers[0]``) against torch's DDP (``wrappers[1]``),
    one step time per round each; then the best bucketed step against the flat wrapper's. ``rounds[name]``: one
    list of per-round step times (seconds) per bucket size, or a single list for a wrapper without buckets."""
    from utils import outcomes

    mine, torchs = wrappers
    lines = []
    for cap, ours, theirs in zip(caps_mb, rounds[mine], rounds[torchs]):
        said = outcomes.compare(mine, [s * 1e3 for s in ours], "torch DDP", [s * 1e3 for s in theirs], unit=" ms")
        lines.append(f"  bucket_cap_mb {cap:g}: {mine} against torch DDP: " + {
            "higher": "slower, beyond the rounds' spread", "lower": "faster, beyond the rounds' spread",
            "within the spread": "within the rounds' spread: noise", "not judged": "one round each, not judged"}[said])
    best_name, best_cap = min(((name, i) for name in wrappers for i in range(len(caps_mb))),
                              key=lambda pick: statistics.mean(rounds[pick[0]][pick[1]]))
    best = [s * 1e3 for s in rounds[best_name][best_cap]]
    said = outcomes.compare(f"{best_name} at {caps_mb[best_cap]:g} MiB", best, "flat", [s * 1e3 for s in rounds["flat"][0]],
                            unit=" ms")
    lines.append(f"the fastest bucketed step ({best_name} at bucket_cap_mb {caps_mb[best_cap]:g}) against the flat "
                 f"wrapper's: " + {"higher": "slower, beyond the rounds' spread", "lower": "faster, beyond the rounds' spread",
                                   "within the spread": "within the rounds' spread: no difference resolved",
                                   "not judged": "one round each, not judged"}[said])
    return lines


def plot_bucket_sweep(caps_mb: list, rounds: dict, wrappers: list, predicted: dict, title: str):
    """Each bucketed wrapper's step time against the bucket size (mean of the rounds, bars: their range), its
    no-overlap prediction (the floor plus every bucket's all-reduce, dashed), and the other wrappers as lines."""
    import matplotlib.pyplot as plt

    mean_ms = lambda values: statistics.mean(values) * 1e3
    others = [name for name in rounds if name not in wrappers]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(wrappers):
        ax.errorbar(caps_mb, [mean_ms(r) for r in rounds[name]], fmt="o-", color=f"C{i}", capsize=3,
                    yerr=[(max(r) - min(r)) * 1e3 / 2 for r in rounds[name]], label=f"{name}: measured")
        kind = "torch DDP" if name == "torch DDP" else "yours"
        ax.plot(caps_mb, [mean_ms(rounds["no communication"][0]) + predicted[cap][kind][1] * 1e3 for cap in caps_mb], "--",
                color=f"C{i}", label=f"{name}: predicted, no overlap ({kind} buckets)")
    for i, name in enumerate(others):
        ax.axhline(mean_ms(rounds[name][0]), linestyle=":", color=f"C{i + 2}", label=name)
    ax.set(xscale="log", xlabel="bucket_cap_mb (MiB)", ylabel="step time, slowest rank (ms)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

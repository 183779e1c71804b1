"""What a DDP step costs on the engines: measured, predicted, and drawn side by side.
Taught in lab 04 (section 4).

``time_ddp_steps`` runs on every engine at once. For each k = 1 .. world size, on ranks 0 .. k-1
together (the others wait at a barrier), it times a DDP step on a subgroup of k ranks and the same step
on the bare model (the computation alone: no hooks, no all-reduce), with ``utils.ddp_timing``'s
``time_ddp_against_bare``, which times lab 06's scaling too; it adds one all-reduce of a tensor as
large as all the gradients (``utils.perf.median_ms``) and records the buckets DDP all-reduces in a
step (a communication hook that notes each bucket's size); ``slowest`` merges the ranks, step by step.
``one_process_steps_ms`` and ``one_process_ms`` time the alternative in the notebook: one process computing
the same global batch. ``predict`` gives each step's buckets and all-reduce time from lab 03's alpha-beta
model (``utils.ddp_timing``, which lab 06 uses too). ``say_costs`` prints what the numbers show, the
throughput of the DDP ranks against one process's judged through ``utils.outcomes`` on each timed step.
"""
from __future__ import annotations

import functools
import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from utils import models
from utils.perf import median_ms, step_times_ms
from utils.ddp_timing import Workload, ddp_bucket_bytes, predicted_comm_seconds, time_ddp_against_bare
from utils.train import train_step


def gradient_bytes(model: torch.nn.Module) -> list[int]:
    """Each trainable parameter's gradient size in bytes, in the order backward produces them (last layer first)."""
    return [q.numel() * q.element_size() for q in reversed(list(model.parameters())) if q.requires_grad]


def _buckets_launched(cfg: dict, x, y, group, device) -> list[int]:
    """Bytes of each bucket DDP all-reduces in one step, in launch order, seen by a communication hook.

    The step measured is the second: in the first, DDP puts every gradient in one bucket while it
    records the order they arrive in, then rebuilds its buckets (at its default cap, 1 MiB first and 25 MiB after).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    net = models.MLP(**cfg).to(device)
    ddp = DistributedDataParallel(net, process_group=group, device_ids=[device] if device.type == "cuda" else None)
    sizes: list[int] = []

    def noting_hook(state, bucket):
        buffer = bucket.buffer()
        sizes.append(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(state, bucket)   # what DDP does without a hook

    ddp.register_comm_hook(group, noting_hook)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    train_step(ddp, optimizer, x, y)
    sizes.clear()
    train_step(ddp, optimizer, x, y)
    return sizes


def time_ddp_steps(workloads: dict, per_rank_batch: int, device, *, warmup: int = 3, repeats: int = 10) -> dict:
    """On every engine: ``{(name, k): {"ddp": ms, "compute": ms, "all_reduce": ms, "grad_bytes": [...],
    "buckets": [...]}}`` for this rank, for each workload (``models.MLP`` settings by name) and each k.

    Times are this rank's medians; a step of k ranks is as slow as the slowest, so take the maximum
    over ranks (``slowest``). Every rank must call it, with the same arguments.
    """
    device = torch.device(device)

    def all_reduce_and_buckets(name, group, net, x, y):
        grads = torch.zeros(sum(q.numel() for q in net.parameters()), device=device)
        return dict(all_reduce=median_ms(lambda: dist.all_reduce(grads, group=group), device,
                                         group=group, warmup=warmup, repeats=repeats),
                    grad_bytes=gradient_bytes(net),
                    buckets=_buckets_launched(workloads[name], x, y, group, device))

    mlps = {name: Workload(functools.partial(models.MLP, **cfg), (cfg["d_in"],), cfg["n_classes"],
                           lambda k: per_rank_batch)
            for name, cfg in workloads.items()}
    return time_ddp_against_bare(mlps, device, warmup=warmup, repeats=repeats, more=all_reduce_and_buckets)


def slowest(per_rank: list[dict]) -> dict:
    """Per (workload, k): each timed step as slow as its slowest rank (a step ends when every rank's does; the ranks
    start each step together at a barrier), as ``ddp_steps`` and ``compute_steps``, with their medians as ``ddp`` and
    ``compute``; the slowest rank's all-reduce median; rank 0's buckets."""
    merged = {}
    for key, first in per_rank[0].items():
        ranks = [t[key] for t in per_rank if key in t]
        merged[key] = {f"{what}_steps": [max(steps) for steps in zip(*(t[f"{what}_steps"] for t in ranks))]
                       for what in ("ddp", "compute")}
        merged[key].update({what: statistics.median(merged[key][f"{what}_steps"]) for what in ("ddp", "compute")},
                           all_reduce=max(t["all_reduce"] for t in ranks), grad_bytes=first["grad_bytes"],
                           buckets=first["buckets"])
    return merged


def one_process_steps_ms(cfg: dict, batch: int, *, warmup: int = 3, repeats: int = 10) -> list[float]:
    """The ms of each timed training step of ``models.MLP(**cfg)`` on ``batch`` random samples, in this process."""
    torch.manual_seed(0)
    net = models.MLP(**cfg)
    x, y = torch.randn(batch, cfg["d_in"]), torch.randint(0, cfg["n_classes"], (batch,))
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    return step_times_ms(lambda: train_step(net, optimizer, x, y), "cpu", warmup=warmup, repeats=repeats)


def one_process_ms(cfg: dict, batch: int, *, warmup: int = 3, repeats: int = 10) -> float:
    """Median ms of one training step of ``models.MLP(**cfg)`` on ``batch`` random samples, in this process."""
    return statistics.median(one_process_steps_ms(cfg, batch, warmup=warmup, repeats=repeats))


def say_costs(costs: dict, predicted: dict, one_process_steps: dict, workloads, n: int, per_rank_batch: int,
              threads: int) -> list[str]:
    """Section 6's findings at the largest k, ``n``: per workload, DDP's buckets against the prediction, its cost at
    k = 1, the computation and communication, and the throughput of n DDP ranks against one process's (each timed
    step's samples per second, through ``utils.outcomes.compare``: faster or slower only beyond the steps' spread)."""
    from utils import outcomes

    lines = []
    for name in workloads:
        t1, tn = costs[(name, 1)], costs[(name, n)]
        comm = max(tn["ddp"] - tn["compute"], 0)
        samples = n * per_rank_batch
        ddp_rates = [samples / ms * 1e3 for ms in tn["ddp_steps"]]
        single_rates = [samples / ms * 1e3 for ms in one_process_steps[(name, n)]]
        said = outcomes.compare(f"{name}: {n} DDP ranks", ddp_rates, "one process", single_rates, unit=" samples/s")
        ratio = statistics.median(ddp_rates) / statistics.median(single_rates)
        lines.append(
            f"- {name}: DDP launched {len(tn['buckets'])} bucket(s) of {tn['buckets']} bytes, predicted "
            f"{len(predicted[name][n]['buckets'])} ({'as predicted' if tn['buckets'] == predicted[name][n]['buckets'] else 'NOT as predicted'}); "
            f"at k = 1 the DDP step took {t1['ddp'] - t1['compute']:+.2f} ms against the bare step; the computation "
            f"per rank went from {t1['compute']:.2f} ms at k = 1 to {tn['compute']:.2f} ms at k = {n}; communication at "
            f"k = {n}: {comm:.2f} ms measured, {predicted[name][n]['all_reduce_ms']:.2f} ms predicted; {n} DDP ranks "
            f"processed {ratio:.2f}x the samples per second of one process (median steps): " + {
                "higher": "more, beyond the steps' spread", "lower": "fewer, beyond the steps' spread",
                "within the spread": "not told apart within the steps' spread",
                "not judged": "one step each, not judged"}[said])
        if said == "higher":
            single, serial = statistics.median(one_process_steps[(name, n)]), n * t1["compute"]
            lines.append(f"  why: one process took {single:.2f} ms for {n} x {per_rank_batch} samples, "
                         + (f"longer than {n} bare steps of {per_rank_batch} samples one after the other on one engine "
                            f"({serial:.2f} ms): the baseline was slowed (other programs on the machine, or its threads "
                            f"waiting for each other)" if single > serial else
                            f"and {n} bare steps of {per_rank_batch} samples on one engine take {serial:.2f} ms: the single "
                            f"process used its {threads} threads worse than {n} processes with fewer threads each"))
    return lines


def predict(grad_bytes: list[int], ks, alpha: float, beta: float, bucket_cap_mb: float | None = None) -> dict:
    """Per k: DDP's buckets (bytes, launch order) and the ms they take to all-reduce if nothing overlaps."""
    buckets = ddp_bucket_bytes(grad_bytes, bucket_cap_mb)
    return {k: dict(buckets=buckets,
                    all_reduce_ms=1e3 * predicted_comm_seconds(grad_bytes, k, alpha, beta, bucket_cap_mb) if k > 1 else 0.0)
            for k in ks}


def plot_costs(costs: dict, predicted: dict, one_process: dict, workloads, ks, per_rank_batch: int, title: str):
    """Throughput against k (DDP, ideal, one process), then per workload where a step's time goes, with the
    all-reduce time predicted from alpha and beta beside the measured communication."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(workloads), figsize=(5 * (1 + len(workloads)), 4))
    for i, name in enumerate(workloads):
        rates = [k * per_rank_batch / costs[(name, k)]["ddp"] * 1e3 for k in ks]
        line, = axes[0].plot(ks, rates, "o-", label=f"{name}, DDP")
        axes[0].plot(ks, [rates[0] * k for k in ks], ":", color=line.get_color(), label=f"{name}, ideal (k x 1 rank)")
        axes[0].plot(ks, [k * per_rank_batch / one_process[(name, k)] * 1e3 for k in ks], "s--",
                     color=line.get_color(), label=f"{name}, one process, same global batch")
        ax = axes[1 + i]
        compute = [costs[(name, k)]["compute"] for k in ks]
        comm = [max(costs[(name, k)]["ddp"] - costs[(name, k)]["compute"], 0) for k in ks]
        left = [k - 0.2 for k in ks]
        ax.bar(left, compute, width=0.4, label="computation (no DDP)")
        ax.bar(left, comm, width=0.4, bottom=compute, label="communication (DDP step - computation)")
        ax.bar([k + 0.2 for k in ks], [predicted[name][k]["all_reduce_ms"] for k in ks], width=0.4, color="gray",
               label="predicted all-reduce (buckets x alpha-beta)")
        ax.plot(left, [costs[(name, k)]["all_reduce"] for k in ks], "kx", label="one all_reduce of the gradients")
        ax.set(xlabel="ranks k", ylabel="ms per step (slowest rank)", xticks=ks,
               title=f"{name}: {len(predicted[name][ks[-1]]['buckets'])} bucket(s) predicted")
        ax.legend(fontsize=7)
    axes[0].set(xlabel="ranks k", ylabel="samples / s", xticks=ks, yscale="log", title=title)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig

"""Counting the work in a step, measuring how fast this machine can do it, and the course's one timer.

Taught in labs/01_mlp_cpu.ipynb ("Cost of a step"). ``elapsed_ms`` is the one clock (it waits for the
device: lab 02 explains why); ``best_ms`` (best of rounds) and ``median_ms`` (median of barrier-started
calls, for steps of several ranks) time with it everywhere in the library.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .models import mlp_layer_shapes


def mlp_train_flops(batch_size: int, n_layers: int, d_in: int, d_hidden: int, n_classes: int) -> int:
    """Floating-point operations of one training step of the bias-free MLP.

    A linear layer with weight (out, in) costs 2*B*in*out FLOPs forward (a multiply and
    an add per weight per sample). Backward costs twice that (one matmul for the gradient
    of the input, one for the gradient of the weight), except in the first layer: the data
    needs no gradient, so autograd computes only the weight gradient there. tanh, the loss
    and the SGD update are O(B * width) and left out.
    """
    layers = [2 * batch_size * fan_in * fan_out
              for fan_in, fan_out in mlp_layer_shapes(n_layers, d_in, d_hidden, n_classes)]
    return 3 * sum(layers) - layers[0]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until ``device`` has finished the work queued on it (GPU calls return before).

    ``None``: the current CUDA device, if CUDA is in use in this process. CPU work is done when its call
    returns."""
    device = torch.device(device) if device is not None else None
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def elapsed_ms(fn, device) -> float:
    """Milliseconds that ``fn()`` takes on ``device``: the clock starts once the work queued before is done
    and stops once ``fn``'s own work is (GPU calls return before their work ends)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def best_ms(fn, device, repeats: int, rounds: int = 3, warmup: bool = True) -> float:
    """Best of ``rounds`` synchronised timings of ``repeats`` calls of ``fn``, in ms per call.

    One untimed call first (allocations, library set-up) unless ``warmup`` is False; the best round
    is the one least disturbed by other programs."""
    device = torch.device(device)
    if warmup:
        fn()

    def calls():
        for _ in range(repeats):
            fn()

    return min(elapsed_ms(calls, device) / repeats for _ in range(rounds))


def step_times_ms(fn, device, *, group=None, warmup: int = 3, repeats: int = 10) -> list[float]:
    """Synchronised ms of each of ``repeats`` calls of ``fn()`` after ``warmup`` untimed ones. With a process
    ``group``, every call starts at a barrier of it (a collective waits for the slowest rank, so each rank's
    clock starts together); None: this process alone, no barrier."""
    device = torch.device(device)
    times = []
    for i in range(warmup + repeats):
        if group is not None:
            dist.barrier(group=group)
        took = elapsed_ms(fn, device)
        if i >= warmup:
            times.append(took)
    return times


def median_ms(fn, device, *, group=None, warmup: int = 3, repeats: int = 10) -> float:
    """The median of ``step_times_ms`` (lab 04's all-reduce of all the gradients, for one)."""
    return statistics.median(step_times_ms(fn, device, group=group, warmup=warmup, repeats=repeats))


def matmul_peak_gflops(device=None, size: int = 2048, repeats: int = 10,
                       dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a ``size`` x ``size`` matrix product on ``device``.

    The best of several timed runs (after one warm-up) estimates what the machine
    achieves on the most favourable dense kernel: a practical peak to compare steps with.
    """
    device = torch.device(device or "cpu")
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return 2 * size ** 3 / (best_ms(lambda: a @ b, device, repeats=1, rounds=repeats) / 1e3) / 1e9

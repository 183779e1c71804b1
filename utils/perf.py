"""Counting the work in a step, measuring how fast this machine can do it, and the course's one timer.

Taught in labs/01_mlp_cpu.ipynb ("Cost of a step"); ``synchronize`` and ``best_ms`` time GPU work
everywhere in the library (lab 02 explains why the clock must wait for the device).
"""
from __future__ import annotations

import time

import torch

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


def best_ms(fn, device, repeats: int, rounds: int = 3, warmup: bool = True) -> float:
    """Best of ``rounds`` synchronised timings of ``repeats`` calls of ``fn``, in ms per call.

    One untimed call first (allocations, library set-up) unless ``warmup`` is False; the best round
    is the one least disturbed by other programs."""
    device = torch.device(device)
    if warmup:
        fn()
    best = float("inf")
    for _ in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        synchronize(device)
        best = min(best, (time.perf_counter() - start) * 1e3 / repeats)
    return best


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

"""Counting the work in a step and measuring how fast this machine can do it.

Taught in labs/01_mlp_cpu.ipynb ("Cost of a step").
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


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_peak_gflops(device=None, size: int = 2048, repeats: int = 10,
                       dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of a ``size`` x ``size`` matrix product on ``device``.

    The best of several timed runs (after one warm-up) estimates what the machine
    achieves on the most favourable dense kernel: a practical peak to compare steps with.
    """
    device = torch.device(device or "cpu")
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    _synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9

import math

import pytest
import torch

from utils.perf import matmul_peak_gflops, mlp_train_flops


def test_mlp_train_flops_hand_computed():
    # 3 layers: 10 -> 4 -> 4 -> 2 at batch 5.
    forward = 2 * 5 * 10 * 4 + 2 * 5 * 4 * 4 + 2 * 5 * 4 * 2
    assert forward == 640
    first = 2 * 5 * 10 * 4  # the first layer's input gradient is never computed
    assert mlp_train_flops(5, 3, 10, 4, 2) == 3 * 640 - first == 1520


def test_mlp_train_flops_one_layer_and_seed_sizes():
    assert mlp_train_flops(1, 1, 7, 99, 3) == 2 * 2 * 7 * 3  # d_hidden unused; forward + weight gradient
    # The seed exercise: 4 layers 1024 -> 256 -> 256 -> 256 -> 32, batch 64.
    expected = 3 * 2 * 64 * (1024 * 256 + 256 * 256 * 2 + 256 * 32) - 2 * 64 * 1024 * 256
    assert mlp_train_flops(64, 4, 1024, 256, 32) == expected
    assert isinstance(mlp_train_flops(64, 4, 1024, 256, 32), int)


def test_mlp_train_flops_linear_in_batch():
    assert mlp_train_flops(64, 3, 20, 8, 5) == 64 * mlp_train_flops(1, 3, 20, 8, 5)


def test_mlp_train_flops_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_layers"):
        mlp_train_flops(8, 0, 10, 4, 2)


def test_matmul_peak_gflops_positive():
    gflops = matmul_peak_gflops("cpu", size=64, repeats=2)
    assert isinstance(gflops, float) and gflops > 0 and math.isfinite(gflops)
    assert matmul_peak_gflops(size=32, repeats=1, dtype=torch.float64) > 0

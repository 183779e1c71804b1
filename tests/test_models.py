import math

import numpy as np
import pytest
import torch
from torch import nn

from utils.models import MLP, mlp_layer_shapes


@pytest.mark.parametrize("n_layers, expected", [
    (1, [(10, 3)]),
    (2, [(10, 6), (6, 3)]),
    (4, [(10, 6), (6, 6), (6, 6), (6, 3)]),
])
def test_layer_shapes(n_layers, expected):
    assert mlp_layer_shapes(n_layers, 10, 6, 3) == expected
    model = MLP(n_layers, 10, 6, 3)
    assert isinstance(model.layers, nn.ModuleList) and len(model.layers) == n_layers
    for layer, (fan_in, fan_out) in zip(model.layers, expected):
        assert isinstance(layer, nn.Linear)
        assert layer.bias is None
        assert tuple(layer.weight.shape) == (fan_out, fan_in)
    assert sum(p.numel() for p in model.parameters()) == sum(i * o for i, o in expected)


def manual_forward(model, x):
    weights = [layer.weight for layer in model.layers]
    out = x.flatten(1)
    for w in weights[:-1]:
        out = torch.tanh(out @ w.T)
    return out @ weights[-1].T


@pytest.mark.parametrize("n_layers", [1, 2, 4])
def test_forward_is_tanh_between_layers_not_after_last(n_layers):
    torch.manual_seed(0)
    model = MLP(n_layers, 10, 6, 3)
    x = torch.randn(7, 10) * 3
    out = model(x)
    assert out.shape == (7, 3)
    assert torch.allclose(out, manual_forward(model, x), atol=1e-6)
    # Logits are not squashed: a bounded output would mean tanh after the last layer.
    with torch.no_grad():
        model.layers[-1].weight.mul_(50)
    assert model(x).abs().max() > 1.5


def test_forward_flattens_images():
    torch.manual_seed(0)
    model = MLP(2, 16, 5, 4)
    x = torch.randn(3, 1, 4, 4)
    assert torch.allclose(model(x), model(x.reshape(3, 16)))


def test_kaiming_uniform_bound():
    torch.manual_seed(0)
    model = MLP(2, 1024, 256, 10)
    for layer in model.layers:
        fan_in = layer.weight.shape[1]
        bound = math.sqrt(6 / fan_in)
        w = layer.weight.detach()
        assert w.abs().max() <= bound
        # Fills the range (PyTorch's default init would stop at 1/sqrt(fan_in)).
        assert w.abs().max() > 0.95 * bound
        # Uniform on [-bound, bound]: variance bound^2 / 3 = 2 / fan_in.
        assert w.var().item() == pytest.approx(2 / fan_in, rel=0.1)


@pytest.mark.parametrize("bad", [dict(n_layers=0), dict(n_layers=-1), dict(d_in=0), dict(d_hidden=2.5),
                                 dict(n_classes="3"), dict(n_layers=True)])
def test_invalid_sizes(bad):
    sizes = dict(n_layers=2, d_in=4, d_hidden=3, n_classes=2) | bad
    name, value = next(iter(bad.items()))
    with pytest.raises(ValueError, match=f"{name} must be a whole number >= 1, got {value!r}"):
        MLP(**sizes)


def test_numpy_integer_sizes_accepted():
    model = MLP(np.int64(2), np.int64(8), 5, np.int32(3))
    assert model(torch.randn(2, 8)).shape == (2, 3)
    assert mlp_layer_shapes(np.int64(2), 8, 5, 3) == [(8, 5), (5, 3)]
    assert all(type(v) is int for shape in mlp_layer_shapes(np.int64(2), 8, 5, 3) for v in shape)

"""Models used by the labs.

``MLP`` is the multi-layer perceptron of lab 01 (taught there, cell by cell);
later labs add their convolutional networks here.
"""
from __future__ import annotations

import numbers

import torch
from torch import nn


def mlp_layer_shapes(n_layers: int, d_in: int, d_hidden: int, n_classes: int) -> list[tuple[int, int]]:
    """(in_features, out_features) of each linear layer: d_in -> d_hidden ... -> n_classes."""
    sizes = {"n_layers": n_layers, "d_in": d_in, "d_hidden": d_hidden, "n_classes": n_classes}
    for name, value in sizes.items():
        # numbers.Integral admits numpy integers (e.g. from np.prod); bool is not a size.
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    n_layers, d_in, d_hidden, n_classes = (int(v) for v in sizes.values())
    widths = [d_in] + [d_hidden] * (n_layers - 1) + [n_classes]
    return list(zip(widths[:-1], widths[1:]))


class MLP(nn.Module):
    """Bias-free linear layers with tanh between them (not after the last one).

    Weights use Kaiming-uniform initialisation (He et al., 2015), as in the seed
    exercise this lab is built on. Taught in labs/01_mlp_cpu.ipynb.
    """

    def __init__(self, n_layers: int = 4, d_in: int = 1024, d_hidden: int = 256, n_classes: int = 32):
        super().__init__()
        self.layers = nn.ModuleList()
        for fan_in, fan_out in mlp_layer_shapes(n_layers, d_in, d_hidden, n_classes):
            layer = nn.Linear(fan_in, fan_out, bias=False)
            nn.init.kaiming_uniform_(layer.weight)
            self.layers.append(layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.flatten(1)
        for layer in self.layers[:-1]:
            out = torch.tanh(layer(out))
        return self.layers[-1](out)

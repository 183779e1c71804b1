"""Checks for labs/01_mlp_cpu.ipynb."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import exercise, expect
from ..models import MLP, mlp_layer_shapes


def check_build_layers(build_layers) -> None:
    """Exercise 1.1: ``build_layers(n_layers, d_in, d_hidden, n_classes) -> nn.ModuleList``."""
    with exercise("Exercise 1.1 (build the layers)"):
        for n_layers in (1, 2, 4):
            layers = build_layers(n_layers, 12, 7, 3)
            expect(isinstance(layers, nn.ModuleList),
                   f"build_layers must return an nn.ModuleList (so PyTorch sees the parameters), "
                   f"got {type(layers).__name__}")
            expect(len(layers) == n_layers, f"with n_layers={n_layers} there should be {n_layers} layers, "
                                            f"got {len(layers)}")
            for i, (layer, (fan_in, fan_out)) in enumerate(zip(layers, mlp_layer_shapes(n_layers, 12, 7, 3))):
                expect(isinstance(layer, nn.Linear), f"layer {i} should be an nn.Linear, got {type(layer).__name__}")
                expect(layer.bias is None, f"layer {i} has a bias; create it with bias=False")
                expect(tuple(layer.weight.shape) == (fan_out, fan_in),
                       f"with n_layers={n_layers}, layer {i} should map {fan_in} -> {fan_out} features "
                       f"(weight shape ({fan_out}, {fan_in})), got weight shape {tuple(layer.weight.shape)}")
        # PyTorch's default init bounds weights by 1/sqrt(fan_in); Kaiming-uniform by sqrt(6/fan_in).
        fan_in = 1024
        weight = build_layers(2, fan_in, 256, 10)[0].weight.detach()
        bound = math.sqrt(6 / fan_in)
        expect(weight.abs().max() <= bound * 1.0001 and weight.abs().max() > 1.5 / math.sqrt(fan_in),
               f"the weights do not look Kaiming-uniform initialised (expected values in "
               f"[-{bound:.3f}, {bound:.3f}] filling that range; max |w| is {weight.abs().max():.3f}); "
               f"call nn.init.kaiming_uniform_(layer.weight) on each layer")


def check_forward(forward) -> None:
    """Exercise 1.2: ``forward(layers, x) -> logits``, tanh between layers, not after the last."""
    with exercise("Exercise 1.2 (forward pass)"):
        torch.manual_seed(0)
        for n_layers in (1, 3):
            reference = MLP(n_layers, 10, 6, 4)
            x = torch.randn(5, 10)
            out = forward(reference.layers, x)
            expect(isinstance(out, torch.Tensor), f"forward must return a tensor, got {type(out).__name__}")
            expect(tuple(out.shape) == (5, 4), f"forward should return shape (batch, n_classes) = (5, 4), "
                                               f"got {tuple(out.shape)}")
            with torch.no_grad():
                expected = reference(x)
                # Checked for one layer too: that case runs first, and a learner who applies
                # tanh after every layer fails it.
                if torch.allclose(out, torch.tanh(expected), atol=1e-5):
                    expect(False, "tanh is applied after the last layer too; the last layer must return "
                                  "raw scores (logits), which cross_entropy expects")
                no_tanh = x
                for layer in reference.layers:
                    no_tanh = layer(no_tanh)
                if n_layers > 1 and torch.allclose(out, no_tanh, atol=1e-5):
                    expect(False, "no tanh between the layers: apply torch.tanh to the output of every "
                                  "layer except the last")
            expect(torch.allclose(out, expected, atol=1e-5),
                   f"with {n_layers} layer(s) the output differs from layer -> tanh -> ... -> layer "
                   f"(largest difference {(out - expected).abs().max():.3g})")
            expect(out.requires_grad, "the output carries no gradient: do not compute it under "
                                      "torch.no_grad() or with .detach()")


def check_evaluate(evaluate) -> None:
    """Exercise 1.3: ``evaluate(model, x, y, batch_size) -> mean loss over every sample``."""
    with exercise("Exercise 1.3 (evaluate)"):
        torch.manual_seed(0)
        model = MLP(2, 8, 5, 3)
        x, y = torch.randn(103, 8), torch.randint(0, 3, (103,))
        with torch.no_grad():
            expected = F.cross_entropy(model(x), y).item()
        model.train()
        result = evaluate(model, x, y, 10)
        expect(isinstance(result, float), f"evaluate should return a Python float (use .item()), "
                                          f"got {type(result).__name__}")
        expect(model.training, "evaluate must put the model back in training mode (model.train()) "
                               "before returning")
        if not math.isclose(result, expected, rel_tol=1e-4):
            with torch.no_grad():
                batch_means = [F.cross_entropy(model(x[i:i + 10]), y[i:i + 10]).item() for i in range(0, 103, 10)]
            if math.isclose(result, sum(batch_means) / len(batch_means), rel_tol=1e-4):
                expect(False, "this is the mean of the per-batch means, but the last batch is smaller "
                              "(103 samples, batches of 10): sum the per-sample losses "
                              "(reduction='sum') and divide by the number of samples")
            expect(False, f"expected the mean cross-entropy over all 103 samples, {expected:.5f}, "
                          f"got {result:.5f}")
        expect(all(p.grad is None for p in model.parameters()),
               "evaluate computed gradients; wrap it in torch.no_grad() (evaluation needs no backward)")

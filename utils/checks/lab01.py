"""Checks for labs/01_mlp_cpu.ipynb.

Each check runs the learner's function on small, awkward inputs and watches how the work is done
(which samples the model saw, in which mode, with or without autograd), not only the result.
"""
from __future__ import annotations

import copy
import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from . import exercise, expect, hint_for
from ..models import MLP, mlp_layer_shapes

HINTS = {
    "1.1": """Step by step:
1. The widths are [d_in] + [d_hidden] * (n_layers - 1) + [n_classes]; layer i maps widths[i] -> widths[i + 1].
2. For each pair (fan_in, fan_out): layer = nn.Linear(fan_in, fan_out, bias=False).
3. nn.init.kaiming_uniform_(layer.weight) (optionally nonlinearity="tanh", the gain that suits tanh).
4. Collect the layers in an nn.ModuleList (a plain list hides their parameters from PyTorch) and return it.""",
    "1.2": """Step by step:
1. out = x.
2. For every layer except the last (layers[:-1]): out = torch.tanh(layer(out)).
3. Return layers[-1](out): the last layer's raw scores (logits), no tanh, since F.cross_entropy applies
   the softmax itself.""",
    "1.3": """Step by step:
1. model.eval() (dropout and similar layers behave differently in evaluation).
2. Under `with torch.no_grad():` loop `for start in range(0, len(x), batch_size)` and take the slices
   x[start:start + batch_size], y[start:start + batch_size] (the last slice may be shorter).
3. Add up F.cross_entropy(model(xb), yb, reduction="sum").item() over the batches: per-sample sums, so the
   short last batch counts with its true weight.
4. model.train(), then return total / len(x).""",
    "1.4": """Step by step:
1. loss = F.cross_entropy(model(x), y)   (the forward pass and the loss)
2. optimizer.zero_grad()                 (clear the gradients of the previous step)
3. loss.backward()                       (fill every parameter's .grad)
4. optimizer.step()                      (update the weights from .grad)
5. return loss.item()                    (the loss before this update, as a float)""",
}


hint = hint_for(HINTS)  # lab01.hint("1.1") prints that exercise's step-by-step hint


# --- 1.1 build the layers ---------------------------------------------------------------------------

# Kaiming-uniform draws from U(-b, b) with b = gain * sqrt(3 / fan_in); the text allows the default
# gain (sqrt(2), for ReLU) and the gain for tanh (5/3). b * sqrt(fan_in) identifies the choice.
_KAIMING = {"the default (ReLU) gain": math.sqrt(2) * math.sqrt(3), "nonlinearity='tanh'": 5 / 3 * math.sqrt(3)}


def _describe_init(weight: torch.Tensor, fan_in: int, fan_out: int) -> str | None:
    """None if ``weight`` looks Kaiming-uniform (an allowed gain, fan_in mode), else what it looks like."""
    w = weight.detach().double().flatten()
    scale = w.abs().max().item() * math.sqrt(fan_in)   # b * sqrt(fan_in)
    uniform = abs(w.std().item() * math.sqrt(3) / w.abs().max().item() - 1) < 0.05  # std = b / sqrt(3)
    allowed = any(abs(scale / s - 1) < 0.02 for s in _KAIMING.values())
    if allowed and uniform:
        return None
    if not uniform:
        return ("the values are not spread evenly over a range (a normal distribution? kaiming_normal_?): "
                "use nn.init.kaiming_uniform_")
    if abs(scale - 1) < 0.02:
        return ("they look like PyTorch's default init of nn.Linear (bound 1/sqrt(fan_in)): initialise each "
                "weight with nn.init.kaiming_uniform_")
    for gain_name, s in _KAIMING.items():
        if abs(w.abs().max().item() * math.sqrt(fan_out) / s - 1) < 0.02:
            return (f"the bound follows fan_out ({fan_out}), not fan_in ({fan_in}): keep "
                    f"kaiming_uniform_'s default mode='fan_in'")
    allowed_text = " or ".join(f"{s:.3f} ({name})" for name, s in _KAIMING.items())
    return (f"the values fill [-b, b] with b * sqrt(fan_in) = {scale:.3f}; nn.init.kaiming_uniform_ gives "
            f"{allowed_text}")


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
            expect(len({id(layer.weight) for layer in layers}) == n_layers,
                   f"with n_layers={n_layers} some layers are the same object (e.g. [layer] * n): create a new "
                   f"nn.Linear for every layer, so that each has its own weights")
        # Every layer is checked, on sizes large enough to tell the distributions apart; fan_in differs
        # from fan_out in the first and last layers, so a fan_out bound shows.
        shapes = mlp_layer_shapes(3, 1024, 384, 64)
        for i, (layer, (fan_in, fan_out)) in enumerate(zip(build_layers(3, 1024, 384, 64), shapes)):
            problem = _describe_init(layer.weight, fan_in, fan_out)
            expect(problem is None, f"layer {i} ({fan_in} -> {fan_out}) does not look Kaiming-uniform "
                                    f"initialised: {problem}")


# --- 1.2 forward -------------------------------------------------------------------------------------

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


# --- 1.3 evaluate ------------------------------------------------------------------------------------

def _dropout_model() -> nn.Module:
    """A small model whose output depends on train/eval mode (dropout), so a missing eval() shows."""
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3))


def _record_calls(model: nn.Module) -> tuple[list[dict], object]:
    """Record every forward call of ``model``: batch size, train/eval mode, whether autograd was on."""
    calls: list[dict] = []

    def hook(module, inputs):
        calls.append({"batch": len(inputs[0]), "training": module.training, "grad": torch.is_grad_enabled()})
    return calls, model.register_forward_pre_hook(hook)


def check_evaluate(evaluate) -> None:
    """Exercise 1.3: ``evaluate(model, x, y, batch_size) -> mean loss over every sample``."""
    with exercise("Exercise 1.3 (evaluate)"):
        torch.manual_seed(0)
        model = _dropout_model()
        n, batch_size = 103, 10   # a last batch of 3: a mean of batch means is wrong
        x, y = torch.randn(n, 8), torch.randint(0, 3, (n,))
        model.eval()
        with torch.no_grad():
            expected = F.cross_entropy(model(x), y).item()
        model.train()
        calls, handle = _record_calls(model)
        try:
            result = evaluate(model, x, y, batch_size)
        finally:
            handle.remove()
        expect(isinstance(result, float), f"evaluate should return a Python float (use .item()), "
                                          f"got {type(result).__name__}")
        expect(model.training, "evaluate must put the model back in training mode (model.train()) "
                               "before returning")
        sizes = [call["batch"] for call in calls]
        expect(sum(sizes) == n,
               f"the model saw {sum(sizes)} samples, but x has {n}: evaluate every sample exactly once "
               f"(range(0, len(x), batch_size) keeps the short last batch)")
        expect(max(sizes) <= batch_size,
               f"the model was called on {max(sizes)} samples at once with batch_size={batch_size}: work "
               f"through the data batch_size samples at a time (a whole test set may not fit in memory)")
        expect(not any(call["training"] for call in calls),
               "the model was in training mode while evaluating, so dropout was switching units off at "
               "random: call model.eval() before the loop")
        expect(not any(call["grad"] for call in calls),
               "evaluate recorded an autograd graph for every batch (memory and time spent for nothing): "
               "run the loop under torch.no_grad()")
        if not math.isclose(result, expected, rel_tol=1e-4):
            model.eval()
            with torch.no_grad():
                batch_means = [F.cross_entropy(model(x[i:i + batch_size]), y[i:i + batch_size]).item()
                               for i in range(0, n, batch_size)]
            model.train()
            if math.isclose(result, sum(batch_means) / len(batch_means), rel_tol=1e-4):
                expect(False, "this is the mean of the per-batch means, but the last batch is smaller "
                              f"({n} samples, batches of {batch_size}): sum the per-sample losses "
                              "(reduction='sum') and divide by the number of samples")
            expect(False, f"expected the mean cross-entropy over all {n} samples, {expected:.5f}, "
                          f"got {result:.5f}")


# --- 1.4 the training step ---------------------------------------------------------------------------

def _reference_step(model, optimizer, x, y, *, zero_grad=True) -> float:
    loss = F.cross_entropy(model(x), y)
    if zero_grad:
        optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _run_steps(step, model, batches, **options) -> list:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    return [step(model, optimizer, x, y, **options) for x, y in batches]


def check_train_step(train_step) -> None:
    """Exercise 1.4: ``train_step(model, optimizer, x, y) -> loss before the update, as a float``."""
    with exercise("Exercise 1.4 (the training step)"):
        torch.manual_seed(0)
        start = MLP(3, 9, 11, 5)
        batches = [(torch.randn(13, 9), torch.randint(0, 5, (13,))) for _ in range(4)]
        reference = copy.deepcopy(start)
        expected = _run_steps(_reference_step, reference, batches)

        model = copy.deepcopy(start)
        calls, handle = _record_calls(model)
        try:
            losses = _run_steps(train_step, model, batches)
        finally:
            handle.remove()
        result = losses[0]
        expect(result is not None, "train_step returned None: return the loss of the batch, loss.item()")
        expect(isinstance(result, numbers.Real) and not isinstance(result, bool),
               f"train_step should return the loss as a Python float, got {type(result).__name__}"
               + (": use loss.item()" if isinstance(result, torch.Tensor) else ""))
        expect(len(calls) == len(batches),
               f"over {len(batches)} steps the model was called {len(calls)} times: one forward pass per step, "
               f"on the batch (x, y) it is given")
        expect(all(call["training"] for call in calls),
               "the model was in evaluation mode during a training step: leave it in training mode "
               "(no model.eval() in train_step)")
        expect(all(call["grad"] for call in calls),
               "the forward pass ran without autograd (torch.no_grad()?), so there is nothing to "
               "backpropagate: compute the loss with autograd on")
        moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), start.parameters())]
        expect(any(moved), "the weights did not change: after loss.backward() call optimizer.step() "
                           "(and clear the gradients before backward, not between backward and step)")
        expect(all(moved), f"the weights of layer(s) {[i for i, m in enumerate(moved) if not m]} did not change: "
                           f"give the optimizer every parameter and call optimizer.step()")
        same_weights = all(torch.allclose(p, q, rtol=1e-4, atol=1e-6)
                           for p, q in zip(model.parameters(), reference.parameters()))
        if not same_weights:
            piled = copy.deepcopy(start)
            _run_steps(_reference_step, piled, batches, zero_grad=False)
            expect(not all(torch.allclose(p, q, rtol=1e-4, atol=1e-6)
                           for p, q in zip(model.parameters(), piled.parameters())),
                   "the weights match a loop that never clears the gradients, so each step adds the old "
                   "gradients to the new ones: call optimizer.zero_grad() before loss.backward()")
            expect(False, f"after {len(batches)} steps the weights differ from forward -> "
                          f"F.cross_entropy -> zero_grad -> backward -> step on each batch "
                          f"(largest difference {max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters())):.3g})")
        got = [float(v) for v in losses]
        expect(all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) for a, b in zip(got, expected)),
               f"the weights are right but the returned losses are not the loss of each batch before its "
               f"update (F.cross_entropy(model(x), y)): expected {[round(v, 4) for v in expected]}, "
               f"got {[round(v, 4) for v in got]}")

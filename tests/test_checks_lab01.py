import pytest
import torch
import torch.nn.functional as F
from torch import nn

from check_helpers import fails, stub
from utils.checks import ExerciseError, Incorrect, NotSolved, expect, exercise, lab01


# --- correct solutions, as a learner would write them ---------------------------------------

def build_layers(n_layers, d_in, d_hidden, n_classes, bias=False, init=True, container=nn.ModuleList):
    widths = [d_in] + [d_hidden] * (n_layers - 1) + [n_classes]
    layers = container()
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layer = nn.Linear(fan_in, fan_out, bias=bias)
        if init:
            nn.init.kaiming_uniform_(layer.weight)
        layers.append(layer)
    return layers


def forward(layers, x):
    out = x
    for layer in layers[:-1]:
        out = torch.tanh(layer(out))
    return layers[-1](out)


@torch.no_grad()
def evaluate(model, x, y, batch_size):
    model.eval()
    total = 0.0
    for i in range(0, len(x), batch_size):
        total += F.cross_entropy(model(x[i:i + batch_size]), y[i:i + batch_size], reduction="sum").item()
    model.train()
    return total / len(x)


# --- 1.1 build_layers ------------------------------------------------------------------------

def test_build_layers_correct(capsys):
    lab01.check_build_layers(build_layers)
    assert "\u2713 Exercise 1.1 (build the layers): passed" in capsys.readouterr().out


def test_build_layers_stub():
    message = fails(lab01.check_build_layers, stub, NotSolved)
    assert message.startswith("Exercise 1.1 (build the layers) is not solved yet")
    assert "raise NotImplementedError" in message


def test_build_layers_with_bias():
    message = fails(lab01.check_build_layers, lambda *a: build_layers(*a, bias=True), Incorrect)
    assert message == "layer 0 has a bias; create it with bias=False"


def test_build_layers_default_init():
    message = fails(lab01.check_build_layers, lambda *a: build_layers(*a, init=False), Incorrect)
    assert "do not look Kaiming-uniform" in message
    assert "nn.init.kaiming_uniform_(layer.weight)" in message


def test_build_layers_plain_list():
    message = fails(lab01.check_build_layers, lambda *a: build_layers(*a, container=list), Incorrect)
    assert message.startswith("build_layers must return an nn.ModuleList") and "got list" in message


def test_build_layers_wrong_count_and_shape():
    one_too_many = lambda n, *rest: build_layers(n + 1, *rest)
    assert fails(lab01.check_build_layers, one_too_many, Incorrect) == \
        "with n_layers=1 there should be 1 layers, got 2"

    def transposed(n_layers, d_in, d_hidden, n_classes):
        layers = build_layers(n_layers, d_in, d_hidden, n_classes)
        layers[0] = nn.Linear(layers[0].out_features, layers[0].in_features, bias=False)
        return layers
    message = fails(lab01.check_build_layers, transposed, Incorrect)
    assert "layer 0 should map 12 -> 3 features (weight shape (3, 12))" in message
    assert "got weight shape (12, 3)" in message


# --- 1.2 forward -----------------------------------------------------------------------------

def test_forward_correct(capsys):
    lab01.check_forward(forward)
    assert "\u2713 Exercise 1.2 (forward pass): passed" in capsys.readouterr().out


def test_forward_stub_with_hint():
    def hinted(layers, x):
        raise NotImplementedError("loop over the layers")
    message = fails(lab01.check_forward, hinted, NotSolved)
    assert message.startswith("Exercise 1.2 (forward pass) is not solved yet")
    assert message.endswith("\n  loop over the layers")


def test_forward_tanh_after_last_layer():
    def tanh_everywhere(layers, x):
        for layer in layers:
            x = torch.tanh(layer(x))
        return x
    message = fails(lab01.check_forward, tanh_everywhere, Incorrect)
    assert message.startswith("tanh is applied after the last layer too")


def test_forward_no_tanh():
    def linear_only(layers, x):
        for layer in layers:
            x = layer(x)
        return x
    message = fails(lab01.check_forward, linear_only, Incorrect)
    assert message.startswith("no tanh between the layers")


def test_forward_other_wrong_activation():
    def relu(layers, x):
        for layer in layers[:-1]:
            x = torch.relu(layer(x))
        return layers[-1](x)
    message = fails(lab01.check_forward, relu, Incorrect)
    assert message.startswith("with 3 layer(s) the output differs from layer -> tanh -> ... -> layer")


def test_forward_detached():
    message = fails(lab01.check_forward, lambda layers, x: forward(layers, x).detach(), Incorrect)
    assert message.startswith("the output carries no gradient")


def test_forward_wrong_shape_and_type():
    message = fails(lab01.check_forward, lambda layers, x: forward(layers, x).T, Incorrect)
    assert "shape (batch, n_classes) = (5, 4), got (4, 5)" in message
    message = fails(lab01.check_forward, lambda layers, x: forward(layers, x).tolist(), Incorrect)
    assert message == "forward must return a tensor, got list"


def learner_crashes(layers, x):
    return layers[0](x.T)  # a typical shape mistake


def test_forward_crash_is_incorrect_with_learner_traceback():
    with pytest.raises(Incorrect) as info:
        lab01.check_forward(learner_crashes)
    error = info.value
    assert str(error).startswith("Exercise 1.2 (forward pass): your code raised RuntimeError:")
    assert isinstance(error.__cause__, RuntimeError)
    lines = error._render_traceback_()
    assert lines[0] == f"\u2717 {error}"
    text = "\n".join(lines)
    assert "Your code raised this (innermost call last):" in text
    assert "in learner_crashes" in text and "layers[0](x.T)" in text
    assert "utils/checks" not in text.replace("\\", "/")  # no frames from inside the checks
    assert lines[-1].startswith("RuntimeError:")


# --- 1.3 evaluate ----------------------------------------------------------------------------

def test_evaluate_correct(capsys):
    lab01.check_evaluate(evaluate)
    assert "\u2713 Exercise 1.3 (evaluate): passed" in capsys.readouterr().out


def test_evaluate_stub():
    assert fails(lab01.check_evaluate, stub, NotSolved).startswith("Exercise 1.3 (evaluate) is not solved yet")


def test_evaluate_mean_of_batch_means():
    @torch.no_grad()
    def batch_means(model, x, y, batch_size):
        model.eval()
        losses = [F.cross_entropy(model(x[i:i + batch_size]), y[i:i + batch_size]).item()
                  for i in range(0, len(x), batch_size)]
        model.train()
        return sum(losses) / len(losses)
    message = fails(lab01.check_evaluate, batch_means, Incorrect)
    assert message.startswith("this is the mean of the per-batch means")
    assert "reduction='sum'" in message


def test_evaluate_not_restoring_train_mode():
    def stays_in_eval(model, x, y, batch_size):
        result = evaluate(model, x, y, batch_size)
        model.eval()
        return result
    message = fails(lab01.check_evaluate, stays_in_eval, Incorrect)
    assert message.startswith("evaluate must put the model back in training mode (model.train())")


def test_evaluate_returns_tensor():
    message = fails(lab01.check_evaluate, lambda *a: torch.tensor(evaluate(*a)), Incorrect)
    assert message == "evaluate should return a Python float (use .item()), got Tensor"


def test_evaluate_wrong_value():
    message = fails(lab01.check_evaluate, lambda *a: evaluate(*a) + 0.1, Incorrect)
    assert message.startswith("expected the mean cross-entropy over all 103 samples")


def test_evaluate_computes_gradients():
    def with_backward(model, x, y, batch_size):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.item()
    message = fails(lab01.check_evaluate, with_backward, Incorrect)
    assert message.startswith("evaluate computed gradients")


# --- the ExerciseError machinery -------------------------------------------------------------

def test_render_traceback_is_the_message_alone():
    with pytest.raises(NotSolved) as info:
        lab01.check_evaluate(stub)
    assert info.value.__cause__ is None
    assert info.value._render_traceback_() == [f"\u2717 {info.value}"]
    with pytest.raises(Incorrect) as info:
        with exercise("demo"):
            expect(False, "the specific diagnostic")
    assert info.value._render_traceback_() == ["\u2717 the specific diagnostic"]


def test_exercise_context(capsys):
    with exercise("demo"):
        expect(True, "unused")
    assert capsys.readouterr().out == "\u2713 demo: passed\n"
    with pytest.raises(Incorrect, match=r"^demo: your code raised KeyError: 'k'$"):
        with exercise("demo"):
            {}["k"]
    assert issubclass(NotSolved, ExerciseError) and issubclass(Incorrect, AssertionError)

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from check_helpers import fails, stub
from learner_hints import ROOT, learner_cells_hold_no_hint
from utils.checks import ExerciseError, Incorrect, NotSolved, expect, exercise, lab01


# --- correct solutions, as a learner would write them ---------------------------------------

def build_layers(n_layers, d_in, d_hidden, n_classes, bias=False, init=nn.init.kaiming_uniform_,
                 container=nn.ModuleList):
    widths = [d_in] + [d_hidden] * (n_layers - 1) + [n_classes]
    layers = container()
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layer = nn.Linear(fan_in, fan_out, bias=bias)
        if init:
            init(layer.weight)
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
    assert message.startswith("layer 0 (1024 -> 384) does not look Kaiming-uniform initialised: they look like "
                              "PyTorch's default init of nn.Linear")


@pytest.mark.parametrize("init", [lambda w: nn.init.kaiming_uniform_(w, nonlinearity="tanh"),
                                  lambda w: nn.init.kaiming_uniform_(w, nonlinearity="relu")],
                         ids=["tanh gain", "relu gain"])
def test_build_layers_accepts_the_allowed_gains(init, capsys):
    lab01.check_build_layers(lambda *a: build_layers(*a, init=init))
    assert "passed" in capsys.readouterr().out


def test_build_layers_wrong_inits():
    normal = fails(lab01.check_build_layers, lambda *a: build_layers(*a, init=nn.init.kaiming_normal_), Incorrect)
    assert "not spread evenly over a range (a normal distribution? kaiming_normal_?)" in normal
    fan_out = fails(lab01.check_build_layers,
                    lambda *a: build_layers(*a, init=lambda w: nn.init.kaiming_uniform_(w, mode="fan_out")), Incorrect)
    assert "the bound follows fan_out (384), not fan_in (1024)" in fan_out
    xavier = fails(lab01.check_build_layers, lambda *a: build_layers(*a, init=nn.init.xavier_uniform_), Incorrect)
    assert "b * sqrt(fan_in) = 2.0" in xavier and "2.449 (the default (ReLU) gain) or 2.887" in xavier


def test_build_layers_only_first_layer_initialised():
    def first_only(n_layers, d_in, d_hidden, n_classes):
        layers = build_layers(n_layers, d_in, d_hidden, n_classes, init=False)
        nn.init.kaiming_uniform_(layers[0].weight)
        return layers
    message = fails(lab01.check_build_layers, first_only, Incorrect)
    assert message.startswith("layer 1 (384 -> 384) does not look Kaiming-uniform initialised")


def test_build_layers_shared_layer_objects():
    def shared(n_layers, d_in, d_hidden, n_classes):
        layers = build_layers(min(n_layers, 2), d_in, d_hidden, n_classes)
        if n_layers > 2:
            hidden = nn.Linear(d_hidden, d_hidden, bias=False)
            nn.init.kaiming_uniform_(hidden.weight)
            layers = nn.ModuleList([layers[0]] + [hidden] * (n_layers - 2) + [layers[1]])
        return layers
    message = fails(lab01.check_build_layers, shared, Incorrect)
    assert message.startswith("with n_layers=4 some layers are the same object")


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


def test_evaluate_with_autograd_on():
    def with_grad(model, x, y, batch_size):
        return evaluate.__wrapped__(model, x, y, batch_size)  # the same loop, without torch.no_grad()
    message = fails(lab01.check_evaluate, with_grad, Incorrect)
    assert message.startswith("evaluate recorded an autograd graph for every batch")
    assert "torch.no_grad()" in message


def test_evaluate_without_eval_mode():
    @torch.no_grad()
    def dropout_on(model, x, y, batch_size):
        total = sum(F.cross_entropy(model(x[i:i + batch_size]), y[i:i + batch_size], reduction="sum").item()
                    for i in range(0, len(x), batch_size))
        return total / len(x)
    message = fails(lab01.check_evaluate, dropout_on, Incorrect)
    assert message.startswith("the model was in training mode while evaluating, so dropout")


def test_evaluate_ignores_batch_size():
    @torch.no_grad()
    def all_at_once(model, x, y, batch_size):
        model.eval()
        loss = F.cross_entropy(model(x), y).item()
        model.train()
        return loss
    message = fails(lab01.check_evaluate, all_at_once, Incorrect)
    assert message.startswith("the model was called on 103 samples at once with batch_size=10")


def test_evaluate_drops_the_last_batch():
    @torch.no_grad()
    def full_batches_only(model, x, y, batch_size):
        model.eval()
        starts = range(0, len(x) - batch_size + 1, batch_size)
        total = sum(F.cross_entropy(model(x[i:i + batch_size]), y[i:i + batch_size], reduction="sum").item()
                    for i in starts)
        model.train()
        return total / (len(starts) * batch_size)
    message = fails(lab01.check_evaluate, full_batches_only, Incorrect)
    assert message.startswith("the model saw 100 samples, but x has 103")


# --- 1.4 train_step --------------------------------------------------------------------------

def train_step(model, optimizer, x, y, order=("zero_grad", "backward", "step"), keep=lambda loss: loss.item()):
    loss = F.cross_entropy(model(x), y)
    for action in order:
        {"zero_grad": optimizer.zero_grad, "backward": loss.backward, "step": optimizer.step}[action]()
    return keep(loss)


def test_train_step_correct(capsys):
    lab01.check_train_step(train_step)
    lab01.check_train_step(lambda *a: train_step(*a, order=("backward", "step", "zero_grad")))
    assert capsys.readouterr().out.count("\u2713 Exercise 1.4 (the training step): passed") == 2


def test_train_step_stub():
    assert fails(lab01.check_train_step, stub, NotSolved).startswith("Exercise 1.4 (the training step) is not solved")


def test_train_step_without_zero_grad():
    message = fails(lab01.check_train_step, lambda *a: train_step(*a, order=("backward", "step")), Incorrect)
    assert message.startswith("the weights match a loop that never clears the gradients")


def test_train_step_zero_grad_between_backward_and_step_or_no_step():
    for order in (("backward", "zero_grad", "step"), ("zero_grad", "backward")):
        message = fails(lab01.check_train_step, lambda *a: train_step(*a, order=order), Incorrect)
        assert message.startswith("the weights did not change: after loss.backward() call optimizer.step()")


def test_train_step_wrong_loss():
    def nll_on_logits(model, optimizer, x, y):  # nll_loss expects log-probabilities, not logits
        loss = F.nll_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    message = fails(lab01.check_train_step, nll_on_logits, Incorrect)
    assert message.startswith("after 4 steps the weights differ from forward -> F.cross_entropy -> zero_grad")


def test_train_step_returns_tensor_or_nothing():
    message = fails(lab01.check_train_step, lambda *a: train_step(*a, keep=lambda loss: loss.detach()), Incorrect)
    assert message == "train_step should return the loss as a Python float, got Tensor: use loss.item()"
    message = fails(lab01.check_train_step, lambda *a: train_step(*a, keep=lambda loss: None), Incorrect)
    assert message.startswith("train_step returned None")


def test_train_step_in_eval_mode_or_without_autograd():
    def eval_mode(model, optimizer, x, y):
        model.eval()
        return train_step(model, optimizer, x, y)
    assert fails(lab01.check_train_step, eval_mode, Incorrect).startswith(
        "the model was in evaluation mode during a training step")

    def no_grad_forward(model, optimizer, x, y):
        with torch.no_grad():
            logits = model(x)
        loss = F.cross_entropy(logits.requires_grad_(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    assert fails(lab01.check_train_step, no_grad_forward, Incorrect).startswith(
        "the forward pass ran without autograd")


def test_train_step_loss_after_the_update():
    def loss_after(model, optimizer, x, y):
        train_step(model, optimizer, x, y)
        with torch.no_grad():
            return F.cross_entropy(model(x), y).item()
    message = fails(lab01.check_train_step, loss_after, Incorrect)
    assert message.startswith("over 4 steps the model was called 8 times")

    def wrong_loss(model, optimizer, x, y):
        train_step(model, optimizer, x, y)
        return 0.0
    message = fails(lab01.check_train_step, wrong_loss, Incorrect)
    assert message.startswith("the weights are right but the returned losses are not the loss of each batch")


def test_train_step_updates_one_layer_only():
    def last_layer_only(model, optimizer, x, y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.layers[-1].weight -= 0.3 * model.layers[-1].weight.grad
        return loss.item()
    message = fails(lab01.check_train_step, last_layer_only, Incorrect)
    assert message.startswith("the weights of layer(s) [0, 1] did not change")


def test_hints_are_shown_on_demand_and_absent_from_the_learner_edition(capsys):
    lab01.hint("1.4")
    assert "optimizer.zero_grad()" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no step-by-step hint for '9.9'"):
        lab01.hint("9.9")
    learner_cells_hold_no_hint(ROOT / "labs" / "01_mlp_cpu.ipynb", lab01.HINTS)


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

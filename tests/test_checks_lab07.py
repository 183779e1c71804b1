"""The checks of lab 07: right answers pass, the typical wrong ones fail with their own message."""
from __future__ import annotations

import math

import pytest
import torch

from check_helpers import fails
from utils import landscape
from utils.checks import Incorrect, NotSolved, lab07


# --- 7.1 linear scaling with warm-up ------------------------------------------------------------------

def right_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=base_lr / target, total_iters=warmup_steps)


def warmup_variant(rule="linear", start=None, total=lambda w: w, groups=slice(None), scheduler=True):
    def learner(optimizer, base_lr, base_batch, batch, warmup_steps):
        k = batch / base_batch
        target = base_lr * (k if rule == "linear" else math.sqrt(k) if rule == "sqrt" else 1)
        for group in optimizer.param_groups[groups]:
            group["lr"] = target
        if not scheduler:
            return None
        return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=start or base_lr / target,
                                                 total_iters=total(warmup_steps))
    return learner


def test_warmup_right_passes():
    lab07.check_warmup(right_warmup)


@pytest.mark.parametrize("wrong, message", [
    (warmup_variant(rule="none"), "the linear scaling rule gives"),
    (warmup_variant(rule="sqrt"), "the linear scaling rule gives"),
    (warmup_variant(start=0.1), "starts from the small batch's lr"),
    (warmup_variant(total=lambda w: w - 1), "it should at step"),
    (warmup_variant(scheduler=False), "return a scheduler from torch.optim.lr_scheduler"),
    (warmup_variant(groups=slice(0, 1)), "different learning rates: set every group's lr"),
], ids=["no scaling", "sqrt", "starts at 0.1", "one step short", "no scheduler", "first group only"])
def test_warmup_mistakes(wrong, message):
    assert message in fails(lab07.check_warmup, wrong, Incorrect)


# --- 7.2 one LARS step -----------------------------------------------------------------------------------

def lars(fallback=True, wd_in_denominator=True, new_v_in_w=True):
    def learner(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        denominator = g_norm + (weight_decay * w_norm if wd_in_denominator else 0) + eps
        local_lr = 1.0 if fallback and (w_norm == 0 or g_norm == 0) else trust_coefficient * w_norm / denominator
        if not fallback and w_norm == 0 and g_norm == 0:
            local_lr = w_norm / g_norm                      # 0 / 0
        new_v = momentum * v + lr * local_lr * (g + weight_decay * w)
        return w - (new_v if new_v_in_w else v), new_v
    return learner


def test_lars_right_passes():
    lab07.check_lars_step(lars())


@pytest.mark.parametrize("wrong, message", [
    (lars(wd_in_denominator=False), "new v differs from the rule"),
    (lars(new_v_in_w=False), "new v is right, but new w differs"),
], ids=["weight decay left out of the ratio", "old v subtracted"])
def test_lars_mistakes(wrong, message):
    assert message in fails(lab07.check_lars_step, wrong, Incorrect)


def test_lars_zero_norm_without_fallback():
    def no_fallback(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        local_lr = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
        new_v = momentum * v + lr * local_lr * (g + weight_decay * w)
        return w - new_v, new_v
    # A zero weight gives local_lr 0 instead of 1.0: the bias never learns.
    assert "a weight of zeros" in fails(lab07.check_lars_step, no_fallback, Incorrect)


# --- 7.3 filter normalisation ----------------------------------------------------------------------------

def test_filter_normalize_reference_passes():
    lab07.check_filter_normalize(landscape.filter_normalize)


def whole_tensor(direction, model):
    return [torch.zeros_like(d) if w.dim() <= 1 else d * (w.detach().norm() / d.norm())
            for d, w in zip(direction, model.parameters())]


def keeps_biases(direction, model):
    out = landscape.filter_normalize(direction, model)
    return [d.clone() if w.dim() <= 1 else o for d, o, w in zip(direction, out, model.parameters())]


def divides_by_zero(direction, model):
    out = []
    for d, w in zip(direction, model.parameters()):
        if w.dim() <= 1:
            out.append(torch.zeros_like(d))
            continue
        d_norm = d.reshape(d.shape[0], -1).norm(dim=1, keepdim=True)
        w_norm = w.detach().reshape(w.shape[0], -1).norm(dim=1, keepdim=True)
        out.append((d.reshape(d.shape[0], -1) / d_norm * w_norm).reshape(d.shape))
    return out


def in_place(direction, model):
    for d, n in zip(direction, landscape.filter_normalize(direction, model)):
        d.copy_(n)
    return direction


def the_weights(direction, model):
    return [torch.zeros_like(w) if w.dim() <= 1 else w.detach().clone() for w in model.parameters()]


@pytest.mark.parametrize("wrong, message", [
    (whole_tensor, "you scaled the whole tensor"),
    (keeps_biases, "is 1-D (a bias or a scale)"),
    (divides_by_zero, "has nan or inf"),
    (in_place, "changed the direction it was given"),
    (the_weights, "do not replace it"),
], ids=["whole tensor", "biases kept", "0 / 0", "in place", "weights returned"])
def test_filter_normalize_mistakes(wrong, message):
    assert message in fails(lab07.check_filter_normalize, wrong, Incorrect)


# --- 7.4 the critical batch --------------------------------------------------------------------------------

def right_critical(batch_sizes, steps):
    kept = [(b, s) for b, s in zip(batch_sizes, steps) if s is not None]
    return min(b * s for b, s in kept) / min(s for _, s in kept)


def test_critical_batch_right_passes():
    lab07.check_critical_batch(right_critical)


def most_examples(batch_sizes, steps):
    kept = [(b, s) for b, s in zip(batch_sizes, steps) if s is not None]
    return max(b * s for b, s in kept) / min(s for _, s in kept)


def first_listed(batch_sizes, steps):
    kept = [(b, s) for b, s in zip(batch_sizes, steps) if s is not None]
    return kept[0][0] * kept[0][1] / min(s for _, s in kept)


def keeps_none(batch_sizes, steps):
    return min(b * s for b, s in zip(batch_sizes, steps)) / min(steps)


def last_is_fewest_steps(batch_sizes, steps):
    kept = [(b, s) for b, s in zip(batch_sizes, steps) if s is not None]
    return min(b * s for b, s in kept) / kept[-1][1]


@pytest.mark.parametrize("wrong, message", [
    (most_examples, "not the most"),
    (first_listed, "not those of the first batch size listed"),
    (keeps_none, "your code raised TypeError"),
    (last_is_fewest_steps, "you read B_crit"),
], ids=["max examples", "first listed", "None kept", "last run's steps"])
def test_critical_batch_mistakes(wrong, message):
    assert message in fails(lab07.check_critical_batch, wrong, Incorrect)


@pytest.mark.parametrize("check", [lab07.check_warmup, lab07.check_lars_step, lab07.check_filter_normalize,
                                   lab07.check_critical_batch])
def test_stubs_are_not_solved(check):
    def stub(*args, **kwargs):
        raise NotImplementedError("Hint: x")
    assert "not solved yet" in fails(check, stub, NotSolved)


def test_step_by_step_hints_exist_for_every_exercise():
    assert sorted(lab07.HINTS) == ["7.1", "7.2", "7.3", "7.4"]
    with pytest.raises(ValueError, match="there is one for"):
        lab07.hint("9.9")

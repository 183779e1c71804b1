"""utils.optim: LARS, LAMB and NovoGrad against issue 10's update rules, worked out by hand on tiny
tensors (float64, so a wrong term shows far above rounding), and the warm-up schedule's learning rates.

Most cases use w = [3, 4] (norm 5) and g = [0.6, 0.8] (norm 1) with eps=0, so the expected
numbers can be read off the comments.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.optim.lr_scheduler import StepLR

from utils.optim import LAMB, LARS, NovoGrad, linear_warmup

F64 = torch.float64


def param(*values) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=F64))


def set_grad(p, *values) -> None:
    p.grad = torch.tensor(values, dtype=F64)


def close(p, *expected) -> None:
    assert p.dtype == F64
    torch.testing.assert_close(p.detach(), torch.tensor(expected, dtype=F64), rtol=0, atol=1e-12)


# --- LARS --------------------------------------------------------------------------------------

def test_lars_two_steps_without_weight_decay():
    w = param(3.0, 4.0)
    opt = LARS([w], lr=0.5, momentum=0.9, trust_coefficient=0.1, eps=0.0)
    set_grad(w, 0.6, 0.8)
    opt.step()
    # local_lr = 0.1 * 5 / 1 = 0.5; v = 0.5 * 0.5 * g = [0.15, 0.2]; w = [2.85, 3.8]
    close(w, 2.85, 3.8)
    torch.testing.assert_close(opt.state[w]["momentum_buffer"], torch.tensor([0.15, 0.2], dtype=F64))
    set_grad(w, 0.6, 0.8)
    opt.step()
    # ||w|| = 4.75, local_lr = 0.475; v = 0.9 * [0.15, 0.2] + 0.5 * 0.475 * g = [0.2775, 0.37]
    close(w, 2.85 - 0.2775, 3.8 - 0.37)


def test_lars_weight_decay_enters_the_trust_ratio_and_the_step():
    w = param(3.0, 4.0)
    opt = LARS([w], lr=0.5, momentum=0.9, weight_decay=0.5, trust_coefficient=0.1, eps=0.0)
    set_grad(w, 0.6, 0.8)
    opt.step()
    # local_lr = 0.1 * 5 / (1 + 0.5 * 5) = 1/7; g + 0.5 w = [2.1, 2.8]; v = 0.5/7 * [2.1, 2.8] = [0.15, 0.2]
    close(w, 2.85, 3.8)
    set_grad(w, 0.0, 1.0)
    opt.step()
    # ||w|| = 4.75: local_lr = 0.475 / (1 + 2.375); g + 0.5 w = [1.425, 2.9]
    local_lr = 0.475 / 3.375
    close(w, 2.85 - (0.9 * 0.15 + 0.5 * local_lr * 1.425), 3.8 - (0.9 * 0.2 + 0.5 * local_lr * 2.9))


def test_lars_zero_weight_uses_local_lr_one():
    w = param(0.0, 0.0)
    opt = LARS([w], lr=0.5, trust_coefficient=0.1)
    set_grad(w, 0.6, 0.8)
    opt.step()
    close(w, -0.3, -0.4)          # v = 0.5 * 1.0 * g (the formula would give local_lr = 0: no step ever)


def test_lars_zero_gradient_uses_local_lr_one():
    still, decayed = param(3.0, 4.0), param(3.0, 4.0)
    opt = LARS([{"params": [still]}, {"params": [decayed], "weight_decay": 0.2}], lr=0.5, trust_coefficient=0.1)
    set_grad(still, 0.0, 0.0)
    set_grad(decayed, 0.0, 0.0)
    opt.step()
    close(still, 3.0, 4.0)
    # local_lr = 1.0, not 0.1 * 5 / (0 + 0.2 * 5) = 0.5: v = 0.5 * 1.0 * 0.2 * w = 0.1 w
    close(decayed, 2.7, 3.6)


def test_lars_default_eps_is_in_the_denominator():
    w = param(3.0, 4.0)
    opt = LARS([w], lr=1.0, trust_coefficient=0.1, eps=0.25)
    set_grad(w, 0.6, 0.8)
    opt.step()
    local_lr = 0.5 / 1.25        # 0.1 * 5 / (1 + 0 + 0.25)
    close(w, 3.0 - local_lr * 0.6, 4.0 - local_lr * 0.8)
    assert LARS([param(1.0)], lr=0.1).defaults == dict(lr=0.1, momentum=0.9, weight_decay=0.0,
                                                       trust_coefficient=0.001, eps=1e-8)


# --- LAMB --------------------------------------------------------------------------------------

def test_lamb_two_steps_with_bias_correction():
    w = param(3.0, 4.0)
    opt = LAMB([w], lr=0.1, betas=(0.9, 0.999), eps=0.0)
    set_grad(w, 0.6, 0.8)
    opt.step()
    # m_hat = g, v_hat = g^2: r = [1, 1]; ratio = 5 / sqrt(2)
    a = 0.1 * 5 / math.sqrt(2)
    close(w, 3.0 - a, 4.0 - a)
    set_grad(w, 0.3, -0.4)
    opt.step()
    m = [0.9 * 0.1 * 0.6 + 0.1 * 0.3, 0.9 * 0.1 * 0.8 + 0.1 * -0.4]
    v = [0.999 * 0.001 * 0.36 + 0.001 * 0.09, 0.999 * 0.001 * 0.64 + 0.001 * 0.16]
    r = [(mi / (1 - 0.9 ** 2)) / math.sqrt(vi / (1 - 0.999 ** 2)) for mi, vi in zip(m, v)]
    ratio = math.hypot(3.0 - a, 4.0 - a) / math.hypot(*r)
    close(w, 3.0 - a - 0.1 * ratio * r[0], 4.0 - a - 0.1 * ratio * r[1])
    assert opt.state[w]["step"] == 2


def test_lamb_weight_decay_is_added_to_the_update_before_the_ratio():
    w = param(3.0, 4.0)
    opt = LAMB([w], lr=0.1, eps=0.0, weight_decay=0.1)
    set_grad(w, 0.6, 0.8)
    opt.step()
    u = [1 + 0.3, 1 + 0.4]                     # r + 0.1 * w
    ratio = 5 / math.hypot(*u)
    close(w, 3.0 - 0.1 * ratio * u[0], 4.0 - 0.1 * ratio * u[1])


def test_lamb_zero_weight_and_zero_gradient_use_ratio_one():
    zero_w, zero_g, zero_g_decayed = param(0.0, 0.0), param(3.0, 4.0), param(3.0, 4.0)
    opt = LAMB([{"params": [zero_w, zero_g]}, {"params": [zero_g_decayed], "weight_decay": 0.1}], lr=0.1)
    set_grad(zero_w, 0.6, 0.8)
    set_grad(zero_g, 0.0, 0.0)
    set_grad(zero_g_decayed, 0.0, 0.0)
    opt.step()
    r = [0.6 / (0.6 + 1e-6), 0.8 / (0.8 + 1e-6)]   # m_hat / (sqrt(v_hat) + eps) with the default eps
    close(zero_w, -0.1 * r[0], -0.1 * r[1])   # ratio 1.0, not ||w|| / ||u|| = 0
    close(zero_g, 3.0, 4.0)                   # u = 0
    close(zero_g_decayed, 3.0 * 0.9, 4.0 * 0.9)   # u = 0.1 w, ratio 10: w - 0.1 * 10 * 0.1 w


# --- NovoGrad ----------------------------------------------------------------------------------

def test_novograd_two_steps():
    w = param(3.0, 4.0)
    opt = NovoGrad([w], lr=0.1, betas=(0.95, 0.98), eps=0.0)
    set_grad(w, 0.6, 0.8)
    opt.step()
    # v = ||g||^2 = 1 (not 0.02); m = g / 1
    close(w, 3.0 - 0.06, 4.0 - 0.08)
    set_grad(w, 0.0, 2.0)
    opt.step()
    v = 0.98 * 1 + 0.02 * 4
    m = [0.95 * 0.6 + 0.0, 0.95 * 0.8 + 2.0 / math.sqrt(v)]
    close(w, 2.94 - 0.1 * m[0], 3.92 - 0.1 * m[1])
    torch.testing.assert_close(opt.state[w]["exp_avg_sq"], torch.tensor(v, dtype=F64))


def test_novograd_weight_decay_enters_the_first_moment():
    w = param(3.0, 4.0)
    opt = NovoGrad([w], lr=0.1, eps=0.0, weight_decay=0.5)
    set_grad(w, 0.6, 0.8)
    opt.step()
    close(w, 3.0 - 0.1 * (0.6 + 1.5), 4.0 - 0.1 * (0.8 + 2.0))
    set_grad(w, 0.6, 0.8)
    opt.step()
    w1 = [3.0 - 0.21, 4.0 - 0.28]
    m = [0.95 * 2.1 + 0.6 + 0.5 * w1[0], 0.95 * 2.8 + 0.8 + 0.5 * w1[1]]   # v stays 1
    close(w, w1[0] - 0.1 * m[0], w1[1] - 0.1 * m[1])


def test_novograd_zero_weight_and_zero_gradient():
    zero_w, zero_g = param(0.0, 0.0), param(3.0, 4.0)
    opt = NovoGrad([zero_w, zero_g], lr=0.1, weight_decay=0.0)
    set_grad(zero_w, 0.6, 0.8)
    set_grad(zero_g, 0.0, 0.0)
    opt.step()
    s = 1 / (1 + 1e-8)
    close(zero_w, -0.06 * s, -0.08 * s)
    close(zero_g, 3.0, 4.0)                   # 0 / (0 + eps) = 0: no step, no nan


# --- what all three share ----------------------------------------------------------------------

OPTIMIZERS = [(LARS, dict(momentum=0.9, trust_coefficient=0.02)), (LAMB, {}), (NovoGrad, {})]


@pytest.mark.parametrize("cls, extra", OPTIMIZERS)
def test_groups_use_their_own_settings(cls, extra):
    """Two groups with different settings step exactly as two optimisers with those settings."""
    a, b = param(3.0, 4.0), param(-1.0, 2.0, 0.5)
    a_alone, b_alone = param(3.0, 4.0), param(-1.0, 2.0, 0.5)
    together = cls([{"params": [a]}, {"params": [b], "lr": 0.03, "weight_decay": 0.1}], lr=0.2, **extra)
    apart = [cls([a_alone], lr=0.2, **extra), cls([b_alone], lr=0.03, weight_decay=0.1, **extra)]
    for grads in ([(0.6, 0.8), (0.1, -0.2, 0.3)], [(0.5, 0.1), (-0.4, 0.0, 0.2)]):
        for p, q, g in ((a, a_alone, grads[0]), (b, b_alone, grads[1])):
            set_grad(p, *g)
            set_grad(q, *g)
        together.step()
        for opt in apart:
            opt.step()
    torch.testing.assert_close(a, a_alone, rtol=0, atol=0)
    torch.testing.assert_close(b, b_alone, rtol=0, atol=0)
    assert not torch.equal(a.detach(), torch.tensor([3.0, 4.0], dtype=F64))


@pytest.mark.parametrize("cls, extra", OPTIMIZERS)
def test_parameter_without_gradient_is_untouched(cls, extra):
    moved, frozen = param(3.0, 4.0), param(1.0, 1.0)
    opt = cls([moved, frozen], lr=0.1, weight_decay=0.5, **extra)
    set_grad(moved, 0.6, 0.8)
    opt.step()
    close(frozen, 1.0, 1.0)                   # weight decay would have moved it
    assert frozen not in opt.state
    assert not torch.equal(moved.detach(), torch.tensor([3.0, 4.0], dtype=F64))


@pytest.mark.parametrize("cls, extra", OPTIMIZERS)
def test_step_runs_the_closure_with_gradients_on(cls, extra):
    w = param(3.0, 4.0)
    opt = cls([w], lr=0.1, **extra)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 25.0
    assert w.norm().item() < 5.0


@pytest.mark.parametrize("cls, extra, lr", [(LARS, {}, 10.0), (LAMB, {}, 0.05), (NovoGrad, {}, 0.01)])
def test_optimizers_train_a_tiny_model(cls, extra, lr):
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x[:, :2].sum(1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = cls(model.parameters(), lr=lr, **extra)
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0], losses[::10]


@pytest.mark.parametrize("make, words", [
    (lambda p: LARS(p, lr=-0.1), "lr"),
    (lambda p: LARS(p, lr=0.1, momentum=1.0), "momentum"),
    (lambda p: LARS(p, lr=0.1, trust_coefficient=0.0), "trust_coefficient"),
    (lambda p: LARS(p, lr=0.1, weight_decay=-1e-4), "weight_decay"),
    (lambda p: LARS([{"params": p, "lr": -1.0}], lr=0.1), "lr"),
    (lambda p: LAMB(p, lr=0.1, betas=(0.9, 1.0)), "betas[1]"),
    (lambda p: LAMB(p, lr=0.1, betas=0.9), "pair"),
    (lambda p: LAMB(p, lr=0.1, eps=-1.0), "eps"),
    (lambda p: NovoGrad(p, lr=float("nan")), "lr"),
    (lambda p: NovoGrad([{"params": p, "betas": (-0.1, 0.9)}], lr=0.1), "betas[0]"),
])
def test_bad_settings_raise_a_value_error_naming_them(make, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        make([param(1.0)])


def test_a_group_added_later_is_checked_too():
    opt = LAMB([param(1.0)], lr=0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        opt.add_param_group({"params": [param(2.0)], "weight_decay": -0.5})


# --- warm-up -----------------------------------------------------------------------------------

def lrs_of(optimizer, scheduler, steps):
    """The lr of each group at optimizer steps 0..steps-1, stepping the scheduler after each."""
    seen = []
    for _ in range(steps):
        seen.append([round(group["lr"], 12) for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return seen


def test_linear_warmup_reaches_the_target_at_step_warmup_steps():
    opt = torch.optim.SGD([{"params": [param(1.0)]}, {"params": [param(1.0)], "lr": 0.08}], lr=0.8)
    sched = linear_warmup(opt, warmup_steps=4, start_factor=0.25)
    assert lrs_of(opt, sched, 7) == [[0.2, 0.02], [0.35, 0.035], [0.5, 0.05], [0.65, 0.065],
                                      [0.8, 0.08], [0.8, 0.08], [0.8, 0.08]]


def test_linear_warmup_default_start_factor():
    opt = torch.optim.SGD([param(1.0)], lr=1.0)
    sched = linear_warmup(opt, warmup_steps=2)
    assert lrs_of(opt, sched, 3) == [[0.1], [0.55], [1.0]]


def test_linear_warmup_then_another_schedule():
    opt = torch.optim.SGD([param(1.0)], lr=0.8)
    after = StepLR(opt, step_size=2, gamma=0.5)
    sched = linear_warmup(opt, warmup_steps=3, start_factor=0.5, after=after)
    got = [lr for (lr,) in lrs_of(opt, sched, 8)]
    assert got == pytest.approx([0.4, 0.5333333333, 0.6666666667, 0.8, 0.8, 0.4, 0.4, 0.2])


def test_no_warmup_keeps_the_lr_or_hands_over_at_once():
    opt = torch.optim.SGD([param(1.0)], lr=0.3)
    assert lrs_of(opt, linear_warmup(opt, warmup_steps=0), 3) == [[0.3]] * 3
    opt = torch.optim.SGD([param(1.0)], lr=0.3)
    after = StepLR(opt, step_size=1, gamma=0.5)
    assert linear_warmup(opt, 0, after=after) is after


@pytest.mark.parametrize("kwargs, words", [
    (dict(warmup_steps=-1), "warmup_steps"), (dict(warmup_steps=2.5), "warmup_steps"),
    (dict(warmup_steps=4, start_factor=0.0), "start_factor"), (dict(warmup_steps=4, start_factor=2.0), "start_factor"),
])
def test_linear_warmup_bad_settings(kwargs, words):
    opt = torch.optim.SGD([param(1.0)], lr=0.3)
    with pytest.raises(ValueError, match=words):
        linear_warmup(opt, **kwargs)


def test_linear_warmup_refuses_a_scheduler_of_another_optimizer():
    opt, other = (torch.optim.SGD([param(1.0)], lr=0.3) for _ in range(2))
    with pytest.raises(ValueError, match="same optimizer"):
        linear_warmup(opt, 4, after=StepLR(other, step_size=1))

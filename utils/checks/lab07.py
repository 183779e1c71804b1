"""Checks for labs/07_batch_size.ipynb: each runs the learner's function on small, awkward inputs and
compares with the course's reference (``utils.optim``, ``utils.landscape``) or with values computed here.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import exercise, expect, show_hint

HINTS = {
    "7.1": """Step by step:
1. The target learning rate is base_lr * batch / base_batch (the linear scaling rule).
2. Set it in every param group of the optimizer (group["lr"] = ...): schedulers scale the lr they find there.
3. Return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=base_lr / target, end_factor=1.0,
   total_iters=warmup_steps): step 0 runs at base_lr, step warmup_steps is the first at the target.""",
    "7.2": """Step by step, for one tensor:
1. w_norm = torch.linalg.vector_norm(w), g_norm likewise.
2. local_lr = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps), but 1.0 when
   w_norm or g_norm is 0 (torch.where, or a Python if on .item()).
3. v_new = momentum * v + lr * local_lr * (g + weight_decay * w); w_new = w - v_new. Return both.""",
    "7.3": """Step by step, for each pair (d, w) of direction and parameter:
1. A 1-D parameter (bias): a zero direction.
2. Otherwise view both as (filters, rest) with reshape(shape[0], -1); take each row's norm.
3. Multiply each filter of d by ||w filter|| / ||d filter||, and leave a filter whose ||d filter|| is 0 at 0.""",
    "7.4": """Step by step:
1. Keep the pairs (B, S) whose S is not None (the run reached the target).
2. S_min = the fewest steps of any batch size; E_min = the fewest examples, min over B of B * S.
3. B_crit = E_min / S_min.""",
}


def hint(name: str) -> None:
    """Print the step-by-step hint of exercise ``name`` (e.g. ``"7.2"``)."""
    show_hint(HINTS, name)


# --- 7.1 linear scaling with warm-up ----------------------------------------------------------------


def _learning_rates(scheduler_fn, base_lr, base_batch, batch, warmup_steps, steps) -> tuple[list[float], object]:
    param = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param, ], lr=base_lr, momentum=0.9)
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": base_lr})
    scheduler = scheduler_fn(optimizer, base_lr, base_batch, batch, warmup_steps)
    rates = []
    for _ in range(steps):
        rates.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return rates, scheduler


def check_warmup(linear_scaling_with_warmup) -> None:
    from torch.optim.lr_scheduler import LRScheduler

    with exercise("7.1"):
        for base_lr, base_batch, batch, warmup in ((0.1, 64, 1024, 10), (0.05, 32, 96, 3), (0.2, 256, 256, 4)):
            target = base_lr * batch / base_batch
            rates, scheduler = _learning_rates(linear_scaling_with_warmup, base_lr, base_batch, batch, warmup,
                                               warmup + 4)
            expect(isinstance(scheduler, LRScheduler),
                   f"7.1: return a scheduler from torch.optim.lr_scheduler (got {type(scheduler).__name__}); "
                   f"the training loop calls its step() after every optimizer step.")
            expect(all(len(set(step)) == 1 for step in rates),
                   "7.1: the optimizer's two param groups got different learning rates: set every group's lr.")
            lrs = [step[0] for step in rates]
            expect(math.isclose(lrs[-1], target, rel_tol=1e-6),
                   f"7.1 (base lr {base_lr} at batch {base_batch}, batch {batch}): after the warm-up the lr is "
                   f"{lrs[-1]:.6g}, the linear scaling rule gives {target:.6g} = base_lr * batch / base_batch.")
            expect(math.isclose(lrs[0], base_lr, rel_tol=1e-6),
                   f"7.1 (batch {batch}): the first step runs at {lrs[0]:.6g}; Goyal et al.'s warm-up starts from "
                   f"the small batch's lr, {base_lr:.6g} (start_factor = base_lr / target).")
            want = [target * (base_lr / target + (1 - base_lr / target) * min(i, warmup) / warmup)
                    for i in range(warmup + 4)]
            first_full = next(i for i, lr in enumerate(lrs) if math.isclose(lr, target, rel_tol=1e-6))
            expect(first_full == warmup or batch == base_batch,
                   f"7.1 (warm-up of {warmup} steps): the lr first reaches the target at step {first_full}; it should "
                   f"at step {warmup} (the steps are counted from 0: total_iters = warmup_steps).")
            worst = max(abs(a - b) for a, b in zip(lrs, want))
            expect(worst <= 1e-9 * max(1.0, target),
                   f"7.1: the lrs over the warm-up are {[round(v, 6) for v in lrs]}, a straight line from base_lr to "
                   f"the target gives {[round(v, 6) for v in want]}.")


# --- 7.2 one LARS step ------------------------------------------------------------------------------


def _reference_lars(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
    from utils.optim import LARS

    param = nn.Parameter(w.clone())
    param.grad = g.clone()
    optimizer = LARS([param], lr=lr, momentum=momentum, weight_decay=weight_decay,
                     trust_coefficient=trust_coefficient, eps=eps)
    optimizer.state[param]["momentum_buffer"] = v.clone()
    optimizer.step()
    return param.detach(), optimizer.state[param]["momentum_buffer"]


def _lars_cases():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64) * 3
    grad = torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.01
    v = torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.1
    base = dict(lr=2.0, momentum=0.9, weight_decay=0.0, trust_coefficient=0.02, eps=1e-8)
    return [("no weight decay", w, grad, v, base),
            ("weight decay 0.01", w, grad, v, {**base, "weight_decay": 0.01}),
            ("momentum 0, v starts at zero", w, grad, torch.zeros_like(v), {**base, "momentum": 0.0}),
            ("a weight of zeros (a bias at the start)", torch.zeros(4, dtype=torch.float64),
             torch.full((4,), 0.5, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), base),
            ("a gradient of zeros", w, torch.zeros_like(grad), v, {**base, "weight_decay": 0.01})]


def check_lars_step(lars_step) -> None:
    with exercise("7.2"):
        for label, w, g, v, settings in _lars_cases():
            want_w, want_v = _reference_lars(w, g, v, **settings)
            got = lars_step(w.clone(), g.clone(), v.clone(), **settings)
            expect(isinstance(got, tuple) and len(got) == 2, f"7.2: return (new_w, new_v), got {type(got).__name__}")
            got_w, got_v = (torch.as_tensor(t, dtype=torch.float64) for t in got)
            expect(bool(torch.isfinite(got_w).all() and torch.isfinite(got_v).all()),
                   f"7.2 ({label}): your step gives nan or inf: when ||w|| or ||g|| is 0, local_lr is 1.0 "
                   f"(0 / 0 otherwise).")
            if not torch.allclose(got_v, want_v, rtol=1e-9, atol=1e-12):
                expect(False, f"7.2 ({label}, {settings}): new v differs from the rule by up to "
                              f"{(got_v - want_v).abs().max().item():.3g}: v = momentum * v + lr * local_lr * "
                              f"(g + weight_decay * w), local_lr = trust_coefficient * ||w|| / "
                              f"(||g|| + weight_decay * ||w|| + eps).")
            expect(torch.allclose(got_w, want_w, rtol=1e-9, atol=1e-12),
                   f"7.2 ({label}): new v is right, but new w differs by up to {(got_w - want_w).abs().max().item():.3g}: "
                   f"w = w - v (with the new v).")


# --- 7.3 filter normalisation -----------------------------------------------------------------------


class _Awkward(nn.Module):
    """A conv layer, a linear layer with one filter of zeros, a bias and a lone 1-D scale."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.fc = nn.Linear(5, 4, bias=False)
        self.scale = nn.Parameter(torch.tensor([2.0, -1.0]))
        with torch.no_grad():
            self.fc.weight[2] = 0.0
            self.fc.weight.mul_(torch.tensor([[1.0], [10.0], [1.0], [0.01]]))


def check_filter_normalize(filter_normalize) -> None:
    from utils import landscape

    with exercise("7.3"):
        torch.manual_seed(3)
        model = _Awkward()
        direction = landscape.random_direction(model, seed=5)
        direction[1][0] = 0.0                               # a filter of zeros in the direction too
        before = [d.clone() for d in direction]
        want = landscape.filter_normalize(direction, model)
        got = filter_normalize(direction, model)
        expect(all(torch.equal(a, b) for a, b in zip(before, direction)),
               "7.3: your function changed the direction it was given: return new tensors.")
        got = list(got)
        expect(len(got) == len(want) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(got, want)),
               "7.3: return one tensor per model.parameters(), each of its parameter's shape.")
        names = [name for name, _ in model.named_parameters()]
        for name, a, b, w in zip(names, got, want, model.parameters()):
            expect(bool(torch.isfinite(a).all()), f"7.3: {name}'s direction has nan or inf: a filter whose "
                                                  f"direction is zero stays zero (no 0 / 0).")
            if w.dim() <= 1:
                expect(bool((a == 0).all()), f"7.3: {name} is 1-D (a bias or a scale): Li et al. give it a zero "
                                             f"direction, so it stays at its trained value.")
                continue
            expect(not torch.allclose(a, w.detach()), f"7.3: {name}'s direction is the weights themselves: scale "
                                                      f"each filter of the given direction, do not replace it.")
            got_norms = a.reshape(a.shape[0], -1).norm(dim=1)
            want_norms = b.reshape(b.shape[0], -1).norm(dim=1)
            if not torch.allclose(got_norms, want_norms, rtol=1e-5, atol=1e-7):
                whole = math.isclose(a.norm().item(), w.norm().item(), rel_tol=1e-4)
                expect(False, f"7.3: {name}'s filters have norms {got_norms.tolist()}, the weights' filters "
                              f"{want_norms.tolist()}"
                              + (": you scaled the whole tensor, not each filter (one row of a Linear weight, "
                                 "one output channel of a Conv weight)." if whole else "."))
            expect(torch.allclose(a, b, rtol=1e-5, atol=1e-7),
                   f"7.3: {name}: the norms are right but not the direction: scale each filter of the given "
                   f"direction, do not replace it by another.")


# --- 7.4 the critical batch from a sweep -------------------------------------------------------------


def check_critical_batch(critical_batch) -> None:
    with exercise("7.4"):
        cases = [("a sweep listed out of order", [512, 32, 128, 2048, 8], [1500.0, 9000.0, 3000.0, 1125.0, 33000.0]),
                 ("a run that never reached the target", [16, 64, 256, 1024], [None, 900, 400, 380]),
                 ("the fewest examples not at the smallest batch", [8, 16, 32], [4000, 1500, 1200])]
        for label, batches, steps in cases:
            kept = [(b, s) for b, s in zip(batches, steps) if s is not None]
            s_min = min(s for _, s in kept)
            e_min = min(b * s for b, s in kept)
            want = e_min / s_min
            got = critical_batch(list(batches), list(steps))
            expect(isinstance(got, (int, float)) and math.isfinite(got),
                   f"7.4 ({label}): return the critical batch size as a number, got {got!r}")
            if not math.isclose(got, want, rel_tol=1e-9):
                expect(not math.isclose(got, max(b * s for b, s in kept) / s_min, rel_tol=1e-9),
                       f"7.4 ({label}): E_min is the fewest examples, min over the batch sizes of B * S, not the most.")
                expect(not math.isclose(got, kept[0][0] * kept[0][1] / s_min, rel_tol=1e-9) or kept[0][0] * kept[0][1] == e_min,
                       f"7.4 ({label}): E_min is the fewest examples over all batch sizes, not those of the first "
                       f"batch size listed.")
                expect(False, f"7.4 ({label}, batch sizes {batches}, steps {steps}): you read B_crit = {got:.6g}; "
                              f"E_min / S_min = {e_min:g} / {s_min:g} = {want:.6g}.")

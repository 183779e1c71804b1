"""Checks for labs/07_batch_size.ipynb: each runs the learner's function on small, awkward inputs and
compares with the course's reference (``utils.optim``, ``utils.labs.lab07``) or with values computed here.

The exercises are numbered in the notebook's order: 7.1 the critical batch, 7.2 linear scaling with
warm-up, 7.3 filter normalisation, 7.4 one LARS step. The inputs are irregular on purpose (batch ratios
that are not whole numbers, a batch below the base batch, an optimizer whose groups hold other lrs than
base_lr, momentum buffers that are not zero, several eps, a sweep whose largest batch is not the fastest,
one sweep drawn at random at each call, a model whose state_dict holds buffers), every result is copied
before it is compared, so that a lazy result cannot change afterwards what the check saw, and the inputs
are compared after the call, so that a function that writes into them is caught.
"""
from __future__ import annotations

import math
import numbers
import random

import torch
from torch import nn

from . import Incorrect, exercise, expect, hint_for

HINTS = {
    "7.1": """Step by step:
1. Leave out the runs whose steps are None: they never reached the target.
2. S_min and E_min are two minima over the runs that are left, one counted in steps, one in examples
   (a run of S steps at batch B sees B times S examples). In a noisy sweep neither need sit at the
   largest or the smallest batch: take the minimum over every run.
3. Put S = 2 S_min into McCandlish et al.'s relation: what is E then? The batch size of that run is
   its examples over its steps.""",
    "7.2": """Step by step:
1. The scaled learning rate is the linear scaling rule's of section 2.
2. Write it into every param group before you build the scheduler: a scheduler multiplies the lr it
   finds in the groups when it is created.
3. Read help(torch.optim.lr_scheduler.LinearLR): its factor moves in a straight line from start_factor
   to end_factor over total_iters calls of step(). Work out the start factor that makes step 0 run at
   base_lr, and the total_iters that makes step warmup_steps the first at the scaled lr.
4. LinearLR accepts start factors in (0, 1] only. Below the base batch the scaled lr is already
   below base_lr: there is nothing to warm up, so that run starts at the scaled lr.""",
    "7.3": """Step by step, for each pair (d, w) of direction and parameter:
1. A 1-D parameter (a bias): a zero direction.
2. Otherwise see both as a matrix with one row per filter (Tensor.reshape or Tensor.flatten with
   start_dim=1) and take each row's norm (torch.linalg.vector_norm with dim).
3. Rescale each row of d so that its norm becomes that of the same row of w; a row of d whose norm
   is 0 stays 0 (torch.where keeps the 0 / 0 out). Return new tensors, in a list.""",
    "7.4": """Step by step, for one tensor:
1. The norms of the whole tensor w and of its gradient g (torch.linalg.vector_norm).
2. The local learning rate: the trust coefficient times the weights' norm over the norm of the update
   direction, which You et al. take as the sum of the norms of its two parts (the gradient and the
   weight-decay term); eps joins that sum. When either norm of step 1 is 0 it is 1.0 instead.
3. Heavy-ball momentum: the buffer decays by the momentum argument, then takes the global lr times
   the local lr times the update direction (the gradient with the weight-decay term added).
4. The weights move against the new buffer. Return both, as new tensors.""",
}


hint = hint_for(HINTS)  # lab07.hint("7.1") prints that exercise's step-by-step hint


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


# --- 7.1 the critical batch from a sweep -------------------------------------------------------------

CRITICAL_CASES = [
    ("a sweep listed out of order", [512, 32, 128, 2048, 8], [1500, 9000, 3000, 1125, 33000]),
    ("a run that never reached the target", [16, 64, 256, 1024], [None, 900, 400, 380]),
    ("the fewest examples not at the smallest batch", [8, 16, 32], [4000, 1500, 1200]),
    ("a noisy sweep whose largest batch is not the fastest", [24, 48, 96, 192, 384], [2600, 1400, 900, 610, 655]),
]


def random_sweep(rng: random.Random) -> tuple[list[int], list[int | None]]:
    """A sweep drawn from McCandlish et al.'s S(B) = S_min (1 + B_crit / B), with noise, shuffled, one run
    that never got there: new at every call, so that no answer read from a message can be typed in."""
    s_min, b_crit = rng.randint(200, 2000), rng.randint(20, 3000)
    batches = rng.sample([2 ** k * m for k in range(2, 13) for m in (1, 3)], 6)
    steps = [round(s_min * (1 + b_crit / b) * rng.uniform(0.85, 1.15)) for b in batches]
    steps[rng.randrange(len(steps))] = None
    return batches, steps


def _as_number(got):
    """A tensor or numpy value holding one number, as a Python number; anything else as it is."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        return got.item()
    if type(got).__module__ == "numpy" and getattr(got, "size", 0) == 1:
        return got.item()
    return got


def _critical(batches, steps) -> float:
    kept = [(b, s) for b, s in zip(batches, steps) if s is not None]
    return min(b * s for b, s in kept) / min(s for _, s in kept)


def check_critical_batch(critical_batch) -> None:
    with exercise("7.1"):
        cases = CRITICAL_CASES + [("a sweep drawn at random", *random_sweep(random.Random()))]
        answers = {label: _critical(batches, steps) for label, batches, steps in cases}
        for label, batches, steps in cases:
            kept = [(b, s) for b, s in zip(batches, steps) if s is not None]
            s_min = min(s for _, s in kept)
            e_min = min(b * s for b, s in kept)
            want = answers[label]
            try:
                got = critical_batch(list(batches), list(steps))
            except TypeError as error:
                if None not in steps:
                    raise
                raise Incorrect(f"7.1 ({label}, steps {steps}): your code raised TypeError: {error}. A step count "
                                f"of None is a run that never reached the target: leave it out before taking "
                                f"any minimum.") from error
            got = _as_number(got)
            expect(isinstance(got, numbers.Real) and not isinstance(got, bool) and math.isfinite(got),
                   f"7.1 ({label}): return the critical batch size as a number, got {got!r}")
            if _close(got, want):
                continue
            smallest, largest = min(kept), max(kept)
            others = [other for other, answer in answers.items() if other != label and _close(got, answer)]
            expect(not others, f"7.1 ({label}): {got:.6g} is the critical batch of another sweep of this check "
                               f"('{others[0] if others else ''}'): compute it from the sweep your function is given.")
            if None in steps:
                shifted = [s for s in steps if s is not None]
                expect(not _close(got, min(b * s for b, s in zip(batches, shifted)) / s_min),
                       f"7.1 ({label}, batch sizes {batches}, steps {steps}): you left out the None but kept its "
                       f"batch size, so every batch size after it was paired with the next run's steps: drop each "
                       f"run whole (its batch size with its steps).")
            expect(not _close(got, max(b * s for b, s in kept) / s_min),
                   f"7.1 ({label}): E_min is the fewest examples any batch size needs, not the most.")
            expect(not (_close(got, e_min / largest[1]) and largest[1] != s_min),
                   f"7.1 ({label}, batch sizes {batches}, steps {steps}): S_min is the fewest steps of any batch "
                   f"size; in a noisy sweep that need not be the largest batch's ({largest[0]} took {largest[1]}).")
            expect(not (_close(got, smallest[0] * smallest[1] / s_min) and smallest[0] * smallest[1] != e_min),
                   f"7.1 ({label}, batch sizes {batches}, steps {steps}): E_min is the fewest examples of any "
                   f"batch size, not those of the smallest batch ({smallest[0]}).")
            expect(not _close(got, kept[0][0] * kept[0][1] / s_min),
                   f"7.1 ({label}): E_min is the fewest examples over all batch sizes, not those of the first "
                   f"batch size listed.")
            expect(False, f"7.1 ({label}, batch sizes {batches}, steps {steps}): you read B_crit = {got:.6g}; "
                          f"here S_min is {s_min:g} steps, E_min {e_min:g} examples, and the batch size at which a "
                          f"run takes twice of each is {want:.6g}.")


# --- 7.2 linear scaling with warm-up ----------------------------------------------------------------

# (base_lr, base_batch, batch, warmup_steps): whole and fractional batch ratios, a ratio of 1, and a
# batch below the base batch (nothing to warm up: the scaled lr from step 0).
WARMUP_CASES = ((0.1, 64, 1024, 10), (0.03, 48, 200, 7), (0.05, 32, 96, 3), (0.2, 256, 256, 4), (0.1, 64, 24, 5))
# The lrs the optimizer's two groups hold before the call, per case: base_lr in most, others in one (an
# optimizer may be built with any lr), so that multiplying the lr found there, or reading base_lr from it, shows.
FOUND_LRS = {(0.03, 48, 200, 7): (1.0, 0.002)}


def _hand_written(scheduler) -> str | None:
    """Why ``scheduler`` is a hand-written schedule, or None when it is built from torch's own."""
    from torch.optim import lr_scheduler

    for inner in getattr(scheduler, "_schedulers", None) or []:   # SequentialLR, ChainedScheduler
        reason = _hand_written(inner)
        if reason:
            return reason
    kind = type(scheduler)
    if kind in (lr_scheduler.LambdaLR, lr_scheduler.MultiplicativeLR):
        return f"{kind.__name__} runs a function you wrote"
    if getattr(lr_scheduler, kind.__name__, None) is not kind:     # a class of the learner's, whatever its module says
        return f"{kind.__name__} is a scheduler class of your own"
    replaced = sorted({"get_lr", "_get_closed_form_lr", "step"} & set(vars(scheduler)))
    if replaced:
        return f"the scheduler's {', '.join(replaced)} is a function of yours (set on the scheduler)"
    return None


def _learning_rates(scheduler_fn, base_lr, base_batch, batch, warmup_steps, steps, found) -> tuple[list[list[float]], object]:
    param = nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=found[0], momentum=0.9)
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(2))], "lr": found[1]})
    try:
        scheduler = scheduler_fn(optimizer, base_lr, base_batch, batch, warmup_steps)
    except ValueError as error:
        if batch >= base_batch:
            raise
        raise Incorrect(f"7.2 (batch {batch} below the base batch {base_batch}): your code raised ValueError: "
                        f"{error}. Below the base batch the scaled lr is smaller than base_lr, so there is "
                        f"nothing to warm up: run at the scaled lr from step 0 (a start factor of 1).") from error
    rates = []
    for _ in range(steps):
        rates.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        if hasattr(scheduler, "step"):
            scheduler.step()
    return rates, scheduler


def check_warmup(linear_scaling_with_warmup) -> None:
    from torch.optim.lr_scheduler import LRScheduler

    with exercise("7.2"):
        for base_lr, base_batch, batch, warmup in WARMUP_CASES:
            ratio = batch / base_batch
            target = base_lr * ratio
            start = min(base_lr, target)
            where = f"base lr {base_lr} at batch {base_batch}, batch {batch}, warm-up {warmup} steps"
            found = FOUND_LRS.get((base_lr, base_batch, batch, warmup), (base_lr, base_lr))
            rates, scheduler = _learning_rates(linear_scaling_with_warmup, base_lr, base_batch, batch, warmup,
                                               warmup + 4, found)
            expect(isinstance(scheduler, LRScheduler),
                   f"7.2: return a scheduler from torch.optim.lr_scheduler (got {type(scheduler).__name__}); "
                   f"the training loop calls its step() after every optimizer step.")
            reason = _hand_written(scheduler)
            expect(reason is None,
                   f"7.2: {reason}: that is a schedule written by hand. The exercise asks for torch's own "
                   f"scheduler whose factor moves in a straight line (no function of the step of yours).")
            expect(found == (base_lr, base_lr) or not _close(rates[-1][0], found[0] * ratio, 1e-6),
                   f"7.2 ({where}): the optimizer's groups held lrs {found[0]} and {found[1]} before your call, not "
                   f"base_lr, and after the warm-up your lr is {rates[-1][0]:.6g}, {found[0]} times the batch ratio. "
                   f"An optimizer may be built with any lr: set each group's lr to base_lr times the ratio (do not "
                   f"multiply the lr you find there, nor read base_lr from it).")
            expect(all(len(set(step)) == 1 for step in rates),
                   "7.2: the optimizer's two param groups got different learning rates: set every group's lr.")
            lrs = [step[0] for step in rates]
            if not _close(lrs[-1], target, 1e-6):
                rounded = {base_lr * math.floor(ratio), base_lr * round(ratio)}
                expect(not (ratio != round(ratio) and any(_close(lrs[-1], r, 1e-6) for r in rounded)),
                       f"7.2 ({where}): after the warm-up the lr is {lrs[-1]:.6g}, base_lr times the batch ratio "
                       f"{ratio:.6g} rounded to a whole number; the ratio of two batch sizes need not be whole: "
                       f"divide with /, not //, and do not round.")
                expect(False, f"7.2 ({where}): after the warm-up the lr is {lrs[-1]:.6g}, the linear scaling "
                              f"rule gives {target:.6g}.")
            if batch < base_batch:
                expect(_close(lrs[0], target, 1e-6),
                       f"7.2 ({where}): the first step runs at {lrs[0]:.6g}. Below the base batch the scaled lr "
                       f"{target:.6g} is the smaller one: there is nothing to warm up, so every step runs at it "
                       f"(a schedule that comes down from base_lr is not a warm-up).")
            expect(_close(lrs[0], start, 1e-6),
                   f"7.2 ({where}): the first step runs at {lrs[0]:.6g}; Goyal et al.'s warm-up starts from the "
                   f"small batch's lr, {start:.6g}.")
            want = [target * (start / target + (1 - start / target) * min(i, warmup) / warmup)
                    for i in range(warmup + 4)]
            first_full = next(i for i, lr in enumerate(lrs) if _close(lr, target, 1e-6))
            expect(first_full == warmup or batch <= base_batch,
                   f"7.2 ({where}): the lr first reaches the target at step {first_full}; it should at step "
                   f"{warmup} (the steps are counted from 0).")
            worst = max(abs(a - b) for a, b in zip(lrs, want))
            expect(worst <= 1e-9 * max(1.0, target),
                   f"7.2 ({where}): the lrs over the warm-up are {[round(v, 6) for v in lrs]}, a straight line "
                   f"from {start:.6g} to the target gives {[round(v, 6) for v in want]}.")


# --- 7.3 filter normalisation -----------------------------------------------------------------------


class _Awkward(nn.Module):
    """A BatchNorm (1-D parameters, and buffers that model.state_dict() holds but model.parameters() does
    not), a conv layer, a linear layer with one filter of zeros, a bias and a lone 1-D scale."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(2)
        self.conv = nn.Conv2d(2, 3, 3)
        self.fc = nn.Linear(5, 4, bias=False)
        self.scale = nn.Parameter(torch.tensor([2.0, -1.0]))
        with torch.no_grad():
            self.fc.weight[2] = 0.0
            self.fc.weight.mul_(torch.tensor([[1.0], [10.0], [1.0], [0.01]]))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def check_filter_normalize(filter_normalize) -> None:
    from ..labs import lab07 as lab

    with exercise("7.3"):
        torch.manual_seed(3)
        model = _Awkward()
        direction = lab.random_direction(model, seed=5)
        conv = [name for name, _ in model.named_parameters()].index("conv.weight")
        direction[conv][0] = 0.0                            # a filter of zeros in the direction too
        before = [d.clone() for d in direction]
        weights = [w.detach().clone() for w in model.parameters()]
        want = lab.filter_normalize(before, model)
        got = filter_normalize(direction, model)
        expect(_same(before, direction),
               "7.3: your function changed the direction it was given: return new tensors.")
        try:                                                # read the result once, and keep a copy of it
            got = [torch.as_tensor(t).detach().clone() for t in got]
        except TypeError as error:
            raise Incorrect(f"7.3: return a list of tensors, one per model.parameters(); got "
                            f"{type(got).__name__}") from error
        expect(_same(before, direction),
               "7.3: reading your result changed the direction it was given (a generator, or a lazy view, that "
               "works in place): compute new tensors and return them in a list.")
        expect(_same(weights, [w.detach() for w in model.parameters()]),
               "7.3: your function changed the model's weights: read them (w.detach()), do not write them.")
        expect(len(got) == len(want) and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(got, want)),
               "7.3: return one tensor per model.parameters(), each of its parameter's shape.")
        expect(all(a.dtype == b.dtype for a, b in zip(got, want)),
               f"7.3: return tensors of the direction's dtype ({want[0].dtype}); yours are "
               f"{sorted({str(a.dtype) for a in got})}.")
        names = [name for name, _ in model.named_parameters()]
        for name, a, b, w in zip(names, got, want, weights):
            expect(bool(torch.isfinite(a).all()), f"7.3: {name}'s direction has nan or inf: a filter whose "
                                                  f"direction is zero stays zero (no 0 / 0).")
            if w.dim() <= 1:
                expect(bool((a == 0).all()), f"7.3: {name} is 1-D (a bias or a scale): Li et al. give it a zero "
                                             f"direction, so it stays at its trained value.")
                continue
            expect(not torch.allclose(a, w), f"7.3: {name}'s direction is the weights themselves: scale "
                                             f"each filter of the given direction, do not replace it.")
            got_norms = a.reshape(a.shape[0], -1).norm(dim=1)
            want_norms = b.reshape(b.shape[0], -1).norm(dim=1)
            if not torch.allclose(got_norms, want_norms, rtol=1e-5, atol=1e-7):
                whole = math.isclose(a.norm().item(), w.norm().item(), rel_tol=1e-4)
                expect(bool(a.any()), f"7.3: {name}'s direction is all zeros, though its weights and the given "
                                      f"direction are not. Pair each direction tensor with the parameter in the same "
                                      f"place of model.parameters(): model.state_dict() also holds buffers (here "
                                      f"BatchNorm's running statistics), which shift every pair after them.")
                expect(False, f"7.3: {name}'s filters have norms {got_norms.tolist()}, the weights' filters "
                              f"{want_norms.tolist()}"
                              + (": you scaled the whole tensor, not each filter (one row of a Linear weight, "
                                 "one output channel of a Conv weight)." if whole else "."))
            expect(torch.allclose(a, b, rtol=1e-5, atol=1e-7),
                   f"7.3: {name}: the norms are right but not the direction: scale each filter of the given "
                   f"direction, do not replace it by another.")


# --- 7.4 one LARS step ------------------------------------------------------------------------------


def _reference_lars(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
    from utils.optim import LARS

    param = nn.Parameter(w.clone())
    param.grad = g.clone()
    optimizer = LARS([param], lr=lr, momentum=momentum, weight_decay=weight_decay,
                     trust_coefficient=trust_coefficient, eps=eps)
    optimizer.state[param]["momentum_buffer"] = v.clone()
    optimizer.step()
    return param.detach(), optimizer.state[param]["momentum_buffer"]


def lars_cases():
    """(label, w, g, v, settings): every setting varies somewhere, and the buffers are not zero."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(5, 3, generator=g, dtype=torch.float64) * 3
    grad = torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.01
    v = torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.1
    base = dict(lr=2.0, momentum=0.9, weight_decay=0.0, trust_coefficient=0.02, eps=1e-8)
    return [("no weight decay", w, grad, v, base),
            ("weight decay 0.01, eps 1e-3", w, grad, v,
             dict(lr=1.5, momentum=0.9, weight_decay=0.01, trust_coefficient=0.005, eps=1e-3)),
            ("momentum 0.5 on a buffer that is not zero, eps 0.02", w, grad, v,
             dict(lr=0.7, momentum=0.5, weight_decay=0.003, trust_coefficient=0.1, eps=0.02)),
            ("momentum 0, v starts at zero", w, grad, torch.zeros_like(v), {**base, "momentum": 0.0}),
            ("a weight of zeros (a bias at the start)", torch.zeros(4, dtype=torch.float64),
             torch.full((4,), 0.5, dtype=torch.float64), torch.full((4,), 0.05, dtype=torch.float64), base),
            ("a gradient of zeros", w, torch.zeros_like(grad), v, {**base, "weight_decay": 0.01, "eps": 1e-4})]


def _fit(target: torch.Tensor, *columns: torch.Tensor) -> tuple[list[float], float]:
    """Least squares of ``target`` on ``columns`` (all flattened): (coefficients, largest residual)."""
    design = torch.stack([c.flatten() for c in columns], dim=1)
    coefficients = torch.linalg.lstsq(design, target.flatten()[:, None]).solution[:, 0]
    return coefficients.tolist(), (design @ coefficients - target.flatten()).abs().max().item()


def _diagnose_lars(label, w, g, v, got_v, want_v, lr, momentum, weight_decay, trust_coefficient, eps) -> str:
    """The message for a wrong new v: which part of the step differs, in numbers."""
    w_norm, g_norm = torch.linalg.vector_norm(w).item(), torch.linalg.vector_norm(g).item()
    differs = f"7.4 ({label}): new v differs from LARS's by up to {(got_v - want_v).abs().max().item():.3g}"
    if w_norm == 0 or g_norm == 0:
        return (f"{differs}. Here ||w|| = {w_norm:g} and ||g|| = {g_norm:g}: when either norm is 0, LARS's local "
                f"lr is 1.0 (otherwise a tensor that starts at zero, a bias, would never learn).")
    tol = 1e-9 * max(1.0, want_v.abs().max().item())
    direction = g + weight_decay * w
    if bool(v.any()):
        (kept, step), residual = _fit(got_v, v, direction)
        if residual <= tol and not _close(kept, momentum, 1e-6):
            return (f"{differs}: your step keeps {kept:.6g} of the old buffer, the momentum argument is "
                    f"{momentum}. Use the argument.")
    else:
        (step,), residual = _fit(got_v - momentum * v, direction)
    if residual > tol:
        if weight_decay and _fit(got_v - momentum * v, g)[1] <= tol:
            return (f"{differs}: your step follows the gradient alone; with weight decay the update direction "
                    f"is the gradient plus the weight-decay term ({weight_decay} times w).")
        return (f"{differs}: it is not the old buffer times the momentum plus one multiple of the update direction"
                + (" (the local lr is one number for the whole tensor: the norms of all of w and all of g, not of "
                   "each row)." if w.dim() > 1 else "."))
    local, want = step / lr, trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    if _close(local * lr, want, 1e-6):
        return (f"{differs}: your buffer takes the local lr times the update direction, without the global lr "
                f"({lr}); in You et al.'s algorithm 1 the buffer takes lr times the local lr times the direction, "
                f"and w moves by the buffer alone.")
    if momentum and _close(local, (1 - momentum) * want, 1e-6):
        return (f"{differs}: your buffer takes (1 - momentum) times the step, a dampened average; LARS's heavy-ball "
                f"momentum adds the whole step.")
    if _close(local, min(want, 1.0), 1e-6):
        return (f"{differs}: your local lr is {local:.9g}, LARS's {want:.9g}: you capped it at 1 (LARC's clipping); "
                f"LARS's local lr is the trust ratio itself.")
    sum_norm = torch.linalg.vector_norm(direction).item()
    if weight_decay and _close(local, trust_coefficient * w_norm / (sum_norm + eps), 1e-6):
        return (f"{differs}: your local lr is {local:.9g}, LARS's {want:.9g}: your ratio divides by the norm of the "
                f"update direction, ||g + weight_decay w||; You et al. divide by the sum of the two norms, "
                f"||g|| + weight_decay ||w||.")
    if weight_decay and _close(local, trust_coefficient * w_norm / (g_norm + eps), 1e-6):
        return (f"{differs}: your local lr is {local:.9g}, LARS's {want:.9g}. Weight decay is missing from the "
                f"trust ratio's denominator: You et al. bound the norm of the whole update direction, weight-decay "
                f"term included.")
    implied_eps = trust_coefficient * w_norm / local - g_norm - weight_decay * w_norm if local else math.inf
    if -1e-9 <= implied_eps <= 1e-6:
        return (f"{differs}: your local lr is {local:.9g}, LARS's {want:.9g}; it is the one for eps = "
                f"{implied_eps if abs(implied_eps) > 1e-12 else 0:.2g}, and the eps argument is {eps}. Use the "
                f"argument.")
    implied_tc = local * (g_norm + weight_decay * w_norm + eps) / w_norm
    for usual in (1.0, 0.001, 0.01, 0.02, 0.1):
        if _close(implied_tc, usual, 1e-6):
            return (f"{differs}: your local lr is {local:.9g}, LARS's {want:.9g}; it uses a trust coefficient of "
                    f"{usual:g}, and the trust_coefficient argument is {trust_coefficient}. Use the argument.")
    return f"{differs}: your local lr is {local:.9g}, LARS's trust ratio gives {want:.9g}."


def check_lars_step(lars_step) -> None:
    with exercise("7.4"):
        for label, w, g, v, settings in lars_cases():
            want_w, want_v = _reference_lars(w, g, v, **settings)
            given = {"w": w.clone(), "g": g.clone(), "v": v.clone()}
            got = lars_step(*given.values(), **settings)
            expect(isinstance(got, tuple) and len(got) == 2, f"7.4: return (new_w, new_v), got {type(got).__name__}")
            got_w, got_v = (torch.as_tensor(t).detach().clone() for t in got)   # read once, kept as they are now
            for name, before in (("w", w), ("g", g), ("v", v)):
                expect(torch.equal(given[name], before),
                       f"7.4 ({label}): your step changed its argument {name} in place; return new tensors and leave "
                       f"w, g and v as they were (an optimizer keeps g in p.grad, and the caller decides what "
                       f"becomes of w and v).")
            expect(got_w.dtype == w.dtype and got_v.dtype == w.dtype,
                   f"7.4 ({label}): return tensors of w's dtype ({w.dtype}); yours are {got_w.dtype} and "
                   f"{got_v.dtype} (a tensor built with a fixed dtype, or .float(), lowers the precision).")
            expect(tuple(got_w.shape) == tuple(w.shape) and tuple(got_v.shape) == tuple(w.shape),
                   f"7.4 ({label}): new w and new v have the shape of w, {tuple(w.shape)}; got "
                   f"{tuple(got_w.shape)} and {tuple(got_v.shape)}.")
            expect(bool(torch.isfinite(got_w).all() and torch.isfinite(got_v).all()),
                   f"7.4 ({label}): your step gives nan or inf: when ||w|| or ||g|| is 0, the local lr is 1.0 "
                   f"(0 / 0 otherwise).")
            if not torch.allclose(got_v, want_v, rtol=1e-9, atol=1e-12):
                expect(False, _diagnose_lars(label, w, g, v, got_v, want_v, **settings))
            if not torch.allclose(got_w, want_w, rtol=1e-9, atol=1e-12):
                old = torch.allclose(got_w, w - v, rtol=1e-9, atol=1e-12)
                expect(False, f"7.4 ({label}): new v is right, but new w differs by up to "
                              f"{(got_w - want_w).abs().max().item():.3g}"
                              + (": you moved w by the old buffer; it moves by the new one." if old else "."))

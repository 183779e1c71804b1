"""The checks of lab 07: right answers pass, the typical wrong ones fail with their own message.

Exercises in the notebook's order: 7.1 the critical batch, 7.2 linear scaling with warm-up, 7.3 filter
normalisation, 7.4 one LARS step. Each class of wrong answer an outside tester found (inputs too regular
to tell it apart, a lazy result, a hand-written schedule) has a test below that feeds it.
"""
from __future__ import annotations

import math

import pytest
import torch

from check_helpers import fails
from learner_hints import ROOT, learner_cells_hold_no_hint
from utils.labs import lab07 as lab
from utils.checks import Incorrect, NotSolved, lab07


# --- 7.1 the critical batch --------------------------------------------------------------------------------

def right_critical(batch_sizes, steps):
    kept = [(b, s) for b, s in zip(batch_sizes, steps) if s is not None]
    return min(b * s for b, s in kept) / min(s for _, s in kept)


def test_critical_batch_right_passes():
    lab07.check_critical_batch(right_critical)


def test_critical_batch_accepts_a_tensor_or_numpy_number():
    lab07.check_critical_batch(lambda b, s: torch.tensor(right_critical(b, s), dtype=torch.float64))


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


def largest_batch_is_fastest(batch_sizes, steps):
    """Right whenever the largest batch takes the fewest steps, as in a clean sweep."""
    kept = sorted((b, s) for b, s in zip(batch_sizes, steps) if s is not None)
    return min(b * s for b, s in kept) / kept[-1][1]


def smallest_batch_is_cheapest(batch_sizes, steps):
    """Right whenever the smallest batch needs the fewest examples."""
    kept = sorted((b, s) for b, s in zip(batch_sizes, steps) if s is not None)
    return kept[0][0] * kept[0][1] / min(s for _, s in kept)


@pytest.mark.parametrize("wrong, message", [
    (most_examples, "not the most"),
    (first_listed, "not those of the first batch size listed"),
    (keeps_none, "A step count of None is a run that never reached the target"),
    (last_is_fewest_steps, "you read B_crit"),
    (largest_batch_is_fastest, "need not be the largest batch's"),
    (smallest_batch_is_cheapest, "not those of the smallest batch"),
], ids=["max examples", "first listed", "None kept", "last run's steps", "largest batch's steps",
        "smallest batch's examples"])
def test_critical_batch_mistakes(wrong, message):
    assert message in fails(lab07.check_critical_batch, wrong, Incorrect)


def drops_none_from_steps_only(batch_sizes, steps):
    """Removes the None from the steps but keeps its batch size: the pairs after it shift by one."""
    kept_steps = [s for s in steps if s is not None]
    return min(b * s for b, s in zip(batch_sizes, kept_steps)) / min(kept_steps)


ANSWERS = {tuple(b): right_critical(b, s) for _, b, s in lab07.CRITICAL_CASES}


def typed_in(batch_sizes, steps):
    """The answers of the check's fixed sweeps, read from its messages and typed in."""
    return ANSWERS.get(tuple(batch_sizes), next(iter(ANSWERS.values())))


@pytest.mark.parametrize("wrong, message", [
    (drops_none_from_steps_only, "kept its batch size, so every batch size after it was paired with the next"),
    (typed_in, "is the critical batch of another sweep of this check"),
], ids=["None dropped from the steps only", "answers typed in"])
def test_critical_batch_mistakes_found_by_an_outside_review(wrong, message):
    assert message in fails(lab07.check_critical_batch, wrong, Incorrect)


def test_critical_batch_accepts_a_numpy_number():
    import numpy as np
    lab07.check_critical_batch(lambda b, s: np.array(right_critical(b, s)))


def test_random_sweeps_are_irregular_and_new_at_every_call():
    import random
    rng = random.Random(1)
    sweeps = [lab07.random_sweep(rng) for _ in range(20)]
    assert len({tuple(b) for b, _ in sweeps}) == 20
    assert all(s.count(None) == 1 and len(b) == len(s) for b, s in sweeps)


def test_critical_batch_sweeps_include_one_whose_largest_batch_is_not_the_fastest():
    assert any(s[max(range(len(b)), key=b.__getitem__)] != min(x for x in s if x is not None)
               for _, b, s in lab07.CRITICAL_CASES)


# --- 7.2 linear scaling with warm-up ------------------------------------------------------------------

def right_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=min(1.0, base_lr / target),
                                             total_iters=warmup_steps)


def warmup_variant(rule="linear", start=None, total=lambda w: w, groups=slice(None), scheduler=True,
                   below="clamp"):
    def learner(optimizer, base_lr, base_batch, batch, warmup_steps):
        k = batch / base_batch
        target = base_lr * {"linear": k, "sqrt": math.sqrt(k), "none": 1, "floor": batch // base_batch,
                            "round": round(k)}[rule]
        for group in optimizer.param_groups[groups]:
            group["lr"] = target
        if not scheduler:
            return None
        factor = start or base_lr / target
        if below == "clamp":
            factor = min(1.0, factor)
        elif below == "cool down" and factor > 1:          # base_lr down to the target: not a warm-up
            for group in optimizer.param_groups:
                group["lr"] = base_lr
            return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=target / base_lr,
                                                     total_iters=warmup_steps)
        return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=factor, total_iters=total(warmup_steps))
    return learner


def lambda_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    """Right numbers, but a schedule written by hand, which the exercise rules out."""
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    start = min(1.0, base_lr / target)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: start + (1 - start) * min(i, warmup_steps) / warmup_steps)


class OwnLinear(torch.optim.lr_scheduler.LinearLR):
    """A scheduler class of the learner's own (here one that only renames LinearLR)."""


def own_class_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    return OwnLinear(optimizer, start_factor=min(1.0, base_lr / target), total_iters=warmup_steps)


class DisguisedLinear(torch.optim.lr_scheduler.LinearLR):
    """A class of the learner's own that claims torch's module as its own."""


DisguisedLinear.__module__ = "torch.optim.lr_scheduler"


def disguised_class_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    scheduler = right_warmup(optimizer, base_lr, base_batch, batch, warmup_steps)
    scheduler.__class__ = DisguisedLinear
    return scheduler


def replaced_get_lr_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    """torch's LinearLR, its get_lr swapped on the instance for a hand-written schedule."""
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    start = min(1.0, base_lr / target)
    scheduler.get_lr = lambda: [target * (start + (1 - start) * min(scheduler.last_epoch, warmup_steps) / warmup_steps)
                                for _ in optimizer.param_groups]
    scheduler._get_closed_form_lr = scheduler.get_lr
    for group in optimizer.param_groups:
        group["lr"] = target * start
    return scheduler


@pytest.mark.parametrize("wrong, message", [
    (disguised_class_warmup, "DisguisedLinear is a scheduler class of your own"),
    (replaced_get_lr_warmup, "is a function of yours (set on the scheduler)"),
], ids=["own class in torch's module", "get_lr replaced on the instance"])
def test_warmup_hand_written_schedules_in_disguise(wrong, message):
    assert message in fails(lab07.check_warmup, wrong, Incorrect)


def sequential_warmup(optimizer, base_lr, base_batch, batch, warmup_steps):
    """Torch's own schedulers composed: allowed."""
    sched = torch.optim.lr_scheduler
    target = base_lr * batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] = target
    warm = sched.LinearLR(optimizer, start_factor=min(1.0, base_lr / target), total_iters=warmup_steps)
    return sched.SequentialLR(optimizer, [warm, sched.ConstantLR(optimizer, factor=1.0, total_iters=0)],
                              milestones=[warmup_steps])


@pytest.mark.parametrize("right", [right_warmup, sequential_warmup], ids=["LinearLR", "SequentialLR"])
def test_warmup_right_passes(right):
    lab07.check_warmup(right)


def test_warmup_below_the_base_batch_runs_at_the_scaled_lr_from_step_0():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    scheduler = right_warmup(optimizer, 0.1, 64, 24, 5)
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.1 * 24 / 64] * 8)


@pytest.mark.parametrize("wrong, message", [
    (warmup_variant(rule="none"), "the linear scaling rule gives"),
    (warmup_variant(rule="sqrt"), "the linear scaling rule gives"),
    (warmup_variant(rule="floor"), "rounded to a whole number"),
    (warmup_variant(rule="round"), "rounded to a whole number"),
    (warmup_variant(start=0.1), "starts from the small batch's lr"),
    (warmup_variant(total=lambda w: w - 1), "it should at step"),
    (warmup_variant(scheduler=False), "return a scheduler from torch.optim.lr_scheduler"),
    (warmup_variant(groups=slice(0, 1)), "different learning rates: set every group's lr"),
    (warmup_variant(below="crash"), "nothing to warm up: run at the scaled lr from step 0"),
    (warmup_variant(below="cool down"), "a schedule that comes down from base_lr is not a warm-up"),
    (lambda_warmup, "LambdaLR runs a function you wrote: that is a schedule written by hand"),
    (own_class_warmup, "OwnLinear is a scheduler class of your own: that is a schedule written by hand"),
], ids=["no scaling", "sqrt", "integer ratio", "rounded ratio", "starts at 0.1", "one step short", "no scheduler",
        "first group only", "LinearLR refuses a start factor above 1", "cools down below the base batch",
        "LambdaLR", "own scheduler class"])
def test_warmup_mistakes(wrong, message):
    assert message in fails(lab07.check_warmup, wrong, Incorrect)


def multiplies_the_lr_found(optimizer, base_lr, base_batch, batch, warmup_steps):
    """Scales the lr the groups hold: right only while they hold base_lr (and compounds when run twice)."""
    k = batch / base_batch
    for group in optimizer.param_groups:
        group["lr"] *= k
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=min(1.0, 1 / k), total_iters=warmup_steps)


def reads_base_lr_from_the_optimizer(optimizer, base_lr, base_batch, batch, warmup_steps):
    return right_warmup(optimizer, optimizer.param_groups[0]["lr"], base_batch, batch, warmup_steps)


@pytest.mark.parametrize("wrong", [multiplies_the_lr_found, reads_base_lr_from_the_optimizer],
                         ids=["lr found multiplied", "base_lr read from the optimizer"])
def test_warmup_sets_the_lr_whatever_the_optimizer_held(wrong):
    assert "do not multiply the lr you find there, nor read base_lr from it" in \
        fails(lab07.check_warmup, wrong, Incorrect)


def test_warmup_cases_hold_fractional_ratios_and_a_batch_below_the_base():
    ratios = [batch / base for _, base, batch, _ in lab07.WARMUP_CASES]
    assert any(r != round(r) for r in ratios) and any(r < 1 for r in ratios)


# --- 7.3 filter normalisation ----------------------------------------------------------------------------

def test_filter_normalize_reference_passes():
    lab07.check_filter_normalize(lab.filter_normalize)


def test_filter_normalize_accepts_a_tuple():
    lab07.check_filter_normalize(lambda direction, model: tuple(lab.filter_normalize(direction, model)))


def whole_tensor(direction, model):
    return [torch.zeros_like(d) if w.dim() <= 1 else d * (w.detach().norm() / d.norm())
            for d, w in zip(direction, model.parameters())]


def keeps_biases(direction, model):
    out = lab.filter_normalize(direction, model)
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
    for d, n in zip(direction, lab.filter_normalize(direction, model)):
        d.copy_(n)
    return direction


def lazily_in_place(direction, model):
    """A generator: it writes into the direction only when the check reads the result."""
    return (d.copy_(n) for d, n in zip(direction, lab.filter_normalize(direction, model)))


def changes_the_weights(direction, model):
    out = lab.filter_normalize(direction, model)
    with torch.no_grad():
        for w in model.parameters():
            w.mul_(1.5)
    return out


def the_weights(direction, model):
    return [torch.zeros_like(w) if w.dim() <= 1 else w.detach().clone() for w in model.parameters()]


def paired_with_state_dict(direction, model):
    """Pairs the direction with model.state_dict(), whose buffers (BatchNorm's statistics) shift the pairs."""
    out = []
    for d, w in zip(direction, model.state_dict().values()):
        if w.dim() <= 1:
            out.append(torch.zeros_like(d))
            continue
        d_norm, w_norm = d.reshape(d.shape[0], -1).norm(dim=1), w.reshape(w.shape[0], -1).norm(dim=1)
        out.append(d * (w_norm / d_norm).nan_to_num().reshape(-1, *([1] * (d.dim() - 1))))
    return out


def half_precision(direction, model):
    return [t.half() for t in lab.filter_normalize(direction, model)]


@pytest.mark.parametrize("wrong, message", [
    (paired_with_state_dict, "model.state_dict() also holds buffers"),
    (half_precision, "return tensors of the direction's dtype"),
], ids=["paired with state_dict", "half precision"])
def test_filter_normalize_mistakes_found_by_an_outside_review(wrong, message):
    assert message in fails(lab07.check_filter_normalize, wrong, Incorrect)


@pytest.mark.parametrize("wrong, message", [
    (whole_tensor, "you scaled the whole tensor"),
    (keeps_biases, "is 1-D (a bias or a scale)"),
    (divides_by_zero, "has nan or inf"),
    (in_place, "your function changed the direction it was given"),
    (lazily_in_place, "reading your result changed the direction it was given"),
    (changes_the_weights, "changed the model's weights"),
    (the_weights, "do not replace it"),
    (lambda direction, model: 3.0, "return a list of tensors"),
], ids=["whole tensor", "biases kept", "0 / 0", "in place", "lazily in place", "weights changed",
        "weights returned", "not a list"])
def test_filter_normalize_mistakes(wrong, message):
    assert message in fails(lab07.check_filter_normalize, wrong, Incorrect)


# --- 7.4 one LARS step -----------------------------------------------------------------------------------

def lars(fallback=True, wd_in_denominator=True, new_v_in_w=True, momentum_used=None, eps_used=None,
         trust_used=None, wd_in_direction=True):
    def learner(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
        momentum = momentum if momentum_used is None else momentum_used
        eps = eps if eps_used is None else eps_used
        trust_coefficient = trust_coefficient if trust_used is None else trust_used
        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        denominator = g_norm + (weight_decay * w_norm if wd_in_denominator else 0) + eps
        local_lr = 1.0 if fallback and (w_norm == 0 or g_norm == 0) else trust_coefficient * w_norm / denominator
        if not fallback and w_norm == 0 and g_norm == 0:
            local_lr = w_norm / g_norm                      # 0 / 0
        new_v = momentum * v + lr * local_lr * (g + (weight_decay * w if wd_in_direction else 0))
        return w - (new_v if new_v_in_w else v), new_v
    return learner


def test_lars_right_passes():
    lab07.check_lars_step(lars())


def test_lars_reference_matches_the_papers_rule_written_out():
    """The check's reference, utils.optim.LARS, against You et al.'s algorithm 1 written here by hand."""
    for _, w, g, v, s in lab07.lars_cases():
        want_w, want_v = lab07._reference_lars(w, g, v, **s)
        w_norm, g_norm = w.norm().item(), g.norm().item()
        local = 1.0 if 0 in (w_norm, g_norm) else \
            s["trust_coefficient"] * w_norm / (g_norm + s["weight_decay"] * w_norm + s["eps"])
        new_v = s["momentum"] * v + s["lr"] * local * (g + s["weight_decay"] * w)
        assert torch.allclose(want_v, new_v, rtol=1e-12) and torch.allclose(want_w, w - new_v, rtol=1e-12)


@pytest.mark.parametrize("wrong, message", [
    (lars(wd_in_denominator=False), "Weight decay is missing from the trust ratio's denominator"),
    (lars(wd_in_direction=False), "your step follows the gradient alone"),
    (lars(new_v_in_w=False), "you moved w by the old buffer"),
    (lars(momentum_used=0.9), "your step keeps 0.9 of the old buffer, the momentum argument is 0.5"),
    (lars(eps_used=1e-8), "it is the one for eps = 1e-08, and the eps argument is 0.001"),
    (lars(eps_used=0.0), "it is the one for eps = 0, and the eps argument is"),
    (lars(trust_used=0.02), "it uses a trust coefficient of 0.02, and the trust_coefficient argument is 0.005"),
    (lars(trust_used=1.0), "it uses a trust coefficient of 1, and the trust_coefficient argument is 0.02"),
], ids=["weight decay left out of the ratio", "weight decay left out of the direction", "old v subtracted",
        "momentum fixed at 0.9", "eps fixed at 1e-8", "eps left out", "trust coefficient fixed",
        "trust coefficient left out"])
def test_lars_mistakes(wrong, message):
    assert message in fails(lab07.check_lars_step, wrong, Incorrect)


def lars_variant(local_lr=None, dampened=False, lr_in_buffer=True, writes=None, dtype=None, row_norms=False):
    """A LARS step with one mistake: ``local_lr(trust ratio, w_norm, ratio's norm of the sum)`` replaces the
    local lr; ``writes`` names the argument it updates in place."""
    def learner(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
        norm = (lambda t: t.norm(dim=-1, keepdim=True)) if row_norms else torch.linalg.vector_norm
        w_norm, g_norm = norm(w), norm(g)
        local = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
        if local_lr:
            local = local_lr(local, w_norm, norm(g + weight_decay * w), trust_coefficient, eps)
        local = torch.where((w_norm == 0) | (g_norm == 0), 1.0, local)       # LARS's guard: the one mistake is another
        step = (g + weight_decay * w) * local * (lr if lr_in_buffer else 1) * ((1 - momentum) if dampened else 1)
        if writes == "g":
            g.add_(w, alpha=weight_decay)
        if writes == "v":
            new_v = v.mul_(momentum).add_(step)
        else:
            new_v = momentum * v + step
        new_w = w.sub_(new_v) if writes == "w" else w - (new_v if lr_in_buffer else lr * new_v)
        return (new_w.float(), new_v.float()) if dtype else (new_w, new_v)
    return learner


@pytest.mark.parametrize("wrong, message", [
    (lars_variant(lr_in_buffer=False), "without the global lr"),
    (lars_variant(dampened=True), "a dampened average"),
    (lars_variant(local_lr=lambda local, *_: local.clamp(max=1.0)), "you capped it at 1"),
    (lars_variant(local_lr=lambda local, w_norm, sum_norm, tc, eps: tc * w_norm / (sum_norm + eps)),
     "divides by the norm of the update direction"),
    (lars_variant(row_norms=True), "not of each row"),
    (lars_variant(writes="g"), "changed its argument g in place"),
    (lars_variant(writes="v"), "changed its argument v in place"),
    (lars_variant(writes="w"), "changed its argument w in place"),
    (lars_variant(dtype=torch.float32), "return tensors of w's dtype"),
], ids=["lr outside the buffer", "dampened momentum", "local lr capped at 1", "norm of the sum in the ratio",
        "norms per row", "g written in place", "v written in place", "w written in place", "float32"])
def test_lars_mistakes_found_by_an_outside_review(wrong, message):
    assert message in fails(lab07.check_lars_step, wrong, Incorrect)


def test_lars_zero_norm_without_fallback():
    def no_fallback(w, g, v, lr, momentum, weight_decay, trust_coefficient, eps):
        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        local_lr = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
        new_v = momentum * v + lr * local_lr * (g + weight_decay * w)
        return w - new_v, new_v
    # A zero weight gives local_lr 0 instead of 1.0: the bias never learns.
    message = fails(lab07.check_lars_step, no_fallback, Incorrect)
    assert "a weight of zeros" in message and "LARS's local lr is 1.0" in message


def test_lars_cases_vary_every_setting_and_use_a_buffer_that_is_not_zero():
    cases = lab07.lars_cases()
    for name in ("lr", "momentum", "weight_decay", "trust_coefficient", "eps"):
        assert len({s[name] for *_, s in cases}) >= 2, name
    assert any(s["momentum"] not in (0.0, 0.9) and bool(v.any()) for _, _, _, v, s in cases)


# --- every exercise ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("check", [lab07.check_critical_batch, lab07.check_warmup, lab07.check_filter_normalize,
                                   lab07.check_lars_step])
def test_stubs_are_not_solved(check):
    def stub(*args, **kwargs):
        raise NotImplementedError("Hint: x")
    assert "not solved yet" in fails(check, stub, NotSolved)


@pytest.mark.parametrize("check, number", [(lab07.check_critical_batch, "7.1"), (lab07.check_warmup, "7.2"),
                                           (lab07.check_filter_normalize, "7.3"), (lab07.check_lars_step, "7.4")])
def test_checks_are_numbered_in_notebook_order(check, number):
    import nbformat

    nb = nbformat.read(ROOT / "labs" / "07_batch_size.ipynb", as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("### Exercise 7.")]
    assert [h.split(":")[0] for h in headings] == [f"### Exercise 7.{i}" for i in range(1, 5)]
    # The check cell of exercise 7.N comes after the heading of exercise 7.N and before that of 7.N+1.
    name = f"lab07.{check.__name__}("
    assert text.index(f"### Exercise {number}") < text.index(name)
    if number != "7.4":
        assert text.index(name) < text.index(f"### Exercise 7.{int(number[-1]) + 1}")


def test_step_by_step_hints_exist_for_every_exercise_and_stay_out_of_the_learner_edition():
    assert sorted(lab07.HINTS) == ["7.1", "7.2", "7.3", "7.4"]
    with pytest.raises(ValueError, match="there is one for"):
        lab07.hint("9.9")
    learner_cells_hold_no_hint(ROOT / "labs" / "07_batch_size.ipynb", lab07.HINTS)


def test_no_hint_or_task_writes_the_formula_the_learner_derives():
    import nbformat

    nb = nbformat.read(ROOT / "labs" / "07_batch_size.ipynb", as_version=4)
    from tooling import release
    learner = "\n".join(release.learner_notebook(nb).cells[i].source for i in range(len(nb.cells)))
    for formula in ("E_min / S_min", "e_min / s_min", "trust_coefficient * w_norm", "(g + weight_decay * w)",
                    "start_factor=base_lr / target"):
        assert formula not in learner, formula
        assert all(formula not in hint for hint in lab07.HINTS.values()), formula

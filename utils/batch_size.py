"""Batch size and learning rate: the gradient noise scale, the critical batch size, scaling rules (lab 07).

- ``gradient_noise_scale``: McCandlish et al. (2018, "An Empirical Model of Large-Batch
  Training"), appendix A: the simple noise scale B_simple = tr(Sigma) / |G|^2 from gradient norms
  at two batch sizes. Below it, doubling the batch nearly halves the steps; well above it, it
  hardly helps.
- ``steps_to_target`` and ``fit_critical_batch``: the measured side of the same story (Shallue et
  al. 2018, "Measuring the Effects of Data Parallelism on Neural Network Training"): steps to reach
  a target for several batch sizes, fitted with McCandlish's S(B) = S_min (1 + B_crit / B).
- ``scaled_lr``: the learning-rate scaling rules (Krizhevsky 2014, "One weird trick": square
  root; Goyal et al. 2017, "Accurate, Large Minibatch SGD": linear).
- ``seed_verdict``: which of several settings did best over a few seeds, named only when the seeds
  separate it from the others (otherwise the difference is called noise).
- ``paired_difference``: two settings run on the same seeds (a small and a large batch from the same
  start), their difference seed by seed, and whether every seed agrees on its sign.
- ``compared`` and ``best_of``: the lab's printed verdicts, decided by ``utils.outcomes.compare`` and
  ``utils.outcomes.best`` (mean against mean, beyond both seeds' spreads, recorded for the test suite's
  own rules when ``COURSE_VERDICTS`` is set), with a sentence to print.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn


# --- The gradient noise scale (McCandlish et al. 2018, appendix A) --------------------------------

def _squared_grad_norm(model: nn.Module, params, loss_fn, x: torch.Tensor, y: torch.Tensor) -> float:
    loss = loss_fn(model(x), y)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(sum((g * g).sum() for g in grads if g is not None))


def gradient_noise_scale(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, b_small: int, b_big: int,
                         n_pairs: int = 20, seed: int = 0) -> dict:
    """McCandlish et al.'s unbiased estimates of |G|^2, tr(Sigma) and the simple noise scale.

    A mini-batch gradient of B samples has E|G_B|^2 = |G|^2 + tr(Sigma) / B, where G is the
    full gradient and Sigma the covariance of one sample's gradient. Measuring |G_B|^2 at two
    batch sizes gives two equations in the two unknowns (their appendix A.1):

        G2 = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)     estimates |G|^2
        S  = (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)          estimates tr(Sigma)

    Each |G_B|^2 is the mean over ``n_pairs`` random batches, taken before the two are combined
    and the ratio is taken, as the paper does: G2 and S are unbiased but their ratio is not, and a
    mean of per-pair ratios would be ruled by the pairs whose G2 happens to be near zero. Returns
    ``{"B_simple": S / G2, "G2": G2, "S": S}``.

    ``loss_fn`` must average over the batch (``reduction="mean"``, the default of
    ``F.cross_entropy``). Batches are drawn with replacement from ``(x, y)`` with a generator
    seeded by ``seed``: i.i.d. samples are what the formula assumes, which makes G2 and S unbiased
    for the full data set's |G|^2 and tr(Sigma) (Sigma with 1/n). Gradients are taken in eval
    mode (no dropout; BatchNorm with its running statistics), so the noise measured is that of
    sampling alone; the model's ``.grad`` fields, weights and mode are left as they were. The
    estimates are noisy: a negative G2 or B_simple means too few pairs, or b_small and b_big too
    close together (a ratio of 10 or more works well).
    """
    n = len(x)
    for name, value in (("b_small", b_small), ("b_big", b_big), ("n_pairs", n_pairs)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if b_small >= b_big:
        raise ValueError(f"b_small must be smaller than b_big, got b_small={b_small}, b_big={b_big}; "
                         f"e.g. b_small={max(1, b_big // 10)}")
    if b_big > n:
        raise ValueError(f"b_big={b_big} is larger than the data ({n} samples); use b_big <= {n}")
    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    sums = {b_small: 0.0, b_big: 0.0}
    was_training = model.training
    model.eval()
    try:
        for _ in range(n_pairs):
            for b in (b_small, b_big):
                idx = torch.randint(n, (b,), generator=generator)
                sums[b] += _squared_grad_norm(model, params, loss_fn, x[idx].to(device), y[idx].to(device))
    finally:
        model.train(was_training)
    g2_small, g2_big = sums[b_small] / n_pairs, sums[b_big] / n_pairs
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    s = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    return {"B_simple": s / g2 if g2 != 0 else math.inf, "G2": g2, "S": s}


# --- Steps to a target and the critical batch size -----------------------------------------------

def _column(history, name: str) -> list:
    """A metric's values from a dict of lists, a list of dicts, or an object (utils.train.History)."""
    if isinstance(history, Mapping):
        if name in history:
            return list(history[name])
        keys = list(history)
    elif isinstance(history, (list, tuple)):
        if all(isinstance(row, Mapping) and name in row for row in history):
            return [row[name] for row in history]
        keys = sorted({k for row in history if isinstance(row, Mapping) for k in row})
    else:
        # History logs its evaluations at ``logged_step``: "step" finds it there.
        for attr in (name, f"logged_{name}"):
            if hasattr(history, attr):
                return list(getattr(history, attr))
        keys = [k for k in vars(history)] if hasattr(history, "__dict__") else []
    raise ValueError(f"the history has no {name!r}; it has {keys}")


def steps_to_target(history, target: float, key: str = "test_accuracy", step_key: str = "step",
                    higher_is_better: bool | None = None) -> int | None:
    """The first logged step at which ``history[key]`` reaches ``target``; None if it never does.

    ``history`` is a ``utils.train.History`` (its ``logged_step`` serves as "step"), a dict of
    equal-length lists, or a list of dicts (one per logged step). "Reaches" means ``>= target``
    for a metric where higher is better and ``<= target`` for one where lower is better;
    ``higher_is_better=None`` decides from the name (lower is better when ``key`` contains
    "loss"). A NaN (a diverged run) never reaches the target. Only logged steps are seen, so the
    answer is as fine as the logging (``log_every``).
    """
    values, steps = _column(history, key), _column(history, step_key)
    if len(values) != len(steps):
        raise ValueError(f"history[{key!r}] has {len(values)} entries but history[{step_key!r}] has {len(steps)}")
    if higher_is_better is None:
        higher_is_better = "loss" not in key
    for step, value in zip(steps, values):
        if (value >= target) if higher_is_better else (value <= target):
            return int(step)
    return None


def fit_critical_batch(batch_sizes, steps) -> tuple[float, float]:
    """Fit McCandlish et al.'s S(B) = S_min (1 + B_crit / B) to steps-to-target; returns (S_min, B_crit).

    S_min is the fewest steps any batch size needs, B_crit the critical batch size: at B = B_crit
    training takes twice S_min steps and twice the fewest examples E_min = S_min * B_crit (the
    same model written for examples: E(B) = E_min (1 + B / B_crit)). The model is linear in
    1 / B, S = S_min + (S_min B_crit) / B, so it is fitted by linear least squares on the
    *relative* residuals (S_fit - S) / S: steps span orders of magnitude across batch sizes and
    their run-to-run noise grows with them, so an unweighted fit would be decided by the smallest
    batches alone. An S_min <= 0 or a negative B_crit means the measurements do not have the
    model's shape (steps that do not level off, or that grow with the batch): measure more, or
    larger, batch sizes.
    """
    batch_sizes, steps = list(batch_sizes), list(steps)
    if len(batch_sizes) != len(steps):
        raise ValueError(f"batch_sizes has {len(batch_sizes)} entries but steps has {len(steps)}")
    for i, (b, s) in enumerate(zip(batch_sizes, steps)):
        if s is None:
            raise ValueError(f"steps[{i}] is None (the run at batch size {b} never reached the target): "
                             f"leave that batch size out, or lower the target")
        if not b > 0 or not s > 0:
            raise ValueError(f"batch sizes and steps must be > 0, got batch size {b!r} with steps {s!r}")
    if len(set(batch_sizes)) < 2:
        raise ValueError(f"fitting S_min and B_crit needs at least 2 different batch sizes, got {batch_sizes}")
    s = torch.tensor(steps, dtype=torch.float64)
    inv_b = 1 / torch.tensor(batch_sizes, dtype=torch.float64)
    # Rows divided by S: least squares of (S_min + c / B) / S - 1, with c = S_min * B_crit.
    design = torch.stack([torch.ones_like(inv_b), inv_b], dim=1) / s[:, None]
    s_min, c = torch.linalg.lstsq(design, torch.ones_like(s)[:, None]).solution[:, 0].tolist()
    return s_min, (c / s_min if s_min != 0 else math.inf)


def predicted_steps(batch_sizes, s_min: float, b_crit: float) -> list[float]:
    """S(B) = S_min (1 + B_crit / B) at each batch size: the fitted curve of ``fit_critical_batch``, to plot."""
    return [s_min * (1 + b_crit / b) for b in batch_sizes]


# --- Learning-rate scaling -----------------------------------------------------------------------

LR_RULES = ("none", "sqrt", "linear")


def scaled_lr(base_lr: float, base_batch: int, batch: int, rule: str) -> float:
    """The learning rate for ``batch`` from one tuned at ``base_batch``.

    "none" keeps ``base_lr``; "sqrt" multiplies it by sqrt(batch / base_batch) (Krizhevsky 2014:
    it keeps the variance of the update the same); "linear" by batch / base_batch (Goyal et al.
    2017: k times the batch, k times the step, which holds until the batch nears the critical
    batch size and needs a warm-up at the start).
    """
    if rule not in LR_RULES:
        raise ValueError(f"rule must be one of {LR_RULES}, got {rule!r}")
    if not base_lr > 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr!r}")
    if not base_batch > 0 or not batch > 0:
        raise ValueError(f"base_batch and batch must be > 0, got base_batch={base_batch!r}, batch={batch!r}")
    ratio = batch / base_batch
    return base_lr * {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[rule]


# --- Verdicts over seeds -------------------------------------------------------------------------

def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def seed_verdict(scores: Mapping[str, list], *, higher_is_better: bool = True, fmt: str = ".3g") -> dict:
    """Compare settings measured over several seeds, and name a winner only when the seeds separate it.

    ``scores[name]`` holds one number per seed; None or nan is a seed that failed (a diverged run),
    which counts as the worst possible result. The leader is the setting with the best mean over its
    finite seeds; it is *separated* when it had at least two seeds and its worst seed beats the best
    seed of every other setting (the ranges do not overlap), otherwise the difference is within the
    seed-to-seed noise. Returns ``{"leader", "separated", "mean", "low", "high", "failed", "text"}``
    (mean/low/high/failed per setting; low/high are the worst and best finite seeds; ``text`` a
    sentence that says so, numbers formatted with ``fmt``). A setting whose seeds all failed has no
    mean and cannot lead.
    """
    if not scores:
        raise ValueError("no settings to compare")
    sign = 1.0 if higher_is_better else -1.0
    mean, low, high, failed = {}, {}, {}, {}
    for name, values in scores.items():
        values = list(values)
        if not values:
            raise ValueError(f"{name!r} has no seeds")
        finite = _finite(values)
        failed[name] = len(values) - len(finite)
        mean[name] = sum(finite) / len(finite) if finite else math.nan
        low[name] = min(finite, key=lambda v: sign * v) if finite else math.nan
        high[name] = max(finite, key=lambda v: sign * v) if finite else math.nan
    alive = [name for name in scores if not math.isnan(mean[name])]

    def show(name) -> str:
        n = len(scores[name])
        if not alive or name not in alive:
            return f"{name} failed on every seed"
        spread = f" ({format(low[name], fmt)} to {format(high[name], fmt)})" if n > 1 else ""
        return f"{name} {format(mean[name], fmt)}{spread}" + (f", failed on {failed[name]} of {n} seeds"
                                                                if failed[name] else "")

    listing = "; ".join(show(name) for name in sorted(scores, key=lambda k: -sign * mean[k] if k in alive
                                                              else math.inf))
    if not alive:
        return dict(leader=None, separated=False, mean=mean, low=low, high=high, failed=failed,
                    text=f"every setting failed on every seed: {listing}")
    leader = max(alive, key=lambda name: sign * mean[name])
    seeds = len(scores[leader])
    worst = -math.inf if failed[leader] else sign * low[leader]
    others = [sign * high[name] for name in alive if name != leader]
    separated = seeds >= 2 and all(worst > other for other in others)
    tied = [name for name in alive if mean[name] == mean[leader]]
    if len(scores) == 1:
        text = f"only one setting: {listing}"
    elif len(tied) > 1:
        separated = False
        text = f"no winner: {', '.join(tied)} tie on the mean: {listing}"
    elif separated:
        text = f"{leader} is best on every one of {seeds} seeds: {listing}"
    elif seeds < 2:
        text = f"one seed only, so no winner is named ({leader} leads on it): {listing}"
    else:
        text = f"no clear winner: {leader} leads on the mean, within the seed-to-seed spread: {listing}"
    return dict(leader=leader, separated=separated, mean=mean, low=low, high=high, failed=failed, text=text)


def paired_difference(a, b, *, fmt: str = ".3g") -> dict:
    """``b[i] - a[i]`` for measurements of two settings on the same seeds, and whether the seeds agree.

    Pairing by seed removes what the two share (the start, the order of the batches). ``consistent``
    is True when there are at least two seeds and every difference has the same sign (none is zero);
    otherwise the sign of the mean is within the seed-to-seed noise. The text gives the chance that every
    seed agrees when there is no difference at all (2 ** (1 - n) for n seeds: 1 in 4 for 3), so that three
    agreeing seeds are read as the weak evidence they are. Returns ``{"mean", "low",
    "high", "differences", "consistent", "text"}``; ``text`` reads e.g. "+0.12 (+0.1 to +0.15),
    the same sign on every one of 3 seeds (1 chance in 4 ...)" with the numbers formatted by ``fmt`` (a sign is added).
    """
    a, b = [float(v) for v in a], [float(v) for v in b]
    if not a or len(a) != len(b):
        raise ValueError(f"give one number per seed for both settings, the same seeds: got {len(a)} and {len(b)}")
    if not all(math.isfinite(v) for v in a + b):
        raise ValueError(f"every measurement must be a finite number: got {a} and {b}")
    differences = [y - x for x, y in zip(a, b)]
    mean = sum(differences) / len(differences)
    low, high = min(differences), max(differences)
    show = lambda v: format(v, "+" + fmt)  # noqa: E731
    consistent = len(differences) >= 2 and (low > 0 or high < 0)
    if len(differences) == 1:
        text = f"{show(mean)} on one seed only: not evidence either way"
    elif consistent:
        # A sign test: with no real difference, n seeds all agree on the sign with probability 2 ** (1 - n).
        text = (f"{show(mean)} ({show(low)} to {show(high)}), the same sign on every one of {len(differences)} seeds "
                f"(1 chance in {2 ** (len(differences) - 1)} if there were no difference)")
    else:
        text = f"{show(mean)} ({show(low)} to {show(high)}): the seeds disagree on the sign, within the noise"
    return dict(mean=mean, low=low, high=high, differences=differences, consistent=consistent, text=text)


# --- Printed verdicts, decided by utils.outcomes -------------------------------------------------

def compared(name_a: str, a, name_b: str, b, *, percent: bool = False, fmt: str = ".3g", margin: float = 0.0,
             words: Mapping[str, str] | None = None) -> dict:
    """``a`` against ``b`` (one number per seed each) by ``utils.outcomes.compare``, with a sentence to print.

    The conclusion is outcomes.compare's: 'higher' or 'lower' only when the means differ by more than
    both seeds' spreads (half the range) plus ``margin``, else 'within the spread' ('not judged' with one
    seed each). ``words`` maps a conclusion to what it means in the lab's terms ("sharper", "no gap
    beyond the spread"); the sentence gives both means, the spread and those words. Returns
    ``{"conclusion", "mean_a", "mean_b", "spread", "text"}``.
    """
    from . import outcomes

    a, b = [float(v) for v in a], [float(v) for v in b]
    conclusion = outcomes.compare(name_a, a, name_b, b, margin=margin, percent=percent)
    (ma, sa), (mb, sb) = outcomes.mean_spread(a), outcomes.mean_spread(b)
    show = (lambda v: f"{v:.1%}") if percent else (lambda v: format(v, fmt))  # noqa: E731
    spread = sa + sb + margin
    said = {"not judged": "one seed each, not judged", "within the spread": f"within the seeds' spread (+-{show(spread)})",
            "higher": f"higher, beyond the seeds' spread (+-{show(spread)})",
            "lower": f"lower, beyond the seeds' spread (+-{show(spread)})"}[conclusion]
    text = f"{name_a} {show(ma)} against {name_b} {show(mb)}: {said}"
    if words and conclusion in words:
        text += f": {words[conclusion]}"
    return dict(conclusion=conclusion, mean_a=ma, mean_b=mb, spread=spread, text=text)


def best_of(scores: Mapping[str, list], *, what: str, fmt: str = ".1%", higher_is_better: bool = True,
            failed_as: float | None = 0.0) -> dict:
    """The best of several settings over seeds, named by ``utils.outcomes.best``; a listing and its sentence.

    ``scores[name]`` holds one number per seed; None or nan (a diverged run) counts as ``failed_as``
    (0 accuracy by default) and is named in the listing. Returns ``{"leader", "text", "mean"}``:
    ``leader`` is outcomes.best's winner, None when the best mean is within the seeds' spread of the
    runner-up (or there is one seed).
    """
    from . import outcomes

    if not scores:
        raise ValueError("no settings to compare")
    filled, failed = {}, {}
    for name, values in scores.items():
        values = list(values)
        failed[name] = len(values) - len(_finite(values))
        filled[name] = [float(v) if v is not None and math.isfinite(float(v)) else failed_as for v in values]
        if None in filled[name]:
            raise ValueError(f"{name!r} has a failed seed and failed_as is None")
    winner, sentence = outcomes.best(filled, higher_is_better=higher_is_better, what=what)
    mean = {name: sum(v) / len(v) for name, v in filled.items()}
    sign = 1 if higher_is_better else -1

    def show(name):
        v = filled[name]
        spread = f" ({format(min(v), fmt)} to {format(max(v), fmt)})" if len(v) > 1 else ""
        return f"{name} {format(mean[name], fmt)}{spread}" + (
            f", diverged on {failed[name]} of {len(v)} seeds (counted as {format(failed_as, fmt)})" if failed[name] else "")

    listing = "; ".join(show(name) for name in sorted(filled, key=lambda k: -sign * mean[k]))
    return dict(leader=winner, mean=mean, text=f"{sentence} ({listing})")

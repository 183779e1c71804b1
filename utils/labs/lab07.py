"""Lab 07's measurements, figures and printed verdicts: short training runs, the batch size's effects
(noise scale, critical batch, learning-rate rules) and the loss landscape.

Short training runs for lab 07: one configuration in, its history out, so that many can run as a sweep
on the engines (``utils.sweep``). Taught in labs/07_batch_size.ipynb.

    run = train_run(batch_size=256, lr=0.4, steps=500, eval_every=50)
    run["history"]          # [{"step", "samples", "train_loss", "test_loss", "test_accuracy"}, ...]

The model is lab 01's MLP on MNIST-1D (lab 04's size); each process builds the data once and keeps it.
Batches are drawn without replacement, epoch after epoch, from a generator seeded by ``seed``. A run
that diverges (a loss that is not finite, or ten times the loss at the start) stops at once and says so.

Batch size and learning rate: the gradient noise scale, the critical batch size, scaling rules (lab 07).

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

Sharpness and loss landscapes of a trained network (lab 07, "sharp minima" and "loss landscapes").

- ``epsilon_sharpness``: Keskar et al.'s own measure (2017, "On Large-Batch Training for Deep
  Learning: Generalization Gap and Sharp Minima", metric 2.1 in the full space): the largest rise of
  the loss in a small box around the weights, relative to the loss, in percent.
- ``top_hessian_eigenvalue``: the curvature of the loss in its steepest direction, by power
  iteration with Hessian-vector products, the sharpness measure of later studies (Yao et al. 2018,
  "Hessian-based analysis of large batch training").
- ``random_direction``, ``filter_normalize``, ``interpolate``, ``surface_2d``: the plots of Li et al.
  (2018, "Visualizing the Loss Landscape of Neural Nets"): the loss along the straight line between
  two solutions, and on a plane through one solution spanned by two filter-normalised random
  directions.

Works for any ``nn.Module``; the Hessian needs a twice-differentiable model and loss (tanh, not
ReLU, in ``utils.models.MLP``; with ReLU the second derivative of the activation is zero almost
everywhere and only the loss's curvature remains). A direction is a list of tensors in the order
of ``model.parameters()``. The losses are computed on ``x, y`` in one forward pass, moved to the
model's device: pass a subset of the data that fits in memory.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from utils import data, models, optim
from utils.train import train_step


MODEL = dict(n_layers=3, d_in=40, d_hidden=100, n_classes=10)
OPTIMIZERS = ("sgd", "lars", "lamb", "novograd")


@functools.lru_cache(maxsize=4)
def mnist1d(num_samples: int = 5000, seed: int = 42) -> data.Dataset:
    """MNIST-1D, made once per process (every configuration of a sweep on an engine reuses it)."""
    return data.mnist1d(num_samples=num_samples, seed=seed)


def make_optimizer(name: str, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "lars":
        return optim.LARS(params, lr=lr, momentum=momentum or 0.9, weight_decay=weight_decay)
    if name == "lamb":
        return optim.LAMB(params, lr=lr, weight_decay=weight_decay)
    if name == "novograd":
        return optim.NovoGrad(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


@torch.no_grad()
def _losses(model, dataset: data.Dataset) -> dict:
    model.eval()
    train_loss = F.cross_entropy(model(dataset.x_train), dataset.y_train).item()
    logits = model(dataset.x_test)
    model.train()
    return {"train_loss": train_loss, "test_loss": F.cross_entropy(logits, dataset.y_test).item(),
            "test_accuracy": (logits.argmax(1) == dataset.y_test).float().mean().item()}


def train_run(batch_size: int, lr: float, *, steps: int | None = None, epochs: float | None = None,
              optimizer: str = "sgd", momentum: float = 0.0, weight_decay: float = 0.0, warmup_steps: int = 0,
              warmup_start: float = 0.1, eval_every: int | None = None, target_accuracy: float | None = None,
              target_train_loss: float | None = None, num_samples: int = 5000,
              train_size: int | None = None, seed: int = 0, keep_state: bool = False) -> dict:
    """Train lab 07's MLP on MNIST-1D; return the configuration, the history and what happened.

    Give ``steps`` or ``epochs``. ``warmup_steps`` > 0 ramps the learning rate linearly from
    ``warmup_start * lr`` at step 0 to ``lr`` at step ``warmup_steps`` (``utils.optim.linear_warmup``,
    a ``LinearLR``; Goyal et al. 2017 start from the small batch's lr: ``warmup_start`` = base / batch).
    ``target_accuracy`` stops the run at the first evaluation that reaches it (``steps_to_target``);
    ``target_train_loss`` at the first evaluation whose loss on the whole training set is at most it
    (both given: whichever comes first).
    ``train_size`` keeps the first samples of the training split (a scaling-law sweep).
    ``keep_state`` returns the final weights (``state``) too.
    """
    dataset = mnist1d(num_samples)
    if train_size is not None:
        if not 1 <= train_size <= len(dataset.x_train):
            raise ValueError(f"train_size={train_size}: choose 1 .. {len(dataset.x_train)} (or a larger num_samples)")
        dataset = data.Dataset(dataset.name, dataset.x_train[:train_size], dataset.y_train[:train_size],
                               dataset.x_test, dataset.y_test, dataset.n_classes)
    n = len(dataset.x_train)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size={batch_size}: choose 1 .. {n}, the training samples")
    if (steps is None) == (epochs is None):
        raise ValueError("give either steps or epochs")
    steps = steps if steps is not None else max(1, math.ceil(epochs * n / batch_size))
    eval_every = eval_every or max(1, steps // 20)
    torch.manual_seed(seed)
    model = models.MLP(**MODEL)
    opt = make_optimizer(optimizer, model.parameters(), lr, momentum, weight_decay)
    scheduler = optim.linear_warmup(opt, warmup_steps, start_factor=warmup_start) if warmup_steps else None
    generator = torch.Generator().manual_seed(seed)
    order, position = torch.randperm(n, generator=generator), 0
    start = time.perf_counter()
    first = _losses(model, dataset)
    history = [{"step": 0, "samples": 0, **first}]
    step_losses, diverged, reached = [], False, None
    for step in range(1, steps + 1):
        if position + batch_size > n:                  # a new epoch: a new order, no partial batch
            order, position = torch.randperm(n, generator=generator), 0
        index = order[position:position + batch_size]
        position += batch_size
        loss = train_step(model, opt, dataset.x_train[index], dataset.y_train[index])
        if scheduler is not None:
            scheduler.step()
        step_losses.append(loss.item())
        if not math.isfinite(step_losses[-1]) or step_losses[-1] > 10 * first["train_loss"]:
            diverged = True
            break
        if step % eval_every == 0 or step == steps:
            history.append({"step": step, "samples": step * batch_size, **_losses(model, dataset)})
            if ((target_accuracy is not None and history[-1]["test_accuracy"] >= target_accuracy)
                    or (target_train_loss is not None and history[-1]["train_loss"] <= target_train_loss)):
                reached = step
                break
    result = {"batch_size": batch_size, "lr": lr, "optimizer": optimizer, "momentum": momentum,
              "warmup_steps": warmup_steps, "train_size": n, "history": history, "step_losses": step_losses,
              "diverged": diverged, "steps_to_target": reached, "seconds": time.perf_counter() - start,
              "final": history[-1]}
    if keep_state:
        result["state"] = {k: v.clone() for k, v in model.state_dict().items()}
    return result


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
    from utils import outcomes

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
    from utils import outcomes

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


def _trainable(model, why_needed: str) -> list:
    """The parameters that require grad; a ValueError that says why some are needed when there are none."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"the model has no parameter that requires grad: {why_needed}")
    return params


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextmanager
def _eval_and_restore(model: nn.Module):
    """Eval mode inside (no dropout, BatchNorm's running statistics); weights, buffers and mode restored after."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.load_state_dict(saved)
        model.train(was_training)


def _loss(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> float:
    device = _device(model)
    with torch.no_grad():
        return float(loss_fn(model(x.to(device)), y.to(device)))


def _check_direction(direction, model: nn.Module, name: str = "direction") -> list[torch.Tensor]:
    direction = list(direction)
    params = list(model.parameters())
    if len(direction) != len(params):
        raise ValueError(f"{name} has {len(direction)} tensors but the model has {len(params)} parameter tensors; "
                         f"build it with random_direction(model, seed) (one tensor per model.parameters())")
    for i, (d, p) in enumerate(zip(direction, params)):
        if tuple(d.shape) != tuple(p.shape):
            raise ValueError(f"{name}[{i}] has shape {tuple(d.shape)} but parameter {i} has shape {tuple(p.shape)}")
    return direction


def _params_of(state: dict, model: nn.Module, name: str) -> list[torch.Tensor]:
    """The tensors of ``state`` (a state_dict) for ``model.parameters()``, in that order."""
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in state]
    if missing:
        raise ValueError(f"{name} lacks the parameters {missing[:3]}{'...' if len(missing) > 3 else ''}: "
                         f"pass a state_dict of this model, e.g. "
                         f"{{k: v.clone() for k, v in model.state_dict().items()}}")
    return [state[n] for n in names]


# --- Sharpness -----------------------------------------------------------------------------------

def top_hessian_eigenvalue(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, iters: int = 20,
                           tol: float = 1e-3, seed: int = 0) -> float:
    """The eigenvalue of largest magnitude of the Hessian of ``loss_fn(model(x), y)``.

    The Hessian is taken over every parameter that requires grad, at the model's current weights,
    in eval mode (the model's mode and weights are left as they were). It is never formed: each
    power-iteration step multiplies a vector v by it with one extra backward pass through the
    gradient (Pearlmutter 1994: H v = d(g . v)/dw, ``torch.autograd.grad`` with
    ``create_graph=True``). Power iteration converges to the eigenvalue of largest *magnitude*:
    near a minimum that is the largest positive one (the sharpest direction, Keskar et al. 2016),
    but where negative curvature dominates the returned value is negative. The estimate is the
    Rayleigh quotient v . H v; it stops after ``iters`` steps, or earlier once it changes by less
    than ``tol`` relative to its size. ``seed`` fixes the random start vector.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    params = _trainable(model, "there is no Hessian to take")
    device = _device(model)
    generator = torch.Generator().manual_seed(seed)
    # Drawn on the CPU so that the same seed gives the same start vector on every device.
    v = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(device) for p in params]
    with _eval_and_restore(model):
        loss = loss_fn(model(x.to(device)), y.to(device))
        # allow_unused: a parameter the loss does not touch has a zero gradient and zero curvature.
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

        def hvp(vector):
            dot = sum((g * u).sum() for g, u in zip(grads, vector))
            if not dot.requires_grad:  # the gradient does not depend on the weights: H = 0
                return [torch.zeros_like(u) for u in vector]
            out = torch.autograd.grad(dot, params, retain_graph=True, allow_unused=True)
            return [torch.zeros_like(p) if h is None else h.detach() for p, h in zip(params, out)]

        norm = torch.sqrt(sum((u * u).sum() for u in v))
        v = [u / norm for u in v]
        eigenvalue = None
        for _ in range(iters):
            hv = hvp(v)
            new = float(sum((h * u).sum() for h, u in zip(hv, v)))  # Rayleigh quotient, |v| = 1
            hv_norm = float(torch.sqrt(sum((h * h).sum() for h in hv)))
            if hv_norm == 0.0:
                return 0.0  # v is in the null space; with a random start, H is (numerically) zero
            converged = eigenvalue is not None and abs(new - eigenvalue) <= tol * abs(new)
            eigenvalue = new
            if converged:
                break
            v = [h / hv_norm for h in hv]
    return eigenvalue


def epsilon_sharpness(model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, epsilon: float = 1e-3,
                      steps: int = 20, seed: int = 0) -> float:
    """Keskar et al.'s sharpness: the largest rise of the loss in a box around the weights, in percent.

    Their metric 2.1 with A = I (the whole weight space): with ``w`` the weights and ``f`` the loss,

        100 * (max over |d_i| <= epsilon (|w_i| + 1) of f(w + d)  -  f(w)) / (1 + f(w))

    The box is per weight and grows with the weight's size (``+ 1`` keeps it open around a weight
    at zero), so it is less sensitive to the weights' scale than the top Hessian eigenvalue, though
    not invariant. The maximum is not known in closed form: Keskar et al. search it with L-BFGS-B
    (a quasi-Newton method with bounds); here it is searched by projected sign-gradient ascent, the
    steepest ascent for a box (each step moves every weight by a quarter of its half-width in the
    direction that raises the loss, then clips to the box), from a seeded random start inside the
    box (at an exact minimum the gradient is zero), for ``steps`` steps, keeping the highest loss
    seen. Any search finds a lower bound of the true maximum; with the same settings it is the same
    lower bound for every solution it compares. Computed on ``x, y`` in one pass, in eval mode; the
    model's weights and mode are left as they were. Every parameter that requires grad is perturbed.
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r} (Keskar et al.'s boxes are of the order of 1e-3)")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    params = _trainable(model, "there is no box to search")
    device = _device(model)
    x, y = x.to(device), y.to(device)
    generator = torch.Generator().manual_seed(seed)
    with _eval_and_restore(model):
        start = [p.detach().clone() for p in params]
        half = [epsilon * (w.abs() + 1) for w in start]
        with torch.no_grad():
            base = float(loss_fn(model(x), y))
            # Drawn on the CPU so that the same seed gives the same start on every device.
            delta = [(torch.rand(w.shape, generator=generator, dtype=w.dtype).to(device) * 2 - 1) * h / 2
                     for w, h in zip(start, half)]
        highest = base
        for _ in range(steps):
            with torch.no_grad():
                for p, w, d in zip(params, start, delta):
                    p.copy_(w + d)
            loss = loss_fn(model(x), y)
            highest = max(highest, loss.item())
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for d, g, h in zip(delta, grads, half):
                    if g is not None:
                        d.add_(g.sign() * h / 4).clamp_(min=-h, max=h)
        with torch.no_grad():
            for p, w, d in zip(params, start, delta):
                p.copy_(w + d)
            highest = max(highest, float(loss_fn(model(x), y)))
    return 100 * (highest - base) / (1 + base)


# --- Directions (Li et al. 2018, section 4) ------------------------------------------------------

def random_direction(model: nn.Module, seed: int) -> list[torch.Tensor]:
    """A Gaussian random direction: one N(0, 1) tensor per ``model.parameters()``, same shapes.

    Drawn on the CPU from ``seed`` (so it is the same on every device), then moved to each
    parameter's device and dtype. Rescale it with ``filter_normalize`` before plotting.
    """
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in model.parameters()]


def filter_normalize(direction, model: nn.Module) -> list[torch.Tensor]:
    """Li et al.'s filter normalisation: each filter of the direction gets the norm of the same filter of the weights.

    A filter is one slice along the first dimension of a parameter tensor: a row of a Linear
    weight (one output neuron), an output channel of a Conv weight. A ReLU network computes the
    same function when a filter is scaled up and the next layer scaled down (with BatchNorm after
    it, at any scale of the filter), so a plain random direction moves small filters relatively
    much and large ones hardly at all; scaling each
    filter of the direction to ``||weights filter||`` makes plots of different networks comparable.
    A filter whose weights are zero gets a zero direction. 1-D tensors (biases, BatchNorm scales
    and shifts) get a zero direction, as in Li et al.'s plots ("ignore biasbn"): they stay at
    their trained values. Returns new tensors; ``direction`` is not modified.
    """
    direction = _check_direction(direction, model)
    out = []
    for d, w in zip(direction, model.parameters()):
        w = w.detach()
        if w.dim() <= 1:
            out.append(torch.zeros_like(d))
            continue
        d_norm = d.reshape(d.shape[0], -1).norm(dim=1)
        w_norm = w.reshape(w.shape[0], -1).norm(dim=1).to(d.dtype)
        # A zero filter in d (or in w) stays zero instead of becoming 0/0.
        scale = torch.where(d_norm > 0, w_norm / torch.where(d_norm > 0, d_norm, 1), 0)
        out.append(d * scale.reshape(-1, *([1] * (d.dim() - 1))))
    return out


# --- Plots ---------------------------------------------------------------------------------------

def interpolate(model: nn.Module, state_a: dict, state_b: dict, alphas, loss_fn, x: torch.Tensor,
                y: torch.Tensor) -> list[float]:
    """Losses on the straight line between two solutions (Goodfellow et al. 2015; Keskar et al. 2016, fig. 3).

    For each alpha, every parameter is set to ``(1 - alpha) * A + alpha * B`` (alpha = 0 is A,
    1 is B; values outside [0, 1] extrapolate) and ``loss_fn(model(x), y)`` is computed in eval
    mode without gradients. ``state_a`` and ``state_b`` are state_dicts of this model; buffers
    (BatchNorm's running statistics) are taken from A. The model's weights and mode are restored
    afterwards. Returns one float per alpha.
    """
    a = _params_of(state_a, model, "state_a")
    b = _params_of(state_b, model, "state_b")
    losses = []
    with _eval_and_restore(model):
        model.load_state_dict(state_a)  # A's buffers; its parameters are overwritten below
        for alpha in alphas:
            alpha = float(alpha)
            with torch.no_grad():
                for p, pa, pb in zip(model.parameters(), a, b):
                    p.copy_((1 - alpha) * pa.to(p) + alpha * pb.to(p))
            losses.append(_loss(model, loss_fn, x, y))
    return losses


def surface_2d(model: nn.Module, center_state: dict, d1, d2, coords, loss_fn, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """Losses on the plane ``center + a * d1 + b * d2`` for a and b in ``coords`` (Li et al. 2018).

    ``d1`` and ``d2`` are directions (lists matching ``model.parameters()``, usually
    ``filter_normalize(random_direction(model, seed), model)``); ``center_state`` is a state_dict
    of this model, whose buffers are used throughout. Returns a CPU tensor ``surface`` of shape
    ``[len(coords), len(coords)]`` with ``surface[i, j]`` the loss at ``a = coords[j]``,
    ``b = coords[i]``: rows follow d2 and columns d1, the layout ``plt.contour(coords, coords,
    surface)`` expects (d1 along the x axis). Evaluated in eval mode without gradients; the model's
    weights and mode are restored afterwards. Costs ``len(coords) ** 2`` forward passes.
    """
    center = _params_of(center_state, model, "center_state")
    d1 = _check_direction(d1, model, "d1")
    d2 = _check_direction(d2, model, "d2")
    coords = [float(c) for c in coords]
    surface = torch.empty(len(coords), len(coords), dtype=torch.float64)
    with _eval_and_restore(model):
        model.load_state_dict(center_state)
        for i, b in enumerate(coords):
            for j, a in enumerate(coords):
                with torch.no_grad():
                    for p, c, u, v in zip(model.parameters(), center, d1, d2):
                        p.copy_(c.to(p) + a * u.to(p) + b * v.to(p))
                surface[i, j] = _loss(model, loss_fn, x, y)
    return surface

"""Layer-wise adaptive optimisers for large batches, and a linear learning-rate warm-up.

Taught in labs/07 (batch size and learning rate). Each optimiser scales the step of every
parameter tensor by a ratio of norms, so that a layer whose gradient is large compared with its
weights does not take a step that wipes them out: the reason large-batch training with a large
learning rate can stay stable (You et al. 2017, 2019). The update rules are the papers' algorithms,
written out in each class's docstring; tests/library/test_optim.py compares single steps against them.

    optimizer = LARS(model.parameters(), lr=0.1 * batch_size / 256, weight_decay=5e-4)
    scheduler = linear_warmup(optimizer, warmup_steps=500, start_factor=256 / batch_size)
    for x, y in batches:
        ...; optimizer.step(); scheduler.step()

Every rule works on one parameter tensor at a time, with the hyper-parameters of its group
(each param group may override them); a parameter whose ``.grad`` is None is left untouched.
"""
from __future__ import annotations

import math

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ConstantLR, LRScheduler, LinearLR, SequentialLR


# --- argument checks: one ValueError per mistake, naming the fix ------------------------------

def _non_negative(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {name}={value!r}")


def _positive(name: str, value) -> None:
    _non_negative(name, value)
    if value == 0:
        raise ValueError(f"{name} must be > 0, got {name}=0")


def _fraction(name: str, value) -> None:
    """A decay rate of a running average: 0 <= value < 1 (at 1 the average would never move)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {name}={value!r}")


def _betas(value) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got betas={value!r}")
    _fraction("betas[0]", value[0])
    _fraction("betas[1]", value[1])


def _gradient(p: torch.Tensor, name: str) -> torch.Tensor:
    if p.grad.is_sparse:
        raise ValueError(f"{name} does not support sparse gradients; use a dense layer "
                         f"(e.g. nn.Embedding(..., sparse=False))")
    return p.grad


def _ratio_or_one(numerator: torch.Tensor, denominator: torch.Tensor, *zero_norms: torch.Tensor) -> torch.Tensor:
    """numerator / denominator, or 1.0 where any of ``zero_norms`` is 0.

    Computed with torch.where, not an ``if`` on ``.item()``: on a GPU an ``if`` would make the host
    wait for the device once per parameter tensor.
    """
    zero = torch.zeros((), dtype=numerator.dtype, device=numerator.device)
    for norm in zero_norms:
        zero = zero + (norm == 0)
    one = torch.ones_like(numerator)
    # The division still runs where a norm is 0 (and may give inf or nan); where() discards it.
    return torch.where(zero > 0, one, numerator / denominator)


class _LayerWise(Optimizer):
    """What the three optimisers share: the closure, and checks of each group's settings."""

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])  # after the defaults are filled in: overrides too

    def _check_group(self, group: dict) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns the closure's loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():  # the closure computes a loss and calls backward()
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, _gradient(p, type(self).__name__), self.state[p], group)
        return loss

    def _update(self, w: torch.Tensor, g: torch.Tensor, state: dict, group: dict) -> None:
        raise NotImplementedError


class LARS(_LayerWise):
    """Layer-wise Adaptive Rate Scaling (You, Gitman and Ginsburg 2017, "Large Batch Training of
    Convolutional Networks", arXiv:1708.03888, algorithm 1).

    For each parameter tensor w with gradient g::

        local_lr = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)
                   (1.0 when ||w|| or ||g|| is 0)
        v = momentum * v + lr * local_lr * (g + weight_decay * w)      (v starts at zero)
        w = w - v

    The 1.0 for a zero norm keeps a tensor that starts at zero (a bias) learning: its local_lr
    would otherwise be 0 for ever. State per tensor: ``momentum_buffer`` (v).
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float = 0.001, eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    def _check_group(self, group: dict) -> None:
        _non_negative("lr", group["lr"])
        _fraction("momentum", group["momentum"])
        _non_negative("weight_decay", group["weight_decay"])
        _positive("trust_coefficient", group["trust_coefficient"])
        _non_negative("eps", group["eps"])

    def _update(self, w, g, state, group):
        wd = group["weight_decay"]
        w_norm, g_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(g)
        local_lr = _ratio_or_one(group["trust_coefficient"] * w_norm, g_norm + wd * w_norm + group["eps"],
                                 w_norm, g_norm)
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(w)
        v = state["momentum_buffer"]
        v.mul_(group["momentum"]).add_((g + wd * w) * (group["lr"] * local_lr))
        w.sub_(v)


class _Moments(_LayerWise):
    """What LAMB and NovoGrad share: betas, eps and weight decay, checked the same way."""

    def _check_group(self, group: dict) -> None:
        _non_negative("lr", group["lr"])
        _betas(group["betas"])
        _non_negative("eps", group["eps"])
        _non_negative("weight_decay", group["weight_decay"])


class LAMB(_Moments):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2019, "Large Batch Optimization
    for Deep Learning: Training BERT in 76 minutes", arXiv:1904.00962, algorithm 2, with
    bias-corrected moments and the scaling function phi the identity).

    For each parameter tensor w with gradient g, at step t = 1, 2, ...::

        m = beta1 * m + (1 - beta1) * g            v = beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - beta1 ** t)               v_hat = v / (1 - beta2 ** t)
        r = m_hat / (sqrt(v_hat) + eps)            u = r + weight_decay * w
        ratio = ||w|| / ||u||                      (1.0 when either norm is 0)
        w = w - lr * ratio * u

    (m and v start at zero: Adam's moments, Kingma and Ba 2015.) State per tensor: ``step``,
    ``exp_avg`` (m) and ``exp_avg_sq`` (v), as torch's Adam names them.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))


    def _update(self, w, g, state, group):
        beta1, beta2 = group["betas"]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(w), exp_avg_sq=torch.zeros_like(w))
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        r = (m / (1 - beta1 ** t)) / ((v / (1 - beta2 ** t)).sqrt() + group["eps"])
        u = r + group["weight_decay"] * w
        w_norm, u_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(u)
        ratio = _ratio_or_one(w_norm, u_norm, w_norm, u_norm)
        w.sub_(u * (group["lr"] * ratio))


class NovoGrad(_Moments):
    """NovoGrad (Ginsburg et al. 2019, "Stochastic Gradient Methods with Layer-wise Adaptive Moments
    for Training of Deep Networks", arXiv:1905.11286, algorithm 1; the optimiser of the NVIDIA
    data-parallelism course).

    Its second moment is one number per tensor, not one per weight as in Adam. For each parameter
    tensor w with gradient g::

        v = ||g||^2                                     at the first step
        v = beta2 * v + (1 - beta2) * ||g||^2           after
        m = beta1 * m + (g / (sqrt(v) + eps) + weight_decay * w)     (m starts at zero)
        w = w - lr * m

    State per tensor: ``step``, ``exp_avg`` (m) and ``exp_avg_sq`` (v, a 0-d tensor).
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.95, 0.98), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))


    def _update(self, w, g, state, group):
        beta1, beta2 = group["betas"]
        g_norm_sq = torch.linalg.vector_norm(g).square()
        if not state:
            # The first v is the gradient's own norm, not (1 - beta2) of it: no bias to correct.
            state.update(step=0, exp_avg=torch.zeros_like(w), exp_avg_sq=g_norm_sq.clone())
        else:
            state["exp_avg_sq"].mul_(beta2).add_(g_norm_sq, alpha=1 - beta2)
        state["step"] += 1
        m = state["exp_avg"]
        m.mul_(beta1).add_(g / (state["exp_avg_sq"].sqrt() + group["eps"]) + group["weight_decay"] * w)
        w.sub_(m * group["lr"])


def linear_warmup(optimizer: Optimizer, warmup_steps: int, start_factor: float = 0.1,
                  after: LRScheduler | None = None) -> LRScheduler:
    """Gradual linear warm-up (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet
    in 1 Hour", arXiv:1706.02677, section 2.2), built from ``torch.optim.lr_scheduler`` only.

    Call ``scheduler.step()`` once after each ``optimizer.step()``. Optimizer step i (counted from
    0) then runs at ``lr * (start_factor + (1 - start_factor) * min(i, warmup_steps) / warmup_steps)``
    for every param group's own lr: step 0 at ``start_factor * lr``, and **step ``warmup_steps``
    is the first at the full lr** (a ``LinearLR``; it stays at the full lr after).

    start_factor: Goyal et al. start from the small batch's learning rate, so for a batch k times
      the reference batch (lr scaled k times by the linear-scaling rule) pass ``start_factor=1/k``.
    after: a scheduler built on the same optimizer that takes over at step ``warmup_steps``
      (counting its own steps from 0 there; joined with ``SequentialLR``), e.g.
      ``CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps)``. Build it before calling
      this function.
    warmup_steps=0 means no warm-up: ``after`` itself, or a constant lr (``ConstantLR``).
    """
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a whole number >= 0 (0: no warm-up), got {warmup_steps!r}")
    if not isinstance(start_factor, (int, float)) or not 0 < start_factor <= 1:
        raise ValueError(f"start_factor must be in (0, 1] (the warm-up starts at start_factor * lr), "
                         f"got {start_factor!r}; for a batch k times the reference batch use 1/k")
    if after is not None and getattr(after, "optimizer", None) is not optimizer:
        raise ValueError("`after` must be a scheduler built on the same optimizer, e.g. "
                         "after=CosineAnnealingLR(optimizer, T_max=...)")
    if warmup_steps == 0:
        return after if after is not None else ConstantLR(optimizer, factor=1.0, total_iters=0)
    warmup = LinearLR(optimizer, start_factor=start_factor, end_factor=1.0, total_iters=warmup_steps)
    if after is None:
        return warmup
    return SequentialLR(optimizer, [warmup, after], milestones=[warmup_steps])

"""Sharpness and loss landscapes of a trained network (lab 07, "sharp minima" and "loss landscapes").

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

from contextlib import contextmanager

import torch
from torch import nn


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

"""Parle: replicas coupled by a proximal and an elastic term. Taught in lab 08.

Chaudhari, Baldassi, Zecchina, Soatto, Talwalkar and Oberman 2017, "Parle: parallelizing
stochastic gradient descent" (arXiv:1707.00424), as its code does it (github.com/ucla-vision/parle,
``parle_mpi.py``). Each of n replicas (one per worker) keeps its weights y, the weights x it had
at the last synchronisation, an exponential average z of its weights and two momentum buffers:

    every step (Entropy-SGD's inner loop, Chaudhari et al. 2017, "Entropy-SGD"):
        y <- y - lr * nesterov(grad f(y) + gamma_t * (y - x))      proximal pull towards x
        z <- alpha * z + (1 - alpha) * y
    every L steps, ``synchronize`` (one all-reduce of z):
        y <- y - lr * nesterov(gamma_t * (x - z) + rho_t * (x - mean over replicas of z))
        x <- y                                                     elastic pull (Elastic-SGD)
    scoping: gamma_t = min(gamma * (1 + scoping)^(t // L), 1), rho_t = min(rho * (1 + scoping)^(t // L), 10)

with t the number of steps taken. The master, the average of the replicas' x, is the model the
original evaluates (``master``).

Special cases, each with its exact conditions (tests/library/test_parle.py compares each with an
independent implementation written from its paper):
  * n = 1, L = 1, gamma = rho = 0 is torch.optim.SGD with the same momentum (Nesterov or not).
  * n = 1, rho = 0 is *not* Entropy-SGD in general. Entropy-SGD (Chaudhari et al. 2017, Algorithm 1)
    restarts its inner iterate and its average from x every round and moves x from x; this update
    (like the original) never restarts z and moves x from the end of the inner loop
    (without momentum: x <- y_L - lr * gamma * (x - z)). Only with momentum 0 and alpha = 0 (z = y_L) is it Entropy-SGD
    without noise, whose average is its last inner iterate, with inner step lr and outer step
    lr + 1 / gamma.
  * L = 1, gamma = 0 is *not* Elastic-SGD (Zhang, Choromanska and LeCun 2015): the replicas are
    pulled towards the mean of their z recomputed at every synchronisation, after their gradient
    steps, where Elastic-SGD keeps a centre variable with an elastic update of its own. Only with
    rho = 0 too do both reduce to n independent SGD runs.

Where this differs from the original code (``parle_mpi.py``), and why:
  * Bug fixed: the original advances its step counter t inside its loop over parameter tensors,
    so t grows by the number of tensors per step and the scoping schedule runs that many times
    too fast (14 times for its LeNet). Here t grows once per step.
  * Bug fixed: the original's replica-count flag (-n) is overwritten by the number of MPI
    processes, so it does nothing. Here there is no such flag: the replica count *is* the number
    of workers (the size of the process group, or of the list in ``simulate``).
  * Nesterov momentum as torch.optim.SGD computes it (g + momentum * buffer); the original adds
    the buffer itself (g + buffer), which is not Nesterov's method and is not plain SGD at n = 1.
    For a constant gradient g and momentum 0.9 the original steps 11 g, this one 10 g, per lr.
  * At synchronisation the original weighs (x - z) by 1 whatever gamma; here by gamma_t, so that
    gamma = 0 switches the proximal coupling off in both places (which the SGD special case
    needs). With the default gamma = 0.01 the pull of x towards z is 100 times weaker here.
  * ``rho`` is the coefficient itself; the original multiplies its --rho flag by L * n (pass
    rho = flag * L * n to reproduce it). ``scoping`` is its 0.5 / (mini-batches per epoch).
  * One all-reduce of the z's per synchronisation; the master is computed only when asked for
    (``master``). The original does two Reduce + Bcast rounds per synchronisation (the mean of
    the z's, then the master) and also averages the training loss.
  * The caller sets the start, the learning rate and the number of steps. The original seeds each
    replica differently (so the replicas start apart), runs 5 "epochs" of len(loader) rounds of L
    mini-batches each (one of its epochs is L passes over the training set) and divides lr by 10
    after each; ``train_parle`` keeps lr constant.
  * Evaluation: the original loads the master and recomputes BatchNorm's statistics with a pass
    over the training set; ``train_parle`` averages the replicas' BatchNorm statistics instead.
"""
from __future__ import annotations

import copy
import functools
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .parallel_sgd import LocalSGDHistory, all_reduce_mean, worker_batches
from .train import evaluate


class Parle(torch.optim.Optimizer):
    """One replica's Parle optimizer: ``step()`` after each backward, ``synchronize()`` when
    ``due`` (every ``L`` steps). See the module's docstring for the update rules."""

    def __init__(self, params, lr: float, momentum: float = 0.9, nesterov: bool = True, gamma: float = 0.01,
                 rho: float = 0.01, L: int = 25, alpha: float = 0.75, scoping: float = 0.0,
                 gamma_max: float = 1.0, rho_max: float = 10.0):
        checks = {"lr": lr > 0, "momentum": 0 <= momentum < 1, "gamma": gamma >= 0, "rho": rho >= 0,
                  "alpha": 0 <= alpha < 1, "scoping": scoping >= 0, "gamma_max": gamma_max >= 0, "rho_max": rho_max >= 0}
        wrong = [name for name, ok in checks.items() if not ok]
        if wrong:
            raise ValueError(f"Parle needs lr > 0, 0 <= momentum < 1, 0 <= alpha < 1 and gamma, rho, scoping and "
                             f"their maxima >= 0; check {', '.join(wrong)}")
        if not isinstance(L, int) or L < 1:
            raise ValueError(f"L (inner steps between synchronisations) must be a whole number >= 1, got {L!r}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))
        self.gamma, self.rho, self.L, self.alpha, self.scoping = gamma, rho, L, alpha, scoping
        self.gamma_max, self.rho_max = gamma_max, rho_max
        self.t = 0                  # steps taken: advanced once per step (the original's bug: per tensor)
        self.last_sync = 0
        for p in self._params():
            self.state[p] = {"x": p.detach().clone(), "z": p.detach().clone(),
                             "inner": torch.zeros_like(p), "outer": torch.zeros_like(p)}

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def coefficients(self) -> tuple[float, float]:
        """(gamma_t, rho_t): both grow by a factor (1 + scoping) every L steps, up to their maxima."""
        growth = (1 + self.scoping) ** (self.t // self.L)
        return min(self.gamma * growth, self.gamma_max), min(self.rho * growth, self.rho_max)

    @property
    def due(self) -> bool:
        """True once L steps have passed since the last synchronisation."""
        return self.t - self.last_sync >= self.L

    @staticmethod
    def _direction(g, buffer, group):
        if group["momentum"] == 0:
            return g
        buffer.mul_(group["momentum"]).add_(g)
        return g.add(buffer, alpha=group["momentum"]) if group["nesterov"] else buffer

    @torch.no_grad()
    def step(self, closure=None):
        """One inner step: SGD with momentum on the loss plus gamma_t/2 |y - x|^2; updates z."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        gamma, _ = self.coefficients()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("Parle handles dense gradients only (use sparse=False in embeddings)")
                state = self.state[p]
                g = p.grad.add(p - state["x"], alpha=gamma)
                p.add_(self._direction(g, state["inner"], group), alpha=-group["lr"])
                state["z"].mul_(self.alpha).add_(p, alpha=1 - self.alpha)
        self.t += 1                 # once per step, outside the loop over tensors
        return loss

    def sync_tensors(self) -> list[torch.Tensor]:
        """The tensors ``synchronize`` averages over the replicas: each parameter's z."""
        return [self.state[p]["z"] for p in self._params()]

    @torch.no_grad()
    def synchronize(self, average=None, group=None) -> None:
        """The elastic step. ``average(tensors)`` must replace each tensor by its mean over the
        replicas, in place; by default an all-reduce over ``group`` (every rank must call this)."""
        average = average or functools.partial(all_reduce_mean, group=group)
        gamma, rho = self.coefficients()
        center = [z.clone() for z in self.sync_tensors()]
        average(center)
        means = iter(center)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                g = (state["x"] - state["z"]).mul_(gamma).add_(state["x"] - next(means), alpha=rho)
                p.add_(self._direction(g, state["outer"], group), alpha=-group["lr"])
                state["x"].copy_(p)
        self.last_sync = self.t

    @torch.no_grad()
    def master(self, average=None, group=None) -> list[torch.Tensor]:
        """The average over the replicas of their weights at the last synchronisation (x): the
        model the original evaluates. A collective, like ``synchronize``."""
        average = average or functools.partial(all_reduce_mean, group=group)
        xs = [self.state[p]["x"].clone() for p in self._params()]
        average(xs)
        return xs


def synchronize_all(optimizers: list[Parle]) -> None:
    """``synchronize`` every replica of a one-process simulation: the mean is over the list."""
    means = [sum(zs) / len(optimizers) for zs in zip(*(o.sync_tensors() for o in optimizers))]
    for o in optimizers:
        o.synchronize(lambda tensors: [t.copy_(m) for t, m in zip(tensors, means)])


def simulate(models: list[nn.Module], batches, steps: int, loss_fn=F.cross_entropy, **parle_options):
    """n replicas (``models``) in one process, each with its own ``Parle(**parle_options)``;
    ``batches(replica, step)`` gives that replica's ``(x, y)``. Returns the optimizers and each
    step's losses (one row per step, one column per replica)."""
    optimizers = [Parle(m.parameters(), **parle_options) for m in models]
    losses = []
    for step in range(steps):
        row = []
        for replica, (model, optimizer) in enumerate(zip(models, optimizers)):
            x, y = batches(replica, step)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            row.append(loss.item())
        losses.append(row)
        if optimizers[0].due:
            synchronize_all(optimizers)
    return optimizers, losses


@torch.no_grad()
def _load_master(model: nn.Module, optimizer: Parle, group) -> None:
    for p, mean_x in zip(optimizer._params(), optimizer.master(group=group)):
        p.copy_(mean_x)
    # Parle couples the parameters only; BatchNorm's statistics are averaged for evaluation.
    all_reduce_mean([b for b in model.buffers() if b.is_floating_point()], group)


def train_parle(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int, lr: float,
                L: int = 25, gamma: float = 0.01, rho: float = 0.01, momentum: float = 0.9, alpha: float = 0.75,
                scoping: float | None = None, group=None, seed: int = 0, shard: bool = False,
                x_test=None, y_test=None, eval_every: int | None = None) -> LocalSGDHistory:
    """Parle on this rank of ``group`` (one replica per rank, torch.distributed); every rank calls it.

    Each replica draws mini-batches from all of ``(x, y)`` in its own order, as the original does
    (``shard=True``: its own 1/n). ``scoping`` defaults to the original's 0.5 / (mini-batches per
    epoch). Returns a ``LocalSGDHistory`` (``averaging_time``: time in ``synchronize``); with test
    data the master is evaluated after a synchronisation at most every ``eval_every`` steps
    (default: only at the end). ``model`` ends as the master, the same on every rank: the mean
    of the replicas' weights at the last synchronisation, so steps after it (when ``steps`` is not
    a multiple of L) do not count.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    batches = worker_batches(len(x), rank, world_size, batch_size, seed, shard)
    if scoping is None:
        scoping = 0.5 / max(1, (len(x) // world_size if shard else len(x)) // batch_size)
    optimizer = Parle(model.parameters(), lr=lr, momentum=momentum, gamma=gamma, rho=rho, L=L, alpha=alpha,
                      scoping=scoping)
    history, last_eval, start = LocalSGDHistory(), 0, time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        idx = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        history.losses.append(loss.item())
        if optimizer.due:
            began = time.perf_counter()
            optimizer.synchronize(group=group)
            history.averaging_time += time.perf_counter() - began
            history.n_averages += 1
            if x_test is not None and eval_every is not None and step - last_eval >= eval_every:
                began = time.perf_counter()
                history.eval_seconds.append(began - start - history.eval_time)
                master = copy.deepcopy(model)
                _load_master(master, optimizer, group)
                test_loss, accuracy = evaluate(master, x_test, y_test)
                history.eval_steps.append(step)
                history.test_loss.append(test_loss)
                history.test_accuracy.append(accuracy)
                history.eval_time += time.perf_counter() - began
                last_eval = step
    history.wall_time = time.perf_counter() - start - history.eval_time
    _load_master(model, optimizer, group)
    if x_test is not None and (not history.eval_steps or history.eval_steps[-1] != steps):
        test_loss, accuracy = evaluate(model, x_test, y_test)
        history.eval_seconds.append(history.wall_time)
        history.eval_steps.append(steps)
        history.test_loss.append(test_loss)
        history.test_accuracy.append(accuracy)
    return history

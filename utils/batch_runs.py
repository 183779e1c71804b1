"""Short training runs for lab 07: one configuration in, its history out, so that many can run as a sweep
on the engines (``utils.sweep``). Taught in labs/07_batch_size.ipynb.

    run = train_run(batch_size=256, lr=0.4, steps=500, eval_every=50)
    run["history"]          # [{"step", "samples", "train_loss", "test_loss", "test_accuracy"}, ...]

The model is lab 01's MLP on MNIST-1D (lab 04's size); each process builds the data once and keeps it.
Batches are drawn without replacement, epoch after epoch, from a generator seeded by ``seed``. A run
that diverges (a loss that is not finite, or ten times the loss at the start) stops at once and says so.
"""
from __future__ import annotations

import functools
import math
import time

import torch
import torch.nn.functional as F

from . import data, models, optim

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
        loss = F.cross_entropy(model(dataset.x_train[index]), dataset.y_train[index])
        opt.zero_grad()
        loss.backward()
        opt.step()
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

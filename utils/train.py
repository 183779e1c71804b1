"""The course's training loop: mini-batch SGD with per-step timing and held-out evaluation.

Taught step by step in labs/01_mlp_cpu.ipynb; later labs reuse it. The log line is the
seed exercise's: ``step N | train_loss x | test_loss y | step time z.zzms``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import get_device


def train_step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step of ``model`` on the batch (x, y) with cross-entropy; returns the loss, detached (reading
    its value is the caller's choice: ``.item()`` waits for the device). The step every lab after 01 and the
    benchmarks take; labs 01 and 02 have learners write it."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def check_training_config(n_train: int, batch_size: int, lr: float, n_steps: int = 1, log_every: int = 1) -> None:
    """Raise a ValueError that names the fix for a setting no training run can use."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if batch_size > n_train:
        raise ValueError(f"batch_size={batch_size} is larger than the training set ({n_train} samples); "
                         f"use batch_size <= {n_train} or a larger train_size")
    if not lr > 0:
        raise ValueError(f"learning rate must be > 0, got lr={lr!r}")
    if not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be a whole number >= 1, got {n_steps!r}")
    if not isinstance(log_every, int) or log_every < 1:
        raise ValueError(f"log_every must be a whole number >= 1, got {log_every!r}")


def _epoch_orders(n: int, batch_size: int, seed: int, shuffle: bool):
    """Each epoch's sample order: a fresh permutation, or None for the stored order."""
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be between 1 and the number of samples ({n}), got {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randperm(n, generator=generator) if shuffle else None


def batch_indices(n: int, batch_size: int, seed: int = 0, shuffle: bool = True):
    """Endless mini-batch indices: a new permutation each epoch, the last partial batch dropped."""
    for order in _epoch_orders(n, batch_size, seed, shuffle):
        order = torch.arange(n) if order is None else order
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def epoch_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0, shuffle: bool = True):
    """Endless mini-batches ``(xb, yb)`` in the order of ``batch_indices``, as views.

    Each epoch reorders the tensors once (one gather of the whole set) and every step takes a
    contiguous slice: gathering scattered rows at every step cost about 0.1 ms a step on a
    2-core CPU (benchmarks/README.md).
    """
    for order in _epoch_orders(len(x), batch_size, seed, shuffle):
        xs, ys = (x, y) if order is None else (x[order.to(x.device)], y[order.to(y.device)])
        for start in range(0, len(x) - batch_size + 1, batch_size):
            yield xs[start:start + batch_size], ys[start:start + batch_size]


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` over all of ``(x, y)``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for start in range(0, len(x), batch_size):
        xb = x[start:start + batch_size].to(device, non_blocking=True)
        yb = y[start:start + batch_size].to(device, non_blocking=True)
        logits = model(xb)
        total_loss += F.cross_entropy(logits, yb, reduction="sum")
        correct += (logits.argmax(dim=1) == yb).sum()
    model.train(was_training)
    # One host-device sync for the whole evaluation, not one per batch.
    return total_loss.item() / len(x), correct.item() / len(x)


class StepTimer:
    """Times steps without adding a host-device sync to every step.

    On CUDA each step is bracketed by CUDA events and read back only when ``collect``
    is called; on other devices wall-clock time is exact because the work is synchronous.
    """

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._pending: list = []
        self._t0 = 0.0
        self.times_ms: list[float] = []

    def start(self) -> None:
        if self.cuda:
            self._pending.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
            self._pending[-1][0].record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._pending[-1][1].record()
        else:
            self.times_ms.append((time.perf_counter() - self._t0) * 1e3)

    def collect(self) -> list[float]:
        """All step times so far, in milliseconds."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.times_ms.extend(start.elapsed_time(end) for start, end in self._pending)
            self._pending.clear()
        return self.times_ms


@dataclass
class History:
    """What a training run measured; ``logged_*`` lists line up with ``logged_step``."""
    logged_step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)
    samples_seen: list[int] = field(default_factory=list)
    step_time_ms: list[float] = field(default_factory=list)  # every step
    batch_size: int = 0
    device: str = "cpu"

    @property
    def mean_step_ms(self) -> float:
        """Mean step time, skipping the first step (it pays one-off allocation costs)."""
        times = self.step_time_ms[1:] or self.step_time_ms
        return sum(times) / len(times)

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / (self.mean_step_ms / 1e3)


def log_line(step: int, train_loss: float, test_loss: float, step_ms: float) -> str:
    return f"step {step} | train_loss {train_loss:.4f} | test_loss {test_loss:.4f} | step time {step_ms:.2f}ms"


def train(model: nn.Module, data, *, batch_size: int = 64, lr: float = 0.1, lr_end_factor: float = 0.3,
          n_steps: int = 1000, log_every: int = 100, eval_size: int | None = None, device=None,
          seed: int = 0, shuffle: bool = True, progress: bool = True, print_log: bool = True) -> History:
    """Train ``model`` on ``data`` (a ``utils.data.Dataset``) with SGD and a linear LR decay.

    The learning rate goes linearly from ``lr`` to ``lr * lr_end_factor`` over ``n_steps``
    (the seed's ``LinearLR``). Every ``log_every`` steps, and after the last one, the loss
    is evaluated on up to ``eval_size`` training and test samples and the seed's log line
    printed with the mean step time since the previous log. ``shuffle=False`` walks the
    training set in order every epoch, as the seed exercise's ``SequentialSampler`` does.
    """
    check_training_config(len(data.x_train), batch_size, lr, n_steps, log_every)
    device = get_device(device) if not isinstance(device, torch.device) else device
    model.to(device).train()
    # The datasets of these labs fit in memory: moving them once avoids a copy per step.
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    n_eval = eval_size or len(x_train)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=lr_end_factor,
                                                  total_iters=n_steps)
    history = History(batch_size=batch_size, device=str(device))
    timer = StepTimer(device)
    batches = epoch_batches(x_train, y_train, batch_size, seed=seed, shuffle=shuffle)
    bar = progress_bar(n_steps, progress)
    last_logged = 0
    for step in range(n_steps):
        xb, yb = next(batches)  # a new epoch's shuffle happens here, outside the timed step
        timer.start()
        train_step(model, optimizer, xb, yb)
        scheduler.step()
        timer.stop()
        bar.update(1)
        if step % log_every == 0 or step == n_steps - 1:
            times = timer.collect()
            train_loss, _ = evaluate(model, x_train[:n_eval], y_train[:n_eval])
            test_loss, test_acc = evaluate(model, x_test[:n_eval], y_test[:n_eval])
            step_ms = sum(times[last_logged:]) / len(times[last_logged:])
            last_logged = len(times)
            history.logged_step.append(step)
            history.train_loss.append(train_loss)
            history.test_loss.append(test_loss)
            history.test_accuracy.append(test_acc)
            history.samples_seen.append((step + 1) * batch_size)
            if print_log:
                bar.write(log_line(step, train_loss, test_loss, step_ms))
    bar.close()
    history.step_time_ms = list(timer.collect())
    return history


def time_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, n_steps: int = 20,
               warmup: int = 3, lr: float = 0.01, device=None) -> float:
    """Median milliseconds of one SGD step at ``batch_size``, after ``warmup`` untimed steps."""
    check_training_config(len(x), batch_size, lr, n_steps)
    device = get_device(device) if not isinstance(device, torch.device) else device
    model.to(device).train()
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    timer = StepTimer(device)
    batches = epoch_batches(x, y, batch_size)
    for i in range(warmup + n_steps):
        xb, yb = next(batches)
        if i >= warmup:
            timer.start()
        train_step(model, optimizer, xb, yb)
        if i >= warmup:
            timer.stop()
    return float(torch.tensor(timer.collect()).median())


class _NoBar:
    def update(self, n): pass
    def set_postfix(self, **values): pass
    def write(self, line): print(line)
    def close(self): pass


def progress_bar(total: int, enabled: bool, desc: str = "training", unit: str = "step", leave: bool = False):
    """A tqdm bar of ``total`` items (training steps, a sweep's runs), or, when not ``enabled``, one that
    shows nothing but what is written through it."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave)

"""Hogwild!: processes updating one model in shared memory without locks. Taught in lab 08.

Niu, Recht, Re and Wright 2011, "Hogwild!: A lock-free approach to parallelizing stochastic
gradient descent": P processes read the shared weights, compute a gradient and write their update
back, with no lock. A process may read weights that another is half-way through writing, and two
read-modify-writes of the same weight at once lose one of them. The paper proves this harmless
when updates are *sparse* (each touches few weights, so they seldom collide); ``lost_updates``
measures how often they collide on a dense and on a sparse model.

    result = hogwild.train_hogwild(models.CNN(data.input_shape), (data.x_train, data.y_train),
                                   processes=4, epochs=2, batch_size=32, lr=0.05)
    result.model, result.train_time, result.updates

Unlike PyTorch's mnist_hogwild example, where every process trains on the whole data set (so P
processes do P times the work of one), each process here trains on its own 1/P shard: P processes
do one process's work between them, and the speed-up is a real one. Processes start with the
``spawn`` method (a forked child inherits the parent's threads and locks: unsafe with PyTorch's
thread pools and on macOS), each with its own thread count, optimizer and momentum buffers. The
model's class must be importable from a module (e.g. ``utils.models``): spawned processes import
it; a class defined in a notebook cannot be found there.

In lab 08 the learners start the processes themselves (exercise 8.4); ``Worker`` is what each of
their processes runs there: their own worker function, sent by value, timed, started together.
"""
from __future__ import annotations

import copy
import os
import queue
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from .parallel_sgd import shard_indices
from .train import train_step


class HogwildError(RuntimeError):
    """A worker process raised or died; the message carries its traceback."""


def _entry(target, rank, parent, args, results, ready, n, threads):
    try:
        torch.set_num_threads(threads)
        with ready.get_lock():
            ready.value += 1
        # Start together (spawning and importing torch take seconds), unless the parent is gone.
        while ready.value < n:
            _stop_if_orphaned(parent)
            time.sleep(0.01)
        results.put(("ok", rank, target(rank, parent, *args)))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def run_processes(target, args_per_process: list, threads_per_process: int = 1, timeout: float | None = None) -> list:
    """``target(rank, parent_pid, *args)`` in one spawned process per entry of ``args_per_process``;
    their return values in rank order. The first error is raised here (``HogwildError`` with the
    worker's traceback); whatever happens, including KeyboardInterrupt, every process is ended and
    joined before this returns. Results must pickle by value (numbers, lists, numpy arrays)."""
    ctx = mp.get_context("spawn")
    results, ready, n = ctx.Queue(), ctx.Value("i", 0), len(args_per_process)
    procs = [ctx.Process(target=_entry, daemon=True,
                         args=(target, rank, os.getpid(), args, results, ready, n, threads_per_process))
             for rank, args in enumerate(args_per_process)]
    got, end = {}, None if timeout is None else time.monotonic() + timeout
    try:
        for proc in procs:
            proc.start()
        silent_polls = 0
        while len(got) < len(procs):
            try:
                status, rank, value = results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in got]
                silent_polls = silent_polls + 1 if dead else 0
                if silent_polls >= 5:      # a report may still be in the pipe: give it a second
                    raise HogwildError(f"process {dead[0]} exited with code {procs[dead[0]].exitcode} without a "
                                       f"report (see its stderr; \"Can't get attribute\" there means the model's "
                                       f"class must be importable from a module, not defined in a notebook)") from None
                if end is not None and time.monotonic() > end:
                    raise TimeoutError(f"Hogwild processes still running after {timeout} s") from None
                continue
            if status == "error":
                raise HogwildError(f"process {rank} of {len(procs)} raised:\n{value}")
            got[rank] = value
        return [got[r] for r in range(len(procs))]
    finally:
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
        for proc in procs:
            if proc.pid is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()


def _stop_if_orphaned(parent: int) -> None:
    # A killed kernel cannot end its children; they notice that their parent changed and stop.
    if os.getppid() != parent:
        raise SystemExit("the parent process is gone")


def wait_for_all(ready: torch.Tensor, rank: int, timeout: float) -> bool:
    """Process ``rank`` marks its slot of ``ready`` (a shared tensor, one slot per process) and waits
    until every slot is marked: a common start, since spawning a process and importing torch take
    seconds. Returns False if ``timeout`` seconds ran out first (processes started one after another)."""
    ready[rank] = 1
    deadline = time.monotonic() + timeout
    while int(ready.sum()) < len(ready):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Worker:
    """What each process runs when the learner's own code starts the Hogwild processes (lab 08,
    exercise 8.4): ``worker(rank, model, x, y)`` runs ``fn(model, x, y, *args, seed * 65537 + rank + 1)``
    (``train_hogwild``'s per-process seed) with one torch thread, after all ``processes`` have started
    (at most ``wait_s`` seconds), and records in shared memory what the lab reports: each process's
    updates (``fn``'s return value) and the start and end of its training (CLOCK_MONOTONIC, which is
    system-wide). ``fn`` may come from a notebook: it travels by value, pickled with cloudpickle."""

    def __init__(self, fn, processes: int, *args, seed: int = 0, wait_s: float = 60.0):
        import cloudpickle

        self.payload, self.args, self.seed, self.wait_s = cloudpickle.dumps(fn), args, seed, wait_s
        self.ready = torch.zeros(processes, dtype=torch.int32).share_memory_()
        self.updates = torch.zeros(processes, dtype=torch.int64).share_memory_()
        self.times = torch.zeros(processes, 2, dtype=torch.float64).share_memory_()

    def __call__(self, rank: int, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        import cloudpickle

        torch.set_num_threads(1)
        fn = cloudpickle.loads(self.payload)
        wait_for_all(self.ready, rank, self.wait_s)
        self.times[rank, 0] = time.monotonic()
        self.updates[rank] = fn(model, x, y, *self.args, self.seed * 65537 + rank + 1)
        self.times[rank, 1] = time.monotonic()

    def train_time(self) -> float:
        """From the first process's start to the last one's end, in seconds."""
        return float(self.times[:, 1].max() - self.times[:, 0].min())


class Snapshots:
    """Copies of a shared Hogwild model taken while ``worker``'s processes train it, for measurement.

    A thread of the parent process waits until every process has started training (``worker.times``),
    then copies the shared weights every ``every_s`` seconds until all have ended, and once more at
    the end (``take_last``). Each copy is stamped with the training time since the common start; the
    copies are evaluated afterwards (``evaluate``), so evaluation never takes time from training and
    Hogwild's time to a target is read as the other methods' is. The processes never see the copies.

        snaps = hogwild.Snapshots(model, worker, every_s=2.0)
        with snaps:
            hogwild_train(model, x, y, processes, worker)
        times, accuracies = snaps.evaluate(x_test, y_test)
    """

    def __init__(self, model: nn.Module, worker: "Worker", every_s: float, timeout_s: float = 600.0):
        import threading

        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s!r}")
        self.model, self.worker, self.every_s, self.timeout_s = model, worker, every_s, timeout_s
        self.taken: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _copy(self) -> dict:
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not bool((self.worker.times[:, 0] > 0).all()):      # every process training
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            time.sleep(0.005)
        start = float(self.worker.times[:, 0].min())
        due = start + self.every_s
        while not self._stop.is_set() and not bool((self.worker.times[:, 1] > 0).all()):
            now = time.monotonic()
            if now >= due:
                self.taken.append((now - start, self._copy()))
                due += self.every_s
            time.sleep(min(0.005, max(0.0, due - now)))

    def __enter__(self) -> "Snapshots":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.take_last()

    def take_last(self) -> None:
        """The trained model, stamped with the whole training time (``worker.train_time()``)."""
        self.taken.append((self.worker.train_time(), self._copy()))

    def evaluate(self, x_test: torch.Tensor, y_test: torch.Tensor) -> tuple[list[float], list[float]]:
        """(training seconds, test accuracy) of every copy, in the order taken."""
        from .train import evaluate

        probe = copy.deepcopy(self.model)
        times, accuracies = [], []
        for seconds, state in self.taken:
            probe.load_state_dict(state)
            times.append(seconds)
            accuracies.append(evaluate(probe, x_test, y_test)[1])
        return times, accuracies


@dataclass
class HogwildResult:
    """``model``: the shared model, trained. ``wall_time``: the whole call, start-up included;
    ``train_time``: from the common start to the last process's end. ``updates[r]``: SGD steps of
    process r; ``epoch_losses[r]``: its mean training loss over each epoch on its shard."""
    model: nn.Module
    wall_time: float
    train_time: float
    updates: list
    epoch_losses: list


def _train_worker(rank, parent, model, x, y, epochs, batch_size, lr, momentum, seed, share):
    if not share:
        # What fork without share_memory() gives: a private copy that the parent never sees.
        model = copy.deepcopy(model)
    torch.manual_seed(seed + rank)                       # dropout masks differ between processes
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)   # its own momentum
    generator = torch.Generator().manual_seed(seed * 65537 + rank + 1)
    updates, epoch_losses, start = 0, [], time.monotonic()
    model.train()
    for _ in range(epochs):
        total = 0.0
        for idx in torch.randperm(len(x), generator=generator).split(batch_size):
            _stop_if_orphaned(parent)
            loss = train_step(model, optimizer, x[idx], y[idx])   # its step writes the shared weights, no lock
            updates += 1
            total += loss.item() * len(idx)
        epoch_losses.append(total / len(x))
    return updates, epoch_losses, start, time.monotonic()


def train_hogwild(model: nn.Module, data, *, processes: int, epochs: int, batch_size: int, lr: float,
                  momentum: float = 0.0, seed: int = 0, threads_per_process: int = 1,
                  share_memory: bool = True, timeout: float | None = None) -> HogwildResult:
    """Train ``model`` (CPU) in place with Hogwild on ``processes`` spawned processes; each runs
    ``epochs`` passes of plain SGD (``momentum`` optional, its buffers private) over its own random
    shard of ``data`` (an ``(x, y)`` pair, or a ``utils.data.Dataset``'s training split).

    ``share_memory=False`` is for teaching only: each process trains a private copy (as a forked
    process does with a model that was never moved to shared memory) and the returned model has
    not changed. Note that torch.multiprocessing moves any tensor it *sends* to another process
    into shared memory, so under spawn the copy has to be explicit; ``share_memory()`` states the
    intent and also works with fork.
    """
    x, y = (data.x_train, data.y_train) if hasattr(data, "x_train") else data
    for name, value in (("processes", processes), ("epochs", epochs), ("batch_size", batch_size),
                        ("threads_per_process", threads_per_process)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}; pass matching inputs and labels")
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("Hogwild shares the model through CPU shared memory; pass a model on the CPU (model.cpu())")
    if share_memory:
        model.share_memory()
    model.zero_grad(set_to_none=True)    # each process allocates its own gradients
    args = [(model, x[s], y[s], epochs, batch_size, lr, momentum, seed, share_memory)
            for s in shard_indices(len(x), processes, seed)]
    start = time.perf_counter()
    reports = run_processes(_train_worker, args, threads_per_process, timeout)
    wall_time = time.perf_counter() - start
    train_time = max(r[3] for r in reports) - min(r[2] for r in reports)   # CLOCK_MONOTONIC: system-wide
    return HogwildResult(model, wall_time, train_time, [r[0] for r in reports], [r[1] for r in reports])

# --- Lost updates: dense against sparse -----------------------------------------------------

def sparse_problem(n_samples: int = 5000, n_features: int = 10_000, active: int = 5, n_classes: int = 10,
                   seed: int = 0):
    """Samples with ``active`` non-zero features out of ``n_features`` (as indices and values),
    labelled by a random linear teacher: the kind of problem Hogwild was made for."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(n_features, (n_samples, active), generator=g)
    values = torch.randn(n_samples, active, generator=g, dtype=torch.float64)
    teacher = torch.randn(n_features, n_classes, generator=g, dtype=torch.float64)
    y = (teacher[indices] * values.unsqueeze(-1)).sum(1).argmax(1)
    return indices, values, y


class SparseLinear(nn.Module):
    """A linear model on sparse inputs whose SGD update writes only the rows of the features
    present in the batch (sparse gradients): ``active`` x ``n_classes`` weights per sample."""

    def __init__(self, n_features: int, n_classes: int):
        super().__init__()
        self.weight = nn.EmbeddingBag(n_features, n_classes, mode="sum", sparse=True)

    def forward(self, indices, values):
        return self.weight(indices, per_sample_weights=values)


class DenseMLP(nn.Module):
    """An MLP on the same inputs made dense: every update writes every weight (a zero gradient
    still means a read-modify-write), even where the inputs were zero."""

    def __init__(self, n_features: int, n_classes: int, hidden: int = 16):
        super().__init__()
        self.n_features = n_features
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, indices, values):
        x = torch.zeros(len(indices), self.n_features, dtype=values.dtype).scatter_add_(1, indices, values)
        return self.net(x)


def _probe_worker(rank, parent, model, indices, values, y, steps, batch_size, lr, seed):
    params = list(model.parameters())
    applied = [torch.zeros_like(p) for p in params]       # the sum of this process's increments
    magnitude = [torch.zeros_like(p) for p in params]     # the sum of their absolute values
    generator = torch.Generator().manual_seed(seed * 65537 + rank + 1)
    began, writing, written, rows = [], [], [], []
    for _ in range(steps):
        _stop_if_orphaned(parent)
        idx = torch.randint(len(y), (batch_size,), generator=generator)
        for p in params:
            p.grad = None
        began.append(time.monotonic())                    # the read of the shared weights starts
        F.cross_entropy(model(indices[idx], values[idx]), y[idx]).backward()
        deltas = [(p.grad.coalesce() if p.grad.is_sparse else p.grad) * -lr for p in params]
        writing.append(time.monotonic())
        with torch.no_grad():
            for p, delta in zip(params, deltas):
                p.add_(delta)                             # the unlocked read-modify-write
        written.append(time.monotonic())
        for a, m, delta in zip(applied, magnitude, deltas):
            a.add_(delta)
            m.add_(delta.abs())
        rows.append(set(indices[idx].unique().tolist()) if isinstance(model, SparseLinear) else None)
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts]).numpy()
    return flat(applied), flat(magnitude), np.array(began), np.array(writing), np.array(written), rows


def _conflicts(began: list, written: list, rows: list) -> list[np.ndarray]:
    """Per process, which updates' intervals ``[began, written]`` overlapped in time with another
    process's on at least one common weight (``rows`` None: every weight)."""
    flags = [np.zeros(len(b), dtype=bool) for b in began]
    for a in range(len(began)):
        for b in range(a + 1, len(began)):
            for i in range(len(began[a])):
                # b's intervals follow one another, so those overlapping a's i-th one form a range
                lo = np.searchsorted(written[b], began[a][i], side="right")
                hi = np.searchsorted(began[b], written[a][i], side="left")
                for j in range(lo, hi):
                    if rows[a][i] is None or rows[a][i] & rows[b][j]:
                        flags[a][i] = flags[b][j] = True
    return flags


def lost_updates(kind: str = "sparse", *, processes: int = 2, steps: int = 2000, batch_size: int = 1,
                 lr: float = 0.05, n_features: int = 10_000, active: int = 5, n_classes: int = 10,
                 hidden: int = 16, seed: int = 0) -> dict:
    """Run Hogwild (plain SGD, float64, each process sampling the whole set) on a ``"dense"``
    (``DenseMLP``) or ``"sparse"`` (``SparseLinear``) model of ``sparse_problem`` and measure its
    collisions. Returns a dict of numbers to plot:

    - ``conflict_fraction``: the fraction of updates that overlapped in time, from reading the
      weights to writing them, with another process's update of a common weight: updates
      computed on weights that changed underneath, the collisions Niu et al. count on being rare.
    - ``write_overlap_fraction``: the fraction whose writes (the ``add_`` calls alone) overlapped
      in time another process's writes of a common weight: two processes writing at once.
    - ``lost_fraction``: increments lost by colliding writes, ``sum|applied - observed|`` over
      ``sum|increments|``. Each process adds up the increments it wrote (``applied``); without
      collisions their total equals the net change of the shared weights (``observed``), up to
      rounding: float64 keeps that below 1e-12, far below one lost increment.
    - ``lost_weights``: how many weights lost part of their increments; ``written_per_update``:
      the fraction of the weights one update writes; ``weights``, ``updates``, ``train_time``.
    """
    if kind not in ("dense", "sparse"):
        raise ValueError(f"kind must be 'dense' or 'sparse', got {kind!r}")
    indices, values, y = sparse_problem(n_features=n_features, active=active, n_classes=n_classes, seed=seed)
    torch.manual_seed(seed)
    model = (DenseMLP(n_features, n_classes, hidden) if kind == "dense" else SparseLinear(n_features, n_classes))
    model = model.double().share_memory()
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
    args = [(model, indices, values, y, steps, batch_size, lr, seed)] * processes
    start = time.perf_counter()
    reports = run_processes(_probe_worker, args)
    wall_time = time.perf_counter() - start
    applied, magnitude = sum(r[0] for r in reports), sum(r[1] for r in reports)
    observed = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy() - before
    missing = np.abs(applied - observed)
    began, writing, written, rows = ([r[i] for r in reports] for i in (2, 3, 4, 5))
    in_flight, writes = _conflicts(began, written, rows), _conflicts(writing, written, rows)
    per_update = np.mean([len(r) for rs in rows for r in rs]) * n_classes if kind == "sparse" else len(before)
    return {"kind": kind, "processes": processes, "weights": len(before), "updates": processes * steps,
            "written_per_update": float(per_update / len(before)),
            "conflict_fraction": float(np.mean(np.concatenate(in_flight))),
            "write_overlap_fraction": float(np.mean(np.concatenate(writes))),
            "lost_fraction": float(missing.sum() / magnitude.sum()),
            "lost_weights": int((missing > 1e-9 * magnitude + 1e-12).sum()),
            "train_time": float(max(w[-1] for w in written) - min(b[0] for b in began)), "wall_time": wall_time}

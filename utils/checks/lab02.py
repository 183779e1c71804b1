"""Checks for labs/02_single_gpu.ipynb."""
from __future__ import annotations

import copy
import numbers
import queue
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import ExerciseError, Incorrect, exercise, expect, hint_for
from ..models import MLP
from ..perf import best_ms

HINTS = {
    "2.1": """Step by step:
1. losses = [] before the loop.
2. For each (x, y) in batches: loss = F.cross_entropy(model(x), y); optimizer.zero_grad();
   loss.backward(); optimizer.step().
3. losses.append(loss.detach()): the loss stays a tensor on the device, without its autograd graph.
4. After the loop, return torch.stack(losses): one 1-D tensor, still on the device. No .item(), float(),
   print, .cpu() or torch.tensor(...) anywhere: each of them waits for the device.""",
    "2.2": """Step by step:
1. fn() once: the warm-up, outside the timed region.
2. sync(device): the warm-up's work must have finished before the clock starts.
3. start = time.perf_counter(); call fn() `repeats` times.
4. sync(device): wait for the work those calls queued, then read time.perf_counter() again.
5. Return (end - start) * 1000 / repeats: milliseconds per call.
(With CUDA events instead: start.record() before the calls, end.record() after them, end.synchronize(),
then start.elapsed_time(end) / repeats.)""",
}


hint = hint_for(HINTS)  # lab02.hint("2.1") prints that exercise's step-by-step hint

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
# Tensor methods that copy a value to the host (and so wait for the device on a GPU).
_HOST_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__",
               "__repr__", "__format__")


@contextmanager
def _count_host_reads():
    """Count host reads of tensors (``.item()``, ``float()``, ``print``...) made by the learner's code.

    Calls from inside torch itself are not counted, only those written in the learner's code.
    Yields a dict ``{method name: count}``.
    """
    counts: dict[str, int] = {}
    saved = {name: torch.Tensor.__dict__.get(name) for name in _HOST_READS}

    def spy(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if not caller.startswith(_TORCH_DIR):
                counts[name] = counts.get(name, 0) + 1
            with warnings.catch_warnings():  # torch's warnings would point at this file, not the learner's
                warnings.simplefilter("ignore")
                return original(self, *args, **kwargs)
        return wrapper

    try:
        for name in _HOST_READS:
            setattr(torch.Tensor, name, spy(name))
        yield counts
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)


@contextmanager
def _sync_debug_mode(mode: str):
    """Make CUDA synchronising operations raise (``error``) or warn, and restore the mode after."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ynchronization debug mode.*")
        torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Ss]ynchronization debug mode.*")
            torch.cuda.set_sync_debug_mode(previous)


def _reference_losses(model, batches, lr: float, zero_grad: bool = True) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _describe_reads(counts: dict[str, int]) -> str:
    names = {"item": ".item()", "tolist": ".tolist()", "numpy": ".numpy()", "__float__": "float(tensor)",
             "__int__": "int(tensor)", "__bool__": "a tensor in an `if` or `bool()`",
             "__index__": "a tensor used as a Python index", "__repr__": "print(tensor)",
             "__format__": "a tensor in an f-string"}
    return ", ".join(f"{names[name]} ({n}x)" for name, n in counts.items())


def check_train_steps(train_steps) -> None:
    """Exercise 2.1: ``train_steps(model, optimizer, batches) -> 1-D tensor of losses on the device``."""
    with exercise("Exercise 2.1 (train_steps)"):
        # An explicit index: torch.device("cuda") != torch.device("cuda:0"), the device tensors report.
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        n_steps, lr = 5, 0.5
        torch.manual_seed(0)
        model = MLP(2, 12, 8, 4).to(device)
        batches = [(torch.randn(16, 12, device=device), torch.randint(0, 4, (16,), device=device))
                   for _ in range(n_steps)]
        start = copy.deepcopy(model)
        reference_model = copy.deepcopy(start)
        expected = _reference_losses(reference_model, batches, lr)

        learner_model = copy.deepcopy(start)
        optimizer = torch.optim.SGD(learner_model.parameters(), lr=lr)
        with _count_host_reads() as reads:
            result = train_steps(learner_model, optimizer, batches)

        expect(result is not None, "train_steps returned None: end it with return torch.stack(losses)")
        if isinstance(result, (list, tuple)):
            if result and all(isinstance(v, numbers.Number) for v in result):
                expect(False, f"train_steps returned a {type(result).__name__} of Python numbers: you called "
                              f".item() (or float()) on each loss, and on a GPU every such call waits for the "
                              f"step to finish. Keep each loss on the device (losses.append(loss.detach())) "
                              f"and return torch.stack(losses)")
            if result and all(isinstance(v, torch.Tensor) for v in result):
                expect(False, f"train_steps returned a {type(result).__name__} of tensors; return one 1-D "
                              f"tensor instead: torch.stack(losses)")
        expect(not isinstance(result, numbers.Number),
               f"train_steps returned one Python number ({result!r}): you called .item() or float(), and "
               f"it should give every step's loss. Append loss.detach() to a list at each step and return "
               f"torch.stack(losses)")
        expect(isinstance(result, torch.Tensor),
               f"train_steps should return a tensor of the per-step losses, got {type(result).__name__}")
        expect(result.device == device,
               f"the returned losses are on {result.device} but the model is on {device}: keep them on "
               f"the device with torch.stack(losses) (torch.tensor(list) or .cpu() copies them to the "
               f"host, which waits for the device)")
        expect(result.dim() == 1 and len(result) == n_steps,
               f"with {n_steps} batches train_steps should return shape ({n_steps},), one loss per step, "
               f"got shape {tuple(result.shape)}")
        expect(not result.requires_grad,
               "the returned losses still require grad, so each one keeps its step's autograd graph "
               "alive: store loss.detach(), not loss")
        changed = any(not torch.equal(p, q) for p, q in zip(learner_model.parameters(), start.parameters()))
        expect(changed, "the model's weights did not change: for every batch call optimizer.zero_grad(), "
                        "loss.backward(), then optimizer.step(), in that order")
        got = result.detach().float().cpu()
        if not torch.allclose(got, torch.tensor(expected), rtol=1e-4, atol=1e-5):
            accumulated = _reference_losses(copy.deepcopy(start), batches, lr, zero_grad=False)
            expect(not torch.allclose(got, torch.tensor(accumulated), rtol=1e-4, atol=1e-5),
                   "the losses match a loop that never clears the gradients, so they pile up from step "
                   "to step: call optimizer.zero_grad() before loss.backward() at every step")
            expect(False, f"the losses differ from one SGD step per batch with "
                          f"loss = F.cross_entropy(model(x), y): expected "
                          f"{[round(v, 4) for v in expected]}, got {[round(v, 4) for v in got.tolist()]}")
        expect(all(torch.allclose(p, q, rtol=1e-4, atol=1e-6)
                   for p, q in zip(learner_model.parameters(), reference_model.parameters())),
               "the losses are right but the final weights differ from the reference's: every batch, the last "
               "one included, needs its optimizer.step() after loss.backward()")
        expect(not reads, f"the losses are right, but train_steps reads tensors on the host: "
                          f"{_describe_reads(reads)}. On a GPU each read waits until the device has "
                          f"finished all queued work (a sync point). Keep the losses as tensors and let "
                          f"the caller read them once, after the loop")

        _check_on_meta(train_steps, start, batches)

        if device.type == "cuda":
            # Prove there is no sync point: CUDA raises on any synchronising call in this mode.
            # First make sure this torch's own training step has none (else skip this part).
            try:
                with _sync_debug_mode("error"):
                    _reference_losses_on_device(copy.deepcopy(start), batches, lr)
            except RuntimeError:
                print("(this torch version synchronises inside a plain SGD step; "
                      "skipping the sync-point test on CUDA)")
                return
            learner_model = copy.deepcopy(start)
            optimizer = torch.optim.SGD(learner_model.parameters(), lr=lr)
            try:
                with _sync_debug_mode("error"):
                    train_steps(learner_model, optimizer, batches)
            except RuntimeError as error:
                if "synchroniz" not in str(error):
                    raise
                raise Incorrect("train_steps makes the host wait for the GPU (a sync point) inside the "
                                "loop: torch.cuda.set_sync_debug_mode('error') stopped it at the line shown "
                                "below. Typical causes: .item(), float(), print(loss), .cpu(), "
                                "torch.tensor(list_of_gpu_tensors), creating a tensor on the CPU and "
                                "moving it with .to(device). Keep everything on the device") from error


class _HostToDevice(TorchDispatchMode):
    """Records copies from host memory onto another device (on a GPU: blocking copies, sync points)."""

    _COPIES = ("aten._to_copy", "aten.copy_", "aten.to")

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func).startswith(self._COPIES):
            sources = [t.device.type for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
            targets = [t.device.type for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if "cpu" in sources and any(d != "cpu" for d in targets):
                self.copies += 1
        return out


def _check_on_meta(train_steps, start, batches) -> None:
    """Run ``train_steps`` on the meta device, whose tensors have no data: any host read fails there.

    A CPU run cannot show ``.cpu()``, ``.to("cpu")`` or a loss written into a host tensor (the values are
    on the host already); on meta each of them raises, like the sync point it would be on a GPU.
    """
    model = copy.deepcopy(start).to("meta")
    meta_batches = [(x.to("meta"), y.to("meta")) for x, y in batches]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    spy = _HostToDevice()
    try:
        with spy:
            result = train_steps(model, optimizer, meta_batches)
    except (RuntimeError, NotImplementedError) as error:
        raise Incorrect(
            "train_steps copies data from the device to the host: run on a device whose tensors cannot be "
            f"read on the host (PyTorch's 'meta' device), it failed with \"{str(error).splitlines()[0]}\". "
            "On a GPU that copy waits for all queued work. Typical causes: .cpu(), .to('cpu'), .numpy(), "
            "writing each loss into a tensor created on the host (torch.zeros(n)[i] = loss), "
            "torch.tensor(list_of_losses). Keep the losses on the device and torch.stack them") from error
    expect(isinstance(result, torch.Tensor) and result.device.type == "meta",
           f"with the model and batches on the 'meta' device, train_steps returned "
           f"{type(result).__name__ if not isinstance(result, torch.Tensor) else 'a tensor on ' + str(result.device)}: "
           f"the losses must stay on the model's device, whichever it is (torch.stack(losses))")
    expect(spy.copies == 0,
           f"train_steps copies tensors from the host onto the device ({spy.copies} copies over "
           f"{len(batches)} steps, e.g. torch.tensor(0.0).to(device)): a blocking copy makes the host wait for "
           f"the device on a GPU, a sync point. Create such tensors on the device (torch.zeros((), "
           f"device=...)) or keep a list of loss.detach()")


def _reference_losses_on_device(model, batches, lr: float) -> torch.Tensor:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


class _SimulatedGPU:
    """A stand-in for a CUDA stream, so that the timer check can see missing synchronisation on a CPU.

    Work "launched" on it returns at once and runs later on a worker thread, in order, as kernels queue
    on a CUDA stream. While active it replaces ``torch.cuda.synchronize`` (wait until the queue is empty)
    and ``torch.cuda.Event`` (record / synchronize / query / elapsed_time, timestamps taken when the queue
    reaches them). Every wait has a deadline, so a mistake can never hang the check.
    """

    TIMEOUT_S = 20.0

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._run, daemon=True)
        self._saved = {}

    def _run(self):
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                item()
            finally:
                self._queue.task_done()

    def launch(self, work) -> None:
        self._queue.put(work)

    def synchronize(self, device=None) -> None:
        done = threading.Event()
        self._queue.put(done.set)
        if not done.wait(self.TIMEOUT_S):
            raise RuntimeError("the simulated GPU did not finish its queued work in time")

    def event_class(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing=False, blocking=False, interprocess=False):
                self.enable_timing, self._time, self._done = enable_timing, None, None

            def record(self, stream=None):
                done = self._done = threading.Event()

                def stamp():
                    self._time = time.perf_counter()
                    done.set()
                gpu.launch(stamp)

            def query(self):
                return self._done is None or self._done.is_set()

            def synchronize(self):
                if self._done is not None and not self._done.wait(gpu.TIMEOUT_S):
                    raise RuntimeError("the simulated GPU did not reach this event in time")

            def wait(self, stream=None):
                pass

            def elapsed_time(self, end):
                if not (self.enable_timing and end.enable_timing):
                    raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
                if self._time is None or end._time is None:
                    raise RuntimeError("Both events must be recorded and completed before calculating elapsed "
                                       "time: call end.synchronize() first")
                return (end._time - self._time) * 1e3
        return Event

    def __enter__(self):
        self._worker.start()
        self._saved = {"synchronize": torch.cuda.synchronize, "Event": torch.cuda.Event,
                       "is_available": torch.cuda.is_available}
        torch.cuda.synchronize = self.synchronize
        torch.cuda.Event = self.event_class()
        torch.cuda.is_available = lambda: True  # for code that guards its synchronisation with it
        return self

    def __exit__(self, *exc):
        for name, value in self._saved.items():
            setattr(torch.cuda, name, value)
        self._queue.put(None)
        self._worker.join(self.TIMEOUT_S)
        return False


def _check_timer(time_ms, device: torch.device, gpu: _SimulatedGPU | None) -> None:
    """Time an ``fn`` whose every call is logged, and compare ``time_ms`` with the logged span.

    The first call is slow (one-off set-up, as on a real device), so timing it shows. With ``gpu`` set,
    fn only queues its work on the simulated GPU and returns, as a CUDA kernel launch does.
    """
    repeats, work_ms, first_ms = 5, 20, 60
    calls: list[dict] = []

    def fn():
        call = {"start": time.perf_counter(), "done": None}
        calls.append(call)
        ms = first_ms if len(calls) == 1 else work_ms

        def work():
            time.sleep(ms / 1e3)
            call["done"] = time.perf_counter()
        if gpu is None:
            work()
        else:
            gpu.launch(work)

    where = "on a simulated GPU (this machine has none; fn queues its work and returns at once, " \
            "as a CUDA launch does)" if gpu else f"on {device.type}"
    result = time_ms(fn, device, repeats)
    # Work still queued when time_ms returned means its clock stopped before the device finished.
    unfinished = gpu is not None and bool(calls) and calls[-1]["done"] is None
    if gpu is not None:
        gpu.synchronize()  # the work of every call has finished: its times are known
    expect(result is not None, "time_ms returned None: return the mean time of one call, in milliseconds")
    expect(isinstance(result, numbers.Real) and not isinstance(result, bool),
           f"time_ms should return a Python float (milliseconds), got {type(result).__name__}"
           + (": convert it with float(...)" if isinstance(result, torch.Tensor) else ""))
    expect(len(calls) > repeats,
           f"{where}, fn was called {len(calls)} time(s) with repeats={repeats}: call it once first, as a "
           f"warm-up (its first call pays one-off set-up costs), then `repeats` times in the timed region")
    expect(len(calls) <= 2 * repeats,
           f"{where}, fn was called {len(calls)} times with repeats={repeats}: call it `repeats` times "
           f"(plus a warm-up call)")
    result = float(result)
    timed = calls[-repeats:]
    warm_up_done = calls[-repeats - 1]["done"]
    # From the first timed call (or the end of the warm-up's work, if later) to the end of the last one's work.
    right = (timed[-1]["done"] - max(timed[0]["start"], warm_up_done)) * 1e3 / repeats
    if abs(result / right - 1) <= 0.1:
        return
    stopped_early = (f"{where}, calls whose work takes {work_ms} ms took {result:.3f} ms by your measure: your clock "
                     f"stopped before the device finished (you measured the launches only). Synchronise "
                     f"(sync(device)) before reading the clock at the end, or time with torch.cuda.Event")
    # Checked before the units: a launch-only time can be close to the right time in seconds.
    expect(not unfinished, stopped_early)
    expect(not abs(result / (right / 1e3) - 1) <= 0.1,
           f"{where}, calls of about {work_ms} ms took {result:.4f} by your measure: that looks like seconds; "
           f"return milliseconds (multiply by 1000)")
    expect(not abs(result / (right * repeats) - 1) <= 0.1,
           f"{where}, calls of about {right:.1f} ms took {result:.1f} ms by your measure, {repeats} times too "
           f"long: that is the total of the {repeats} repeats; divide by repeats")
    expect(not abs(result / (right * repeats / (repeats + 1)) - 1) <= 0.05,
           f"{where}, your time is {repeats}/{repeats + 1} of the right one ({result:.1f} ms against {right:.1f} ms): "
           f"divide the time of the {repeats} timed calls by {repeats}, not {repeats + 1}")
    warm_up_late = warm_up_done > timed[0]["start"]
    expect(not (gpu and warm_up_late and result > right),
           f"{where}, your time ({result:.1f} ms per call) includes the end of the warm-up's work "
           f"({right:.1f} ms without it): the device was still busy when the clock started. Synchronise "
           f"(sync(device)) before starting the clock, too")
    with_warmup = (timed[-1]["done"] - calls[0]["start"]) * 1e3 / repeats
    expect(not (len(calls) == repeats + 1 and abs(result / with_warmup - 1) <= 0.1),
           f"{where}, your time includes the warm-up call ({result:.1f} ms per call, {right:.1f} ms without it): "
           f"start the clock after the warm-up")
    expect(not (gpu and result < right / 2), stopped_early)
    expect(False, f"{where}, calls of about {right:.1f} ms each (measured around them) took {result:.4g} ms by "
                  f"your time_ms; time only the `repeats` calls after the warm-up, and divide by repeats")


def check_time_ms(time_ms) -> None:
    """Exercise 2.2: ``time_ms(fn, device, repeats) -> mean milliseconds of one call of fn()``."""
    with exercise("Exercise 2.2 (time_ms)"):
        try:
            _check_timer(time_ms, torch.device("cpu"), None)
        except (ExerciseError, NotImplementedError):  # NotImplementedError, the stub's, is a RuntimeError
            raise
        except (RuntimeError, AssertionError) as error:  # a CPU-only torch build asserts instead
            if torch.cuda.is_available() or not any(w in str(error) for w in ("NVIDIA", "CUDA", "cuda")):
                raise
            raise Incorrect("with device=cpu your time_ms called CUDA, which this machine does not have: "
                            "call torch.cuda.synchronize() or use CUDA events only when "
                            "device.type == 'cuda'") from error
        if not torch.cuda.is_available():
            try:
                with _SimulatedGPU() as gpu:
                    _check_timer(time_ms, torch.device("cuda:0"), gpu)
            except (ExerciseError, NotImplementedError):
                raise
            except (RuntimeError, AssertionError) as error:
                raise Incorrect(f"on a simulated GPU (this machine has none) your time_ms failed: {error}. "
                                f"The simulation offers torch.cuda.synchronize() (sync(device) calls it) and "
                                f"torch.cuda.Event(enable_timing=True) with record(), synchronize() and "
                                f"elapsed_time()") from error
            return
        device = torch.device("cuda:0")
        _check_timer(time_ms, device, None)
        a = torch.randn(2048, 2048, device=device)
        b = torch.randn(2048, 2048, device=device)

        def matmuls():
            for _ in range(8):
                a @ b

        repeats = 5
        matmuls()  # warm-up: cuBLAS set-up and memory allocation are not part of the test
        reference = best_ms(matmuls, device, repeats, rounds=1, warmup=False)
        result = float(time_ms(matmuls, device, repeats))
        reference = min(reference, best_ms(matmuls, device, repeats, rounds=1, warmup=False))
        expect(result >= reference * 0.7,
               f"on cuda, 8 matrix products took {result:.3f} ms by your measure but "
               f"{reference:.3f} ms when synchronised: GPU work is asynchronous, so your clock stopped "
               f"before the work finished. Call torch.cuda.synchronize() before each reading of the "
               f"clock, or time with torch.cuda.Event(enable_timing=True)")
        expect(result <= reference * 1.4,
               f"on cuda, 8 matrix products took {result:.3f} ms by your measure, more than 1.4 times the "
               f"synchronised {reference:.3f} ms: measure only the repeated calls of fn() and divide "
               f"by repeats")

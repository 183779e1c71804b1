"""Checks for labs/02_single_gpu.ipynb."""
from __future__ import annotations

import copy
import numbers
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

from . import ExerciseError, Incorrect, exercise, expect
from ..models import MLP

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
        expect(not reads, f"the losses are right, but train_steps reads tensors on the host: "
                          f"{_describe_reads(reads)}. On a GPU each read waits until the device has "
                          f"finished all queued work (a sync point). Keep the losses as tensors and let "
                          f"the caller read them once, after the loop")

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


def _synchronised_ms(fn, device: torch.device, repeats: int) -> float:
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3 / repeats


def _check_sleep(time_ms, device: torch.device) -> None:
    repeats, sleep_ms = 4, 20
    calls = []

    def sleepy():
        calls.append(1)
        time.sleep(sleep_ms / 1e3)

    result = time_ms(sleepy, device, repeats)
    expect(result is not None, "time_ms returned None: return the mean time of one call, in milliseconds")
    expect(isinstance(result, numbers.Real) and not isinstance(result, bool),
           f"time_ms should return a Python float (milliseconds), got {type(result).__name__}"
           + (": convert it with float(...)" if isinstance(result, torch.Tensor) else ""))
    where = f"on {device.type}"
    expect(len(calls) >= repeats,
           f"{where}, fn was called {len(calls)} time(s) with repeats={repeats}: call fn() `repeats` "
           f"times and return the mean time of one call")
    expect(len(calls) <= 2 * repeats,
           f"{where}, fn was called {len(calls)} times with repeats={repeats}: call it `repeats` times "
           f"(plus at most a few warm-up calls)")
    result = float(result)
    if 15 <= result <= 60:
        return
    expect(not 15e-3 <= result <= 60e-3,
           f"{where}, a function that sleeps {sleep_ms} ms took {result:.4f} by your measure: that looks "
           f"like seconds; return milliseconds (multiply by 1000)")
    expect(not 15 * repeats <= result <= 60 * repeats,
           f"{where}, a function that sleeps {sleep_ms} ms took {result:.1f} ms by your measure, about "
           f"{repeats} times too long: that is the total of the {repeats} repeats; divide by repeats")
    expect(False, f"{where}, a function that sleeps {sleep_ms} ms should take about {sleep_ms} ms, "
                  f"your time_ms returned {result:.4g}")


def check_time_ms(time_ms) -> None:
    """Exercise 2.2: ``time_ms(fn, device, repeats) -> mean milliseconds of one call of fn()``."""
    with exercise("Exercise 2.2 (time_ms)"):
        try:
            _check_sleep(time_ms, torch.device("cpu"))
        except ExerciseError:
            raise
        except (RuntimeError, AssertionError) as error:  # a CPU-only torch build asserts instead
            if torch.cuda.is_available() or not any(w in str(error) for w in ("NVIDIA", "CUDA", "cuda")):
                raise
            raise Incorrect("with device=cpu your time_ms called CUDA, which this machine does not have: "
                            "call torch.cuda.synchronize() or use CUDA events only when "
                            "device.type == 'cuda'") from error
        if torch.cuda.is_available():
            device = torch.device("cuda:0")
            _check_sleep(time_ms, device)
            a = torch.randn(2048, 2048, device=device)
            b = torch.randn(2048, 2048, device=device)

            def matmuls():
                for _ in range(8):
                    a @ b

            repeats = 5
            matmuls()  # warm-up: cuBLAS set-up and memory allocation are not part of the test
            reference = _synchronised_ms(matmuls, device, repeats)
            result = float(time_ms(matmuls, device, repeats))
            reference = min(reference, _synchronised_ms(matmuls, device, repeats))
            expect(result >= reference / 2,
                   f"on cuda, 8 matrix products took {result:.3f} ms by your measure but "
                   f"{reference:.3f} ms when synchronised: GPU work is asynchronous, so your clock stopped "
                   f"before the work finished. Call torch.cuda.synchronize() before each reading of the "
                   f"clock, or time with torch.cuda.Event(enable_timing=True)")
            expect(result <= reference * 2,
                   f"on cuda, 8 matrix products took {result:.3f} ms by your measure, more than twice the "
                   f"synchronised {reference:.3f} ms: measure only the repeated calls of fn() and divide "
                   f"by repeats")

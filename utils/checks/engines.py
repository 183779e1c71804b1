"""Running a learner's exercise on every engine at once, from a check cell in the notebook.

A check ships the learner's function (or class) to the engines (ipyparallel sends what the
notebook defines by value; the names it uses are looked up in the engines' namespace), runs one
case at a time on every rank, and reports in the notebook which rank, which case and what went
wrong. Used by the checks of labs 03, 04, 05 and 08. The harness they import:

- ``prepare(workers, fn, name)``: ship ``fn`` and what it uses to the engines, or say what is missing;
- ``run_case(workers, name, job, fn, args, case, hint)``: run ``job(fn, *args)`` on every rank, on the
  check's own group; return each rank's result or raise the check's message naming rank and case;
  ``run_cases`` does a list of them;
- ``Wrong(message)``: raised by a job on a rank to fail the case with ``message``;
- ``spy(recv_dtype)``: count the learner's torch.distributed calls (``POINT_TO_POINT`` names the
  point-to-point ones) and route them to ``check_group``, the group ``renew_group`` makes
  (``verify_group``, made when ``prepare`` is asked for ``own_collectives``, carries the check's own);
- ``globals_used(fn)``: the notebook names a function reads, to ship them with it;
- ``replaced_in_dist(functions)``: torch.distributed's functions swapped for watchers inside a block.

What gloo does when messages do not match (measured with torch 2.14): a blocking send waits
until the matching receive is posted; a rank left waiting raises "Timed out waiting ..." after
its process group's timeout, and every later operation of that group fails with "Application
timeout caused pair closure"; a message larger than its receive buffer aborts the receiving
process (gloo moves raw bytes: a smaller message, or another dtype of the same byte size, arrives
silently as garbage). So each check runs the learner's calls on a process group
of its own, with a short timeout (the spy below adds ``group=`` to every torch.distributed call
that has none): a deadlock ends as a message after a few seconds and leaves the cluster's own
group, and the next try, untouched. Only a dead engine needs a fresh cluster, and the message
says so.
"""
from __future__ import annotations

import datetime
import os
import inspect
import sys
import time
import traceback
import types
from contextlib import contextmanager
from pathlib import Path

import torch

from . import expect
from .. import cluster, config

GROUP_TIMEOUT = 10.0  # seconds a rank of the check's own process group waits for a message
_HERE = str(Path(__file__).resolve().parent)
_ENGINE_NAMES = {"rank", "world_size", "device", "torch", "dist"}  # set on each engine by utils.cluster
_RESTART = ("Start a fresh cluster: run `cluster.stop()`, then re-run the Setup cell and the "
            "cells after it up to your exercise (they import what the engines need).")
_COMMUNICATION = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast", "scatter", "gather",
                  "all_gather", "all_gather_into_tensor", "all_reduce", "reduce", "reduce_scatter",
                  "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_single", "gather_single",
                  "all_to_all", "all_to_all_single", "barrier")
_TIMED_OUT = "Timed out waiting"  # gloo's message when a rank waited longer than its group's timeout
check_group = None  # on an engine: the process group the current check runs the learner's calls on
verify_group = None  # on an engine: the group of a check's own collectives (prepare(..., own_collectives=True))
POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}


class Wrong(Exception):
    """Raised on an engine when a case gives a wrong answer; the message names the rank."""


# --- on the engines ------------------------------------------------------------------------

def renew_group(old, timeout_s: float):
    """On every engine: destroy ``old`` (if any) and return a new process group of all ranks."""
    import torch.distributed as dist

    if old is not None:
        try:
            dist.destroy_process_group(old)
        except Exception:
            pass  # a group broken by a timeout is dropped all the same
    return dist.new_group(timeout=datetime.timedelta(seconds=timeout_s))


def _fresh_group(timeout_s: float, own_collectives: bool = False) -> bool:
    """On every engine: a new process group of all ranks for the next check's calls and, with
    ``own_collectives``, a second one (``verify_group``) for the check's own collectives, so that a
    learner who skips a collective cannot pair it with one of the check's."""
    global check_group, verify_group
    old, check_group = check_group, None
    check_group = renew_group(old, timeout_s)
    if own_collectives:
        old, verify_group = verify_group, None
        verify_group = renew_group(old, timeout_s)
    return True


@contextmanager
def spy(recv_dtype: torch.dtype | None = None):
    """Inside the block, on this rank: torch.distributed calls that name no group run on the
    check's own group, and are counted (with the elements sent, and ``"NAME async"`` for calls
    with ``async_op=True``).

    With ``recv_dtype``, a receive into a buffer of another dtype raises a clear TypeError here:
    gloo itself would abort the process when the message arrives.
    """
    import torch.distributed as dist

    calls: dict = {"elements_sent": 0}
    saved = {name: getattr(dist, name) for name in _COMMUNICATION if hasattr(dist, name)}

    def wrap(name, original):
        signature = inspect.signature(original)

        def counting(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("async_op"):
                calls[f"{name} async"] = calls.get(f"{name} async", 0) + 1
            if "group" in signature.parameters and bound.arguments.get("group") is None \
                    and check_group is not None:
                bound.arguments["group"] = check_group
            tensor = args[0] if args else kwargs.get("tensor")
            if name in ("send", "isend") and isinstance(tensor, torch.Tensor):
                calls["elements_sent"] += tensor.numel()
            if (name in ("recv", "irecv") and recv_dtype is not None and isinstance(tensor, torch.Tensor)
                    and tensor.dtype != recv_dtype):
                raise TypeError(f"dist.{name} into a {tensor.dtype} buffer, but the tensors sent are "
                                f"{recv_dtype}: allocate receive buffers with dtype=tensor.dtype (gloo moves raw "
                                f"bytes: a larger message aborts the receiving process, one of another dtype "
                                f"arrives as garbage)")
            return original(*bound.args, **bound.kwargs)
        counting.__name__ = name  # P2POp's repr reads op.__name__
        return counting

    with replaced_in_dist({name: wrap(name, original) for name, original in saved.items()}):
        yield calls


@contextmanager
def replaced_in_dist(replacements: dict):
    """Inside the block, the torch.distributed functions named in ``replacements`` are replaced, in
    distributed_c10d too where it holds the same function (torch's internal calls, and
    ``P2POp(dist.isend, ...)``'s own check, look them up there); every one is restored after."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    saved = {name: getattr(dist, name) for name in replacements}
    also_c10d = {name for name in replacements if getattr(c10d, name, None) is saved[name]}
    try:
        for name, replacement in replacements.items():
            setattr(dist, name, replacement)
            if name in also_c10d:
                setattr(c10d, name, replacement)
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
            if name in also_c10d:
                setattr(c10d, name, original)


def _learner_traceback(error: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_HERE)]
    lines = ["Your code raised this (innermost call last):"]
    lines += [line.rstrip("\n") for line in traceback.format_list(frames)]
    lines += [line.rstrip("\n") for line in traceback.format_exception_only(type(error), error)]
    return "\n".join(lines)


class _ByValue:
    """A class from the notebook, pickled by value with cloudpickle: ipyparallel's own canning
    recurses forever on a method that calls ``super()`` (its ``__class__`` cell)."""

    def __init__(self, cls: type):
        import cloudpickle

        self.payload = cloudpickle.dumps(cls)

    def load(self) -> type:
        import cloudpickle

        return cloudpickle.loads(self.payload)


def _on_rank(job, learner_fn, *args):
    """Run one case on this engine: ('ok', what job returned), ('wrong', message) or ('error', ename, evalue, trace)."""
    try:
        if isinstance(learner_fn, _ByValue):
            learner_fn = learner_fn.load()
        result = job(learner_fn, *args)
    except Wrong as wrong:
        return ("wrong", str(wrong))
    except BaseException as error:  # the learner's code may raise anything; report it in the notebook
        return ("error", type(error).__name__, str(error), _learner_traceback(error))
    return ("ok", result)


def _ping():
    import torch.distributed as dist

    one = torch.ones(1)
    dist.all_reduce(one)
    return int(one.item())



# --- in the notebook -----------------------------------------------------------------------

def globals_used(fn, seen=None) -> dict:
    """Functions, classes and modules from the notebook that ``fn`` (a function or a class)
    refers to, recursively, by name."""
    seen = {} if seen is None else seen
    if isinstance(fn, type):
        namespace = vars(sys.modules[fn.__module__])
        code_objects = [v.__code__ for v in vars(fn).values() if isinstance(v, types.FunctionType)]
    else:
        namespace, code_objects = fn.__globals__, [fn.__code__]
    names = set()
    while code_objects:
        code = code_objects.pop()
        names.update(code.co_names)
        code_objects += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in sorted(names - _ENGINE_NAMES - set(seen)):
        value = namespace.get(name)
        if isinstance(value, (types.FunctionType, types.ModuleType, type)):
            if isinstance(value, type) and value.__module__ != "__main__":
                continue  # a library class travels by reference, through its module
            seen[name] = value
            if not isinstance(value, types.ModuleType) and value.__module__ == "__main__":
                globals_used(value, seen)
    return seen


def prepare(workers, fn, name: str, own_collectives: bool = False) -> None:
    """The engines are alive, their process group works, they know what ``fn`` uses, and the
    check has a fresh process group of its own (two with ``own_collectives``: see ``_fresh_group``)."""
    if workers is None or not hasattr(workers, "view"):
        expect(False, f"{name}: pass the `workers` that cluster.start(...) returned (run the Setup cell)")
    if cluster.running() is not workers:
        expect(False, f"{name}: `workers` is not the running cluster (it was stopped). Re-run the Setup cell, "
                      f"then your exercise cell and this one.")
    if not callable(fn):
        expect(False, f"{name}: pass your function (or class) itself, got a {type(fn).__name__}")
    if set(workers.view.targets) - set(workers.client.ids):
        expect(False, f"{name}: an engine of the cluster has died (gloo aborts a process that receives a "
                      f"message larger than its receive buffer). {_RESTART}")
    ping = workers.view.apply_async(_ping)
    if not ping.wait(10):
        expect(False, f"{name}: the engines are still busy with earlier work, most likely a %%px cell that "
                      f"deadlocked: it stays blocked until the cluster's timeout ({workers.timeout:g} s), "
                      f"after which the cluster's process group is broken. {_RESTART}")
    try:
        ping.get(0)
    except Exception as error:
        expect(False, f"{name}: the cluster's process group no longer works ({getattr(error, 'evalue', error)}); "
                      f"after a timeout gloo closes its connections for good. {_RESTART}")
    used = globals_used(fn)
    code = ["import torch", "import torch.distributed as dist", "from utils.collectives import chunk_bounds"]
    code += [f"import {v.__name__} as {alias}" for alias, v in used.items() if isinstance(v, types.ModuleType)]
    workers.view.execute("\n".join(code), block=False).wait(10)
    functions = {alias: v for alias, v in used.items() if isinstance(v, types.FunctionType)}
    if functions:
        workers.view.push(functions, block=False).wait(10)
    group = workers.view.apply_async(_fresh_group, _group_timeout(workers), own_collectives)
    if not group.wait(_group_timeout(workers) + 10):
        expect(False, f"{name}: the check's own process group could not be created in time. {_RESTART}")
    try:
        group.get(0)
    except Exception as error:
        expect(False, f"{name}: the check's own process group could not be created "
                      f"({getattr(error, 'evalue', error)}). {_RESTART}")


def _load_factor() -> float:
    """How many times slower than on an idle machine the engines may run now (1 to 6): the load average
    over the cores. A right answer on a loaded machine must not be refused for being slow."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 1.0
    return min(6.0, max(1.0, load / config.real_cores()))


def _group_timeout(workers) -> float:
    return min(float(workers.timeout), float(round(GROUP_TIMEOUT * _load_factor())))


def run_case(workers, name: str, job, fn, args: tuple, case: str, hint: str = "") -> list:
    """Run ``_on_rank(job, fn, *args)`` on every rank; raise in the notebook if any rank failed,
    else return what the job returned on each rank, in rank order."""
    waited_s = _group_timeout(workers)
    limit = waited_s + 10 * _load_factor()  # a rank blocked in torch.distributed gives up after waited_s
    try:
        shipped = _ByValue(fn) if isinstance(fn, type) else fn
        pending = [workers.client[engine].apply_async(_on_rank, job, shipped, *args) for engine in workers.view.targets]
    except Exception as error:  # the function could not be sent (e.g. it holds something unpicklable)
        expect(False, f"{name}: your function could not be sent to the engines: {type(error).__name__}: {error}")
    deadline = time.monotonic() + limit
    for result in pending:
        result.wait(max(0.0, deadline - time.monotonic()))
    outcomes = []
    for result in pending:
        if not result.ready():
            outcomes.append(("running",))
            continue
        try:
            outcomes.append(result.get(0))
        except Exception as error:  # an engine died, or the check itself could not run there
            outcomes.append(("crash", getattr(error, "ename", type(error).__name__),
                             getattr(error, "evalue", str(error))))
    kinds = {}
    for rank, outcome in enumerate(outcomes):
        kind = outcome[0]
        if kind == "error" and _TIMED_OUT in outcome[2]:
            kind = "waited"
        kinds.setdefault(kind, []).append((rank, outcome))
    errors, waited = kinds.get("error", []), [rank for rank, _ in kinds.get("waited", [])]
    running, crashes = [rank for rank, _ in kinds.get("running", [])], kinds.get("crash", [])
    fine = ("The check runs your code on a process group of its own, so the cluster is unharmed: fix "
            "your function, run its cell again, then this one.")
    if errors and len(errors) == len(outcomes) and all(o[1] == "NotImplementedError" for _, o in errors):
        raise NotImplementedError(errors[0][1][2])  # the stub: exercise() turns it into NotSolved
    if crashes:
        died = [rank for rank, o in crashes if o[1] == "EngineError" or "died" in o[2]]
        if died:
            expect(False, f"{name}: the engine process of rank(s) {died} died (case: {case}). gloo aborts a "
                          f"process that receives a message larger than its receive buffer (more elements, or "
                          f"a larger dtype, than the buffer holds): both sides must agree on every message's "
                          f"size.{hint} {_RESTART}")
        rank, (_, ename, evalue) = crashes[0]
        expect(False, f"{name}: the check could not run on rank {rank}: {ename}: {evalue}")
    if running:
        expect(False, f"{name}: rank(s) {running} were still running after {limit:g} s (case: {case}), although "
                      f"every torch.distributed call in the check gives up after {waited_s:g} s: an endless "
                      f"loop? The engines stay busy until it ends. {_RESTART}")
    if errors:
        rank, (_, ename, evalue, trace) = errors[0]
        message = f"{name}: on rank {rank}, with {case}, your code raised {ename}: {evalue}{hint}"
        if "NoneType" in evalue:
            message += (". A parameter's .grad is None when the parameter is frozen (requires_grad=False) or forward "
                        "did not use it: skip frozen parameters, and reduce zeros in place of a None gradient")
        if ename == "NameError":
            message += (". Your function runs on the engines: there only torch, dist, chunk_bounds, rank, "
                        "world_size, device, what %%px cells defined, and the notebook's functions and modules "
                        "it uses exist. Compute other values inside the function")
        if waited:
            message += (f"\nRank(s) {waited} were left waiting for it and gave up after {waited_s:g} s. In your "
                        f"own %%px cells they would wait for the cluster's timeout ({workers.timeout:g} s), and "
                        f"the cluster's process group would be broken afterwards.")
        expect(False, f"{message}\n{fine}\n\n{trace}")
    if waited:
        expect(False, f"{name}: rank(s) {waited} waited {waited_s:g} s for a message that never came (case: "
                      f"{case}): most likely a deadlock. In gloo a blocking dist.send waits until the matching "
                      f"receive is posted, so ranks that all send first (or all receive first) wait for each "
                      f"other forever: post dist.isend and dist.irecv, then wait on both. Ranks that disagree "
                      f"on how many messages they exchange (one skips an empty chunk, its neighbour sends it) "
                      f"hang the same way.{hint}\n{fine} (In your own %%px cells a deadlock blocks until the "
                      f"cluster's timeout, {workers.timeout:g} s, and breaks the cluster's process group: then "
                      f"run cluster.stop() and the Setup cell again.)")
    wrong = kinds.get("wrong", [])
    if wrong:
        expect(False, f"{name}: {wrong[0][1][1]}{hint}")
    return [outcome[1] for outcome in outcomes]


def run_cases(workers, name, job, fn, cases, hint_for):
    """Run each case; ``hint_for(case, earlier_passed)`` adds advice when a case fails."""
    passed = []
    for args, label in cases:
        run_case(workers, name, job, fn, args, label, hint_for(args, passed))
        passed.append(args)

"""Run a learner's torchrun script and record what each rank did, for the check of lab 06's exercise 6.1.

    torchrun --nnodes 2 --nproc-per-node 2 ... -m utils.checks.job.probe train_ddp.py --epochs 2 ...

Each process runs the script as ``__main__`` (exactly as ``torchrun train_ddp.py`` would) after
wrapping a few torch functions so that they also write down their calls: ``init_process_group``
(its explicit ``rank`` and ``world_size``, if any, the backend and ``init_method`` asked for), ``DistributedSampler``
(its replicas, rank, seed, and the epoch in force each time it is iterated), ``DistributedDataParallel``
(its ``device_ids``, and the samples of every training forward), ``all_reduce`` (the values a
script reduces by hand, whether it reaches the function as ``torch.distributed.all_reduce`` or as
``torch.distributed.distributed_c10d.all_reduce``), every ``optimizer.step()`` (the optimizer's class and each parameter group's
settings in force, which schedulers change, so that a check can take the same steps), ``torch.save``,
``destroy_process_group``, the lines the rank printed (and apart, what the job's own code printed to stdout:
torch's output and the check's left out), and how many times the DDP model's weights changed
other than through an optimizer step (between two steps, or between a step and a save).
So that a grader can tie what a run saved to the training it recorded, it also notes a digest of the
model's weights when DDP wraps them (``initial``), for every ``torch.save`` the optimizer steps taken
so far and digests of what was saved and of the DDP model's weights then (``saved``), and the sum of
every training forward's input (``input_sums``: the images can be matched with the sampler's order).
Between an optimizer step's start and its end the weights may change (that is the step), so the probe
also notes (``tampered``) anything of the script's own that would run inside that window: an optimizer
class only named like torch's, its step function or torch.optim's arithmetic replaced, or step hooks of
the script's own (outside tests trained in hidden steps there and had them counted as one).
The record goes to ``$COURSE_PROBE_DIR/rank<RANK>.json`` when the process exits (after the script's own exit
handlers), however the script ends, unless the process is killed or ends with ``os._exit``; it says
whether the rank's error was a lost peer (a communication error or a timeout) rather than its own.

``COURSE_PROBE_GPUS=1`` simulates a GPU node without a GPU (``SimulatedGPUs``): every node has one
"GPU" per local process, tensors moved to ``cuda:i`` stay on the CPU but are tracked as living on
``cuda:i``, an operation mixing devices fails as it would on a GPU, reading a GPU value on the host is
counted as a host sync, and ``nccl`` is run as ``gloo``. ``COURSE_PROBE_FAIL_AT=N`` with
``COURSE_PROBE_FAIL_RANK=R`` makes rank R's N-th training forward raise, to see whether the job
still tears its process group down when one rank fails.

``COURSE_PROBE_CALLS_ONLY=1`` is for a real run (the assessment's run that counts): the calls are recorded,
but nothing is simulated, no tensor operation is watched, and the script's own timeout and devices stand;
only its training dropout draws its masks from the probe's seeds, as in the check, so that the run can be
replayed step by step in one process.

``COURSE_PROBE_REFUSAL=1`` is for a job that should stop before training (a global batch the world
size does not divide): no rank exits before every rank has written its record (a rank that exits makes
torchrun stop the others, which could then not show whether they would have refused on their own), a
rank that ended closes its process group so that a peer waiting in a collective with it fails at once,
and collectives time out after ``REFUSAL_TIMEOUT`` instead of the usual cap.

Training dropout draws its masks from a seed per training forward (``masked_dropout``), so that the
check's one-process reference can draw the same ones whatever else the script does with the random
number generator.

Behaviour is observed, not the source text: a learner may write the script any way they like.
"""
from __future__ import annotations

import atexit
import datetime
import hashlib
import inspect
import io
import json
import os
import re
import runpy
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.optim import optimizer as optimizer_module
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.data import DistributedSampler
from torch.utils.weak import WeakIdKeyDictionary

from utils.ddp import forget_destroyed_group

INJECTED = "error injected by the check into one rank's 3rd training step"
MAX_STEPS = 5000                               # optimizer steps recorded; a check's job takes far fewer
MAX_SAVES = 1000                               # saves recorded (a job saves once per epoch)
MAX_TIMEOUT = datetime.timedelta(seconds=60)   # a job that waits longer for a peer is stuck, in the check
# In a refusal run, a rank's collectives after init_process_group: the ranks of a right script reach the refusal
# together (at worst after loading the data and building the model and DDP), and a rank whose peers have stopped
# should not wait for them a whole minute. Init itself keeps MAX_TIMEOUT (processes start unevenly on a busy host).
REFUSAL_TIMEOUT = datetime.timedelta(seconds=20)
# Text of the errors a rank gets when a peer has gone (gloo, nccl, the store) rather than of its own making.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Connection refused", "Broken pipe",
             "Timed out", "timed out")
DROPOUT_SEEDS_PER_FORWARD = 16
# The log line a job prints after every epoch (its start is enough: the check reads these three numbers).
EPOCH_LINE = re.compile(r"^epoch\s+(\d+)\s+train_loss\s+(\S+)\s+test_accuracy\s+(\S+)", re.MULTILINE)
_DESTROY = dist.destroy_process_group          # torch's own, which the probe's record of the script's call wraps


def state_digest(state) -> str | None:
    """A digest of a state_dict's names, dtypes, shapes and values, the same for the weights in memory and for
    the file they were saved to, on any device. None for anything else (not a dict of dense tensors named by
    strings): the probe digests whatever a script saves, and must never make its save fail."""
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        return None
    digest = hashlib.sha256()
    try:
        with torch._C.DisableTorchFunction(), torch.no_grad():
            for key in sorted(state):
                tensor = state[key]
                if tensor.layout != torch.strided or tensor.is_nested or tensor.is_quantized:
                    return None
                value = tensor.detach().to("cpu").contiguous().reshape(-1)
                digest.update(f"{key}|{value.dtype}|{tuple(tensor.shape)}|".encode())
                digest.update(value.view(torch.uint8).numpy().tobytes())
    except Exception:  # noqa: BLE001 - a tensor of a kind no file of the course's model holds: no digest
        return None
    return digest.hexdigest()


def masked_dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """Dropout whose mask comes from ``seed`` alone (the probe's training dropout, and the reference's)."""
    if p >= 1:
        return x * 0
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed)) >= p
    if keep.device != x.device:        # a real GPU run (the run that counts): the mask drawn on the host, moved
        keep = keep.to(x.device)
    return x * keep / (1 - p)


# Whose code wrote to stdout: the frame that called write (print's caller), past the standard library's
# frames (logging, traceback, io: their caller decides). torch's own output and the check's are not the job's.
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_CHECKS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # utils/checks/, this package's parent
_NOT_THE_JOBS = (os.path.dirname(torch.__file__) + os.sep, _CHECKS_DIR)
JOB_PRINTED_KEPT = 4000        # characters of the job's own stdout kept in the record (the first ones)


def _written_by_the_job(frame) -> bool:
    """Whether the code that wrote (``frame``, the caller of write) is the job's: its script, or any module it
    called other than torch's and the check's."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen") or (name.startswith(_STDLIB_DIR) and "-packages" not in name)):
            return not name.startswith(_NOT_THE_JOBS)
        frame = frame.f_back
    return True


class _Tee(io.TextIOBase):
    """Passes writes on to the real stream and keeps the text, to count what this rank printed; what the job's
    own code wrote (not torch's, not the check's) is kept apart too (``job``: the first characters, and a count
    of the lines), so that a check can refuse a line printed by any rank but rank 0."""

    def __init__(self, stream, kept: list[str]):
        self.stream, self.kept = stream, kept
        self.job, self.job_chars, self.job_lines, self.job_ended_line = [], 0, 0, True

    def write(self, text):
        self.kept.append(text)
        if text and _written_by_the_job(sys._getframe(1)):
            if self.job_chars < JOB_PRINTED_KEPT:
                self.job.append(text[:JOB_PRINTED_KEPT - self.job_chars])
            self.job_chars += len(text)
            self.job_lines += text.count("\n")
            self.job_ended_line = text.endswith("\n")
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


class SimulatedGPUs(TorchFunctionMode):
    """A node with ``count`` GPUs, on the CPU: records where tensors would live and what a GPU would refuse.

    A tensor moved to ``cuda:i`` (``.to``, ``.cuda``, ``device=`` of a factory) stays on the CPU and is
    noted as living on ``cuda:i``; results of operations inherit their inputs' device. Convolutions,
    linear layers, losses and comparisons given tensors of two devices raise as on a GPU; ``item()``,
    ``float()``, ``.cpu()`` and the like of a GPU tensor count as host syncs. Also rules the training
    dropout (seeded masks) and notes dropout in train mode outside a training forward (evaluation)."""

    MIXING = {"conv1d", "conv2d", "conv3d", "linear", "cross_entropy", "nll_loss", "mse_loss", "matmul", "mm",
              "bmm", "addmm", "embedding", "batch_norm", "eq", "__eq__"}
    SYNCS = {"item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__", "__format__",
             "__repr__"}

    def __init__(self, record: dict, count: int, simulate: bool):
        super().__init__()
        self.record, self.count, self.simulate = record, count, simulate
        self.where = WeakIdKeyDictionary()           # tensor -> "cuda:i"
        self.current = 0
        self.training_forward = 0                      # > 0 inside the DDP forward of a training step
        self.internal = 0                              # > 0 inside DDP's own code, which needs the real devices
        self.dropout_calls = 0

    # --- devices ---
    def cuda_index(self, spec) -> str | None:
        """``"cuda:i"`` for a device spec on a GPU (checked against this node's GPUs), None for any other."""
        if spec is None or isinstance(spec, bool):
            return None
        if isinstance(spec, int):
            index = spec
        else:
            device = torch.device(spec) if isinstance(spec, (str, torch.device)) else None
            if device is None or device.type != "cuda":
                return None
            index = self.current if device.index is None else device.index
        if not 0 <= index < self.count:
            self.record["device_errors"].append(f"cuda:{index}")
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index}; this node has {self.count} "
                               f"GPU(s), cuda:0 .. cuda:{self.count - 1})")
        return f"cuda:{index}"

    def _tag(self, out, device) -> None:
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.where[leaf] = device

    def _sync(self, what: str) -> None:
        phase = "train" if torch.is_grad_enabled() else "eval"
        self.record["syncs"][phase] += 1
        step = self.record["forwards"]        # the training steps begun so far: where in training the read is
        if step:
            points = self.record["sync_points"]
            points[str(step)] = points.get(str(step), 0) + 1
        if len(self.record["sync_kinds"]) < 5 and what not in self.record["sync_kinds"]:
            self.record["sync_kinds"].append(what)

    def _move(self, name, args, kwargs):
        tensor = args[0]
        if name == "cuda":
            spec = args[1] if len(args) > 1 else kwargs.get("device")
            target, dtype, non_blocking = self.cuda_index("cuda" if spec is None else spec), None, False
            memory_format = None
        elif len(args) > 1 and isinstance(args[1], torch.Tensor):
            target, dtype, non_blocking, memory_format = self.where.get(args[1]), args[1].dtype, False, None
        else:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is None:                               # a change of dtype only: same device
                out = torch.Tensor.to(tensor, *args[1:], **kwargs)
                self._tag(out, self.where.get(tensor))
                return out
            target = self.cuda_index(device)
        source = self.where.get(tensor)
        changes = {"dtype": dtype} if dtype is not None else {}
        if memory_format is not None:
            changes["memory_format"] = memory_format
        out = torch.Tensor.to(tensor, **changes) if changes else tensor
        if source != target:
            if source is not None and target is None:
                self._sync(".cpu()")                         # a copy from the GPU to the host waits for it
            out = out.view_as(out) if out is tensor else out  # a new tensor, as a copy to another device is
        if target is not None:
            self.where[out] = target
        return out

    # --- dropout ---
    def _dropout(self, args, kwargs):
        x = args[0]
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        training = args[2] if len(args) > 2 else kwargs.get("training", True)
        if not training:
            if self.training_forward and torch.is_grad_enabled():    # a training step with the model in eval mode
                self.record["train_in_eval_mode"] = self.record.get("train_in_eval_mode", 0) + 1
            return x
        if self.training_forward and torch.is_grad_enabled():
            seed = (self.training_forward - 1) * DROPOUT_SEEDS_PER_FORWARD + self.dropout_calls
            self.dropout_calls += 1
        else:                                                # evaluation with the model left in train mode
            self.record["eval_in_train_mode"] += 1
            seed = 10 ** 9 + self.record["eval_in_train_mode"]
        out = masked_dropout(x, p, seed)
        self._tag(out, self.where.get(x))
        return out

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is F.dropout:
            return self._dropout(args, kwargs)
        if not self.simulate:
            return func(*args, **kwargs)
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            return self._move(name, args, kwargs)
        if kwargs.get("device") is not None:
            target = self.cuda_index(kwargs["device"])
            if target is not None:
                out = func(*args, **{**kwargs, "device": "cpu"})
                self._tag(out, target)
                return out
        if (name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == "device"
                and not self.internal and isinstance(args[0], torch.nn.Parameter) and args[0] in self.where):
            return torch.device(self.where[args[0]])     # next(model.parameters()).device, as a script asks
        leaves = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        devices = [self.where.get(leaf) for leaf in leaves]
        if name in self.SYNCS and leaves and devices[0] is not None:
            self._sync(f".{name}()" if not name.startswith("__") else f"{name.strip('_')}(tensor)")
        if name in self.MIXING:
            placed = {device or "cpu" for leaf, device in zip(leaves, devices) if leaf.dim() > 0}
            if len(placed) > 1:
                self.record["mismatches"].append({"op": name, "devices": [d or "cpu" for d in devices],
                                                  "training": bool(self.training_forward)})
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{' and '.join(sorted(placed))}! (in {name}, on a simulated GPU node)")
        if name == "__set__" and len(args) == 2 and isinstance(args[1], torch.Tensor):   # param.data = moved
            self._tag(args[0], self.where.get(args[1]))
        out = func(*args, **kwargs)
        device = next((d for d in devices if d is not None), None)
        if device is not None and name not in self.SYNCS:
            self._tag(out, device)
        if name == "cpu" and out is (args[0] if args else None) and device is not None:
            out = out.view_as(out)     # on a real GPU .cpu() is a copy on the host: not the tagged GPU tensor
        return out

    def device_of(self, tensor) -> str:
        return self.where.get(tensor) or "cpu"


class _WeightWatch:
    """Counts the times the DDP model's weights changed other than through an optimizer step: a copy is
    taken after every step and compared (and taken again) before the next step and before every save. The
    count stays on the weights' device until the record is written (no host sync per step on a GPU)."""

    def __init__(self):
        self.params, self.snapshot, self.changes = [], None, None

    def watch(self, params) -> None:
        self.params, self.snapshot = list(params), None

    def after_step(self) -> None:
        if not self.params:             # no DDP model: the check says so, nothing to watch
            return
        with torch._C.DisableTorchFunction(), torch.no_grad():
            self.snapshot = [p.detach().clone() for p in self.params]

    def compare(self) -> None:
        if not self.snapshot:
            return
        with torch._C.DisableTorchFunction(), torch.no_grad():
            changed = torch.stack([((p != s) & ~(p.isnan() & s.isnan())).any()         # NaN stays NaN: unchanged
                                   for p, s in zip(self.params, self.snapshot)]).any().int()
            self.changes = changed if self.changes is None else self.changes + changed
        self.after_step()           # compared from here on: one change is counted once

    def count(self) -> int:
        with torch._C.DisableTorchFunction():
            return 0 if self.changes is None else int(self.changes.item())


def _setting(value):
    """A parameter group's setting as JSON can hold it (a tensor learning rate as its number)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        with torch._C.DisableTorchFunction():      # reading it is the probe's doing, not a host sync of the job's
            return value.item()
    if isinstance(value, (tuple, list)):
        return [_setting(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def _store_address(store) -> str | None:
    """Where a store given to init_process_group lives: "host:port" for a TCPStore (through any PrefixStore),
    its class for another kind, None for none."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if store is None:
        return None
    if isinstance(store, dist.TCPStore):
        return f"{store.host}:{store.port}"
    return type(store).__name__


def _optimizers_as_given() -> tuple[dict, dict]:
    """Before the script runs: every optimizer class it may use (torch.optim's and the course's utils.optim's),
    by the name a step record gives it, with its step function and that function's code; and the functions
    of the modules that define them (the steps' arithmetic, torch.optim.sgd.sgd and the like), with their code."""
    import types

    from utils import optim as course_optimizers
    classes = {}
    for module in (torch.optim, course_optimizers):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer:
                classes[f"{value.__module__}.{value.__qualname__}"] = (value, value.step, value.step.__code__)
    modules = {sys.modules[cls.__module__] for cls, *_ in classes.values()} | {optimizer_module}
    functions = {(module.__name__, name): (value, value.__code__) for module in modules
                 for name, value in vars(module).items()
                 if isinstance(value, types.FunctionType) and value.__module__ == module.__name__}
    return classes, functions


_GIVEN_OPTIMIZERS = _optimizers_as_given()
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(lambda self: None).__code__   # torch's wrapper of every step
_PROBE_HOOKS: list = []   # the probe's own step hooks (the only global ones a script's run may have)


def _given_step(step, original) -> bool:
    """``step`` is ``original``, or torch's profiling wrapper around it (Optimizer wraps each class's step once)."""
    if step is original:
        return True
    cells = [cell.cell_contents for cell in getattr(step, "__closure__", None) or ()]
    return getattr(step, "__code__", None) is _HOOKED_STEP and cells == [original]


def tampering(optimizer) -> str | None:
    """What of the script's own would run inside ``optimizer``'s step, between the probe's hooks that take
    the weights before it and after it (None: nothing). An optimizer the check does not take again (not one
    of ``_GIVEN_OPTIMIZERS``, by name) is refused elsewhere."""
    classes, functions = _GIVEN_OPTIMIZERS
    cls = type(optimizer)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name not in classes:
        return None
    given, step, code = classes[name]
    if cls is not given:
        return f"its optimizer's class is named {name} but is a class of the script's own"
    if not _given_step(cls.step, step) or step.__code__ is not code:
        return f"{name}.step was replaced"
    if getattr(optimizer, "_optimizer_step_pre_hooks", None) or getattr(optimizer, "_optimizer_step_post_hooks", None):
        return "its optimizer had step hooks of the script's own (register_step_pre_hook or register_step_post_hook)"
    hooks = optimizer_module._global_optimizer_pre_hooks, optimizer_module._global_optimizer_post_hooks
    if [hook for registered in hooks for hook in registered.values()] != _PROBE_HOOKS:
        return ("step hooks for every optimizer were registered (register_optimizer_step_pre_hook or "
                "register_optimizer_step_post_hook)")
    for (module, function), (value, code) in functions.items():
        now = getattr(sys.modules[module], function, None)
        if now is not value or value.__code__ is not code:
            return f"{module}.{function} (the optimizer's arithmetic) was replaced"
    return None


def step_record(optimizer, index: dict) -> dict:
    """One optimizer step: the optimizer's class, and per parameter group its parameters (their positions in
    the DDP model's ``parameters()``, -1 for one outside it) and its settings at this step."""
    return {"class": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            "groups": [{"params": [index.get(id(p), -1) for p in group["params"]],
                        "settings": {key: _setting(value) for key, value in group.items() if key != "params"}}
                       for group in optimizer.param_groups]}


def _record_calls(record: dict, gpus: SimulatedGPUs, weights: _WeightWatch, input_sums: list) -> None:
    init, destroy, save, all_reduce = dist.init_process_group, dist.destroy_process_group, torch.save, dist.all_reduce
    sampler_init, set_epoch, sampler_iter = DistributedSampler.__init__, DistributedSampler.set_epoch, DistributedSampler.__iter__
    ddp_init, ddp_forward = DistributedDataParallel.__init__, DistributedDataParallel.forward
    fail_at = int(os.environ.get("COURSE_PROBE_FAIL_AT", "0"))
    fails_here = os.environ.get("COURSE_PROBE_FAIL_RANK", "") == os.environ.get("RANK")
    right = {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    refusal = os.environ.get("COURSE_PROBE_REFUSAL") == "1"
    calls_only = os.environ.get("COURSE_PROBE_CALLS_ONLY") == "1"   # a real run: its settings left as they are
    torchrun_master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"   # before the script runs
    positions = {}                                   # id of a parameter of the DDP model -> its position
    trained = []     # the last DDP model's weights and buffers by name: the tensor objects DDP and its optimizer update

    def init_process_group(*args, **kwargs):
        bound = inspect.signature(init).bind(*args, **kwargs)
        given = bound.arguments
        record["init"] = {key: given.get(key) for key in ("rank", "world_size")}
        record["init"]["backend"] = str(given.get("backend"))
        method = given.get("init_method")
        record["init"]["init_method"] = None if method is None else str(method)[:300]
        record["init"]["master"] = torchrun_master
        record["init"]["env_master"] = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        record["init"]["store"] = _store_address(given.get("store"))
        wrong = {key: value for key, value in record["init"].items()
                 if key in right and value not in (None, -1) and int(value) != right[key]}
        if wrong:   # the ranks would wait for each other until the timeout: stop now, the check explains why
            raise RuntimeError(f"the check stopped this rank: init_process_group was given {wrong}, torchrun's "
                               f"environment says {right}")
        if gpus.simulate:
            if given.get("device_id") is not None:
                record["set_device"].append(gpus.cuda_index(given["device_id"]))
                bound.arguments["device_id"] = None
            bound.arguments["backend"] = "gloo"              # nccl needs real GPUs; gloo does the same sums
        if not calls_only:
            bound.arguments["timeout"] = min(given.get("timeout") or MAX_TIMEOUT, MAX_TIMEOUT)
        joined = init(*bound.args, **bound.kwargs)
        if refusal:
            dist.set_timeout(min(bound.arguments.get("timeout") or MAX_TIMEOUT, REFUSAL_TIMEOUT))
            _probe_dir().mkdir(parents=True, exist_ok=True)
            (_probe_dir() / f"joined{os.environ['RANK']}").touch()   # see _wait_for_every_record
        return joined

    def destroy_process_group(*args, **kwargs):
        record["destroyed"] = True
        if refusal:
            _wait_for_every_rank_to_join(_probe_dir())
        destroyed = destroy(*args, **kwargs)
        # A right script must not die at exit for torch's sake: with the group freed for real, gloo's threads
        # end now, not during the interpreter's shutdown (utils.ddp.destroy_process_group says why).
        forget_destroyed_group()
        return destroyed

    def saved(obj, f, *args, **kwargs):
        weights.compare()
        record["saves"].append(str(f))
        if len(record["saved"]) < MAX_SAVES:
            record["saved"].append({"file": os.path.basename(str(f)), "steps": record["optimizer_steps"],
                                    "digest": state_digest(obj),
                                    "model": state_digest(trained[0]) if trained else None})
        return save(obj, f, *args, **kwargs)

    def hand_all_reduce(tensor, *args, **kwargs):
        record["all_reduced"] += tensor.numel()
        if gpus.simulate and record["init"] and "nccl" in record["init"]["backend"] and gpus.where.get(tensor) is None:
            record["mismatches"].append({"op": "all_reduce", "devices": ["cpu"], "training": False})
            raise RuntimeError("No backend type associated with device type cpu (nccl reduces GPU tensors only; "
                               "on a simulated GPU node)")
        return all_reduce(tensor, *args, **kwargs)

    def distributed_sampler(self, *args, **kwargs):
        given = inspect.signature(sampler_init).bind(self, *args, **kwargs).arguments
        # What the script passed, recorded before the sampler can refuse it (a rank >= num_replicas raises).
        entry = {"given": {key: given.get(key) for key in ("num_replicas", "rank")},
                 "size": len(given["dataset"]), "epochs": [], "iterated": []}
        record["samplers"].append(entry)
        self._probe_index = len(record["samplers"]) - 1
        sampler_init(self, *args, **kwargs)
        entry.update(seed=self.seed, shuffle=self.shuffle, drop_last=self.drop_last)

    def sampler_set_epoch(self, epoch):
        if hasattr(self, "_probe_index"):
            record["samplers"][self._probe_index]["epochs"].append(int(epoch))
        return set_epoch(self, epoch)

    def sampler_iterate(self):
        if hasattr(self, "_probe_index"):
            entry = record["samplers"][self._probe_index]
            # The order is drawn from seed + epoch: a seed changed after construction counts as that epoch.
            entry["iterated"].append(int(self.epoch) + int(self.seed) - int(entry.get("seed", self.seed)))
        return sampler_iter(self)

    def ddp(self, *args, **kwargs):
        bound = inspect.signature(ddp_init).bind(self, *args, **kwargs)
        module = bound.arguments["module"]
        record["ddp"] += 1
        # The last DDP model's (the one watched and saved), before DDP broadcasts rank 0's. Its tensors are kept by
        # object, not re-read through state_dict() at a save: a state_dict hook or a parameter swapped in before a
        # save would otherwise show other weights than the ones trained.
        record["initial"] = state_digest(module.state_dict())
        trained[:] = [dict(module.state_dict(keep_vars=True))]
        record["params"] = sum(p.numel() for p in module.parameters())
        positions.clear()
        positions.update({id(p): i for i, p in enumerate(module.parameters())})
        weights.watch(module.parameters())
        record["param_tensors"] = len(positions)
        record["model_device"] = sorted({gpus.device_of(p) for p in module.parameters()})
        ids = bound.arguments.get("device_ids")
        record["device_ids"] = None if ids is None else [gpus.cuda_index(i) or str(i) for i in ids]
        if gpus.simulate:
            bound.arguments["device_ids"] = bound.arguments["output_device"] = None   # the tensors are on the CPU
        gpus.internal += 1
        try:
            return ddp_init(*bound.args, **bound.kwargs)
        finally:
            gpus.internal -= 1

    def forward(self, *args, **kwargs):
        training = self.training and torch.is_grad_enabled()    # else evaluation through the wrapper
        if torch.is_grad_enabled() and not self.training:      # DDP still prepares a backward: a step in eval mode?
            record["ddp_eval_with_grad"] += 1
        if training:
            record["forwards"] += 1
            batch = next((leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)), None)
            record["batches"].append(0 if batch is None or batch.dim() == 0 else len(batch))
            if batch is not None and len(input_sums) < MAX_STEPS:
                with torch._C.DisableTorchFunction(), torch.no_grad():   # kept on its device: no host sync per step
                    input_sums.append(batch.detach().float().sum())
            if fails_here and record["forwards"] == fail_at:
                raise RuntimeError(INJECTED)
            gpus.training_forward, gpus.dropout_calls = record["forwards"], 0
        gpus.internal += 1
        try:
            return ddp_forward(self, *args, **kwargs)
        finally:
            gpus.training_forward = 0
            gpus.internal -= 1

    def before_step(optimizer, args, kwargs):
        weights.compare()
        record["optimizer_steps"] += 1
        if not record["tampered"]:
            record["tampered"] = tampering(optimizer)
        if len(record["steps"]) < MAX_STEPS:
            record["steps"].append(step_record(optimizer, positions))
        gpus.internal += 1          # the optimizer's own code sees the real devices (it picks its kernels by them)

    def after_step(optimizer, args, kwargs):
        gpus.internal -= 1
        weights.after_step()

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    _PROBE_HOOKS[:] = [before_step, after_step]
    # A script reaches these through torch.distributed or through the module that defines them (also with
    # `from torch.distributed.distributed_c10d import all_reduce`, which runs after this): replace both.
    for name, replacement in [("init_process_group", init_process_group), ("destroy_process_group", destroy_process_group),
                              ("all_reduce", hand_all_reduce)]:
        setattr(dist, name, replacement)
        setattr(dist.distributed_c10d, name, replacement)
    torch.save = saved
    DistributedSampler.__init__, DistributedSampler.set_epoch = distributed_sampler, sampler_set_epoch
    DistributedSampler.__iter__ = sampler_iterate
    DistributedDataParallel.__init__, DistributedDataParallel.forward = ddp, forward
    if gpus.simulate:
        _simulate_cuda(record, gpus)


class _SimulatedStream:
    """The current stream of a simulated GPU: never capturing a graph; waiting for it is a host sync."""

    def __init__(self, gpus: SimulatedGPUs):
        self.gpus = gpus

    def is_capturing(self) -> bool:
        return False

    def synchronize(self) -> None:
        self.gpus._sync("stream.synchronize()")


def _simulate_cuda(record: dict, gpus: SimulatedGPUs) -> None:
    """torch.cuda as a node with a GPU per local process shows it to a script."""
    def set_device(device):
        index = gpus.cuda_index(device)
        if index is None:
            raise ValueError(f"torch.cuda.set_device takes a GPU (an index or a cuda device), not {device!r}")
        record["set_device"].append(index)
        gpus.current = int(index.split(":")[1])

    def synchronize(device=None):
        gpus._sync("torch.cuda.synchronize()")

    # Pinned memory needs a driver; a simulated node's host memory stands for it (DataLoader(pin_memory=True)
    # pins in a thread of its own, where the mode above is not active, so the method itself is replaced).
    torch.Tensor.pin_memory = lambda self, device=None: self
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: gpus.count
    torch.cuda.set_device, torch.cuda.synchronize = set_device, synchronize
    torch.cuda.current_device = lambda: gpus.current
    torch.cuda.get_device_name = lambda device=None: "simulated GPU"
    # Optimizers ask the accelerator's current stream whether a CUDA graph is being captured (Adam does).
    torch.accelerator.current_stream = lambda device=None: _SimulatedStream(gpus)


def _probe_dir() -> Path:
    return Path(os.environ.get("COURSE_PROBE_DIR", "."))


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: torchrun ... -m utils.checks.job.probe SCRIPT [ARGS...]")
    script = argv[0]
    out = _probe_dir()
    rank = os.environ.get("RANK", "?")
    record = {"rank": rank, "world_size": os.environ.get("WORLD_SIZE"), "local_rank": os.environ.get("LOCAL_RANK"),
              "local_world_size": os.environ.get("LOCAL_WORLD_SIZE"), "node": os.environ.get("GROUP_RANK"),
              "init": None, "destroyed": False, "samplers": [], "ddp": 0, "forwards": 0, "batches": [], "saves": [],
              "error": None, "printed": "", "set_device": [], "device_errors": [], "model_device": None,
              "device_ids": None, "params": 0, "mismatches": [], "syncs": {"train": 0, "eval": 0}, "sync_kinds": [],
              "all_reduced": 0, "eval_in_train_mode": 0, "train_in_eval_mode": 0, "ddp_eval_with_grad": 0,
              "steps": [], "sync_points": {}, "peer_lost": False, "initial": None, "saved": [], "optimizer_steps": 0,
              "tampered": None, "argv": [str(a)[:200] for a in argv[1:100]]}
    printed: list[str] = []
    input_sums: list = []
    gpus = SimulatedGPUs(record, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), os.environ.get("COURSE_PROBE_GPUS") == "1")
    weights = _WeightWatch()
    _record_calls(record, gpus, weights, input_sums)
    # Written at exit, after the script's own exit handlers (atexit runs the last registered first): a script
    # may rightly tear its group down in one of them.
    tee = _Tee(sys.stdout, printed)
    atexit.register(_write_record, out, rank, record, printed, weights, tee, input_sums)
    sys.stdout = tee
    sys.argv = list(argv)
    if os.environ.get("COURSE_PROBE_CALLS_ONLY") == "1":
        # The grader replays this run in float32 on the CPU: TF32, cuDNN's default for convolutions on Ampere and newer
        # GPUs, would round the run's steps more coarsely than the replay does (an outside review emulated it: 3-4% of an
        # epoch's movement, near the replay's tolerance). A script may turn it on again; its record says so.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        # A real run (COURSE_PROBE_CALLS_ONLY, gpus.simulate False) passes every tensor operation through untouched
        # but its training dropout, seeded as in the check, so that the grader can replay it (assessment.job).
        with gpus:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            record["error"] = f"SystemExit: {stop.code}"
        raise
    except BaseException as error:
        record["error"] = f"{type(error).__name__}: {error}"
        record["peer_lost"] = isinstance(error, dist.DistError) or any(text in str(error) for text in PEER_LOST)
        raise


def _write_record(out: Path, rank: str, record: dict, printed: list[str], weights: _WeightWatch,
                  tee: _Tee | None = None, input_sums: list | None = None) -> None:
    text = "".join(printed)
    record["printed"] = text[-20000:]
    if tee is not None:     # what the job's own code printed (torch's and the check's output left out)
        job = "".join(tee.job)
        record["job_printed"] = job
        record["job_printed_lines"] = tee.job_lines + (0 if tee.job_ended_line else 1)
    # The epoch lines apart: a job that prints a progress line every step would push them out of the tail.
    record["epoch_lines"] = "\n".join(line.group(0) for line in EPOCH_LINE.finditer(text))[-100_000:]
    try:
        record["weights_changed_between_steps"] = weights.count()
    except Exception as error:  # noqa: BLE001 - a device lost at exit: the record still goes out, saying so
        record["weights_changed_between_steps"] = f"unknown ({type(error).__name__})"
    try:
        with torch._C.DisableTorchFunction():
            record["input_sums"] = torch.stack([s.to("cpu") for s in input_sums]).tolist() if input_sums else []
    except Exception as error:  # noqa: BLE001 - as above
        record["input_sums"] = f"unknown ({type(error).__name__})"
    # What rounds the run's steps, for the replay's evidence: where it trained, TF32, torch's threads.
    record["numerics"] = {"cuda": bool(record.get("set_device")) or torch.cuda.is_initialized(),
                          "tf32": bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32),
                          "threads": torch.get_num_threads()}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    if os.environ.get("COURSE_PROBE_REFUSAL") == "1":
        _wait_for_every_record(out)


def _wait_for_every_rank_to_join(out: Path) -> None:
    """In a refusal run, before a group is closed: a peer still inside init_process_group would see the group
    closed under it and fail for that, not for its own choice, so wait until every rank has joined or ended."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    deadline = time.monotonic() + REFUSAL_TIMEOUT.total_seconds()
    while time.monotonic() < deadline and not all(
            (out / f"joined{r}").exists() or (out / f"rank{r}.json").exists() for r in range(world)):
        time.sleep(0.05)


def _wait_for_every_record(out: Path) -> None:
    """Stay until every rank has written its record (at most a refusal run's collective timeout and a margin):
    torchrun stops all ranks once one exits, and a rank stopped before it decides shows nothing of its own.
    The group is closed first, so that a peer still waiting in a collective with this rank fails now."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_initialized():
        _wait_for_every_rank_to_join(out)
        _DESTROY()
    deadline = time.monotonic() + REFUSAL_TIMEOUT.total_seconds() + 10
    while len(list(out.glob("rank*.json"))) < world and time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1:])

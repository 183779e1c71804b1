"""Data parallelism written from scratch: four wrappers, each a step further towards torch's DDP.
Taught in lab 05; the lab's exercises build the same four.

    model = BucketedDDP(MLP(), bucket_cap_mb=25)     # or NaiveDDP, FlatDDP, OverlapDDP
    loss_fn(model(x), y).backward()
    model.finish_gradient_synchronization()          # after backward(), before optimizer.step()
    optimizer.step()

Every wrapper broadcasts rank 0's parameters and buffers when it is built (and its buffers before
every forward, as torch's DDP does), and leaves every rank's gradients equal to the mean over the
ranks of the local gradients, so that each rank takes the same optimizer step.

- ``NaiveDDP``:    one blocking all_reduce per parameter, after backward.
- ``FlatDDP``:     one all_reduce of all gradients flattened into a single buffer, after backward.
- ``OverlapDDP``:  an asynchronous all_reduce per parameter, started from a hook the moment its
                   gradient is ready, so communication overlaps the rest of backward.
- ``BucketedDDP``: gradients copied into buckets of about ``bucket_cap_mb``, in reverse order of
                   the parameters (roughly the order backward produces them); each bucket is reduced
                   asynchronously as soon as it is full (Li et al., VLDB 2020, section 3.2).

Choices (the same in all four): a parameter that received no gradient on this rank (unused in
forward) takes part as zeros, so every rank always runs the same collectives, and it ends with the
mean gradient (zeros if no rank used it; torch's DDP leaves such a gradient ``None``, which matters
only to optimizers with weight decay). Parameters with ``requires_grad=False`` are left out. Tied
weights are one parameter, reduced once. Inside ``with model.no_sync():`` gradients accumulate
locally; the first backward after it reduces the accumulated sums.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn


class Timeline:
    """Spans of time on named lanes ("compute", "bucket 0", ...), for a Gantt chart of one step.

    On the CPU a span is host time (``time.perf_counter``). With a CUDA ``device`` the host only
    queues work, so spans are CUDA events on the device's streams instead, read (after a
    synchronisation) when ``spans`` is first asked for: NCCL completes a collective's future when
    the collective is queued, not when its bytes have arrived, so host clocks would end every
    all-reduce at its launch.
    """

    def __init__(self, device=None):
        self.origin = time.perf_counter()
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self._spans: list[tuple[str, str, float, float]] = []   # (lane, label, start s, end s)
        self._events: list = []                                   # (lane, label, start event, end event)
        if self.cuda:
            self._origin_event = self._event()
            self._side = torch.cuda.Stream(device=device)         # where the ends of collectives are marked

    @staticmethod
    def _event():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, lane: str, label: str, start: float, end: float) -> None:
        self._spans.append((lane, label, start - self.origin, end - self.origin))

    @property
    def spans(self) -> list[tuple[str, str, float, float]]:
        if self._events:
            torch.cuda.synchronize()
            for lane, label, start, end in self._events:
                self._spans.append((lane, label, self._origin_event.elapsed_time(start) / 1e3,
                                    self._origin_event.elapsed_time(end) / 1e3))
            self._events = []
        return self._spans

    @contextmanager
    def span(self, lane: str, label: str):
        if self.cuda:
            start = self._event()
            try:
                yield
            finally:
                self._events.append((lane, label, start, self._event()))
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(lane, label, start, time.perf_counter())

    def add_work(self, lane: str, work) -> None:
        """An async collective from its launch to its end (time queued behind earlier ones included)."""
        if self.cuda:
            start = self._event()                      # the gradients are ready: the collective may start
            with torch.cuda.stream(self._side):
                work.wait()                            # the side stream waits for the collective, the host does not
                end = torch.cuda.Event(enable_timing=True)
                end.record(self._side)
            self._events.append((lane, "all_reduce", start, end))
            return
        start = time.perf_counter()
        work.get_future().then(lambda _: self.add(lane, "all_reduce", start, time.perf_counter()))


def _record_when_done(timeline: Timeline | None, work, lane: str) -> None:
    """Record an async all_reduce on a lane of its own (see ``Timeline.add_work``)."""
    if timeline is not None:
        timeline.add_work(lane, work)


class DataParallel(nn.Module):
    """What the four wrappers share: the start-up broadcast, buffers, ``no_sync`` and the bookkeeping.

    A subclass writes ``finish_gradient_synchronization``; it may use ``self.params`` (the
    parameters to reduce), ``self.world_size``, ``self.group``, ``self.local_grad(param)``,
    ``self.on_gradient_ready(hook)`` and ``self.synchronizing`` (False inside ``no_sync()``).
    Lab 05's exercises subclass it the same way.
    """

    def __init__(self, module: nn.Module, group=None, timeline: Timeline | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("no process group: start the workers with utils.cluster.start(n) "
                               "(or torchrun / dist.init_process_group) before wrapping the model")
        self.module, self.group, self.timeline = module, group, timeline
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]  # tied weights appear once
        self.synchronizing = True
        self._remove_earlier_hooks()
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=self._global_rank_0(), group=group)

    def _global_rank_0(self) -> int:
        # broadcast's src is a global rank; the group's rank 0 is not global rank 0 for a subgroup.
        return 0 if self.group is None else dist.get_global_rank(self.group, 0)

    def forward(self, *args, **kwargs):
        buffers = list(self.module.buffers())
        if buffers and self.world_size > 1:
            # Like torch's DDP (broadcast_buffers=True): e.g. BatchNorm's running statistics follow rank 0.
            with torch.no_grad():
                for buffer in buffers:
                    dist.broadcast(buffer, src=self._global_rank_0(), group=self.group)
        if self.timeline is None:
            return self.module(*args, **kwargs)
        with self.timeline.span("compute", "forward"):
            return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (gradient accumulation); the next backward outside reduces them."""
        self.synchronizing = False
        try:
            yield
        finally:
            self.synchronizing = True

    def on_gradient_ready(self, hook) -> None:
        """Call ``hook(param)`` whenever backward has accumulated a parameter's gradient."""
        for param in self.params:
            param._data_parallel_hook = param.register_post_accumulate_grad_hook(hook)

    def _remove_earlier_hooks(self) -> None:
        # Wrapping the same model again (re-running a notebook cell) must not leave the old
        # wrapper's hooks behind: they would go on launching collectives of their own.
        for param in self.module.parameters():
            old = getattr(param, "_data_parallel_hook", None)
            if old is not None:
                old.remove()
                del param._data_parallel_hook

    def local_grad(self, param: nn.Parameter) -> torch.Tensor:
        """This rank's gradient of ``param``, or zeros if backward gave it none (every rank must
        still take part in its reduction)."""
        return param.grad if param.grad is not None else torch.zeros_like(param)

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError


class NaiveDDP(DataParallel):
    """One blocking all_reduce per parameter after backward: correct, and as slow as it gets."""

    def finish_gradient_synchronization(self) -> None:
        if not self.synchronizing:
            return
        for param in self.params:
            grad = self.local_grad(param)
            dist.all_reduce(grad, group=self.group)        # the sum over ranks ...
            grad.div_(self.world_size)                     # ... divided: the mean (seed 000 forgot this)
            param.grad = grad


class FlatDDP(DataParallel):
    """All gradients flattened into one buffer and reduced in one call: one latency, not one per tensor."""

    def finish_gradient_synchronization(self) -> None:
        if not self.synchronizing or not self.params:
            return
        flat = torch.cat([self.local_grad(p).reshape(-1) for p in self.params])
        flat.div_(self.world_size)                         # divide first: the sum of means cannot overflow
        dist.all_reduce(flat, group=self.group)
        for param, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
            param.grad = piece.view_as(param)


def _all_reduce_async(tensor: torch.Tensor, group=None):
    """``dist.all_reduce(tensor, async_op=True)``, safe to start from a gradient hook.

    The course's fix for an upstream problem (torch 2.14, gloo). For every backward, torch.autograd
    stashes a Python object, a copy of the context variables, in the thread's state
    (pytorch/pytorch#173568), and a collective started inside backward copies that state into its
    work object, so freeing the work takes the GIL. The last reference can be gloo's worker
    thread's, let go just after the work completes; when that falls as the interpreter shuts down
    (a job that ends right after its last step, or after barrier() and dist.destroy_process_group(),
    which leaves gloo's threads running once torch.optim has imported torch._dynamo: see
    ``destroy_process_group``), Python ends
    that thread inside the destructor, which may not throw, and the process aborts: "terminate
    called without an active exception", SIGABRT (the crash of pytorch/pytorch#117762). Keeping the
    handles, as torch's DDP does, only narrows the window: the wrapper can be freed before gloo's
    thread lets go. So the collective starts without that object: nothing in its work needs the GIL.
    """
    remove = getattr(torch._C, "_remove_obj_from_tls", None)          # private; older torch lacks it
    if remove is None or not torch._C._is_key_in_tls("context"):       # outside backward: nothing to do
        return dist.all_reduce(tensor, group=group, async_op=True)
    context = torch._C._get_obj_in_tls("context")
    remove("context")
    try:
        return dist.all_reduce(tensor, group=group, async_op=True)
    finally:
        torch._C._stash_obj_in_tls("context", context)                # backward goes on with it


class OverlapDDP(DataParallel):
    """An async all_reduce per parameter, started by a hook as soon as backward has its gradient."""

    def __init__(self, module: nn.Module, group=None, timeline: Timeline | None = None):
        super().__init__(module, group, timeline)
        self._works: dict[nn.Parameter, object] = {}       # param -> its in-flight all_reduce, this step
        self.on_gradient_ready(self._grad_ready)

    def _grad_ready(self, param: nn.Parameter) -> None:
        if not self.synchronizing:
            return
        if param in self._works:
            raise RuntimeError("backward() ran twice before finish_gradient_synchronization(); for gradient "
                               "accumulation run the earlier backward passes inside `with model.no_sync():`")
        self._launch(param, param.grad)

    def _launch(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        grad.div_(self.world_size)
        work = _all_reduce_async(grad, self.group)           # from a hook: see _all_reduce_async
        _record_when_done(self.timeline, work, f"grad {tuple(param.shape)}")
        self._works[param] = work

    def finish_gradient_synchronization(self) -> None:
        if not self.synchronizing:
            return
        for param in self.params:                          # unused on this rank: reduce zeros, same order everywhere
            if param not in self._works:
                param.grad = self.local_grad(param)
                self._launch(param, param.grad)
        for work in self._works.values():
            work.wait()
        self._works = {}


class _Bucket:
    """Some parameters' gradients side by side in one flat buffer, reduced in one call."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        pieces = self.buffer.split([p.numel() for p in params])
        self.pieces = {param: piece.view_as(param) for param, piece in zip(params, pieces)}
        self.ready: set = set()
        self.work = None

    def put(self, param: nn.Parameter, grad: torch.Tensor) -> None:
        piece = self.pieces[param]
        if grad.data_ptr() != piece.data_ptr():           # after the first step .grad may be the piece itself
            piece.copy_(grad)
        self.ready.add(param)


def assign_buckets(params: list[nn.Parameter], bucket_cap_mb: float) -> list[list[nn.Parameter]]:
    """Group parameters, last first, into buckets of at most ``bucket_cap_mb`` MiB (a larger parameter
    gets a bucket of its own); a bucket holds one dtype and device, since it is one flat tensor."""
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0 (torch's DDP uses 25), got {bucket_cap_mb!r}")
    cap_bytes = bucket_cap_mb * 2 ** 20
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for param in reversed(params):                         # backward produces the last layer's grads first
        nbytes = param.numel() * param.element_size()
        fits = buckets and size + nbytes <= cap_bytes
        same_kind = buckets and (buckets[-1][0].dtype, buckets[-1][0].device) == (param.dtype, param.device)
        if fits and same_kind:
            buckets[-1].append(param)
            size += nbytes
        else:
            buckets.append([param])
            size = nbytes
    return buckets


class BucketedDDP(DataParallel):
    """Gradients packed into buckets of about ``bucket_cap_mb`` MiB; each full bucket is reduced at once,
    asynchronously, while backward goes on. Buckets are launched in the same order on every rank."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None, timeline: Timeline | None = None):
        super().__init__(module, group, timeline)
        self.buckets = [_Bucket(params) for params in assign_buckets(self.params, bucket_cap_mb)]
        self._bucket_of = {param: bucket for bucket in self.buckets for param in bucket.params}
        self._next = 0                                     # the next bucket to launch
        self.on_gradient_ready(self._grad_ready)

    def _grad_ready(self, param: nn.Parameter) -> None:
        if not self.synchronizing:
            return
        bucket = self._bucket_of[param]
        if param in bucket.ready:
            raise RuntimeError("backward() ran twice before finish_gradient_synchronization(); for gradient "
                               "accumulation run the earlier backward passes inside `with model.no_sync():`")
        bucket.put(param, param.grad)
        self._launch_full_buckets()

    def _launch_full_buckets(self) -> None:
        # Strictly in bucket order: had a rank launched bucket 1 before bucket 0, the collectives
        # would pair up wrongly across ranks.
        while self._next < len(self.buckets) and len(self.buckets[self._next].ready) == len(self.buckets[self._next].params):
            bucket = self.buckets[self._next]
            bucket.buffer.div_(self.world_size)
            bucket.work = _all_reduce_async(bucket.buffer, self.group)
            _record_when_done(self.timeline, bucket.work, f"bucket {self._next}")
            self._next += 1

    def finish_gradient_synchronization(self) -> None:
        if not self.synchronizing:
            return
        for bucket in self.buckets[self._next:]:           # parameters backward never reached on this rank
            for param in bucket.params:
                if param not in bucket.ready:
                    bucket.put(param, self.local_grad(param))
        self._launch_full_buckets()
        for bucket in self.buckets:
            bucket.work.wait()
            for param in bucket.params:
                param.grad = bucket.pieces[param]          # a view of the bucket: no copy back (torch's
            bucket.ready, bucket.work = set(), None        # gradient_as_bucket_view); zero_grad() clears it
        self._next = 0


def step_time(wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int = 10, warmup: int = 3,
              lr: float = 0.1, group=None) -> float:
    """Median seconds of one SGD step of ``wrapped`` on this rank's batch ``(x, y)``: the slowest
    rank's, since a data-parallel step is over only when every rank is. Every rank must call it.

    A barrier lines the ranks up before each step, so no rank is timed waiting for a late one;
    on CUDA the device is synchronised before the clock stops. ``wrapped`` may be any module:
    a DDP wrapper of this file, torch's DDP, or a bare model (no communication at all).
    """
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)
    finish = getattr(wrapped, "finish_gradient_synchronization", None)
    times = []
    for _ in range(warmup + steps):
        dist.barrier(group=group)
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(wrapped(x), y).backward()
        if finish is not None:
            finish()
        optimizer.step()
        if x.is_cuda:
            torch.cuda.synchronize(x.device)
        times.append(time.perf_counter() - start)
    median = torch.tensor(sorted(times[warmup:])[steps // 2], dtype=torch.float64,
                          device=x.device if dist.get_backend(group) == "nccl" else "cpu")
    dist.all_reduce(median, op=dist.ReduceOp.MAX, group=group)
    return median.item()


VARIANTS = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP, "bucketed": BucketedDDP}


def destroy_process_group() -> None:
    """``dist.destroy_process_group()``, with gloo's threads stopped before it returns: the teardown
    of the course's jobs (after a ``dist.barrier()`` when they end normally).

    Why (torch 2.14, gloo). A gloo worker thread lets go of a finished collective a moment after the
    caller has moved on (a barrier even keeps the collectives before it until it is freed itself),
    and letting go of a tensor that has a Python object, a gradient say, takes the GIL. Should that
    fall while the interpreter shuts down, Python ends the thread inside a C++ destructor, which may
    not throw: "terminate called without an active exception", SIGABRT, from a job that trained
    correctly. Destroying the group joins its threads (torch releases the GIL for that), so no thread
    is left to do it late. But ``dist.destroy_process_group()`` destroys nothing while something
    else still refers to the group, and ``torch.distributed.nn.functional`` does when it was first
    imported after ``init_process_group`` (torch._dynamo imports it, and torch.optim's optimizers
    and torch's DDP import torch._dynamo when they are built): its functions' default ``group`` is
    ``group.WORLD``, read at import. So those references go too.
    """
    dist.destroy_process_group()
    forget_destroyed_group()


def forget_destroyed_group() -> None:
    """Drop the references to a destroyed default group that ``torch.distributed.nn.functional``
    keeps in its functions' default arguments (``group=group.WORLD``, read when the module was
    imported): with them gone the group is freed, and gloo's threads end with it. None, what they
    are when the module is imported before any group exists, means the default group there."""
    import sys

    functional = sys.modules.get("torch.distributed.nn.functional")
    for function in vars(functional).values() if functional is not None else ():
        defaults = getattr(function, "__defaults__", None) or ()
        if any(isinstance(value, dist.ProcessGroup) for value in defaults):
            function.__defaults__ = tuple(None if isinstance(value, dist.ProcessGroup) else value
                                          for value in defaults)

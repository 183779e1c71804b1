"""Checks for labs/05_ddp_from_scratch.ipynb: the learner's four DDP wrappers.

Each check sends the learner's class to the engines and, on every rank at once, trains it for a
few steps on ``RareNet``: ``utils.labs.lab05.AwkwardNet`` (frozen, tied, unused parameters, a
buffer; every rank starting from other weights) plus a layer that only some ranks use in a step,
a different rank each step. It then requires that the ranks agree, that the weights equal one
process trained on the whole batches and torch's DDP trained on the same shards, that frozen
parameters keep no gradient, and that the wrapper communicates the way its exercise asks (one
call; during backward without waiting there; per bucket, of the right size, in the right order;
nothing inside ``no_sync()``).

Every all_reduce and broadcast the learner makes is first announced to the other ranks (what,
how many elements, which dtype) on the check's own process group, so ranks that disagree on their
calls get a message naming the first difference instead of a deadlock or a crashed engine. The
wrapper is built with torch's default device set to ``meta``: a buffer allocated without
``device=`` lands there and is named, as it would land on the CPU in a GPU run. The finished
wrappers of ``utils.ddp`` and torch's DDP are refused: the exercise is to write them.
"""
from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch import nn

from . import ExerciseError, exercise, hint_for
from .engines import Wrong, globals_used, prepare, run_case, spy
from ..labs.lab05 import AwkwardNet

TOLERANCE = 1e-9      # float64: a correct wrapper differs from one process by rounding only
STEPS = 3
TINY_CAP_MB, MIDDLE_CAP_MB, HUGE_CAP_MB = 1e-6, 0.002, 1000.0
_GUARDED = ("all_reduce", "broadcast")                  # the collectives a wrapper makes
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32)
_FINISHED = ("NaiveDDP", "FlatDDP", "OverlapDDP", "BucketedDDP", "assign_buckets", "_Bucket",
             "_launch_full_buckets", "DistributedDataParallel")

HINTS = {
    "5.1": """Step by step:
1. In __init__, inside `with torch.no_grad():`, loop over list(module.parameters()) + list(module.buffers())
   and call dist.broadcast(tensor, src=0) on each: rank 0's values overwrite every other rank's.
2. In finish_gradient_synchronization, loop over self.module.parameters() and skip those whose
   requires_grad is False (frozen parameters keep no gradient).
3. Take grad = param.grad if param.grad is not None else torch.zeros_like(param). Never skip a None
   gradient: another rank may have one, and every rank must make the same calls in the same order.
   (Not `param.grad or ...`: a tensor of several elements has no truth value.)
4. dist.all_reduce(grad) sums it over the ranks in place; grad /= dist.get_world_size() makes it the
   mean; param.grad = grad stores it (needed when it was None).""",
    "5.2": """Step by step:
1. flat = torch.cat([self.local_grad(p).reshape(-1) for p in self.params]): one float64 vector.
2. flat /= self.world_size, then dist.all_reduce(flat): one call for all gradients.
3. sizes = [p.numel() for p in self.params]; for each (param, piece) in zip(self.params, flat.split(sizes)):
   param.grad = piece.view_as(param).""",
    "5.3": """Step by step:
1. gradient_ready(param): if not self.synchronizing, return (inside no_sync() gradients stay local).
2. Divide param.grad by self.world_size in place, then
   self.handles[param] = dist.all_reduce(param.grad, async_op=True). Do not wait here: waiting in the
   hook blocks backward until the bytes have travelled, and nothing overlaps.
3. finish_gradient_synchronization: return if not self.synchronizing. For each param of self.params
   (the same order on every rank) that is not in self.handles (backward never reached it), set
   param.grad = self.local_grad(param) / self.world_size and start its all_reduce the same way.
4. Then call .wait() on every handle, and reset self.handles = {} for the next step.""",
    "5.4": """Step by step:
1. __init__: cap = bucket_cap_mb * 2**20 bytes. Walk reversed(self.params); a parameter's bytes are
   param.numel() * param.element_size(). Append it to the last bucket if that bucket's bytes plus its
   own stay <= cap, else start a new bucket {"params": [param]}.
2. For each bucket: slices[param] = (offset, offset + param.numel()) with a running offset; buffer =
   torch.zeros(total, dtype=first.dtype, device=first.device) where first = bucket["params"][0] (a
   float32 buffer rounds float64 gradients; a CPU buffer fails on GPUs); ready = set(); handle = None.
3. self.bucket_of = {param: bucket for bucket in self.buckets for param in bucket["params"]};
   self.next_bucket = 0.
4. launch_full_buckets: while self.next_bucket < len(self.buckets) and the bucket at that index has
   every param in its ready set: divide its buffer by self.world_size, handle = dist.all_reduce(buffer,
   async_op=True), self.next_bucket += 1. Stop at the first bucket not full: launch in order.
5. finish_gradient_synchronization: for buckets from self.next_bucket on, put(bucket, param,
   self.local_grad(param)) for each param not ready; launch_full_buckets(); then for every bucket:
   handle.wait(), param.grad = buffer[start:stop].view_as(param).clone() for each slice, ready = set(),
   handle = None. Finally self.next_bucket = 0.""",
}


hint = hint_for(HINTS)  # lab05.hint("5.1") prints that exercise's step-by-step hint


class RareNet(nn.Module):
    """AwkwardNet's awkward parts (frozen, tied, unused, a buffer, a one-element parameter) plus
    ``rare``, a layer applied only to samples whose first feature is > 0: a rank whose shard holds
    none leaves its gradient None while other ranks' are not None. It is registered before ``head``
    so that, walking the parameters from the last, buckets before it can launch during backward."""

    def __init__(self, d_in: int = 12, d_hidden: int = 16, n_classes: int = 5):
        super().__init__()
        self.frozen = nn.Linear(d_in, d_hidden)
        self.frozen.requires_grad_(False)
        self.wide = nn.Linear(d_hidden, 4 * d_hidden)
        self.narrow = nn.Linear(4 * d_hidden, d_hidden)
        self.tied = nn.Linear(d_hidden, d_hidden, bias=False)
        self.unused = nn.Linear(d_hidden, d_hidden)
        self.rare = nn.Linear(d_hidden, n_classes)
        self.head = nn.Linear(d_hidden, n_classes)
        self.gain = nn.Parameter(torch.ones(1))
        self.register_buffer("scale", torch.rand(d_hidden) + 0.5)

    def forward(self, x):
        h = torch.tanh(self.frozen(x)) * self.scale
        h = torch.tanh(self.narrow(torch.relu(self.wide(h))))
        h = torch.tanh(self.tied(h))
        h = torch.tanh(self.tied(h))
        out = self.head(h) * self.gain
        picked = x[:, 0] > 0
        if picked.any():                                   # data-dependent: some ranks skip the layer
            out = out + picked.unsqueeze(1) * self.rare(h)
        return out


def rare_batches(steps: int, world_size: int, per_rank: int = 3) -> list:
    """Global batches in which, at step s, one sample of rank (s + 1) % p's shard, at a place that
    moves from step to step, is the only one that uses ``RareNet.rare``."""
    from ..labs import lab05 as lab

    batches = lab.global_batches(steps, per_rank * world_size)
    for step, (x, _) in enumerate(batches):
        x[:, 0] = -x[:, 0].abs() - 0.1
        x[((step + 1) % world_size) * per_rank + step % per_rank, 0] = 1.0 + step
    return batches


# --- on the engines ------------------------------------------------------------------------

class _Watched:
    """A work handle of an async collective, which notes when it is waited on."""

    def __init__(self, work, log):
        self._work, self._log = work, log

    def wait(self, *args, **kwargs):
        self._log["waits"].append(self._log["phase"])
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _dtype_name(index: int) -> str:
    return str(_DTYPES[index]).replace("torch.", "") if 0 <= index < len(_DTYPES) else "other"


def _describe(row) -> str:
    op, numel, dtype = (int(v) for v in row[:3])
    if op == len(_GUARDED):
        return "nothing more (its step was over)"
    return f"{_GUARDED[op]} of {numel} {_dtype_name(dtype)} elements"


def _announce(log, op: int, numel: int, dtype: torch.dtype | None, problem: int = 0) -> None:
    """Tell every rank which call this rank makes next (``problem``: 1 a tensor on another device than
    the gradients, 2 of another dtype); raise Wrong on every rank if any has a problem or they differ."""
    import torch.distributed as dist

    from . import engines

    mine = torch.tensor([op, numel, _DTYPES.index(dtype) if dtype in _DTYPES else -1, problem],
                        dtype=torch.int64, device=log["device"])
    rows = torch.empty(dist.get_world_size() * 4, dtype=torch.int64, device=log["device"])
    log["gather"](rows, mine, group=engines.check_group)
    rows = rows.view(-1, 4).tolist()
    log["count"] += 1
    for rank, row in enumerate(rows):
        where = f"rank {rank}, in its collective number {log['count']} of a step,"
        if row[3] == 1:
            raise Wrong(f"{where} reduces a tensor on another device than the gradients ({log['device']}): "
                         f"allocate buffers with device=param.device. (The check builds your wrapper with torch's "
                         f"default device set to 'meta', to find buffers that would stay on the CPU in a GPU run, "
                         f"where nccl refuses them.)")
        if row[3] == 2:
            raise Wrong(f"{where} reduces a {_dtype_name(row[2])} tensor, but the gradients "
                         f"are {_dtype_name(_DTYPES.index(log['dtype']))}: allocate buffers with dtype=param.dtype "
                         f"(a float32 buffer rounds float64 gradients to 7 digits)")
    if any(row[:3] != rows[0][:3] for row in rows):
        made = "; ".join(f"rank {rank}: {_describe(row)}" for rank, row in enumerate(rows))
        raise Wrong(f"the ranks disagree on collective number {log['count']} of a step ({made}). Collectives pair "
                     f"up by their order on each rank, so every rank must make the same calls, in the same order, "
                     f"on tensors of the same size: never skip a parameter whose gradient is None on this rank "
                     f"(another rank may have one; reduce zeros), and launch buckets in bucket order")


@contextmanager
def _watch(model: nn.Module):
    """``engines.spy`` (counts, the check's group), plus: every all_reduce and broadcast is announced
    to the other ranks first, with its dtype and device checked against ``model``'s parameters; async
    handles note when they are waited on; the elements of each all_reduce are listed in call order."""
    import torch.distributed as dist

    param = next(model.parameters())
    log = {"phase": "", "waits": [], "works": [], "sizes": [], "count": 0, "device": param.device, "dtype": param.dtype,
           "gather": dist.all_gather_into_tensor}

    def guard(name, inner):
        def call(*args, **kwargs):
            tensor = args[0] if args else kwargs.get("tensor")
            if not isinstance(tensor, torch.Tensor):
                return inner(*args, **kwargs)
            problem = 0
            if name == "all_reduce":
                problem = 1 if tensor.device != param.device else 2 if tensor.dtype != param.dtype else 0
                log["sizes"].append(tensor.numel())
            _announce(log, _GUARDED.index(name), tensor.numel(), tensor.dtype, problem)
            work = inner(*args, **kwargs)
            if work is None:
                return None
            log["works"].append(work)
            return _Watched(work, log)
        return call

    with spy() as calls:
        spies = {name: getattr(dist, name) for name in _GUARDED}
        try:
            for name, counted in spies.items():
                setattr(dist, name, guard(name, counted))
            log["calls"] = calls
            yield log
        finally:
            for name, counted in spies.items():
                setattr(dist, name, counted)


def _end_step(log) -> None:
    """Every rank says its step is over: a rank that made fewer calls than another is named."""
    _announce(log, len(_GUARDED), 0, None)


def _wrap(cls, cap):
    return (lambda module: cls(module, bucket_cap_mb=cap)) if cap is not None else cls


def _build(cls, cap, model, log):
    """The learner's wrapper around ``model``, built with torch's default device set to meta."""
    with torch.device("meta"):
        wrapped = _wrap(cls, cap)(model)
    _end_step(log)
    return wrapped


def _model_and_batches(rare: bool, micro_batches: int):
    import torch.distributed as dist

    from ..labs import lab05 as lab

    p = dist.get_world_size()
    make = RareNet if rare else AwkwardNet
    batches = (rare_batches(STEPS * micro_batches, p) if rare else
               lab.global_batches(STEPS * micro_batches, 3 * p))
    model, reference = lab.start_models(make)
    return make, model, reference, batches


def _train_and_compare(cls, cap, micro_batches, exercise_kind, rare=True):
    """Train the learner's wrapper; raise Wrong naming the first problem; return the worst differences."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from .. import replicas
    from ..labs import lab05 as lab
    from . import engines

    rank, p = dist.get_rank(), dist.get_world_size()
    make, model, reference, batches = _model_and_batches(rare, micro_batches)
    with _watch(model) as log:
        wrapped = _build(cls, cap, model, log)
        lab.train_data_parallel(lambda m: wrapped, model, batches, micro_batches=micro_batches)
        _end_step(log)
        across_ranks = replicas.replica_differences(model)
    spread = {name: d for name, d in across_ranks.items() if d > 0}
    if spread:
        cause = ("broadcast every parameter and buffer from rank 0 in __init__ (inside torch.no_grad()), so all "
                 "ranks start equal" if exercise_kind == "naive" else
                 "every rank must end finish_gradient_synchronization() holding the same mean gradients")
        raise Wrong(f"after {STEPS} steps the ranks hold different values of {', '.join(spread)}: {cause}")
    frozen = [name for name, param in model.named_parameters() if not param.requires_grad and param.grad is not None]
    if frozen:
        raise Wrong(f"rank {rank}: the frozen parameters {', '.join(frozen)} (requires_grad=False) hold a gradient "
                     f"after your step: leave them out, as one process and torch's DDP do (their .grad stays None; "
                     f"an optimizer with weight decay would move them)")

    lab.train_single_process(reference, batches, micro_batches=micro_batches)
    to_single = lab.differences(reference, model)
    worst = max(to_single, key=to_single.get)
    if to_single[worst] > TOLERANCE:
        for factor, why in ((p, f"the gradients were summed over the {p} ranks but not divided by {p}: that "
                                f"multiplies the learning rate by the world size (seed 000's own solution does this)"),
                            (1 / p, f"the gradients were divided by {p} twice (or averaged, then divided again)"),
                            (p / 2, f"the gradients were divided by 2, not by the world size {p}")):
            _, scaled = lab.start_models(make)
            lab.train_single_process(scaled, batches, lr=0.1 * factor, micro_batches=micro_batches)
            if max(lab.differences(scaled, model).values()) <= 1e-6:
                raise Wrong(f"rank {rank}: your weights equal one process trained with learning rate "
                             f"{0.1 * factor:g} instead of 0.1: {why}")
        accumulate = (" With gradient accumulation the first backward runs inside no_sync(): its gradients must "
                      "stay local and be reduced, summed with the second's, after the second backward."
                      if micro_batches > 1 else "")
        raise Wrong(f"rank {rank}: after {STEPS} steps `{worst}` differs by {to_single[worst]:.3g} from one "
                     f"process trained on the whole batches: every rank must end with the mean over the ranks of "
                     f"its local gradient (parameters without a gradient take part as zeros).{accumulate}")

    twin, _ = lab.start_models(make)
    lab.train_data_parallel(
        lambda m: DistributedDataParallel(m, process_group=engines.check_group, find_unused_parameters=True),
        twin, batches, micro_batches=micro_batches)
    to_torch = lab.differences(twin, model)
    if max(to_torch.values()) > TOLERANCE:
        raise Wrong(f"rank {rank}: your weights match one process but differ from torch's DDP by "
                     f"{max(to_torch.values()):.3g}: tell the course maintainers, this should not happen")
    return max(to_single.values()), max(to_torch.values())


def _one_step(cls, cap, rare, accumulate):
    """One step on a fresh model, watched: (log, calls before the first layer's gradient was ready,
    of those async, all_reduce calls inside no_sync(), the model, the wrapper)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    rank = dist.get_rank()
    _, model, _, batches = _model_and_batches(rare, 2 if accumulate else 1)
    early, inside = [], 0
    counted = {"all_reduce": 0, "all_reduce async": 0}
    with _watch(model) as log:
        calls = log["calls"]
        # AwkwardNet's first trainable layer gets its gradients last. These probes are registered before
        # the wrapper's hooks, so they run first: what was launched by then overlapped with backward.
        for first in (model.wide.weight, model.wide.bias):
            first.register_post_accumulate_grad_hook(
                lambda _: early.append(tuple(calls.get(k, 0) - counted[k] for k in counted)))
        wrapped = _build(cls, cap, model, log)
        shard = slice(3 * rank, 3 * rank + 3)
        if accumulate:
            x, y = batches[0]
            before = calls.get("all_reduce", 0)
            with wrapped.no_sync():
                F.cross_entropy(wrapped(x[shard]), y[shard]).backward()
            inside = calls.get("all_reduce", 0) - before
            early.clear()
        x, y = batches[1 if accumulate else 0]
        loss = F.cross_entropy(wrapped(x[shard]), y[shard])
        counted = {k: calls.get(k, 0) for k in counted}
        log["sizes"].clear()
        log["phase"] = "backward"
        loss.backward()
        log["phase"] = "finish"
        wrapped.finish_gradient_synchronization()
        log["phase"] = ""
        log["pending"] = sum(not work.is_completed() for work in log["works"])   # seen before any later call
        _end_step(log)
        log["total"] = calls.get("all_reduce", 0) - counted["all_reduce"]
    during, during_async = early[0] if early else (0, 0)
    return log, during, during_async, inside, model


def _calls_job(cls, cap, kind, rare):
    from .. import ddp

    log, during, during_async, _, model = _one_step(cls, cap, rare, accumulate=False)
    total = log["total"]
    trainable = [param for param in model.parameters() if param.requires_grad]
    made = (f"your wrapper made {total} all_reduce call(s) in one step, {during} of them before backward "
            f"reached the first layer")
    if kind == "flat" and total != 1:
        raise Wrong(f"{made}; flatten all gradients into one tensor and reduce it with a single all_reduce")
    if kind == "overlap":
        if during == 0:
            raise Wrong(f"{made}: start each parameter's all_reduce from its hook (self.on_gradient_ready), "
                         f"so it overlaps the rest of backward")
        if during_async < during:
            raise Wrong(f"{made}, {during - during_async} of them blocking: pass async_op=True in the hook, "
                         f"keep the handle, and wait for it in finish_gradient_synchronization()")
        if total != len(trainable):
            raise Wrong(f"{made}; expected one per parameter that requires a gradient ({len(trainable)}), including "
                         f"those backward never reached (launch them in finish_gradient_synchronization())")
    if kind == "bucketed":
        expected = [sum(p.numel() for p in bucket) for bucket in ddp.assign_buckets(trainable, cap)]
        if cap == TINY_CAP_MB and total != len(trainable):
            raise Wrong(f"with bucket_cap_mb={cap:g} every parameter is larger than the cap and gets a bucket of "
                         f"its own: expected {len(trainable)} all_reduce calls, {made}")
        if cap == HUGE_CAP_MB and total != 1:
            raise Wrong(f"with bucket_cap_mb={cap:g} every gradient fits in one bucket: expected 1 all_reduce "
                         f"call, {made}")
        if log["sizes"] != expected:
            order = sorted(log["sizes"]) == sorted(expected)
            raise Wrong(f"with bucket_cap_mb={cap:g} your all_reduce calls, in launch order, held "
                         f"{log['sizes']} elements; expected buckets of {expected}. " +
                         ("The sizes are right but not their order: build the buckets from the last parameter to "
                          "the first (backward produces gradients roughly in that order) and launch them in bucket "
                          "order." if order else
                          f"Add a parameter to the current bucket while the bucket's bytes plus its own "
                          f"(numel * element_size) stay within bucket_cap_mb * 2**20 = {cap * 2 ** 20:g} bytes, "
                          f"walking the parameters from the last to the first."))
        if cap == TINY_CAP_MB and during == 0:
            raise Wrong(f"{made}: build the buckets from the last parameter to the first (backward produces "
                         f"gradients roughly in that order) and launch each bucket as soon as all its gradients "
                         f"are in, in bucket order")
        if during_async < during:
            raise Wrong(f"{made}, {during - during_async} of them blocking: pass async_op=True")
    if log["pending"]:
        raise Wrong(f"{made}; {log['pending']} of them were still running when finish_gradient_synchronization() "
                     f"returned: the optimizer step would read gradients still being reduced. Call wait() on every "
                     f"handle before returning")
    if kind in ("overlap", "bucketed") and "backward" in log["waits"]:
        raise Wrong(f"{made}, but waited for {log['waits'].count('backward')} of them during backward, right "
                     f"after starting them: that blocks backward until the bytes have travelled, so nothing "
                     f"overlaps. Keep the handles and wait for them in finish_gradient_synchronization()")
    return during, total


def _no_sync_job(cls, cap, kind):
    # On AwkwardNet, which every rank uses alike: calls made inside no_sync() then still pair up across
    # ranks, so they can be counted and named.
    _, _, _, inside, _ = _one_step(cls, cap, False, accumulate=True)
    if inside:
        raise Wrong(f"inside `with model.no_sync():` your wrapper made {inside} all_reduce call(s) during "
                     f"backward: when self.synchronizing is False the hook must return at once, so gradients "
                     f"accumulate locally; the next backward outside no_sync() reduces their sums")
    return inside


# --- in the notebook -----------------------------------------------------------------------

def _names_used(cls) -> set:
    """Every name the class's own code (and the notebook functions it calls) refers to."""
    functions = [v for v in vars(cls).values() if isinstance(v, types.FunctionType)] if isinstance(cls, type) else [cls]
    functions += [v for v in globals_used(cls).values() if isinstance(v, types.FunctionType)]
    codes, names = [f.__code__ for f in functions], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


def _refuse_shortcuts(cls, name: str) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from .. import ddp
    from . import expect

    if isinstance(cls, type):
        for finished in (*ddp.VARIANTS.values(), DistributedDataParallel):
            expect(not issubclass(cls, finished),
                   f"{name}: {cls.__name__} subclasses {finished.__module__}.{finished.__name__}, a finished "
                   f"wrapper: the exercise is to write it. Subclass ddp.DataParallel (or nn.Module) and use only its "
                   f"helpers (self.params, self.local_grad, self.on_gradient_ready, self.synchronizing).")
    used = sorted(_names_used(cls) & set(_FINISHED))
    expect(not used, f"{name}: your class uses {', '.join(used)}, the course's or torch's finished wrapper: the "
                     f"exercise is to write it. torch.distributed's collectives, torch.cat and ddp.DataParallel's "
                     f"helpers are there to use.")


def _check(workers, cls, name: str, kind: str, number: str, caps=(None,)) -> None:
    try:
        with exercise(name):
            _refuse_shortcuts(cls, name)
            prepare(workers, cls, name)
            worst = (0.0, 0.0)
            rare = kind != "overlap"   # per-parameter launches in hook order need the same graph on every rank
            for cap in caps:
                setting = f" with bucket_cap_mb={cap:g}" if cap is not None else ""
                case = f"{STEPS} steps of {'RareNet' if rare else 'AwkwardNet'} on {workers.n} ranks{setting}"
                if kind != "naive":   # first: how it communicates explains most wrong weights
                    run_case(workers, name, _calls_job, cls, (cap, kind, rare), f"counting all_reduce calls{setting}")
                results = run_case(workers, name, _train_and_compare, cls, (cap, 1, kind, rare), case)
                worst = max(worst, max(results))
            if kind in ("overlap", "bucketed"):
                cap = TINY_CAP_MB if kind == "bucketed" else None   # buckets that launch during backward
                run_case(workers, name, _no_sync_job, cls, (cap, kind), "one backward inside no_sync()")
                run_case(workers, name, _train_and_compare, cls, (cap, 2, kind, rare),
                          "gradient accumulation: two backward passes per step, the first inside no_sync()")
    except ExerciseError as error:
        raise type(error)(f"{error}\n  A step-by-step hint: lab05.hint({number!r})") from error.__cause__
    print(f"  on {workers.n} ranks, largest difference from one process: {worst[0]:.1e}, from torch's DDP: "
          f"{worst[1]:.1e} (float64)")


def check_naive(workers, MyNaiveDDP) -> None:
    """Exercise 5.1: broadcast at start, one all_reduce per gradient after backward, divided by p."""
    _check(workers, MyNaiveDDP, "Exercise 5.1 (naive DDP)", "naive", "5.1")


def check_flat(workers, MyFlatDDP) -> None:
    """Exercise 5.2: one all_reduce over all gradients flattened."""
    _check(workers, MyFlatDDP, "Exercise 5.2 (flat DDP)", "flat", "5.2")


def check_overlap(workers, MyOverlapDDP) -> None:
    """Exercise 5.3: an async all_reduce per gradient, started from its hook during backward."""
    _check(workers, MyOverlapDDP, "Exercise 5.3 (overlapping DDP)", "overlap", "5.3")


def check_bucketed(workers, MyBucketedDDP) -> None:
    """Exercise 5.4: buckets of bucket_cap_mb, last parameter first, each reduced when full; no_sync."""
    _check(workers, MyBucketedDDP, "Exercise 5.4 (bucketed DDP)", "bucketed", "5.4",
           caps=(TINY_CAP_MB, MIDDLE_CAP_MB, HUGE_CAP_MB))

"""Checks for labs/05_ddp_from_scratch.ipynb: the learner's four DDP wrappers.

Each check sends the learner's class to the engines and, on every rank at once, trains it on
``utils.equivalence.AwkwardNet`` (frozen, tied, unused parameters, a buffer; every rank starting
from other weights) for a few steps. It then requires that the ranks agree, that the weights equal
one process trained on the whole batches and torch's DDP trained on the same shards, and that
the wrapper communicates the way its exercise asks (one call, during backward, per bucket).
Wrong answers are diagnosed where a typical mistake explains them: a sum without the division,
a missing broadcast, buckets that never launch during backward.
"""
from __future__ import annotations

from . import exercise
from .engines import _Wrong, _prepare, _run_case, _spy

TOLERANCE = 1e-9      # float64: a correct wrapper differs from one process by rounding only
STEPS = 3
TINY_CAP_MB, MIDDLE_CAP_MB, HUGE_CAP_MB = 1e-6, 0.002, 1000.0


# --- on the engines ------------------------------------------------------------------------

def _wrap(cls, cap):
    return (lambda module: cls(module, bucket_cap_mb=cap)) if cap is not None else cls


def _train_and_compare(cls, cap, micro_batches, exercise_kind):
    """Train the learner's wrapper; raise _Wrong naming the first problem; return the worst differences."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from .. import equivalence, replicas
    from . import engines

    rank, p = dist.get_rank(), dist.get_world_size()
    batches = equivalence.global_batches(STEPS * micro_batches, 3 * p)
    model, reference = equivalence.start_models()
    with _spy():
        equivalence.train_data_parallel(_wrap(cls, cap), model, batches, micro_batches=micro_batches)
        across_ranks = replicas.replica_differences(model)
    spread = {name: d for name, d in across_ranks.items() if d > 0}
    if spread:
        cause = ("broadcast every parameter and buffer from rank 0 in __init__ (inside torch.no_grad()), so all "
                 "ranks start equal" if exercise_kind == "naive" else
                 "every rank must end finish_gradient_synchronization() holding the same mean gradients")
        raise _Wrong(f"after {STEPS} steps the ranks hold different values of {', '.join(spread)}: {cause}")

    equivalence.train_single_process(reference, batches, micro_batches=micro_batches)
    to_single = equivalence.differences(reference, model)
    worst = max(to_single, key=to_single.get)
    if to_single[worst] > TOLERANCE:
        for factor, why in ((p, f"the gradients were summed over the {p} ranks but not divided by {p}: that "
                                f"multiplies the learning rate by the world size (seed 000's own solution does this)"),
                            (1 / p, f"the gradients were divided by {p} twice (or averaged, then divided again)")):
            _, scaled = equivalence.start_models()
            equivalence.train_single_process(scaled, batches, lr=0.1 * factor, micro_batches=micro_batches)
            if max(equivalence.differences(scaled, model).values()) <= 1e-6:
                raise _Wrong(f"rank {rank}: your weights equal one process trained with learning rate "
                             f"{0.1 * factor:g} instead of 0.1: {why}")
        accumulate = (" With gradient accumulation the first backward runs inside no_sync(): its gradients must "
                      "stay local and be reduced, summed with the second's, after the second backward."
                      if micro_batches > 1 else "")
        raise _Wrong(f"rank {rank}: after {STEPS} steps `{worst}` differs by {to_single[worst]:.3g} from one "
                     f"process trained on the whole batches: every rank must end with the mean over the ranks of "
                     f"its local gradient (parameters without a gradient take part as zeros).{accumulate}")

    twin, _ = equivalence.start_models()
    equivalence.train_data_parallel(
        lambda m: DistributedDataParallel(m, process_group=engines._check_group, find_unused_parameters=True),
        twin, batches, micro_batches=micro_batches)
    to_torch = equivalence.differences(twin, model)
    if max(to_torch.values()) > TOLERANCE:
        raise _Wrong(f"rank {rank}: your weights match one process but differ from torch's DDP by "
                     f"{max(to_torch.values()):.3g}: tell the course maintainers, this should not happen")
    return max(to_single.values()), max(to_torch.values())


def _count_calls(cls, cap):
    """All-reduce calls in one step: (before the first layer's gradient was ready, of those
    asynchronous, in the whole step, parameters to reduce)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from .. import equivalence

    p, rank = dist.get_world_size(), dist.get_rank()
    x, y = equivalence.global_batches(1, 3 * p)[0]
    model, _ = equivalence.start_models()
    with _spy() as calls:
        counted = {"all_reduce": 0, "all_reduce async": 0}
        early = []
        # AwkwardNet's first trainable layer gets its gradients last. These probes are registered before
        # the wrapper's hooks, so they run first: what was launched by then overlapped with backward.
        for first in (model.wide.weight, model.wide.bias):
            first.register_post_accumulate_grad_hook(
                lambda _: early.append(tuple(calls.get(k, 0) - counted[k] for k in counted)))
        wrapped = _wrap(cls, cap)(model)
        loss = F.cross_entropy(wrapped(x[3 * rank:3 * rank + 3]), y[3 * rank:3 * rank + 3])
        counted = {k: calls.get(k, 0) for k in counted}
        loss.backward()
        wrapped.finish_gradient_synchronization()
        total = calls.get("all_reduce", 0) - counted["all_reduce"]
    during, during_async = early[0] if early else (0, 0)
    trainable = sum(1 for param in model.parameters() if param.requires_grad)
    return during, during_async, total, trainable


def _calls_job(cls, cap, kind):
    during, during_async, total, trainable = _count_calls(cls, cap)
    made = (f"your wrapper made {total} all_reduce call(s) in one step, {during} of them before backward "
            f"reached the first layer")
    if kind == "flat" and total != 1:
        raise _Wrong(f"{made}; flatten all gradients into one tensor and reduce it with a single all_reduce")
    if kind == "overlap":
        if during == 0:
            raise _Wrong(f"{made}: start each parameter's all_reduce from its hook (self.on_gradient_ready), "
                         f"so it overlaps the rest of backward")
        if during_async < during:
            raise _Wrong(f"{made}, {during - during_async} of them blocking: pass async_op=True in the hook, "
                         f"keep the handle, and wait for it in finish_gradient_synchronization()")
        if total != trainable:
            raise _Wrong(f"{made}; expected one per parameter that requires a gradient ({trainable}), including "
                         f"those backward never reached (launch them in finish_gradient_synchronization())")
    if kind == "bucketed":
        if cap == TINY_CAP_MB and total != trainable:
            raise _Wrong(f"with bucket_cap_mb={cap:g} every parameter is larger than the cap and gets a bucket of "
                         f"its own: expected {trainable} all_reduce calls, {made}")
        if cap == HUGE_CAP_MB and total != 1:
            raise _Wrong(f"with bucket_cap_mb={cap:g} every gradient fits in one bucket: expected 1 all_reduce "
                         f"call, {made}")
        if cap == MIDDLE_CAP_MB and not 1 < total < trainable:
            raise _Wrong(f"with bucket_cap_mb={cap:g} MiB the gradients fill several buckets of several "
                         f"parameters each: {made}; add a parameter to the current bucket while its bytes "
                         f"(numel * element_size) stay within bucket_cap_mb * 2**20")
        if cap == TINY_CAP_MB and during == 0:
            raise _Wrong(f"{made}: build the buckets from the last parameter to the first (backward produces "
                         f"gradients roughly in that order) and launch each bucket as soon as all its gradients "
                         f"are in, in bucket order")
        if during_async < during:
            raise _Wrong(f"{made}, {during - during_async} of them blocking: pass async_op=True")
    return during, total


# --- in the notebook -----------------------------------------------------------------------

def _check(workers, cls, name: str, kind: str, caps=(None,)) -> None:
    with exercise(name):
        _prepare(workers, cls, name)
        worst = (0.0, 0.0)
        for cap in caps:
            setting = f" with bucket_cap_mb={cap:g}" if cap is not None else ""
            case = f"{STEPS} steps of AwkwardNet on {workers.n} ranks{setting}"
            results = _run_case(workers, name, _train_and_compare, cls, (cap, 1, kind), case)
            worst = max(worst, max(results))
            if kind != "naive":
                _run_case(workers, name, _calls_job, cls, (cap, kind), f"counting all_reduce calls{setting}")
        if kind == "bucketed":
            _run_case(workers, name, _train_and_compare, cls, (MIDDLE_CAP_MB, 2, kind),
                      f"gradient accumulation: two backward passes per step, the first inside no_sync()")
    print(f"  on {workers.n} ranks, largest difference from one process: {worst[0]:.1e}, from torch's DDP: "
          f"{worst[1]:.1e} (float64)")


def check_naive(workers, MyNaiveDDP) -> None:
    """Exercise 5.1: broadcast at start, one all_reduce per gradient after backward, divided by p."""
    _check(workers, MyNaiveDDP, "Exercise 5.1 (naive DDP)", "naive")


def check_flat(workers, MyFlatDDP) -> None:
    """Exercise 5.2: one all_reduce over all gradients flattened."""
    _check(workers, MyFlatDDP, "Exercise 5.2 (flat DDP)", "flat")


def check_overlap(workers, MyOverlapDDP) -> None:
    """Exercise 5.3: an async all_reduce per gradient, started from its hook during backward."""
    _check(workers, MyOverlapDDP, "Exercise 5.3 (overlapping DDP)", "overlap")


def check_bucketed(workers, MyBucketedDDP) -> None:
    """Exercise 5.4: buckets of bucket_cap_mb, last parameter first, each reduced when full; no_sync."""
    _check(workers, MyBucketedDDP, "Exercise 5.4 (bucketed DDP)", "bucketed",
           caps=(TINY_CAP_MB, MIDDLE_CAP_MB, HUGE_CAP_MB))

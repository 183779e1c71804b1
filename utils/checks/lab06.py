"""Checks for labs/06_realistic_model.ipynb.

``check_job(script)`` is ``utils.checks.job.check.JobCheck`` for this lab's script (read its docstring):
it runs the learner's torchrun script itself on a tiny problem, as two simulated GPU nodes (2 + 1
processes, so ``LOCAL_RANK`` differs from ``RANK`` on the second), compares the weights it saved with one
process on the same global batches, then makes one rank fail in a training step and gives it a global
batch the world size does not divide. The optimizer is fixed: ``SGD(lr, momentum=0.9)``, as the
single-process script has it. Each typical mistake gets its own message.

``check_buckets(ddp_bucket_bytes)`` compares the learner's buckets with those a real
``DistributedDataParallel`` all-reduces for parameters of the same sizes (``recorded_buckets``: a comm
hook on a one-rank gloo group of its own), on fixed cases that tell the typical misreadings of torch's
rule apart (MB for MiB in any of the three limits, a default cap for an explicit one, the first bucket's
limit, ``>`` for ``>=``, a gradient larger than the limit given a bucket of its own or cut, the order of the
parameters and of the buckets, DDP's assignment at construction, a cap rounded to whole MiB), each with its
own message,
then on random sizes (one case with the default cap, one with a cap given), which answers written in for
the fixed cases do not pass. A function that asks the check's own code, builds a DDP, changes the
check's module or the list it is given fails with its own message.
"""
from __future__ import annotations

import functools
import math
import random
import sys

import torch

from . import Incorrect, exercise, expect, hint_for
from utils.checks.job import LOG_LINE, TIME_LIMIT_S, WEIGHT_TOLERANCE, JobCheck  # noqa: F401 (the lab's names)

# The tiny problem the check trains: sizes that do not divide evenly (padding, a short last batch), and
# dropout on, so that evaluating in train mode changes the accuracy.
JOB = {"epochs": 2, "global_batch": 12, "lr": 0.05, "train_size": 100, "test_size": 60, "dropout": 0.5,
       "seed": 3}
NODES = [2, 1]              # processes on each simulated node: world size 3, LOCAL_RANK != RANK on the second

HINTS = {
    "6.1": """Step by step (the lab's section 1 and lab 04's sections 1, 2 and 6):
1. setup(): torchrun gives every process RANK (its index among all processes of all machines),
   WORLD_SIZE and LOCAL_RANK (its index on its own machine) in os.environ (and MASTER_ADDR/MASTER_PORT,
   which init_process_group reads itself). With a GPU per local process:
   torch.cuda.set_device(local_rank), backend "nccl", device cuda:local_rank; otherwise "gloo" and
   the CPU. Call dist.init_process_group(backend, timeout=...) without a rank or world size: it reads
   them from the environment. Return dist.get_rank(), dist.get_world_size() and the device.
2. The per-rank batch is the global batch divided by the world size: refuse one that does not divide
   (raise SystemExit with a message) before training.
3. DistributedSampler(train_set, shuffle=True, seed=args.seed) for the training loader, and
   sampler.set_epoch(epoch) at the start of every epoch; the loader itself does not shuffle.
4. torch.manual_seed(args.seed) before building the model, as the single-process script does; move it
   to the device, then DistributedDataParallel(model, device_ids=[device] on a GPU, None on the CPU).
5. Every step: the batch to the device, forward through the DDP model, backward, step. DDP averages the
   gradients itself. Keep the loss sum and sample count in a tensor on the device (no .item() per step).
6. The train loss of an epoch: one dist.all_reduce of the sum and the count, then divide. Evaluate in
   eval mode (model.eval(), then model.train() again), rank 0 alone is fine.
7. Only rank 0 prints the epoch line and saves ddp_model.module.state_dict() to args.out/model.pt.
8. try: ... finally: dist.destroy_process_group(), so a failing step still tears the group down.""",
    "6.2": """Step by step (the text before the exercise; torch's rule is _BucketCapacityConfig.create in
torch/nn/parallel/distributed.py):
1. The limits. bucket_cap_mb None is DDP's default: a first bucket of 1 MiB
   (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), then 25 MiB for every bucket after it. A cap given
   explicitly is the limit of every bucket, the first one's too. A MiB is 2**20 bytes, and a cap may be
   a fraction of a MiB: turn it into bytes before rounding.
2. The order. Backward produces the last parameter's gradient first, so walk param_bytes from its end.
3. Add each size to the open bucket, whatever its size (a gradient is never split, nor set apart for
   being large); once the bucket holds at least its limit (the first bucket's limit while no bucket is
   closed yet, the later buckets' after), note its size and open a new bucket.
4. At the end, a bucket that is not empty is the last one. Return the sizes in the order you noted
   them: that is the order DDP all-reduces them.""",
}


hint = hint_for(HINTS)  # lab06.hint("6.1") prints that exercise's step-by-step hint


# --- Exercise 6.1: the job, checked by utils.checks.job.check ---------------------------------------

# Divisible by 2 and 4 (the lab's world sizes) but not by 3: a test written for a world size of 2 or 4, or for
# LOCAL_WORLD_SIZE (2 on the first node), lets this batch through.
REFUSED_BATCH = 20
JOB_CHECK = JobCheck("6.1", JOB, saved="model.pt", nodes=NODES, refused_batch=REFUSED_BATCH)
check_job, check_training = JOB_CHECK.check, JOB_CHECK.check_training
check_one_rank_failing, check_refusal = JOB_CHECK.check_one_rank_failing, JOB_CHECK.check_refusal
run_job, reference_run, job_arguments = JOB_CHECK.run_job, JOB_CHECK.reference_run, JOB_CHECK.job_arguments
_diagnose_run = JOB_CHECK._diagnose_run


# --- Exercise 6.2: DDP's buckets ------------------------------------------------------------------
#
# The rule is torch's, read in torch/nn/parallel/distributed.py (torch 2.14): _BucketCapacityConfig.create
# gives the first bucket dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) only when bucket_cap_mb is None (the
# default), and the cap itself when bucket_cap_mb is given; _MB_TO_BYTES is 1024 * 1024. The assignment is
# C++ (dist._compute_bucket_assignment_by_size, called directly): each tensor is added to the open bucket of
# its dtype and device, which closes once it holds at least its limit (a tensor above the limit joins the
# open bucket), and the limits go first bucket's, then the cap's, per dtype and device. After the first
# iteration the Reducer rebuilds the buckets in the order the gradients arrived (without that rebuild, as
# with find_unused_parameters=True, they stay filled in parameters() order and listed reversed). The sizes
# here are all float32 on one device, so the separation by dtype and device never shows. The check does
# not trust that reading: the answers it compares with are the buckets a real DistributedDataParallel
# makes, recorded by a comm hook.

MiB = 2 ** 20


def _private_group():
    """A gloo process group of one rank, built without init_process_group, so that recording DDP's
    buckets neither needs nor disturbs a default process group in the learner's kernel."""
    import torch.distributed as dist

    global _GROUP
    _OWN_CALLS[0] += 1
    if _GROUP is None:
        store = dist.HashStore()
        group = dist.ProcessGroup(store, 0, 1)
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                                dist.ProcessGroupGloo(store, 0, 1))
        _GROUP = group
    return _GROUP


_GROUP = None
_THIS_MODULE = sys.modules[__name__]


class _SizedParameters(torch.nn.Module):
    """float32 parameters of the given sizes in bytes, used by forward in the order they are defined
    (as the layers of a network are), so backward produces their gradients last to first."""

    def __init__(self, param_bytes):
        _OWN_CALLS[0] += 1
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(n // 4)) for n in param_bytes)

    def forward(self, x):
        for weight in self.weights:
            x = x + weight.sum()
        return x


def recorded_buckets(param_bytes, bucket_cap_mb=None) -> list[int]:
    """The buckets a real ``DistributedDataParallel`` makes for float32 parameters of these sizes (bytes,
    in ``model.parameters()`` order), in bytes, in the order it all-reduces them.

    A comm hook records every bucket's buffer in the second training step: in the first, DDP puts all
    gradients in one bucket and notes the order in which they arrive; it then rebuilds its buckets in
    that order. ``bucket_cap_mb`` is passed to DDP as it is (None: DDP's default).
    """
    return list(_recorded(tuple(int(n) for n in param_bytes), bucket_cap_mb))


@functools.lru_cache(maxsize=128)
def _recorded(param_bytes: tuple, bucket_cap_mb) -> tuple:
    from torch.nn.parallel import DistributedDataParallel

    _OWN_CALLS[0] += 1        # also counts a call that goes past the cache (_recorded.__wrapped__)
    if any(n <= 0 or n % 4 for n in param_bytes):
        raise ValueError(f"sizes must be positive multiples of 4 bytes (float32): {param_bytes}")
    torch.manual_seed(0)
    ddp = DistributedDataParallel(_SizedParameters(param_bytes), process_group=_private_group(),
                                  bucket_cap_mb=bucket_cap_mb)
    record = []

    def hook(state, bucket):
        buffer = bucket.buffer()
        record.append(buffer.numel() * buffer.element_size())
        done = torch.futures.Future()
        done.set_result(buffer)
        return done

    ddp.register_comm_hook(None, hook)
    for _ in range(2):
        record.clear()
        ddp(torch.zeros(())).backward()
    return tuple(record)


def _rule(param_bytes, bucket_cap_mb=None, *, unit=MiB, first_unit=None, later_unit=None, cap_unit=None,
          first="cap", order="backward", close="at least", big="joins", whole_mib=None, listed="in order",
          small_buckets=1, later_default=25):
    """Buckets by the rule torch applies, or by a typical misreading of it (the keywords), used only to
    name a wrong answer's mistake; what is right is what ``recorded_buckets`` records. ``unit``: the bytes
    of a MiB, for every limit, unless ``first_unit`` (the default's first bucket), ``later_unit`` (the
    default's later buckets) or ``cap_unit`` (a cap given) say otherwise. ``big``: "joins" (torch: a gradient
    at or above the limit joins the open bucket), "own bucket" (closes the open one and gets one of its
    own) or "split" (cut at the limit, the rest carried over)."""
    _OWN_CALLS[0] += 1
    if bucket_cap_mb is None:
        limits = ((25 if first == "25 MiB" else 1) * (first_unit or unit), later_default * (later_unit or unit))
    else:
        cap = int(({"down": math.floor, "up": math.ceil}[whole_mib](bucket_cap_mb) if whole_mib else bucket_cap_mb)
                  * (cap_unit or unit))
        limits = ({"cap": cap, "1 MiB": unit, "min": min(unit, cap), "25 MiB": cap}[first], cap)
    buckets, size = [], 0
    for nbytes in (reversed(param_bytes) if order == "backward" else param_bytes):
        limit = limits[0 if len(buckets) < small_buckets else 1]
        if big == "own bucket" and nbytes >= limit:
            buckets += [size, nbytes] if size else [nbytes]
            size = 0
            continue
        if close == "before overflow" and size and size + nbytes > limit:
            buckets.append(size)
            size = 0
        size += nbytes
        while big == "split" and size >= limit:
            buckets.append(limit)
            size -= limit
            limit = limits[0 if len(buckets) < small_buckets else 1]
        if size >= limit if close == "at least" else size > limit if close == "above" else False:
            buckets.append(size)
            size = 0
    buckets += [size] if size else []
    return buckets[::-1] if listed == "reversed" else buckets


_OWN_CALLS = [0]


def _own_calls() -> tuple:
    """How often the check's own answers have been asked for: DDP's recording (through its cache or past it,
    or built from its parts), and its reading of the rule."""
    info = _recorded.cache_info()
    return info.hits + info.misses, _OWN_CALLS[0]


# Each typical mistake: how it reads the rule, and what is wrong with it, in words.
BUCKET_MISTAKES = [
    ("MB for MiB", dict(unit=10 ** 6),
     "your limits count MB (10**6 bytes); DDP's bucket_cap_mb and its 1 MiB first bucket count MiB, "
     "2**20 = 1,048,576 bytes (torch/nn/parallel/distributed.py, _MB_TO_BYTES)."),
    ("1 MiB first bucket whatever the cap", dict(first="1 MiB"),
     "your first bucket's limit is 1 MiB although bucket_cap_mb was given. DDP uses its small first bucket "
     "(torch.distributed._DEFAULT_FIRST_BUCKET_BYTES) only when bucket_cap_mb is left at its default; "
     "an explicit cap is the limit of every bucket, the first included."),
    ("min(1 MiB, cap) first bucket", dict(first="min"),
     "your first bucket's limit is the smaller of 1 MiB and the cap. With bucket_cap_mb given, DDP's first "
     "bucket has the cap as its limit even when the cap is above 1 MiB: the 1 MiB first bucket belongs to "
     "the default only."),
    ("default taken as 25 MiB for every bucket", dict(first="25 MiB"),
     "with bucket_cap_mb left at its default (None), your first bucket's limit is 25 MiB. DDP's default "
     "gives the first bucket a limit of its own, 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), "
     "so the last layers' gradients start travelling early; 25 MiB is the limit of the buckets after it."),
    ("closed only above the limit", dict(close="above"),
     "a bucket that holds exactly its limit stays open in yours. DDP closes a bucket as soon as it holds "
     "at least its limit."),
    ("closed before it would overflow", dict(close="before overflow"),
     "you close a bucket before a gradient would take it over its limit. DDP puts that gradient in too and "
     "closes the bucket after it: a bucket is closed once it holds at least its limit."),
    ("filled in model.parameters() order", dict(order="forward"),
     "you filled the buckets from the first parameter of model.parameters(). DDP fills them in the order "
     "backward produces the gradients, which for these models is the reverse: the last parameters' "
     "gradients go into the first bucket."),
    ("listed last bucket first", dict(listed="reversed"),
     "your buckets are DDP's, listed last to first: return them in the order DDP all-reduces them, the "
     "bucket of the last parameters first."),
    ("cap rounded to whole MiB", dict(whole_mib="down"),
     "your limit looks rounded to a whole number of MiB: bucket_cap_mb may be a fraction (0.5 MiB is "
     "524,288 bytes), and DDP converts it to bytes before rounding."),
    ("cap rounded up to whole MiB", dict(whole_mib="up"),
     "your limit looks rounded up to a whole number of MiB: bucket_cap_mb may be a fraction (0.5 MiB is "
     "524,288 bytes), and DDP converts it to bytes before rounding (down, with int())."),
    ("default: 1 MiB for every bucket", dict(later_default=1),
     "with bucket_cap_mb left at its default, your later buckets are closed at 1 MiB too. Only the first "
     "bucket has the small limit (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES); every bucket after it has "
     "the default cap, 25 MiB (_DEFAULT_BUCKET_CAP_MB)."),
    ("the default's first bucket counted in MB", dict(first_unit=10 ** 6),
     "your first bucket's limit with the default cap is 1 MB, 10**6 bytes. DDP's small first bucket, "
     "torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, is 1 MiB: 2**20 = 1,048,576 bytes."),
    ("the default's later buckets counted in MB", dict(later_unit=10 ** 6),
     "your later buckets' limit with the default cap is 25 MB, 25 * 10**6 bytes. DDP's default cap is 25 MiB "
     "(_DEFAULT_BUCKET_CAP_MB * _MB_TO_BYTES in torch/nn/parallel/distributed.py): 26,214,400 bytes."),
    ("a cap given counted in MB", dict(cap_unit=10 ** 6),
     "your limit for a bucket_cap_mb given counts MB (10**6 bytes). DDP turns bucket_cap_mb into bytes with "
     "_MB_TO_BYTES, 1024 * 1024: bucket_cap_mb=1 is 1,048,576 bytes."),
    ("a gradient larger than the limit given a bucket of its own", dict(big="own bucket"),
     "a gradient at least as large as the limit got a bucket of its own, the open bucket closed before it. "
     "DDP has no such case: it adds that gradient to the open bucket like any other, and the bucket, now "
     "at or above its limit, closes (dist._compute_bucket_assignment_by_size). Only when the open bucket is "
     "empty is the large gradient alone."),
    ("gradients cut at the limit", dict(big="split"),
     "your buckets are cut at exactly their limit, a gradient split between two buckets. DDP never splits "
     "a gradient: each whole gradient goes into one bucket, so a bucket is closed holding its limit or more."),
    ("DDP's first assignment, kept", dict(order="forward", listed="reversed"),
     "your buckets are DDP's assignment at construction (all it keeps with find_unused_parameters=True): "
     "filled from model.parameters()' first parameter on, then listed last to first. With the "
     "default settings DDP rebuilds its buckets after the first iteration in the order the gradients "
     "arrived (Reducer's rebuild_buckets): the last parameters' gradients fill the first, small bucket."),
    ("the small limit for the second bucket too", dict(small_buckets=2),
     "your second bucket was also closed at the first bucket's limit of 1 MiB. Only the first bucket DDP "
     "fills has the small limit; from the second on, the limit is the cap, 25 MiB by default."),
]

# Sizes in bytes, in model.parameters() order (float32, so multiples of 4), and bucket_cap_mb
# (None: DDP's default). Each case tells some mistakes apart (tests/test_checks_lab06.py shows that
# every mistake gets its own message).
BUCKET_CASES = [
    # Backward order 990000, 20000, 20000, 40000, ...: MiB closes the first bucket at 1,070,000, MB at
    # 1,010,000, closing before an overflow at 1,030,000; a 25 MiB first limit makes one bucket.
    ("default cap, the last gradients just under 1 MiB",
     [4 * 150_000, 4 * 120_000, 40_000, 20_000, 20_000, 990_000], None),
    # The last gradient is exactly 1 MiB: at least its limit, so it is a bucket of its own.
    ("default cap, the last gradient exactly 1 MiB", [4 * 100, 4 * 30_000, 4 * 2_000, MiB], None),
    # 25 given explicitly: no small first bucket, 7.6 MB fits one bucket of 25 MiB.
    ("bucket_cap_mb=25 given", [4 * 300_000, 4 * 1_000_000, 4 * 200_000, 4 * 400_000], 25),
    # A cap below 1 MiB tells "1 MiB whatever the cap" from min(1 MiB, cap), and a fraction of a MiB.
    ("bucket_cap_mb=0.5, small gradients", [4 * 40_000, 4 * 60_000, 4 * 50_000, 4 * 70_000, 4 * 30_000], 0.5),
    # A gradient larger than the cap joins the open bucket (backward 800000 + 1 MiB + 1.2 MB closes a bucket,
    # then 200000 + 3 MiB closes the next): no bucket of its own (200000, then 3 MiB alone), never cut at 2 MiB.
    ("bucket_cap_mb=2, a gradient larger than the cap after a small one",
     [80_000, 3 * MiB, 200_000, 1_200_000, MiB, 800_000], 2),
    # The same with the default's first bucket: 100000 + 2 MiB is the first bucket, twice its 1 MiB limit.
    ("default cap, a 2 MiB gradient after a small one", [300_000, 2 * MiB, 100_000], None),
    # A cap of 1 MiB: 520000 + 500000 = 1,020,000 bytes is 1 MB or more but under 1 MiB, so the bucket stays
    # open for the 40000 after; counted in MB it would close there.
    ("bucket_cap_mb=1, a bucket between 1 MB and 1 MiB", [300_000, 40_000, 500_000, 520_000], 1),
    # Default cap, 3 MB after a first bucket of exactly 1 MiB: one bucket of 25 MiB's limit holds it all; 1 MiB
    # limits after the first would close it at 1.2 MB.
    ("default cap, 3 MB after the first bucket", [600_000] * 5 + [MiB], None),
    # Default cap, 26,000,000 bytes after a first bucket of exactly 1 MiB: under 25 MiB (26,214,400), so one
    # bucket; a later limit of 25 MB (25,000,000) would close it at 25,600,000, before the last 400000.
    ("default cap, 26 MB after the first bucket", [400_000] + [6_400_000] * 4 + [MiB], None),
]
RANDOM_CAPS = [0.25, 0.5, 0.75, 1, 1.5, 2]   # multiples of 1/8 MiB: whole bytes


def _random_case(rng: random.Random, default: bool):
    """Random sizes, with the default cap (gradients up to 8 MB, so later buckets reach 25 MiB) or a cap drawn."""
    n = rng.randint(4, 9)
    largest = 2_000_000 if default else 400_000
    sizes = [4 * rng.randint(1_000, largest) for _ in range(n)]
    return "random sizes", sizes, None if default else rng.choice(RANDOM_CAPS)


def _answer(ddp_bucket_bytes, sizes, cap) -> list[int]:
    """The learner's buckets for one case, checked for their form."""
    from torch.nn.parallel import DistributedDataParallel

    before, own_code = _own_calls(), dict(vars(_THIS_MODULE))
    given, built, ddp_init = list(sizes), [], DistributedDataParallel.__init__

    def counted_init(self, *args, **kwargs):   # a DDP built to read its buckets answers nothing of the rule
        built.append(1)
        return ddp_init(self, *args, **kwargs)

    DistributedDataParallel.__init__ = counted_init
    try:
        got = ddp_bucket_bytes(given, bucket_cap_mb=cap)
    except TypeError as error:
        if cap is None:
            raise Incorrect(f"6.2: called with bucket_cap_mb=None, your function raised TypeError: {error}. "
                            f"None means the cap was left at DDP's default (as in DistributedDataParallel's "
                            f"own signature), whose buckets differ from any cap given explicitly.") from error
        raise
    finally:
        DistributedDataParallel.__init__ = ddp_init
        changed = sorted(name for name, value in vars(_THIS_MODULE).items() if own_code.get(name) is not value)
        vars(_THIS_MODULE).update(own_code)                  # the check's code as it was, whatever happened
    expect(_own_calls() == before, "6.2: your function asked the check's own code for the answer (its "
                                   "recording of DDP's buckets, or its reading of the rule): compute the "
                                   "buckets from the sizes and the rule in the text.")
    expect(not changed, f"6.2: your function changed the check's own code ({', '.join(changed)}): compute the "
                        f"buckets from the sizes and the rule in the text.")
    expect(not built, "6.2: your function built a DistributedDataParallel to read its buckets: predict them "
                      "from the sizes and the rule in the text, as you would for a model too large to try.")
    expect(given == list(sizes), f"6.2: your function changed the list of sizes it was given (to {given}); the "
                                 f"caller's list is the model's parameters, in order, and the lab passes the same "
                                 f"list again: read it from its end (reversed(param_bytes)) without changing it.")
    expect(isinstance(got, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in got),
           f"6.2: return a list of whole numbers of bytes, one per bucket; got {got!r}")
    return list(got)


def _describe(label, sizes, cap) -> str:
    return f"{label}: sizes {sizes} bytes in model.parameters() order, bucket_cap_mb={cap}"


def _judge(cases, answers, otherwise: str = "") -> None:
    """Fail with the message of the first wrong answer, naming its mistake where one reading explains it
    (``otherwise`` where none does)."""
    wants = [recorded_buckets(sizes, cap) for _, sizes, cap in cases]
    wrong = [i for i, (got, want) in enumerate(zip(answers, wants)) if got != want]
    if not wrong:
        return
    first = wrong[0]
    (label, sizes, cap), got, want = cases[first], answers[first], wants[first]
    case = f"6.2 ({_describe(label, sizes, cap)}): you made buckets of {got} bytes, DDP makes {want}"
    expect(sum(got) == sum(sizes), f"{case}. Your buckets hold {sum(got)} bytes in all, the gradients "
                                   f"{sum(sizes)}: every gradient goes into exactly one bucket.")
    everywhere = [message for _, kwargs, message in BUCKET_MISTAKES
                  if all(_rule(s, c, **kwargs) == a for (_, s, c), a in zip(cases, answers))]
    here = [message for _, kwargs, message in BUCKET_MISTAKES if _rule(sizes, cap, **kwargs) == got]
    if everywhere or len(here) == 1:
        expect(False, f"{case}: {(everywhere or here)[0]}")
    expect(False, f"{case}.{otherwise}")


def check_buckets(ddp_bucket_bytes) -> None:
    """Exercise 6.2: bucket sizes against the buckets of a real DistributedDataParallel (a comm hook
    records them), on fixed cases that tell the typical mistakes apart, then on two random ones."""
    with exercise("6.2"):
        answers = [_answer(ddp_bucket_bytes, sizes, cap) for _, sizes, cap in BUCKET_CASES]
        _judge(BUCKET_CASES, answers)
        rng = random.Random()
        randoms = [_random_case(rng, default) for default in (True, False)]
        for label, sizes, cap in randoms:
            _judge([(label, sizes, cap)], [_answer(ddp_bucket_bytes, sizes, cap)],
                   " Your answers were DDP's on every fixed case but not on these random sizes: answers written "
                   "in for the fixed cases, rather than computed from the sizes and the cap, fail here.")
        print(f"  checked against the buckets of a real DistributedDataParallel (recorded by a comm hook) on "
              f"{len(BUCKET_CASES)} fixed cases and two random ones ("
              + "; ".join(f"{len(sizes)} gradients, bucket_cap_mb={cap}: {len(recorded_buckets(sizes, cap))} bucket(s)"
                          for _, sizes, cap in randoms) + ")")

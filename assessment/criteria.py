"""What the assessment grades: each criterion, its points, what it checks in the learner's words, and the two rules
on the run that counts (``target_held``, ``speed``), which the grader and the notebook's own verdict share.

The grader iterates this table (``assessment.grader.grade``); the notebook prints it. The first three are
decided by running the learner's torchrun script on a tiny problem (``assessment.job``), the last two by
evaluating the checkpoints of the run that counts on held-out images the grader draws at grading time.
"""
import functools
import json
import math
from pathlib import Path

# The speed rule's factor, here because the criteria's text states it (settings.py, which the grader may import only
# after it has set the quick mode, gives the same value as settings.SPEED_FACTOR, and says how it was chosen).
SPEED_FACTOR = 1.3
# What one optimizer step costs, measured once (benchmarks/bench_assessment_step_cost.py writes it): the speed rule
# prices steps with it, so that its verdict never depends on the machine that grades or on its load.
STEP_COST = Path(__file__).resolve().with_name("step_cost.json")

CRITERIA = {
    # name: (points, what it checks)
    "job": (5, "your script, on 2 processes of one node and on 3 of two GPU nodes (simulated), gives each rank its "
               "own reshuffled share of the data, picks each rank's device from its place on its node, trains through "
               "DDP to the weights one process reaches taking the same optimizer steps on the same global batches, "
               "logs the loss over all ranks and the test accuracy on rank 0 only, saves rank 0's checkpoints only, "
               "and tears its process group down"),
    "failure": (2, "when one rank fails in a training step, your job fails too, and every rank tears its process "
                   "group down instead of waiting for the others"),
    "refusal": (1, "a global batch the processes cannot share equally is refused by every rank before training"),
    "target": (4, "two consecutive checkpoints of your run that counts reach the target accuracy on held-out images "
                  "made at grading time, and its last checkpoint stays at the floor or above"),
    "speed": (2, f"your run that counts holds the target within {SPEED_FACTOR:g} times the modelled time the "
                 "course's solution needs: its optimizer steps to the target times the cost of one step at its batch "
                 "per process (compute, measured once for this model, plus the all-reduce of lab 03's alpha-beta "
                 "model), so that the verdict is the same on any machine, idle or loaded, CPU or GPU"),
}


def target_held(accuracies: list, target: float, floor: float) -> tuple[int | None, str]:
    """The target rule, on the accuracies of the checkpoints after epochs 1, 2, ... (None: a checkpoint missing,
    refused or not new, which breaks a pair): (the first epoch of the first pair of consecutive checkpoints at or
    above ``target``, or None; why not, or ""). A pair counts only if the last checkpoint is at ``floor`` or above:
    a run that reaches the target and then collapses has not held it."""
    for epoch in range(1, len(accuracies)):
        pair = accuracies[epoch - 1:epoch + 1]
        if all(a is not None and a >= target for a in pair):
            last = accuracies[-1]
            if last is None or last < floor:
                shown = "is missing or was not evaluated" if last is None else f"has accuracy {last:.3f}"
                return None, (f"reached the target {target:.2f} after epochs {epoch} and {epoch + 1}, but the last "
                              f"checkpoint {shown}, not at the floor {floor:.2f} or above: the run did not hold the target")
            return epoch, ""
    return None, f"the target is {target:.2f} at two consecutive epochs"


def steps_to_target(first: int, global_batch: int, train_size: int, workers: int, drop_last: bool = False) -> int:
    """The optimizer steps a run took until the second checkpoint of its first held pair (``first``, from
    ``target_held``): every epoch, each process takes its share of the training set in batches of
    global_batch / workers (the last one smaller, or left out with ``drop_last``)."""
    share = math.ceil(train_size / workers)              # DistributedSampler pads the shares to equal sizes
    per_rank = global_batch // workers
    return (first + 1) * (share // per_rank if drop_last else math.ceil(share / per_rank))


@functools.lru_cache(maxsize=1)
def _step_cost() -> dict:
    return json.loads(STEP_COST.read_text())


def step_seconds(per_rank_batch: int) -> tuple[float, float]:
    """The modelled cost of one optimizer step at ``per_rank_batch`` images per process: (compute, communication)
    in seconds. Compute: the measured step time, interpolated linearly between the measured batches (beyond them,
    extended along the last two). Communication: the ring all-reduce of the gradients between the processes, from
    lab 03's alpha-beta model with the measured alpha and beta (``utils.collectives.ring_all_reduce_seconds``)."""
    table = _step_cost()
    measured = sorted((int(batch), seconds) for batch, seconds in table["compute_seconds"].items())
    (b0, s0), (b1, s1) = next(((lo, hi) for lo, hi in zip(measured, measured[1:]) if per_rank_batch <= hi[0]),
                              measured[-2:])
    compute = s0 + (s1 - s0) * (per_rank_batch - b0) / (b1 - b0)
    from utils.collectives import ring_all_reduce_seconds
    ring = table["all_reduce"]
    communication = ring_all_reduce_seconds(ring["gradient_bytes"], table["workers"], ring["alpha_s"],
                                            ring["beta_s_per_byte"])
    return max(compute, 0.0), communication


def modelled_seconds(steps: int, per_rank_batch: int) -> float:
    """The speed rule's time to the target: ``steps`` optimizer steps at ``step_seconds(per_rank_batch)`` each."""
    return steps * sum(step_seconds(per_rank_batch))


def speed(first: int | None, global_batch: int, drop_last: bool = False) -> tuple[bool, str]:
    """The speed rule: the run that counts at ``global_batch`` (each epoch's last smaller batch left out with
    ``drop_last``), having held the target from epoch ``first``, took
    at most SPEED_FACTOR x the modelled time of the course's solution (its global batch ``settings.GLOBAL_BATCH``,
    held by epoch ``settings.REFERENCE_EPOCHS``). Modelled, not measured: the steps a run took are the same on any
    machine, and each is priced from one table, so no machine's speed, load or other work changes the verdict."""
    from . import settings
    if first is None:
        return False, "the run that counts did not hold the target, so it has no time to the target"
    size = dict(train_size=settings.TRAIN_SIZE, workers=settings.WORKERS)
    steps = steps_to_target(first, global_batch, drop_last=drop_last, **size)
    reference_steps = steps_to_target(settings.REFERENCE_EPOCHS - 1, settings.GLOBAL_BATCH, **size)
    mine = modelled_seconds(steps, global_batch // settings.WORKERS)
    reference = modelled_seconds(reference_steps, settings.GLOBAL_BATCH // settings.WORKERS)
    said = (f"your run held the target after {steps} optimizer steps of {global_batch // settings.WORKERS} images per "
            f"process (epoch {first + 1}), {mine:.1f} s modelled; the course's solution needs {reference_steps} steps of "
            f"{settings.GLOBAL_BATCH // settings.WORKERS} (epoch {settings.REFERENCE_EPOCHS}, {settings.REFERENCE_FROM}), "
            f"{reference:.1f} s, and the limit is {settings.SPEED_FACTOR:g}x that, {settings.SPEED_FACTOR * reference:.1f} s")
    return mine <= settings.SPEED_FACTOR * reference * (1 + 1e-9), said   # a float's last digit never decides

"""What the assessment grades: each criterion, its points, what it checks in the learner's words, and the two rules
on the run that counts (``target_held``, ``speed``), which the grader and the notebook's own verdict share.

The grader iterates this table (``assessment.grade``); the notebook prints it. The first three are
decided by running the learner's torchrun script on a tiny problem (``assessment.job``), the last two by
evaluating the checkpoints of the run that counts on held-out images the grader draws at grading time.
"""
import math

# The speed rule's factor, here because the criteria's text states it (settings.py, which the grader may import only
# after it has set the quick mode, gives the same value as settings.SPEED_FACTOR, and says how it was chosen).
SPEED_FACTOR = 1.3

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
    "speed": (2, f"your run that counts holds the target within {SPEED_FACTOR:g} times the optimizer steps the "
                 "course's solution needs (its median over the recorded seeds): how fast it trains, counted in steps, "
                 "so that the verdict is the same on any machine, idle or loaded, CPU or GPU"),
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


def steps_to_target(first: int, global_batch: int, train_size: int, workers: int) -> int:
    """The optimizer steps a run took until the second checkpoint of its first held pair (``first``, from
    ``target_held``): every epoch, each process takes its share of the training set in batches of
    global_batch / workers (the last one smaller)."""
    share = math.ceil(train_size / workers)              # DistributedSampler pads the shares to equal sizes
    return (first + 1) * math.ceil(share / (global_batch // workers))


def speed(first: int | None) -> tuple[bool, str]:
    """The speed rule: the run that counts, having held the target from epoch ``first``, took at most
    SPEED_FACTOR x the steps the course's solution takes (``settings.REFERENCE_EPOCHS``). Steps, not seconds: a
    step costs the same for every submission (the same model, global batch and processes), so the steps are the
    time to the target up to that constant, whatever the machine, its load or the grader's other work."""
    from . import settings
    if first is None:
        return False, "the run that counts did not hold the target, so it has no time to the target"
    size = dict(global_batch=settings.GLOBAL_BATCH, train_size=settings.TRAIN_SIZE, workers=settings.WORKERS)
    mine, reference = steps_to_target(first, **size), steps_to_target(settings.REFERENCE_EPOCHS - 1, **size)
    said = (f"your run held the target after {mine} optimizer steps (epoch {first + 1}); the course's solution needs "
            f"{reference} (epoch {settings.REFERENCE_EPOCHS}, {settings.REFERENCE_FROM}), and the limit is "
            f"{settings.SPEED_FACTOR:g}x that, {settings.SPEED_FACTOR * reference:.0f}")
    return mine <= settings.SPEED_FACTOR * reference, said

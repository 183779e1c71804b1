"""What the assessment grades: each criterion, its points, and what it checks in the learner's words.

The grader iterates this table (``assessment.grade``); the notebook prints it. The first three are
decided by running the learner's torchrun script on a tiny problem (``assessment.job``), the last by
evaluating the checkpoints of the run that counts on held-out images the grader draws at grading time.
"""
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
                  "made at grading time"),
}

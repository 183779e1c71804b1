"""The assessment's fixed settings: the notebook, its checks and the grader all read them from here.

The task: the baseline trains one process at BASE_BATCH with BASE_LR; the learner's data-parallel
job (a torchrun script, run with WORKERS processes) trains at a global batch the learner chooses from
MIN_GLOBAL_BATCH to MAX_GLOBAL_BATCH (so that many times fewer steps) for the same EPOCHS and must still
reach TARGET accuracy at two evaluations in a row (two consecutive epochs' checkpoints) and keep its last
checkpoint at FLOOR or above (a run that collapses afterwards does not pass), on held-out images that the
grader draws afresh at grading time, and reach it fast (``criteria.speed``). The images are the shapes set at
DIFFICULTY "hard" (in full mode), on which the CNN plateaus well below 100%. How these were chosen
is recorded in the course repository's benchmarks/README.md.
"""
import numbers
import os

from assessment import criteria
from utils import config

WORKERS = 2                      # processes of the run that counts (torchrun --nproc-per-node WORKERS)
DIFFICULTY = config.pick(quick="standard", full="hard")   # utils.data.shapes(difficulty=...)
BASE_BATCH = 32
BASE_LR = 0.02                   # SGD with momentum MOMENTUM; tuned for BASE_BATCH
MOMENTUM = 0.9
SCALE = config.pick(quick=4, full=16)   # the course's solution's choice: its global batch over the baseline's
GLOBAL_BATCH = SCALE * BASE_BATCH       # ... the speed rule's reference
# The learner's choice of global batch: from 8x the baseline's (quick mode: 4x) to 64x (16x), a multiple of WORKERS.
# At 64x an epoch of the full TRAIN_SIZE is 5 steps; beyond, too few steps are left to train in EPOCHS.
MIN_GLOBAL_BATCH = config.pick(quick=4, full=8) * BASE_BATCH
MAX_GLOBAL_BATCH = config.pick(quick=16, full=64) * BASE_BATCH
EPOCHS = config.pick(quick=3, full=20)
TRAIN_SIZE = config.pick(quick=2400, full=9600)   # images for training (9600 + 2400 = the set's 12000)
TEST_SIZE = config.pick(quick=600, full=2400)
TARGET = config.pick(quick=0.15, full=0.60)       # held-out accuracy two consecutive checkpoints must reach
FLOOR = config.pick(quick=0.12, full=0.50)        # ... and the last checkpoint must not fall below (chance is 0.10)
# Quick mode (the test suite) trains 3 epochs of 19 steps on the standard images: its target only tells
# a trained model from an untrained one (chance is 0.10; the solution measured 0.19-0.27 after epochs 2-3).
EVAL_SIZE = 2000                 # fresh held-out images the grader draws for every submission
CHECKPOINT_DIR = "checkpoints"   # the run that counts: rank 0 saves the model there after every epoch (epoch_01.pt, ...)
RECORD_DIR = "run_record"        # the run that counts: what each process did (utils.checks.job.probe), for the grader
# Every setting the run that counts gives the script (so that the script's own defaults play no part).
# Its seed (its shuffles, initial weights and dropout follow it): the grader draws one for each submission and gives
# it through SEED_VARIABLE, so that no learner tunes on the graded run; a learner's own run takes COUNTED_SEED. The
# solution holds the target at every drawn seed recorded with the real job (benchmarks/results/assessment_job.json,
# benchmarks/bench_assessment_job.py; tests/test_bench_assessment_job.py checks it).
COUNTED_SEED = 0
COUNTED_RUN = {"epochs": EPOCHS, "train_size": TRAIN_SIZE, "test_size": TEST_SIZE, "difficulty": DIFFICULTY,
               "dropout": 0.25}
SEED_VARIABLE = "COURSE_COUNTED_SEED"   # the grader sets it in the notebook's environment
JOB_DIR = "assessment_job"       # the learner's script, written by the notebook's %%writefile cell
JOB_FILE = "train_job.py"
# How fast: the run that counts must hold the target within SPEED_FACTOR x the optimizer steps the course's solution
# takes to it. REFERENCE_EPOCHS: the epoch that ends the solution's first held pair, its median over the drawn seeds
# of benchmarks/results/assessment_job.json (full mode; re-derived by tests/test_bench_assessment_job.py, which also
# checks that the solution's slowest recorded seed is within the factor); quick mode: its last epoch. SPEED_FACTOR:
# the solution's slowest recorded seed holds within it with an epoch to spare, and a run 20% slower than the median
# passes; in full mode the rule then refuses runs that hold the target only in the last epochs.
REFERENCE_EPOCHS = config.pick(quick=3, full=14)
REFERENCE_FROM = config.pick(quick="the last epoch of quick mode's short run", full="its median over the recorded seeds")
SPEED_FACTOR = criteria.SPEED_FACTOR


def counted_seed() -> int:
    """The seed of the run that counts: the one the grader gives (``SEED_VARIABLE``), else ``COUNTED_SEED``."""
    given = os.environ.get(SEED_VARIABLE, "")
    return int(given) if given.isdigit() else COUNTED_SEED


def check_global_batch(global_batch) -> int:
    """The learner's choice of global batch as a Python int, or a ValueError that says what to choose."""
    if isinstance(global_batch, numbers.Integral) and not isinstance(global_batch, bool):
        global_batch = int(global_batch)     # a numpy or torch integer is a whole number too
    if type(global_batch) is not int:
        raise ValueError(f"the global batch of the run that counts must be an integer (a Python int), got "
                         f"{type(global_batch).__name__} {global_batch!r:.40}")
    if not MIN_GLOBAL_BATCH <= global_batch <= MAX_GLOBAL_BATCH or global_batch % WORKERS:
        raise ValueError(f"the global batch of the run that counts must be from {MIN_GLOBAL_BATCH} to "
                         f"{MAX_GLOBAL_BATCH} ({MIN_GLOBAL_BATCH // BASE_BATCH}x to {MAX_GLOBAL_BATCH // BASE_BATCH}x "
                         f"the baseline's {BASE_BATCH}) and one that {WORKERS} processes share equally (a multiple of "
                         f"{WORKERS}); got {global_batch}")
    return global_batch


def counted_run(seed: int, global_batch: int = GLOBAL_BATCH) -> dict:
    """Every setting the run that counts gives the script: its seed and the learner's global batch included."""
    return {**COUNTED_RUN, "global_batch": check_global_batch(global_batch), "seed": seed}


def checkpoint_name(epoch: int) -> str:
    """The file rank 0 saves after epoch ``epoch`` (counted from 1) in the checkpoint folder."""
    return f"epoch_{epoch:02d}.pt"

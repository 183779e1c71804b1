"""The assessment's fixed settings: the notebook, its checks and the grader all read them from here.

The task: the baseline trains one process at BASE_BATCH with BASE_LR; the learner's data-parallel
job must train at GLOBAL_BATCH (SCALE times larger, so SCALE times fewer steps) for the same EPOCHS
and still reach TARGET accuracy on held-out data that the grader makes afresh at grading time.
"""
from utils import config

WORKERS = 2                      # engines, one rank each
BASE_BATCH = 32
BASE_LR = 0.02                   # SGD with momentum MOMENTUM; tuned for BASE_BATCH
MOMENTUM = 0.9
SCALE = 4
GLOBAL_BATCH = SCALE * BASE_BATCH
EPOCHS = 4
TRAIN_SIZE = config.pick(quick=2400, full=9600)   # shapes images for training (lab 06's offline set)
TEST_SIZE = config.pick(quick=600, full=2400)
TARGET = config.pick(quick=0.25, full=0.70)       # held-out accuracy the saved model must reach
# Quick mode (the test suite) trains 76 steps: its target only tells a trained model from an untrained one.
EVAL_SIZE = 2000                 # fresh held-out images the grader draws for every submission
MODEL_FILE = "assessment_model.pt"
TIME_FACTOR = 1.0                # on a GPU: the DDP run may take at most this times the baseline's time

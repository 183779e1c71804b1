"""The assessment's data-parallel job. Run: torchrun --nproc-per-node 2 train_job.py [--epochs 20 ...]"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from assessment import settings
from utils import data, models
from utils.train import evaluate     # loss and accuracy in eval mode, without building a graph


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=settings.EPOCHS)
    parser.add_argument("--global-batch", type=int, default=settings.GLOBAL_BATCH,
                        help="samples per optimizer step, all processes together")
    parser.add_argument("--train-size", type=int, default=settings.TRAIN_SIZE)
    parser.add_argument("--test-size", type=int, default=settings.TEST_SIZE)
    parser.add_argument("--difficulty", default=settings.DIFFICULTY)
    parser.add_argument("--dropout", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=settings.CHECKPOINT_DIR, help="folder for the checkpoints")
    return parser.parse_args()


def setup():
    """Join the job's process group; return (rank, world_size, device)."""
    raise NotImplementedError(
        'Hint: torchrun describes each process in environment variables that init_process_group '
        'reads by itself, and the backend follows the device this process may use (lab 06, section '
        '1)'
    )


def make_optimizer(parameters, global_batch, steps_per_epoch, epochs):
    """The optimizer for this global batch and the scheduler that changes its settings from step to step."""
    raise NotImplementedError(
        'Hint: what did labs 06 and 07 measure when the batch grew at a fixed number of epochs? '
        "Read torch.optim.lr_scheduler's documentation for the ways a learning rate can change "
        'from step to step.'
    )


def train(args, rank, world_size, device):
    raise NotImplementedError(
        "Hint: the baseline's loop and lab 06's job, changed in who reads which samples, who "
        'averages the gradients, how a metric becomes global, who prints and writes, and how the '
        'optimizer is built'
    )


if __name__ == "__main__":
    args = parse_args()
    rank, world_size, device = setup()
    raise NotImplementedError(
        'Hint: the process group must be let go of however training ends, normally or with an '
        'error'
    )

"""What the assessment grades, first half: what each rank runs (the verdicts are in ``verdicts``).

Each ``rank_*`` function runs the learner's functions (found in ``ns``, the namespace their cells
defined) on one rank of an initialised process group and returns plain data (lists, tensors). The
grader runs these halves in its sandbox on 2 and 3 spawned ranks; ``assessment.verdicts`` judges the
results in the grader's own process, with references computed there. ``verdicts`` is not in the
sandbox's view of the course, so learner code cannot call a reference to make up an answer.

Secrets: each rank's data comes from its own seed, ``rank_seed(secret, world, rank)``, a hash of the
grader's secret. A rank knows only its own; the weights one process reaches on the global batch need
every rank's data, so they cannot be made up on one rank without the communication being assessed.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from utils.models import CNN

PROBE_SHAPE = (1, 8, 8)      # tiny images: the probes test behaviour, not accuracy
N_PROBE = 60                 # divisible by 2, 3 and 4 ranks, so shards are whole and padding-free


SHARED = -1                  # rank_seed(secret, world, SHARED): the seed every rank may know


def rank_seed(secret: int, world: int, rank: int) -> int:
    """Rank ``rank``'s own seed: one rank's seed tells nothing of another's or of the secret."""
    digest = hashlib.sha256(f"{secret}:{world}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


def probe_model(seed: int) -> torch.nn.Module:
    """A tiny CNN in float64 (so sums taken in another order agree to ~1e-12), without dropout."""
    torch.manual_seed(seed)
    return CNN(PROBE_SHAPE, channels=(2, 3), hidden=6, dropout=0.0).double()


class IndexSet(Dataset):
    """Sample i is (i as a float, label): the batches a loader yields tell which samples it drew."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(float(i)), int(i) % 10


class LoggedImages(Dataset):
    """Tiny images that record, in order, every index the learner's loader fetched."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y, self.fetched = x, y, []

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return self.x[i], self.y[i]


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    module = getattr(module, "module", module)  # the model inside a DDP wrapper
    return [p.detach().clone() for p in module.state_dict().values()]


# --- 1. sharding: make_train_loader(train_set, global_batch, seed) -> (loader, sampler) ----------

def assessment_batch(world: int) -> int:
    """The assessment's global batch, rounded down to a multiple of ``world`` (the probe also runs 3 ranks)."""
    from . import settings
    return settings.GLOBAL_BATCH - settings.GLOBAL_BATCH % world


def rank_sharding(ns: dict, global_batch: int, seed: int) -> dict:
    loader, sampler = ns["make_train_loader"](IndexSet(N_PROBE), global_batch, seed)
    epochs = []
    for epoch in (0, 1):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        epochs.append([[int(i) for i in x.tolist()] for x, _ in loader])
    # The assessment's own global batch too: a loader that caps the batch (min(global_batch, 64), say)
    # passes the small probe above but would train the run that counts at another batch.
    big_batch = assessment_batch(dist.get_world_size())
    big, _ = ns["make_train_loader"](IndexSet(2 * big_batch), big_batch, seed)
    first = next(iter(big), None)
    return {"epochs": epochs, "loader_uses_sampler": getattr(loader, "sampler", None) is sampler,
            "has_set_epoch": hasattr(sampler, "set_epoch"),
            "assessment_batch": int(len(first[0])) if first is not None else 0}


# --- 2. the DDP step: wrap_model(model) and train_step(model, optimizer, x, y) ------------------

STEP_LR, STEP_MOMENTUM, STEP_STEPS, STEP_PER_RANK = 0.2, 0.9, 3, 4


def step_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One rank's batches for the DDP-step probe, from that rank's own seed."""
    g = torch.Generator().manual_seed(seed)
    # Random non-integer pixels: sums in another order differ, so a missing average shows.
    return [(torch.randn(STEP_PER_RANK, *PROBE_SHAPE, generator=g, dtype=torch.float64),
             torch.randint(0, 10, (STEP_PER_RANK,), generator=g)) for _ in range(STEP_STEPS)]


def rank_ddp_step(ns: dict, seed: int) -> dict:
    """``seed`` is this rank's own: its initial weights (DDP must make rank 0's everyone's) and its batches."""
    model = ns["wrap_model"](probe_model(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=STEP_LR, momentum=STEP_MOMENTUM)
    losses = []
    for x, y in step_batches(seed):
        loss = ns["train_step"](model, optimizer, x, y)
        losses.append(float(loss.detach()) if torch.is_tensor(loss) else float(loss))
    return {"weights": _weights(model), "losses": losses,
            "is_ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel)}


# --- 3. metrics: global_mean(total, count) -> the mean over every rank's samples -----------------

def metric_inputs(seed: int, rank: int) -> tuple[float, int]:
    """The (total, count) rank ``rank`` passes to global_mean, from its own seed; the judge recomputes them."""
    g = torch.Generator().manual_seed(seed)
    count = 3 + 4 * rank                                   # unequal counts: a mean of means is wrong
    return float(torch.rand(1, generator=g)) * count * 2.5, count


def rank_metrics(ns: dict, seed: int) -> dict:
    total, count = metric_inputs(seed, dist.get_rank())
    return {"mean": float(ns["global_mean"](total, count))}


# --- 4. the training job: train(epochs, global_batch, checkpoint_dir) ----------------------------

JOB_EPOCHS, JOB_BATCH_PER_RANK = 2, 5
JOB_LR = 0.05   # the probe's own optimizer (in place of make_optimizer's), so a reference can be computed


def job_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N_PROBE, *PROBE_SHAPE, generator=g), torch.randint(0, 10, (N_PROBE,), generator=g)


def probe_job_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return CNN(PROBE_SHAPE, channels=(2, 3), hidden=6, dropout=0.0)


def job_namespace(ns: dict, seed: int) -> dict:
    """Replace the engines' data, model factory and optimizer factory with tiny, instrumented ones."""
    x, y = job_data(seed)
    ns["train_set"] = LoggedImages(x, y)
    ns["test_set"] = torch.utils.data.TensorDataset(x[:20].clone(), y[:20].clone())
    models, batch_sizes, optimizers, outside_ddp = [], [], [], []

    def record(module, args):
        if module.training:
            batch_sizes.append(int(args[0].shape[0]))
            if not _inside_ddp():
                outside_ddp.append(len(batch_sizes))

    def make_model():
        model = probe_job_model(seed)
        model.register_forward_pre_hook(record)
        models.append(model)
        return model

    def make_optimizer(parameters, *args, **kwargs):
        optimizer = torch.optim.SGD(parameters, lr=JOB_LR, momentum=0.9)
        optimizers.append(optimizer)
        return optimizer, torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)   # lr stays JOB_LR

    ns["make_model"], ns["make_optimizer"] = make_model, make_optimizer
    return {"models": models, "batch_sizes": batch_sizes, "optimizers": optimizers, "outside_ddp": outside_ddp}


def _inside_ddp() -> bool:
    """Whether the model's forward was called by a DistributedDataParallel wrapper's forward."""
    import sys

    from torch.nn.parallel import DistributedDataParallel
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        if isinstance(frame.f_locals.get("self"), DistributedDataParallel):
            return True
        frame = frame.f_back
    return False


def rank_job(ns: dict, seed: int, checkpoint_dir: str) -> dict:
    from . import settings
    world = dist.get_world_size()
    probes = job_namespace(ns, seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns["train"](JOB_EPOCHS, JOB_BATCH_PER_RANK * world, checkpoint_dir)
    dist.barrier()
    saved = []   # per epoch: the checkpoint's keys and values, None where it is missing, or why it is unreadable
    # Each rank got a folder of its own (the probe's choice: a job may not assume a shared one), so a
    # rank other than 0 that saves leaves files where none should be.
    other_saves = len(list(Path(checkpoint_dir).glob("*.pt"))) if dist.get_rank() and Path(checkpoint_dir).is_dir() else 0
    for epoch in range(1, JOB_EPOCHS + 1 if dist.get_rank() == 0 else 1):   # rank 0 saves, and is judged
        path = Path(checkpoint_dir) / settings.checkpoint_name(epoch)
        if not path.exists():
            saved.append(None)
            continue
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
            saved.append({"keys": list(state), "values": list(state.values())})
        except Exception as error:  # judged later: the message says what was wrong with the file
            saved.append(f"{type(error).__name__}: {error}")
    return {"printed": out.getvalue(), "fetched": ns["train_set"].fetched, "batch_sizes": probes["batch_sizes"],
            "weights": _weights(probes["models"][-1]) if probes["models"] else None, "saved": saved,
            "other_saves": other_saves,
            "keys": list(probes["models"][-1].state_dict()) if probes["models"] else [],
            "optimizers": len(probes["optimizers"]), "outside_ddp": len(probes["outside_ddp"])}


CRITERIA = {
    # name: (points, what it checks, in the feedback's words)
    "sharding": (2, "make_train_loader gives each rank a disjoint shuffled shard in batches of global_batch // world_size"),
    "ddp_step": (2, "wrap_model + train_step on 2 and 3 ranks give the weights of one process on the global batch"),
    "metrics": (1, "global_mean is the mean over every rank's samples, on every rank"),
    "training_job": (3, "train() shards and reshuffles, trains DDP to the weights of one process on the same global "
                        "batches, logs on rank 0 only and saves a checkpoint of rank 0's model every epoch"),
    "target": (4, "two consecutive checkpoints your notebook saved reach the target accuracy on held-out data made "
                  "at grading time"),
}


def rank_run(name: str, ns: dict, secret: int, checkpoint_dir: str) -> dict:
    """Criterion ``name``'s half on this rank, with this rank's own seed (the probe and the checks both use it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if name == "sharding":
        return rank_sharding(ns, 4 * world, rank_seed(secret, world, SHARED))
    if name == "ddp_step":
        return rank_ddp_step(ns, rank_seed(secret, world, rank))
    if name == "metrics":
        return rank_metrics(ns, rank_seed(secret, world, rank))
    return rank_job(ns, rank_seed(secret, world, SHARED), checkpoint_dir)


def check_on_engines(name: str, ns: dict, seed: int = 0, **options) -> None:
    """The notebook's check of criterion ``name`` on the engines (see ``assessment.verdicts``)."""
    from . import verdicts  # not in the grader's sandbox: there the grader judges, outside
    verdicts.check_on_engines(name, ns, seed, **options)

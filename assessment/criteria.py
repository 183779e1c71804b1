"""What the assessment grades, as two halves: what each rank runs, and the verdict on all ranks' results.

Each ``rank_*`` function runs the learner's functions (found in ``ns``, the namespace their cells
defined) on one rank of an initialised process group and returns plain data (lists, tensors). Each
``judge_*`` function takes every rank's results and returns ``None`` when the criterion holds, or the
reason it does not, in words a learner understands. The notebook's check cells run both halves on the
engines; the grader runs the ``rank_*`` halves in a sandbox on 2 and 3 spawned ranks and the
``judge_*`` halves in its own process, so a submission cannot change a verdict by patching code.
"""
from __future__ import annotations

import io
import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import Dataset

from utils.models import CNN

PROBE_SHAPE = (1, 8, 8)      # tiny images: the probes test behaviour, not accuracy
N_PROBE = 60                 # divisible by 2, 3 and 4 ranks, so shards are whole and padding-free


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

def rank_sharding(ns: dict, global_batch: int, seed: int) -> dict:
    loader, sampler = ns["make_train_loader"](IndexSet(N_PROBE), global_batch, seed)
    epochs = []
    for epoch in (0, 1):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        epochs.append([[int(i) for i in x.tolist()] for x, _ in loader])
    return {"epochs": epochs, "loader_uses_sampler": getattr(loader, "sampler", None) is sampler,
            "has_set_epoch": hasattr(sampler, "set_epoch")}


def judge_sharding(results: list[dict], global_batch: int) -> str | None:
    world = len(results)
    per_rank = global_batch // world
    if not all(r["has_set_epoch"] for r in results):
        return ("the sampler you return has no set_epoch(): return the DistributedSampler itself, so that the "
                "training loop can reshuffle every epoch")
    if not all(r["loader_uses_sampler"] for r in results):
        return ("the loader does not draw from the sampler you return: pass it as DataLoader(..., sampler=sampler), "
                "or set_epoch() in the training loop changes nothing")
    for epoch in (0, 1):
        shards = [[i for batch in r["epochs"][epoch] for i in batch] for r in results]
        for rank, r in enumerate(results):
            sizes = [len(b) for b in r["epochs"][epoch]]
            if sizes and max(sizes) != per_rank:
                return (f"on {world} ranks with global batch {global_batch}, rank {rank}'s batches hold {max(sizes)} "
                        f"samples; each rank's batch must be global_batch // world_size = {per_rank}, so that the "
                        f"ranks together take one global batch per step")
        seen = [i for shard in shards for i in shard]
        if len(seen) != len(set(seen)):
            both = sorted(set(shards[0]) & set(shards[1]))[:5]
            return (f"on {world} ranks the shards overlap (ranks 0 and 1 both got samples {both}...): every rank "
                    f"must get its own part of the data, e.g. through a DistributedSampler")
        if sorted(seen) != list(range(N_PROBE)):
            missing = sorted(set(range(N_PROBE)) - set(seen))[:5]
            return (f"on {world} ranks one epoch does not cover the data: samples {missing}... were never drawn "
                    f"(drop_last on the sampler or the loader drops samples)")
        if shards[0] == sorted(shards[0]):
            return "the shards come in order: shuffle the training data (the sampler's shuffle=True, with the seed)"
    if results[0]["epochs"][0] == results[0]["epochs"][1]:
        return ("epochs 0 and 1 give the same order although set_epoch() was called: the sampler must reshuffle "
                "with the epoch (DistributedSampler does)")
    return None


# --- 2. the DDP step: wrap_model(model) and train_step(model, optimizer, x, y) ------------------

STEP_LR, STEP_MOMENTUM, STEP_STEPS, STEP_PER_RANK = 0.2, 0.9, 3, 4


def _step_batches(seed: int, global_batch: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEP_STEPS):
        # Random non-integer pixels: sums in another order differ, so a missing average shows.
        yield (torch.randn(global_batch, *PROBE_SHAPE, generator=g, dtype=torch.float64),
               torch.randint(0, 10, (global_batch,), generator=g))


def rank_ddp_step(ns: dict, seed: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = ns["wrap_model"](probe_model(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=STEP_LR, momentum=STEP_MOMENTUM)
    losses = []
    for x, y in _step_batches(seed, STEP_PER_RANK * world):
        part = slice(rank * STEP_PER_RANK, (rank + 1) * STEP_PER_RANK)
        loss = ns["train_step"](model, optimizer, x[part], y[part])
        losses.append(float(loss.detach()) if torch.is_tensor(loss) else float(loss))
    return {"weights": _weights(model), "losses": losses,
            "is_ddp": isinstance(model, torch.nn.parallel.DistributedDataParallel)}


def reference_step(seed: int, world: int) -> list[torch.Tensor]:
    """One process, the whole global batch, the same steps: the weights DDP must reproduce."""
    model = probe_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=STEP_LR, momentum=STEP_MOMENTUM)
    for x, y in _step_batches(seed, STEP_PER_RANK * world):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return _weights(model)


def _same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-9) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=tol, rtol=0) for x, y in zip(a, b))


def judge_ddp_step(results: list[dict], reference: list[torch.Tensor]) -> str | None:
    world = len(results)
    if not all(_same(r["weights"], results[0]["weights"]) for r in results):
        return (f"after {STEP_STEPS} steps on {world} ranks the ranks' weights differ: the gradients were not "
                f"averaged over ranks; wrap the model in DistributedDataParallel")
    if not _same(results[0]["weights"], reference):
        return (f"after {STEP_STEPS} steps on {world} ranks the ranks agree with each other but not with one "
                f"process training on the whole global batch: a step is zero_grad, the mean cross-entropy loss of "
                f"the local batch, backward, optimizer.step (DDP averages the gradients itself; do not scale the loss)")
    return None


# --- 3. metrics: global_mean(total, count) -> the mean over every rank's samples -----------------

def metric_inputs(seed: int, rank: int) -> tuple[float, int]:
    """The (total, count) rank ``rank`` passes to global_mean; the judge recomputes them from the seed."""
    g = torch.Generator().manual_seed(seed + rank)
    count = 3 + 4 * rank                                   # unequal counts: a mean of means is wrong
    return float(torch.rand(1, generator=g)) * count * 2.5, count


def rank_metrics(ns: dict, seed: int) -> dict:
    total, count = metric_inputs(seed, dist.get_rank())
    return {"mean": float(ns["global_mean"](total, count))}


def judge_metrics(results: list[dict], seed: int) -> str | None:
    inputs = [metric_inputs(seed, rank) for rank in range(len(results))]   # never the ranks' own word
    expected = sum(t for t, _ in inputs) / sum(c for _, c in inputs)
    means = [r["mean"] for r in results]
    if all(abs(m - expected) < 1e-6 for m in means):
        return None
    mean_of_means = sum(t / c for t, c in inputs) / len(results)
    if all(abs(m - mean_of_means) < 1e-6 for m in means):
        return ("global_mean returned the mean of the ranks' means; with unequal counts that is wrong: sum the "
                "totals and the counts over ranks (one all_reduce), then divide")
    local = [t / c for t, c in inputs]
    if all(abs(m - l) < 1e-6 for m, l in zip(means, local)):
        return "global_mean returned each rank's own mean: reduce the total and the count over ranks first"
    return (f"on {len(results)} ranks global_mean gave {['%.4f' % m for m in means]}, expected {expected:.4f} on "
            f"every rank (sum of totals / sum of counts)")


# --- 4. the training job: train(epochs, global_batch, model_path) --------------------------------

JOB_EPOCHS, JOB_BATCH_PER_RANK = 2, 5


def job_namespace(ns: dict, seed: int) -> dict:
    """Replace the engines' data and model factory with tiny, instrumented ones before train() runs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_PROBE, *PROBE_SHAPE, generator=g)
    y = torch.randint(0, 10, (N_PROBE,), generator=g)
    ns["train_set"] = LoggedImages(x, y)
    ns["test_set"] = torch.utils.data.TensorDataset(x[:20].clone(), y[:20].clone())
    models, batch_sizes = [], []

    def make_model():
        torch.manual_seed(seed)
        model = CNN(PROBE_SHAPE, channels=(2, 3), hidden=6, dropout=0.0)
        model.register_forward_pre_hook(lambda m, args: batch_sizes.append(int(args[0].shape[0])) if m.training else None)
        models.append(model)
        return model

    ns["make_model"] = make_model
    return {"models": models, "batch_sizes": batch_sizes}


def rank_job(ns: dict, seed: int, model_path: str) -> dict:
    world = dist.get_world_size()
    probes = job_namespace(ns, seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns["train"](JOB_EPOCHS, JOB_BATCH_PER_RANK * world, model_path)
    dist.barrier()
    saved = None
    if Path(model_path).exists():
        try:
            state = torch.load(model_path, weights_only=True, map_location="cpu")
            saved = {"keys": list(state), "values": list(state.values())}
        except Exception as error:  # judged below: the message says what was wrong with the file
            saved = f"{type(error).__name__}: {error}"
    return {"printed": out.getvalue(), "fetched": ns["train_set"].fetched, "batch_sizes": probes["batch_sizes"],
            "weights": _weights(probes["models"][-1]) if probes["models"] else None, "saved": saved,
            "keys": list(probes["models"][-1].state_dict()) if probes["models"] else [],
            "initial": _weights(probe_job_model(seed))}


def probe_job_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return CNN(PROBE_SHAPE, channels=(2, 3), hidden=6, dropout=0.0)


def judge_job(results: list[dict]) -> str | None:
    world = len(results)
    shard = N_PROBE // world
    if any(r["weights"] is None for r in results):
        return "train() never called make_model(): build the model with make_model() on every rank"
    if any(r["printed"].strip() for r in results[1:]):
        rank = next(i for i, r in enumerate(results) if i and r["printed"].strip())
        return f"rank {rank} printed {results[rank]['printed'].strip()[:60]!r}: only rank 0 may log"
    if not results[0]["printed"].strip():
        return "rank 0 printed nothing: log one line per epoch on rank 0 (epoch, train loss, test accuracy)"
    for rank, r in enumerate(results):
        if len(r["fetched"]) != JOB_EPOCHS * shard:
            return (f"on {world} ranks with {N_PROBE} samples and {JOB_EPOCHS} epochs, rank {rank} drew "
                    f"{len(r['fetched'])} samples instead of {JOB_EPOCHS * shard}: each epoch a rank trains on its "
                    f"own shard once (make_train_loader) and train() runs exactly `epochs` epochs")
        if r["batch_sizes"] and max(r["batch_sizes"]) != JOB_BATCH_PER_RANK:
            return (f"rank {rank} trained on batches of {max(r['batch_sizes'])} samples; with global batch "
                    f"{JOB_BATCH_PER_RANK * world} on {world} ranks each rank's batch is {JOB_BATCH_PER_RANK}")
    first = [r["fetched"][:shard] for r in results]
    if len({i for f in first for i in f}) != N_PROBE:
        return "within one epoch the ranks drew overlapping samples: use make_train_loader's sampler in train()"
    if all(r["fetched"][:shard] == r["fetched"][shard:] for r in results):
        return ("every epoch drew the samples in the same order: call sampler.set_epoch(epoch) at the start of "
                "each epoch")
    if not all(_same(r["weights"], results[0]["weights"], 1e-6) for r in results):
        return "the ranks ended with different weights: train the DistributedDataParallel model (wrap_model)"
    if _same(results[0]["weights"], results[0]["initial"], 0.0):
        return "the weights never changed: train() must run optimizer steps"
    saved = results[0]["saved"]
    if saved is None:
        return "no model was saved at model_path: rank 0 saves the trained model's state_dict there"
    if isinstance(saved, str):
        return f"the file at model_path could not be read as a state_dict ({saved})"
    if saved["keys"] != results[0]["keys"] or not _same(saved["values"], results[0]["weights"], 1e-6):
        return ("the saved state_dict is not the trained model's: save model.module.state_dict() (the model "
                "inside DDP, so the keys have no 'module.' prefix) after the last epoch")
    return None


CRITERIA = {
    # name: (points, what it checks, in the feedback's words)
    "sharding": (2, "make_train_loader gives each rank a disjoint shuffled shard in batches of global_batch // world_size"),
    "ddp_step": (2, "wrap_model + train_step on 2 and 3 ranks give the weights of one process on the global batch"),
    "metrics": (1, "global_mean is the mean over every rank's samples, on every rank"),
    "training_job": (3, "train() shards and reshuffles, trains DDP, logs on rank 0 only and saves rank 0's model"),
    "target": (4, "the model your notebook saved reaches the target accuracy on held-out data made at grading time"),
}


# --- the notebook's check cells: both halves on the engines' own process group --------------------

def check_on_engines(name: str, ns: dict, seed: int = 0, **options) -> None:
    """Run criterion ``name`` on every engine, judge on rank 0, and fail every rank if it does not hold.

    ``ns`` is the engine's ``globals()``, where the learner's functions live. The training-job check
    swaps the engines' data and model factory for tiny instrumented ones and puts them back after.
    """
    from utils.checks import Incorrect, exercise

    with exercise(f"Criterion '{name}'"):
        world = dist.get_world_size()
        if name == "sharding":
            batch = options.get("global_batch", 4 * world)
            mine = rank_sharding(ns, batch, seed)
            judge = lambda results: judge_sharding(results, batch)
        elif name == "ddp_step":
            mine = rank_ddp_step(ns, seed)
            judge = lambda results: judge_ddp_step(results, reference_step(seed, world))
        elif name == "metrics":
            mine = rank_metrics(ns, seed)
            judge = lambda results: judge_metrics(results, seed)
        elif name == "training_job":
            saved = {key: ns[key] for key in ("train_set", "test_set", "make_model") if key in ns}
            path = str(Path(options.get("folder", ".")) / f".check_job_{world}.pt")
            try:
                mine = rank_job(ns, seed, path)
            finally:
                ns.update(saved)
                if dist.get_rank() == 0:
                    Path(path).unlink(missing_ok=True)
            judge = judge_job
        else:
            raise ValueError(f"no criterion {name!r}; there are: {', '.join(CRITERIA)}")
        results = [None] * world
        dist.all_gather_object(results, mine)
        reason = judge(results)
        if reason:
            raise Incorrect(f"{name} on {world} ranks: {reason}")

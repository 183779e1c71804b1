"""What the assessment grades, second half: the verdict on every rank's results, and the references.

Each ``judge_*`` function takes every rank's results (from ``assessment.criteria``'s ``rank_*``
halves) and returns ``None`` when the criterion holds, or the reason it does not, in words a learner
understands. The references (one process on the same global batches) are computed here from the
grader's secret. The grader imports this module in its own process only: it is left out of the
sandbox's view of the course, so no submission can call it. The notebook's check cells use it on the
engines (``check_on_engines``), with seeds that are no secret.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .criteria import (CRITERIA, JOB_BATCH_PER_RANK, JOB_EPOCHS, JOB_LR, N_PROBE, SHARED, STEP_LR, STEP_MOMENTUM,
                       STEP_STEPS, _weights, assessment_batch, job_data, metric_inputs, probe_job_model, probe_model,
                       rank_run, rank_seed, rank_sharding, step_batches)


def _same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-9) -> bool:
    return len(a) == len(b) and all(torch.is_tensor(x) and x.shape == y.shape and x.dtype == y.dtype
                                    and torch.allclose(x, y, atol=tol, rtol=0) for x, y in zip(a, b))


# --- 1. sharding -----------------------------------------------------------------------------------

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
    big_batch = assessment_batch(world)
    got = [r.get("assessment_batch") for r in results]
    if any(b != big_batch // world for b in got):
        return (f"at the assessment's global batch ({big_batch} on {world} ranks) your loader's batches hold "
                f"{got[0]} samples, not {big_batch // world}: every global batch is split the same way")
    return None


# --- 2. the DDP step -------------------------------------------------------------------------------

def reference_step(secret: int, world: int) -> list[torch.Tensor]:
    """One process, rank 0's initial weights, every rank's batches together: the weights DDP must reach."""
    seeds = [rank_seed(secret, world, rank) for rank in range(world)]
    model = probe_model(seeds[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=STEP_LR, momentum=STEP_MOMENTUM)
    per_rank = [step_batches(seed) for seed in seeds]
    for step in range(STEP_STEPS):
        x = torch.cat([batches[step][0] for batches in per_rank])
        y = torch.cat([batches[step][1] for batches in per_rank])
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return _weights(model)


def judge_ddp_step(results: list[dict], reference: list[torch.Tensor]) -> str | None:
    world = len(results)
    if not all(_same(r["weights"], results[0]["weights"]) for r in results):
        return (f"after {STEP_STEPS} steps on {world} ranks the ranks' weights differ: the ranks started from "
                f"different weights and their gradients must be averaged; wrap the model in DistributedDataParallel")
    if not all(r.get("is_ddp") is True for r in results):
        return ("wrap_model must return the model wrapped in DistributedDataParallel (the ranks' weights agree, "
                "but not through DDP)")
    if not _same(results[0]["weights"], reference):
        return (f"after {STEP_STEPS} steps on {world} ranks the ranks agree with each other but not with one "
                f"process training on the whole global batch: a step is zero_grad, the mean cross-entropy loss of "
                f"the local batch, backward, optimizer.step (DDP averages the gradients itself; do not scale the loss)")
    return None


# --- 3. metrics ------------------------------------------------------------------------------------

def judge_metrics(results: list[dict], secret: int) -> str | None:
    world = len(results)
    inputs = [metric_inputs(rank_seed(secret, world, rank), rank) for rank in range(world)]  # never the ranks' word
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


# --- 4. the training job ---------------------------------------------------------------------------

def reference_job(results: list[dict], secret: int) -> list[list[torch.Tensor]]:
    """One process on the global batches the ranks drew, in their order: the weights train() must hold
    after each epoch (the last entry: at the end).

    The ranks' logs of the samples they drew say which global batch each step took; the data and the
    model come from the seed. A rank's step k took its k-th batch of JOB_BATCH_PER_RANK samples.
    """
    world = len(results)
    x, y = job_data(rank_seed(secret, world, SHARED))
    model = probe_job_model(rank_seed(secret, world, SHARED))
    optimizer = torch.optim.SGD(model.parameters(), lr=JOB_LR, momentum=0.9)
    per_epoch = (N_PROBE // world) // JOB_BATCH_PER_RANK
    after_each_epoch = []
    for step in range(JOB_EPOCHS * per_epoch):
        part = slice(step * JOB_BATCH_PER_RANK, (step + 1) * JOB_BATCH_PER_RANK)
        index = torch.tensor([i for r in results for i in r["fetched"][part]], dtype=torch.long)
        optimizer.zero_grad()
        F.cross_entropy(model(x[index]), y[index]).backward()
        optimizer.step()
        if (step + 1) % per_epoch == 0:
            after_each_epoch.append(_weights(model))
    return after_each_epoch


def judge_job(results: list[dict], secret: int) -> str | None:
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
        if len(r["fetched"]) != JOB_EPOCHS * shard or not all(isinstance(i, int) and 0 <= i < N_PROBE
                                                               for i in r["fetched"]):
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
    if any(r["outside_ddp"] for r in results):
        return ("some training batches went through the model itself, not through its DistributedDataParallel "
                "wrapper: every training step runs the wrapped model (wrap_model(make_model()))")
    if any(r["optimizers"] != 1 for r in results):
        return ("train() must build its optimizer once, with make_optimizer(parameters, global_batch, steps_per_epoch) "
                "returning (optimizer, scheduler): the grader swaps in its own to compare your job with one process")
    reference = reference_job(results, secret)
    if not _same(results[0]["weights"], reference[-1], 1e-5):
        return ("the trained weights are not those of one process taking the same global batches in the same order: "
                "each step is one train_step on this rank's batch of the DDP model, then scheduler.step(); no extra "
                "steps, no extra gradient averaging, no change to the gradients")
    saved = results[0]["saved"]
    for epoch, state in enumerate(saved, 1):
        if state is None:
            return (f"after epoch {epoch} of {JOB_EPOCHS} rank 0 saved no checkpoint: it saves the model's state_dict "
                    f"in checkpoint_dir as settings.checkpoint_name({epoch}) after every epoch")
        if isinstance(state, str):
            return f"the checkpoint of epoch {epoch} could not be read as a state_dict ({state})"
        if state["keys"] != results[0]["keys"]:
            return ("a checkpoint's keys are not the model's: save model.module.state_dict() (the model inside DDP, so "
                    "the keys have no 'module.' prefix)")
    for epoch, state in enumerate(saved, 1):
        if not _same(state["values"], reference[epoch - 1], 1e-5):
            return (f"the checkpoint of epoch {epoch} is not the model as it is after epoch {epoch}'s training: save "
                    f"model.module.state_dict() at the end of every epoch (not a best-so-far copy, not the final "
                    f"model under every name)")
    saves = [r["other_saves"] for r in results[1:]]
    if any(saves):
        rank = 1 + next(i for i, n in enumerate(saves) if n)
        return (f"rank {rank} saved {saves[rank - 1]} checkpoint file(s) too: only rank 0 saves, or the ranks "
                f"write the same file at once")
    return None


def judge(name: str, results: list[dict], secret: int) -> str | None:
    """The verdict on criterion ``name`` from every rank's results of a probe run with ``secret``."""
    world = len(results)
    if name == "sharding":
        return judge_sharding(results, 4 * world)
    if name == "ddp_step":
        return judge_ddp_step(results, reference_step(secret, world))
    if name == "metrics":
        return judge_metrics(results, secret)
    if name == "training_job":
        return judge_job(results, secret)
    raise ValueError(f"no criterion {name!r}; there are: {', '.join(CRITERIA)}")


# --- the notebook's check cells: both halves on the engines' own process group --------------------

def check_on_engines(name: str, ns: dict, seed: int = 0, **options) -> None:
    """Run criterion ``name`` on every engine, judge on rank 0, and fail every rank if it does not hold.

    ``ns`` is the engine's ``globals()``, where the learner's functions live. The training-job check
    swaps the engines' data and factories for tiny instrumented ones and puts them back after.
    """
    from utils.checks import Incorrect, exercise

    if name not in CRITERIA or name == "target":
        raise ValueError(f"no criterion {name!r} to check here; there are: sharding, ddp_step, metrics, training_job")
    with exercise(f"Criterion '{name}'"):
        world = dist.get_world_size()
        saved = {key: ns[key] for key in ("train_set", "test_set", "make_model", "make_optimizer") if key in ns}
        path = str(Path(options.get("folder", ".")) / f".check_job_{world}_rank{dist.get_rank()}")
        try:
            if name == "sharding" and "global_batch" in options:
                mine = rank_sharding(ns, options["global_batch"], seed)
            else:
                mine = rank_run(name, ns, seed, path)
        finally:
            ns.update(saved)
            shutil.rmtree(path, ignore_errors=True)
        results = [None] * world
        dist.all_gather_object(results, mine)
        if name == "sharding" and "global_batch" in options:
            reason = judge_sharding(results, options["global_batch"])
        else:
            reason = judge(name, results, seed)
        if reason:
            raise Incorrect(f"{name} on {world} ranks: {reason}")

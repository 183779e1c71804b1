"""Checks for labs/06_realistic_model.ipynb.

``check_job(script)`` runs the learner's torchrun script itself, as a cluster would, on a tiny problem,
with a time limit, through ``utils.checks.job_probe`` (which records what each rank called, printed,
and where its tensors lived). The job runs as two "nodes" on this machine (two torchrun agents meeting
at a c10d rendezvous: 2 processes and 1, so ``LOCAL_RANK`` differs from ``RANK`` on the second node)
that look like GPU nodes with a GPU per process (``job_probe.SimulatedGPUs``): the device each rank
picks, ``set_device``, where the model and the batches live and the host syncs are judged as a GPU job
needs them, without a GPU. Then it trains the same model in this process, one process on the same
global batches with the same dropout masks, and compares the weights the script saved, the train loss
and test accuracy it logged. Two more runs: one rank fails in a training step (the job must fail and
tear its group down), and a global batch the world size does not divide (the job must refuse it).
Each typical mistake gets its own message.

``check_buckets(ddp_bucket_bytes)`` compares the learner's buckets with those a real
``DistributedDataParallel`` all-reduces for parameters of the same sizes (``recorded_buckets``: a comm
hook on a one-rank gloo group of its own), on fixed cases that tell the typical misreadings of torch's
rule apart (MB for MiB, a default cap for an explicit one, the first bucket's limit, ``>`` for ``>=``,
the order of the parameters and of the buckets, a cap rounded to whole MiB), each with its own message,
then on random sizes (one case with the default cap, one with a cap given), which answers written in for
the fixed cases do not pass. A function that asks the check's own code, builds a DDP, changes the
check's module or the list it is given fails with its own message.
"""
from __future__ import annotations

import functools
import json
import math
import random
import re
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from . import Incorrect, NotSolved, exercise, expect, hint_for
from .. import export
from .job_probe import INJECTED, SimulatedGPUs

# The tiny problem the check trains: sizes that do not divide evenly (padding, a short last batch), and
# dropout on, so that evaluating in train mode changes the accuracy.
JOB = {"epochs": 2, "global_batch": 12, "lr": 0.05, "train_size": 100, "test_size": 60, "dropout": 0.5,
       "seed": 3}
NODES = [2, 1]              # processes on each simulated node: world size 3, LOCAL_RANK != RANK on the second
TIME_LIMIT_S = 150          # the probe caps the process group's timeout at 60 s
WEIGHT_TOLERANCE = 1e-4     # float32 sums taken in another order differ by ~1e-6 after these steps
LOG_LINE = re.compile(r"^epoch\s+(\d+)\s+train_loss\s+(\S+)\s+test_accuracy\s+(\S+)", re.MULTILINE)

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
3. Add each size to the open bucket; once the bucket holds at least its limit (the first bucket's limit
   while no bucket is closed yet, the later buckets' after), note its size and open a new bucket.
4. At the end, a bucket that is not empty is the last one. Return the sizes in the order you noted
   them: that is the order DDP all-reduces them.""",
}


hint = hint_for(HINTS)  # lab06.hint("6.1") prints that exercise's step-by-step hint


# --- running the script ---------------------------------------------------------------------------


def job_arguments(out: Path, **changes) -> list[str]:
    """The command-line arguments of the check's tiny job, as the single-process script takes them."""
    settings = {**JOB, **changes, "out": str(out)}
    return [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]


def run_job(script: Path, nproc, workdir: Path, *, fail_at: int = 0, fail_rank: int | None = None,
            gpus: bool = True, timeout: float = TIME_LIMIT_S, **changes):
    """Run ``script`` under torchrun and the probe; return (exit code or None on timeout, output, records).

    ``nproc``: processes, or a list of processes per simulated node (``export.run``). ``gpus``: each node
    looks like a GPU node with a GPU per process. ``fail_at``: the training step at which rank
    ``fail_rank`` raises. ``changes``: job settings other than ``JOB``'s."""
    probe = workdir / "probe"
    env = {"COURSE_PROBE_DIR": str(probe), "COURSE_PROBE_FAIL_AT": str(fail_at),
           "COURSE_PROBE_FAIL_RANK": "" if fail_rank is None else str(fail_rank), "COURSE_PROBE_GPUS": "1" if gpus else ""}
    result = export.run(["-m", "utils.checks.job_probe", script, *job_arguments(workdir / "out", **changes)], nproc,
                        cwd=workdir, threads=1, env=env, timeout=timeout)
    records = {}
    for path in probe.glob("rank*.json"):
        record = json.loads(path.read_text())
        records[int(record["rank"])] = record
    return result.code, result.output, records


# --- the reference: one process on the same global batches ----------------------------------------


def _rank_batches(n: int, world_size: int, per_rank: int, epoch: int | None, seed: int):
    """Each rank's list of index batches in one epoch, as DistributedSampler and DataLoader make them
    (``epoch`` None: set_epoch never called)."""
    from torch.utils.data import DistributedSampler

    per_rank_batches = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        if epoch is not None:
            sampler.set_epoch(epoch)
        indices = list(sampler)
        per_rank_batches.append([indices[i:i + per_rank] for i in range(0, len(indices), per_rank)])
    return per_rank_batches


def reference_run(world_size: int, *, set_epoch: bool = True, dataset=None, epochs=None) -> dict:
    """Train as the job should, in one process: each step takes all ranks' batches, each with the dropout
    masks the probe gave that rank's forward, and averages the ranks' mean losses, as DDP averages
    their gradients. ``epochs``: the value set_epoch gave each epoch (default 0, 1, ...).

    Returns the final ``state``, and per epoch the ``train_loss`` (over all samples of all ranks),
    ``rank0_loss`` (rank 0's samples only: what a log without the mean over ranks shows) and
    ``test_accuracy``.
    """
    from utils import data, models

    job = JOB
    dataset = dataset or data.load("shapes", train_size=job["train_size"], test_size=job["test_size"])
    per_rank = job["global_batch"] // world_size
    torch.manual_seed(job["seed"])
    model = models.CNN(dataset.input_shape, dropout=job["dropout"])
    optimizer = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=0.9)
    dropout = SimulatedGPUs({"eval_in_train_mode": 0}, 1, simulate=False)   # the probe's seeded masks
    history, step = [], 0
    for epoch in (epochs if epochs is not None else range(job["epochs"])):
        batches = _rank_batches(len(dataset.x_train), world_size, per_rank, epoch if set_epoch else None, job["seed"])
        total = count = rank0_total = rank0_count = 0.0
        model.train()
        for at in range(len(batches[0])):
            step += 1
            parts = []
            for r in range(world_size):
                index = torch.tensor(batches[r][at])
                dropout.training_forward, dropout.dropout_calls = step, 0
                with dropout:
                    logits = model(dataset.x_train[index])
                parts.append(F.cross_entropy(logits, dataset.y_train[index], reduction="none"))
            optimizer.zero_grad()
            torch.stack([p.mean() for p in parts]).mean().backward()
            optimizer.step()
            losses = torch.cat(parts)
            total, count = total + losses.sum().item(), count + len(losses)
            rank0_total, rank0_count = rank0_total + parts[0].sum().item(), rank0_count + len(parts[0])
        model.eval()
        with torch.no_grad():
            accuracy = (model(dataset.x_test).argmax(1) == dataset.y_test).float().mean().item()
        history.append({"train_loss": total / count, "rank0_loss": rank0_total / rank0_count,
                        "test_accuracy": accuracy})
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": history}


# --- the diagnosis --------------------------------------------------------------------------------


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _who(rec: dict) -> str:
    """A rank named as a cluster names it: its RANK, and its LOCAL_RANK on its node."""
    return f"rank {rec['rank']} (LOCAL_RANK {rec['local_rank']} on node {rec['node']})"


def _read_state(path: Path) -> dict:
    expect(path.exists(), f"6.1: no model was saved to {path.name} in the folder given by --out: rank 0 must "
                          f"save ddp_model.module.state_dict() to os.path.join(args.out, 'model.pt').")
    state = torch.load(path, map_location="cpu", weights_only=True)
    expect(isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()),
           "6.1: model.pt must hold a state_dict (a dict of tensors): save ddp_model.module.state_dict().")
    expect(not any(k.startswith("module.") for k in state),
           "6.1: the saved weights' names start with 'module.': that is the DDP wrapper's state_dict. Save "
           "ddp_model.module.state_dict(), the model inside, so the file loads into a plain model.")
    return state


def _diagnose_run(code, output: str, records: dict, nproc: int, what: str) -> None:
    """Failures visible in how the job ran, before any number is compared."""
    if "NotImplementedError" in output:
        found = re.search(r"NotImplementedError: (.*)", output)
        raise NotSolved("6.1 is not solved yet: replace the `raise NotImplementedError` in the script cell "
                        "with your code, run that cell (it rewrites the file), then this one."
                        + (f"\n  {found.group(1)}" if found else ""))
    where = f"with {nproc} processes{what}"
    _diagnose_numbers(records, nproc)
    _diagnose_devices(records)
    if code is None:
        started = sorted(r for r, rec in records.items() if rec.get("init"))
        expect(False, f"6.1: the job did not finish within {TIME_LIMIT_S} s {where}. Ranks that got through "
                      f"init_process_group: {started or 'none'}. A rank or world size written into the script "
                      f"(instead of read from torchrun's environment) makes the ranks wait for each other "
                      f"forever; so does a collective that only some ranks call.\nLast output:\n{_tail(output)}")
    errors = {rank: rec["error"] for rank, rec in sorted(records.items()) if rec["error"]}
    no_driver = [rank for rank, error in errors.items() if "NVIDIA driver" in error or "not compiled with CUDA" in error]
    expect(not no_driver, f"6.1: rank(s) {no_driver} used a GPU feature that the check's simulated GPU nodes (CPUs "
                          f"that look like GPUs) cannot run ({errors[no_driver[0]].rstrip('.') if no_driver else ''}). The exercise "
                          f"needs none beyond the device, set_device, nccl and moving the model and batches: leave "
                          f"mixed precision, CUDA streams and the like out of this script, and try them on a GPU node.")
    expect(not errors, f"6.1: the job failed {where}; rank errors: {errors}.\nLast output:\n{_tail(output)}")
    missing = sorted(set(range(nproc)) - set(records))
    expect(not missing, f"6.1: rank(s) {missing} ended without a trace {where} (killed, or the job never "
                        f"started them).\nLast output:\n{_tail(output)}")
    for rank in range(nproc):
        expect(records[rank]["init"] is not None, f"6.1: rank {rank} never called dist.init_process_group {where}.")
    # Every rank ran the script to its end (the probe writes its record then): a failure now happens at exit,
    # where a process group left open can abort the process (gloo does when its peer has gone).
    not_destroyed = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
    expect(code == 0 or not not_destroyed,
           f"6.1: the job failed at exit {where} (exit code {code}), and rank(s) {not_destroyed} never called "
           f"dist.destroy_process_group(): end the job by tearing the group down, in a finally block so it "
           f"happens even on error.")
    expect(code == 0, f"6.1: the job failed {where} (exit code {code}).\nLast output:\n{_tail(output)}")


def _diagnose_numbers(records: dict, nproc: int) -> None:
    """A rank or world size written into the script, wherever the probe saw one, LOCAL_RANK's included."""
    for rank, rec in sorted(records.items()):
        right = {"rank": rank, "world_size": nproc, "num_replicas": nproc}
        local = {"rank": int(rec["local_rank"]), "world_size": int(rec["local_world_size"]),
                 "num_replicas": int(rec["local_world_size"])}
        for what, given in [("init_process_group", rec["init"] or {})] + [
                ("its DistributedSampler", s["given"]) for s in rec["samplers"]]:
            wrong = {key: value for key, value in given.items() if key in right and value not in (None, -1) and int(value) != right[key]}
            if not wrong:
                continue
            local_numbers = all(int(value) == local[key] for key, value in wrong.items())
            expect(False, f"6.1: {_who(rec)} of {nproc} called {what} with "
                          f"{', '.join(f'{key}={value}' for key, value in wrong.items())}"
                          + (": LOCAL_RANK and LOCAL_WORLD_SIZE count the processes of one machine; on a job of "
                             "several machines the process group needs RANK and WORLD_SIZE, which count them all. "
                             "Leave them out (init_process_group reads them from torchrun's environment, and the "
                             "sampler asks the process group)." if local_numbers else
                             ": numbers written into the script. Leave them out (torchrun puts RANK and WORLD_SIZE "
                             "in the environment, and the sampler asks the process group), or use dist.get_rank() "
                             "and dist.get_world_size()."))


_PLACEMENT = {
    "input": "a batch that was never moved to the GPU: move every batch with x.to(device) (and its labels)",
    "weight": "a model whose weights are still on the CPU: move it with model.to(device) before wrapping it in DDP",
    "target": "labels left on the CPU while the model's output is on the GPU: move y with y.to(device) too",
    "all_reduce": "an all_reduce of a tensor on the CPU: nccl reduces GPU tensors only; create it on the device "
                  "(torch.zeros(2, device=device))",
    "two gpus": "tensors on two different GPUs: the model and every batch go to the same device, cuda:LOCAL_RANK",
}


def _placement_mistake(mismatch: dict) -> str:
    devices, op = mismatch["devices"], mismatch["op"]
    if op == "all_reduce":
        return _PLACEMENT["all_reduce"]
    if "cpu" not in devices:
        return _PLACEMENT["two gpus"]
    if op in ("cross_entropy", "nll_loss", "mse_loss", "eq", "__eq__"):
        return _PLACEMENT["target"] if devices[0] != "cpu" else _PLACEMENT["input"]
    return _PLACEMENT["input"] if devices[0] == "cpu" else _PLACEMENT["weight"]


_RANK_IS_NOT_LOCAL = ("RANK counts the processes of all machines; the GPU of a process is chosen by LOCAL_RANK, "
                      "its index on its own machine.")


def _diagnose_devices(records: dict) -> None:
    """What a GPU node refuses or punishes: each rank's device, set_device, the backend, where tensors live.
    Errors first (any rank), then what a rank got wrong without failing."""
    for rank, rec in sorted(records.items()):
        if rec["device_errors"]:
            asked = rec["device_errors"][0]
            expect(False, f"6.1: {_who(rec)} asked for {asked}, but its node has {rec['local_world_size']} GPU(s), "
                          f"one per local process"
                          + (f": that is its RANK. {_RANK_IS_NOT_LOCAL}" if asked == f"cuda:{rank}" else
                             f": use cuda:LOCAL_RANK (cuda:{rec['local_rank']})."))
    for rank, rec in sorted(records.items()):
        if rec["mismatches"]:
            mismatch = rec["mismatches"][0]
            expect(False, f"6.1: on a GPU node, {_who(rec)} would fail in {mismatch['op']} "
                          f"({'training' if mismatch['training'] else 'outside a training step'}) with tensors on "
                          f"{' and '.join(sorted(set(mismatch['devices'])))}: {_placement_mistake(mismatch)}.")
    for rank, rec in sorted(records.items()):
        if rec["init"] is None or rec["ddp"] == 0:
            continue
        own, backend = f"cuda:{rec['local_rank']}", rec["init"]["backend"]
        by_rank = f" (cuda:{rank}: that is its RANK. {_RANK_IS_NOT_LOCAL})" if str(rank) != rec["local_rank"] else ""
        expect(backend in ("None", "nccl") or "cuda:nccl" in backend,
               f"6.1: on a node with a GPU per process, {_who(rec)} chose the backend {backend!r}: use 'nccl', "
               f"the GPUs' own collectives (gloo is for the CPU).")
        expect(own in rec["set_device"],
               f"6.1: on a GPU node, {_who(rec)} "
               + (f"called torch.cuda.set_device with {rec['set_device']}"
                  + (by_rank if f"cuda:{rank}" in rec["set_device"] else "") if rec["set_device"] else
                  "never called torch.cuda.set_device")
               + f": call torch.cuda.set_device(local_rank) ({own}) before init_process_group, or nccl and every "
                 f"'cuda' without an index use GPU 0, the same GPU for every process of the node.")
        expect(rec["model_device"] == [own],
               f"6.1: {_who(rec)} wrapped a model whose weights were on {rec['model_device']} in DDP; on a GPU "
               f"node it belongs on {own}: model.to(device) before DistributedDataParallel"
               + (by_rank if rec["model_device"] == [f"cuda:{rank}"] else "."))
        expect(rec["device_ids"] in (None, [own]),
               f"6.1: {_who(rec)} gave DDP device_ids={rec['device_ids']}; its model is on {own}: "
               f"device_ids=[device] (or None).")


def _expected_batches(nproc: int) -> list[int]:
    """The training batch sizes of every rank over the job: its sampler's share in per-rank batches."""
    share, per_rank = math.ceil(JOB["train_size"] / nproc), JOB["global_batch"] // nproc
    return ([per_rank] * (share // per_rank) + ([share % per_rank] if share % per_rank else [])) * JOB["epochs"]


def _diagnose_calls(records: dict, nproc: int) -> list:
    """What each rank called, did and printed. Returns the epochs that set_epoch gave the sampler."""
    first = []
    for rank, rec in sorted(records.items()):
        samplers = [s for s in rec["samplers"] if s["size"] == JOB["train_size"]]
        expect(samplers, f"6.1: rank {rank} built no DistributedSampler over the training set: every rank then "
                         f"trains on all of the data (the same samples {nproc} times), not on its own share. "
                         f"Give the training DataLoader sampler=DistributedSampler(train_set, shuffle=True, "
                         f"seed=args.seed).")
        sampler = samplers[0]
        expect(sampler["shuffle"] and sampler["seed"] == JOB["seed"],
               f"6.1: the training DistributedSampler has shuffle={sampler['shuffle']}, seed={sampler['seed']}; "
               f"the job shuffles with the seed it is given: shuffle=True, seed=args.seed.")
        epochs = sampler["iterated"]
        expect(len(epochs) == JOB["epochs"] and len(set(epochs)) == len(epochs),
               f"6.1: over {JOB['epochs']} epochs, rank {rank}'s sampler was read with set_epoch values {epochs} "
               f"(set_epoch called with {sampler['epochs'] or 'nothing'}). Call sampler.set_epoch(epoch) at the "
               f"start of every epoch: without a new value every epoch visits the samples in the same order.")
        first = first if rank else epochs
        expect(epochs == first, f"6.1: rank {rank}'s sampler was read with set_epoch values {epochs}, rank 0's with "
                                f"{first}: every rank must use the same value, or their shares overlap.")
        expect(rec["ddp"] >= 1, f"6.1: rank {rank} never wrapped the model in DistributedDataParallel: nothing "
                                f"averages the gradients, and the replicas drift apart.")
    expected = _expected_batches(nproc)
    for rank, rec in sorted(records.items()):
        batches = rec["batches"]
        in_eval = rec.get("ddp_eval_with_grad", 0)
        expect(batches == expected or not in_eval,
               f"6.1: {_who(rec)} ran {len(batches)} training steps of the {len(expected)} its share needs, and "
               f"{in_eval} forward pass(es) through the DDP model with gradients on while it was in eval mode: "
               f"after evaluating, put the model back in train mode (ddp_model.train()), or the steps after the "
               f"first evaluation train without dropout.")
        expect(rec.get("train_in_eval_mode", 0) == 0,
               f"6.1: {_who(rec)} ran {rec.get('train_in_eval_mode', 0)} dropout layer(s) in eval mode inside training "
               f"steps: the model was left in eval mode after an evaluation. Call model.train() again after "
               f"evaluating (utils.train.evaluate puts back the mode it found), or every epoch after the first trains "
               f"without dropout.")
        expect(batches, f"6.1: {_who(rec)} ran no training step through the DDP model: call the wrapper "
                        f"(ddp_model(x)), not the model inside it; only the wrapper's forward prepares the "
                        f"gradients' all-reduce, and every rank must train on its own share.")
        expect(batches == expected,
               f"6.1: {_who(rec)} ran {len(batches)} training steps on {sum(batches)} samples in {JOB['epochs']} "
               f"epochs, in batches of {sorted(set(batches), reverse=True)}; with a global batch of "
               f"{JOB['global_batch']} on {nproc} processes, each rank runs {len(expected)} steps on its own "
               f"{sum(expected)} samples (its DistributedSampler's share), in batches of "
               f"{JOB['global_batch']} / {nproc} = {JOB['global_batch'] // nproc}: every rank does its part of the work.")
        expect(rec["all_reduced"] < rec["params"],
               f"6.1: {_who(rec)} all-reduced {rec['all_reduced']:,} values by hand, {rec['all_reduced'] / rec['params']:.1f} "
               f"times the model's {rec['params']:,} parameters: DDP already averages the gradients during "
               f"backward; reducing them again sends every gradient twice (and a sum not divided doubles the step).")
        expect(rec["eval_in_train_mode"] == 0,
               f"6.1: {_who(rec)} ran dropout in train mode outside a training step ({rec['eval_in_train_mode']} "
               f"time(s)): evaluate after model.eval() (and call model.train() before training again), or the test "
               f"accuracy is measured with activations dropped at random.")
        expect(rec["syncs"]["train"] < len(batches),
               f"6.1: on a GPU node, {_who(rec)} read GPU values on the host {rec['syncs']['train']} times while "
               f"training ({', '.join(rec['sync_kinds'])}) in {len(batches)} steps: each read waits until the GPU "
               f"has finished all queued work, a host sync every step. Keep the loss sum on the device and read it "
               f"once per epoch.")
    printed = {rank: len(LOG_LINE.findall(rec["printed"])) for rank, rec in records.items()}
    chatty = [rank for rank, lines in printed.items() if rank != 0 and lines]
    by_local = " (LOCAL_RANK is 0 on every node: test the global rank, dist.get_rank())" if chatty and all(
        records[rank]["local_rank"] == "0" for rank in chatty) else ""
    expect(not chatty, f"6.1: rank(s) {chatty} printed epoch lines too: log on rank 0 only "
                       f"(if rank == 0: print(...)){by_local}, or the log repeats every line {nproc} times.")
    expect(printed.get(0) == JOB["epochs"], f"6.1: rank 0 printed {printed.get(0)} epoch line(s) for "
                                            f"{JOB['epochs']} epochs; print one line per epoch, in the single-process "
                                            f"script's format: epoch E train_loss L test_accuracy A seconds S.")
    savers = sorted(rank for rank, rec in records.items() if rec["saves"])
    by_local = " (LOCAL_RANK is 0 on every node: test the global rank, dist.get_rank())" if all(
        records[rank]["local_rank"] == "0" for rank in savers if rank) and len(savers) > 1 else ""
    expect(savers == [0], f"6.1: torch.save was called on rank(s) {savers or 'none'}: rank 0 alone saves "
                          f"the checkpoint{by_local} (several processes writing one file can corrupt it).")
    not_destroyed = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
    expect(not not_destroyed, f"6.1: rank(s) {not_destroyed} never called dist.destroy_process_group(): end the "
                              f"job by tearing the group down, in a finally block so it happens even on error.")
    return first


def _compare(records: dict, state: dict, reference: dict, nproc: int) -> None:
    logged = [(int(e), float(loss), float(acc)) for e, loss, acc in LOG_LINE.findall(records[0]["printed"])]
    for (epoch, loss, accuracy), ref in zip(logged, reference["history"]):
        if abs(loss - ref["train_loss"]) > 1e-3 * max(1.0, ref["train_loss"]):
            own = abs(loss - ref["rank0_loss"]) <= 1e-3 * max(1.0, ref["rank0_loss"])
            expect(False, f"6.1: epoch {epoch}'s train_loss is {loss:.6f}, but over all {nproc} ranks' samples it is "
                          f"{ref['train_loss']:.6f}"
                          + (f" (yours is rank 0's own loss: average over ranks with dist.all_reduce of the loss sum "
                             f"and the sample count)." if own else
                             ". Sum loss * batch size and the sample counts on each rank, all_reduce both, divide."))
        expect(abs(accuracy - ref["test_accuracy"]) <= 1.5 / JOB["test_size"],
               f"6.1: epoch {epoch}'s test_accuracy is {accuracy:.4f}, but the model at that point scores "
               f"{ref['test_accuracy']:.4f} on the whole test set (in eval mode, without gradients).")
    expect(set(state) == set(reference["state"]),
           f"6.1: the saved weights have the tensors {sorted(state)}, the lab's CNN has "
           f"{sorted(reference['state'])}: save the model built by models.CNN.")
    worst_name, worst = max(((name, (state[name].float() - ref.float()).abs().max().item())
                             for name, ref in reference["state"].items()), key=lambda item: item[1])
    expect(worst <= WEIGHT_TOLERANCE,
           f"6.1: with {nproc} processes the final weights differ from one process trained on the same global "
           f"batches by up to {worst:.2e} (in {worst_name}). Each rank must take global_batch / world_size samples "
           f"per step from its DistributedSampler, all ranks start from rank 0's model (DDP broadcasts it), and "
           f"the optimizer is SGD(lr, momentum=0.9) as in the single-process script.")


def check_job(script) -> None:
    """Exercise 6.1: run the learner's torchrun script on two simulated GPU nodes (2 + 1 processes), then with
    one rank failing in a training step, then with a global batch the world size does not divide."""
    with exercise("6.1"):
        script = Path(script).resolve()
        expect(script.exists(), f"6.1: {script} does not exist yet: run the %%writefile cell above, which writes it.")
        try:
            compile(script.read_text(), str(script), "exec")
        except SyntaxError as error:
            expect(False, f"6.1: your script does not compile: line {error.lineno}: {error.msg}")
        check_training(script)
        check_one_rank_failing(script)
        check_refusal(script)


def check_training(script: Path) -> None:
    """The job on two simulated GPU nodes: how each rank ran, what it called, and its numbers."""
    from utils import data

    nproc = sum(NODES)
    with tempfile.TemporaryDirectory(prefix="lab06-check-") as folder:
        code, output, records = run_job(script, NODES, Path(folder))
        _diagnose_run(code, output, records, nproc, f" on two nodes ({' + '.join(map(str, NODES))} processes)")
        epochs = _diagnose_calls(records, nproc)
        state = _read_state(Path(folder) / "out" / "model.pt")
    dataset = data.load("shapes", train_size=JOB["train_size"], test_size=JOB["test_size"])
    _compare(records, state, reference_run(nproc, dataset=dataset, epochs=epochs), nproc)


def check_one_rank_failing(script: Path) -> None:
    """Rank 1 of 2 (on the second node) raises in its 3rd training step: the job must fail, and tear down."""
    with tempfile.TemporaryDirectory(prefix="lab06-check-") as folder:
        code, output, records = run_job(script, [1, 1], Path(folder), fail_at=3, fail_rank=1)
    expect(code is not None, f"6.1: when rank 1 alone failed in a training step ({INJECTED}), the job did "
                             f"not end within {TIME_LIMIT_S} s: the other rank kept waiting. Let the error "
                             f"end the process, and tear the group down in a finally block.")
    expect(code != 0, f"6.1: a training step that raises on one rank ({INJECTED}) must make the job fail, "
                      f"but it exited with {code}: do not swallow errors.")
    left = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
    expect(not left, f"6.1: when a training step raised on rank 1, rank(s) {left} never called "
                     f"dist.destroy_process_group(): put the training in try: ... finally: "
                     f"dist.destroy_process_group().")


# Divisible by 2 and 4 (the lab's world sizes) but not by 3: a test written for a world size of 2 or 4, or for
# LOCAL_WORLD_SIZE (2 on the first node), lets this batch through.
REFUSED_BATCH = 20


def check_refusal(script: Path) -> None:
    """A global batch that the 3 processes of two nodes cannot share equally: the job must stop before training."""
    batch, nproc = REFUSED_BATCH, sum(NODES)
    with tempfile.TemporaryDirectory(prefix="lab06-check-") as folder:
        code, output, records = run_job(script, NODES, Path(folder), global_batch=batch)
    trained = sorted(rank for rank, rec in records.items() if rec["batches"])
    expect(code not in (0, None) and not trained,
           f"6.1: a global batch of {batch} does not divide among {nproc} processes, but your job "
           + (f"trained on rank(s) {trained}" if trained else f"ended with exit code {code}")
           + ": refuse it before training, with an error that says to use a multiple of the world size "
             "(raise SystemExit(...)); dropping the remainder silently changes the batch the learning rate "
             "was chosen for.")


# --- Exercise 6.2: DDP's buckets ------------------------------------------------------------------
#
# The rule is torch's, read in torch/nn/parallel/distributed.py (torch 2.14): _BucketCapacityConfig.create
# gives the first bucket dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) only when bucket_cap_mb is None (the
# default), and the cap itself when bucket_cap_mb is given; _MB_TO_BYTES is 1024 * 1024. The check does
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


def _rule(param_bytes, bucket_cap_mb=None, *, unit=MiB, first="cap", order="backward", close="at least",
          whole_mib=None, listed="in order", small_buckets=1, later_default=25):
    """Buckets by the rule torch applies, or by a typical misreading of it (the keywords), used only to
    name a wrong answer's mistake; what is right is what ``recorded_buckets`` records."""
    _OWN_CALLS[0] += 1
    if bucket_cap_mb is None:
        limits = ((25 if first == "25 MiB" else 1) * unit, later_default * unit)
    else:
        cap = int(({"down": math.floor, "up": math.ceil}[whole_mib](bucket_cap_mb) if whole_mib else bucket_cap_mb)
                  * unit)
        limits = ({"cap": cap, "1 MiB": unit, "min": min(unit, cap), "25 MiB": cap}[first], cap)
    buckets, size = [], 0
    for nbytes in (reversed(param_bytes) if order == "backward" else param_bytes):
        limit = limits[0 if len(buckets) < small_buckets else 1]
        if close == "before overflow" and size and size + nbytes > limit:
            buckets.append(size)
            size = 0
        size += nbytes
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
    # A gradient larger than the cap goes into the bucket that it overflows.
    ("bucket_cap_mb=2, a gradient larger than the cap", [4 * 20_000, 3 * MiB, 4 * 300_000, MiB, 4 * 200_000], 2),
    # Default cap, 3 MB after a first bucket of exactly 1 MiB: one bucket of 25 MiB's limit holds it all; 1 MiB
    # limits after the first would close it at 1.2 MB.
    ("default cap, 3 MB after the first bucket", [600_000] * 5 + [MiB], None),
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

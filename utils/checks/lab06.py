"""Checks for labs/06_realistic_model.ipynb.

``check_job(script)`` runs the learner's torchrun script itself, as a cluster would: 2 processes, then
3, on a tiny problem, with a time limit, through ``utils.checks.job_probe`` (which records what each
rank called and printed). It then trains the same model in this process, one process on the same
global batches, and compares: the final weights the script saved, the train loss and test accuracy it
logged. Each typical mistake gets its own message: no sampler, no ``set_epoch``, logging or saving on
every rank, metrics not averaged over ranks, no teardown (also when training fails), a rank or world
size written into the script.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from . import NotSolved, exercise, expect, show_hint
from .job_probe import INJECTED

# The tiny problem the check trains: sizes that do not divide evenly (padding, a short last batch).
JOB = {"epochs": 2, "global_batch": 12, "lr": 0.05, "train_size": 100, "test_size": 60, "dropout": 0.0,
       "seed": 3}
TIME_LIMIT_S = 180
WEIGHT_TOLERANCE = 1e-4     # float32 sums taken in another order differ by ~1e-6 after these steps
LOG_LINE = re.compile(r"^epoch\s+(\d+)\s+train_loss\s+(\S+)\s+test_accuracy\s+(\S+)", re.MULTILINE)

HINTS = {
    "6.1": """Step by step (the lab's section 1 and lab 04's sections 1, 2 and 6):
1. setup(): torchrun gives every process RANK, WORLD_SIZE and LOCAL_RANK in os.environ (and
   MASTER_ADDR/MASTER_PORT, which init_process_group reads itself). With a GPU per local process:
   torch.cuda.set_device(local_rank), backend "nccl", device cuda:local_rank; otherwise "gloo" and
   the CPU. Call dist.init_process_group(backend, timeout=...) without a rank or world size: it reads
   them from the environment. Return dist.get_rank(), dist.get_world_size() and the device.
2. The per-rank batch is the global batch divided by the world size (refuse one that does not divide).
3. DistributedSampler(train_set, shuffle=True, seed=args.seed) for the training loader, and
   sampler.set_epoch(epoch) at the start of every epoch; the loader itself does not shuffle.
4. torch.manual_seed(args.seed) before building the model, as the single-process script does; then
   DistributedDataParallel(model, device_ids=[device] on a GPU, None on the CPU).
5. The train loss of an epoch: each rank sums loss * batch size and counts samples (as tensors);
   one dist.all_reduce of the two, then divide. Evaluate as you like (rank 0 alone is fine).
6. Only rank 0 prints the epoch line and saves ddp_model.module.state_dict() to args.out/model.pt.
7. try: ... finally: dist.destroy_process_group(), so a failing step still tears the group down.""",
    "6.2": """Step by step:
1. limits = (2**20, bucket_cap_mb * 2**20): the first bucket's limit, then every other bucket's.
2. Walk param_bytes adding each size to the open bucket; once it holds at least its limit (the limit of
   bucket number len(buckets), the first or the others), append its size to the list and open a new one.
3. At the end, a bucket that is not empty is the last one.""",
}


def hint(name: str) -> None:
    """Print the step-by-step hint of exercise ``name`` (e.g. ``"6.1"``)."""
    show_hint(HINTS, name)


# --- running the script ---------------------------------------------------------------------------


def job_arguments(out: Path, **changes) -> list[str]:
    """The command-line arguments of the check's tiny job, as the single-process script takes them."""
    settings = {**JOB, **changes, "out": str(out)}
    return [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]


def run_job(script: Path, nproc: int, workdir: Path, *, fail_at: int = 0, timeout: float = TIME_LIMIT_S):
    """Run ``script`` under torchrun and the probe; return (exit code or None on timeout, output, records)."""
    probe = workdir / "probe"
    env = {**os.environ, "COURSE_PROBE_DIR": str(probe), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "COURSE_PROBE_FAIL_AT": str(fail_at)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "utils.checks.job_probe", str(script), *job_arguments(workdir / "out")]
    process = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)   # torchrun and every rank: one process group
        output, _ = process.communicate()
        code = None
    records = {}
    for path in probe.glob("rank*.json"):
        record = json.loads(path.read_text())
        records[int(record["rank"])] = record
    return code, output, records


# --- the reference: one process on the same global batches ----------------------------------------


def _rank_batches(n: int, world_size: int, per_rank: int, epoch: int, seed: int, set_epoch: bool):
    """Each rank's list of index batches in one epoch, as DistributedSampler and DataLoader make them."""
    from torch.utils.data import DistributedSampler

    per_rank_batches = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        if set_epoch:
            sampler.set_epoch(epoch)
        indices = list(sampler)
        per_rank_batches.append([indices[i:i + per_rank] for i in range(0, len(indices), per_rank)])
    return per_rank_batches


def reference_run(world_size: int, *, set_epoch: bool = True, dataset=None) -> dict:
    """Train as the job should, in one process: each step takes all ranks' batches together.

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
    history = []
    for epoch in range(job["epochs"]):
        batches = _rank_batches(len(dataset.x_train), world_size, per_rank, epoch, job["seed"], set_epoch)
        total = count = rank0_total = rank0_count = 0.0
        model.train()
        for step in range(len(batches[0])):
            parts = [torch.tensor(batches[r][step]) for r in range(world_size)]
            index = torch.cat(parts)
            losses = F.cross_entropy(model(dataset.x_train[index]), dataset.y_train[index], reduction="none")
            optimizer.zero_grad()
            losses.mean().backward()     # equal shards: the mean of the ranks' mean gradients
            optimizer.step()
            total, count = total + losses.sum().item(), count + len(index)
            rank0_total, rank0_count = rank0_total + losses[:len(parts[0])].sum().item(), rank0_count + len(parts[0])
        model.eval()
        with torch.no_grad():
            accuracy = (model(dataset.x_test).argmax(1) == dataset.y_test).float().mean().item()
        history.append({"train_loss": total / count, "rank0_loss": rank0_total / rank0_count,
                        "test_accuracy": accuracy})
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": history}


# --- the diagnosis --------------------------------------------------------------------------------


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


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
    if code is None:
        started = sorted(r for r, rec in records.items() if rec.get("init"))
        expect(False, f"6.1: the job did not finish within {TIME_LIMIT_S} s {where}. Ranks that got through "
                      f"init_process_group: {started or 'none'}. A rank or world size written into the script "
                      f"(instead of read from torchrun's environment) makes the ranks wait for each other "
                      f"forever; so does a collective that only some ranks call.\nLast output:\n{_tail(output)}")
    _diagnose_numbers(records, nproc)
    errors = {rank: rec["error"] for rank, rec in sorted(records.items()) if rec["error"]}
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
    """A rank or world size written into the script as a number, wherever the probe saw one."""
    for rank, rec in sorted(records.items()):
        right = {"rank": rank, "world_size": nproc, "num_replicas": nproc}
        for what, given in [("init_process_group", rec["init"] or {})] + [
                ("its DistributedSampler", s["given"]) for s in rec["samplers"]]:
            wrong = {key: value for key, value in given.items() if key in right and value not in (None, -1) and int(value) != right[key]}
            expect(not wrong, f"6.1: rank {rank} of {nproc} called {what} with "
                              f"{', '.join(f'{key}={value}' for key, value in wrong.items())}: numbers written into "
                              f"the script. Leave them out (torchrun puts RANK and WORLD_SIZE in the environment, "
                              f"and the sampler asks the process group), or use dist.get_rank() and "
                              f"dist.get_world_size().")


def _diagnose_calls(records: dict, nproc: int) -> None:
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
        expect(sampler["epochs"] == list(range(JOB["epochs"])),
               f"6.1: rank {rank} called set_epoch with {sampler['epochs'] or 'nothing'} over {JOB['epochs']} epochs. "
               f"Call sampler.set_epoch(epoch) at the start of every epoch: without it every epoch visits the "
               f"samples in the same order.")
        expect(rec["ddp"] >= 1, f"6.1: rank {rank} never wrapped the model in DistributedDataParallel: nothing "
                                f"averages the gradients, and the replicas drift apart.")
    printed = {rank: len(LOG_LINE.findall(rec["printed"])) for rank, rec in records.items()}
    chatty = [rank for rank, lines in printed.items() if rank != 0 and lines]
    expect(not chatty, f"6.1: rank(s) {chatty} printed epoch lines too: log on rank 0 only "
                       f"(if rank == 0: print(...)), or the log repeats every line {nproc} times.")
    expect(printed.get(0) == JOB["epochs"], f"6.1: rank 0 printed {printed.get(0)} epoch line(s) for "
                                            f"{JOB['epochs']} epochs; print one line per epoch, in the single-process "
                                            f"script's format: epoch E train_loss L test_accuracy A seconds S.")
    savers = sorted(rank for rank, rec in records.items() if rec["saves"])
    expect(savers == [0], f"6.1: torch.save was called on rank(s) {savers or 'none'}: rank 0 alone saves "
                          f"the checkpoint (several processes writing one file can corrupt it).")
    not_destroyed = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
    expect(not not_destroyed, f"6.1: rank(s) {not_destroyed} never called dist.destroy_process_group(): end the "
                              f"job by tearing the group down, in a finally block so it happens even on error.")


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
    """Exercise 6.1: run the learner's torchrun script at 2 and 3 processes, and once with a failing step."""
    from utils import data

    with exercise("6.1"):
        script = Path(script).resolve()
        expect(script.exists(), f"6.1: {script} does not exist yet: run the %%writefile cell above, which writes it.")
        try:
            compile(script.read_text(), str(script), "exec")
        except SyntaxError as error:
            expect(False, f"6.1: your script does not compile: line {error.lineno}: {error.msg}")
        dataset = data.load("shapes", train_size=JOB["train_size"], test_size=JOB["test_size"])
        for nproc in (2, 3):
            with tempfile.TemporaryDirectory(prefix="lab06-check-") as folder:
                code, output, records = run_job(script, nproc, Path(folder))
                _diagnose_run(code, output, records, nproc, "")
                _diagnose_calls(records, nproc)
                state = _read_state(Path(folder) / "out" / "model.pt")
                reference = reference_run(nproc, dataset=dataset)
                if nproc == 3:
                    worst = max((state[k].float() - v).abs().max().item() for k, v in reference["state"].items()
                                if k in state)
                    expect(worst <= WEIGHT_TOLERANCE, f"6.1: your job is right with 2 processes but not with 3 "
                                                      f"(weights differ by up to {worst:.2e}): a number 2 written "
                                                      f"where the world size belongs? Use dist.get_world_size().")
                _compare(records, state, reference, nproc)
        with tempfile.TemporaryDirectory(prefix="lab06-check-") as folder:
            code, output, records = run_job(script, 2, Path(folder), fail_at=3)
            expect(code not in (0, None), f"6.1: a training step that raises ({INJECTED}) must make the job fail, "
                                          f"but it exited with {code}: do not swallow errors.")
            left = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
            expect(not left, f"6.1: when a training step raised, rank(s) {left} never called "
                             f"dist.destroy_process_group(): put the training in try: ... finally: "
                             f"dist.destroy_process_group().")


# --- Exercise 6.2: DDP's buckets ------------------------------------------------------------------


def _torch_buckets(param_bytes: list[int], bucket_cap_mb: float) -> list[int]:
    """What torch's own bucket assignment makes of these sizes (float32 tensors of those sizes)."""
    import torch.distributed as dist

    tensors = [torch.empty(n // 4) for n in param_bytes]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, [2 ** 20, int(bucket_cap_mb * 2 ** 20)])
    return [sum(param_bytes[i] for i in bucket) for bucket in indices]


BUCKET_CASES = [
    ("one small model", [4 * 1290, 4 * 128, 4 * 36864, 4 * 32, 4 * 4608, 4 * 16, 4 * 144], 25.0),
    ("a parameter of exactly 1 MiB first", [2 ** 20, 4 * 10, 4 * 10], 25.0),
    ("a parameter larger than the cap", [4 * 100, 12 * 2 ** 20, 4 * 100, 4 * 100], 5.0),
    ("many 0.4 MiB parameters", [int(0.4 * 2 ** 20) // 4 * 4] * 12, 1.0),
    ("the cap reached exactly", [2 ** 20, 2 ** 21, 2 ** 21, 4 * 3], 4.0),
]


def check_buckets(ddp_bucket_bytes) -> None:
    """Exercise 6.2: bucket sizes against torch's own ``_compute_bucket_assignment_by_size``."""
    with exercise("6.2"):
        for label, sizes, cap in BUCKET_CASES:
            want = _torch_buckets(sizes, cap)
            got = ddp_bucket_bytes(list(sizes), bucket_cap_mb=cap)
            expect(isinstance(got, (list, tuple)) and all(isinstance(n, int) for n in got),
                   f"6.2: return a list of whole numbers of bytes, one per bucket; got {got!r}")
            got = list(got)
            expect(sum(got) == sum(sizes), f"6.2 ({label}): your buckets hold {sum(got)} bytes in all, the "
                                           f"gradients {sum(sizes)}: every gradient goes into exactly one bucket.")
            if got != want and len(got) == len(want) + 1 and got[:len(want) - 1] == want[:len(want) - 1]:
                expect(False, f"6.2 ({label}, cap {cap} MiB): you made {got}, DDP makes {want}: a bucket is closed "
                              f"as soon as it holds *at least* its limit (the gradient that crosses it goes in too), "
                              f"not before it would overflow.")
            if got != want and got and want and got[0] != want[0]:
                expect(False, f"6.2 ({label}, cap {cap} MiB): your first bucket holds {got[0]} bytes, DDP's "
                              f"{want[0]}: the first bucket's limit is 1 MiB (2**20 bytes) whatever the cap, so the "
                              f"last layers' gradients start travelling early.")
            expect(got == want, f"6.2 ({label}, cap {cap} MiB, gradient sizes {sizes}): you made buckets of {got} "
                                f"bytes, DDP makes {want}.")

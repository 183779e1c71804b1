"""Checks for labs/06_realistic_model.ipynb.

``check_job(script)`` runs the learner's torchrun script itself, as a cluster would: 2 processes, then
3, on a tiny problem, with a time limit, through ``utils.checks.job_probe`` (which records what each
rank called and printed). It then trains the same model in this process, one process on the same
global batches, and compares: the final weights the script saved, the train loss and test accuracy it
logged. Each typical mistake gets its own message: no sampler, no ``set_epoch``, logging or saving on
every rank, metrics not averaged over ranks, no teardown (also when training fails), a rank or world
size written into the script.

``check_buckets(ddp_bucket_bytes)`` compares the learner's buckets with those a real
``DistributedDataParallel`` all-reduces for parameters of the same sizes (``recorded_buckets``: a comm
hook on a one-rank gloo group of its own), on fixed cases that tell the typical misreadings of torch's
rule apart (MB for MiB, a default cap for an explicit one, the first bucket's limit, ``>`` for ``>=``,
the order of the parameters and of the buckets, a cap rounded to whole MiB), each with its own message,
then on random sizes, which answers written in for the fixed cases do not pass.
"""
from __future__ import annotations

import functools
import json
import random
import re
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from . import Incorrect, NotSolved, exercise, expect, hint_for
from .. import export
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


def run_job(script: Path, nproc: int, workdir: Path, *, fail_at: int = 0, timeout: float = TIME_LIMIT_S):
    """Run ``script`` under torchrun and the probe; return (exit code or None on timeout, output, records)."""
    probe = workdir / "probe"
    result = export.run(["-m", "utils.checks.job_probe", script, *job_arguments(workdir / "out")], nproc, cwd=workdir,
                        threads=1, env={"COURSE_PROBE_DIR": str(probe), "COURSE_PROBE_FAIL_AT": str(fail_at)},
                        timeout=timeout)
    records = {}
    for path in probe.glob("rank*.json"):
        record = json.loads(path.read_text())
        records[int(record["rank"])] = record
    return result.code, result.output, records


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
    if _GROUP is None:
        store = dist.HashStore()
        group = dist.ProcessGroup(store, 0, 1)
        group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                                dist.ProcessGroupGloo(store, 0, 1))
        _GROUP = group
    return _GROUP


_GROUP = None


class _SizedParameters(torch.nn.Module):
    """float32 parameters of the given sizes in bytes, used by forward in the order they are defined
    (as the layers of a network are), so backward produces their gradients last to first."""

    def __init__(self, param_bytes):
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
          whole_mib=False, listed="in order"):
    """Buckets by the rule torch applies, or by a typical misreading of it (the keywords), used only to
    name a wrong answer's mistake; what is right is what ``recorded_buckets`` records."""
    _RULE_CALLS[0] += 1
    if bucket_cap_mb is None:
        limits = ((25 if first == "25 MiB" else 1) * unit, 25 * unit)
    else:
        cap = int((int(bucket_cap_mb) if whole_mib else bucket_cap_mb) * unit)
        limits = ({"cap": cap, "1 MiB": unit, "min": min(unit, cap), "25 MiB": cap}[first], cap)
    buckets, size = [], 0
    for nbytes in (reversed(param_bytes) if order == "backward" else param_bytes):
        limit = limits[min(len(buckets), 1)]
        if close == "before overflow" and size and size + nbytes > limit:
            buckets.append(size)
            size = 0
        size += nbytes
        if size >= limit if close == "at least" else size > limit if close == "above" else False:
            buckets.append(size)
            size = 0
    buckets += [size] if size else []
    return buckets[::-1] if listed == "reversed" else buckets


_RULE_CALLS = [0]


def _own_calls() -> tuple:
    """How often the check's own answers have been asked for: DDP's recording, and its reading of the rule."""
    info = _recorded.cache_info()
    return info.hits + info.misses, _RULE_CALLS[0]


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
    ("cap rounded to whole MiB", dict(whole_mib=True),
     "your limit looks rounded to a whole number of MiB: bucket_cap_mb may be a fraction (0.5 MiB is "
     "524,288 bytes), and DDP converts it to bytes before rounding."),
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
]
RANDOM_CAPS = [None, None, 0.25, 0.5, 0.75, 1, 1.5, 2]   # multiples of 1/8 MiB: whole bytes


def _random_case(rng: random.Random):
    n = rng.randint(4, 9)
    sizes = [4 * rng.randint(1_000, 400_000) for _ in range(n)]
    return "random sizes", sizes, rng.choice(RANDOM_CAPS)


def _answer(ddp_bucket_bytes, sizes, cap) -> list[int]:
    """The learner's buckets for one case, checked for their form."""
    before = _own_calls()
    try:
        got = ddp_bucket_bytes(list(sizes), bucket_cap_mb=cap)
    except TypeError as error:
        if cap is None:
            raise Incorrect(f"6.2: called with bucket_cap_mb=None, your function raised TypeError: {error}. "
                            f"None means the cap was left at DDP's default (as in DistributedDataParallel's "
                            f"own signature), whose buckets differ from any cap given explicitly.") from error
        raise
    expect(_own_calls() == before, "6.2: your function asked the check's own code for the answer (its "
                                   "recording of DDP's buckets, or its reading of the rule): compute the "
                                   "buckets from the sizes and the rule in the text.")
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
    records them), on fixed cases that tell the typical mistakes apart, then on a random one."""
    with exercise("6.2"):
        answers = [_answer(ddp_bucket_bytes, sizes, cap) for _, sizes, cap in BUCKET_CASES]
        _judge(BUCKET_CASES, answers)
        label, sizes, cap = _random_case(random.Random())
        got = _answer(ddp_bucket_bytes, sizes, cap)
        want = recorded_buckets(sizes, cap)
        _judge([(label, sizes, cap)], [got],
               " Your answers were DDP's on every fixed case but not on these random sizes: answers written "
               "in for the fixed cases, rather than computed from the sizes and the cap, fail here.")
        print(f"  checked against the buckets of a real DistributedDataParallel (recorded by a comm hook) on "
              f"{len(BUCKET_CASES)} fixed cases and one random one ({len(sizes)} gradients, "
              f"bucket_cap_mb={cap}: {len(want)} bucket(s))")

"""The check of a learner's torchrun training job: lab 06's exercise 6.1 and the assessment's job.

``JobCheck(label, job, ...)`` runs the learner's script itself, as a cluster would, on a tiny problem, with
a time limit, through ``utils.checks.job.probe`` (which records what each rank called, printed, and where
its tensors lived). The job runs as two "nodes" on this machine (two torchrun agents meeting at a c10d
rendezvous: 2 processes and 1, so ``LOCAL_RANK`` differs from ``RANK`` on the second node) that look like
GPU nodes with a GPU per process (``probe.SimulatedGPUs``): the device each rank picks, ``set_device``,
where the model and the batches live and the host syncs are judged as a GPU job needs them, without a
GPU. Then it trains the same model in this process, one process on the same global batches with the same
dropout masks and the same optimizer steps, and compares the weights the script saved, the train loss and
test accuracy it logged. Two more runs: one rank fails in a training step (the job must fail and tear its
group down), and a global batch the world size does not divide (every rank must refuse it). Each typical
mistake gets its own message.

The optimizer the reference uses is either fixed (``SGD(lr, momentum=0.9)``, what lab 06's script keeps
from its single-process version) or "replayed": the probe records every ``optimizer.step()`` (the
``torch.optim`` or ``utils.optim`` class, each parameter group's settings at that step, which a scheduler changes), and the
reference takes the same steps, so a job that chooses its own optimizer and schedule is still compared
with one process exactly.

The run (``run_job``) and the judgement (``judge_training`` and the other ``judge_*``) are separate, so
that a grader can run the job in a sandbox and judge what comes back in a process of its own.
"""
from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import torch
import torch.nn.functional as F

from utils.checks import NotSolved, exercise, expect
from utils import export
from utils.checks.job.probe import EPOCH_LINE as LOG_LINE, INJECTED, SimulatedGPUs

TIME_LIMIT_S = 150          # the probe caps the process group's timeout at 60 s
WEIGHT_TOLERANCE = 1e-4     # float32 sums taken in another order (3 ranks' all-reduce) differ by ~1e-7 after these steps
# The logged train loss, relative (absolute below 1): the job's arithmetic matches the reference's to ~1e-7 and the log's
# 6 decimals round by 5e-7, while a mean of per-batch means is off by 4e-4 to 4e-3 in these jobs (the last batch of an
# epoch is smaller); 1e-3 let some of those through.
LOSS_TOLERANCE = 1e-4
FIXED_OPTIMIZER = "fixed"       # SGD(lr, momentum=0.9), as the single-process script has it
REPLAYED_OPTIMIZER = "replayed"  # the optimizer steps the probe recorded, taken again by the reference
# Host reads of GPU values a rank may make per epoch, counted by the training steps after which it read any (reads
# between the same two steps count once: the loss sum and the count read one after the other wait for the GPU
# once). One or two per epoch (the log line, a progress line) cost nothing next to an epoch of steps; a read every
# few steps makes the GPU idle that often. Lab 06's tiny job has 9 steps per epoch and rank, so a read every 4th
# step or more often exceeds this on any rank (a job of shorter epochs could not tell the two apart).
SYNC_POINTS_PER_EPOCH = 2
# The simulated nodes meet at a loopback address other than 127.0.0.1 (Linux routes all of 127.0.0.0/8 to the
# loopback; macOS has only 127.0.0.1), so that a script that writes the rendezvous address in, instead of
# leaving it to torchrun's MASTER_ADDR, is seen doing so.
SIMULATED_HOST = "127.0.0.2" if sys.platform.startswith("linux") else "127.0.0.1"


# --- the reference: one process on the same global batches ----------------------------------------


def _average_as_ddp(rank_losses: list, parameters: list) -> None:
    """Set each parameter's gradient to the ranks' average the way DDP computes it: each rank's gradient of its
    own mean loss, scaled by 1 / world size, then summed (DDP's Reducer multiplies each gradient by 1 / the
    process group's size as it copies it into its bucket, before the all-reduce sums the buckets). Another order
    of the same arithmetic, e.g. one backward through the mean of the ranks' means, differs by rounding on 3 ranks
    (1/3 is not exact), and at about 1 seed in 100 of the tiny job a max-pooling or ReLU decision flipped by that
    rounding moved the final weights by up to 9e-4; in DDP's order the real 3-process job agreed to 3e-8. The
    all-reduce may add the three terms in another order (a ring starts each chunk at another rank): over 300
    seeds, the two orders' final weights differed by at most 1.7e-5, inside WEIGHT_TOLERANCE."""
    scale = 1.0 / len(rank_losses)
    grads = [torch.autograd.grad(losses.mean(), parameters) for losses in rank_losses]
    for i, parameter in enumerate(parameters):
        total = grads[0][i] * scale
        for rank_grads in grads[1:]:
            total = total + rank_grads[i] * scale
        parameter.grad = total


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


# --- the diagnosis --------------------------------------------------------------------------------


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _epoch_lines(rec: dict) -> str:
    """The epoch lines a rank printed (all of them, however much else it printed; the probe keeps them apart)."""
    return rec.get("epoch_lines", rec["printed"])


def _who(rec: dict) -> str:
    """A rank named as a cluster names it: its RANK, and its LOCAL_RANK on its node."""
    return f"rank {rec['rank']} (LOCAL_RANK {rec['local_rank']} on node {rec['node']})"


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


def _ending(rec: dict | None) -> str:
    """How a rank that did not refuse a batch on its own ended, from its record."""
    if rec is None:
        return "left no record (stopped from outside)"
    # gloo's source path left out; the text cut first (the pattern is quadratic in runs of "[")
    error = re.sub(r"\[[^\]]*:\d+\] ?", "", str(rec["error"] or "")[:2000]).split(". ")[0][:100]
    trained = f"went on to train ({len(rec['batches'])} step(s)) and " if rec["batches"] else ""
    if rec.get("peer_lost"):
        return trained + ("timed out waiting for its peers" if "timed out" in error.lower() else
                          "ended with a communication error, its peers gone") + f" ({error})"
    return trained + "ended without refusing it" + (f" ({error})" if error else "")


def _optimizer_class(name: str):
    """The optimizer class a step record names: one of torch.optim's or of the course's ``utils.optim`` (LARS,
    LAMB, NovoGrad), which the reference can take again; None for any other."""
    from utils import optim as course_optimizers

    module, _, qualname = name.rpartition(".")
    if module.startswith("torch.optim"):
        found = getattr(torch.optim, qualname, None)
        if found is torch.optim.LBFGS:   # its closure runs the model up to max_iter times in one step: steps would
            return None                  # not be the time to the target, nor the same for every submission
        if found in (torch.optim.Optimizer, torch.optim.SparseAdam):   # the base class steps nothing; SparseAdam
            return None                                                 # needs sparse gradients, which DDP never gives
    elif module == "utils.optim":
        found = getattr(course_optimizers, qualname, None)
    else:
        return None
    return found if isinstance(found, type) and issubclass(found, torch.optim.Optimizer) else None


def _plain_setting(key: str, value) -> bool:
    """A recorded optimizer setting the replay can take as given: a finite number (a learning rate not below 0), a
    flag, None, a short name, or a short tuple of finite numbers (Adam's betas)."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e12   # NaN compares False
    if value is None or isinstance(value, bool) or (isinstance(value, str) and len(value) <= 40):
        return True
    if isinstance(value, list):
        return len(value) <= 4 and all(number(v) for v in value)
    return number(value) and (key != "lr" or value >= 0)


def _settings_of(step: dict) -> str:
    """A step's settings as a learner reads them: a group's, or each group's."""
    settings = [{k: v for k, v in group["settings"].items() if k in ("lr", "momentum", "weight_decay", "betas")}
                for group in step["groups"]]
    return str(settings[0] if len(settings) == 1 else settings)


class _Replay:
    """The optimizer steps a rank recorded, taken again on ``model``: the same class and parameter groups,
    each step with the settings (learning rate, momentum, ...) that were in force when the rank took it."""

    def __init__(self, model, steps: list):
        params = list(model.parameters())
        first = steps[0]
        groups = [{**self._settings(group), "params": [params[i] for i in group["params"]]} for group in first["groups"]]
        # every group carries its own settings; lr is given too because some optimizers require it (utils.optim's)
        self.optimizer = _optimizer_class(first["class"])(groups, lr=groups[0]["lr"])
        self.steps, self.taken = steps, 0

    # How an optimizer runs, not what it computes: a GPU run's capturable or fused Adam is replayed on the CPU
    IMPLEMENTATION = {"capturable": False, "fused": None, "foreach": None, "differentiable": False}

    @classmethod
    def _settings(cls, group: dict) -> dict:
        settings = {key: tuple(value) if isinstance(value, list) else value for key, value in group["settings"].items()}
        return {**settings, **{key: value for key, value in cls.IMPLEMENTATION.items() if key in settings}}

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        record = self.steps[min(self.taken, len(self.steps) - 1)]
        self.taken += 1
        for group, recorded in zip(self.optimizer.param_groups, record["groups"]):
            group.update(self._settings(recorded))
        self.optimizer.step()


class JobCheck:
    """The check of one exercise's torchrun job (see the module's docstring).

    ``job``: the tiny problem's settings, passed to the script as ``--key=value`` options (``epochs``,
    ``global_batch``, ``lr``, ``train_size``, ``test_size``, ``dropout``, ``seed``, and any other the script
    takes, such as ``difficulty``). ``saved``: the file rank 0 writes in ``--out``, read after the last
    epoch (with ``checkpoint_every_epoch``, rank 0 saves a file of its own after every epoch, this the last).
    ``nodes``: processes per simulated node. ``refused_batch``: a global batch the world size does
    not divide. ``optimizer``: ``FIXED_OPTIMIZER`` or ``REPLAYED_OPTIMIZER``."""

    def __init__(self, label: str, job: dict, *, saved: str = "model.pt", nodes=(2, 1), refused_batch: int = 20,
                 optimizer: str = FIXED_OPTIMIZER, checkpoint_every_epoch: bool = False):
        self.label, self.job, self.saved = label, dict(job), saved
        self.checkpoint_every_epoch = checkpoint_every_epoch
        self.nodes, self.refused_batch, self.optimizer = list(nodes), refused_batch, optimizer

    def job_arguments(self, out: Path, **changes) -> list[str]:
        """The command-line arguments of the check's tiny job, as the single-process script takes them."""
        settings = {**self.job, **changes, "out": str(out)}
        return [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]

    def run_job(self, script: Path, nproc, workdir: Path, *, fail_at: int = 0, fail_rank: int | None = None,
                gpus: bool = True, timeout: float = TIME_LIMIT_S, **changes):
        """Run ``script`` under torchrun and the probe; return (exit code or None on timeout, output, records).

        ``nproc``: processes, or a list of processes per simulated node (``export.run``). ``gpus``: each node
        looks like a GPU node with a GPU per process. ``fail_at``: the training step at which rank
        ``fail_rank`` raises. ``changes``: job settings other than ``self.job``'s. A global batch that the
        processes cannot share equally is a refusal run (the probe's ``COURSE_PROBE_REFUSAL``): every rank's
        end is recorded before any exits, and collectives time out sooner."""
        probe = workdir / "probe"
        processes = nproc if isinstance(nproc, int) else sum(nproc)
        refusal = changes.get("global_batch", self.job["global_batch"]) % processes != 0
        env = {"COURSE_PROBE_DIR": str(probe), "COURSE_PROBE_FAIL_AT": str(fail_at),
               "COURSE_PROBE_FAIL_RANK": "" if fail_rank is None else str(fail_rank), "COURSE_PROBE_GPUS": "1" if gpus else "",
               "COURSE_PROBE_REFUSAL": "1" if refusal else ""}
        result = export.run(["-m", "utils.checks.job.probe", script, *self.job_arguments(workdir / "out", **changes)], nproc,
                            cwd=workdir, threads=1, env=env, timeout=timeout, host=SIMULATED_HOST)
        records = {}
        for path in probe.glob("rank*.json"):
            record = json.loads(path.read_text())
            records[int(record["rank"])] = record
        return result.code, result.output, records

    def dataset(self):
        """The tiny problem's images, as the script loads them (rendered once per check: about a second each)."""
        from utils import data

        if getattr(self, "_dataset", None) is not None:
            return self._dataset
        options = {"difficulty": self.job["difficulty"]} if "difficulty" in self.job else {}
        self._dataset = data.load(self.job.get("dataset", "shapes"), train_size=self.job["train_size"],
                                  test_size=self.job["test_size"], **options)
        return self._dataset

    def reference_run(self, world_size: int, *, set_epoch: bool = True, dataset=None, epochs=None,
                      steps: list | None = None, drop_last: bool = False) -> dict:
        """Train as the job should, in one process: each step takes all ranks' batches, each with the dropout
        masks the probe gave that rank's forward, and averages the ranks' mean losses, as DDP averages
        their gradients. ``epochs``: the value set_epoch gave each epoch (default 0, 1, ...). ``steps``: rank
        0's recorded optimizer steps, which a replayed optimizer takes again. ``drop_last``: each rank's last
        smaller batch of an epoch left out, as a DataLoader with drop_last=True does.

        Returns the final ``state``, and per epoch the ``train_loss`` (over all samples of all ranks),
        ``rank0_loss`` (rank 0's samples only: what a log without the mean over ranks shows) and
        ``test_accuracy``.
        """
        # One thread, as each of the job's processes has (run_job): the same kernels sum in the same order, so on
        # 2 ranks the reference is the job's arithmetic to the bit. With more threads it differed by ~1e-8, and for
        # some seeds a max-pooling or ReLU decision flipped by that much grew to 2e-4 over the steps.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._reference_run(world_size, set_epoch, dataset, epochs, steps, drop_last)
        finally:
            torch.set_num_threads(threads)

    def _reference_run(self, world_size, set_epoch, dataset, epochs, steps, drop_last) -> dict:
        job = self.job
        dataset = dataset or self.dataset()
        model, stepper = self._reference_model(dataset, steps)
        dropout = SimulatedGPUs({"eval_in_train_mode": 0}, 1, simulate=False)   # the probe's seeded masks
        history, step = [], 0
        for epoch in (epochs if epochs is not None else range(job["epochs"])):
            batches = self._epoch_batches(dataset, world_size, epoch if set_epoch else None, drop_last)
            step, parts = self._train_epoch(model, stepper, dataset, batches, dropout, step)
            model.eval()
            with torch.no_grad():
                accuracy = (model(dataset.x_test).argmax(1) == dataset.y_test).float().mean().item()
            total = count = rank0_total = rank0_count = 0.0
            for ranks in parts:            # summed step by step, in float64, as the job's log lines sum them
                losses = torch.cat(ranks)
                total, count = total + losses.sum().item(), count + len(losses)
                rank0_total, rank0_count = rank0_total + ranks[0].sum().item(), rank0_count + len(ranks[0])
            history.append({"train_loss": total / count, "rank0_loss": rank0_total / rank0_count,
                            "test_accuracy": accuracy})
        return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "history": history}

    def replay_epochs(self, world_size: int, epochs: list, steps: list, drop_last: bool, starts, dataset=None):
        """The run's epochs taken again in one process, as ``reference_run`` trains (one thread, the probe's dropout
        masks, the recorded optimizer steps): epoch i starts from the weights ``starts(i)`` returns (a state_dict:
        the seed's initialisation, or the run's own checkpoint of the epoch before; None: where the replay's
        previous epoch ended), with the optimizer's state the replay reached; yields each epoch's end weights. Starting each epoch from the run's own weights keeps
        rounding from growing over the epochs: what a replayed epoch ends with differs from the run's checkpoint
        only by that epoch's own arithmetic, unless the run trained otherwise than its records show."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            dataset = dataset or self.dataset()
            model, stepper = self._reference_model(dataset, steps)
            dropout = SimulatedGPUs({"eval_in_train_mode": 0}, 1, simulate=False)
            step = 0
            for i, epoch in enumerate(epochs):
                start = starts(i)
                if start is not None:
                    model.load_state_dict(start)
                batches = self._epoch_batches(dataset, world_size, epoch, drop_last)
                step, _ = self._train_epoch(model, stepper, dataset, batches, dropout, step)
                yield {k: v.detach().clone() for k, v in model.state_dict().items()}
        finally:
            torch.set_num_threads(threads)

    def _reference_model(self, dataset, steps):
        """The course's CNN at the job's seed's initialisation, and what steps it: the recorded optimizer steps
        taken again (``REPLAYED_OPTIMIZER``) or SGD with momentum (``FIXED_OPTIMIZER``)."""
        from utils import models

        torch.manual_seed(self.job["seed"])
        model = models.CNN(dataset.input_shape, dropout=self.job["dropout"])
        if self.optimizer == REPLAYED_OPTIMIZER:
            return model, _Replay(model, steps)
        return model, torch.optim.SGD(model.parameters(), lr=self.job["lr"], momentum=0.9)

    def _epoch_batches(self, dataset, world_size: int, epoch, drop_last: bool) -> list:
        """Each rank's index batches of one epoch (``epoch``: set_epoch's value, None for never set)."""
        per_rank = self.job["global_batch"] // world_size
        batches = _rank_batches(len(dataset.x_train), world_size, per_rank, epoch, self.job["seed"])
        if drop_last:                  # a DataLoader with drop_last=True: each rank's last smaller batch left out
            batches = [[batch for batch in mine if len(batch) == per_rank] for mine in batches]
        return batches

    @staticmethod
    def _train_epoch(model, stepper, dataset, batches, dropout, step: int) -> tuple[int, list]:
        """One epoch in one process: each step takes all ranks' batches, each with the dropout masks the probe gave
        that rank's forward, and averages the ranks' gradients as DDP does. Returns the steps taken so far and, per
        step, each rank's per-sample losses."""
        model.train()
        parameters, parts_per_step = list(model.parameters()), []
        for at in range(len(batches[0])):
            step += 1
            parts = []
            for r in range(len(batches)):
                index = torch.tensor(batches[r][at])
                dropout.training_forward, dropout.dropout_calls = step, 0
                with dropout:
                    logits = model(dataset.x_train[index])
                parts.append(F.cross_entropy(logits, dataset.y_train[index], reduction="none"))
            stepper.zero_grad()
            _average_as_ddp(parts, parameters)
            stepper.step()
            parts_per_step.append([p.detach() for p in parts])
        return step, parts_per_step

    def _read_state(self, path: Path) -> dict:
        expect(path.exists(), f"{self.label}: no model was saved to {path.name} in the folder given by --out: rank 0 must "
                              f"save ddp_model.module.state_dict() to os.path.join(args.out, {self.saved!r}).")
        return torch.load(path, map_location="cpu", weights_only=True)

    def _checked_state(self, state) -> dict:
        """The saved weights, if they are a plain model's state_dict."""
        expect(isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()),
               f"{self.label}: {self.saved} must hold a state_dict (a dict of tensors): save ddp_model.module.state_dict().")
        expect(not any(k.startswith("module.") for k in state),
               f"{self.label}: the saved weights' names start with 'module.': that is the DDP wrapper's state_dict. Save "
               "ddp_model.module.state_dict(), the model inside, so the file loads into a plain model.")
        return state

    def _diagnose_run(self, code, output: str, records: dict, nproc: int, what: str) -> None:
        """Failures visible in how the job ran, before any number is compared."""
        if "NotImplementedError" in output:
            found = re.search(r"NotImplementedError: (.*)", output)
            raise NotSolved(f"{self.label} is not solved yet: replace the `raise NotImplementedError` in the script cell "
                            "with your code, run that cell (it rewrites the file), then this one."
                            + (f"\n  {found.group(1)}" if found else ""))
        where = f"with {nproc} processes{what}"
        self._diagnose_numbers(records, nproc)
        self._diagnose_rendezvous(records)
        self._diagnose_devices(records)
        self._diagnose_unequal_batches(records, nproc)
        if code is None:
            started = sorted(r for r, rec in records.items() if rec.get("init"))
            expect(False, f"{self.label}: the job did not finish within {TIME_LIMIT_S} s {where}. Ranks that got through "
                          f"init_process_group: {started or 'none'}. A rank or world size written into the script "
                          f"(instead of read from torchrun's environment) makes the ranks wait for each other "
                          f"forever; so does a collective that only some ranks call.\nLast output:\n{_tail(output)}")
        errors = {rank: rec["error"] for rank, rec in sorted(records.items()) if rec["error"]}
        no_driver = [rank for rank, error in errors.items() if "NVIDIA driver" in error or "not compiled with CUDA" in error]
        expect(not no_driver, f"{self.label}: rank(s) {no_driver} used a GPU feature that the check's simulated GPU nodes (CPUs "
                              f"that look like GPUs) cannot run ({errors[no_driver[0]].rstrip('.') if no_driver else ''}). The exercise "
                              f"needs none beyond the device, set_device, nccl and moving the model and batches: leave "
                              f"mixed precision, CUDA streams and the like out of this script, and try them on a GPU node.")
        expect(not errors, f"{self.label}: the job failed {where}; rank errors: {errors}.\nLast output:\n{_tail(output)}")
        missing = sorted(set(range(nproc)) - set(records))
        expect(not missing, f"{self.label}: rank(s) {missing} ended without a trace {where} (killed, or the job never "
                            f"started them).\nLast output:\n{_tail(output)}")
        for rank in range(nproc):
            expect(records[rank]["init"] is not None, f"{self.label}: rank {rank} never called dist.init_process_group {where}.")
        # Every rank ran the script to its end (the probe writes its record then): a failure now happens at exit,
        # where a process group left open can abort the process (gloo does when its peer has gone).
        not_destroyed = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
        expect(code == 0 or not not_destroyed,
               f"{self.label}: the job failed at exit {where} (exit code {code}), and rank(s) {not_destroyed} never called "
               f"dist.destroy_process_group(): end the job by tearing the group down, in a finally block so it "
               f"happens even on error.")
        expect(code == 0, f"{self.label}: the job failed {where} (exit code {code}).\nLast output:\n{_tail(output)}")

    def _diagnose_unequal_batches(self, records: dict, nproc: int) -> None:
        """Per-rank batches that are not global_batch / WORLD_SIZE on every rank: the ranks' steps no longer pair up,
        so DDP's collectives fail with a size mismatch or wait, and the ranks that left a record show why. A per-rank
        batch from LOCAL_WORLD_SIZE, which differs between nodes, is named as such (the rank of the one-process node,
        killed when its peers failed, may leave no record)."""
        first = {rank: rec["batches"][0] for rank, rec in sorted(records.items()) if rec.get("batches")}
        right = self.job["global_batch"] // nproc
        local = {rank: self.job["global_batch"] // int(records[rank]["local_world_size"] or 1) for rank in first}
        if first and first == local and any(size != right for size in first.values()):
            expect(False, f"{self.label}: the ranks' first training batches had {first} samples (rank: samples), "
                          f"global_batch / LOCAL_WORLD_SIZE on each: LOCAL_WORLD_SIZE counts the processes of one machine "
                          f"only, so the nodes took batches of different sizes and their steps no longer paired up. Each "
                          f"rank takes global_batch / WORLD_SIZE samples per step (dist.get_world_size() counts them "
                          f"all), {self.job['global_batch']} / {nproc} = {right} here.")
        expect(len(set(first.values())) <= 1,
               f"{self.label}: the ranks' first training batches had {first} samples (rank: samples): every rank takes "
               f"global_batch / WORLD_SIZE samples per step, {self.job['global_batch']} / {nproc} = {right} here, or "
               f"their steps no longer pair up and DDP's collectives fail or wait.")

    def _diagnose_numbers(self, records: dict, nproc: int) -> None:
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
                expect(False, f"{self.label}: {_who(rec)} of {nproc} called {what} with "
                              f"{', '.join(f'{key}={value}' for key, value in wrong.items())}"
                              + (": LOCAL_RANK and LOCAL_WORLD_SIZE count the processes of one machine; on a job of "
                                 "several machines the process group needs RANK and WORLD_SIZE, which count them all. "
                                 "Leave them out (init_process_group reads them from torchrun's environment, and the "
                                 "sampler asks the process group)." if local_numbers else
                                 ": numbers written into the script. Leave them out (torchrun puts RANK and WORLD_SIZE "
                                 "in the environment, and the sampler asks the process group), or use dist.get_rank() "
                                 "and dist.get_world_size()."))

    def _diagnose_rendezvous(self, records: dict) -> None:
        """A rendezvous address written into the script: an ``init_method`` or a ``store`` other than torchrun's
        address, or MASTER_ADDR / MASTER_PORT changed before init_process_group read them."""
        for rank, rec in sorted(records.items()):
            init = rec["init"] or {}
            master = init.get("master")
            if master is None:
                continue
            method, store, env = init.get("init_method"), init.get("store"), init.get("env_master", master)
            if store is not None:
                given, meets = f"store={store}", store
            elif method not in (None, "env://"):
                try:
                    parsed = urlsplit(method)
                    meets = f"{parsed.hostname}:{parsed.port}" if parsed.scheme == "tcp" else method
                except ValueError:
                    meets = method
                given = f"init_method={method!r}"
            else:
                given, meets = f"MASTER_ADDR:MASTER_PORT changed to {env}", env
            expect(meets == master,
                   f"{self.label}: {_who(rec)} joined the process group with {given}, but torchrun says the job meets at "
                   f"{master} (MASTER_ADDR:MASTER_PORT as torchrun set them). An address written into the script works "
                   f"while every process runs on one machine; on a cluster the other machines' processes look for it "
                   f"on their own machine. Leave init_method, store and MASTER_ADDR alone: init_process_group then "
                   f"reads torchrun's MASTER_ADDR and MASTER_PORT (env://).")

    def _diagnose_devices(self, records: dict) -> None:
        """What a GPU node refuses or punishes: each rank's device, set_device, the backend, where tensors live.
        Errors first (any rank), then what a rank got wrong without failing."""
        for rank, rec in sorted(records.items()):
            if rec["device_errors"]:
                asked = rec["device_errors"][0]
                expect(False, f"{self.label}: {_who(rec)} asked for {asked}, but its node has {rec['local_world_size']} GPU(s), "
                              f"one per local process"
                              + (f": that is its RANK. {_RANK_IS_NOT_LOCAL}" if asked == f"cuda:{rank}" else
                                 f": use cuda:LOCAL_RANK (cuda:{rec['local_rank']})."))
        for rank, rec in sorted(records.items()):
            if rec["mismatches"]:
                mismatch = rec["mismatches"][0]
                expect(False, f"{self.label}: on a GPU node, {_who(rec)} would fail in {mismatch['op']} "
                              f"({'training' if mismatch['training'] else 'outside a training step'}) with tensors on "
                              f"{' and '.join(sorted(set(mismatch['devices'])))}: {_placement_mistake(mismatch)}.")
        for rank, rec in sorted(records.items()):
            if rec["init"] is None or rec["ddp"] == 0:
                continue
            own, backend = f"cuda:{rec['local_rank']}", rec["init"]["backend"]
            by_rank = f" (cuda:{rank}: that is its RANK. {_RANK_IS_NOT_LOCAL})" if str(rank) != rec["local_rank"] else ""
            expect(backend in ("None", "nccl") or "cuda:nccl" in backend,
                   f"{self.label}: on a node with a GPU per process, {_who(rec)} chose the backend {backend!r}: use 'nccl', "
                   f"the GPUs' own collectives (gloo is for the CPU).")
            expect(own in rec["set_device"],
                   f"{self.label}: on a GPU node, {_who(rec)} "
                   + (f"called torch.cuda.set_device with {rec['set_device']}"
                      + (by_rank if f"cuda:{rank}" in rec["set_device"] else "") if rec["set_device"] else
                      "never called torch.cuda.set_device")
                   + f": call torch.cuda.set_device(local_rank) ({own}) before init_process_group, or nccl and every "
                     f"'cuda' without an index use GPU 0, the same GPU for every process of the node.")
            expect(rec["model_device"] == [own],
                   f"{self.label}: {_who(rec)} wrapped a model whose weights were on {rec['model_device']} in DDP; on a GPU "
                   f"node it belongs on {own}: model.to(device) before DistributedDataParallel"
                   + (by_rank if rec["model_device"] == [f"cuda:{rank}"] else "."))
            expect(rec["device_ids"] in (None, [own]),
                   f"{self.label}: {_who(rec)} gave DDP device_ids={rec['device_ids']}; its model is on {own}: "
                   f"device_ids=[device] (or None).")

    def _expected_batches(self, nproc: int, drop_last: bool = False) -> list[int]:
        """The training batch sizes of every rank over the job: its sampler's share in per-rank batches (with
        ``drop_last``, as a DataLoader with drop_last=True gives them: without each epoch's last smaller batch)."""
        share, per_rank = math.ceil(self.job["train_size"] / nproc), self.job["global_batch"] // nproc
        last = [share % per_rank] if share % per_rank and not drop_last else []
        return ([per_rank] * (share // per_rank) + last) * self.job["epochs"]

    def _drops_last(self, records: dict, nproc: int) -> bool:
        """Whether rank 0 left out each epoch's last smaller batch (drop_last=True), which the job may do."""
        dropped = self._expected_batches(nproc, drop_last=True)
        return dropped != self._expected_batches(nproc) and records.get(0, {}).get("batches") == dropped

    def _diagnose_calls(self, records: dict, nproc: int) -> list:
        """What each rank called, did and printed. Returns the epochs that set_epoch gave the sampler."""
        first = []
        def trained(rec):   # training steps through DDP, or optimizer steps without it
            return bool(rec["batches"] or rec.get("steps"))

        idle = sorted(rank for rank, rec in records.items() if rank and not trained(rec))
        expect(not idle or not trained(records[0]),
               f"{self.label}: rank(s) {idle} never trained (no training step, no DDP model) while rank 0 did: every "
               f"rank trains on its own share of each global batch, through the DDP wrapper, or the job is one process "
               f"doing all the work while the others wait.")
        for rank, rec in sorted(records.items()):
            samplers = [s for s in rec["samplers"] if s["size"] == self.job["train_size"]]
            sizes = sorted({s["size"] for s in rec["samplers"]})
            expect(samplers or not sizes,
                   f"{self.label}: rank {rank}'s DistributedSampler covers {' and '.join(map(str, sizes))} samples, but the "
                   f"check gave the job --train-size={self.job['train_size']}: load the data with the sizes the script is "
                   f"given (args.train_size, args.test_size), not with numbers written into it.")
            expect(samplers, f"{self.label}: rank {rank} built no DistributedSampler over the training set: every rank then "
                             f"trains on all of the data (the same samples {nproc} times), not on its own share. "
                             f"Give the training DataLoader sampler=DistributedSampler(train_set, shuffle=True, "
                             f"seed=args.seed).")
            for sampler in samplers:   # one sampler, or a new one every epoch: each shuffles with the job's seed
                expect(sampler["shuffle"] and sampler["seed"] == self.job["seed"],
                       f"{self.label}: the training DistributedSampler has shuffle={sampler['shuffle']}, seed={sampler['seed']}; "
                       f"the job shuffles with the seed it is given: shuffle=True, seed=args.seed.")
            epochs = [epoch for sampler in samplers for epoch in sampler["iterated"]]
            set_to = [epoch for sampler in samplers for epoch in sampler["epochs"]]
            expect(len(epochs) == self.job["epochs"] and len(set(epochs)) == len(epochs),
                   f"{self.label}: over {self.job['epochs']} epochs, rank {rank}'s sampler was read with set_epoch values {epochs} "
                   f"(set_epoch called with {set_to or 'nothing'}). Call sampler.set_epoch(epoch) at the "
                   f"start of every epoch: without a new value every epoch visits the samples in the same order.")
            first = first if rank else epochs
            expect(epochs == first, f"{self.label}: rank {rank}'s sampler was read with set_epoch values {epochs}, rank 0's with "
                                    f"{first}: every rank must use the same value, or their shares overlap.")
            expect(rec["ddp"] >= 1, f"{self.label}: rank {rank} never wrapped the model in DistributedDataParallel: nothing "
                                    f"averages the gradients, and the replicas drift apart.")
        expected = self._expected_batches(nproc, drop_last=self._drops_last(records, nproc))
        for rank, rec in sorted(records.items()):
            batches = rec["batches"]
            in_eval = rec.get("ddp_eval_with_grad", 0)
            expect(batches == expected or not in_eval,
                   f"{self.label}: {_who(rec)} ran {len(batches)} training steps of the {len(expected)} its share needs, and "
                   f"{in_eval} forward pass(es) through the DDP model with gradients on while it was in eval mode: "
                   f"after evaluating, put the model back in train mode (ddp_model.train()), or the steps after the "
                   f"first evaluation train without dropout.")
            expect(rec.get("train_in_eval_mode", 0) == 0,
                   f"{self.label}: {_who(rec)} ran {rec.get('train_in_eval_mode', 0)} dropout layer(s) in eval mode inside training "
                   f"steps: the model was left in eval mode after an evaluation. Call model.train() again after "
                   f"evaluating (utils.train.evaluate puts back the mode it found), or every epoch after the first trains "
                   f"without dropout.")
            expect(batches, f"{self.label}: {_who(rec)} ran no training step through the DDP model: call the wrapper "
                            f"(ddp_model(x)), not the model inside it; only the wrapper's forward prepares the "
                            f"gradients' all-reduce, and every rank must train on its own share.")
            expect(batches == expected,
                   f"{self.label}: {_who(rec)} ran {len(batches)} training steps on {sum(batches)} samples in {self.job['epochs']} "
                   f"epochs, in batches of {sorted(set(batches), reverse=True)}; with a global batch of "
                   f"{self.job['global_batch']} on {nproc} processes, each rank runs {len(expected)} steps on its own "
                   f"{sum(expected)} samples (its DistributedSampler's share), in batches of "
                   f"{self.job['global_batch']} / {nproc} = {self.job['global_batch'] // nproc} (each epoch's last batch smaller, "
                   f"unless the loader drops it with drop_last=True on every rank): every rank does its part of the work.")
            expect(rec["all_reduced"] < rec["params"],
                   f"{self.label}: {_who(rec)} all-reduced {rec['all_reduced']:,} values by hand, {rec['all_reduced'] / rec['params']:.1f} "
                   f"times the model's {rec['params']:,} parameters: DDP already averages the gradients during "
                   f"backward; reducing them again sends every gradient twice (and a sum not divided doubles the step).")
            expect(rec["eval_in_train_mode"] == 0,
                   f"{self.label}: {_who(rec)} ran dropout in train mode outside a training step ({rec['eval_in_train_mode']} "
                   f"time(s)): evaluate after model.eval() (and call model.train() before training again), or the test "
                   f"accuracy is measured with activations dropped at random.")
            points, allowed = rec.get("sync_points", {}), SYNC_POINTS_PER_EPOCH * self.job["epochs"]
            expect(len(points) <= allowed,
                   f"{self.label}: on a GPU node, {_who(rec)} read GPU values on the host {sum(points.values())} times while "
                   f"training ({', '.join(rec['sync_kinds'])}), after {len(points)} of its {len(batches)} training steps: "
                   f"each read waits until the GPU has finished all queued work (a host sync), and the GPU idles until "
                   f"the host queues more. Reads one after the other wait once; read after one or two steps per epoch at "
                   f"most (here {allowed} of the {len(batches)} steps of {self.job['epochs']} epochs): keep the loss sum on "
                   f"the device and read it once per epoch, for the log line.")
        for rank, rec in sorted(records.items()):
            changed = rec.get("weights_changed_between_steps", 0)
            expect(not isinstance(changed, int) or changed == 0,
                   f"{self.label}: {_who(rec)}'s model weights changed {changed} time(s) other than through an optimizer "
                   f"step (between two steps, or between a step and a save): train only through the DDP model and its "
                   f"optimizer, one step per batch; weights changed by hand are not the job's steps, and nothing "
                   f"keeps the replicas equal.")
        printed = {rank: len(LOG_LINE.findall(_epoch_lines(rec))) for rank, rec in records.items()}
        chatty = [rank for rank, lines in printed.items() if rank != 0 and lines]
        by_local = " (LOCAL_RANK is 0 on every node: test the global rank, dist.get_rank())" if chatty and all(
            records[rank]["local_rank"] == "0" for rank in chatty) else ""
        expect(not chatty, f"{self.label}: rank(s) {chatty} printed epoch lines too: log on rank 0 only "
                           f"(if rank == 0: print(...)){by_local}, or the log repeats every line {nproc} times.")
        self._diagnose_other_ranks_printing(records)
        expect(printed.get(0) == self.job["epochs"], f"{self.label}: rank 0 printed {printed.get(0)} epoch line(s) for "
                                                f"{self.job['epochs']} epochs; print one line per epoch, in the single-process "
                                                f"script's format: epoch E train_loss L test_accuracy A seconds S.")
        savers = sorted(rank for rank, rec in records.items() if rec["saves"])
        by_local = " (LOCAL_RANK is 0 on every node: test the global rank, dist.get_rank())" if all(
            records[rank]["local_rank"] == "0" for rank in savers if rank) and len(savers) > 1 else ""
        expect(savers == [0], f"{self.label}: torch.save was called on rank(s) {savers or 'none'}: rank 0 alone saves "
                              f"the checkpoint{by_local} (several processes writing one file can corrupt it).")
        saves = records[0]["saves"]       # counted, not their names: a save to a temporary name renamed after is fine
        expect(not self.checkpoint_every_epoch or len(saves) >= self.job["epochs"],
               f"{self.label}: rank 0 saved {len(saves)} time(s) in {self.job['epochs']} epochs "
               f"({sorted({Path(path).name for path in saves})}): save a checkpoint after every epoch, each under its own "
               f"name ({self.saved} is the last), as the run that counts is judged on consecutive epochs' checkpoints.")
        not_destroyed = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
        expect(not not_destroyed, f"{self.label}: rank(s) {not_destroyed} never called dist.destroy_process_group(): end the "
                                  f"job by tearing the group down, in a finally block so it happens even on error.")
        return first

    def _diagnose_other_ranks_printing(self, records: dict) -> None:
        """Logging is rank 0's alone: any line a rank other than 0 printed to stdout is refused, naming it. What
        torch or the check printed is not the job's (the probe keeps the job's own output apart, ``job_printed``);
        torchrun's own messages come from its agents, not from the ranks."""
        talkers = []
        for rank, rec in sorted(records.items()):
            text = rec.get("job_printed") or ""
            if rank != 0 and text:
                talkers.append((rank, rec, str(text)))
        if not talkers:
            return
        rank, rec, text = talkers[0]
        lines = text.splitlines() or [text]
        shown = next((line.strip() for line in lines if line.strip()), "")
        shown = repr(shown[:100] + ("..." if len(shown) > 100 else "")) if shown else "an empty line"
        count = rec.get("job_printed_lines")
        count = count if isinstance(count, int) and count > 0 else len(lines)
        more = f" (and {count - 1} more line(s))" if count > 1 else ""
        also = f"; rank(s) {[r for r, _, _ in talkers[1:]]} printed too" if len(talkers) > 1 else ""
        by_local = (" (LOCAL_RANK is 0 on every node: test the global rank, dist.get_rank())"
                    if all(str(r.get("local_rank")) == "0" for _, r, _ in talkers) else "")
        expect(False, f"{self.label}: rank {rank} printed {shown}{more}{also}: print from rank 0 only{by_local}. Every "
                      f"rank's stdout ends up in the job's one log, so a line printed by every rank repeats "
                      f"there once per process.")

    def _diagnose_steps(self, records: dict, nproc: int) -> list:
        """Every rank took one step of one torch.optim optimizer per batch, the same steps as rank 0, over all
        of the model's parameters. Returns rank 0's steps, which the reference takes again."""
        first = records[0]["steps"]
        for rank, rec in sorted(records.items()):
            steps, batches = rec["steps"], rec["batches"]
            expect(len(steps) == len(batches),
                   f"{self.label}: {_who(rec)} took {len(steps)} optimizer step(s) in {len(batches)} training "
                   f"batches: one optimizer.step() per batch, after backward, on every rank.")
            if not steps:
                continue
            expect(not rec.get("tampered"),
                   f"{self.label}: {_who(rec)}: {rec.get('tampered')}. Code of the script's own ran inside the optimizer's "
                   f"steps, where the check cannot tell a step's update from another: step one optimizer from torch.optim "
                   f"or utils.optim as it is, with no hooks on its steps.")
            classes = sorted({step["class"] for step in steps})
            expect(len(classes) == 1 and _optimizer_class(classes[0]) is not None,
                   f"{self.label}: {_who(rec)} stepped the optimizer(s) {classes}: use one optimizer from torch.optim "
                   f"(SGD, Adam, ...) or one of the course's own in utils.optim; the check takes the same "
                   f"steps in one process to compare.")
            groups = steps[0]["groups"]
            held = sorted(i for group in groups for i in group["params"])
            expect(held == list(range(rec.get("param_tensors", 0))),
                   f"{self.label}: {_who(rec)}'s optimizer holds parameters that are not the DDP model's, or some twice: "
                   f"give it ddp_model.parameters() (or the model's inside it).")
            odd = [str(v) for group in groups for v in group["settings"].values() if isinstance(v, str) and v.startswith("<")]
            expect(not odd, f"{self.label}: {_who(rec)}'s optimizer has settings the check cannot take again ({odd}): "
                            f"give it numbers.")
            expect(all(group["params"] for group in groups),
                   f"{self.label}: {_who(rec)}'s optimizer has parameter groups that hold no parameter: give each group "
                   f"some of the model's parameters, or use one group.")
            bad = next((f"{key}={value!r} (step {at})" for at, step in enumerate(steps) for group in step["groups"]
                        for key, value in group["settings"].items() if not _plain_setting(key, value)), None)
            expect(bad is None,
                   f"{self.label}: {_who(rec)}'s optimizer took a step with {bad}: every setting must be a finite number "
                   f"(a learning rate of 0 or more), a flag, or a short tuple of numbers (Adam's betas).")
            expect(rec.get("optimizer_steps", len(steps)) == len(steps),
                   f"{self.label}: {_who(rec)}'s record counts {rec.get('optimizer_steps')} optimizer steps but holds "
                   f"{len(steps)}: it was changed after the steps were recorded.")
            differs = next((at for at, (mine, ref) in enumerate(zip(steps, first)) if mine != ref), None)
            expect(differs is None,
                   f"{self.label}: {_who(rec)}'s optimizer step {differs} had the settings "
                   f"{_settings_of(steps[differs]) if differs is not None else ''}, rank 0's "
                   f"{_settings_of(first[differs]) if differs is not None else ''}: every rank must take the same "
                   f"steps (the same optimizer, rate and schedule), or the replicas drift apart.")
        return first

    def _compare(self, records: dict, state: dict, reference: dict, nproc: int) -> None:
        # The weights first: a wrong step makes the logged numbers differ too, and their message would send the
        # learner to the logging instead of the training.
        expect(set(state) == set(reference["state"]),
               f"{self.label}: the saved weights have the tensors {sorted(state)}, the course's CNN has "
               f"{sorted(reference['state'])}: save the model built by models.CNN.")
        worst_name, worst = max(((name, (state[name].float() - ref.float()).abs().max().item())
                                 for name, ref in reference["state"].items()), key=lambda item: item[1])
        expect(worst <= WEIGHT_TOLERANCE,
               f"{self.label}: with {nproc} processes the final weights differ from one process trained on the same global "
               f"batches by up to {worst:.2e} (in {worst_name}). Each rank must take global_batch / world_size samples "
               f"per step from its DistributedSampler, all ranks start from rank 0's model (DDP broadcasts it), and "
               + ("each rank's optimizer takes the same steps (one optimizer.step() per batch, after backward)."
                  if self.optimizer == REPLAYED_OPTIMIZER else
                  "the optimizer is SGD(lr, momentum=0.9) as in the single-process script."))
        logged = [(int(e), float(loss), float(acc)) for e, loss, acc in LOG_LINE.findall(_epoch_lines(records[0]))]
        pairs = list(zip(logged, reference["history"]))
        own = all(abs(loss - ref["rank0_loss"]) <= LOSS_TOLERANCE * max(1.0, ref["rank0_loss"]) for (_, loss, _), ref in pairs)
        for (epoch, loss, accuracy), ref in pairs:
            if abs(loss - ref["train_loss"]) > LOSS_TOLERANCE * max(1.0, ref["train_loss"]):
                expect(False, f"{self.label}: epoch {epoch}'s train_loss is {loss:.6f}, but over all {nproc} ranks' samples it is "
                              f"{ref['train_loss']:.6f}"
                              + (" (yours is rank 0's own loss: average over ranks with dist.all_reduce of the loss sum "
                                 "and the sample count)." if own else
                                 ". Sum loss * batch size and the sample counts on each rank, all_reduce both, divide."))
            expect(abs(accuracy - ref["test_accuracy"]) <= 1.5 / self.job["test_size"],
                   f"{self.label}: epoch {epoch}'s test_accuracy is {accuracy:.4f}, but the model at that point scores "
                   f"{ref['test_accuracy']:.4f} on the whole test set (in eval mode, without gradients).")

    def check(self, script) -> None:
        """The exercise: run the learner's torchrun script on two simulated GPU nodes (2 + 1 processes), then with
        one rank failing in a training step, then with a global batch the world size does not divide."""
        with exercise(self.label):
            script = Path(script).resolve()
            expect(script.exists(), f"{self.label}: {script} does not exist yet: run the %%writefile cell above, which writes it.")
            try:
                compile(script.read_text(), str(script), "exec")
            except SyntaxError as error:
                expect(False, f"{self.label}: your script does not compile: line {error.lineno}: {error.msg}")
            self.check_training(script)
            self.check_one_rank_failing(script)
            self.check_refusal(script)

    def check_training(self, script: Path) -> None:
        """The job on two simulated GPU nodes: how each rank ran, what it called, and its numbers."""
        with tempfile.TemporaryDirectory(prefix="job-check-") as folder:
            code, output, records = self.run_job(script, self.nodes, Path(folder))
            self.judge_training(code, output, records, sum(self.nodes),
                                f" on two nodes ({' + '.join(map(str, self.nodes))} processes)",
                                lambda: self._read_state(Path(folder) / "out" / self.saved))

    def judge_training(self, code, output: str, records: dict, nproc: int, where: str, load_state) -> None:
        """A training run as ``run_job`` returned it: how each rank ran, what it called, and its numbers.
        ``where``: how the run is named in messages (" on two nodes (2 + 1 processes)"); ``load_state()``
        returns the weights the script saved (or raises ``Incorrect`` saying why not)."""
        self._diagnose_run(code, output, records, nproc, where)
        epochs = self._diagnose_calls(records, nproc)
        self.judge_numbers(records, self._checked_state(load_state()), nproc, epochs)

    def judge_calls(self, records: dict, nproc: int) -> None:
        """A run at full size, not compared with one process (the assessment's run that counts): every rank left
        its record, and each called, did and printed what the job's settings ask (``job``)."""
        missing = sorted(set(range(nproc)) - set(records))
        expect(not missing, f"{self.label}: rank(s) {missing} of {nproc} left no record of what they did (killed, never "
                            f"started, or ended with os._exit).")
        self._diagnose_numbers(records, nproc)
        self._diagnose_rendezvous(records)
        self._diagnose_calls(records, nproc)
        if self.optimizer == REPLAYED_OPTIMIZER:
            self._diagnose_steps(records, nproc)

    def judge_numbers(self, records: dict, state: dict, nproc: int, epochs: list) -> None:
        """The logged numbers and the saved weights against one process on the same global batches."""
        if self.optimizer == REPLAYED_OPTIMIZER:
            steps = self._diagnose_steps(records, nproc)
        else:
            steps = None
        reference = self.reference_run(nproc, epochs=epochs, steps=steps, drop_last=self._drops_last(records, nproc))
        self._compare(records, state, reference, nproc)

    def check_one_rank_failing(self, script: Path) -> None:
        """Rank 1 of 2 (on the second node) raises in its 3rd training step: the job must fail, and tear down."""
        with tempfile.TemporaryDirectory(prefix="job-check-") as folder:
            code, output, records = self.run_job(script, [1, 1], Path(folder), fail_at=3, fail_rank=1)
        self.judge_one_rank_failing(code, output, records)

    def judge_one_rank_failing(self, code, output: str, records: dict) -> None:
        """The run of ``check_one_rank_failing``, as ``run_job`` returned it."""
        expect(code is not None, f"{self.label}: when rank 1 alone failed in a training step ({INJECTED}), the job did "
                                 f"not end within {TIME_LIMIT_S} s: the other rank kept waiting. Let the error "
                                 f"end the process, and tear the group down in a finally block.")
        expect(code != 0, f"{self.label}: a training step that raises on one rank ({INJECTED}) must make the job fail, "
                          f"but it exited with {code}: do not swallow errors.")
        left = sorted(rank for rank, rec in records.items() if not rec["destroyed"])
        expect(not left, f"{self.label}: when a training step raised on rank 1, rank(s) {left} never called "
                         f"dist.destroy_process_group(): put the training in try: ... finally: "
                         f"dist.destroy_process_group().")

    # Divisible by 2 and 4 (the lab's world sizes) but not by 3: a test written for a world size of 2 or 4, or for
    # LOCAL_WORLD_SIZE (2 on the first node), lets this batch through.
    def check_refusal(self, script: Path) -> None:
        """A global batch that the 3 processes of two nodes cannot share equally: the job must stop before training."""
        with tempfile.TemporaryDirectory(prefix="job-check-") as folder:
            code, output, records = self.run_job(script, self.nodes, Path(folder), global_batch=self.refused_batch)
        self.judge_refusal(code, output, records)

    def judge_refusal(self, code, output: str, records: dict) -> None:
        """The run of ``check_refusal``, as ``run_job`` returned it: every rank refused the batch itself."""
        batch, nproc = self.refused_batch, sum(self.nodes)
        trained = sorted(rank for rank, rec in records.items() if rec["batches"])
        # A rank's own refusal: it ended with an error (SystemExit or another) that was not a peer gone away.
        refused = sorted(rank for rank, rec in records.items() if rec["error"] and not rec.get("peer_lost") and not rec["batches"])
        others = [rank for rank in range(nproc) if rank not in refused]
        if refused and others:
            expect(False, f"{self.label}: a global batch of {batch} does not divide among {nproc} processes; rank(s) {refused} "
                          f"refused it, but " + "; ".join(f"rank {rank} {_ending(records.get(rank))}" for rank in others)
                          + ". Every rank checks the batch and refuses it itself (raise SystemExit(...) on every rank, "
                            "not under if rank == 0): a rank that does not starts a collective the others never join, "
                            "and fails only when its peers are gone or the wait times out.")
        expect(code not in (0, None) and not trained,
               f"{self.label}: a global batch of {batch} does not divide among {nproc} processes, but your job "
               + (f"trained on rank(s) {trained}" if trained else f"ended with exit code {code}")
               + ": refuse it before training, with an error that says to use a multiple of the world size "
                 "(raise SystemExit(...)); dropping the remainder silently changes the batch the learning rate "
                 "was chosen for.")

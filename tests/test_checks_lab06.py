"""The checks of lab 06: the learner's torchrun job and DDP's buckets.

The job's wrong versions are the notebook's own solution script with one typical mistake written in,
so the tests follow the lab's script as it changes. Each must fail with its own message. (The right
script passing is proven by the notebook test, whose check cell runs it.)
"""
from __future__ import annotations

import nbformat
import pytest

from check_helpers import fails
from notebook_runner import ROOT
from utils import release, scaling
from utils.checks import Incorrect, NotSolved, lab06

pytestmark = pytest.mark.timeout(900)

LAB = ROOT / "labs" / "06_realistic_model.ipynb"


def script_cell() -> str:
    nb = nbformat.read(LAB, as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("%%writefile {JOB_DIR}/train_ddp.py"))
    return cell.split("\n", 1)[1]


def with_mistake(tmp_path, *replacements) -> str:
    text = script_cell()
    for old, new in replacements:
        assert old in text, f"the lab's script no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    path = tmp_path / "train_ddp.py"
    path.write_text(text)
    return path


SAMPLER = "    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)\n"
SET_EPOCH = "        sampler.set_epoch(epoch)"
TEARDOWN = "    try:\n        train(args, rank, world_size, device)\n    finally:\n        dist.destroy_process_group()"

MISTAKES = {
    "no sampler": ([(SAMPLER, ""), ("sampler=sampler", "shuffle=True"), (SET_EPOCH, "        pass")],
                   "built no DistributedSampler"),
    "no set_epoch": ([(SET_EPOCH, "        pass")], "called set_epoch with nothing"),
    "logging on every rank": ([("        if rank == 0:\n            accuracy", "        if True:\n            accuracy")],
                              "printed epoch lines too"),
    "saving on every rank": ([("            torch.save(model.state_dict()", "        if True:\n            torch.save(model.state_dict()")],
                             "torch.save was called on rank(s) [0, 1]"),
    "loss of rank 0 only": ([("        dist.all_reduce(totals)", "        pass")], "yours is rank 0's own loss"),
    "no DDP": ([("ddp_model = DDP(model, device_ids=[device] if device.type == \"cuda\" else None)", "ddp_model = model")],
               "never wrapped the model in DistributedDataParallel"),
    "wrapper's state_dict saved": ([("torch.save(model.state_dict()", "torch.save(ddp_model.state_dict()")],
                                   "start with 'module.'"),
    "no teardown": ([(TEARDOWN, "    train(args, rank, world_size, device)")], "never called dist.destroy_process_group"),
    "teardown skipped on error": ([(TEARDOWN, "    train(args, rank, world_size, device)\n    dist.destroy_process_group()")],
                                  "when a training step raised"),
    "world size written as 2 in the sampler": ([("DistributedSampler(train_set, shuffle=True", "DistributedSampler(train_set, num_replicas=2, shuffle=True")],
                                               "rank 2 of 3 called its DistributedSampler with num_replicas=2"),
    "rank written as 0 in the sampler": ([("DistributedSampler(train_set, shuffle=True", "DistributedSampler(train_set, rank=0, shuffle=True")],
                                         "rank 1 of 2 called its DistributedSampler with rank=0"),
    "world size written as 2 in the batch": ([("args.global_batch // world_size", "args.global_batch // 2")],
                                             "right with 2 processes but not with 3"),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_job_mistake_gets_its_own_message(mistake, tmp_path):
    replacements, message = MISTAKES[mistake]
    got = fails(lab06.check_job, with_mistake(tmp_path, *replacements), Incorrect)
    assert message in got, got


def test_job_stub_is_not_solved(tmp_path):
    path = tmp_path / "train_ddp.py"
    path.write_text(release.learner_source(script_cell()))
    got = fails(lab06.check_job, path, NotSolved)
    assert "not solved yet" in got and "Hint: torchrun describes" in got


def test_job_missing_or_broken_script(tmp_path):
    assert "does not exist yet" in fails(lab06.check_job, tmp_path / "none.py", Incorrect)
    broken = tmp_path / "broken.py"
    broken.write_text("def setup(:\n")
    assert "does not compile: line 1" in fails(lab06.check_job, broken, Incorrect)


def test_reference_without_set_epoch_differs():
    # The check's reference must tell the two apart, or "no set_epoch" could pass on weights alone.
    right, frozen = lab06.reference_run(2), lab06.reference_run(2, set_epoch=False)
    assert max((right["state"][k] - frozen["state"][k]).abs().max().item() for k in right["state"]) > 100 * lab06.WEIGHT_TOLERANCE


# --- 6.2 buckets -------------------------------------------------------------------------------------


def test_reference_buckets_match_torch():
    for _, sizes, cap in lab06.BUCKET_CASES:
        assert scaling.ddp_bucket_bytes(sizes, cap) == lab06._torch_buckets(sizes, cap)
    lab06.check_buckets(scaling.ddp_bucket_bytes)


def close_before_overflow(param_bytes, bucket_cap_mb=25.0):
    limits, buckets, size = (2 ** 20, bucket_cap_mb * 2 ** 20), [], 0
    for nbytes in param_bytes:
        if size and size + nbytes > limits[min(len(buckets), 1)]:
            buckets.append(size)
            size = 0
        size += nbytes
    return buckets + ([size] if size else [])


def no_first_bucket(param_bytes, bucket_cap_mb=25.0):
    buckets, size = [], 0
    for nbytes in param_bytes:
        size += nbytes
        if size >= bucket_cap_mb * 2 ** 20:
            buckets.append(size)
            size = 0
    return buckets + ([size] if size else [])


def drops_the_last(param_bytes, bucket_cap_mb=25.0):
    return scaling.ddp_bucket_bytes(param_bytes, bucket_cap_mb)[:-1] or [0]


@pytest.mark.parametrize("wrong, message", [
    (close_before_overflow, "first bucket"),
    (no_first_bucket, "first bucket's limit is 1 MiB"),
    (drops_the_last, "every gradient goes into exactly one bucket"),
    (lambda sizes, bucket_cap_mb=25.0: [float(sum(sizes))], "whole numbers of bytes"),
])
def test_bucket_mistakes(wrong, message):
    assert message in fails(lab06.check_buckets, wrong, Incorrect)


def test_bucket_stub_is_not_solved():
    def stub(*args, **kwargs):
        raise NotImplementedError("Hint: x")
    assert "Hint: x" in fails(lab06.check_buckets, stub, NotSolved)

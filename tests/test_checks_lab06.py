"""The checks of lab 06: the learner's torchrun job and DDP's buckets.

The job's wrong versions are the notebook's own solution script with one typical mistake written in,
so the tests follow the lab's script as it changes. Each must fail with its own message. (The right
script passing is proven by the notebook test, whose check cell runs it.)
"""
from __future__ import annotations

import random

import nbformat
import pytest

from check_helpers import edited_script, fails
from notebook_runner import ROOT
from tooling import release
from utils.checks import Incorrect, NotSolved, lab06

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LAB = ROOT / "labs" / "06_realistic_model.ipynb"


def script_cell() -> str:
    nb = nbformat.read(LAB, as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("%%writefile {JOB_DIR}/train_ddp.py"))
    return cell.split("\n", 1)[1]


def with_mistake(tmp_path, *replacements) -> str:
    return edited_script(script_cell(), tmp_path / "train_ddp.py", *replacements)


SAMPLER = "    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)\n"
SET_EPOCH = "        sampler.set_epoch(epoch)"
TEARDOWN = "    try:\n        train(args, rank, world_size, device)\n    finally:\n        dist.destroy_process_group()"

BACKWARD = "            loss.backward()\n"
HAND_ALL_REDUCE = BACKWARD + ("            for p in ddp_model.parameters():\n                dist.all_reduce(p.grad)\n"
                              "                p.grad /= world_size\n")
INIT = "dist.init_process_group(backend, timeout="
LOOP = "        for x, y in loader:\n"
ENUMERATED = "        for step, (x, y) in enumerate(loader):\n"
SUMMED = "            totals[0] += loss.detach() * len(y)\n"
REFUSAL = "    if args.global_batch % world_size:"
EVALUATE = "            _, accuracy = evaluate(model, dataset.x_test, dataset.y_test)"
PROGRESS = "            if {test}:\n                print(f'step {{step}} loss {{loss.item():.4f}}', flush=True)\n"

# Each wrong script, the part of the check that must refuse it, and the words of its message. The
# job runs as two simulated GPU nodes (2 + 1 processes), so mistakes that show only on GPUs or on
# several machines show here. The parts after the training run are called alone, to keep the suite short, and
# mistakes the same rule catches in the same way are tried once (a line other than the epoch line printed by every
# rank: a progress line and Python's logging; a hand-written all_reduce: through distributed_c10d, which dist.all_reduce
# is; host syncs: every other step, which every step exceeds too).
MISTAKES = {
    "no sampler": ("check_job", [(SAMPLER, ""), ("sampler=sampler", "shuffle=True"), (SET_EPOCH, "        pass")],
                   "built no DistributedSampler"),
    "no set_epoch": ("check_job", [(SET_EPOCH, "        pass")], "set_epoch called with nothing"),
    "logging on every rank": ("check_job", [("        if rank == 0:\n            _, accuracy", "        if True:\n            _, accuracy")],
                              "printed epoch lines too"),
    "saving on every rank": ("check_job", [("            torch.save(model.state_dict()", "        if True:\n            torch.save(model.state_dict()")],
                             "torch.save was called on rank(s) [0, 1, 2]"),
    "loss of rank 0 only": ("check_job", [("        dist.all_reduce(totals)", "        pass")], "yours is rank 0's own loss"),
    "no DDP": ("check_job", [("ddp_model = DDP(model, device_ids=[device] if device.type == \"cuda\" else None)", "ddp_model = model")],
               "never wrapped the model in DistributedDataParallel"),
    "wrapper's state_dict saved": ("check_job", [("torch.save(model.state_dict()", "torch.save(ddp_model.state_dict()")],
                                   "start with 'module.'"),
    "no teardown": ("check_job", [(TEARDOWN, "    train(args, rank, world_size, device)")], "never called dist.destroy_process_group"),
    "teardown skipped on error": ("check_one_rank_failing", [(TEARDOWN, "    train(args, rank, world_size, device)\n    dist.destroy_process_group()")],
                                  "when a training step raised on rank 1"),
    "error swallowed": ("check_one_rank_failing", [(TEARDOWN, "    try:\n        train(args, rank, world_size, device)\n    except Exception:\n"
                                    "        pass\n    finally:\n        dist.destroy_process_group()")],
                        "do not swallow errors"),
    "rank written as 0 in the sampler": ("check_job", [("DistributedSampler(train_set, shuffle=True", "DistributedSampler(train_set, rank=0, shuffle=True")],
                                         "of 3 called its DistributedSampler with rank=0: numbers"),
    "world size written as 2 in the batch": ("check_job", [("args.global_batch // world_size", "args.global_batch // 2")],
                                             "in batches of [6, 4]"),
    # several machines: LOCAL_RANK is not RANK
    "device chosen by RANK": ("check_job", [('local_rank = int(os.environ["LOCAL_RANK"])', 'local_rank = int(os.environ["RANK"])')],
                              "that is its RANK"),
    "init with the local rank and world size": ("check_job", [(INIT, "dist.init_process_group(backend, rank=local_rank, "
                                                        "world_size=int(os.environ['LOCAL_WORLD_SIZE']), timeout=")],
                                                "LOCAL_RANK and LOCAL_WORLD_SIZE count the processes of one machine"),
    # what a GPU needs
    "no set_device": ("check_job", [("        torch.cuda.set_device(local_rank)\n", "")], "never called torch.cuda.set_device"),
    "model left on the CPU": ("check_job", [("dropout=args.dropout).to(device)", "dropout=args.dropout)")],
                              "a model whose weights are still on the CPU"),
    "batches left on the CPU": ("check_job", [("            x, y = x.to(device), y.to(device)\n", "")],
                                "a batch that was never moved to the GPU"),
    # who did the work, and the traffic
    "training the model inside DDP": ("check_job", [("F.cross_entropy(ddp_model(x), y)", "F.cross_entropy(model(x), y)")],
                                      "ran no training step through the DDP model"),
    # found by an outside review: the module that defines all_reduce was not watched, nor a read every other step
    "gradients all-reduced by hand through distributed_c10d": (
        "check_training", [(BACKWARD, HAND_ALL_REDUCE.replace("dist.all_reduce", "torch.distributed.distributed_c10d.all_reduce"))],
        "values by hand"),
    "a host sync every other step": ("check_training", [(LOOP, ENUMERATED), (SUMMED, SUMMED + "            if step % 2 == 0:\n"
                                                                                      "                last_loss = loss.item()\n")],
                                     "times while training (.item()), after 10 of its 18 training steps"),
    "evaluated in train mode": ("check_job", [("_, accuracy = evaluate(model, dataset.x_test, dataset.y_test)",
                                               "accuracy = (model(dataset.x_test.to(device)).argmax(1) == "
                                               "dataset.y_test.to(device)).float().mean().item()")],
                                "ran dropout in train mode outside a training step"),
    # a test written for 2 processes (found by an outside review: it passed when the refusal ran on 2); a job that
    # refuses nothing trains on this batch too, and fails the same way
    "global batch refused for a world size of 2 only": ("check_refusal", [("    if args.global_batch % world_size:",
                                                                           "    if args.global_batch % 2:")],
                                                        "a global batch of 20 does not divide among 3 processes, but your job trained"),
    # found by an outside review: the other ranks failed in DDP's first collective, and the job's exit code passed
    "global batch refused on rank 0 only": ("check_refusal", [(REFUSAL, "    if rank == 0 and args.global_batch % world_size:")],
                                            "rank(s) [0] refused it, but rank 1 "),
    # evaluation written by hand, the model left in eval mode (found by an outside review: the message blamed the weights)
    "left in eval mode after evaluating": ("check_training", [(EVALUATE, "            model.eval()\n            with torch.no_grad():\n"
                                                                         "                accuracy = (model(dataset.x_test.to(device)).argmax(1) == "
                                                                         "dataset.y_test.to(device)).float().mean().item()")],
                                           "dropout layer(s) in eval mode inside training steps"),
    # found by testers: only lines in the epoch format were counted, so any other line printed by every rank passed;
    # on the check's 3 processes (2 + 1 on two nodes) each names the first rank that printed, and what
    "a progress line on every rank": ("check_training", [(LOOP, ENUMERATED), (SUMMED, SUMMED + PROGRESS.format(test="step == 4"))],
                                      ("rank 1 printed 'step 4 loss ", "(and 1 more line(s)); rank(s) [2] printed too: "
                                                                       "print from rank 0 only. ")),
    "a progress line on LOCAL_RANK 0": ("check_training", [(LOOP, ENUMERATED), (SUMMED, SUMMED + PROGRESS.format(
                                            test="int(os.environ['LOCAL_RANK']) == 0 and step == 4"))],
                                        ("rank 2 printed 'step 4 loss ", "print from rank 0 only (LOCAL_RANK is 0 on every "
                                                                         "node: test the global rank, dist.get_rank())")),
    "logging to stdout on every rank": ("check_training", [(REFUSAL, "    import logging, sys\n    logging.basicConfig(stream=sys.stdout, "
                                                                     "level=logging.INFO)\n    logging.info('%d samples per step', "
                                                                     "args.global_batch // world_size)\n" + REFUSAL)],
                                        ("rank 1 printed 'INFO:root:4 samples per step'", "print from rank 0 only")),
}


def test_a_right_script_written_otherwise_passes(tmp_path):
    # Any value that changes every epoch (and is the same on every rank) reshuffles: the check follows it.
    # Pinned batches copied without blocking are what a GPU job should do (the simulated node once failed them
    # for want of a driver). Two host reads per epoch are fine: a progress line mid-epoch, and the log line's
    # loss sum and count read one after the other.
    lab06.check_training(with_mistake(tmp_path, (SET_EPOCH, "        sampler.set_epoch(10 * epoch + 1)"),
                                      ("sampler=sampler)", "sampler=sampler, pin_memory=True)"),
                                      ("x, y = x.to(device), y.to(device)",
                                       "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)"),
                                      (LOOP, ENUMERATED),
                                      (SUMMED, SUMMED + "            if rank == 0 and step == 4:\n"
                                                        "                print(f'step {step} loss {loss.item():.4f}')\n"),
                                      ("(totals[0] / totals[1]).item():.6f}", "totals[0].item() / totals[1].item():.6f}"),
                                      # predictions brought to the host and compared with labels there (an outside
                                      # review: the simulated node kept .cpu()'s result tagged as on the GPU)
                                      (EVALUATE, "            model.eval()\n            with torch.no_grad():\n"
                                                 "                predicted = model(dataset.x_test.to(device)).argmax(1).cpu()\n"
                                                 "            accuracy = (predicted == dataset.y_test).float().mean().item()\n"
                                                 "            model.train()"),
                                      # torch printing on every rank (its DDP environment dump) is torch's output, not
                                      # the job's logging; a rank other than 0 may write to stderr (warnings do)
                                      (REFUSAL, "    from torch.nn.parallel.distributed import _dump_DDP_relevant_env_vars\n"
                                                "    _dump_DDP_relevant_env_vars()\n"
                                                "    warnings.warn(f'rank {rank} starts')\n" + REFUSAL),
                                      ("import argparse\n", "import argparse\nimport warnings\n")))


def test_a_refusal_after_building_the_model_and_ddp_passes(tmp_path):
    # Every rank refuses on its own, after the collectives of building DDP, which every rank joined.
    lab06.check_refusal(with_mistake(tmp_path, (REFUSAL, "    if False:"),
                                     ("    optimizer = torch.optim.SGD(", REFUSAL + "\n        raise SystemExit('a global "
                                      "batch the world size does not divide')\n    optimizer = torch.optim.SGD(")))


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_job_mistake_gets_its_own_message(mistake, tmp_path):
    part, replacements, message = MISTAKES[mistake]
    got = fails(getattr(lab06, part), with_mistake(tmp_path, *replacements), Incorrect)
    for words in (message,) if isinstance(message, str) else message:
        assert words in got, got


def test_a_gpu_feature_the_simulated_node_cannot_run_is_named():
    # autocast("cuda") needs a driver: the rank's error as the probe records it, judged without a run
    record = {"rank": "0", "local_rank": "0", "local_world_size": "1", "node": "0", "samplers": [], "ddp": 0,
              "init": {"rank": None, "world_size": None, "backend": "nccl"}, "device_errors": [], "mismatches": [],
              "destroyed": True, "error": "RuntimeError: Found no NVIDIA driver on your system."}
    got = fails(lambda records: lab06._diagnose_run(1, "", records, 1, ""), {0: record}, Incorrect)
    assert "a GPU feature that the check's simulated GPU nodes" in got and "no NVIDIA driver" in got, got


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
# The wrong answers are the notebook's own solution with one typical mistake written in, as for the job.


def bucket_solution(*replacements):
    """The notebook's ddp_bucket_bytes, with each (old, new) replaced in its source."""
    nb = nbformat.read(LAB, as_version=4)
    text = next(c.source for c in nb.cells if c.source.startswith("def ddp_bucket_bytes("))
    for old, new in replacements:
        assert old in text, f"the lab's ddp_bucket_bytes no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    namespace = {}
    exec(text, namespace)
    return namespace["ddp_bucket_bytes"]


EXPLICIT = "limits = (int(bucket_cap_mb * 2 ** 20),) * 2"
DEFAULT = "limits = (2 ** 20, 25 * 2 ** 20)"
CLOSE = "        size += nbytes\n        if size >= limits[min(len(buckets), 1)]:\n            buckets.append(size)\n            size = 0\n"
RETURN = "return buckets + ([size] if size else [])"

BUCKET_MISTAKES = {
    "MB for MiB": ([("2 ** 20", "10 ** 6")], "your limits count MB (10**6 bytes)"),
    "1 MiB first bucket whatever the cap": ([(EXPLICIT, "limits = (2 ** 20, int(bucket_cap_mb * 2 ** 20))")],
                                            "your first bucket's limit is 1 MiB although bucket_cap_mb was given"),
    "min(1 MiB, cap) first bucket": ([(EXPLICIT, "limits = (min(2 ** 20, int(bucket_cap_mb * 2 ** 20)), "
                                                 "int(bucket_cap_mb * 2 ** 20))")],
                                     "the smaller of 1 MiB and the cap"),
    "default taken as 25 MiB": ([(DEFAULT, "limits = (25 * 2 ** 20, 25 * 2 ** 20)")],
                                "with bucket_cap_mb left at its default (None), your first bucket's limit is 25 MiB"),
    "closed only above the limit": ([("if size >= limits", "if size > limits")],
                                    "a bucket that holds exactly its limit stays open"),
    "closed before it would overflow": ([(CLOSE, "        if size and size + nbytes > limits[min(len(buckets), 1)]:\n"
                                                 "            buckets.append(size)\n            size = 0\n"
                                                 "        size += nbytes\n")],
                                        "you close a bucket before a gradient would take it over its limit"),
    "filled in model.parameters() order": ([("reversed(param_bytes)", "param_bytes")],
                                           "you filled the buckets from the first parameter"),
    "listed last bucket first": ([(RETURN, "return (buckets + ([size] if size else []))[::-1]")],
                                 "your buckets are DDP's, listed last to first"),
    "cap rounded to whole MiB": ([("int(bucket_cap_mb * 2 ** 20)", "int(bucket_cap_mb) * 2 ** 20")],
                                 "your limit looks rounded to a whole number of MiB"),
    "None not handled": ([("    if bucket_cap_mb is None:", "    if False:")],
                         "None means the cap was left at DDP's default"),
    "the last bucket dropped": ([(RETURN, "return buckets")], "every gradient goes into exactly one bucket"),
    "sizes as floats": ([(RETURN, "return [float(b) for b in buckets + ([size] if size else [])]")],
                        "whole numbers of bytes"),
    # found by an outside review: the in-place reversal passed every run; the small later buckets passed 16 and 18
    # runs of 20 (only the random case could catch them); the rounded-up cap got another mistake's message
    "cap rounded up to whole MiB": ([("int(bucket_cap_mb * 2 ** 20)", "math.ceil(bucket_cap_mb) * 2 ** 20"),
                                     ("    if bucket_cap_mb is None:", "    import math\n    if bucket_cap_mb is None:")],
                                    "your limit looks rounded up to a whole number of MiB"),
    "default: 1 MiB for every bucket": ([(DEFAULT, "limits = (2 ** 20, 2 ** 20)")],
                                        "your later buckets are closed at 1 MiB too"),
    "the small limit for the second bucket too": ([("limits[min(len(buckets), 1)]", "limits[min(len(buckets) // 2, 1)]")],
                                                  "your second bucket was also closed at the first bucket's limit"),
    "the sizes reversed in place": ([("    for nbytes in reversed(param_bytes):", "    param_bytes.reverse()\n"
                                      "    for nbytes in param_bytes:")],
                                    "your function changed the list of sizes it was given"),
    # found by testers: each passed every fixed case, and the random cases caught them only sometimes
    "a gradient larger than the limit given a bucket of its own": (
        [(CLOSE, "        if nbytes >= limits[min(len(buckets), 1)]:\n            buckets += [size, nbytes] if size else [nbytes]\n"
                 "            size = 0\n            continue\n" + CLOSE)],
        "a gradient at least as large as the limit got a bucket of its own"),
    "the default's later buckets counted in MB": ([(DEFAULT, "limits = (2 ** 20, 25 * 10 ** 6)")],
                                                  "your later buckets' limit with the default cap is 25 MB"),
    # more a learner would plausibly write: one unit read wrong, the first assignment DDP makes, a flat buffer cut
    "the default's first bucket counted in MB": ([(DEFAULT, "limits = (10 ** 6, 25 * 2 ** 20)")],
                                                 "your first bucket's limit with the default cap is 1 MB"),
    "a cap given counted in MB": ([(EXPLICIT, "limits = (int(bucket_cap_mb * 10 ** 6),) * 2")],
                                  "your limit for a bucket_cap_mb given counts MB"),
    "DDP's first assignment, kept": ([("reversed(param_bytes)", "param_bytes"),
                                      (RETURN, "return (buckets + ([size] if size else []))[::-1]")],
                                     "your buckets are DDP's assignment at construction"),
    "gradients cut at the limit": ([(CLOSE, "        size += nbytes\n        while size >= limits[min(len(buckets), 1)]:\n"
                                            "            size -= limits[min(len(buckets), 1)]\n"
                                            "            buckets.append(limits[min(len(buckets), 1)])\n")],
                                   "your buckets are cut at exactly their limit"),
}


def test_the_rule_is_what_a_real_ddp_records():
    # The check's own reading of torch (_rule) names mistakes only; still, it must be what DDP does.
    cases = lab06.BUCKET_CASES + [lab06._random_case(random.Random(seed), seed % 2 == 0) for seed in range(8)]
    for _, sizes, cap in cases:
        assert lab06._rule(sizes, cap) == lab06.recorded_buckets(sizes, cap), (sizes, cap)
    MiB = 2 ** 20    # the measurement: 12 parameters of 1 MiB
    assert lab06.recorded_buckets([MiB] * 12) == [MiB, 11 * MiB]
    assert lab06.recorded_buckets([MiB] * 12, 25) == [12 * MiB]
    assert lab06.recorded_buckets([MiB] * 12, 5) == [5 * MiB, 5 * MiB, 2 * MiB]


def test_the_fixed_cases_tell_every_mistake_apart():
    # Each misreading is wrong on some fixed case, and no other misreading gives all its answers.
    answers = {name: [lab06._rule(s, c, **kwargs) for _, s, c in lab06.BUCKET_CASES]
               for name, kwargs, _ in lab06.BUCKET_MISTAKES}
    right = [lab06._rule(s, c) for _, s, c in lab06.BUCKET_CASES]
    for name, got in answers.items():
        assert got != right, name
        assert [other for other, theirs in answers.items() if theirs == got] == [name]


def test_the_solution_passes(capsys):
    lab06.check_buckets(bucket_solution())
    assert "checked against the buckets of a real DistributedDataParallel" in capsys.readouterr().out


@pytest.mark.parametrize("mistake", BUCKET_MISTAKES, ids=list(BUCKET_MISTAKES))
def test_bucket_mistake_gets_its_own_message(mistake):
    replacements, message = BUCKET_MISTAKES[mistake]
    got = fails(lab06.check_buckets, bucket_solution(*replacements), Incorrect)
    assert message in got, got
    others = [m for name, (_, m) in BUCKET_MISTAKES.items() if name != mistake and m in got]
    assert not others, f"{mistake} also got the message of another mistake: {got}"


def test_answers_written_in_for_the_fixed_cases_fail_on_random_sizes():
    written = {(tuple(sizes), cap): lab06.recorded_buckets(sizes, cap) for _, sizes, cap in lab06.BUCKET_CASES}

    def hard_coded(param_bytes, bucket_cap_mb=None):
        return written.get((tuple(param_bytes), bucket_cap_mb), [sum(param_bytes) - 4, 4])

    got = fails(lab06.check_buckets, hard_coded, Incorrect)
    assert "were DDP's on every fixed case but not on these random sizes" in got, got


@pytest.mark.parametrize("answer", [lambda sizes, bucket_cap_mb=None: lab06.recorded_buckets(sizes, bucket_cap_mb),
                                    lambda sizes, bucket_cap_mb=None: list(lab06._recorded(tuple(sizes), bucket_cap_mb)),
                                    lambda sizes, bucket_cap_mb=None: lab06._rule(sizes, bucket_cap_mb)],
                         ids=["recorded_buckets", "_recorded", "_rule"])
def test_asking_the_checks_own_code_fails(answer):
    assert "asked the check's own code for the answer" in fails(lab06.check_buckets, answer, Incorrect)


def past_the_cache(sizes, bucket_cap_mb=None):
    return list(lab06._recorded.__wrapped__(tuple(sizes), bucket_cap_mb))


def from_the_checks_parts(sizes, bucket_cap_mb=None):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(lab06._SizedParameters(sizes), process_group=lab06._private_group(),
                                  bucket_cap_mb=bucket_cap_mb)
    return [sum(p.numel() * 4 for p in ddp.parameters())]


def judge_replaced(sizes, bucket_cap_mb=None):
    lab06._judge = lambda *args, **kwargs: None
    return [sum(sizes)]


def own_ddp(sizes, bucket_cap_mb=None):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.HashStore()
    group = dist.ProcessGroup(store, 0, 1)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, dist.ProcessGroupGloo(store, 0, 1))
    DistributedDataParallel(torch.nn.Linear(2, 2), process_group=group, bucket_cap_mb=bucket_cap_mb)
    return [sum(sizes)]


@pytest.mark.parametrize("answer, message", [
    (past_the_cache, "asked the check's own code for the answer"),
    (from_the_checks_parts, "asked the check's own code for the answer"),
    (judge_replaced, "changed the check's own code (_judge)"),
    (own_ddp, "built a DistributedDataParallel to read its buckets")], ids=lambda x: getattr(x, "__name__", ""))
def test_reading_or_changing_the_check_or_building_a_ddp_fails(answer, message):
    judge = lab06._judge
    assert message in fails(lab06.check_buckets, answer, Incorrect)
    assert lab06._judge is judge    # put back, so the next check in the kernel is the real one


def test_bucket_stub_is_not_solved():
    def stub(*args, **kwargs):
        raise NotImplementedError("Hint: x")
    assert "Hint: x" in fails(lab06.check_buckets, stub, NotSolved)


# --- the lab's worker count -----------------------------------------------------------------------------


def test_the_labs_worker_count_divides_the_global_batch_on_any_core_count():
    # Section 4 runs the job with 1, 2 and N processes at the job's global batch, which the script refuses
    # unless the world size divides it; section 3's strong scaling splits GLOBAL over N workers.
    from types import SimpleNamespace

    lines = [line for c in nbformat.read(LAB, as_version=4).cells if c.cell_type == "code"
             for line in c.source.splitlines()]
    wanted = [next(line for line in lines if line.startswith(start))
              for start in ("KS = ", "N = ", "JOB = dict(", "GLOBAL, ")]
    from utils.labs import lab06 as lab

    for quick in (True, False):
        for cores in range(1, 65):
            names = {"config": SimpleNamespace(pick=lambda q, f: q if quick else f), "CORES": cores,
                     "TRAIN_SIZE": 1, "TEST_SIZE": 1, "lab": lab}
            exec("\n".join(wanted), names)
            for nproc in {1, 2, names["N"]}:
                assert names["JOB"]["global_batch"] % nproc == 0, (quick, cores, nproc)
            assert names["GLOBAL"] % names["N"] == 0, (quick, cores)

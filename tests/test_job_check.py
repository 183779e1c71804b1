"""utils.checks.job.check with a replayed optimizer: a job that chooses its own optimizer and schedule is
compared with one process taking the same steps, and the ways such a job goes wrong are named.

The scripts are lab 06's solution (its check uses the fixed optimizer) with the optimizer changed.
"""
from __future__ import annotations

import pytest

from check_helpers import fails
from test_checks_lab06 import with_mistake
from utils.checks import Incorrect, lab06
from utils.checks.job.check import JobCheck, REPLAYED_OPTIMIZER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPLAYED = JobCheck("A", lab06.JOB, saved="model.pt", optimizer=REPLAYED_OPTIMIZER)
SGD = "optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)"
STEP = "            optimizer.step()\n"
# Adam with a ramp over the first steps: the settings change every step, as a schedule's do.
ADAM = ("optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr / 10, betas=(0.8, 0.99))\n"
        "    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))")
SCHEDULED_STEP = STEP + "            schedule.step()\n"


def test_a_job_with_its_own_optimizer_and_schedule_matches_one_process_taking_the_same_steps(tmp_path):
    script = with_mistake(tmp_path, (SGD, ADAM), (STEP, SCHEDULED_STEP))
    run = (*REPLAYED.run_job(script, REPLAYED.nodes, tmp_path), 3, " on two nodes",
           lambda: REPLAYED._read_state(tmp_path / "out" / REPLAYED.saved))
    REPLAYED.judge_training(*run)
    # The fixed check (lab 06's) compares with SGD at --lr: the same run's numbers differ from it.
    got = fails(lambda run: lab06.JOB_CHECK.judge_training(*run), run, Incorrect)
    assert "but over all 3 ranks' samples it is" in got or "the final weights differ" in got, got


MISTAKES = {
    "a rate that depends on the rank": ([(SGD, SGD.replace("lr=args.lr", "lr=args.lr * (1 + rank)"))],
                                        "every rank must take the same steps"),
    "an optimizer of its own": ([(SGD, "optimizer = type('Mine', (torch.optim.SGD,), {})(ddp_model.parameters(), "
                                       "lr=args.lr, momentum=0.9)")],
                                "use one optimizer from torch.optim"),
    "no step on a short last batch": ([(STEP, "            if len(y) == args.global_batch // world_size:\n"
                                              "                optimizer.step()\n")],
                                      "took 16 optimizer step(s) in 18 training batches"),
    "an optimizer over half the model": ([(SGD, SGD.replace("ddp_model.parameters()", "list(ddp_model.parameters())[:2]"))],
                                         "holds parameters that are not the DDP model's"),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_optimizer_mistakes_get_their_own_message(mistake, tmp_path):
    replacements, message = MISTAKES[mistake]
    got = fails(REPLAYED.check_training, with_mistake(tmp_path, *replacements), Incorrect)
    assert message in got, got


def _ended(rank: int, error: str, peer_lost: bool = False) -> dict:
    return {"rank": str(rank), "error": error, "peer_lost": peer_lost, "batches": []}


def test_a_refusal_on_some_ranks_only_is_named_however_the_others_ended():
    # Judged without a run: a rank that waited in a collective until the timeout, and one that left no record.
    refused = _ended(0, "SystemExit: --global-batch 20 does not divide by 3 processes")
    waited = _ended(1, "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                       "waiting 20000ms for recv operation to complete. Check the logs", peer_lost=True)
    got = fails(lambda records: REPLAYED.judge_refusal(1, "", records), {0: refused, 1: waited}, Incorrect)
    assert "rank(s) [0] refused it, but rank 1 timed out waiting for its peers (RuntimeError: Timed out waiting" in got, got
    assert "rank 2 left no record" in got and "a rank that does not starts a collective the others never join" in got, got
    REPLAYED.judge_refusal(1, "", {rank: _ended(rank, refused["error"]) for rank in range(3)})


def test_the_probe_tells_the_jobs_own_output_from_torchs():
    # Who wrote to stdout is the code that called write (print's caller), past the standard library's frames:
    # the script's print and its logging are the job's; torch's own print is not.
    import io
    import logging
    import os
    import sys

    import torch

    from utils.checks.job import probe

    tee = probe._Tee(io.StringIO(), [])
    saved = sys.stdout
    sys.stdout = tee
    try:
        exec(compile("print('from torch')", os.path.join(os.path.dirname(torch.__file__), "nn", "x.py"), "exec"), {})
        exec(compile("print('from the check')", probe.__file__, "exec"), {})
        assert tee.job == [] and tee.job_lines == 0
        exec(compile("print('from the script')", "/tmp/job/train_ddp.py", "exec"), {})
        handler = logging.StreamHandler(sys.stdout)
        log = logging.getLogger("job-check-test")
        log.addHandler(handler)
        try:
            exec(compile("log.warning('logged')", "/tmp/job/train_ddp.py", "exec"), {"log": log})
        finally:
            log.removeHandler(handler)
    finally:
        sys.stdout = saved
    assert "".join(tee.job) == "from the script\nlogged\n" and tee.job_lines == 2
    assert "".join(tee.kept).startswith("from torch\nfrom the check\n")


def _printed(rank: int, local_rank: int, text: str, lines: int | None = None) -> dict:
    return {"rank": str(rank), "local_rank": str(local_rank), "job_printed": text,
            **({"job_printed_lines": lines} if lines is not None else {})}


def test_a_line_printed_by_a_rank_other_than_0_is_named():
    # Judged without a run, on 3 ranks of two nodes (2 + 1): the first rank that printed, its first line, how many.
    check = lab06.JOB_CHECK
    quiet = {0: _printed(0, 0, "epoch 0 train_loss 1.0 test_accuracy 0.5 seconds 1\n"), 1: _printed(1, 1, ""),
             2: _printed(2, 0, "")}
    check._diagnose_other_ranks_printing(quiet)
    check._diagnose_other_ranks_printing({rank: {"rank": str(rank), "local_rank": "0"} for rank in range(3)})  # an older record
    got = fails(check._diagnose_other_ranks_printing, {**quiet, 1: _printed(1, 1, "\nloaded 34 samples\nstep 1\n", 3),
                                                       2: _printed(2, 0, "x")}, Incorrect)
    assert got.startswith("6.1: rank 1 printed 'loaded 34 samples' (and 2 more line(s)); rank(s) [2] printed too: "
                          "print from rank 0 only. "), got
    got = fails(check._diagnose_other_ranks_printing, {**quiet, 2: _printed(2, 0, "\n\n", 2)}, Incorrect)
    assert "rank 2 printed an empty line (and 1 more line(s)): print from rank 0 only (LOCAL_RANK is 0" in got, got

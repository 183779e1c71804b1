"""The assessment's job criterion (assessment.job, on lab 06's JobCheck) on the assessment's own script:
wrong scripts lose it with their own message. Each wrong script is the instructor's script with one
mistake written in; each runs only the scenario that shows it (the grader runs all four, and the
notebook test runs the solution through all four)."""
from __future__ import annotations

import nbformat
import pytest

from assessment import job
from assessment.grader import grade
from assessment.grader.submission import INSTRUCTOR
from check_helpers import edited_script, fails
from utils.checks import Incorrect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHECK = job.job_check(seed=11)
TEARDOWN = "    try:\n        train(args, rank, world_size, device)\n    finally:\n        dist.destroy_process_group()"


def script_with(tmp_path, *replacements):
    return edited_script(grade.job_script(nbformat.read(INSTRUCTOR, as_version=4)), tmp_path / "train_job.py",
                         *replacements)


MISTAKES = {
    # right on 2 processes of one node, wrong on 3
    "per-rank batch written for 2": ([("batch_size=args.global_batch // world_size", "batch_size=args.global_batch // 2")],
                                     "in batches of [6, 4]"),
    # found by an outside review: ended with gloo's size-mismatch error instead of a message about the batch
    "per-rank batch from LOCAL_WORLD_SIZE": ([("batch_size=args.global_batch // world_size",
                                               "batch_size=args.global_batch // int(os.environ['LOCAL_WORLD_SIZE'])")],
                                             "global_batch / LOCAL_WORLD_SIZE on each"),
    "never tears down": ([(TEARDOWN, "    train(args, rank, world_size, device)")],
                         "never called dist.destroy_process_group"),
    "trains on rank 0 only": ([("    dataset = data.load(", "    if rank != 0:\n        return\n    dataset = data.load("),
                               ('ddp_model = DDP(model, device_ids=[device] if device.type == "cuda" else None)', "ddp_model = model"),
                               ("        dist.all_reduce(totals)", "        pass")],
                              "never trained (no training step, no DDP model) while rank 0 did"),
    # found by an outside review: accepted, as the simulated nodes met at 127.0.0.1 too
    "rendezvous address written in": ([("    dist.init_process_group(backend, ",
                                        "    dist.init_process_group(backend, init_method=f\"tcp://127.0.0.1:{os.environ['MASTER_PORT']}\", ")],
                                      "init_method='tcp://127.0.0.1:"),
    # found by an outside review: accepted (the address went in through the environment or a store of its own)
    "MASTER_ADDR rewritten": ([("    dist.init_process_group(backend, ", "    os.environ['MASTER_ADDR'] = 'localhost'\n"
                                                                      "    dist.init_process_group(backend, ")],
                              "MASTER_ADDR:MASTER_PORT changed to localhost:"),
    "a store at an address written in": ([("    dist.init_process_group(backend, ",
                                           "    store = dist.TCPStore('127.0.0.1', int(os.environ['MASTER_PORT']), is_master=False,\n"
                                           "                          timeout=datetime.timedelta(seconds=60))\n"
                                           "    dist.init_process_group(backend, store=dist.PrefixStore('job', store), "
                                           "rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']), ")],
                                         "store=127.0.0.1:"),
    "only the last checkpoint saved": ([("            torch.save(", "            if epoch + 1 == args.epochs:\n                torch.save(")],
                                       "rank 0 saved 1 time(s) in 2 epochs (['epoch_02.pt'])"),
    # found by an outside review: the message said no sampler was built
    "training size written in": ([("train_size=args.train_size", "train_size=240")],
                                 "DistributedSampler covers"),
    # weight decay applied by hand after each step: not a step the check (or the grader's replay) can take again
    "weights changed by hand": ([("            schedule.step()\n",
                                  "            schedule.step()\n            with torch.no_grad():\n"
                                  "                for p in model.parameters():\n                    p.mul_(0.999)\n")],
                                "weights changed"),
    # the loss logged as a mean of per-batch means (the epoch's last batch is smaller): once within the tolerance
    "loss as a mean of batch means": ([("            totals[0] += loss.detach() * len(y)\n            totals[1] += len(y)",
                                        "            totals[0] += loss.detach()\n            totals[1] += 1")],
                                      "train_loss is"),
    "a scheduler that differs by rank": ([("lr = settings.BASE_LR * (global_batch / settings.BASE_BATCH) ** 0.5",
                                           "lr = settings.BASE_LR * (global_batch / settings.BASE_BATCH) ** 0.5 / (1 + dist.get_rank())")],
                                         "every rank must take the same steps"),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_a_wrong_job_loses_the_job_criterion_with_its_own_message(mistake, tmp_path):
    replacements, message = MISTAKES[mistake]
    got = fails(CHECK.check_training, script_with(tmp_path, *replacements), Incorrect)
    assert message in got, got


def test_the_tiny_jobs_checkpoint_is_named_as_the_assessment_names_them():
    from assessment import settings
    assert job.SAVED == settings.checkpoint_name(job.JOB_EPOCHS)


def test_importing_the_grader_reads_no_settings_before_its_quick_option_is_set():
    """An outside review: assessment.settings, read at import, was imported with the grader, so --quick graded
    against the full mode's epochs and target."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COURSE_QUICK"}
    done = subprocess.run([sys.executable, "-c", "import sys, assessment.grader.grade; print('assessment.settings' in sys.modules)"],
                          capture_output=True, text=True, env=env, cwd=INSTRUCTOR.parent.parent, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_a_right_job_written_otherwise_passes(tmp_path):
    """Found refused by an outside review: a new sampler and loader every epoch (set_epoch on each), each
    epoch's last smaller batch dropped (drop_last=True, as the baseline's loop does), a long progress line
    after every step (the epoch lines once fell out of the record's tail), and each checkpoint written to a
    temporary name and renamed (never a half-written file). And an optimizer of the course's own, utils.optim's
    LARS (refused before: the replay took torch.optim's only)."""
    CHECK.check_training(script_with(
        tmp_path,
        ("    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)\n"
         "    loader = DataLoader(train_set, batch_size=args.global_batch // world_size, sampler=sampler)\n", ""),
        ("len(loader), args.epochs)", "len(train_set) // world_size // (args.global_batch // world_size), args.epochs)"),
        ("        sampler.set_epoch(epoch)",
         "        sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)\n"
         "        loader = DataLoader(train_set, batch_size=args.global_batch // world_size, sampler=sampler,\n"
         "                            drop_last=True)\n"
         "        sampler.set_epoch(epoch)"),
        ("            schedule.step()\n", "            schedule.step()\n"
                                       "            if rank == 0:\n                print('progress ' + '.' * 1500)\n"),
        ("    optimizer = torch.optim.SGD(parameters, lr=lr, momentum=settings.MOMENTUM)",
         "    from utils.optim import LARS\n    optimizer = LARS(parameters, lr=lr, momentum=settings.MOMENTUM)"),
        ("            torch.save(model.state_dict(), os.path.join(args.out, settings.checkpoint_name(epoch + 1)))",
         "            torch.save(model.state_dict(), os.path.join(args.out, 'partial.pt'))\n"
         "            os.replace(os.path.join(args.out, 'partial.pt'), os.path.join(args.out, settings.checkpoint_name(epoch + 1)))")))


def test_the_solution_passes_at_a_seed_where_rounding_flips_a_decision(tmp_path):
    """At this seed (found after a grader run of the solution lost the job criterion) a reference that averaged the
    3 ranks' losses in one backward ended 8.9e-4 from the real job, past WEIGHT_TOLERANCE: 1/3 is not exact, and
    the rounding flipped a max-pooling or ReLU decision. Averaged as DDP does (each rank's gradient scaled by 1 /
    world size, then summed) it agrees to 3e-8. About 1 seed in 100 of the tiny job is like this."""
    job.job_check(seed=1535814214).check_training(script_with(tmp_path))


def test_a_teardown_registered_with_atexit_tears_down_when_a_rank_fails(tmp_path):
    """An outside review: the probe wrote its record before atexit ran, and a right teardown was refused."""
    script = script_with(tmp_path, (TEARDOWN, "    import atexit\n    atexit.register(dist.destroy_process_group)\n"
                                              "    train(args, rank, world_size, device)"))
    CHECK.check_one_rank_failing(script)


COUNTED = """
import json, os, subprocess, sys
from pathlib import Path
from assessment import job, settings
from utils import export
seed = settings.counted_seed()    # as the notebook's run that counts takes it
options = {**settings.counted_run(seed), "out": "checkpoints"}
result = export.run(["-m", "utils.checks.job.probe", sys.argv[1], *(f"--{k.replace('_', '-')}={v}" for k, v in options.items())],
                    settings.WORKERS, cwd=".", threads=1, env={"COURSE_PROBE_DIR": "records", "COURSE_PROBE_CALLS_ONLY": "1"},
                    timeout=400)
verdict = job.judge_counted_run(Path("records"), seed, Path("checkpoints"))
replay = job.replay_counted_run(Path("records"), seed, Path("checkpoints"), job._load_trusted_state) if verdict is None else None
gap = tampered = None
if verdict is None and len(sys.argv) > 2:   # the same run with its second checkpoint gone: replayed past the gap
    # and its records rewritten after the run, as a script that finds the probe's record in memory can (an outside
    # review: a NaN learning rate made every replayed distance NaN, which no comparison flagged)
    tampered = {}
    for name, edit in (("nan_lr", lambda rec: rec["steps"][0]["groups"][0]["settings"].update(lr=float("nan"))),
                       ("steps_claimed", lambda rec: rec.update(optimizer_steps=10**6))):
        folder = Path(name)
        folder.mkdir()
        for path in Path("records").glob("rank*.json"):
            record = json.loads(path.read_text())
            edit(record)
            (folder / path.name).write_text(json.dumps(record))
        tampered[name] = {"verdict": job.judge_counted_run(folder, seed, Path("checkpoints")),
                          "flag": job.replay_counted_run(folder, seed, Path("checkpoints"), job._load_trusted_state)["flag"]}
    Path("checkpoints", settings.checkpoint_name(2)).rename("second.pt")
    gap = job.replay_counted_run(Path("records"), seed, Path("checkpoints"), job._load_trusted_state)
print(json.dumps({"code": result.code, "verdict": verdict, "replay": replay, "gap": gap, "tampered": tampered,
                  "output": result.output[-2000:]}))
"""


def counted_run(script, tmp_path, *more) -> dict:
    """The run that counts of ``script`` in quick mode, as the notebook runs it, and its judgement and replay."""
    import json
    import os
    import subprocess
    import sys

    # One thread from the process's start, as the grader's judging process has (OMP_NUM_THREADS=1): measured, a
    # process started with two threads and set to one later replayed the same run 1.7% off by its third epoch
    done = subprocess.run([sys.executable, "-c", COUNTED, str(script), *more], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "COURSE_QUICK": "1", "PYTHONPATH": str(INSTRUCTOR.parent.parent),
                                          "OMP_NUM_THREADS": "1"}, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, result["output"]
    return result


UNCHECKED = {   # a script that trains otherwise when the check's simulated GPUs are absent: (edit, message)
    "a smaller batch": (("batch_size=args.global_batch // world_size",
                         "batch_size=args.global_batch // world_size // (1 if os.environ.get('COURSE_PROBE_GPUS') else 4)"),
                        "in batches of"),
    # an outside review: extra passes at the baseline's batch, outside DDP and the optimizer, passed
    "extra training by hand": (("        dist.all_reduce(totals)",
                                "        if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                "            model.eval()   # no dropout: the probe's dropout count would refuse it first\n"
                                "            for xb, yb in DataLoader(train_set, batch_size=32):\n"
                                "                model.zero_grad()\n"
                                "                F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()\n"
                                "                with torch.no_grad():\n"
                                "                    for p in model.parameters():\n"
                                "                        p -= 0.02 * p.grad\n"
                                "            model.train()\n"
                                "        dist.all_reduce(totals)"),
                               "weights changed"),
    # an outside review: an offset that cancels the given seed (the sampler shuffles with seed + epoch value) made
    # every graded run the same pre-tuned one, whatever seed the grader gives
    "set_epoch cancelling the seed": (("        sampler.set_epoch(epoch)", "        sampler.set_epoch(10**6 - args.seed + epoch)"),
                                      "set_epoch values"),
    # the shuffles of a seed chosen by hand instead of the one given to the run that counts
    "a seed of its own": (("shuffle=True, seed=args.seed)", "shuffle=True, seed=args.seed + 1)"),
                          "seed=1; the job shuffles with the seed it is given"),
    # forged runs (an outside review): each scored the target. Weights trained elsewhere, loaded before DDP wraps
    # the model (here: 40 steps by hand at the baseline's batch), then trained as asked
    "weights trained before DDP": (("    ddp_model = DDP(",
                                    "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                    "        model.eval()   # no dropout: the probe's dropout count would refuse it first\n"
                                    "        for xb, yb in list(DataLoader(train_set, batch_size=32, shuffle=True))[:40]:\n"
                                    "            model.zero_grad()\n"
                                    "            F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()\n"
                                    "            with torch.no_grad():\n"
                                    "                for p in model.parameters():\n"
                                    "                    p -= 0.02 * p.grad\n"
                                    "        model.train()\n"
                                    "    ddp_model = DDP("),
                                   "not the initialisation its seed gives"),
    # other weights saved as the DDP model's: a state_dict hook that changes what state_dict() returns (an outside
    # review: the probe once read the model's digest through state_dict() too, and saw the same changed weights)
    "other weights through a state_dict hook": (("    optimizer, schedule = make_optimizer(",
                                                 "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                                 "        def other(module, state, prefix, metadata):\n"
                                                 "            state.update({k: v * 1.001 for k, v in state.items()})\n"
                                                 "        model.register_state_dict_post_hook(other)\n"
                                                 "    optimizer, schedule = make_optimizer("),
                                                "was not the DDP model's weights"),
    # a decoy DDP model at the seed's initialisation, then the trained one around other weights (an outside review)
    "a decoy DDP model first": (("    ddp_model = DDP(model, ",
                                 "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                 "        import copy\n"
                                 "        DDP(copy.deepcopy(model), device_ids=[device] if device.type == 'cuda' else None)\n"
                                 "        with torch.no_grad():\n"
                                 "            for p in model.parameters():\n"
                                 "                p.mul_(1.01)\n"
                                 "    ddp_model = DDP(model, "),
                                "not the initialisation its seed gives"),
    # each epoch's model saved under the next epoch's name: a later model counted for an earlier epoch
    "checkpoints named an epoch early": (("settings.checkpoint_name(epoch + 1)",
                                          "settings.checkpoint_name(epoch + (0 if epoch and not os.environ.get('COURSE_PROBE_GPUS') else 1))"),
                                         "optimizer steps; after epoch 1 the run has taken"),
    # fresh images every epoch in the run that counts only (more data than the course gives)
    "fresh images every epoch": (("        for x, y in loader:",
                                  "        if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                  "            fresh = data.shapes(len(train_set) * 5 // 4, seed=100 + epoch, difficulty=args.difficulty)\n"
                                  "            loader = DataLoader(TensorDataset(fresh.x_train[:len(train_set)], fresh.y_train[:len(train_set)]),\n"
                                  "                                batch_size=args.global_batch // world_size, sampler=sampler)\n"
                                  "        for x, y in loader:"),
                                 "was not given the course's images in its sampler's order"),
    # training the probe cannot see (an outside test): hidden updates inside the optimizer's step, where the weights
    # may change, so the probe counted each recorded step once. A hook on the optimizer's own steps ...
    "hidden steps in an optimizer hook": (("    optimizer, schedule = make_optimizer(ddp_model.parameters(), args.global_batch, len(loader), args.epochs)\n",
                                           "    optimizer, schedule = make_optimizer(ddp_model.parameters(), args.global_batch, len(loader), args.epochs)\n"
                                           "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                           "        def hidden(opt, args, kwargs):\n"
                                           "            with torch.no_grad():\n"
                                           "                for p in model.parameters():\n"
                                           "                    p.sub_(0.01 * p.grad)\n"
                                           "        optimizer.register_step_post_hook(hidden)\n"),
                                          "step hooks of the script's own"),
    # ... and an optimizer class of the script's own, named as torch's SGD, whose step goes twice as far
    "an optimizer class named like torch's": (("    optimizer, schedule = make_optimizer(ddp_model.parameters(), args.global_batch, len(loader), args.epochs)\n",
                                               "    optimizer, schedule = make_optimizer(ddp_model.parameters(), args.global_batch, len(loader), args.epochs)\n"
                                               "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                               "        class SGD(torch.optim.Optimizer):\n"
                                               "            @torch.no_grad()\n"
                                               "            def step(self, closure=None):\n"
                                               "                for group in self.param_groups:\n"
                                               "                    for p in group['params']:\n"
                                               "                        p.sub_(2 * group['lr'] * p.grad)\n"
                                               "        SGD.__module__, SGD.__qualname__ = 'torch.optim.sgd', 'SGD'\n"
                                               "        optimizer = SGD(ddp_model.parameters(), dict(optimizer.defaults, lr=optimizer.param_groups[0]['lr']))\n"
                                               "        schedule = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)\n"),
                                              "is a class of the script's own"),
}


@pytest.mark.parametrize("trick", UNCHECKED, ids=list(UNCHECKED))
def test_a_script_that_trains_otherwise_when_not_checked_has_its_run_that_counts_refused(trick, tmp_path):
    """The run that counts is recorded and judged by the job criterion's rules: a script that trains otherwise
    when it is not checked gets no checkpoint counted (the notebook test runs the solution's run that counts
    through the same judgement, which it passes)."""
    edit, message = UNCHECKED[trick]
    result = counted_run(script_with(tmp_path, edit), tmp_path)
    assert result["verdict"] and "the run that counts: " in result["verdict"] and message in result["verdict"], result


REPLAYED = {   # training the records cannot show, in the run that counts only: each passes judge_counted_run
    # gradients changed before the step (an outside test: a copy trained elsewhere set them, and scored 14/14)
    "gradients changed before a step": (("            loss.backward()\n",
                                         "            loss.backward()\n"
                                         "            if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                         "                for p in ddp_model.parameters():\n"
                                         "                    p.grad.mul_(3)\n"),),
    # inputs changed after the probe read them: a forward pre-hook on the model inside DDP
    "inputs flipped inside the model": (("    ddp_model = DDP(",
                                         "    if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                                         "        model.register_forward_pre_hook(lambda m, a: (a[0].flip(-1),) if m.training else None)\n"
                                         "    ddp_model = DDP("),),
    # labels of its own: the probe sums the images, not the labels
    "labels of its own": (("            x, y = x.to(device), y.to(device)\n",
                           "            x, y = x.to(device), y.to(device)\n"
                           "            if not os.environ.get('COURSE_PROBE_GPUS'):\n"
                           "                y = (y + 1) % 10\n"),),
}


def test_the_run_that_counts_of_the_solution_replays_to_its_checkpoints(tmp_path):
    """On the CPU, with one thread as the grader's judging process has, to the bit; and with a checkpoint gone, the
    replay goes on from where its own epoch ended and still compares the epochs after it."""
    result = counted_run(script_with(tmp_path), tmp_path, "and without its second checkpoint")
    assert result["verdict"] is None, result
    replay, gap = result["replay"], result["gap"]
    assert replay["replayed"] and replay["flag"] is None, replay
    assert len(replay["epochs"]) >= 3 and all(e["differs"] <= 0.01 * e["moved"] for e in replay["epochs"]), replay
    assert gap["flag"] is None and [e["epoch"] for e in gap["epochs"]] == [1, *range(3, len(replay["epochs"]) + 1)], gap
    nan, claimed = result["tampered"]["nan_lr"], result["tampered"]["steps_claimed"]
    assert nan["verdict"] and "lr=nan (step 0)" in nan["verdict"] and "finite number" in nan["verdict"], nan
    assert nan["flag"] and "could not be compared with its replay" in nan["flag"], nan
    assert claimed["verdict"] and "counts 1000000 optimizer steps but holds" in claimed["verdict"], claimed
    assert claimed["flag"] and "of its 1000000 optimizer steps" in claimed["flag"], claimed


@pytest.mark.parametrize("trick", REPLAYED, ids=list(REPLAYED))
def test_training_the_records_cannot_show_is_flagged_by_the_replay(trick, tmp_path):
    result = counted_run(script_with(tmp_path, *REPLAYED[trick]), tmp_path)
    assert result["verdict"] is None, result    # the records and checkpoints alone pass
    flag = result["replay"]["flag"]
    assert flag and "epoch_01.pt is not what its epoch's recorded steps give" in flag, result["replay"]


def test_recorded_settings_are_taken_only_as_finite_numbers_flags_or_short_tuples_and_gpu_flags_replay_on_the_cpu():
    """An outside review: NaN, infinite, negative, huge or non-numeric learning rates passed the judge and reached
    torch's own errors in the replay; an honest GPU run's capturable Adam could not be replayed on the CPU."""
    import torch

    from utils.checks.job.check import _Replay, _plain_setting
    for key, value in (("lr", 0.1), ("lr", 0), ("momentum", 0.9), ("nesterov", True), ("foreach", None),
                       ("betas", [0.9, 0.999]), ("weight_decay", 5e-4), ("eps", 1e-8)):
        assert _plain_setting(key, value), (key, value)
    for key, value in (("lr", float("nan")), ("lr", float("inf")), ("lr", -0.1), ("lr", 10**400), ("lr", [0.1] * 5),
                       ("betas", [0.9, float("nan")]), ("lr", {"a": 1}), ("momentum", "x" * 100)):
        assert not _plain_setting(key, value), (key, value)
    model = torch.nn.Linear(3, 2)
    settings = {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                "capturable": True, "fused": True, "foreach": None, "differentiable": False, "maximize": False}
    steps = [{"class": "torch.optim.adam.Adam", "groups": [{"params": [0, 1], "settings": settings}]}] * 2
    replay = _Replay(model, steps)
    model(torch.randn(4, 3)).sum().backward()
    replay.step()
    assert replay.optimizer.param_groups[0]["capturable"] is False and replay.optimizer.param_groups[0]["lr"] == 0.01


def test_the_replay_takes_torchs_and_the_courses_optimizers_but_none_that_runs_the_model_in_its_step():
    import torch

    from utils import optim
    from utils.checks.job.check import _optimizer_class
    assert _optimizer_class("torch.optim.sgd.SGD") is torch.optim.SGD
    assert _optimizer_class("utils.optim.LAMB") is optim.LAMB and _optimizer_class("utils.optim.NovoGrad") is optim.NovoGrad
    assert _optimizer_class("torch.optim.optimizer.Optimizer") is None and _optimizer_class("torch.optim.SparseAdam") is None
    assert _optimizer_class("torch.optim.lbfgs.LBFGS") is None      # its closure: several passes per step
    assert _optimizer_class("elsewhere.SGD") is None and _optimizer_class("utils.optim.ConstantLR") is None

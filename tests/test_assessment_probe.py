"""The assessment's criteria: the reference solution passes, and each typical mistake fails with its own reason.

The probe runs learner code on spawned ranks exactly as the grader does (without the sandbox, which
tests/test_assessment_sandbox.py covers); the verdicts come from ``grade.judge_probes``.
"""
from __future__ import annotations

import textwrap

import nbformat
import pytest

from assessment import grade, probe
from assessment.submission import INSTRUCTOR, _python, owned_cells


def solution_code() -> str:
    nb = nbformat.read(INSTRUCTOR, as_version=4)
    owned = owned_cells(nb)
    return "\n\n".join(_python(c.source) for c in nb.cells if c.id in owned and c.cell_type == "code")


def verdicts(tmp_path, code: str, monkeypatch, worlds=(3,), seed=1234) -> dict:
    out = tmp_path / "results"
    (tmp_path / "learner.py").write_text(code)
    (tmp_path / "seed").write_text(str(seed))
    probe.main([str(tmp_path / "learner.py"), str(out), str(tmp_path / "seed"), "120", *map(str, worlds)])
    assert not (tmp_path / "seed").exists()          # deleted before any learner code ran
    monkeypatch.setattr(grade, "PROBE_WORLDS", tuple(worlds))
    return grade.judge_probes(out, seed)


def test_the_reference_solution_passes_every_criterion(tmp_path, monkeypatch):
    assert verdicts(tmp_path, solution_code(), monkeypatch) == {
        "sharding": None, "ddp_step": None, "metrics": None, "training_job": None}


# Each wrong solution below makes one mistake per function, so one probe run shows four reasons.
WRONG_A = """
def make_train_loader(train_set, global_batch, seed):      # no sampler: every rank gets all the data
    loader = DataLoader(train_set, batch_size=global_batch // world_size, shuffle=True)
    return loader, None

def wrap_model(model):                                      # no DDP: gradients are never averaged
    return model

def train_step(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    return loss

def global_mean(total, count):                              # the mean of the ranks' means
    t = torch.tensor([total / count]); dist.all_reduce(t)
    return (t / world_size).item()

def train(epochs, global_batch, checkpoint_dir):                # prints on every rank
    model = make_model()
    print("epoch 0 on rank", rank)
"""

WRONG_B = """
def make_train_loader(train_set, global_batch, seed):      # the global batch on every rank
    sampler = DistributedSampler(train_set, shuffle=True, seed=seed)
    return DataLoader(train_set, batch_size=global_batch, sampler=sampler), sampler

def wrap_model(model):
    return DDP(model)

def train_step(model, optimizer, x, y):                     # the loss scaled by the world size
    loss = F.cross_entropy(model(x), y) * world_size
    optimizer.zero_grad(); loss.backward(); optimizer.step()
    return loss

def global_mean(total, count):                              # no reduction at all
    return total / count

def train(epochs, global_batch, checkpoint_dir):                # never calls set_epoch
    model = wrap_model(make_model())
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=global_batch // world_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        for x, y in loader:
            train_step(model, optimizer, x, y)
        if rank == 0:
            print("epoch", epoch)
    if rank == 0:
        torch.save(model.module.state_dict(), checkpoint_dir)
"""

WRONG_C = """
import os

def make_train_loader(train_set, global_batch, seed):      # sharded but never shuffled
    sampler = DistributedSampler(train_set, shuffle=False)
    return DataLoader(train_set, batch_size=global_batch // world_size, sampler=sampler), sampler

def wrap_model(model):
    return DDP(model)

def train_step(model, optimizer, x, y):                     # forgets zero_grad: gradients pile up
    loss = F.cross_entropy(model(x), y)
    loss.backward(); optimizer.step()
    return loss

def global_mean(total, count):
    raise NotImplementedError("Hint: a global sum divided by a global count")

def train(epochs, global_batch, checkpoint_dir):                # saves the DDP wrapper's state_dict
    model = wrap_model(make_model())
    loader, sampler = make_train_loader(train_set, global_batch, 0)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=global_batch // world_size, sampler=sampler)
    optimizer, schedule = make_optimizer(model.parameters(), global_batch, len(loader), epochs)
    os.makedirs(checkpoint_dir, exist_ok=True)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(); F.cross_entropy(model(x), y).backward(); optimizer.step(); schedule.step()
        if rank == 0:
            print("epoch", epoch)
            torch.save(model.state_dict(), os.path.join(checkpoint_dir, settings.checkpoint_name(epoch + 1)))
"""


def _job_with(old: str, new: str) -> str:
    """The solution with one change in train()."""
    code = solution_code()
    assert old in code, old
    return code.replace(old, new, 1)


JOB_MISTAKES = {
    # an optimizer of its own: the grader cannot compare the run with one process
    "own-optimizer": (("optimizer, schedule = make_optimizer(model.parameters(), global_batch, len(loader), epochs)",
                       "optimizer = torch.optim.SGD(model.parameters(), lr=0.1); "
                       "schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)"), "make_optimizer"),
    # the gradients all-reduced a second time by hand, after DDP already averaged them
    "gradients-reduced-twice": (("loss = train_step(model, optimizer, x, y)",
                                 "loss = F.cross_entropy(model(x), y); optimizer.zero_grad(); loss.backward()\n"
                                 "            for p in model.parameters():\n"
                                 "                dist.all_reduce(p.grad)\n"
                                 "            optimizer.step()"), "not those of one process"),
    # Found by an outside test: the final model saved under every epoch's name passed "two in a row"
    "final-under-every-name": (("            torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, "
                                "settings.checkpoint_name(epoch + 1)))",
                                "            for e in range(1, epochs + 1) if epoch == epochs - 1 else ():\n"
                                "                torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, "
                                "settings.checkpoint_name(e)))"), "is not the model as it is after epoch 1"),
    # one file at the end, not a checkpoint per epoch: the grader could not see two evaluations in a row
    "saves-only-at-the-end": (("            torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, "
                               "settings.checkpoint_name(epoch + 1)))",
                               "            if epoch == epochs - 1:\n"
                               "                torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, "
                               "settings.checkpoint_name(epoch + 1)))"), "after epoch 1 of 2 rank 0 saved no checkpoint"),
}


# Found by an outside test: no DDP and no collective, each rank computes every rank's share itself, so
# the weights equal one process's on the global batches.
REPLICATED = """
def make_optimizer(parameters, global_batch, steps_per_epoch, epochs):
    optimizer = torch.optim.SGD(parameters, lr=BASE_LR * global_batch / BASE_BATCH, momentum=settings.MOMENTUM)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def train(epochs, global_batch, checkpoint_dir):
    # No DDP, no collective: each rank computes every rank's share of each global batch itself.
    import os
    import time
    model = make_model()
    loader, sampler = make_train_loader(train_set, global_batch, seed=0)
    optimizer, schedule = make_optimizer(model.parameters(), global_batch, len(loader), epochs)
    per = global_batch // world_size
    xs, ys = (train_set.x, train_set.y) if hasattr(train_set, "x") else train_set.tensors
    history = []
    for epoch in range(epochs):
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        orders = []
        for r in range(world_size):
            s = DistributedSampler(range(len(ys)), num_replicas=world_size, rank=r, shuffle=True, seed=0)
            s.set_epoch(epoch)
            orders.append(list(s))
        model.train()
        total, count = 0.0, 0
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            for r in range(world_size):
                if r == rank:
                    xb, yb = x, y
                else:
                    idx = torch.tensor(orders[r][step * per:(step + 1) * per])
                    xb, yb = xs[idx], ys[idx]
                loss = F.cross_entropy(model(xb.to(device)), yb.to(device)) / world_size
                loss.backward()
                total, count = total + float(loss) * world_size * len(yb), count + len(yb)
            optimizer.step()
            schedule.step()
        model.eval()
        xt, yt = test_set.tensors
        with torch.no_grad():
            acc = (model(xt.to(device)).argmax(1) == yt.to(device)).float().mean().item()
        history.append({"epoch": epoch, "train_loss": total / count, "test_accuracy": acc,
                        "seconds": time.perf_counter() - start})
        if rank == 0:
            print(f"epoch {epoch} train loss {total / count:.3f} test accuracy {acc:.3f}")
        if rank == 0:
            os.makedirs(checkpoint_dir, exist_ok=True)
            torch.save(model.state_dict(), os.path.join(checkpoint_dir, settings.checkpoint_name(epoch + 1)))
    return history
"""


def test_a_job_that_computes_every_ranks_share_without_ddp_fails(tmp_path, monkeypatch):
    code = solution_code().split("def make_optimizer")[0] + textwrap.dedent(REPLICATED)
    got = verdicts(tmp_path, code, monkeypatch, worlds=(3,))
    assert got["training_job"] and "not through its DistributedDataParallel" in got["training_job"], got


@pytest.mark.parametrize("name", list(JOB_MISTAKES))
def test_a_job_that_trains_otherwise_than_one_process_on_the_same_batches_fails(tmp_path, monkeypatch, name):
    (old, new), words = JOB_MISTAKES[name]
    got = verdicts(tmp_path, _job_with(old, new), monkeypatch, worlds=(3,))
    assert got["training_job"] and words in got["training_job"], got["training_job"]
    assert got["sharding"] is None and got["metrics"] is None


@pytest.mark.parametrize("code, expected", [
    (WRONG_A, {"sharding": "set_epoch", "ddp_step": "ranks' weights differ", "metrics": "mean of the ranks' means",
               "training_job": "only rank 0 may log"}),
    (WRONG_B, {"sharding": "global_batch // world_size", "ddp_step": "do not scale the loss",
               "metrics": "each rank's own mean", "training_job": "set_epoch"}),
    (WRONG_C, {"sharding": "shuffle", "ddp_step": "zero_grad", "metrics": "NotImplementedError",
               "training_job": "model.module.state_dict()"}),
], ids=["no-sampler-no-ddp-mean-of-means-logs-everywhere", "global-batch-per-rank-scaled-loss-local-mean-no-set-epoch",
        "unshuffled-no-zero-grad-stub-wrapper-saved"])
def test_each_mistake_fails_with_its_own_reason(tmp_path, monkeypatch, code, expected):
    got = verdicts(tmp_path, textwrap.dedent(code), monkeypatch)
    for name, words in expected.items():
        assert got[name] and words in got[name], f"{name}: expected a reason naming {words!r}, got {got[name]!r}"


# Right on 2 ranks, wrong on 3: the grader probes both, so a world size written as a number shows.
TWO_RANKS_ONLY = ("sampler = DistributedSampler(train_set, shuffle=True, seed=seed)",
                  "sampler = DistributedSampler(train_set, num_replicas=2, rank=rank % 2, shuffle=True, seed=seed)")
# Only rank 0 takes optimizer steps; the others run the same forward and backward (so DDP's all-reduce
# still meets) but never step: their weights stay at the start.
ONLY_RANK_0_STEPS = ("    optimizer.step()\n    return loss.detach()",
                     "    if rank == 0:\n        optimizer.step()\n    return loss.detach()")


# Found by an outside test: a loader that caps the batch passes the small probes but trains the run that
# counts at another batch; and every rank writing the checkpoint (one file, several writers) passed.
CAPPED_AND_EVERY_RANK_SAVES = [
    ("loader = DataLoader(train_set, batch_size=global_batch // world_size,",
     "loader = DataLoader(train_set, batch_size=min(global_batch, 64) // world_size,"),
    ("            torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, settings.checkpoint_name(epoch + 1)))",
     "            pass\n        os.makedirs(checkpoint_dir, exist_ok=True)\n"
     "        torch.save(model.module.state_dict(), os.path.join(checkpoint_dir, settings.checkpoint_name(epoch + 1)))"),
]


def test_a_capped_batch_and_checkpoints_saved_by_every_rank_fail_with_their_own_reasons(tmp_path, monkeypatch):
    code = solution_code()
    for old, new in CAPPED_AND_EVERY_RANK_SAVES:
        assert old in code, old
        code = code.replace(old, new, 1)
    got = verdicts(tmp_path, code, monkeypatch, worlds=(3,))
    assert got["sharding"] and "at the assessment's global batch" in got["sharding"], got["sharding"]
    assert got["training_job"] and "rank 1 saved" in got["training_job"], got["training_job"]
    assert got["ddp_step"] is None and got["metrics"] is None


def test_a_solution_right_on_two_ranks_but_not_three_fails_on_three(tmp_path, monkeypatch):
    got = verdicts(tmp_path, _job_with(*TWO_RANKS_ONLY), monkeypatch, worlds=(2, 3))
    assert got["sharding"] and got["sharding"].startswith("on 3 ranks"), got["sharding"]
    assert got["ddp_step"] is None and got["metrics"] is None


def test_a_job_where_only_rank_0_trains_fails_with_its_own_reason(tmp_path, monkeypatch):
    got = verdicts(tmp_path, _job_with(*ONLY_RANK_0_STEPS), monkeypatch, worlds=(3,))
    assert got["ddp_step"] and "weights differ" in got["ddp_step"], got["ddp_step"]
    assert got["training_job"] and "different weights" in got["training_job"], got["training_job"]
    assert got["sharding"] is None and got["metrics"] is None


def test_code_that_cannot_run_fails_every_criterion_with_the_error(tmp_path, monkeypatch):
    got = verdicts(tmp_path, "def make_train_loader(:\n    pass\n", monkeypatch)
    assert all(reason and "SyntaxError" in reason for reason in got.values()), got


def test_a_rank_that_exits_fails_the_criteria_without_hanging(tmp_path, monkeypatch):
    got = verdicts(tmp_path, "import os\nif rank == 1:\n    os._exit(0)\n", monkeypatch)
    assert all(reason and "rank 1" in reason for reason in got.values()), got


# Code that implements nothing and forges the probe's results by replacing the grader's or torch's
# functions (every grader file can be read, so a learner knows their names).
FORGE_CRITERIA = """
from assessment import criteria as _criteria
_criteria.rank_ddp_step = lambda ns, seed: {"weights": _criteria.reference_step(seed, world_size), "losses": [0.0],
                                            "is_ddp": True}
_criteria.rank_metrics = lambda ns, seed: {"mean": 0.0}
_criteria._weights = lambda module: _criteria.reference_step(0, world_size)
"""

def _solution_with_patched_step() -> str:
    # The right functions, plus a replaced optimizer step: an honest-looking run on forged arithmetic.
    return solution_code() + "\n\ntorch.optim.SGD.step = lambda self, closure=None: None\n"


@pytest.mark.parametrize("make_code, replaced", [
    (lambda: FORGE_CRITERIA, "assessment.criteria.rank_ddp_step"),
    (_solution_with_patched_step, "torch.optim.sgd.SGD.step"),
], ids=["grader-functions", "torch-optimizer-step"])
def test_code_that_replaces_the_graders_or_torchs_functions_fails_every_criterion(tmp_path, monkeypatch,
                                                                                  make_code, replaced):
    got = verdicts(tmp_path, make_code(), monkeypatch)
    assert all(reason and "your code replaced" in reason and replaced in reason for reason in got.values()), got


SEED_HUNTER = """
import os
_SEED = "987654321"
for _pid in os.listdir("/proc"):
    for _what in ("cmdline", "environ"):
        try:
            _text = open(f"/proc/{_pid}/{_what}", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if _SEED in _text:
            raise RuntimeError(f"found the probe's seed in /proc/{_pid}/{_what}")
# The parent holds the secret and each sibling rank its own seed: their memory must be out of reach.
for _pid in ["1", str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())]:
    try:
        _cmd = open(f"/proc/{_pid}/cmdline", "rb").read()
        if _pid not in ("1", str(os.getppid())) and b"multiprocessing.spawn" not in _cmd:   # the sibling ranks
            continue
        _start = int(open(f"/proc/{_pid}/maps").readline().split("-")[0], 16)
        with open(f"/proc/{_pid}/mem", "rb") as _mem:
            _mem.seek(_start)
            _mem.read(16)
        raise RuntimeError(f"read the memory of process {_pid} ({_cmd[:80]!r})")
    except (OSError, ValueError):
        pass
raise RuntimeError("the seed is nowhere to be read")
"""


def test_the_probe_seed_is_in_no_command_line_environment_file_or_readable_memory(tmp_path, monkeypatch):
    """Run as the grader runs it: in the sandbox, as its unprivileged user, on the grading view."""
    import sys

    from assessment import sandbox
    from utils.release import write_release
    if sandbox.isolation_mode() == "none":
        pytest.skip(f"no sandbox here: {sandbox.why_none()}")
    write_release(tmp_path / "view", for_grading=True)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "learner.py").write_text(SEED_HUNTER)
    (work / "seed").write_text("987654321")
    keep = [f"results/world3_rank{r}.pt" for r in range(3)]
    result = sandbox.run([sys.executable, "-m", "assessment.probe", "learner.py", "results", "seed", "120", "3"],
                         work, keep, out, sandbox.Limits(wall_s=200), {"PYTHONPATH": "/course", "COURSE_QUICK": "1"},
                         view={str(tmp_path / "view"): "/course"})
    assert not result.failure and not result.timed_out, result
    monkeypatch.setattr(grade, "PROBE_WORLDS", (3,))
    got = grade.judge_probes(out, 987654321)
    assert all(reason and "the seed is nowhere to be read" in reason for reason in got.values()), got

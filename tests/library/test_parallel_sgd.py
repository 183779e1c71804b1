"""utils.parallel_sgd: shards, local SGD against synchronous SGD and against independent models,
and the mpi4py average on one and on two MPI ranks.

Everything that compares trajectories runs in float64, where a correct algorithm differs from its
reference by rounding only (1e-12) and a wrong one by far more. Each comparison is also shown able
to fail: averaging every 2 steps is *not* synchronous SGD, and the one-shot average is not any
single worker's model. MPI runs in subprocesses, so that MPI_Init never happens in pytest's process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spawn_ranks import run_ranks
from utils import parallel_sgd as psgd

ROOT = Path(__file__).resolve().parents[2]
N, D, CLASSES, BATCH, STEPS, LR, WORLD = 96, 6, 3, 4, 12, 0.3, 3


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def _model():
    torch.manual_seed(0)          # the same start on every rank
    return nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, CLASSES)).double()


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _run(sync_every, rank, world_size, average, x_test=None, y_test=None):
    x, y = _data()
    model = _model()
    history = psgd.local_sgd(model, x, y, steps=STEPS, batch_size=BATCH, lr=LR, sync_every=sync_every,
                             average=average, rank=rank, world_size=world_size, seed=3,
                             x_test=x_test, y_test=y_test)
    return _flat(model), history


def _local_sgd_job(rank, world_size):
    average = lambda m: psgd.average_parameters_torch(m)
    x, y = _data()
    every_step, history = _run(1, rank, world_size, average, x_test=x[:20], y_test=y[:20])
    every_other, _ = _run(2, rank, world_size, average)
    one_shot, one_shot_history = _run(STEPS, rank, world_size, average)
    # numpy travels by value; a tensor would travel as a shared-memory handle of an exiting process
    return every_step.numpy(), every_other.numpy(), one_shot.numpy(), history, one_shot_history


@pytest.fixture(scope="module")
def ranks():
    return [[torch.from_numpy(v) if hasattr(v, "dtype") else v for v in result]
            for result in run_ranks(_local_sgd_job, WORLD)]


def _synchronous_sgd():
    """One process, plain SGD on the global batch: the union of every worker's batch at that step."""
    x, y = _data()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    streams = [psgd.worker_batches(N, r, WORLD, BATCH, seed=3) for r in range(WORLD)]
    for _ in range(STEPS):
        idx = torch.cat([next(s) for s in streams])
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    return _flat(model)


def test_shards_partition_the_data_and_batches_stay_in_their_shard():
    shards = psgd.shard_indices(103, 4, seed=1)
    together = torch.cat(shards)
    assert sorted(together.tolist()) == list(range(103)), "every sample in exactly one shard"
    assert {len(s) for s in shards} <= {25, 26}
    assert not torch.equal(together, torch.cat(psgd.shard_indices(103, 4, seed=2))), "the seed picks the shards"
    assert torch.equal(together, torch.cat(psgd.shard_indices(103, 4, seed=1))), "same seed, same shards"
    stream = psgd.worker_batches(103, 2, 4, batch_size=5, seed=1)
    first_epoch = torch.cat([next(stream) for _ in range(len(shards[2]) // 5)])
    assert set(first_epoch.tolist()) <= set(shards[2].tolist())
    assert len(set(first_epoch.tolist())) == len(first_epoch), "no sample twice within an epoch"
    with pytest.raises(ValueError, match="does not fit worker 0"):
        next(psgd.worker_batches(10, 0, 5, batch_size=3))


def test_local_sgd_every_step_equals_synchronous_sgd(ranks):
    reference = _synchronous_sgd()
    for rank, (every_step, every_other, *_) in enumerate(ranks):
        assert (every_step - reference).abs().max() < 1e-12, f"rank {rank}: K=1 is not synchronous SGD"
        # The same comparison catches an algorithm that is not synchronous SGD.
        assert (every_other - reference).abs().max() > 1e-6, "K=2 should differ from synchronous SGD"


def test_one_shot_average_is_the_mean_of_independent_models(ranks):
    alone = [_run(STEPS, r, WORLD, average=lambda m: None)[0] for r in range(WORLD)]
    mean = torch.stack(alone).mean(0)
    for rank, (_, _, one_shot, _, history) in enumerate(ranks):
        assert (one_shot - mean).abs().max() < 1e-12, f"rank {rank}: one-shot average != mean of the workers"
        assert history.n_averages == 1
        assert min((one_shot - a).abs().max() for a in alone) > 1e-4, "the average is no single worker's model"


def test_history_records_every_step_and_every_average(ranks):
    _, _, _, history, _ = ranks[0]
    assert len(history.losses) == STEPS and history.n_averages == STEPS
    assert history.eval_steps == list(range(1, STEPS + 1)) and len(history.test_accuracy) == STEPS
    assert all(0 <= a <= 1 for a in history.test_accuracy)
    assert 0 < history.averaging_time < history.wall_time
    seconds = history.eval_seconds       # training time at each evaluation, evaluations left out
    assert len(seconds) == STEPS and all(0 < a < b for a, b in zip(seconds, seconds[1:]))
    assert seconds[-1] <= history.wall_time


def test_last_step_always_averages():
    x, y = _data()
    calls = []
    history = psgd.local_sgd(_model(), x, y, steps=7, batch_size=4, lr=0.1, sync_every=3,
                             average=lambda m: calls.append(1))
    assert history.n_averages == len(calls) == 3, "after steps 3 and 6, and after the last (7)"


_MPI_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from torch import nn
    from mpi4py import MPI
    from utils.parallel_sgd import average_parameters

    def model(seed):
        torch.manual_seed(seed)
        m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        nn.init.normal_(m[1].weight), nn.init.normal_(m[1].bias)
        m(torch.randn(8, 3))                    # running statistics differ per seed
        return m

    world = MPI.COMM_WORLD
    m = model(world.Get_rank())
    before = {k: v.clone() for k, v in m.state_dict().items()}
    average_parameters(m, MPI.COMM_SELF)
    unchanged = all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    average_parameters(m, world)
    state = {k: v.tolist() for k, v in m.state_dict().items()}
    if world.Get_rank() == 0:
        print(json.dumps({"size": world.Get_size(), "unchanged_by_self": unchanged, "state": state}))
""")


def _model_for_seed(seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    nn.init.normal_(m[1].weight), nn.init.normal_(m[1].bias)
    m(torch.randn(8, 3))
    return m


def _run_mpi_script(tmp_path, launcher):
    script = tmp_path / "average.py"
    script.write_text(_MPI_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(launcher + [sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mpi_average_over_comm_self_leaves_the_weights_unchanged(tmp_path):
    pytest.importorskip("mpi4py")
    result = _run_mpi_script(tmp_path, [])        # a singleton MPI process: COMM_WORLD has size 1 too
    assert result["size"] == 1 and result["unchanged_by_self"]
    for name, value in _model_for_seed(0).state_dict().items():
        assert torch.allclose(torch.tensor(result["state"][name]).to(value.dtype), value), name


def test_mpi_average_over_two_ranks(tmp_path):
    pytest.importorskip("mpi4py")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip(f"no mpiexec beside {sys.executable} (the mpich wheel installs one: pip install mpich)")
    result = _run_mpi_script(tmp_path, [str(mpiexec), "-n", "2"])
    assert result["size"] == 2 and result["unchanged_by_self"]
    models = [_model_for_seed(0).state_dict(), _model_for_seed(1).state_dict()]
    for name, got in result["state"].items():
        got = torch.tensor(got)
        if name.endswith("num_batches_tracked"):
            assert got.item() == 1, "an integer step counter is the same everywhere and stays as it is"
            continue
        expected = (models[0][name] + models[1][name]) / 2
        assert torch.allclose(got, expected, atol=1e-6), f"{name} is not the mean of both ranks' values"
        assert not torch.allclose(expected, models[0][name]), f"{name}: the ranks started equal, a weak check"


def test_average_parameters_refuses_what_it_cannot_view_before_communicating():
    with pytest.raises(ValueError, match="float32 and float64"):
        psgd.average_parameters(nn.Linear(2, 2).half(), comm=None)   # comm is never touched


def _measured_one_shot_job(rank, world_size):
    """One-shot averaging evaluated every 4 steps: the average taken for measurement must not reach the workers."""
    average = lambda m: psgd.average_parameters_torch(m)
    x, y = _data()
    model = _model()
    history = psgd.local_sgd(model, x, y, steps=STEPS, batch_size=BATCH, lr=LR, sync_every=STEPS, average=average,
                             rank=rank, world_size=world_size, seed=3, x_test=x[:20], y_test=y[:20], eval_every=4)
    plain, _ = _run(STEPS, rank, world_size, average)
    return _flat(model).numpy(), plain.numpy(), history


def test_one_shot_is_measured_during_training_without_feeding_the_measurement_back():
    for rank, (measured, plain, history) in enumerate(run_ranks(_measured_one_shot_job, WORLD)):
        assert abs(measured - plain).max() < 1e-12, f"rank {rank}: the measurement's average changed the training"
        assert history.eval_steps == [4, 8, 12] and history.n_averages == 1
        assert len(history.eval_seconds) == 3 and history.eval_seconds[-1] <= history.wall_time


def test_warmup_lr_ramps_linearly_from_lr_to_peak():
    rates = [psgd.warmup_lr(step, 0.1, 0.4, 3) for step in range(1, 7)]
    assert rates == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert psgd.warmup_lr(1, 0.1, 0.4, 0) == 0.4
    with pytest.raises(ValueError):
        psgd.warmup_lr(0, 0.1, 0.4, 3)


def test_local_sgd_warmup_matches_a_hand_written_loop():
    x, y = _data()
    model = _model()
    psgd.local_sgd(model, x, y, steps=STEPS, batch_size=BATCH, lr=LR, sync_every=1, average=lambda m: None,
                   seed=3, peak_lr=3 * LR, warmup_steps=5)
    reference = _model()
    batches = psgd.worker_batches(N, 0, 1, BATCH, seed=3)
    for step in range(1, STEPS + 1):
        idx = next(batches)
        reference.zero_grad()
        F.cross_entropy(reference(x[idx]), y[idx]).backward()
        with torch.no_grad():
            for p in reference.parameters():
                p -= psgd.warmup_lr(step, LR, 3 * LR, 5) * p.grad
    assert (_flat(model) - _flat(reference)).abs().max() < 1e-12

"""utils.hogwild: every process's updates reach the shared model, no process outlives the call,
and the collision measurements of lost_updates.

The reach test is built so that it can fail: the inputs of process r's shard are non-zero in
feature block r only, so process r's gradients touch the columns of block r and nothing else. The
shared model must change in every block; with private copies (share_memory=False) the very same
check finds no change at all.
"""
from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from utils import hogwild
from utils.parallel_sgd import shard_indices

P, BLOCK, CLASSES, N, SEED = 2, 4, 3, 96, 5


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def _block_data():
    """Sample i of shard r has features in block r only; labels from a random linear teacher."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(N, P * BLOCK)
    for r, shard in enumerate(shard_indices(N, P, SEED)):
        x[shard, r * BLOCK:(r + 1) * BLOCK] = torch.randn(len(shard), BLOCK, generator=g)
    y = (x @ torch.randn(P * BLOCK, CLASSES, generator=g)).argmax(1)
    return x, y


def _model():
    torch.manual_seed(0)
    return nn.Linear(P * BLOCK, CLASSES, bias=False)


def _children():
    """This process's descendants, except multiprocessing's resource tracker (one per session)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return {c.pid for c in alive}


def _train(share_memory=True, y=None, epochs=4):
    x, y0 = _block_data()
    model = _model()
    start = model.weight.detach().clone()
    result = hogwild.train_hogwild(model, (x, y0 if y is None else y), processes=P, epochs=epochs, batch_size=4,
                                   lr=0.2, seed=SEED, share_memory=share_memory, timeout=120)
    return model, start, result


def test_every_process_updates_reach_the_shared_weights_and_the_loss_falls():
    before = _children()
    model, start, result = _train()
    assert result.model is model
    assert result.updates == [4 * -(-len(s) // 4) for s in shard_indices(N, P, SEED)], "4 epochs of batches of 4"
    change = (model.weight.detach() - start).abs()
    for r in range(P):
        assert change[:, r * BLOCK:(r + 1) * BLOCK].max() > 1e-3, f"process {r}'s updates never reached the model"
    x, y = _block_data()
    with torch.no_grad():
        initial = F.cross_entropy(x @ start.T, y).item()
        final = F.cross_entropy(model(x), y).item()
    assert final < 0.6 * initial, f"loss {initial:.3f} -> {final:.3f}"
    assert all(losses[-1] < losses[0] for losses in result.epoch_losses)
    assert 0 < result.train_time <= result.wall_time
    assert _children() <= before, "a Hogwild process outlived the call"


def test_without_shared_memory_the_same_check_finds_no_change():
    model, start, result = _train(share_memory=False)
    assert all(u > 0 for u in result.updates), "the processes did train..."
    assert torch.equal(model.weight.detach(), start), "...but on private copies the parent never sees"


def test_a_worker_error_is_raised_here_with_its_traceback_and_no_process_is_left():
    before = _children()
    x, y = _block_data()
    y = y.clone()
    y[shard_indices(N, P, SEED)[1]] = CLASSES          # out of range: only process 1 fails
    with pytest.raises(hogwild.HogwildError, match=r"(?s)process 1 of 2 raised.*Traceback.*out of bounds"):
        _train(y=y)
    assert _children() <= before


def test_an_interrupted_call_leaves_no_process():
    import signal

    # _thread.interrupt_main does nothing while SIGINT is ignored or left to the system (SIG_IGN, SIG_DFL: its
    # documentation). Once, in a whole run of the suite, the interrupt never arrived and the call ran into its 120 s
    # limit; Python's own handler is set here, whatever ran before.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_call_leaves_no_process()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_call_leaves_no_process():
    before = _children()

    def interrupt_once_running():
        end = time.monotonic() + 60
        while len(_children() - before) < P and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(3)             # past start-up, most likely training
        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        _train(epochs=100_000)
    assert _children() <= before


_KILLED_PARENT = textwrap.dedent("""
    import torch
    from torch import nn
    from utils import hogwild

    if __name__ == "__main__":
        x, y = torch.randn(64, 8), torch.randint(3, (64,))
        hogwild.train_hogwild(nn.Linear(8, 3), (x, y), processes=2, epochs=10**6, batch_size=4, lr=0.01)
""")


def test_workers_stop_when_their_parent_is_killed(tmp_path):
    """A kernel killed with SIGKILL runs no cleanup: its workers must notice on their own."""
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_PARENT)
    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, str(script)], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    workers = []
    try:
        end = time.monotonic() + 60
        while len(workers) < P and time.monotonic() < end and parent.poll() is None:
            workers = [c for c in psutil.Process(parent.pid).children() if "spawn_main" in " ".join(c.cmdline())]
            time.sleep(0.1)
        assert len(workers) == P, f"the workers never started (parent exit code {parent.poll()})"
        time.sleep(3)                               # let them pass start-up and train
        os.kill(parent.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"workers {[w.pid for w in alive]} outlived their killed parent"
    finally:
        for process in [parent] + workers:        # a failing run must not leave them behind either
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        parent.wait()


def test_one_process_loses_nothing_and_collides_with_no_one():
    for kind in ("dense", "sparse"):
        result = hogwild.lost_updates(kind, processes=1, steps=200, n_features=2000)
        assert result["conflict_fraction"] == result["write_overlap_fraction"] == 0.0, kind
        # The applied increments add up to the net change of the weights: the accounting is exact.
        assert result["lost_fraction"] < 1e-9 and result["lost_weights"] == 0, (kind, result)


def test_dense_updates_collide_far_more_often_than_sparse_ones():
    dense = hogwild.lost_updates("dense", processes=2, steps=400, n_features=2000)
    sparse = hogwild.lost_updates("sparse", processes=2, steps=400, n_features=2000)
    assert dense["written_per_update"] == 1.0 and sparse["written_per_update"] < 0.01
    assert sparse["conflict_fraction"] < 0.1, "5 of 2000 features per update seldom meet"
    assert dense["conflict_fraction"] > sparse["conflict_fraction"], (dense, sparse)
    assert dense["updates"] == sparse["updates"] == 800


def test_clear_errors():
    with pytest.raises(ValueError, match="processes must be"):
        hogwild.train_hogwild(_model(), _block_data(), processes=0, epochs=1, batch_size=4, lr=0.1)
    with pytest.raises(ValueError, match="'dense' or 'sparse'"):
        hogwild.lost_updates("medium")


# --- Worker: what the learner's own processes run in lab 08 ------------------------------------------

def _count_batches(model, x, y, epochs, seed):
    return epochs * len(x) + seed          # stands for a worker's update count: shows what it was given


def test_worker_runs_the_function_with_the_per_process_seed_and_records_updates_and_times():
    worker = hogwild.Worker(_count_batches, 1, 2, seed=3)
    worker(0, nn.Linear(2, 2), torch.zeros(5, 2), torch.zeros(5))
    assert worker.updates.tolist() == [2 * 5 + 3 * 65537 + 1]       # train_hogwild's seed for process 0
    start, end = worker.times[0].tolist()
    assert 0 < start <= end and worker.train_time() == pytest.approx(end - start)


def test_wait_for_all_starts_together_or_gives_up_after_its_timeout():
    ready = torch.zeros(2, dtype=torch.int32)
    began = time.monotonic()
    assert not hogwild.wait_for_all(ready, 0, timeout=0.2)          # process 1 never came
    assert 0.2 <= time.monotonic() - began < 5
    ready[1] = 1
    assert hogwild.wait_for_all(ready, 0, timeout=0.2)


def _slow_trainer(model, x, y, seed):
    for _ in range(10):                    # one "update" every 20 ms, each adding 1 to every weight
        with torch.no_grad():
            model.weight += 1
        time.sleep(0.02)
    return 10


def test_snapshots_copy_the_shared_weights_during_training_stamped_with_training_time():
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    worker = hogwild.Worker(_slow_trainer, 1)
    with hogwild.Snapshots(model, worker, every_s=0.05) as snaps:
        trainer = threading.Thread(target=worker, args=(0, model, torch.zeros(4, 2), torch.zeros(4)))
        trainer.start()
        trainer.join()
    times = [t for t, _ in snaps.taken]
    values = [float(state["weight"][0, 0]) for _, state in snaps.taken]
    assert len(snaps.taken) >= 3, "copies taken while the worker trained, and one at the end"
    assert all(a < b for a, b in zip(times, times[1:])) and times[-1] == pytest.approx(worker.train_time())
    assert values == sorted(values) and values[-1] == 10 and values[0] < 10, "copies of the weights as they were"
    assert float(model.weight[0, 0]) == 10, "the copies never reach the shared model"
    seconds, accuracies = snaps.evaluate(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))
    assert seconds == times and len(accuracies) == len(times)

"""utils.sweep: configurations on the engines, results in order, failures reported, threads per engine,
and the result table.

One 2-engine cluster serves the module (a start costs seconds). The functions that run on the engines
are defined inside the tests: cloudpickle sends such functions by value, as it does those of a notebook
(this test module itself cannot be imported on the engines).
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field

import pytest
import torch
from ipyparallel import interactive

from utils import cluster, sweep

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def workers():
    started = cluster.start(2, backend="gloo", activate=False)
    yield started
    cluster.stop()


@interactive
def _all_reduce_ones():
    x = torch.ones(1)
    dist.all_reduce(x)  # noqa: F821 (dist is defined on every engine by utils.cluster)
    return x.item()


class _Bar:
    """Stands in for tqdm: records when it advanced."""

    def __init__(self, total):
        self.total, self.updates, self.closed = total, [], False

    def update(self, n):
        self.updates.append((time.time(), n))

    def set_postfix(self, **kwargs):
        self.postfix = kwargs

    def close(self):
        self.closed = True


def test_results_come_in_configuration_order_when_engines_finish_out_of_order(workers, monkeypatch):
    bars = []
    monkeypatch.setattr(sweep, "progress_bar", lambda total, enabled, **style: bars.append(_Bar(total)) or bars[-1])

    def slow_first(index, pause):
        time.sleep(pause)
        return {"index": index, "finished": time.time()}

    pauses = [1.5, 0.0, 0.3, 0.0]
    runs = sweep.run(slow_first, [dict(index=i, pause=p) for i, p in enumerate(pauses)], workers)
    assert [run.config for run in runs] == [dict(index=i, pause=p) for i, p in enumerate(pauses)]
    assert [run.result["index"] for run in runs] == [0, 1, 2, 3]
    assert all(run.ok and run.error is None for run in runs)
    finished = [run.result["finished"] for run in runs]
    assert finished[0] > max(finished[1:]), "the first configuration should have finished last"
    assert {run.engine for run in runs} == {0, 1}
    assert runs[0].seconds >= 1.5 > runs[1].seconds
    bar, = bars
    assert bar.total == 4 and [n for _, n in bar.updates] == [1, 1, 1, 1] and bar.closed
    assert bar.updates[0][0] < finished[0], "the bar should advance as runs finish, not at the end"
    assert workers.run(_all_reduce_ones) == [2.0, 2.0]  # the cluster's process group is untouched


def test_a_failing_configuration_is_reported_with_its_settings_and_traceback(workers):
    def check_lr(lr):
        print(f"checking lr={lr}")
        if lr > 1:
            raise ValueError(f"lr={lr} diverges")
        return lr

    def train(lr, steps):
        return {"loss": [1.0 / (1 + lr * s) for s in range(1, steps + 1)], "lr_used": check_lr(lr)}

    configs = [dict(lr=0.1, steps=3), dict(lr=5.0, steps=3), dict(lr=0.2, steps=2)]
    with pytest.warns(UserWarning, match=r"1 of 3 configurations failed[\s\S]*'lr': 5.0[\s\S]*ValueError: lr=5.0"):
        runs = sweep.run(train, configs, workers, progress=False)
    assert [run.ok for run in runs] == [True, False, True]
    assert runs[0].result["loss"] == pytest.approx([1 / 1.1, 1 / 1.2, 1 / 1.3])
    assert runs[2].result["lr_used"] == 0.2
    failed = runs[1]
    assert failed.config == dict(lr=5.0, steps=3) and failed.result is None
    assert failed.error.startswith("Traceback") and failed.error.endswith("ValueError: lr=5.0 diverges")
    # Both of the learner's frames, with file and source line (cloudpickle drops them; run() restores them).
    assert f'File "{__file__}"' in failed.error
    assert 'raise ValueError(f"lr={lr} diverges")' in failed.error and "check_lr(lr)" in failed.error
    assert "_run_on_engine" not in failed.error
    assert [run.output for run in runs] == [f"checking lr={c['lr']}\n" for c in configs]
    text = sweep.table(runs)
    header, _, *rows = text.splitlines()
    assert header.split() == ["lr", "steps", "loss", "lr_used", "time", "(s)", "error"]
    assert rows[1].split()[:2] == ["5", "3"] and rows[1].endswith("ValueError: lr=5.0 diverges")
    assert rows[0].split()[:4] == ["0.1", "3", f"{1 / 1.3:.4g}", "0.1"]


def test_threads_are_set_per_engine_for_the_run_and_restored(workers):
    def threads(index):
        time.sleep(0.2)  # long enough for both engines to take configurations
        return torch.get_num_threads()

    before = workers.view.apply_sync(torch.get_num_threads)
    odd = (os.cpu_count() or 1) + 1  # never what the sweep would choose
    workers.view.apply_sync(torch.set_num_threads, odd)
    try:
        runs = sweep.run(threads, [dict(index=i) for i in range(4)], workers, progress=False)
        assert [run.result for run in runs] == [max(1, (os.cpu_count() or 1) // 2)] * 4
        assert {run.engine for run in runs} == {0, 1}
        assert workers.view.apply_sync(torch.get_num_threads) == [odd, odd]
        runs = sweep.run(threads, [dict(index=i) for i in range(2)], workers, progress=False, threads_per_engine=3)
        assert [run.result for run in runs] == [3, 3]
        assert workers.view.apply_sync(torch.get_num_threads) == [odd, odd]
    finally:
        for engine, n in zip(workers.view.targets, before):
            workers.client[engine].apply_sync(torch.set_num_threads, n)


def test_closures_travel_by_value(workers):
    scale = torch.tensor([2.0, 3.0])

    def helper(x):
        return x * scale

    def uses_closure(x):
        return helper(torch.tensor(x)).tolist()

    runs = sweep.run(uses_closure, [dict(x=[1.0, 1.0]), dict(x=[0.5, 2.0])], workers, progress=False)
    assert [run.result for run in runs] == [[2.0, 3.0], [1.0, 6.0]]


def test_a_result_that_cannot_travel_is_that_configurations_error(workers):
    import threading

    def returns(kind):
        return threading.Lock() if kind == "lock" else kind

    with pytest.warns(UserWarning, match="1 of 2"):
        runs = sweep.run(returns, [dict(kind="lock"), dict(kind="fine")], workers, progress=False)
    assert "could not be sent back" in runs[0].error and runs[1].result == "fine"


def test_no_configurations_no_runs(workers):
    assert sweep.run(lambda lr: lr, [], workers) == []
    assert sweep.table([]).splitlines()[0] == "time (s)"


@pytest.mark.parametrize("configs, kwargs, words", [
    (dict(lr=0.1), {}, "wrap it in a list"),
    ([dict(lr=0.1), dict(learning_rate=0.1)], {}, r"configuration 1 \{'learning_rate': 0.1\}"),
    ([0.1], {}, "configuration 0 must be a dict"),
    ([dict(lr=0.1)], dict(threads_per_engine=0), "threads_per_engine"),
])
def test_mistakes_are_value_errors_before_anything_runs(workers, configs, kwargs, words):
    with pytest.raises(ValueError, match=words):
        sweep.run(lambda lr: lr, configs, workers, **kwargs)


def test_workers_must_be_a_cluster():
    with pytest.raises(ValueError, match="cluster.start"):
        sweep.run(lambda lr: lr, [dict(lr=0.1)], None)


# --- the table, without engines ------------------------------------------------------------------

@dataclass
class _History:
    train_loss: list = field(default_factory=list)
    batch_size: int = 0
    device: str = "cpu"


def test_final_metrics_takes_the_last_value_of_each_history():
    assert sweep.final_metrics(0.25) == {"result": 0.25}
    assert sweep.final_metrics(torch.tensor(1.5)) == {"result": 1.5}
    assert sweep.final_metrics({"loss": [3.0, 2.0], "acc": torch.tensor([0.1, 0.7]), "name": "x", "empty": []}) \
        == {"loss": 2.0, "acc": pytest.approx(0.7)}
    assert sweep.final_metrics(_History([2.0, 1.0], 64)) == {"train_loss": 1.0, "batch_size": 64}
    assert sweep.final_metrics("text") == {} and sweep.final_metrics(None) == {}


def test_table_columns_settings_metrics_time_and_errors():
    runs = [sweep.Run({"batch": 64, "lr": 0.1}, {"batch": 64, "loss": [1.0, 0.123456]}, seconds=2.04, engine=0),
            sweep.Run({"batch": 512, "warmup": 5}, {"loss": [math.nan]}, seconds=1.0, engine=1),
            sweep.Run({"batch": 4096, "lr": 3.2}, error="Traceback ...\nRuntimeError: loss is nan", seconds=0.5)]
    lines = sweep.table(runs).splitlines()
    assert re.split(r" {2,}", lines[0]) == ["batch", "lr", "warmup", "batch (result)", "loss", "time (s)", "error"]
    assert lines[2].split() == ["64", "0.1", "64", "0.1235", "2.0"]
    assert lines[3].split() == ["512", "5", "nan", "1.0"]
    assert lines[4].split()[:3] == ["4096", "3.2", "0.5"] and lines[4].endswith("RuntimeError: loss is nan")
    assert sweep.table(runs, metrics=["loss"]).splitlines()[0].split()[:4] == ["batch", "lr", "warmup", "loss"]


def test_results_are_the_returned_values_or_an_error_naming_the_failed_configurations():
    good = [sweep.Run(config={"lr": 0.1}, result={"loss": 1.0}), sweep.Run(config={"lr": 0.2}, result=2)]
    assert sweep.results(good) == [{"loss": 1.0}, 2]
    bad = good + [sweep.Run(config={"lr": 9.0}, error="Traceback (most recent call last):\nValueError: lr too big")]
    with pytest.raises(RuntimeError, match=r"1 of 3 configuration\(s\) failed") as info:
        sweep.results(bad)
    assert "9" in str(info.value) and "ValueError: lr too big" in str(info.value)

"""utils.scaling (DDP's buckets, the predicted communication, the scaling measurement) and utils.gpu_speed."""
from __future__ import annotations

import json
import random

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import run_ranks
from utils import collectives, data, gpu_speed, scaling


def torch_buckets(param_bytes, bucket_cap_mb):
    """What a real DDP all-reduces for parameters of these sizes (lab 06's check records it with a
    comm hook); ``param_bytes`` in backward order, the model's parameters in the opposite order."""
    from utils.checks.lab06 import recorded_buckets

    return recorded_buckets(list(reversed(param_bytes)), bucket_cap_mb=bucket_cap_mb)


def test_first_bucket_constant_is_torchs():
    assert scaling.FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES


@pytest.mark.parametrize("seed", range(12))
def test_buckets_match_a_real_ddp_on_random_models(seed):
    rng = random.Random(seed)
    sizes = [4 * rng.choice([1, 10, 1000, 2 ** 16, 2 ** 18, 2 ** 19]) for _ in range(rng.randint(1, 30))]
    cap = [None, 0.5, 1.0, 4.0, 25.0][seed % 5]   # None: DDP's default (a 1 MiB first bucket)
    assert scaling.ddp_bucket_bytes(sizes, cap) == torch_buckets(sizes, cap)


def test_no_gradients_no_buckets():
    assert scaling.ddp_bucket_bytes([]) == []
    assert scaling.predicted_comm_seconds([], 4, 1e-5, 1e-9) == 0


def test_predicted_comm_is_the_sum_over_buckets():
    sizes = [2 ** 20, 2 ** 22, 2 ** 22, 400]
    # Default cap: the first bucket closes at 1 MiB, the next at 25 MiB. A cap of 4 MiB: every bucket at 4 MiB.
    assert scaling.ddp_bucket_bytes(sizes) == [2 ** 20, 2 ** 23 + 400] == torch_buckets(sizes, None)
    buckets = scaling.ddp_bucket_bytes(sizes, bucket_cap_mb=4)
    assert buckets == [2 ** 20 + 2 ** 22, 2 ** 22, 400] == torch_buckets(sizes, 4)
    alpha, beta = 2e-5, 1e-9
    expected = sum(2 * 3 * alpha + 2 * 3 / 4 * n * beta for n in buckets)
    assert scaling.predicted_comm_seconds(sizes, 4, alpha, beta, bucket_cap_mb=4) == pytest.approx(expected)
    assert scaling.predicted_comm_seconds(sizes, 1, alpha, beta, bucket_cap_mb=4) == 0   # one rank sends nothing
    assert collectives.ring_all_reduce_seconds(1, 4, alpha, beta) > 0


def _scaling_job(rank, world_size):
    from utils.models import CNN

    timings = scaling.time_scaling(lambda: CNN((1, 12, 12), channels=(2, 4), hidden=8), (1, 12, 12), 10,
                                   {"strong": lambda k: 12 // k, "weak": lambda k: 4}, torch.device("cpu"),
                                   warmup=1, repeats=2)
    return {f"{label}/{k}": value for (label, k), value in timings.items()}


def test_time_scaling_times_every_k_on_the_ranks_that_take_part():
    per_rank = run_ranks(_scaling_job, 3, deadline_s=120)
    # rank r takes part in k = r+1 .. 3; every entry has both times and the asked-for batch
    for rank, timings in enumerate(per_rank):
        assert sorted(timings) == sorted(f"{label}/{k}" for label in ("strong", "weak") for k in range(rank + 1, 4))
        for key, value in timings.items():
            label, k = key.split("/")
            assert value["per_rank"] == (12 // int(k) if label == "strong" else 4)
            assert value["ddp"] > 0 and value["compute"] > 0


def _shared_routine_job(rank, world_size):
    import functools

    from torch.nn.parallel import DistributedDataParallel

    from utils.models import MLP

    def seen(label, group, model, x, y):
        torch.manual_seed(0)
        fresh = MLP(n_layers=2, d_in=6, d_hidden=5, n_classes=3)
        return {"rows": len(x), "x_sum": float(x.sum()), "labels": y.tolist(), "group_size": group.size(),
                "bare": not isinstance(model, DistributedDataParallel),
                "stepped": any(not torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))}

    build = functools.partial(MLP, n_layers=2, d_in=6, d_hidden=5, n_classes=3)
    workloads = {"fixed": scaling.Workload(build, (6,), 3, lambda k: 4),
                 "shrinking": scaling.Workload(build, (6,), 3, lambda k: 12 // k)}
    timings = scaling.time_ddp_against_bare(workloads, "cpu", warmup=0, repeats=1, more=seen)
    return {f"{label}/{k}": value for (label, k), value in timings.items()}


def test_time_ddp_against_bare_hands_labs_the_stepped_model_and_each_ranks_own_batch():
    """What labs 04 and 06 add (buckets, all-reduce, per-rank batch) is measured on the bare model the two
    timings stepped, on k ranks, with this rank's batch: the same samples at every k, other ranks' differ."""
    per_rank = run_ranks(_shared_routine_job, 3, deadline_s=120)
    for rank, timings in enumerate(per_rank):
        assert sorted(timings) == sorted(f"{label}/{k}" for label in ("fixed", "shrinking") for k in range(rank + 1, 4))
        for key, value in timings.items():
            label, k = key.split("/")
            assert list(value)[:2] == ["ddp", "compute"] and value["ddp"] > 0 and value["compute"] > 0
            assert value["group_size"] == int(k) and value["bare"] and value["stepped"], key
            assert value["rows"] == (4 if label == "fixed" else 12 // int(k)), key
        fixed = {(v["x_sum"], tuple(v["labels"])) for key, v in timings.items() if key.startswith("fixed/")}
        assert len(fixed) == 1, f"rank {rank} stepped on different samples at different k"
    assert len({per_rank[r]["fixed/3"]["x_sum"] for r in range(3)}) == 3, "ranks stepped on the same samples"


def test_gpu_speed_refuses_a_cpu():
    with pytest.raises(ValueError, match="CUDA GPU"):
        gpu_speed.wrn_settings(torch.device("cpu"))


def test_recorded_runs_are_read_oldest_first(tmp_path):
    for name, date in (("b", "2026-02-01"), ("a", "2026-01-01")):
        (tmp_path / f"wrn_gpu_{name}.json").write_text(json.dumps({"machine": name, "date": date, "rows": []}))
    (tmp_path / "other.json").write_text("{}")
    assert [run["machine"] for run in gpu_speed.recorded_runs(tmp_path)] == ["a", "b"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wrn_settings_on_a_gpu():
    rows = gpu_speed.wrn_settings(torch.device("cuda"), (3, 32, 32), depth=10, width=1, batch=16, steps=2, warmup=1)
    assert [row["setting"].split(", ")[-1] for row in rows] == list(gpu_speed.SETTINGS)
    assert all(row["images_per_s"] > 0 for row in rows)


def _tiny_colour_set():
    return data.shapes(num_samples=200, size=8, channels=3, test_fraction=0.2)


def test_train_to_accuracy_stops_once_the_target_is_met_in_a_row():
    run = gpu_speed.train_to_accuracy(_tiny_colour_set(), "cpu", depth=10, width=1, batch=32, epochs=5, target=0.0,
                                      in_a_row=2, dtype=None, channels_last=False)
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]             # any accuracy meets 0.0: stops after two
    assert run["reached_epoch"] == 2 and run["reached_s"] == run["epochs"][-1]["train_s"]
    assert 0 < run["epochs"][0]["train_s"] < run["epochs"][1]["train_s"]
    assert torch.backends.cudnn.benchmark is False                      # the global setting is put back


def test_train_to_accuracy_runs_every_epoch_when_the_target_is_out_of_reach():
    run = gpu_speed.train_to_accuracy(_tiny_colour_set(), "cpu", depth=10, width=1, batch=32, epochs=3, target=1.01,
                                      dtype=None, channels_last=True)
    assert len(run["epochs"]) == 3 and run["reached_epoch"] is None and run["reached_s"] is None
    assert all(0 <= e["val_accuracy"] <= 1 for e in run["epochs"])


def test_train_to_accuracy_refuses_a_batch_larger_than_the_data():
    with pytest.raises(ValueError, match="larger than the 160 training images"):
        gpu_speed.train_to_accuracy(_tiny_colour_set(), "cpu", batch=512)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_to_accuracy_on_a_gpu_with_the_labs_settings():
    run = gpu_speed.train_to_accuracy(_tiny_colour_set(), "cuda", depth=10, width=1, batch=32, epochs=2, target=None)
    assert len(run["epochs"]) == 2 and run["epochs"][1]["train_s"] > 0


def test_slowest_steps_takes_each_steps_slowest_rank():
    per_rank = [{("weak", 1): {"ddp": 5.0, "compute": 4.0, "per_rank": 8}, ("weak", 2): {"ddp": 7.0, "compute": 3.0, "per_rank": 8}},
                {("weak", 2): {"ddp": 6.0, "compute": 3.5, "per_rank": 8}}]
    assert scaling.slowest_steps(per_rank) == {("weak", 1): {"ddp": 5.0, "compute": 4.0},
                                               ("weak", 2): {"ddp": 7.0, "compute": 3.5}}


def test_plot_scaling_draws_throughput_efficiency_and_each_models_communication():
    import matplotlib
    matplotlib.use("Agg")
    fig = scaling.plot_scaling([1, 2], {"CNN, weak": [100.0, 150.0]},
                               {"CNN": ([0.0, 2.0], [0.0, 1.0]), "wide": ([0.0, 9.0], [0.0, 8.0])}, "title")
    assert len(fig.axes) == 4
    assert [line.get_ydata()[1] for line in fig.axes[1].lines if len(line.get_ydata()) == 2][0] == 0.75


def _recorded_run(dataset):
    return {"machine": "m", "date": "d", "model": "WRN-16-4", "dataset": dataset, "target": 0.75,
            "epoch_s": {"fp32": 2.0, "bf16 autocast + channels_last": 1.0},
            "time_to_accuracy": {"epochs": [{"epoch": 1, "train_s": 3.0, "val_accuracy": 0.8}],
                                 "reached_epoch": 1, "reached_s": 3.0}}


def test_gpu_report_compares_with_nvidias_time_only_on_cifar10(capsys):
    rows = [{"setting": "fp32", "images_per_s": 100.0}, {"setting": "bf16", "images_per_s": 150.0}]
    gpu_speed.print_report(rows, "recorded", _recorded_run("shapes, colour 3x32x32"))
    out = capsys.readouterr().out
    assert "1.50x fp32" in out and "cannot be compared" in out and "same data set" not in out
    gpu_speed.print_report(rows, "recorded", _recorded_run("CIFAR-10, 50000 training images"))
    out = capsys.readouterr().out
    assert "on the same data set, CIFAR-10" in out and "cannot be compared" not in out
    gpu_speed.print_report([], None, None)
    assert "No GPU here" in capsys.readouterr().out

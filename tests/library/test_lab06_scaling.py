"""utils.labs.lab06 (DDP's buckets, the predicted communication, the scaling measurement) and utils.labs.lab06."""
from __future__ import annotations

import json
import random

import pytest
import torch
import torch.distributed as dist

from spawn_ranks import run_ranks
from utils import collectives, data, ddp_timing
from utils.labs import lab06


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def torch_buckets(param_bytes, bucket_cap_mb):
    """What a real DDP all-reduces for parameters of these sizes (lab 06's check records it with a
    comm hook); ``param_bytes`` in backward order, the model's parameters in the opposite order."""
    from utils.checks.lab06 import recorded_buckets

    return recorded_buckets(list(reversed(param_bytes)), bucket_cap_mb=bucket_cap_mb)


def test_first_bucket_constant_is_torchs():
    assert ddp_timing.FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES


@pytest.mark.parametrize("seed", range(12))
def test_buckets_match_a_real_ddp_on_random_models(seed):
    rng = random.Random(seed)
    sizes = [4 * rng.choice([1, 10, 1000, 2 ** 16, 2 ** 18, 2 ** 19]) for _ in range(rng.randint(1, 30))]
    cap = [None, 0.5, 1.0, 4.0, 25.0][seed % 5]   # None: DDP's default (a 1 MiB first bucket)
    assert ddp_timing.ddp_bucket_bytes(sizes, cap) == torch_buckets(sizes, cap)


def test_no_gradients_no_buckets():
    assert ddp_timing.ddp_bucket_bytes([]) == []
    assert ddp_timing.predicted_comm_seconds([], 4, 1e-5, 1e-9) == 0


def test_predicted_comm_is_the_sum_over_buckets():
    sizes = [2 ** 20, 2 ** 22, 2 ** 22, 400]
    # Default cap: the first bucket closes at 1 MiB, the next at 25 MiB. A cap of 4 MiB: every bucket at 4 MiB.
    assert ddp_timing.ddp_bucket_bytes(sizes) == [2 ** 20, 2 ** 23 + 400] == torch_buckets(sizes, None)
    buckets = ddp_timing.ddp_bucket_bytes(sizes, bucket_cap_mb=4)
    assert buckets == [2 ** 20 + 2 ** 22, 2 ** 22, 400] == torch_buckets(sizes, 4)
    alpha, beta = 2e-5, 1e-9
    expected = sum(2 * 3 * alpha + 2 * 3 / 4 * n * beta for n in buckets)
    assert ddp_timing.predicted_comm_seconds(sizes, 4, alpha, beta, bucket_cap_mb=4) == pytest.approx(expected)
    assert ddp_timing.predicted_comm_seconds(sizes, 1, alpha, beta, bucket_cap_mb=4) == 0   # one rank sends nothing
    assert collectives.ring_all_reduce_seconds(1, 4, alpha, beta) > 0


def _scaling_job(rank, world_size):
    from utils.models import CNN

    timings = lab06.time_scaling(lambda: CNN((1, 12, 12), channels=(2, 4), hidden=8), (1, 12, 12), 10,
                                   {"strong": lambda k: 12 // k, "weak": lambda k: 12 if k == 1 else 4},
                                   torch.device("cpu"), warmup=1, repeats=2)
    return {f"{label}/{k}": value for (label, k), value in timings.items()}


def test_time_scaling_times_every_k_on_the_ranks_that_take_part_and_k1_once():
    per_rank = run_ranks(_scaling_job, 3, deadline_s=120)
    # rank r takes part in k = r+1 .. 3; every entry has both times, each step's and the asked-for batch
    for rank, timings in enumerate(per_rank):
        assert sorted(timings) == sorted(f"{label}/{k}" for label in ("strong", "weak") for k in range(rank + 1, 4))
        for key, value in timings.items():
            label, k = key.split("/")
            assert value["per_rank"] == (12 // int(k) if label == "strong" or k == "1" else 4)
            assert value["ddp"] > 0 and value["compute"] > 0
            assert len(value["ddp_steps"]) == len(value["compute_steps"]) == 2
    # at k = 1 strong and weak scaling run the same step (12 samples): timed once, shared by both series
    one = per_rank[0]
    assert one["weak/1"]["same_run_as"] == "strong" and "same_run_as" not in one["strong/1"]
    assert one["weak/1"]["ddp_steps"] == one["strong/1"]["ddp_steps"]
    assert one["weak/2"]["ddp_steps"] != one["strong/2"]["ddp_steps"] and "same_run_as" not in one["weak/2"]


def _chosen_ks_job(rank, world_size):
    timings = lab06.time_scaling(lambda: torch.nn.Linear(3, 2), (3,), 2, {"weak": lambda k: 2}, "cpu",
                                   warmup=0, repeats=1, ks=[1, 3])
    return sorted(k for _, k in timings)


def test_time_scaling_times_only_the_ks_asked_for():
    assert run_ranks(_chosen_ks_job, 3, deadline_s=120) == [[1, 3], [3], [3]]


def test_worker_counts_follow_the_cores_up_to_eight_dividing_the_global_batch():
    assert lab06.worker_counts(1) == [1]
    assert lab06.worker_counts(2) == [1, 2]
    assert lab06.worker_counts(6) == [1, 2, 4]
    assert lab06.worker_counts(8) == lab06.worker_counts(64) == [1, 2, 4, 8]
    assert lab06.worker_counts(16, global_batch=48, most=16) == [1, 2, 3, 4, 6, 8, 12, 16]


def test_predicted_step_is_compute_plus_the_buckets_all_reduce():
    sizes, alpha, beta = [2 ** 20, 400], 1e-5, 1e-9
    comm = 1e3 * ddp_timing.predicted_comm_seconds(sizes, 4, alpha, beta)
    assert lab06.predicted_step_ms(8.0, 4, sizes, alpha, beta, strong=False) == pytest.approx(8.0 + comm)
    assert lab06.predicted_step_ms(8.0, 4, sizes, alpha, beta, strong=True) == pytest.approx(2.0 + comm)
    assert lab06.predicted_step_ms(8.0, 1, sizes, alpha, beta, strong=True) == 8.0


def test_speedup_verdict_prints_an_efficiency_only_below_100_percent_beyond_the_spread(tmp_path, monkeypatch):
    from verdict_rules import contradictions, verdicts

    record = tmp_path / "v.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    one = [100.0, 102.0, 98.0]
    below = lab06.speedup_verdict("CNN, weak", 2, one, [150.0, 152.0, 148.0])
    above = lab06.speedup_verdict("CNN, strong", 2, one, [260.0, 262.0, 258.0])     # 130%: contention at k = 1
    close = lab06.speedup_verdict("CNN, weak", 2, one, [195.0, 205.0, 199.0])
    assert "efficiency 75%" in below
    assert "not a speed-up" in above and "130%" not in above and "efficiency 1" not in above
    assert "not told apart from 100%" in close and "efficiency " not in close.replace("no efficiency", "")
    assert [v["conclusion"] for v in verdicts(record)] == ["lower", "higher", "within the spread"]
    assert not contradictions(record)


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
    workloads = {"fixed": ddp_timing.Workload(build, (6,), 3, lambda k: 4),
                 "shrinking": ddp_timing.Workload(build, (6,), 3, lambda k: 12 // k)}
    timings = ddp_timing.time_ddp_against_bare(workloads, "cpu", warmup=0, repeats=1, more=seen)
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
        lab06.wrn_settings(torch.device("cpu"))


def test_recorded_runs_are_read_oldest_first(tmp_path):
    for name, date in (("b", "2026-02-01"), ("a", "2026-01-01")):
        (tmp_path / f"wrn_gpu_{name}.json").write_text(json.dumps({"machine": name, "date": date, "rows": []}))
    (tmp_path / "other.json").write_text("{}")
    assert [run["machine"] for run in lab06.recorded_gpu_runs(tmp_path)] == ["a", "b"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wrn_settings_on_a_gpu():
    rows = lab06.wrn_settings(torch.device("cuda"), (3, 32, 32), depth=10, width=1, batch=16, steps=2, warmup=1)
    assert [row["setting"].split(", ")[-1] for row in rows] == list(lab06.SETTINGS)
    assert all(row["images_per_s"] > 0 for row in rows)


def _tiny_colour_set():
    return data.shapes(num_samples=200, size=8, channels=3, test_fraction=0.2)


def test_train_to_accuracy_stops_once_the_target_is_met_in_a_row():
    run = lab06.train_to_accuracy(_tiny_colour_set(), "cpu", depth=10, width=1, batch=32, epochs=5, target=0.0,
                                      in_a_row=2, dtype=None, channels_last=False)
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]             # any accuracy meets 0.0: stops after two
    assert run["reached_epoch"] == 2 and run["reached_s"] == run["epochs"][-1]["train_s"]
    assert 0 < run["epochs"][0]["train_s"] < run["epochs"][1]["train_s"]
    assert torch.backends.cudnn.benchmark is False                      # the global setting is put back


def test_train_to_accuracy_runs_every_epoch_when_the_target_is_out_of_reach():
    run = lab06.train_to_accuracy(_tiny_colour_set(), "cpu", depth=10, width=1, batch=32, epochs=3, target=1.01,
                                      dtype=None, channels_last=True)
    assert len(run["epochs"]) == 3 and run["reached_epoch"] is None and run["reached_s"] is None
    assert all(0 <= e["val_accuracy"] <= 1 for e in run["epochs"])


def test_train_to_accuracy_refuses_a_batch_larger_than_the_data():
    with pytest.raises(ValueError, match="larger than the 160 training images"):
        lab06.train_to_accuracy(_tiny_colour_set(), "cpu", batch=512)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_train_to_accuracy_on_a_gpu_with_the_labs_settings():
    run = lab06.train_to_accuracy(_tiny_colour_set(), "cuda", depth=10, width=1, batch=32, epochs=2, target=None)
    assert len(run["epochs"]) == 2 and run["epochs"][1]["train_s"] > 0


def test_slowest_steps_takes_each_steps_slowest_rank():
    per_rank = [{("weak", 1): {"ddp": 5.0, "compute": 4.0, "per_rank": 8}, ("weak", 2): {"ddp": 7.0, "compute": 3.0, "per_rank": 8}},
                {("weak", 2): {"ddp": 6.0, "compute": 3.5, "per_rank": 8}}]
    assert lab06.slowest_steps(per_rank) == {("weak", 1): {"ddp": 5.0, "compute": 4.0},
                                               ("weak", 2): {"ddp": 7.0, "compute": 3.5}}
    # each timed step (started together at a barrier) ends with its slowest rank
    per_rank[0][("weak", 2)].update(ddp_steps=[7.0, 1.0], compute_steps=[3.0, 0.5])
    per_rank[1][("weak", 2)].update(ddp_steps=[2.0, 6.0], compute_steps=[1.0, 3.5])
    assert lab06.slowest_steps(per_rank)[("weak", 2)] == {"ddp": 7.0, "compute": 3.5, "ddp_steps": [7.0, 6.0],
                                                            "compute_steps": [3.0, 3.5]}


def test_plot_scaling_draws_measured_and_predicted_throughput_and_each_models_communication():
    import matplotlib
    matplotlib.use("Agg")
    fig = lab06.plot_scaling([1, 2], {"CNN, weak": [100.0, 150.0]}, {"CNN, weak": [100.0, 190.0]},
                               {"CNN": ([0.0, 2.0], [0.0, 1.0]), "wide": ([0.0, 9.0], [0.0, 8.0])}, "title")
    assert len(fig.axes) == 3
    assert [list(line.get_ydata()) for line in fig.axes[0].lines] == [[100.0, 150.0], [100.0, 190.0]]


def _record(alpha=1e-5, beta=1e-9):
    def entry(per_rank, ddp, compute):
        return dict(per_rank=per_rank, ddp_steps=ddp, compute_steps=compute)

    one = dict(grad_bytes=[4000, 400], strong=entry(64, [10.0, 10.0, 12.0], [9.0, 9.0, 9.0]),
               weak=entry(64, [10.0, 10.0, 12.0], [9.0, 9.0, 9.0]))
    two = dict(grad_bytes=[4000, 400], strong=entry(32, [8.0, 8.0, 8.0], [5.0, 5.0, 5.0]),
               weak=entry(64, [16.0, 16.0, 16.0], [10.0, 10.0, 10.0]))
    return dict(machine=dict(cpu="test cpu", cores=2, torch="t"), date="2026-11-28", file="lab06_scaling_2core.json",
                complete=True, runs=[dict(workers=2, alpha=alpha, beta=beta, load_average=[1.5, 1, 1], models={"CNN": two}),
                                     dict(workers=1, alpha=None, beta=None, load_average=[0.5, 1, 1], models={"CNN": one})])


def test_recorded_curves_put_measured_throughput_beside_the_model_from_one_workers_computation():
    ks, throughput, predicted, communication = lab06.recorded_curves(_record())
    assert ks == [1, 2]
    assert throughput["CNN, weak"] == pytest.approx([6400.0, 8000.0]) and throughput["CNN, strong"] == pytest.approx([6400.0, 8000.0])
    comm = 1e3 * ddp_timing.predicted_comm_seconds([4000, 400], 2, 1e-5, 1e-9)
    assert predicted["CNN, weak"] == pytest.approx([64e3 / 9.0, 128e3 / (9.0 + comm)])
    assert predicted["CNN, strong"] == pytest.approx([64e3 / 9.0, 64e3 / (4.5 + comm)])
    assert communication["CNN"] == ([1.0, 6.0], [0.0, pytest.approx(comm)])
    assert "test cpu, 2 cores" in lab06.describe_record(_record()) and "load average 0.5-1.5" in lab06.describe_record(_record())


def test_a_recording_is_contended_when_the_load_left_fewer_idle_cores_than_workers():
    quiet, busy = _record(), _record()
    quiet["runs"][0]["load_average"] = [0.0, 1, 1]         # k = 2 on 2 idle cores; k = 1 at 0.5 leaves one idle
    assert not lab06.contended(quiet) and "contended" not in lab06.describe_record(quiet)
    busy["runs"][0]["load_average"] = [0.5, 1, 1]          # 0.5 + 2 workers > 2 cores
    assert lab06.contended(busy) and "contended" in lab06.describe_record(busy)


def test_recorded_runs_are_read_fewest_cores_first(tmp_path):
    for cores in (16, 2):
        (tmp_path / f"lab06_scaling_{cores}core.json").write_text(json.dumps(dict(_record(), machine=dict(cpu="c", cores=cores, torch="t"))))
    (tmp_path / "lab08_psgd_x.json").write_text("{}")
    assert [(r["machine"]["cores"], r["file"]) for r in lab06.recorded_runs(tmp_path)] == \
        [(2, "lab06_scaling_2core.json"), (16, "lab06_scaling_16core.json")]


def _recorded_run(dataset):
    return {"machine": "m", "date": "d", "model": "WRN-16-4", "dataset": dataset, "target": 0.75,
            "epoch_s": {"fp32": 2.0, "bf16 autocast + channels_last": 1.0},
            "time_to_accuracy": {"epochs": [{"epoch": 1, "train_s": 3.0, "val_accuracy": 0.8}],
                                 "reached_epoch": 1, "reached_s": 3.0}}


def test_gpu_report_compares_with_nvidias_time_only_on_cifar10(capsys):
    rows = [{"setting": "fp32", "images_per_s": 100.0}, {"setting": "bf16", "images_per_s": 150.0}]
    lab06.print_report(rows, "recorded", _recorded_run("shapes, colour 3x32x32"))
    out = capsys.readouterr().out
    assert "1.50x fp32" in out and "cannot be compared" in out and "same data set" not in out
    lab06.print_report(rows, "recorded", _recorded_run("CIFAR-10, 50000 training images"))
    out = capsys.readouterr().out
    assert "on the same data set, CIFAR-10" in out and "cannot be compared" not in out
    lab06.print_report([], None, None)
    assert "No GPU here" in capsys.readouterr().out


def _timings(ms: dict) -> list[dict]:
    """Two ranks' time_scaling results for every model: ``ms[(model, mode, k)] = (ddp ms, bare ms)`` per timed step;
    rank 1 a little faster than rank 0, so that the slowest rank's steps are rank 0's."""
    ranks = []
    for slower in (0.0, -0.05):
        ranks.append({name: {(mode, k): {"ddp": 0.0, "compute": min(c for _, c in steps) + slower,
                                          "ddp_steps": [d + slower for d, _ in steps],
                                          "compute_steps": [c + slower for _, c in steps]}
                             for (model, mode, k), steps in ms.items() if model == name}
                      for name in lab06.MODELS})
    return ranks


def _steps(ddp_ms, bare_ms, n=5):
    return [(ddp_ms + 0.01 * i, bare_ms + 0.01 * i) for i in range(n)]


def test_live_scaling_judges_only_where_each_worker_had_a_core_and_every_verdict_follows_its_numbers(tmp_path, monkeypatch):
    from verdict_rules import contradictions

    record = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    small, wide = lab06.MODELS
    ms = {}
    for model, comm in ((small, 2.0), (wide, 9.0)):
        one = _steps(20.0 + comm / 4, 20.0)
        ms.update({(model, "strong", 1): one, (model, "weak", 1): one,
                   (model, "strong", 2): _steps(10.0 + comm, 10.0), (model, "weak", 2): _steps(20.0 + comm, 20.0)})
    live = lab06.LiveScaling(_timings(ms), lab06.MODELS, [1, 2], 64, 64, (1, 28, 28), alpha=1e-4, beta=1e-9)
    assert live.rates(small, "weak", 2) == [2 * 64 / (22.0 + 0.01 * i) * 1e3 for i in range(5)]
    assert live.comm_ms(wide, 2) == pytest.approx([9.0] * 5)
    assert [m for m, _ in zip(*live.communication[small])] == pytest.approx([0.5, 2.0])
    said = live.verdicts(load=0.0, repeats=5, real_cores=4, cores=4, oversubscribed=False)
    text = "\n".join(said)
    # CNN, weak: 5 steps of 2 x 64 images at 22.0-22.04 ms against 2 x one worker's 20.5-20.54 ms: 93% of ideal
    weak = next(line for line in said if line.startswith(f"  {small}, weak: "))
    assert "workers against" in weak and "efficiency 93%, below 100% beyond the steps' spread" in weak, weak
    for name in (small, wide):
        strong = next(line for line in said if line.startswith(f"  {name}, strong against weak scaling"))
        assert strong.endswith("strong scaling is lower, as its smaller per-worker batch predicts."), strong
    assert f"{wide} sends" in text and "communication was the larger, as the bytes predict" in text, text
    assert record.exists() and not contradictions(record)
    assert live.verdicts(load=0.0, repeats=5, real_cores=2, cores=8, oversubscribed=True)[0].startswith("No timing verdict: 2")
    assert "load average before the run, 1.5" in live.verdicts(load=1.5, repeats=5, real_cores=2, cores=2,
                                                                oversubscribed=False)[0]
    assert len(live.table()) == 4 and "k=2" in live.table()[0]


def test_live_scaling_refuses_timings_that_measured_one_worker_twice():
    small, wide = lab06.MODELS
    ms = {(model, mode, k): _steps(20.0, 19.0) for model in (small, wide) for mode in ("strong", "weak") for k in (1, 2)}
    ms[(small, "weak", 1)] = _steps(25.0, 19.0)
    with pytest.raises(ValueError, match="k = 1 must be one measurement"):
        lab06.LiveScaling(_timings(ms), lab06.MODELS, [1, 2], 64, 64, (1, 28, 28), alpha=1e-4, beta=1e-9)


def _run(accuracies, seconds=1.0):
    return [{"epoch": e, "test_accuracy": a, "seconds": seconds, "train_loss": 1.0} for e, a in enumerate(accuracies)], 10.0, ""


def test_time_to_accuracy_names_no_winner_from_single_runs_and_none_on_shared_cores(tmp_path, monkeypatch):
    from verdict_rules import contradictions

    record = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    # gaps to the target (18 s, 4.5 s, 1.2 s) far beyond one epoch's 6 s: only single runs keep a winner from being named
    runs = {1: _run([0.3, 0.5, 0.6], 6.0), 2: _run([0.3, 0.55, 0.62], 1.5), 4: _run([0.35, 0.6, 0.61], 0.6)}
    lines = lab06.time_to_accuracy_verdicts(runs, train_size=1200, global_batch=64, real_cores=4, cores=4,
                                            oversubscribed=False)
    assert lines[0] == "1 process(es): final test accuracy 60.0%, 60.0% reached after 18.0 s of training, 18.0 s for all epochs"
    assert "reached after 1.2 s" in lines[2] and lines[3].startswith("To 60.0% on this machine (4 cores), one run each: ")
    assert "no clear winner to the target from one seed" in lines[3], lines[3]
    assert "one run each, not judged" in lines[4]
    assert "Every global step held the same samples" in lines[5]            # 1200 samples divide among 1, 2 and 4
    assert not contradictions(record)
    shared = lab06.time_to_accuracy_verdicts(runs, train_size=1200, global_batch=64, real_cores=2, cores=8,
                                             oversubscribed=True)
    assert shared[3].startswith("No verdict on time: the 4-process run took turns on 2 real cores (COURSE_CORES=8)")
    assert "held different samples" in lab06.time_to_accuracy_verdicts(
        {1: runs[1], 3: runs[2]}, train_size=10, global_batch=3, real_cores=4, cores=4, oversubscribed=False)[-1]   # padded

"""utils.labs.lab04 (lab 04, section 4): a DDP step's cost measured on real gloo ranks, and predicted."""
from __future__ import annotations

import statistics

import pytest
import torch

from spawn_ranks import run_ranks
from utils import collectives, ddp_timing, models
from utils.labs import lab04

TINY = dict(n_layers=2, d_in=6, d_hidden=5, n_classes=3)


def test_gradient_bytes_are_the_trainable_parameters_last_layer_first():
    model = models.MLP(**TINY)
    sizes = lab04.gradient_bytes(model)
    assert sizes == [q.numel() * 4 for q in reversed(list(model.parameters()))]
    next(model.parameters()).requires_grad_(False)          # a frozen first layer has no gradient to send
    assert lab04.gradient_bytes(model) == sizes[:-1]


def test_prediction_is_the_ring_model_summed_over_ddps_buckets():
    sizes = [2 ** 19, 2 ** 19, 2 ** 21, 100]                 # 1 MiB closes the first bucket, the rest fit in one
    alpha, beta = 3e-5, 2e-9
    predicted = lab04.predict(sizes, [1, 2, 4], alpha, beta)
    assert predicted[1]["buckets"] == ddp_timing.ddp_bucket_bytes(sizes) == [2 ** 20, 2 ** 21 + 100]
    assert predicted[1]["all_reduce_ms"] == 0.0              # one rank sends nothing
    for k in (2, 4):
        expected = sum(collectives.ring_all_reduce_seconds(n, k, alpha, beta) for n in predicted[k]["buckets"])
        assert predicted[k]["all_reduce_ms"] == pytest.approx(1e3 * expected)
    assert predicted[4]["all_reduce_ms"] > predicted[2]["all_reduce_ms"]


def _costs_job(rank, world_size):
    workloads = {"tiny": TINY, "two buckets": dict(n_layers=3, d_in=10, d_hidden=600, n_classes=500)}
    timings = lab04.time_ddp_steps(workloads, 4, torch.device("cpu"), warmup=1, repeats=2)
    return {f"{name}/{k}": value for (name, k), value in timings.items()}


def test_time_ddp_steps_measures_every_k_and_sees_the_buckets_ddp_launches():
    per_rank = run_ranks(_costs_job, 3, deadline_s=120)
    assert sorted(per_rank[0]) == [f"{name}/{k}" for name in ("tiny", "two buckets") for k in (1, 2, 3)]
    assert sorted(per_rank[1]) == [f"{name}/{k}" for name in ("tiny", "two buckets") for k in (2, 3)]
    assert sorted(per_rank[2]) == ["tiny/3", "two buckets/3"]
    merged = lab04.slowest([{tuple(key.split("/")[:1]) + (int(key.split("/")[1]),): v for key, v in r.items()}
                                for r in per_rank])
    for key, value in merged.items():
        steps = [r[f"{key[0]}/{key[1]}"]["ddp_steps"] for r in per_rank if f"{key[0]}/{key[1]}" in r]
        assert value["ddp_steps"] == [max(step) for step in zip(*steps)] and len(value["ddp_steps"]) == 2
        assert value["ddp"] == statistics.median(value["ddp_steps"])     # the table's number is the verdict's
        assert all(value[what] > 0 for what in ("ddp", "compute", "all_reduce"))
        # the hook saw exactly the buckets that the prediction expects, in launch order
        assert value["buckets"] == ddp_timing.ddp_bucket_bytes(value["grad_bytes"]), key
    assert len(merged[("two buckets", 3)]["buckets"]) == 2     # the last layer alone fills the 1 MiB first bucket
    assert len(merged[("tiny", 3)]["buckets"]) == 1


def test_one_process_ms_times_a_real_step():
    assert lab04.one_process_ms(TINY, 8, warmup=1, repeats=3) > 0
    steps = lab04.one_process_steps_ms(TINY, 8, warmup=1, repeats=3)
    assert len(steps) == 3 and all(ms > 0 for ms in steps)


def _cost(ddp_steps, compute=1.0, buckets=(400,)):
    return {"ddp": statistics.median(ddp_steps), "compute": compute, "all_reduce": 0.1,
            "grad_bytes": [400], "buckets": list(buckets), "ddp_steps": list(ddp_steps)}


def test_say_costs_calls_ddp_faster_or_slower_only_beyond_the_steps_spread(tmp_path, monkeypatch):
    from verdict_rules import contradictions

    record = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    predicted = {name: {3: {"buckets": [400], "all_reduce_ms": 0.05}} for name in ("fast", "slow", "noisy")}
    costs = {("fast", 1): _cost([1.2] * 3, compute=1.1), ("fast", 3): _cost([1.5, 1.6, 1.55]),
             ("slow", 1): _cost([1.1] * 3), ("slow", 3): _cost([9.0, 9.5, 9.2], buckets=(200, 200)),
             ("noisy", 1): _cost([1.1] * 3), ("noisy", 3): _cost([2.0, 6.0, 3.0])}
    single = {("fast", 3): [3.0, 3.1, 3.2], ("slow", 3): [3.0, 3.1, 3.2], ("noisy", 3): [2.5, 5.0, 3.5]}
    lines = lab04.say_costs(costs, predicted, single, ["fast", "slow", "noisy"], 3, 8, threads=2)
    text = "\n".join(lines)
    assert "- fast:" in lines[0] and "more, beyond the steps' spread" in lines[0] and lines[1].startswith("  why:")
    assert "longer than 3 bare steps" not in lines[1] and "used its 2 threads worse" in lines[1]   # 3.1 ms < 3 x 1.1 ms
    slow = next(line for line in lines if line.startswith("- slow:"))
    assert "fewer, beyond the steps' spread" in slow and "NOT as predicted" in slow
    noisy = next(line for line in lines if line.startswith("- noisy:"))
    assert "not told apart within the steps' spread" in noisy, text
    # its medians favour DDP (1.17x), yet no "why" follows a difference the steps do not bear out
    assert "1.17x" in noisy and len(lines) == 4 and lines[-1] == noisy, text
    assert not contradictions(record) and len(record.read_text().splitlines()) == 3

"""utils.labs.lab04 (lab 04, section 4): a DDP step's cost measured on real gloo ranks, and predicted."""
from __future__ import annotations

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
        assert value["ddp"] == max(r[f"{key[0]}/{key[1]}"]["ddp"] for r in per_rank if f"{key[0]}/{key[1]}" in r)
        assert all(value[what] > 0 for what in ("ddp", "compute", "all_reduce"))
        # the hook saw exactly the buckets that the prediction expects, in launch order
        assert value["buckets"] == ddp_timing.ddp_bucket_bytes(value["grad_bytes"]), key
    assert len(merged[("two buckets", 3)]["buckets"]) == 2     # the last layer alone fills the 1 MiB first bucket
    assert len(merged[("tiny", 3)]["buckets"]) == 1


def test_one_process_ms_times_a_real_step():
    assert lab04.one_process_ms(TINY, 8, warmup=1, repeats=3) > 0

"""utils.ddp: every wrapper ends where one process on the whole batch ends, at 2 and 4 gloo ranks.

The model (utils.labs.lab05.AwkwardNet) has a frozen parameter, tied weights, a parameter that
forward never uses, a buffer and parameters of very different sizes, and starts from a different
initialisation on each rank. One spawn per world size runs every case (starting ranks costs
seconds); the harness itself is shown able to fail on a wrapper that sums without dividing.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from spawn_ranks import run_ranks
from utils import ddp, replicas
from utils.labs import lab05

TOLERANCE = 1e-9            # float64: a correct wrapper differs from one process by rounding only
BUCKET_CAPS_MB = (1e-6, 0.002, 1000.0)   # one parameter per bucket, a few per bucket, one bucket


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


class SumWithoutDividing(ddp.NaiveDDP):
    """Seed 000's bug: the gradients are summed over ranks but not divided by the world size."""

    def finish_gradient_synchronization(self):
        for param in self.params:
            grad = self.local_grad(param)
            dist.all_reduce(grad)
            param.grad = grad


def _wrappers():
    cases = {"naive": ddp.NaiveDDP, "flat": ddp.FlatDDP, "overlap": ddp.OverlapDDP,
             "torch DDP": lambda m: nn.parallel.DistributedDataParallel(m, find_unused_parameters=True)}
    for cap in BUCKET_CAPS_MB:
        cases[f"bucketed {cap:g} MB"] = lambda m, cap=cap: ddp.BucketedDDP(m, bucket_cap_mb=cap)
    return cases


def _equivalence_job(rank, world_size):
    torch.set_default_dtype(torch.float32)
    results = {name: max(lab05.compare_with_single_process(wrap).values()) for name, wrap in _wrappers().items()}
    results["sum without dividing"] = max(lab05.compare_with_single_process(SumWithoutDividing).values())
    return results


def _bucket_counts_job(rank, world_size):
    model = lab05.AwkwardNet()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {cap: len(ddp.BucketedDDP(model, bucket_cap_mb=cap).buckets) for cap in BUCKET_CAPS_MB}, len(trainable)


def _accumulation_job(rank, world_size, variant):
    """Two micro-batches per step, the first inside no_sync(): equals one process on both."""
    return max(lab05.compare_with_single_process(ddp.VARIANTS[variant], micro_batches=2).values())


def _zero_in_place_job(rank, world_size, variant):
    """zero_grad(set_to_none=False) keeps last step's .grad tensors (BucketedDDP's are bucket views)."""
    batches = lab05.global_batches(4, 3 * world_size)
    model, reference = lab05.start_models()
    lab05.train_data_parallel(ddp.VARIANTS[variant], model, batches, set_to_none=False)
    lab05.train_single_process(reference, batches)
    return max(lab05.differences(reference, model).values())


@pytest.mark.parametrize("variant", sorted(ddp.VARIANTS))
def test_gradients_zeroed_in_place_between_steps(variant):
    assert max(run_ranks(_zero_in_place_job, 2, variant)) < TOLERANCE


def _rewrap_job(rank, world_size):
    """Wrapping the same model twice (a re-run cell) leaves one set of hooks: one reduction per step."""
    torch.manual_seed(0)
    model = lab05.AwkwardNet().double()
    ddp.OverlapDDP(model)
    wrapped = ddp.BucketedDDP(model, bucket_cap_mb=1e-6)
    calls = []
    original = dist.all_reduce

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counting
    try:
        x, y = lab05.global_batches(1, 2)[0]
        F.cross_entropy(wrapped(x), y).backward()
        wrapped.finish_gradient_synchronization()
    finally:
        dist.all_reduce = original
    replicas.assert_replicas_equal(model, grads=True)
    return len(calls), len(wrapped.buckets)


def _double_backward_job(rank, world_size):
    model = ddp.BucketedDDP(lab05.AwkwardNet().double(), bucket_cap_mb=1e-6)
    x, y = lab05.global_batches(1, 2)[0]
    F.cross_entropy(model(x), y).backward()
    try:
        F.cross_entropy(model(x), y).backward()
    except RuntimeError as error:
        return str(error)
    return "no error"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_wrapper_matches_one_process_on_awkward_models(world_size):
    per_rank = run_ranks(_equivalence_job, world_size, deadline_s=240)
    for rank, results in enumerate(per_rank):
        wrong = {name: d for name, d in results.items() if name != "sum without dividing" and d > TOLERANCE}
        assert not wrong, f"rank {rank} of {world_size}: weights differ from one process by {wrong}"
        # the harness can fail: summing without dividing multiplies the step by the world size
        assert results["sum without dividing"] > 1e-3, results


def _nccl_job(rank, world_size):
    device = torch.device("cuda", rank)
    results = {name: max(lab05.compare_with_single_process(wrap, device=device).values())
               for name, wrap in _wrappers().items() if name != "torch DDP"}
    model = ddp.BucketedDDP(lab05.AwkwardNet().to(device), bucket_cap_mb=1e-6)
    x, y = lab05.global_batches(1, 2, dtype=torch.float32)[0]
    seconds = ddp.step_time(model, x.to(device), y.to(device), steps=2, warmup=1)
    return results, seconds


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.timeout(300)
def test_every_wrapper_matches_one_process_on_nccl_gpus():
    world_size = min(torch.cuda.device_count(), 4)   # nccl needs a GPU of its own per rank
    for rank, (results, seconds) in enumerate(run_ranks(_nccl_job, world_size, backend="nccl", deadline_s=240)):
        wrong = {name: d for name, d in results.items() if d > TOLERANCE}
        assert not wrong, f"rank {rank} of {world_size} (nccl): weights differ from one process by {wrong}"
        assert seconds > 0


def test_bucket_caps_span_one_parameter_per_bucket_to_one_bucket():
    counts, trainable = run_ranks(_bucket_counts_job, 2)[0]
    assert counts[1e-6] == trainable          # frozen parameters are left out; tied weights counted once
    assert 1 < counts[0.002] < trainable
    assert counts[1000.0] == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", sorted(ddp.VARIANTS))
def test_no_sync_accumulates_locally_then_reduces_the_sum(variant):
    differences = run_ranks(_accumulation_job, 2, variant)
    assert max(differences) < TOLERANCE


def test_rewrapping_a_model_replaces_the_old_hooks():
    for calls, buckets in run_ranks(_rewrap_job, 2):
        assert calls == buckets               # the old OverlapDDP's per-parameter hooks are gone


def test_backward_twice_without_no_sync_is_a_clear_error():
    for message in run_ranks(_double_backward_job, 2):
        assert "no_sync" in message


def test_bucket_cap_must_be_positive():
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        ddp.assign_buckets([nn.Parameter(torch.zeros(3))], 0)


def test_assign_buckets_goes_last_parameter_first_and_respects_the_cap():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 300, 20, 20)]    # float32: 40, 1200, 80, 80 bytes
    buckets = ddp.assign_buckets(params, bucket_cap_mb=200 / 2 ** 20)
    assert [[p.numel() for p in bucket] for bucket in buckets] == [[20, 20], [300], [10]]


def test_wrapping_without_a_process_group_says_what_to_do():
    if dist.is_initialized():
        pytest.skip("this test process already has a process group")
    with pytest.raises(RuntimeError, match="utils.cluster.start"):
        ddp.NaiveDDP(nn.Linear(2, 2))

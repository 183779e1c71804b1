"""utils.collectives: the hand-written ring against gloo's all-reduce, in real spawned processes.

One spawn per world size (starting processes and gloo costs seconds); each worker loops over
every case and raises with a message on the first mismatch, and the parent fails the test
with the worker's traceback. Nothing can hang: workers have a gloo timeout, the parent a
deadline, and pytest-timeout a last resort.
"""
from __future__ import annotations

import functools
import math
import random

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings, strategies as st

from spawn_ranks import run_ranks
from utils import collectives
from utils.collectives import (algorithm_bandwidth, bus_bandwidth, chunk_bounds, fit_alpha_beta, ring_all_reduce,
                               ring_all_reduce_seconds, sweep, time_collective)

DTYPES = (torch.float32, torch.float64, torch.int64)


# ---------------------------------------------------------------- ring against gloo, per world size

pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def _cases(world_size):
    """Hand-picked awkward shapes plus a seeded random list: (shape, dtype, transpose, seed)."""
    p = world_size
    shapes = [(0,), (1,), (), (max(p - 1, 1),), (p,), (p + 1,), (2,), (3,), (5,), (7,), (13,), (97,), (1009,),
              (1000,), (7, 13), (3, 0, 2), (4, 5, 6), (2 * p - 1, 3)]
    cases = [(shape, dtype, False) for shape in shapes for dtype in DTYPES]
    cases += [((13, 7), dtype, True) for dtype in DTYPES]  # non-contiguous: a transposed view
    rng = random.Random(1234 + p)
    for _ in range(30):
        shape = tuple(rng.choice([0, 1, 2, 3, rng.randint(1, 60)]) for _ in range(rng.randint(1, 3)))
        cases.append((shape, rng.choice(DTYPES), len(shape) == 2 and rng.random() < 0.3))
    return [(shape, dtype, transpose, seed) for seed, (shape, dtype, transpose) in enumerate(cases)]


def _rank_input(shape, dtype, rank, seed):
    """Integer values (also for floats): sums are exact in any order, so results must match bit for bit."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(-1000, 1000, shape, generator=g).to(dtype)


def _job_compare(rank, world_size, cases):
    for shape, dtype, transpose, seed in cases:
        what = f"shape {shape} {dtype} transpose={transpose} at world size {world_size}"
        base = _rank_input(shape, dtype, rank, seed)
        expected = base.clone()
        dist.all_reduce(expected)
        assert torch.equal(expected, sum(_rank_input(shape, dtype, r, seed) for r in range(world_size))), what
        if transpose:
            storage = base.t().contiguous()  # same values, stored transposed
            x = storage.t()
            assert x.is_contiguous() == (min(shape) <= 1), what  # size-1 dims keep a transpose contiguous
        else:
            x = base.clone()
        out = ring_all_reduce(x)
        assert out is x, f"ring_all_reduce must return its input ({what})"
        assert x.shape == expected.shape and x.dtype == expected.dtype, what
        assert torch.equal(x, expected), f"ring != all_reduce for {what}: max diff {(x - expected).abs().max()}"
        if transpose:
            assert torch.equal(storage.t(), expected), f"result not written back into the view ({what})"
    # Real (non-integer) floats: the ring adds in another order than gloo, so compare with a tolerance.
    for n in (1, 10, 1001, 4099):
        g = torch.Generator().manual_seed(n + rank)
        x = torch.randn(n, generator=g, dtype=torch.float64)
        expected = x.clone()
        dist.all_reduce(expected)
        torch.testing.assert_close(ring_all_reduce(x), expected, rtol=1e-12, atol=1e-12)
    return len(cases)


def _check_subgroup(rank, members):
    group = dist.new_group(members)  # every rank must call new_group, members or not
    if rank not in members:
        return None
    x = torch.arange(10, dtype=torch.float32) * (rank + 1)
    expected = x.clone()
    dist.all_reduce(expected, group=group)
    ring_all_reduce(x, group=group)
    assert torch.equal(x, expected), (x, expected)
    assert torch.equal(x, torch.arange(10, dtype=torch.float32) * sum(m + 1 for m in members))
    return x.tolist()


def _check_timing():
    x = torch.ones(256)
    assert time_collective(lambda: ring_all_reduce(x), warmup=1, repeats=3) > 0
    with pytest.raises(ValueError, match="multiple of 4"):
        sweep(dist.all_reduce, [1024, 1026])  # checked before any rank communicates
    return sweep(ring_all_reduce, [0, 1024, 4096], warmup=1, repeats=2) + \
        sweep(dist.all_reduce, [4096], warmup=0, repeats=1, dtype=torch.float64)


def _job(rank, world_size, cases):
    """Everything one world size checks, in one spawn: starting ranks costs seconds, the checks little."""
    n_cases = _job_compare(rank, world_size, cases)
    collectives.SEGMENT_BYTES = 8      # pieces of one or two elements: many tagged messages per step
    try:
        assert _job_compare(rank, world_size, cases) == n_cases
    finally:
        collectives.SEGMENT_BYTES = 1 << 20
    return dict(n_cases=n_cases,
                subgroup=_check_subgroup(rank, [1, 3]) if world_size == 4 else None,
                sweep=_check_timing() if world_size == 2 else None)


@functools.lru_cache(maxsize=None)
def results_at(world_size):
    cases = _cases(world_size)
    assert len(cases) > 80
    return len(cases), run_ranks(_job, world_size, cases)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_all_reduce_equals_gloo_all_reduce(world_size):
    n_cases, results = results_at(world_size)
    assert [r["n_cases"] for r in results] == [n_cases] * world_size


@pytest.mark.timeout(120)
def test_ring_all_reduce_on_a_subgroup():
    subgroup = [r["subgroup"] for r in results_at(4)[1]]
    assert subgroup[0] is None and subgroup[2] is None and subgroup[1] == subgroup[3] is not None


@pytest.mark.timeout(120)
def test_sweep_same_on_every_rank():
    rank0, rank1 = [r["sweep"] for r in results_at(2)[1]]
    assert rank0 == rank1  # the slowest rank's median, shared by an all_reduce MAX
    assert [r["n_bytes"] for r in rank0] == [0, 1024, 4096, 4096]
    for r in rank0:
        assert r["seconds"] > 0 and r["algbw"] == r["n_bytes"] / r["seconds"]
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (2 - 1) / 2)


# ---------------------------------------------------------------- no process group, bad inputs

def test_errors_without_a_process_group():
    if dist.is_initialized():
        pytest.skip("this test process already has a process group")
    for call in (lambda: ring_all_reduce(torch.ones(3)), lambda: time_collective(lambda: None),
                 lambda: sweep(dist.all_reduce, [1024])):
        with pytest.raises(ValueError, match="utils.cluster.start.. or dist.init_process_group"):
            call()


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="torch.Tensor"):
        ring_all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="repeats"):
        time_collective(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="unknown op"):
        bus_bandwidth(1, 1, 2, op="allreduce")
    with pytest.raises(ValueError, match="seconds must be > 0"):
        algorithm_bandwidth(1, 0)
    with pytest.raises(ValueError, match="world_size"):
        chunk_bounds(10, 0)
    with pytest.raises(ValueError, match="two or more different sizes"):
        fit_alpha_beta([8, 8], [1.0, 2.0])


# ---------------------------------------------------------------- chunk_bounds

@settings(max_examples=300, deadline=None)
@given(numel=st.integers(0, 10_000), world_size=st.integers(1, 64))
def test_chunk_bounds_cover_everything_evenly(numel, world_size):
    bounds = chunk_bounds(numel, world_size)
    assert len(bounds) == world_size
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(prev[1] == nxt[0] for prev, nxt in zip(bounds, bounds[1:]))  # contiguous, no overlap
    sizes = [stop - start for start, stop in bounds]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sizes == [len(c) for c in torch.tensor_split(torch.arange(numel), world_size)]


def test_chunk_bounds_examples():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds(0, 2) == [(0, 0), (0, 0)]


# ---------------------------------------------------------------- bandwidth and the cost model

def test_bandwidth_formulas_hand_computed():
    assert algorithm_bandwidth(1_000_000, 0.001) == pytest.approx(1e9)
    # all-reduce at p = 4: 2 * 3 / 4 = 1.5
    assert bus_bandwidth(1_000_000, 0.001, 4) == pytest.approx(1.5e9)
    assert bus_bandwidth(1_000_000, 0.001, 4, op="all_gather") == pytest.approx(0.75e9)
    assert bus_bandwidth(1_000_000, 0.001, 4, op="reduce_scatter") == pytest.approx(0.75e9)
    assert bus_bandwidth(1_000_000, 0.001, 8, op="broadcast") == pytest.approx(1e9)
    assert bus_bandwidth(1_000_000, 0.001, 8, op="reduce") == pytest.approx(1e9)
    assert bus_bandwidth(1_000_000, 0.001, 1) == 0.0  # one rank moves nothing
    assert bus_bandwidth(1_000_000, 0.001, 2) == pytest.approx(1e9)


def test_ring_model_hand_computed():
    # p = 4, alpha = 10 us, beta = 1 ns/B, 4 MB: 6 * 10 us + 1.5 * 4e6 * 1e-9 s = 60 us + 6 ms
    assert ring_all_reduce_seconds(4e6, 4, 10e-6, 1e-9) == pytest.approx(6.06e-3)
    assert ring_all_reduce_seconds(4e6, 1, 10e-6, 1e-9) == 0.0


SIZES = [4 ** k for k in range(5, 14)]  # 1 KiB .. 64 MiB


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize("world_size", [None, 2, 4, 8])
def test_fit_recovers_exact_alpha_beta(world_size, relative):
    alpha, beta = 25e-6, 0.4e-9
    if world_size is None:
        times = [alpha + beta * n for n in SIZES]
    else:
        times = [ring_all_reduce_seconds(n, world_size, alpha, beta) for n in SIZES]
    a, b = fit_alpha_beta(SIZES, times, world_size, relative=relative)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_fit_with_noise_within_tolerance():
    alpha, beta, p = 40e-6, 1e-9, 4
    rng = random.Random(7)
    sizes = [n for n in SIZES for _ in range(5)]
    times = [ring_all_reduce_seconds(n, p, alpha, beta) * math.exp(rng.gauss(0, 0.05)) for n in sizes]
    a, b = fit_alpha_beta(sizes, times, world_size=p)
    assert a == pytest.approx(alpha, rel=0.1) and b == pytest.approx(beta, rel=0.1)


def test_fit_never_negative():
    # Times that fall with size: the unconstrained slope is negative, so beta is clamped to 0.
    a, b = fit_alpha_beta([1000, 2000, 3000], [3e-3, 2e-3, 1e-3], relative=False)
    assert b == 0.0 and a == pytest.approx(2e-3)  # the best constant: the mean time
    # A line through the origin with a tiny negative intercept: alpha is clamped to 0.
    a, b = fit_alpha_beta([1000, 2000, 3000], [1e-6 - 1e-9, 2e-6 - 1e-9, 3e-6 - 1e-9], relative=False)
    assert a == 0.0 and b == pytest.approx(1e-9, rel=1e-2)


def test_predicted_speedup_adds_one_ring_all_reduce_per_step():
    from utils.collectives import predicted_speedup

    sizes = [2 ** k for k in range(10, 27, 2)]
    alpha, beta = fit_alpha_beta(sizes, [ring_all_reduce_seconds(n, 2, 50e-6, 1 / 2e9) for n in sizes], world_size=2)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and beta == pytest.approx(1 / 2e9, rel=1e-6)
    speedup = predicted_speedup([1, 2, 8], compute_s=0.01, grad_bytes=4e6, alpha=alpha, beta=beta)
    assert speedup[0] == pytest.approx(1.0)
    assert speedup[1] == pytest.approx(2 * 0.01 / (0.01 + 2 * alpha + 4e6 * beta))
    assert 1 < speedup[1] < speedup[2] < 8

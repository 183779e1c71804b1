"""Smoke test of benchmarks/bench_ddp.py: a --quick run (2 gloo ranks, lab-01 model, 1 round) ends,
writes a row per variant, and its ratios follow from its step times. Timings are never pass/fail."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"torch-ddp", "naive", "flat", "overlap", "bucketed", "no-comm"}


def test_quick_run_writes_every_variant(tmp_path):
    out = tmp_path / "bench_ddp.json"
    try:
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ddp.py"), "--quick", "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench_ddp.py --quick ran past 180 s; output so far:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| ranks | model | variant |" in done.stdout            # the Markdown table
    assert "Replicas equal on every rank" in done.stdout

    report = json.loads(out.read_text())
    assert {"cpu", "cores", "torch"} <= set(report["machine"])
    assert report["settings"]["quick"] is True
    rows = report["rows"]
    assert {(r["world_size"], r["model"]) for r in rows} == {(2, "lab-01")}
    assert {r["variant"] for r in rows} == VARIANTS and len(rows) == len(VARIANTS)
    by_variant = {r["variant"]: r for r in rows}
    for r in rows:
        assert r["median_step_ms"] > 0 and all(t > 0 for t in r["round_medians_ms"])
        assert r["samples_per_s"] == pytest.approx(r["global_batch"] / (r["median_step_ms"] / 1e3))
    # Throughput relative to torch DDP, recomputed from the step times.
    ddp, bucketed = by_variant["torch-ddp"], by_variant["bucketed"]
    assert ddp["throughput_vs_ddp"] == pytest.approx(1.0)
    assert bucketed["throughput_vs_ddp"] == pytest.approx(ddp["median_step_ms"] / bucketed["median_step_ms"])
    assert bucketed["throughput_vs_ddp"] == pytest.approx(bucketed["samples_per_s"] / ddp["samples_per_s"])
    assert bucketed["round_ratios_vs_ddp"] == pytest.approx(
        [d / b for d, b in zip(ddp["round_medians_ms"], bucketed["round_medians_ms"])])
    [verdict] = report["verdicts"]
    assert verdict["ratio"] == pytest.approx(bucketed["throughput_vs_ddp"])
    assert verdict["met"] == (verdict["ratio"] >= 0.95)
    # The replicas agree exactly, and the wrappers stay next to torch DDP's weights.
    for name in VARIANTS - {"no-comm"}:
        assert by_variant[name]["max_weight_diff_vs_ddp"] < 1e-4

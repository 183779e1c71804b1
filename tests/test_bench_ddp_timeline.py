"""benchmarks/bench_ddp_timeline.py records one step's spans per wrapper (tried on 2 gloo ranks here;
the GPU recording it exists for needs a node with 2 GPUs)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_records_both_wrappers_spans_on_cpu_ranks(tmp_path):
    out = tmp_path / "timeline.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ddp_timeline.py"), "--cpu", "--quick",
                    "--bucket-cap-mb", "0.01", "--json", str(out)], check=True, timeout=280, cwd=ROOT)
    report = json.loads(out.read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 2 and report["machine"]
    assert report["buckets"] > 1
    for name in ("bucketed", "flat"):
        lanes = {lane for lane, *_ in report["spans_rank0"][name]}
        assert {"compute"} < lanes or name == "flat"
        assert all(end >= start >= 0 for _, _, start, end in report["spans_rank0"][name])
    assert any(lane.startswith("bucket") for lane, *_ in report["spans_rank0"]["bucketed"])


def test_refuses_nccl_without_gpus():
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ddp_timeline", ROOT / "benchmarks" / "bench_ddp_timeline.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit, match="Use --cpu"):
        bench.main([])

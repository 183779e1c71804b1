"""The CNN step benchmark runs end to end (its numbers go to benchmarks/README.md, never into a test)."""
import subprocess
import sys

from notebook_runner import ROOT


def test_bench_cnn_step_smoke(tmp_path):
    out = tmp_path / "cnn.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_cnn_step.py", "--repeats", "1", "--train-size", "128",
                             "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "lab / plain =" in result.stdout and "plain / slices =" in result.stdout and out.exists()

"""Lab 08's recorded-runs benchmark runs end to end and writes what the lab's cell reads (its numbers
go to benchmarks/results/, never into a test)."""
import json
import subprocess
import sys

from notebook_runner import ROOT


def test_bench_lab08_psgd_quick(tmp_path):
    out = tmp_path / "lab08.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_lab08_psgd.py", "--quick", "--workers", "2",
                             "--periods", "1", "one-shot", "--seeds", "0", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["complete"] and record["machine"]["cores"] >= 1
    assert record["settings"]["schema"] == 2
    # K = 1: sqrt(P) x lr, reached by a warm-up; one-shot keeps lr, and is measured during training too
    assert record["settings"]["k1_rule"] == "sqrt"
    assert [(r["workers"], r["period"], round(r["lr"], 6), r["warmup_steps"]) for r in record["runs"]] == \
        [(2, "1", round(0.1 * 2 ** 0.5, 6), 5), (2, "one-shot", 0.1, 0)]
    for run in record["runs"]:
        assert 0 <= run["accuracy"] <= 1 and run["seconds"] > 0 and len(run["times"]) == len(run["accuracies"])
        assert run["steps"] == [10, 20], "measured every steps // evals steps, one-shot included"
        assert all(0 < a < b for a, b in zip(run["times"], run["times"][1:])) and run["times"][-1] <= run["seconds"]

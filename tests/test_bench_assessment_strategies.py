"""The assessment's strategy benchmark runs end to end in quick mode and writes the file the README's
table comes from. Its outcomes (which strategy reaches the target) and timings are measurements for
benchmarks/README.md, never pass/fail conditions here."""
import json
import subprocess
import sys

import pytest

from notebook_runner import ROOT

STRATEGIES = ["none", "sqrt", "linear", "linear+warmup"]


def test_bench_assessment_strategies_quick_writes_the_results_shape(tmp_path):
    out = tmp_path / "strategies.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_assessment_strategies.py", "--quick", "--json", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"machine", "date", "target", "settings", "strategies", "baseline"} <= set(report)
    assert isinstance(report["machine"], str) and "cores" in report["machine"]
    assert 0 < report["target"] < 1 and report["settings"]["quick"] is True
    settings = report["settings"]
    assert settings["global_batch"] == settings["scale"] * settings["base_batch"]
    assert STRATEGIES == [name for name in report["strategies"] if name in STRATEGIES]
    for name, entry in list(report["strategies"].items()) + [("baseline", report["baseline"])]:
        n = entry["seeds"]
        assert n >= 1 and 0 <= entry["passed"] <= n and 0 <= entry["diverged"] <= n, name
        assert 0 <= entry["held_at_end"] <= entry["passed"], name
        assert len(entry["final"]) == n and all(0 <= a <= 1 for a in entry["final"]), name
        assert [len(curve) for curve in entry["curves"]] == [settings["epochs"]] * n, name
        assert [curve[-1] for curve in entry["curves"]] == entry["final"], name
    assert all(report["strategies"][name]["seeds"] == len(settings["seeds"]) >= 3 for name in STRATEGIES)
    # The README's table is printed from the file, one row per strategy and one for the baseline.
    table = subprocess.run([sys.executable, "benchmarks/bench_assessment_strategies.py", "--table", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("| ") and "strategy" not in line]
    assert [row.split("|")[1].strip() for row in rows] == list(report["strategies"]) + [
        f"baseline (batch {settings['base_batch']})"]


def test_reached_needs_two_evaluations_in_a_row():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_strategies import held, learning_rate, reached

    assert not reached([0.5, 0.7, 0.5, 0.7], 0.6) and reached([0.5, 0.7, 0.6, 0.4], 0.6) and not reached([0.9], 0.6)
    assert held([0.1, 0.7, 0.7], 0.6) and not held([0.7, 0.7, 0.5], 0.6) and not held([0.7], 0.6)
    assert learning_rate("none", 5, 0.02, 16, 10) == 0.02 and learning_rate("linear", 0, 0.02, 16, 10) == 0.32
    assert abs(learning_rate("sqrt", 0, 0.02, 16, 10) - 0.08) < 1e-12
    assert abs(learning_rate("linear+warmup", 4, 0.02, 16, 10) - 0.16) < 1e-12
    assert learning_rate("linear+warmup", 50, 0.02, 16, 10) == 0.32
    assert learning_rate("half-linear", 0, 0.02, 16, 10) == 0.16 and learning_rate("baseline", 0, 0.02, 16, 10) == 0.02
    with pytest.raises(ValueError, match="unknown strategy 'cosine'"):
        learning_rate("cosine", 0, 0.02, 16, 10)


def test_the_instructors_solution_takes_the_sqrt_strategys_rate_at_every_step():
    """So the sqrt rows of the results files are the solution's measurements (benchmarks/README.md)."""
    import torch
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_strategies import FULL, QUICK, learning_rate, solution_optimizer

    from assessment import settings
    for options in (FULL, QUICK):
        steps = options["train_size"] // (options["scale"] * settings.BASE_BATCH)
        weight = torch.zeros(1, requires_grad=True)
        optimizer, schedule = solution_optimizer([weight], options["scale"] * settings.BASE_BATCH, steps,
                                                 options["epochs"])
        rates = []
        for _ in range(steps * options["epochs"]):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        expected = [learning_rate("sqrt", step, settings.BASE_LR, options["scale"], 1) for step in range(len(rates))]
        assert max(abs(a - b) for a, b in zip(rates, expected)) < 1e-12, (rates[:3], expected[:3])


def test_readme_tables_are_printed_from_the_results_files():
    # The README's tables are the script's --table output, pasted whole: no number typed by hand.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_strategies import RESULTS, table

    readme = (ROOT / "benchmarks" / "README.md").read_text()
    for path in (RESULTS, RESULTS.with_name("assessment_strategies_seeds3-5.json"),
                 RESULTS.with_name("assessment_half_linear_seeds0-2.json"),
                 *sorted(RESULTS.parent.glob("assessment_batch_*.json"))):
        assert table(json.loads(path.read_text())) in readme, \
            f"benchmarks/README.md's table for {path.name} differs: paste bench_assessment_strategies.py --table {path}"

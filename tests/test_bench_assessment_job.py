"""The run-that-counts benchmark (benchmarks/bench_assessment_job.py): it runs the real job end to end in quick
mode and writes the file the README's table comes from; the speed rule's reference and the drawn seed rest on
its recorded full-mode file. Its outcomes are measurements, checked here only against the settings they set."""
import json
import os
import statistics
import subprocess
import sys

import pytest

from notebook_runner import ROOT

RECORDED = ROOT / "benchmarks" / "results" / "assessment_job.json"
pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def full_mode_settings() -> dict:
    code = ("import json; from assessment import settings as s; print(json.dumps(dict(reference=s.REFERENCE_EPOCHS, "
            "factor=s.SPEED_FACTOR, target=s.TARGET, floor=s.FLOOR, run=s.counted_run(0), epochs=s.EPOCHS)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "COURSE_QUICK": "0"})
    return json.loads(done.stdout)


def test_bench_assessment_job_quick_writes_the_results_shape(tmp_path):
    out = tmp_path / "job.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_assessment_job.py", "--quick", "--seed-list", "7",
                             "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    report = json.loads(out.read_text())
    assert {"machine", "date", "target", "floor", "settings", "strategies", "details"} <= set(report)
    assert report["settings"]["quick"] is True and list(report["strategies"]) == ["solution"]
    run = report["strategies"]["solution"]
    assert run["seed_list"] == [7] and run["seeds"] == 1 and len(run["curves"]) == 1
    assert len(run["curves"][0]) == report["settings"]["epochs"] and run["final"] == [run["curves"][0][-1]]
    assert all(0 <= a <= 1 for a in run["curves"][0])
    table = subprocess.run([sys.executable, "benchmarks/bench_assessment_job.py", "--table", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "| solution | " in table.stdout


def test_the_recorded_runs_are_the_full_mode_run_that_counts_judged_by_the_graders_rule():
    from assessment import criteria
    report, full = json.loads(RECORDED.read_text()), full_mode_settings()
    assert report["settings"]["quick"] is False and report["target"] == full["target"] and report["floor"] == full["floor"]
    assert {k: v for k, v in report["settings"].items() if k in full["run"] and k != "seed"} == \
        {k: v for k, v in full["run"].items() if k != "seed"}
    for name, entry in report["strategies"].items():
        assert len(entry["curves"]) == entry["seeds"] == len(set(entry["seed_list"])), name
        ends = [None if first is None else first + 1
                for first, _ in (criteria.target_held(c, full["target"], full["floor"]) for c in entry["curves"])]
        assert ends == entry["held_by_epoch"] and entry["passed"] == sum(e is not None for e in ends), name


def test_the_solution_holds_the_target_at_every_drawn_seed_and_sets_the_speed_rules_reference():
    """settings.REFERENCE_EPOCHS (full mode) is the median, over the solution's recorded drawn seeds, of the epoch that
    ends its first held pair; the solution itself passes the speed rule at each of them."""
    solution, full = json.loads(RECORDED.read_text())["strategies"]["solution"], full_mode_settings()
    assert solution["seeds"] >= 6 and solution["passed"] == solution["seeds"], solution["held_by_epoch"]
    assert statistics.median_low(solution["held_by_epoch"]) == full["reference"], solution["held_by_epoch"]
    assert max(solution["held_by_epoch"]) <= full["factor"] * full["reference"], solution["held_by_epoch"]


def test_readme_table_is_printed_from_the_results_file():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_job import table

    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert table(json.loads(RECORDED.read_text())) in readme, \
        f"benchmarks/README.md's table differs: paste bench_assessment_job.py --table {RECORDED}"


BATCH_FILES = sorted((ROOT / "benchmarks" / "results").glob("assessment_strategies_batch*.json"))


def test_the_learners_batch_choices_are_recorded_with_the_real_job_and_judged_by_the_graders_rule():
    """Every recorded batch choice (bench_assessment_job.py --global-batch): the full-mode run that counts at a
    batch in the learner's range, at least 6 drawn seeds per strategy, each curve judged by criteria.target_held."""
    from assessment import criteria
    full = full_mode_settings()
    code = ("import json; from assessment import settings as s; "
            "print(json.dumps([s.MIN_GLOBAL_BATCH, s.MAX_GLOBAL_BATCH, s.WORKERS]))")
    low, high, workers = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                                                   text=True, check=True, env={**os.environ, "COURSE_QUICK": "0"}).stdout)
    assert BATCH_FILES, "no recorded batch choice in benchmarks/results/assessment_strategies_batch*.json"
    for path in BATCH_FILES:
        report = json.loads(path.read_text())
        s = report["settings"]
        assert s["quick"] is False and low <= s["global_batch"] <= high and s["workers"] == workers, path.name
        assert {k: v for k, v in s.items() if k in full["run"] and k not in ("seed", "global_batch")} == \
            {k: v for k, v in full["run"].items() if k not in ("seed", "global_batch")}, path.name
        for name, entry in report["strategies"].items():
            assert entry["seeds"] >= 6 and len(entry["curves"]) == entry["seeds"], (path.name, name)
            ends = [None if first is None else first + 1
                    for first, _ in (criteria.target_held(c, full["target"], full["floor"]) for c in entry["curves"])]
            assert ends == entry["held_by_epoch"], (path.name, name)


def test_readme_compares_the_batch_choices_from_the_results_files():
    """benchmarks/README.md holds each batch file's table and the comparison printed from all of them (the speed
    rule's modelled time to the target, from the step-cost table the grader uses now)."""
    result = subprocess.run([sys.executable, "benchmarks/bench_assessment_job.py", "--choices", str(RECORDED),
                             *map(str, BATCH_FILES)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert result.stdout.strip() in readme, ("benchmarks/README.md's comparison differs: paste bench_assessment_job.py "
                                             "--choices results/assessment_job.json results/assessment_strategies_batch*.json")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_job import table
    for path in BATCH_FILES:
        assert table(json.loads(path.read_text())) in readme, f"paste bench_assessment_job.py --table {path}"


def test_readme_shows_the_step_cost_table_the_speed_rule_reads():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_assessment_step_cost import TABLE, summary

    assert summary(json.loads(TABLE.read_text())) in (ROOT / "benchmarks" / "README.md").read_text(), \
        "benchmarks/README.md's step-cost table differs: paste bench_assessment_step_cost.py --table"

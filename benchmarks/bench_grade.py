"""Grading time per submission, and the speed-up of grading two at a time.

Grades a folder of N copies of the instructor edition (correct submissions, the slowest kind:
every cell and every run of the script goes to its end) with ``--jobs 1`` and then ``--jobs J`` (unless J is 1),
in the default (full) configuration unless ``--quick``, and checks that both CSVs are identical and give full
marks. Reports seconds per submission for each and the speed-up (serial time / parallel time), and,
beside them, the seconds of running the same notebook once headless (``tooling.course``, as a learner's
"run all", its check cell included): grading's overhead is the ratio of the two.

    .venv/bin/python benchmarks/bench_grade.py [--copies 2] [--jobs 2] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402


# The grader as `python -m assessment.grader.grade` runs it, with each sandboxed run and each judging step timed
# (one "PHASE name seconds" line each on stderr): where a submission's grading time goes.
TIMED_GRADER = """
import functools, sys, time
from assessment.grader import grade, judging, sandbox
def timed(module, name, label):
    call = getattr(module, name)
    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            print(f"PHASE {label(args)} {time.perf_counter() - start:.2f}", file=sys.stderr, flush=True)
    setattr(module, name, wrapper)
timed(sandbox, "run", lambda args: "job" if "assessment.job" in args[0] else "notebook")
timed(judging, "call", lambda args: args[0])
sys.exit(grade.main(sys.argv[1:]))
"""


def grade(folder: Path, out: Path, jobs: int, quick: bool) -> tuple[float, str, dict]:
    """Seconds the whole batch took, the grader's line on the isolation it used, and seconds per phase (summed
    over the batch: the sandboxed notebook and job runs, and each judging step)."""
    command = [sys.executable, "-c", TIMED_GRADER, str(folder), "--out", str(out), "--jobs", str(jobs)]
    start = time.perf_counter()
    done = subprocess.run(command + (["--quick"] if quick else []), cwd=ROOT, check=True, capture_output=True,
                          text=True)
    isolation = next((line for line in done.stderr.splitlines() if "isolation:" in line), "")
    phases: dict = {}
    for line in done.stderr.splitlines():
        if line.startswith("PHASE "):
            _, name, seconds = line.split()
            phases[name] = round(phases.get(name, 0.0) + float(seconds), 1)
    return time.perf_counter() - start, isolation.split("isolation: ", 1)[-1], phases


def run_once(quick: bool, out: Path) -> float:
    """Seconds to run the instructor edition once, headless, as ``tooling.course`` does (no sandbox, no grader)."""
    command = [sys.executable, "-m", "tooling.course", "--no-html", "--out", str(out),
               str(ROOT / "assessment" / "assessment.ipynb")]
    start = time.perf_counter()
    subprocess.run(command[:3] + (["--quick"] if quick else []) + command[3:], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-grade-"))
    try:
        folder = scratch / "submissions"
        folder.mkdir()
        for i in range(args.copies):
            shutil.copy(ROOT / "assessment" / "assessment.ipynb", folder / f"correct_{i}.ipynb")
        notebook = run_once(args.quick, scratch / "once")
        serial, isolation, phases = grade(folder, scratch / "serial", 1, args.quick)
        csv_serial = (scratch / "serial" / "grades.csv").read_text()
        if args.jobs > 1:
            parallel, _, _ = grade(folder, scratch / "parallel", args.jobs, args.quick)
            same = csv_serial == (scratch / "parallel" / "grades.csv").read_text()
        else:                                   # --jobs 1: the time one at a time only
            parallel, same = None, None
        full = all(row["total"] == row["max_total"] for row in csv.DictReader(io.StringIO(csv_serial)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {"benchmark": "grade", "date": datetime.date.today().isoformat(), "machine": machine.describe(),
              "mode": "quick" if args.quick else "full", "copies": args.copies, "jobs": args.jobs,
              "notebook_once_s": round(notebook, 1),
              "serial_s_per_submission": round(serial / args.copies, 1),
              "grading_over_notebook": round(serial / args.copies / notebook, 2),
              "serial_phases_s_per_submission": {name: round(t / args.copies, 1) for name, t in phases.items()},
              "parallel_s_per_submission": parallel and round(parallel / args.copies, 1),
              "speedup": parallel and round(serial / parallel, 2), "csv_identical": same, "full_marks": full,
              "isolation": isolation}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

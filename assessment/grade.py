"""Grades every assessment notebook in a folder: a CSV for the instructor, feedback for each learner.

    make grade SUBMISSIONS=folder [JOBS=2]
    python -m assessment.grade folder [--jobs 2] [--out build/grades] [--quick]

For each ``.ipynb`` (sorted by name), the grader rebuilds the notebook around the learner's cells
(``assessment.submission``), runs it in a sandbox (``assessment.sandbox``), runs the learner's
functions on 2 and 3 fresh ranks in another sandbox (``assessment.probe``), judges the probes'
results and evaluates the saved model in this process, on held-out images drawn with a seed made
here and never written anywhere. Writes ``grades.csv`` (one row per submission, one column per
criterion, ``total``, ``max_total``, empty columns for the written answers), ``feedback/NAME.md``
and ``executed/NAME.ipynb``.
"""
from __future__ import annotations

import argparse
import csv
import os
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from . import sandbox
from .probe import CRITERIA as PROBED  # the criteria the probe's ranks decide
from .submission import SubmissionError, restore

PROBE_WORLDS = (2, 3)
BASELINE_CELL, RUN_CELL = "asmt-03", "asmt-20"   # the one-process baseline, and the run that counts
WRITTEN = ("q1", "q2")


@dataclass
class Grade:
    name: str
    points: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # criterion -> why it failed (or a note when passed)
    notes: list[str] = field(default_factory=list)
    ran: bool = False


def _criteria():
    from .criteria import CRITERIA  # imported late: settings read COURSE_QUICK when first imported
    return CRITERIA


def evaluate_model(path: Path, seed: int) -> tuple[float | None, str]:
    """Accuracy of the saved state_dict on fresh held-out images, or None and the reason."""
    import torch

    from utils import data, models
    from . import settings
    if not path.exists():
        return None, "your notebook saved no model file (settings.MODEL_FILE): the run that counts did not finish"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")  # tensors only: no code is unpickled
    except Exception as error:
        return None, f"the saved model file could not be read as a state_dict ({type(error).__name__})"
    shape = (1, 28, 28)
    model = models.CNN(shape)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()} if isinstance(state, dict) and all(
        isinstance(v, torch.Tensor) for v in state.values()) else None
    if got != expected:
        return None, ("the saved file is not the assessment CNN's state_dict (its keys or shapes differ): save "
                      "model.module.state_dict() of the model make_model() built")
    model.load_state_dict(state)
    fresh = data.shapes(num_samples=settings.EVAL_SIZE * 5 // 4 // 10 * 10, seed=seed)
    model.eval()
    with torch.no_grad():
        accuracy = (model(fresh.x_train).argmax(1) == fresh.y_train).float().mean().item()
    return accuracy, ""


def _load_probe(out: Path, world: int) -> list[dict] | str:
    import torch
    results = []
    for rank in range(world):
        path = out / f"world{world}_rank{rank}.pt"
        if not path.exists():
            return (f"on {world} ranks, rank {rank} stopped before it finished (it crashed, exited, or hung past "
                    f"the time limit)")
        try:
            results.append(torch.load(path, weights_only=True))
        except Exception as error:
            return f"on {world} ranks, rank {rank}'s results could not be read ({type(error).__name__})"
    return results


def judge_probes(out: Path) -> dict[str, str | None]:
    """Criterion -> None when it holds on every probed world size, else the first reason it fails."""
    from . import criteria
    verdicts: dict[str, str | None] = {}
    for world in PROBE_WORLDS:
        results = _load_probe(out, world)
        for name in PROBED:
            if verdicts.get(name):
                continue
            if isinstance(results, str):
                verdicts[name] = results
                continue
            unfinished = {"error": "your code did not finish this check within the time limit: a loop that never ends, "
                                   "or a collective that not every rank reaches"}
            mine = [r.get(name, unfinished) for r in results]
            errors = [m["error"] for m in mine if isinstance(m, dict) and "error" in m]
            if errors:
                verdicts[name] = f"on {world} ranks {errors[0]}"
                continue
            judge = {"sharding": lambda r: criteria.judge_sharding(r, 4 * world),
                     "ddp_step": lambda r: criteria.judge_ddp_step(r, criteria.reference_step(seed_of(out), world)),
                     "metrics": lambda r: criteria.judge_metrics(r, seed_of(out)), "training_job": criteria.judge_job}[name]
            try:
                verdicts[name] = judge(mine)
            except Exception as error:  # malformed results (a submission that wrote its own): not passed
                verdicts[name] = f"on {world} ranks the results were malformed ({type(error).__name__}: {error})"
    return verdicts


def seed_of(out: Path) -> int:
    return int((out / "probe-seed").read_text())


def grade_one(path: Path, out: Path, options: argparse.Namespace) -> Grade:
    from . import settings
    grade = Grade(path.stem)
    criteria = _criteria()
    grade.points = {name: 0 for name in criteria}
    try:
        submission = restore(path)
    except SubmissionError as error:
        grade.reasons = {name: str(error) for name in criteria}
        return grade
    grade.notes = submission.notes
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))
    try:
        limits = sandbox.Limits(wall_s=options.notebook_timeout)
        env = {"COURSE_QUICK": "1" if options.quick else "0"}
        work, ran = scratch / "notebook", scratch / "notebook-out"
        work.mkdir()
        nbformat.write(submission.restored, work / "submission.ipynb")
        command = [sys.executable, "-m", "assessment.run_notebook", "submission.ipynb", "executed.ipynb",
                   "status.json", str(options.cell_timeout)]
        result = sandbox.run(command, work, ["executed.ipynb", "status.json", settings.MODEL_FILE], ran, limits, env)
        status = _status(ran / "status.json")
        grade.ran = bool(status.get("completed"))
        run_problem = _run_problem(status, result, options)
        errors = status.get("cell_errors", [])
        grade.notes += [f"cell {e['cell']} raised {e['message']}" for e in errors[:5]]
        if len(errors) > 5:
            grade.notes.append(f"... and {len(errors) - 5} more cells raised errors")
        if (ran / "executed.ipynb").exists():
            (out / "executed").mkdir(parents=True, exist_ok=True)
            shutil.copy(ran / "executed.ipynb", out / "executed" / f"{path.stem}.ipynb")

        probe_work, probe_out = scratch / "probe", scratch / "probe-out"
        probe_work.mkdir()
        (probe_work / "learner.py").write_text(submission.code)
        seed = secrets.randbelow(2**31)
        keep = [f"results/world{w}_rank{r}.pt" for w in PROBE_WORLDS for r in range(w)]
        per_world = options.probe_timeout / len(PROBE_WORLDS)
        (probe_work / "seed").write_text(str(seed))   # read and deleted by the probe before any learner code runs
        probed = sandbox.run([sys.executable, "-m", "assessment.probe", "learner.py", "results", "seed",
                              str(per_world), *map(str, PROBE_WORLDS)], probe_work, keep, probe_out,
                             sandbox.Limits(wall_s=options.probe_timeout + 30), env)
        (probe_out / "probe-seed").write_text(str(seed))
        if probed.failure:
            print(f"grader: {probed.failure}", file=sys.stderr)
            verdicts = {name: f"the grader could not run the checks of your functions (not your code's fault; tell "
                              f"your instructor): {probed.failure}" for name in PROBED}
        else:
            verdicts = judge_probes(probe_out)
        for name, reason in verdicts.items():
            grade.points[name] = criteria[name][0] if reason is None else 0
            if reason:
                grade.reasons[name] = reason

        accuracy, why = evaluate_model(ran / settings.MODEL_FILE, secrets.randbelow(2**31))
        if accuracy is None:
            grade.reasons["target"] = run_problem or why
        elif accuracy < settings.TARGET:
            grade.reasons["target"] = (f"your saved model reached {accuracy:.3f} on {settings.EVAL_SIZE} fresh held-out "
                                       f"images; the target is {settings.TARGET:.2f}")
        elif (over := _over_time_budget(status, submission.code_cells)) is not None:
            grade.reasons["target"] = over
        else:
            grade.points["target"] = criteria["target"][0]
            grade.reasons["target"] = f"accuracy {accuracy:.3f} on fresh held-out images (target {settings.TARGET:.2f})"
        if run_problem:
            grade.notes.insert(0, run_problem)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return grade


def _status(path: Path) -> dict:
    import json
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _run_problem(status: dict, result: sandbox.Result, options) -> str:
    if result.failure:  # not the submission's doing: the instructor must see it
        print(f"grader: {result.failure}", file=sys.stderr)
        return f"the grader could not run your notebook (not your code's fault; tell your instructor): {result.failure}"
    if result.timed_out:
        return f"the notebook did not finish within {options.notebook_timeout} s and was stopped"
    if not status:
        return "the notebook run ended without a report (the process was killed, e.g. by a resource limit)"
    error = status.get("error")
    if error:
        return f"the notebook stopped in cell {error.get('cell')}: {error.get('message')}"
    return ""


def _over_time_budget(status: dict, owned: list[str]) -> str | None:
    """Where every worker has a GPU, the data-parallel job must also be fast: the run cell and every cell
    the learner wrote (training could hide in one) take at most TIME_FACTOR x the baseline cell's time.

    Elsewhere the engines share the CPU cores, and time says little about the learner's code: no budget.
    """
    import torch
    from . import settings
    if torch.cuda.device_count() < settings.WORKERS:
        return None
    seconds = {c["id"]: c.get("seconds") or 0.0 for c in status.get("cells", [])}
    base = seconds.get(BASELINE_CELL)
    mine = sum(seconds.get(cell, 0.0) for cell in (*owned, RUN_CELL))
    if base and mine > settings.TIME_FACTOR * base:
        return (f"on this machine's GPUs your job took {mine:.1f} s (the run cell and your own cells), more than "
                f"{settings.TIME_FACTOR} x the one-process baseline's {base:.1f} s measured in the same grading run")
    return None


def feedback(grade: Grade) -> str:
    criteria = _criteria()
    total, best = sum(grade.points.values()), sum(p for p, _ in criteria.values())
    lines = [f"# Feedback: {grade.name}", "", f"Automatic score: **{total} / {best}** "
             f"(the written answers are graded by your instructor).", ""]
    for name, (points, what) in criteria.items():
        mark = "passed" if grade.points.get(name) else "not passed"
        lines.append(f"- **{name}** ({grade.points.get(name, 0)}/{points}, {mark}): {what}.")
        if name in grade.reasons:
            lines.append(f"  - {grade.reasons[name]}")
    if grade.notes:
        lines += ["", "Notes on your notebook:"] + [f"- {note}" for note in grade.notes]
    return "\n".join(lines) + "\n"


def write_outputs(grades: list[Grade], out: Path) -> Path:
    criteria = _criteria()
    best = sum(p for p, _ in criteria.values())
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    table = out / "grades.csv"
    with open(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", *criteria, "total", "max_total", *WRITTEN])
        for grade in grades:
            writer.writerow([grade.name, *(grade.points.get(n, 0) for n in criteria), sum(grade.points.values()),
                             best, *("" for _ in WRITTEN)])
    for grade in grades:
        (out / "feedback" / f"{grade.name}.md").write_text(feedback(grade))
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("submissions", type=Path, help="folder with the .ipynb files to grade")
    parser.add_argument("--out", type=Path, default=Path("build/grades"))
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    parser.add_argument("--quick", action="store_true", help="the quick-mode sizes (as the test suite runs)")
    parser.add_argument("--cell-timeout", type=int, default=300, help="seconds one cell may run")
    parser.add_argument("--notebook-timeout", type=int, default=900, help="seconds the whole notebook may run")
    parser.add_argument("--probe-timeout", type=int, default=300, help="seconds the function probes may run")
    options = parser.parse_args(argv)
    os.environ["COURSE_QUICK"] = "1" if options.quick else os.environ.get("COURSE_QUICK", "0")
    options.quick = os.environ["COURSE_QUICK"] == "1"
    if not options.submissions.is_dir():
        parser.error(f"{options.submissions} is not a folder: put the notebooks to grade in one "
                     f"(make grade SUBMISSIONS=that_folder)")
    paths = sorted(options.submissions.glob("*.ipynb"))
    if not paths:
        parser.error(f"no .ipynb file in {options.submissions}")
    if options.jobs < 1:
        parser.error(f"--jobs must be 1 or more, got {options.jobs}")
    options.out.mkdir(parents=True, exist_ok=True)
    for stale in ("feedback", "executed"):  # an earlier batch's files must not pass for this one's
        shutil.rmtree(options.out / stale, ignore_errors=True)
    mode = sandbox.isolation_mode()
    print(f"grading {len(paths)} submission(s), {options.jobs} at a time; isolation: {mode}", file=sys.stderr)
    from tqdm import tqdm
    start, grades = time.monotonic(), {}
    with ThreadPoolExecutor(options.jobs) as pool, tqdm(total=len(paths), unit="submission", file=sys.stderr) as bar:
        futures = {pool.submit(grade_one, path, options.out, options): path for path in paths}
        for future in as_completed(futures):
            grades[futures[future]] = future.result()
            bar.update()
    ordered = [grades[p] for p in paths]
    table = write_outputs(ordered, options.out)
    failed = sum(not g.ran for g in ordered)
    print(f"graded {len(ordered)}: {len(ordered) - failed} ran to the end, {failed} failed to run; "
          f"{time.monotonic() - start:.0f} s; {table}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

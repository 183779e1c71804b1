"""Grades every assessment notebook in a folder: a CSV for the instructor, feedback for each learner.

    make grade SUBMISSIONS=folder [JOBS=2]
    python -m assessment.grader.grade folder [--jobs 2] [--out build/grades] [--quick]

For each ``.ipynb`` (sorted by name), the grader rebuilds the notebook around the learner's cells
(``assessment.grader.submission``), runs it behind the sandbox's boundary (``assessment.grader.sandbox``), runs the
learner's torchrun script on a tiny problem in another sandbox (``assessment.job``: 2 processes, 3 on
two simulated nodes, one rank failing, a batch to refuse), then judges what came back and evaluates
the saved checkpoints (``assessment.grader.model_file``) on held-out images drawn with a seed made here and
never written anywhere. Reading the handed-in notebook and judging what came back run in a child
process with its own time and memory limits (``assessment.grader.judging``), never in the grader's: a
submission that makes judging slow or huge gets a zero row saying so, and the batch goes on. The
sandboxes see the grading view of the learner bundle (``tooling.release``), never this repository.
Writes ``grades.csv`` (one row per submission, one column per criterion, ``total``, ``max_total``,
empty columns for the written answers; rewritten after every submission), ``feedback/NAME.md`` and
``executed/NAME.ipynb`` (outputs reduced to text and images, no trust mark: see ``inert``). Any
error of the grader's own while grading one submission is that submission's row (0 points, with the
reason) and the batch goes on; the exit status is then 1 and the rows are named.

Where bwrap cannot make the boundary, the grader refuses untrusted work and says what to install;
``--trust-submissions`` grades anyway, for a notebook you trust (your own solution, a test).
"""
from __future__ import annotations

import argparse
import csv
import functools
import os
import re
import resource
import secrets
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from assessment import criteria, job
from assessment.grader import judging, sandbox

COURSE = "/course"   # where the sandboxes see the grading view of the learner bundle

JOB_CELL = "asmt-07"           # the %%writefile cell that holds the learner's script
JUDGED = tuple(dict.fromkeys(job.CRITERION.values()))   # the criteria the script's runs decide
WRITTEN = ("q1", "q2", "q3")
REPLAY_SECONDS = 900   # the replay of a run that counts: one process training what the run trained (full mode: ~2 min)


@dataclass
class Grade:
    name: str
    points: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # criterion -> why it failed (or a note when passed)
    notes: list[str] = field(default_factory=list)
    ran: bool = False
    failed: str = ""   # the grader could not grade it: why
    flags: list[str] = field(default_factory=list)   # for the instructor: evidence that a run trained otherwise
    stem: str = ""     # the file's own name
    file: str = ""     # the name of its feedback and executed notebook (output_names: one per submission)


def _criteria():
    from assessment.criteria import CRITERIA  # imported late: settings read COURSE_QUICK when first imported
    return CRITERIA


def load_checkpoint(path: Path) -> tuple[dict | None, str]:
    """One saved state_dict as plain dense tensors of the model's shapes, or None and why it was refused.

    The file is untrusted: ``model_file`` checks the archive and loads it in a memory-limited process."""
    from utils import models
    from assessment.grader import model_file
    if not path.exists():
        return None, ""
    expected = {k: (tuple(v.shape), v.dtype) for k, v in models.CNN((1, 28, 28)).state_dict().items()}
    try:
        return model_file.load_state_dict(path, expected), ""
    except model_file.ModelFileError as error:
        return None, f"{path.name} was refused: {error}"


def accuracy_on_fresh_images(state: dict, seed: int) -> float:
    import torch

    from utils import models
    model = models.CNN((1, 28, 28))
    model.load_state_dict(state)
    fresh = _fresh_images(seed)
    model.eval()
    with torch.no_grad():
        return (model(fresh.x_train).argmax(1) == fresh.y_train).float().mean().item()


@functools.lru_cache(maxsize=2)
def _fresh_images(seed: int):
    """EVAL_SIZE held-out images the submission never saw, drawn like the course's (difficulty included)."""
    from utils import data
    from assessment import settings
    return data.shapes(num_samples=settings.EVAL_SIZE * 5 // 4 // 10 * 10, seed=seed, difficulty=settings.DIFFICULTY,
                       cache=False)   # drawn once: not kept


def judge_checkpoints(folder: Path, seed: int) -> tuple[int | None, str]:
    """Whether two consecutive epochs' checkpoints reach the target on fresh images and the last one stays at the
    floor or above (``criteria.target_held``): the first epoch of the first such pair (None: not reached), and the
    feedback.

    Every checkpoint is evaluated on the same fresh images. A checkpoint identical to the one before it
    is not a new evaluation (one model saved under several names, or a "best so far" copy), and a
    missing or refused one breaks the run of evaluations."""
    import torch

    from assessment import settings
    names = f"{settings.checkpoint_name(1)} to {settings.checkpoint_name(settings.EPOCHS)}"
    accuracies, refused, previous = [], [], None
    for epoch in range(1, settings.EPOCHS + 1):
        state, why = load_checkpoint(folder / settings.checkpoint_name(epoch))
        if why:
            refused.append(why)
        repeated = (state is not None and previous is not None
                    and all(torch.equal(state[k], previous[k]) for k in state))
        accuracies.append(None if state is None else "same" if repeated else accuracy_on_fresh_images(state, seed))
        previous = state
    if all(a is None for a in accuracies):
        if refused:
            return None, f"every checkpoint in {settings.CHECKPOINT_DIR}/ was refused, so none could be evaluated: {refused[0]}"
        return None, (f"your notebook saved no checkpoint in {settings.CHECKPOINT_DIR}/ ({names}): the run that "
                       f"counts did not finish")
    shown = ", ".join("missing" if a is None else "same as before" if a == "same" else f"{a:.3f}"
                      for a in accuracies)
    summary = f"accuracy of your checkpoints after epochs 1-{settings.EPOCHS} on {settings.EVAL_SIZE} fresh held-out images: {shown}"
    first, why_not = criteria.target_held([a if isinstance(a, float) else None for a in accuracies],
                                          settings.TARGET, settings.FLOOR)
    if first is not None:
        return first, (f"{summary}; at or above the target {settings.TARGET:.2f} after epochs {first} and {first + 1}, "
                      f"and the last one at the floor {settings.FLOOR:.2f} or above")
    notes = []
    if "same" in accuracies:
        notes.append("a checkpoint identical to the one before it is not a new evaluation: save the model as it is "
                     "after each epoch")
    if None in accuracies:
        notes.append(f"a missing or refused checkpoint breaks the run ({names})" + (f"; {refused[0]}" if refused else ""))
    return None, f"{summary}; {why_not}" + "".join(f". Note: {n}" for n in notes)


def job_script(nb: nbformat.NotebookNode) -> str:
    """The learner's script: the job cell's body, without its %%writefile line (restore keeps the course's)."""
    source = next((c.source for c in nb.cells if c.get("id") == JOB_CELL), "")
    return source.split("\n", 1)[1] if source.startswith("%%writefile") and "\n" in source else ""


def load_job_state(path: Path) -> dict:
    """The tiny job's checkpoint, loaded as untrusted input; ``Incorrect`` says why it cannot be judged."""
    from utils.checks import Incorrect
    state, why = load_checkpoint(path)
    if state is None:
        raise Incorrect(f"A.1: {why}" if why else f"A.1: no model was saved as {job.SAVED} in the folder given by "
                                                  f"--out: rank 0 must save the model's weights there after every epoch")
    return state


def grade_one(path: Path, out: Path, options: argparse.Namespace, file: str | None = None) -> Grade:
    """Grade one submission; whatever goes wrong becomes this submission's row, never the batch's end.
    ``file``: its name among the batch's outputs (``output_names``)."""
    grade = Grade(path.stem, stem=path.stem, file=file or safe_name(path.stem))
    grade.points = {name: 0 for name in _criteria()}
    try:
        _grade(path, out, options, grade)
    except judging.JudgingError as error:   # the submission's files made judging slow, huge or crash
        grade.points = {name: 0 for name in _criteria()}
        grade.reasons = {name: f"{error}: what your notebook or script left could not be judged within the grader's "
                               f"limits" for name in _criteria()}
    except Exception as error:  # noqa: BLE001 - one submission must never cost the class its grades
        grade.points = {name: 0 for name in _criteria()}
        grade.failed = f"the grader could not grade this notebook: {type(error).__name__}: {error}"[:500]
        grade.reasons = {name: grade.failed for name in _criteria()}
        print(f"grader: {sandbox.printable(path.name)}: {grade.failed}", file=sys.stderr)
    # Everything below came, at least in part, from the sandbox: printable text only.
    grade.name = sandbox.printable(os.fsencode(path.stem).decode("utf-8", "replace"))
    grade.reasons = {name: sandbox.printable(str(reason))[:2000] for name, reason in grade.reasons.items()}
    grade.notes = [sandbox.printable(str(note))[:500] for note in grade.notes[:20]]
    grade.failed = sandbox.printable(grade.failed)
    return grade


def _grade(path: Path, out: Path, options: argparse.Namespace, grade: Grade) -> None:
    """Run the submission's two sandboxes; everything that reads what it handed in or what they returned
    runs in ``judging``'s limited child process, never here."""
    from assessment import settings
    criteria = _criteria()
    scratch = Path(tempfile.mkdtemp(prefix="course-grade-"))   # private to the grader (0700)
    replay = None
    try:
        work, ran, job_work, job_out = (scratch / name for name in ("notebook", "notebook-out", "job", "job-out"))
        work.mkdir(), job_work.mkdir()
        prepared = judging.call("prepare", str(path), str(work / "submission.ipynb"), str(job_work / settings.JOB_FILE),
                                seconds=options.judge_timeout)
        if prepared["refused"]:
            grade.reasons = {name: prepared["refused"] for name in criteria}
            return
        grade.notes = list(prepared["notes"])
        # COURSE_DATA_DIR in the sandbox's own home: the processes of one submission share the course's drawn
        # images (utils.data's cache), and no submission's files reach another's or the grader's.
        env = {"COURSE_QUICK": "1" if options.quick else "0", "PYTHONPATH": options.course, "COURSE_DATA_DIR": "~/course-data"}
        # Drawn for each submission: no learner can tune on the graded run, and another learner's records are
        # for another seed (the job's shuffles and initial weights follow it).
        given = getattr(options, "counted_seed", None)
        counted = secrets.randbelow(2**31) if given is None else given
        view = {options.course_dir: options.course} if options.course_dir else None
        command = [sys.executable, "-m", "assessment.run_notebook", "submission.ipynb", "executed.ipynb",
                   str(options.cell_timeout)]
        checkpoints = [f"{settings.CHECKPOINT_DIR}/{settings.checkpoint_name(e)}" for e in range(1, settings.EPOCHS + 1)]
        records = [f"{settings.RECORD_DIR}/rank{r}.json" for r in range(settings.WORKERS)]
        result = sandbox.run(command, work, ["executed.ipynb", *checkpoints, *records], ran,
                             sandbox.Limits(wall_s=options.notebook_timeout),
                             {**env, settings.SEED_VARIABLE: str(counted)}, options.mode, view)
        if result.failure:  # not the submission's doing: the instructor must see it
            print(f"grader: {result.failure}", file=sys.stderr)
        # The replay needs only what the notebook returned, and one core: where the run that counts left every
        # checkpoint and record, it runs beside the job and the judging (measured in full mode: replay 114 s, job
        # and judging 110 s, on 2 cores), and is stopped, its answer unread, if the run is not accepted. Only the
        # files' names are looked at here; their contents are read in the judging child.
        replay_step = functools.partial(judging.call, "replay", str(ran), counted,
                                        seconds=getattr(options, "replay_timeout", REPLAY_SECONDS))
        if all((ran / Path(name).name).is_file() for name in [*checkpoints, *records]):
            replay = _Speculative(lambda cancel: replay_step(cancel=cancel))
        seed = secrets.randbelow(2**31)   # the tiny job's shuffles and initial weights: new for every submission
        keep = [f"results/{name}" for scenario in job.SCENARIOS for name in job.files(scenario)]
        ran_job = sandbox.run([sys.executable, "-m", "assessment.job", settings.JOB_FILE, "results", str(seed)],
                              job_work, keep, job_out, sandbox.Limits(wall_s=options.job_timeout), env, options.mode, view)
        if ran_job.failure:
            print(f"grader: {ran_job.failure}", file=sys.stderr)
        (out / "executed").mkdir(parents=True, exist_ok=True)
        run = {"returncode": result.returncode, "timed_out": result.timed_out, "failure": result.failure,
               "timeout": options.notebook_timeout}
        judged = judging.call("judge", str(ran), run, counted, str(job_out), seed, ran_job.failure, secrets.randbelow(2**31),
                              str(out / "executed" / f"{grade.file}.ipynb"), seconds=options.judge_timeout)
        grade.ran = judged["ran"]
        grade.notes = ([judged["run_problem"]] if judged["run_problem"] else []) + grade.notes + judged["notes"] + [
            f"the run that counts ran at seed {counted}, " + ("drawn for this submission" if given is None else
                                                              "given with --counted-seed"),
            f"the checks of your script on the tiny problem ran at seed {seed}, drawn for this submission"]
        for name, reason in judged["verdicts"].items():
            grade.points[name] = criteria[name][0] if reason is None else 0
            if reason:
                grade.reasons[name] = reason
        for name in ("target", "speed"):
            passed, why = judged[name]
            grade.points[name] = criteria[name][0] if passed else 0
            grade.reasons[name] = why
        if judged["target"][0]:   # the run that counts was accepted: taken again, epoch by epoch, in a child of its own
            try:
                replayed = replay.result() if replay is not None else replay_step()
                grade.flags += [replayed["flag"]] if replayed["flag"] else []
            except judging.JudgingError as error:
                grade.flags.append(f"the run that counts could not be replayed: {error}")
    finally:
        if replay is not None:
            replay.stop()          # before the files it reads are removed
        shutil.rmtree(scratch, ignore_errors=True)


class _Speculative:
    """A judging step started now in a thread of its own, its answer read later, or stopped unread."""

    def __init__(self, step):
        self._cancel, self._answer, self._error = threading.Event(), None, None
        self._thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self._thread.start()

    def _run(self, step):
        try:
            self._answer = step(self._cancel)
        except BaseException as error:   # noqa: BLE001 - read, or dropped unread, by the grading thread
            self._error = error

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._answer

    def stop(self) -> None:
        self._cancel.set()
        self._thread.join()


def judge_returned(ran: str, run: dict, counted_seed: int, job_out: str, job_seed: int, job_failure: str,
                   eval_seed: int, executed_to: str) -> dict:
    """Every verdict on what the two sandboxes returned (``judging``'s child runs this, under its limits):
    the job's criteria from its scenarios' files, the target from the run that counts' checkpoints and
    records (a run at ``counted_seed``, the seed the grader gave it), the run's report from the final
    executed notebook, which is written to ``executed_to`` without active content."""
    ran = Path(ran)
    executed = _read_notebook(ran / "executed.ipynb")
    status = run_status(executed, run)
    if executed is not None:
        Path(executed_to).write_text(nbformat.writes(inert(executed)), encoding="utf-8", errors="replace")
    errors = status["cell_errors"]
    notes = [f"cell {e['cell']} raised {e['message']}" for e in errors[:5]]
    if len(errors) > 5:
        notes.append(f"... and {len(errors) - 5} more cells raised errors")
    if job_failure:
        verdicts = {name: f"the grader could not run your script (not your code's fault; tell your instructor): "
                          f"{job_failure}" for name in JUDGED}
    else:
        verdicts = job.judge(Path(job_out), job_seed, load_job_state)   # a scenario cut off by the time limit fails
    first, why = judge_checkpoints(ran, eval_seed)   # kept files come back by base name
    # counted only at its settings and if they come from its training (records and checkpoints come back by base name)
    if first is not None and (unlike := job.judge_counted_run(ran, counted_seed, ran, lambda p: load_checkpoint(p)[0])):
        first, why = None, f"{why}; but they do not count: {unlike}"
    reached = first is not None
    shape = job.counted_run_shape(ran, counted_seed) if reached else None   # its batch, for the speed rule
    problem = status["problem"]
    if not reached and problem:
        why = f"{problem}; {why}"
    cut = functools.partial(_cut, limit=2000)
    return {"ran": status["completed"] and executed is not None and not run["timed_out"],
            "run_problem": cut(problem), "notes": [cut(n) for n in notes],
            "verdicts": {k: None if v is None else cut(v) for k, v in verdicts.items()}, "target": [reached, cut(why)],
            "speed": list(criteria.speed(first if shape else None, *(shape or (0,))))}


def replay_returned(ran: str, counted_seed: int) -> dict:
    """The run that counts replayed against its checkpoints (``job.replay_counted_run``; ``judging``'s child runs
    this, under its limits): its flag, if any, for the instructor, with the evidence; points are not changed."""
    try:
        replayed = job.replay_counted_run(Path(ran), counted_seed, Path(ran), lambda p: load_checkpoint(p)[0])
    except Exception as error:  # noqa: BLE001 - records written in the sandbox: the instructor learns why, nothing more
        return {"flag": _cut(f"the run that counts could not be replayed ({type(error).__name__}: {error})", 500)}
    return {"flag": None if replayed["flag"] is None else _cut(replayed["flag"], 2000)}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def _read_notebook(path: Path) -> nbformat.NotebookNode | None:
    """The executed notebook the sandbox returned, or None where there is none or it does not parse."""
    if not path.is_file():
        return None
    try:
        return nbformat.reads(path.read_text(encoding="utf-8", errors="replace"), as_version=4)
    except Exception:  # noqa: BLE001 - written in the sandbox: anything unreadable is no notebook
        return None


_ANSI = re.compile(r"\x1b\[[0-9;]{0,20}[A-Za-z]")
SAFE_OUTPUTS = ("text/plain", "image/png", "image/jpeg")   # what an executed notebook keeps: nothing that runs


def inert(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The executed notebook as the instructor gets it, safe in any viewer (JupyterLab sanitises, but
    nbconvert's HTML export does not): outputs reduced to text and raster images whose only metadata is a
    numeric size, no widget state or trust marks, cell metadata other than the course's own dropped (it
    can hide a cell's source or outputs), no attachments, and ``<`` escaped in Markdown cells (a learner's
    answer could hold raw HTML; ``&lt;`` shows as ``<``)."""
    for key in list(nb.metadata):
        if key not in ("course", "course_run", "kernelspec", "language_info"):
            del nb.metadata[key]
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "course"}
        cell.pop("attachments", None)
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace("<", "&lt;")
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if "data" in output:
                output["data"] = {k: v for k, v in output["data"].items() if k in SAFE_OUTPUTS}
                output["metadata"] = {kind: {k: v for k, v in size.items() if k in ("width", "height")
                                             and type(v) is int}
                                      for kind, size in output.get("metadata", {}).items()
                                      if kind in output["data"] and isinstance(size, dict)}
                if not output["data"]:
                    continue
            kept.append(output)
        cell.outputs = kept
    return nb


def run_status(nb: nbformat.NotebookNode | None, run: dict) -> dict:
    """The notebook run's report, made here from the sandbox's result (exit status, time-out) and the final
    executed notebook: whether every cell ran, why not, and the cells that raised (their error outputs)."""
    if run["failure"]:
        problem = (f"the grader could not run your notebook (not your code's fault; tell your instructor): "
                   f"{run['failure']}")
    elif run["timed_out"]:
        problem = f"the notebook did not finish within {run['timeout']} s and was stopped"
    elif nb is None:
        problem = "the notebook run ended without a report (the process was killed, e.g. by a resource limit)"
    else:
        problem = ""
    facts = nb.metadata.get("course_run") if nb is not None else None
    facts = facts if isinstance(facts, dict) else {}
    error = facts.get("error") if isinstance(facts.get("error"), dict) else None
    if not problem and (run["returncode"] != 0 or error):
        where = f" in cell {str(error.get('cell'))[:40]}" if error and error.get("cell") else ""
        message = str(error.get("message"))[:300] if error else f"the runner ended with status {run['returncode']}"
        problem = f"the notebook stopped{where}: {message}"
    errors = [{"cell": str(cell.get("id"))[:40], "message": _error_message(out)} for cell in (nb.cells if nb else [])
              if cell.cell_type == "code" for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    return {"completed": run["returncode"] == 0 and not problem, "problem": problem, "cell_errors": errors}


def _error_message(error) -> str:
    """An error output in words; for a %%px cell, the engines' own error (utils.px's RankError names the ranks)."""
    if error.get("ename") == "RankError":
        first = (_ANSI.sub("", str(error.get("evalue") or "")[:2000]).splitlines() or [""])[0]
        return f"(on the engines) {first}"[:300]
    return f"{str(error.get('ename'))[:100]}: {str(error.get('evalue'))[:2000]}"[:300]


def without_checks(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook the grader runs: its check cell is left out (the grader runs the same scenarios itself,
    and judges them outside the sandbox)."""
    nb = nbformat.from_dict(nb)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and "check_job(" in c.source)]
    return nb


def feedback(grade: Grade) -> str:
    criteria = _criteria()
    total, best = sum(grade.points.values()), sum(p for p, _ in criteria.values())
    lines = [f"# Feedback: {grade.name}", "", f"Automatic score: **{total} / {best}** "
             f"(the written answers are graded by your instructor).", ""]
    for name, (points, what) in criteria.items():
        mark = "passed" if grade.points.get(name) else "not passed"
        lines.append(f"- **{name}** ({grade.points.get(name, 0)}/{points}, {mark}): {what}.")
        if name in grade.reasons:
            lines.append(f"  - {inline(grade.reasons[name])}")
    if grade.notes:
        lines += ["", "Notes on your notebook:"] + [f"- {inline(note)}" for note in grade.notes]
    if grade.flags:
        lines += ["", "Flagged for your instructor (no points changed):"] + [f"- {inline(flag)}" for flag in grade.flags]
    return "\n".join(lines) + "\n"


MARKDOWN_ACTIVE = "\\`*[]<>|"   # emphasis, code, links, raw HTML, tables: escaped in text that may quote a run


def inline(text: str) -> str:
    """One line of Markdown that only shows ``text``: reasons and notes quote what a submission's runs printed
    (an outside test wrote a rank's error as new bullets and "Automatic score: **14 / 14**"), so line breaks
    become spaces and every character that Markdown would act on is escaped."""
    return "".join("\\" + c if c in MARKDOWN_ACTIVE else c for c in " ".join(text.split()))


def csv_cell(text: str) -> str:
    """A cell a spreadsheet shows as text: a leading =, +, -, @, tab or carriage return would make it a
    formula (OWASP's CSV injection advice: prefix such a cell with a single quote)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def safe_name(stem: str) -> str:
    """A file name made from a submission's: no path separators, no leading dot. Where it had to change, "+" and
    a hash of the original follow: "+" is never in a name kept as it was, so a learner who names a file after
    another's cleaned name (an outside test did) cannot take that learner's feedback file."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in stem).lstrip(".")[:100]
    if cleaned != stem:
        import hashlib
        cleaned = f"{cleaned or 'submission'}+{hashlib.sha256(os.fsencode(stem)).hexdigest()[:16]}"
    return cleaned


def output_names(stems: list[str]) -> dict[str, str]:
    """Each submission's name for its feedback and executed notebook: ``safe_name``, and never one another
    submission of the batch has, even on a file system that ignores case (a "+2", "+3" ... follows)."""
    names, taken = {}, set()
    for stem in sorted(stems):
        name = first = safe_name(stem)
        count = 1
        while name.lower() in taken:
            count += 1
            name = f"{first}+{count}"
        names[stem] = name
        taken.add(name.lower())
    return names


def write_outputs(grades: list[Grade], out: Path) -> Path:
    """grades.csv and every feedback file, written whole (a temporary file renamed: never half a table)."""
    criteria = _criteria()
    best = sum(p for p, _ in criteria.values())
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    table = out / "grades.csv"
    partial = out / ".grades.csv.part"
    with open(partial, "w", newline="", encoding="utf-8", errors="replace") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)   # a separator inside a name stays inside its cell
        writer.writerow(["submission", *criteria, "total", "max_total", *WRITTEN, "grader_error", "flags"])
        for grade in grades:
            writer.writerow([csv_cell(grade.name), *(grade.points.get(n, 0) for n in criteria),
                             sum(grade.points.values()), best, *("" for _ in WRITTEN), csv_cell(grade.failed),
                             csv_cell("; ".join(grade.flags))])
    partial.replace(table)
    for grade in grades:
        (out / "feedback" / f"{grade.file}.md").write_text(feedback(grade), encoding="utf-8", errors="replace")
    return table


def peak_memory_mib() -> int:
    """The grader's own peak resident memory (its children, the sandboxes and judging, have limits of their own):
    it holds the rows and the threads, never torch or a submission's files, so a batch of any size stays small.
    Linux's VmHWM, of this program only: ru_maxrss keeps the peak of the process it was started from (a parent
    with torch loaded, forked before the exec, read 574 MiB)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) >> 10
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> (20 if sys.platform == "darwin" else 10)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("submissions", type=Path, help="folder with the .ipynb files to grade")
    parser.add_argument("--out", type=Path, default=Path("build/grades"))
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded at once")
    parser.add_argument("--quick", action="store_true", help="the quick-mode sizes (as the test suite runs)")
    parser.add_argument("--cell-timeout", type=int, default=900, help="seconds one cell may run")
    parser.add_argument("--notebook-timeout", type=int, default=1800, help="seconds the whole notebook may run")
    parser.add_argument("--job-timeout", type=int, default=700,
                        help="seconds the runs of the learner's script on the tiny problem may take, all four together")
    parser.add_argument("--judge-timeout", type=float, default=judging.SECONDS,
                        help="seconds each judging step may take (it reads what a submission left, in a child process)")
    parser.add_argument("--replay-timeout", type=float, default=REPLAY_SECONDS,
                        help="seconds the replay of a run that counts may take (one process; past it: a flag, no points lost)")
    parser.add_argument("--counted-seed", type=int, default=None,
                        help="the seed of every run that counts (default: a new one drawn for each submission, "
                             "which its feedback names); give one to re-grade a submission at the seed it had")
    parser.add_argument("--trust-submissions", action="store_true",
                        help="grade without the sandbox's boundary where it cannot be made: only for notebooks you trust")
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
    options.mode = sandbox.isolation_mode()
    if options.mode == "none" and not options.trust_submissions:
        parser.exit(2, f"grader: refusing to grade untrusted notebooks without the sandbox's boundary: "
                       f"{sandbox.why_none()}.\nInstall it, or grade on a Linux machine or container that has it. "
                       f"To grade a notebook you trust (your own solution), add --trust-submissions (make grade ... "
                       f"GRADE_ARGS=--trust-submissions): it then runs as you, unprotected.\n")
    options.out.mkdir(parents=True, exist_ok=True)
    for stale in ("feedback", "executed"):  # an earlier batch's files must not pass for this one's
        shutil.rmtree(options.out / stale, ignore_errors=True)
    (options.out / "grades.csv").unlink(missing_ok=True)
    from tooling.release import write_release
    from utils.config import COURSE_ROOT
    views = Path(tempfile.mkdtemp(prefix="course-grade-view-"))
    try:
        if options.mode == "none":   # unprotected: the code runs here, with this repository on its path
            options.course, options.course_dir = str(COURSE_ROOT), None
        else:
            options.course, options.course_dir = COURSE, str(views / "course")
            write_release(views / "course", for_grading=True)
        caps = sandbox.whole_submission_caps() if options.mode != "none" else []
        print(f"grading {len(paths)} submission(s), {options.jobs} at a time; isolation: {options.mode}"
              + (f" as uid {sandbox.sandbox_uid()}" if sandbox.sandbox_uid() is not None else "")
              + f"; whole-submission caps: {', '.join(caps) if caps else 'none on this machine'}", file=sys.stderr)
        from tqdm import tqdm
        start, grades = time.monotonic(), {}
        with ThreadPoolExecutor(options.jobs) as pool, tqdm(total=len(paths), unit="submission", file=sys.stderr) as bar:
            files = output_names([p.stem for p in paths])
            futures = {pool.submit(grade_one, path, options.out, options, files[path.stem]): path for path in paths}
            for future in as_completed(futures):
                grades[futures[future]] = future.result()
                write_outputs([grades[p] for p in paths if p in grades], options.out)  # an interrupted batch keeps these
                bar.update()
    finally:
        shutil.rmtree(views, ignore_errors=True)
    ordered = [grades[p] for p in paths]
    table = write_outputs(ordered, options.out)
    failed = sum(not g.ran for g in ordered)
    print(f"graded {len(ordered)}: {len(ordered) - failed} ran to the end, {failed} failed to run; "
          f"{time.monotonic() - start:.0f} s; grader's peak memory {peak_memory_mib()} MiB; {table}", file=sys.stderr)
    ungraded = [g.name for g in ordered if g.failed]
    if ungraded:
        print(f"grader: could not grade {len(ungraded)} submission(s), scored 0 with the reason in grades.csv: "
              f"{', '.join(ungraded)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The grader on a whole class: good, partly right, broken and hostile submissions, graded in one batch.

One batch of submissions is graded once (two at a time, quick mode) and every test reads its CSV,
feedback and the machine's process table. The one code cell a learner writes is the job script (a
%%writefile cell: its code runs only as the script, under torchrun, in the grader's runs and in the
notebook's run that counts). Each hostile submission is the instructor's script plus attacks, so the
points it keeps show that the attacks neither helped it nor harmed the rest. The escaper tries every
way out of the sandbox an outside test found in an earlier grader and prints ESCAPED for each that
works, the instructor edition looked for everywhere among them.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from assessment.grader import grade as grade_module, sandbox
from assessment.criteria import CRITERIA
from assessment.grader.submission import INSTRUCTOR, SubmissionError, owned_cells, restore
from tooling.release import learner_notebook

ROOT = INSTRUCTOR.parent.parent
FULL = sum(points for points, _ in CRITERIA.values())
# The runs that count at seed 0, given (the grader draws one per submission by default): the batch's verdicts are then
# the same at every run of the suite, and the quick-mode solution's run passes the target there with a margin.
GRADER_ARGS = ["--quick", "--cell-timeout", "300", "--notebook-timeout", "900", "--job-timeout", "500", "--counted-seed", "0"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the batch is graded once, in the first test's set-up


def instructor():
    return nbformat.read(INSTRUCTOR, as_version=4)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.id == cell_id)


SCRIPT = "asmt-07"      # the learner's %%writefile cell: the one code cell a submission writes


def script_with(*replacements, base=None):
    """The instructor's notebook with its job script changed: each (old, new) replaced, old required."""
    nb = base or instructor()
    text = cell(nb, SCRIPT).source
    for old, new in replacements:
        assert old in text, f"the assessment's script no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    cell(nb, SCRIPT).source = text
    return nb


def script_plus(code: str, at: str = 'if __name__ == "__main__":', base=None):
    """The instructor's script with ``code`` (top-level Python) put before the line ``at``."""
    return script_with((at, textwrap.dedent(code).strip("\n") + "\n\n\n" + at), base=base)


def tampered():
    """Given cells deleted (the check), moved and edited (the run that counts at a small batch)."""
    nb = instructor()
    nb.cells = [c for c in nb.cells if c.id != "asmt-08"]
    nb.cells.insert(1, nb.cells.pop(5))
    run = cell(nb, "asmt-20").source
    assert "**settings.counted_run(seed, GLOBAL_BATCH)" in run, "the run that counts changed: update this test"
    cell(nb, "asmt-20").source = run.replace("**settings.counted_run(seed, GLOBAL_BATCH)",
                                             '**settings.counted_run(seed, GLOBAL_BATCH), "global_batch": 32')
    return nb


# A per-rank batch written for 2 processes: right on 2, wrong on 3 (the "right at 2, wrong at 3").
WRONG_AT_THREE = [("batch_size=args.global_batch // world_size", "batch_size=args.global_batch // 2")]
# The escaper keeps the failure and refusal criteria: wrong on 3 processes, its checkpoints sparse.
ESCAPER_POINTS = CRITERIA["failure"][0] + CRITERIA["refusal"][0]

CHEATER = """
# Reports success without earning it, and tries to reach what it must not.
import glob, json, os, sys
json.dump({"accuracy": 0.99}, open("metrics.json", "w"))
open("grades.csv", "w").write("submission,total\\ncheater,999\\n")
try:
    from assessment.grader import grade        # the grader: not in the sandbox
    grade.judge_checkpoints = lambda *args: (True, "passed")
except ImportError:
    pass
try:
    open(os.path.join(os.path.dirname(settings.__file__), "grader", "grade.py"), "a").write("\\n# edited")
except OSError:
    pass
seen = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:        # a process may end between the listing and the read: that must not end this script
        seen[p] = open(f"/proc/{p}/environ", "rb").read()
    except OSError:
        pass


def train(args, rank, world_size, device):      # no training: fake checkpoints, fake logs, fake records
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        for epoch in range(args.epochs):
            torch.save({"weight": torch.zeros(3)}, os.path.join(args.out, settings.checkpoint_name(epoch + 1)))
            print(f"epoch {epoch} train_loss 0.001 test_accuracy 0.9900 seconds 0.1")
    probe = os.environ.get("COURSE_PROBE_DIR")
    if probe:
        os.makedirs(probe, exist_ok=True)
        json.dump({"rank": os.environ["RANK"], "forged": True}, open(os.path.join(probe, f"rank{os.environ['RANK']}.json"), "w"))
"""

LEAVER_FLOODER = """
# Leaves a process behind in its own session, prints a flood and fills the disk, then carries on; first it
# plants a read-only status file and prints a lone surrogate and a terminal escape (each once ended the batch).
import json, subprocess, sys
try:
    json.dump({"completed": True, "cell_errors": [{"cell": "x", "message": "\\ud800 \\x1b[2J"}]}, open("status.json", "w"))
    os.chmod("status.json", 0o444)
except OSError:       # planted by another rank already
    pass
if os.environ.get("RANK") == "0":   # rank 0 only: a line printed by every rank would cost the job criterion
    print("\\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"), "\\x1b[2J")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(987)"], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.environ.get("RANK") == "0":
    for _ in range(12):
        print("y" * 1_000_000)
    _written = 0
    try:
        while True:
            with open(f"fill{_written}.bin", "wb") as _f:
                _f.write(b"z" * (16 << 20))
            _written += 1
    except OSError:
        pass
    for _i in range(_written + 1):
        if os.path.exists(f"fill{_i}.bin"):
            os.remove(f"fill{_i}.bin")
"""

HOST_MARKER = f"/tmp/course-grader-test-marker-{os.getpid()}"

# Runs in every process of every run of the script, and tries every way out; rank 0 of the run that
# counts prints ESCAPED for each that works, at its end (the notebook shows the output's last lines).
ESCAPER = """
import glob, site, subprocess
_escaped = []
if os.getuid() == 0 or os.geteuid() == 0:
    _escaped.append("runs as root")
if subprocess.run(["mount", "-o", "remount,rw", "/course"], capture_output=True).returncode == 0:
    _escaped.append("remounted the course read-write")
for _target in [settings.__file__, *(os.path.join(p, "course-evil.pth") for p in site.getsitepackages())]:
    try:
        open(_target, "a").write("\\n")
        _escaped.append(f"wrote {_target}")
    except OSError:
        pass
if glob.glob("HOST_MARKER*"):
    _escaped.append("sees the host's /tmp")
for _top in ("/", "/root", "/home", "/srv", "/work", "/run", "/var", "/mnt", "/opt"):
    for _dir, _subdirs, _files in os.walk(_top):
        if _dir.startswith(("/proc", "/sys", "/usr", "/dev")) or "site-packages" in _dir:
            _subdirs[:] = []
            continue
        for _name in _files:
            _path = os.path.join(_dir, _name)
            if _name.endswith(".ipynb") and not _path.startswith(("/course/", os.getcwd())):
                _escaped.append(f"sees another notebook {_path}")
            if _name == "grades.csv" or (_name.startswith("kernel-") and _name.endswith(".json")
                                         and not _path.startswith(os.getcwd())):
                _escaped.append(f"sees {_path}")
            if (_name.endswith(".ipynb") and not _path.startswith(os.getcwd())
                    and "BEGIN SOLUTION" in open(_path, errors="replace").read()):
                _escaped.append(f"found the instructor edition at {_path}")
_solution_train = train


def train(args, rank, world_size, device):
    _solution_train(args, rank, world_size, device)
    if rank == 0:
        for _what in _escaped:
            print(f"ESCAPED: {_what}")
    if rank == 0 and args.out == settings.CHECKPOINT_DIR:   # the run that counts: its checkpoints made sparse
        for _path in glob.glob(f"{args.out}/*.pt"):
            torch.save({k: v.to_sparse() for k, v in torch.load(_path).items()}, _path)
""".replace("HOST_MARKER", HOST_MARKER)

# Makes judging slow and big: an error text of three million "[" on the ranks that should have refused a batch
# (its pattern, once quadratic in the grader's own process, stopped every grading thread), and, in the run that counts, a
# process left behind that rewrites the records (JSON nested 100000 deep, 50 MB) and keeps rewriting the
# executed notebook with HTML, JavaScript and trust marks, and a status file, after the runner wrote them.
SLOW_TO_JUDGE = """
import subprocess, sys
_REWRITER = '''
import json, os, sys, time
forged = {"cells": [{"cell_type": "code", "id": "forged", "metadata": {"trusted": True}, "source": "",
          "execution_count": 1, "outputs": [{"output_type": "display_data", "metadata": {}, "data": {
          "text/html": "<script>alert(1)</script>", "application/javascript": "alert(1)", "text/plain": "FORGED"}}]}],
          "metadata": {"trusted": True}, "nbformat": 4, "nbformat_minor": 5}
while not all(os.path.exists(os.path.join(sys.argv[1], f"rank{r}.json")) for r in (0, 1)):   # the probe's, at exit
    time.sleep(0.1)
time.sleep(1)
open(os.path.join(sys.argv[1], "rank0.json"), "w").write("[" * 100000 + "]" * 100000)
open(os.path.join(sys.argv[1], "rank1.json"), "w").write('{"rank": "1", "x": "' + "y" * (50 << 20) + '"}')
while True:
    for name, content in (("executed.ipynb", forged), ("status.json", {"completed": True})):
        try:
            json.dump(content, open(name, "w"))
        except OSError:
            pass
    time.sleep(0.01)
'''
_solution_train = train


def train(args, rank, world_size, device):
    if args.global_batch % world_size:   # rank 0 refuses; the others end with the text, as if their peer left
        if rank == 0:
            raise SystemExit(f"--global-batch {args.global_batch} does not divide by {world_size} processes")
        raise RuntimeError("Connection closed by peer " + "[" * 3_000_000)
    if rank == 0 and args.out == settings.CHECKPOINT_DIR:   # the run that counts
        subprocess.Popen([sys.executable, "-c", _REWRITER, os.environ["COURSE_PROBE_DIR"]], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _solution_train(args, rank, world_size, device)
"""


def batch() -> dict:
    learner = learner_notebook(instructor())
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('another course')")])
    return {
        "b_learner": learner,
        "d_invalid_json": '{"cells": [ this is not json',
        "e_other_course": other,
        # the script ends every process at once, before any training
        "h_exits": script_with(('    args = parse_args()\n', '    os._exit(3)\n')),
        "i_cheater": script_plus(CHEATER),
        # every way out of the sandbox (the instructor edition looked for everywhere), a process left behind, a
        # flood of output, a full disk and files planted to break the grader, in one script; and a job right on 2
        # processes but wrong on 3 (each submission that runs costs the batch about 2 minutes of both cores)
        "k_escaper": script_plus(LEAVER_FLOODER, base=script_plus(ESCAPER, base=script_with(*WRONG_AT_THREE))),
        "p_slow_to_judge": script_plus(SLOW_TO_JUDGE),
        # Files that once ended the whole batch: wrong JSON types, deep nesting, a huge number; and
        # names a spreadsheet would run as formulas.
        "m_wrong_types": '{"cells": [{"cell_type": 5, "source": [1]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}',
        "n_deep": "[" * 100000 + "]" * 100000,
        "o_huge_number": '{"cells": [], "metadata": {}, "nbformat": ' + "9" * 5000 + ', "nbformat_minor": 5}',
        "=HYPERLINK(1)": other,
        "@SUM(1)": other,
        os.fsdecode(b"q_\xff_name"): other,   # not UTF-8
        "r_vic~tim": '{"cells": [ not json',    # a name that cleans up to the next one's
        "r_vic_tim": other,
        "z_after_the_attacks": instructor(),   # graded after every attack above: still full marks
    }


def write_batch(folder, submissions: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, nb in submissions.items():
        path = folder / f"{name}.ipynb"
        if isinstance(nb, str):
            path.write_text(nb)
        else:
            nbformat.write(nb, path)


def grade(folder, out, jobs: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assessment.grader.grade", str(folder), "--out", str(out),
                           "--jobs", str(jobs), *GRADER_ARGS], cwd=ROOT, capture_output=True, text=True,
                          timeout=3600)


def rows(out) -> dict:
    with open(out / "grades.csv") as f:
        return {row["submission"]: row for row in csv.DictReader(f)}


def leftovers() -> list[str]:
    """Processes of any grading run, or the hostile submissions' own."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = open(f"/proc/{entry}/environ", "rb").read()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
        except OSError:
            continue
        if sandbox.MARKER.encode() in environ or b"time.sleep(987)" in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:120])
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if sandbox.isolation_mode() == "none":
        pytest.skip(f"the hostile submissions need the sandbox's boundary: {sandbox.why_none()}")
    folder, out = tmp_path_factory.mktemp("submissions"), tmp_path_factory.mktemp("grades")
    write_batch(folder, batch())
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    open(HOST_MARKER, "w").close()
    try:
        done = grade(folder, out, jobs=2)
    finally:
        os.unlink(HOST_MARKER)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before, "a submission changed the submissions"
    feedback = {p.stem: p.read_text() for p in (out / "feedback").glob("*.md")}
    return rows(out), feedback, out, done


def total(row) -> int:
    return int(row["total"])


def test_the_csv_has_a_row_per_submission_and_the_columns_instructors_need(graded):
    table, feedback, out, done = graded
    assert set(table) == {grade_module.csv_cell(sandbox.printable(os.fsencode(name).decode("utf-8", "replace")))
                          for name in batch()}
    header = list(next(iter(table.values())))
    assert header == ["submission", *CRITERIA, "total", "max_total", "q1", "q2", "q3", "grader_error", "flags"]
    assert all(int(row["max_total"]) == FULL and row["q1"] == row["q2"] == row["q3"] == "" for row in table.values())
    assert len(feedback) == len(table), "two submissions' feedback went to one file"
    assert f"graded {len(batch())}:" in done.stderr and "failed to run" in done.stderr
    assert "isolation: bwrap" in done.stderr and "whole-submission caps" in done.stderr


def test_the_graders_own_process_stays_small(graded):
    """Issue: 1.43 GB for a batch of 38 when the grader's process imported torch. Its children (sandboxes, judging)
    have limits of their own; the grader holds rows and threads, so its peak must not grow with the batch."""
    *_, done = graded
    peak = re.search(r"grader's peak memory (\d+) MiB", done.stderr)
    assert peak, done.stderr[-2000:]
    assert int(peak.group(1)) < 256, f"the grader's own process peaked at {peak.group(1)} MiB for {len(batch())} submissions"


def test_the_grader_never_imports_torch_in_its_own_process():
    """What the grader reads of the course (settings, the job's scenarios, the release) must not load torch (about
    500 MB, 5 s): only the judging child and the sandboxes import it."""
    code = ("import sys\nfrom assessment import job\nfrom assessment.grader import grade, judging, sandbox\nfrom tooling import release\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_the_instructor_edition_scores_full_marks(graded):
    table, feedback, *_ = graded   # graded last, after every attack in the batch
    assert total(table["z_after_the_attacks"]) == FULL, feedback["z_after_the_attacks"]


def test_the_learner_edition_scores_zero_and_says_why(graded):
    table, feedback, *_ = graded
    assert total(table["b_learner"]) == 0
    text = feedback["b_learner"]
    for name in CRITERIA:
        assert f"**{name}** (0/" in text
    assert "not solved yet" in text and "saved no checkpoint" in text


def test_a_job_right_on_two_processes_but_wrong_on_three_loses_the_job_criterion_only(graded):
    """The escaper's per-rank batch is written for 2 processes: the job criterion goes, the failure and refusal
    criteria stay (its sparse checkpoints cost it the target and speed; the escaper test checks those)."""
    table, feedback, *_ = graded
    row, text = table["k_escaper"], feedback["k_escaper"]
    assert (int(row["job"]), int(row["failure"]), int(row["refusal"])) == (0, 2, 1), text
    assert "3 processes" in text and "in batches of" in text


@pytest.mark.parametrize("name, words", [("d_invalid_json", "not valid JSON"),
                                         ("e_other_course", "not this course's assessment")])
def test_files_that_are_not_the_assessment_score_zero_with_the_reason(graded, name, words):
    table, feedback, *_ = graded
    assert total(table[name]) == 0 and words in feedback[name]


def test_deleted_moved_and_edited_given_cells_are_restored(tmp_path):
    """What the grader runs of a tampered notebook is the instructor's, cell for cell, but for the hidden tests."""
    nbformat.write(tampered(), tmp_path / "tampered.ipynb")
    submission = restore(tmp_path / "tampered.ipynb")
    for words in ("deleted: restored", "edited: restored", "moved"):
        assert any(words in note for note in submission.notes), submission.notes
    course = learner_notebook(instructor(), "assessment")
    assert [c.id for c in submission.restored.cells] == [c.id for c in course.cells]
    owned = owned_cells(instructor())
    for given, ran in zip(course.cells, submission.restored.cells):
        assert ran.source == (cell(instructor(), ran.id).source if ran.id in owned else given.source), ran.id


def test_a_script_that_exits_at_once_scores_zero_with_the_reasons(graded):
    table, feedback, *_ = graded
    assert total(table["h_exits"]) == 0
    text = feedback["h_exits"]
    assert "your job exited with" in text and "ended without a trace" in text, text


def test_fake_logs_fake_records_and_a_fake_model_earn_nothing(graded):
    table, feedback, out, _ = graded
    row = table["i_cheater"]
    assert total(row) == 0, feedback["i_cheater"]
    assert "built no DistributedSampler" in feedback["i_cheater"], feedback["i_cheater"]
    assert "every checkpoint in checkpoints/ was refused" in feedback["i_cheater"], feedback["i_cheater"]
    assert not (out / "metrics.json").exists()
    assert "# edited" not in (ROOT / "assessment" / "grader" / "grade.py").read_text()


def test_no_way_out_of_the_sandbox_works_and_the_attacks_cost_only_the_attacker(graded):
    table, feedback, out, _ = graded
    executed = out / "executed" / "k_escaper.ipynb"
    outputs = json.dumps([c.get("outputs", []) for c in nbformat.read(executed, as_version=4).cells])
    assert "ESCAPED" not in outputs, [line for line in outputs.split("\\n") if "ESCAPED" in line][:5]
    assert executed.stat().st_size < 4 << 20, "display updates went past the output cap"
    row = table["k_escaper"]
    assert total(row) == ESCAPER_POINTS, feedback["k_escaper"]
    assert "sparse" in feedback["k_escaper"]
    assert not list(sandbox.Path(sys.prefix).glob("lib/python*/site-packages/course-evil.pth"))
    assert total(table["z_after_the_attacks"]) == FULL, feedback["z_after_the_attacks"]


@pytest.mark.parametrize("name", ["m_wrong_types", "n_deep", "o_huge_number"])
def test_files_that_once_ended_the_batch_score_zero_with_their_reason(graded, name):
    table, feedback, *_ = graded
    assert total(table[name]) == 0 and "could not grade" not in feedback[name], feedback[name]
    assert "Jupyter" in feedback[name], feedback[name]   # says what to do: save it from Jupyter again


def test_submission_names_cannot_become_spreadsheet_formulas(graded):
    table, feedback, out, _ = graded
    assert "'=HYPERLINK(1)" in table and "'@SUM(1)" in table
    assert not any(name[:1] in "=+-@" for name in table)
    lines = (out / "grades.csv").read_text().splitlines()
    assert all(line.startswith('"') for line in lines), "every field is quoted: a ; in a name stays in its cell"


def test_planted_files_and_unprintable_output_break_nothing(graded):
    table, feedback, *_ = graded
    text = feedback["k_escaper"]
    assert "\x1b" not in text and "\ud800" not in text
    assert total(table["k_escaper"]) == ESCAPER_POINTS, text


def test_left_processes_a_flood_of_output_and_a_full_disk_do_not_reach_the_grader(graded):
    table, feedback, out, _ = graded
    assert total(table["k_escaper"]) == ESCAPER_POINTS, feedback["k_escaper"]   # sparse
    assert leftovers() == []
    assert (out / "executed" / "k_escaper.ipynb").stat().st_size < 8 << 20


def test_grading_in_parallel_gives_the_same_csv_as_grading_one_at_a_time(graded, tmp_path):
    """The rows that do not depend on a run, graded one at a time, are the batch's (the rows of the runs are
    checked against their fixed expected points in the tests above, so a run re-graded here would add only time)."""
    table, *_ = graded                                  # the batch was graded two at a time
    names = ("d_invalid_json", "e_other_course", "m_wrong_types", "r_vic~tim", "r_vic_tim")
    write_batch(tmp_path / "few", {name: nb for name, nb in batch().items() if name in names})
    assert grade(tmp_path / "few", tmp_path / "serial", 1).returncode == 0
    serial = rows(tmp_path / "serial")
    assert set(serial) == {grade_module.csv_cell(sandbox.printable(name)) for name in names}
    assert serial == {name: table[name] for name in serial}
    assert leftovers() == []


def test_a_file_named_after_another_learners_cleaned_name_takes_nothing_of_theirs(tmp_path):
    """An outside test: "Ana Lopez.ipynb" was written as Ana_Lopez-<hash>.md, and a second learner who named a
    file exactly that had the only feedback and executed notebook of the two (the victim's were gone)."""
    victim = "Ana Lopez"
    attacker = grade_module.safe_name(victim)
    assert attacker != victim and grade_module.safe_name(attacker) != attacker   # "+" is never kept
    names = grade_module.output_names([victim, attacker, "alice", "Alice", "x/y", "x_y"])
    assert len({name.lower() for name in names.values()}) == len(names), names   # apart even where case is not
    grades = [grade_module.Grade(stem, points={name: 0 for name in CRITERIA}, stem=stem, file=names[stem])
              for stem in names]
    grade_module.write_outputs(grades, tmp_path)
    written = {p.read_text().splitlines()[0] for p in (tmp_path / "feedback").glob("*.md")}
    assert written == {f"# Feedback: {stem}" for stem in names}, written


def test_feedback_shows_what_a_run_printed_as_one_line_that_markdown_does_not_act_on():
    """An outside test: a rank's error with line breaks wrote its own bullets and score into the feedback."""
    forged = "Connection closed by peer\n\n- **refusal** (1/1, passed)\n\nAutomatic score: **14 / 14** <img src=x onerror=alert(1)> [x](javascript:alert(1))"
    grade = grade_module.Grade("mallory", points={name: 0 for name in CRITERIA}, reasons={"refusal": forged},
                               notes=[forged])
    lines = grade_module.feedback(grade).splitlines()
    assert sum(line.startswith("Automatic score:") for line in lines) == 1, lines
    assert not any(line.lstrip().startswith("- **refusal** (1/") for line in lines[lines.index("- **refusal** (0/1, not passed): "
                                                                                             + CRITERIA["refusal"][1] + ".") + 1:])
    quoted = [line for line in lines if "Connection closed by peer" in line]
    assert len(quoted) == 2 and all("\\<img" in line and "\\[x\\]" in line and "\\*\\*14 / 14\\*\\*" in line
                                    for line in quoted), quoted


# A step cost table for the speed rule's tests: 10 ms of fixed cost a step and 0.4 ms per image, a 1 ms all-reduce
STEP_COST = {"workers": 2, "compute_seconds": {str(b): 0.010 + 0.0004 * b for b in (64, 128, 256, 512, 1024)},
             "all_reduce": {"alpha_s": 0.0005, "beta_s_per_byte": 0.0, "gradient_bytes": 172_000}}


def test_the_speed_rule_prices_steps_against_the_solutions_with_a_margin(monkeypatch):
    """A right answer 20% slower than the solution passes, one 3 times slower fails; another batch is priced by
    its steps' cost, so that fewer, costlier steps can be faster or slower; full-mode sizes."""
    from assessment import criteria, settings
    for name, value in dict(REFERENCE_EPOCHS=10, SPEED_FACTOR=1.5, GLOBAL_BATCH=512, TRAIN_SIZE=9600, WORKERS=2).items():
        monkeypatch.setattr(settings, name, value)
    monkeypatch.setattr(criteria, "_step_cost", lambda: STEP_COST)
    steps = criteria.steps_to_target(9, 512, 9600, 2)
    assert steps == 10 * 19, steps            # 4800 images per process in batches of 256: 19 steps an epoch
    assert criteria.step_seconds(256) == pytest.approx((0.010 + 0.0004 * 256, 0.001))
    assert criteria.step_seconds(192)[0] == pytest.approx(0.010 + 0.0004 * 192)      # between measured batches
    assert criteria.speed(9, 512)[0] and criteria.speed(11, 512)[0]      # the solution's median; 20% slower
    assert criteria.speed(14, 512)[0] and not criteria.speed(15, 512)[0]  # 1.5x: epoch 15 holds, 16 does not
    fast, said = criteria.speed(29, 512)                                  # 3x slower
    assert not fast and "after 570 optimizer steps of 256 images per process" in said and "needs 190 steps" in said
    limit = 1.5 * 190 * (0.010 + 0.0004 * 256 + 0.001)
    assert f"limit is 1.5x that, {limit:.1f} s" in said, said
    # Half the batch: 38 steps an epoch of 128 images, about 10% dearer per epoch here: epoch 13 holds, 14 does not
    assert criteria.modelled_seconds(38, 128) > criteria.modelled_seconds(19, 256)
    assert criteria.speed(12, 256)[0] and not criteria.speed(13, 256)[0]
    # Four times the batch: 5 steps an epoch of 1024, cheaper per epoch; a run that leaves out each epoch's last
    # smaller batch (drop_last) is charged the 4 steps it took
    assert criteria.modelled_seconds(5, 1024) < criteria.modelled_seconds(19, 256)
    assert criteria.steps_to_target(16, 2048, 9600, 2) == 85 and criteria.steps_to_target(16, 2048, 9600, 2, True) == 68
    assert not criteria.speed(16, 2048)[0] and criteria.speed(16, 2048, drop_last=True)[0]
    assert "after 68 optimizer steps" in criteria.speed(16, 2048, drop_last=True)[1]
    assert criteria.speed(None, 512) == (False, "the run that counts did not hold the target, so it has no time to the target")


def test_the_step_cost_table_is_measured_for_every_batch_a_learner_may_choose():
    """The table the speed rule prices steps with (assessment/step_cost.json): written by its benchmark on a named
    machine, covering the per-process batches of the whole range, its costs growing with the batch."""
    from assessment import criteria, settings
    table = json.loads(criteria.STEP_COST.read_text())
    assert table["machine"] and table["date"] and table["workers"] == settings.WORKERS
    measured = sorted(int(b) for b in table["compute_seconds"])
    assert measured[0] <= 8 * settings.BASE_BATCH // settings.WORKERS and measured[-1] >= 64 * settings.BASE_BATCH // 2
    costs = [sum(criteria.step_seconds(b)) for b in range(measured[0], measured[-1] + 1, 16)]
    assert all(c > 0 for c in costs) and costs[-1] > costs[0]
    assert 0 < criteria.step_seconds(128)[1] < criteria.step_seconds(128)[0]   # on this CNN the all-reduce is the smaller part


def test_the_speed_verdict_is_the_same_on_an_idle_and_a_loaded_machine():
    """The same run judged in a fresh process on an idle machine and again while every core is busy: the verdict and
    its text are the same, to the character (the rule reads no clock)."""
    code = ("import json; from assessment import criteria, settings; "
            "print(json.dumps([criteria.speed(e, b) for e in (settings.REFERENCE_EPOCHS - 1, 2 * settings.REFERENCE_EPOCHS) "
            "for b in (settings.MIN_GLOBAL_BATCH, settings.GLOBAL_BATCH, settings.MAX_GLOBAL_BATCH)]))")
    judged = lambda: subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                    timeout=300, env={**os.environ, "COURSE_QUICK": "0"}).stdout
    idle = judged()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        loaded = judged()
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert idle and idle == loaded
    assert json.loads(idle)[1][0] is True     # the solution's own median passes


def test_the_run_that_counts_is_judged_at_the_global_batch_its_command_line_gave():
    """The grader reads the learner's batch from the command line every rank's probe recorded: one value, the same on
    every rank, in the assessment's range; anything else is refused with a reason, never a crash."""
    from assessment import job, settings
    low, high = settings.MIN_GLOBAL_BATCH, settings.MAX_GLOBAL_BATCH

    def records(*batches):
        return {r: {"rank": str(r), "argv": ["--epochs=3", f"--global-batch={b}", "--seed=7"]} for r, b in enumerate(batches)}
    assert job.counted_global_batch(records(low, low)) == low
    assert job.counted_global_batch(records(high, high)) == high
    refused = {"ranks disagree": records(low, high), "one rank only": records(low),
               "no batch given": {r: {"rank": str(r), "argv": ["--epochs=3"]} for r in range(2)},
               "no command line": {r: {"rank": str(r)} for r in range(2)},
               "not a number": records("5e3", "5e3"), "given twice": {r: {"rank": str(r), "argv": [
                   f"--global-batch={low}", f"--global-batch={high}"]} for r in range(2)},
               "not strings": {r: {"rank": str(r), "argv": [[1], {"a": 2}, 3]} for r in range(2)}}
    for name, case in refused.items():
        with pytest.raises(ValueError, match="--global-batch=N given alike to every process"):
            job.counted_global_batch(case)
    for batch in (low - settings.WORKERS, high + settings.WORKERS, low + 1, 10 ** 30):
        with pytest.raises(ValueError, match=f"from {low} to {high}"):
            job.counted_global_batch(records(batch, batch))
    with pytest.raises(ValueError, match="given alike"):   # digits Python reads but the course does not write
        job.counted_global_batch(records("\uff11\uff12\uff18", "\uff11\uff12\uff18"))
    # The learner's choice: any integer type is a whole number; anything else says what is wanted
    import numpy as np
    assert settings.check_global_batch(np.int64(low)) == low and type(settings.check_global_batch(np.int64(low))) is int
    for wrong in (True, float(low), str(low), None):
        with pytest.raises(ValueError, match="must be an integer"):
            settings.check_global_batch(wrong)


def test_restore_refuses_what_is_not_a_notebook_and_names_missing_cells(tmp_path):
    (tmp_path / "bad.ipynb").write_text("[1, 2]")
    with pytest.raises(SubmissionError, match="not a notebook"):
        restore(tmp_path / "bad.ipynb")
    nb = instructor()
    nb.cells = [c for c in nb.cells if c.id != SCRIPT]
    nbformat.write(nb, tmp_path / "missing.ipynb")
    restored = restore(tmp_path / "missing.ipynb")
    assert any(SCRIPT in note and "stub" in note for note in restored.notes)
    assert "NotImplementedError" in cell(restored.restored, SCRIPT).source
    assert "NotImplementedError" in grade_module.job_script(restored.restored)


def test_the_script_is_the_job_cell_without_its_writefile_line():
    nb = instructor()
    script = grade_module.job_script(nb)
    assert script.startswith('"""The assessment') and "%%writefile" not in script
    compile(script, "train_job.py", "exec")
    cell(nb, SCRIPT).source = "print('no magic line')"
    assert grade_module.job_script(nb) == ""


def test_the_command_line_refuses_a_missing_folder(tmp_path):
    done = subprocess.run([sys.executable, "-m", "assessment.grader.grade", str(tmp_path / "nowhere")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_the_learner_edition_has_no_solution_rubric_or_hidden_test():
    text = "\n".join(c.source for c in learner_notebook(instructor()).cells)
    for words in ("Rubric", "Model answer", "HIDDEN TESTS", "BEGIN SOLUTION", "DistributedSampler(train_set"):
        assert words not in text, f"the learner edition still shows {words!r}"
    assert text.count("YOUR ANSWER HERE") == 3 and text.count("raise NotImplementedError") == 5   # A.1 four, A.2 one


def test_display_updates_count_against_the_output_cap(tmp_path):
    """An outside test kept 45 MB of display updates in an executed notebook whose cap is 2 MB."""
    from assessment import run_notebook
    flood = ("from IPython.display import display\n"
             "handle = display('start', display_id=True)\n"
             "for _ in range(40):\n"
             "    handle.update('u' * 200_000)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(flood)])
    nbformat.write(nb, tmp_path / "in.ipynb")
    assert run_notebook.main([str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), "120"]) == 0
    assert nbformat.read(tmp_path / "out.ipynb", as_version=4).metadata.course_run["dropped_output_bytes"] > 0
    assert (tmp_path / "out.ipynb").stat().st_size < run_notebook.OUTPUT_CAP + (1 << 20)


def test_text_built_to_make_judging_slow_and_huge_records_cost_only_their_own_points(graded):
    """A refusal replaced by an error of three million "[" once held the grader's interpreter lock for hours."""
    table, feedback, *_ = graded
    row, text = table["p_slow_to_judge"], feedback["p_slow_to_judge"]
    assert (int(row["job"]), int(row["refusal"]), int(row["target"]), int(row["speed"])) == (CRITERIA["job"][0], 0, 0, 0), text
    assert "could not be read" in text, text   # the records rewritten after the run: nested too deep, 50 MB
    assert "refused it, but rank 1" in text and "\\[\\[\\[\\[" in text, text   # the text, cut and escaped, reached the feedback
    assert len(text) < 40_000 and "[" * 5000 not in text
    assert total(table["z_after_the_attacks"]) == FULL, feedback["z_after_the_attacks"]


def test_the_executed_notebook_is_the_runs_own_without_active_content(graded):
    """A process left behind kept rewriting executed.ipynb (HTML, JavaScript, trusted) and status.json."""
    table, feedback, out, _ = graded
    executed = out / "executed" / "p_slow_to_judge.ipynb"
    nb = nbformat.read(executed, as_version=4)
    ids = [c.get("id") for c in nb.cells]
    assert SCRIPT in ids and "forged" not in ids and nb.metadata.course_run["cells"], ids
    for path in (out / "executed").glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        kinds = {kind for c in nb.cells for o in c.get("outputs", []) for kind in o.get("data", {})}
        assert kinds <= set(grade_module.SAFE_OUTPUTS), (path.name, kinds)
        assert "trusted" not in json.dumps([c.metadata for c in nb.cells] + [nb.metadata]), path.name


def test_judging_runs_in_a_child_with_its_own_limits(tmp_path):
    """Reading a submission happens in a child process; past its time or memory it stops with a clear reason."""
    from assessment.grader import judging
    nbformat.write(instructor(), tmp_path / "a.ipynb")
    args = (str(tmp_path / "a.ipynb"), str(tmp_path / "run.ipynb"), str(tmp_path / "job.py"))
    assert judging.call("prepare", *args)["refused"] == "" and "DistributedSampler" in (tmp_path / "job.py").read_text()
    with pytest.raises(judging.JudgingError, match=r"judging took longer than 0.5 s"):
        judging.call("prepare", *args, seconds=0.5)
    big = instructor()
    cell(big, SCRIPT).source += "\n# " + "x" * 15_000_000
    nbformat.write(big, tmp_path / "big.ipynb")
    with pytest.raises(judging.JudgingError, match="ran out of its memory limit of 64 MiB"):
        judging.call("prepare", str(tmp_path / "big.ipynb"), *args[1:], memory_bytes=64 << 20)
    assert judging.call("prepare", *args, memory_bytes=64 << 20)["refused"] == ""   # the real one fits


def test_a_submission_that_judging_cannot_finish_gets_a_zero_row_with_the_reason(tmp_path):
    import argparse
    nbformat.write(instructor(), tmp_path / "slow.ipynb")
    options = argparse.Namespace(judge_timeout=0.5)
    row = grade_module.grade_one(tmp_path / "slow.ipynb", tmp_path / "out", options)
    assert sum(row.points.values()) == 0 and not row.failed
    assert all("judging took longer than 0.5 s" in why for why in row.reasons.values()), row.reasons


def test_the_executed_notebook_given_to_the_instructor_runs_nothing_in_any_viewer():
    """An outside review: nbconvert's HTML export turned an image's width and a Markdown answer into script."""
    from nbconvert import HTMLExporter
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("My answer <img src=x onerror=alert(2)>", metadata={"jupyter": {"source_hidden": True}}),
        nbformat.v4.new_code_cell("x", metadata={"trusted": True, "course": {"answer": True}}, outputs=[
            nbformat.v4.new_output("display_data", {"image/png": "AAAA", "text/html": "<script>alert(1)</script>",
                                                     "application/javascript": "alert(1)", "image/svg+xml": "<svg/>"},
                                   metadata={"image/png": {"width": "1 onerror=alert(document.domain)", "height": 20}}),
            nbformat.v4.new_output("display_data", {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}),
            nbformat.v4.new_output("stream", name="stdout", text="kept\n")])],
        metadata={"widgets": {"state": {}}, "trusted": True})
    clean = grade_module.inert(nb)
    html = HTMLExporter().from_notebook_node(clean)[0]
    import re
    handlers = re.findall(r"<[a-zA-Z][^>]*\son[a-z]+=[^>]*>", html)    # an element with an event handler
    assert not handlers and "alert(1)" not in html and "<svg" not in html, handlers[:3]
    assert "My answer &lt;img" in html   # the answer's text is shown, as text
    code = clean.cells[1]
    assert [list(o.get("data", {})) for o in code.outputs] == [["image/png"], []]
    assert code.outputs[0].metadata == {"image/png": {"height": 20}} and code.metadata == {"course": {"answer": True}}
    assert clean.cells[0].metadata == {} and "widgets" not in clean.metadata and "trusted" not in clean.metadata


def test_the_run_that_counts_gets_the_graders_seed(tmp_path, monkeypatch):
    """The seed reaches the notebook's environment and the judgement of the run's records, and the feedback names it:
    one drawn for each submission by default, the one given with --counted-seed otherwise."""
    import argparse
    from assessment import settings
    from assessment.grader import judging
    given, judged = [], []
    monkeypatch.setattr(sandbox, "run", lambda command, work, keep, out, limits, env, *rest:
                        given.append(env.get(settings.SEED_VARIABLE)) or sandbox.Result(0, False, 1.0, "none"))
    monkeypatch.setattr(judging, "call", lambda step, *args, **kw: {"refused": "", "notes": []} if step == "prepare" else
                        judged.append(args[2]) or {"ran": True, "run_problem": "", "notes": [], "verdicts": {},
                                                   "target": [False, "no checkpoint"], "speed": [False, "no target"]})
    rows = []
    for seed in (None, None, 12345):
        options = argparse.Namespace(judge_timeout=5, quick=True, course=str(ROOT), course_dir=None, mode="none",
                                     cell_timeout=60, notebook_timeout=60, job_timeout=60, counted_seed=seed)
        rows.append(grade_module.grade_one(ROOT / "assessment" / "assessment.ipynb", tmp_path, options))
    seeds = [g for g in given if g is not None]
    assert len(seeds) == 3 and seeds[2] == "12345" and [int(s) for s in seeds] == judged, (given, judged)
    assert seeds[0] != seeds[1], "two submissions got the same drawn seed (1 chance in 2**31)"
    assert all(f"ran at seed {s}, " in " ".join(row.notes) for row, s in zip(rows, seeds))
    counted = [next(note for note in row.notes if note.startswith("the run that counts ran at seed")) for row in rows]
    assert ["drawn for this submission" in note for note in counted] == [True, True, False], counted
    # the tiny job's seed is drawn every time, and named so that a job check's failure can be re-run
    assert all(any(note.startswith("the checks of your script on the tiny problem ran at seed") for note in row.notes)
               for row in rows)


def test_a_replay_that_differs_is_flagged_in_the_feedback_and_the_table_and_costs_no_points(tmp_path, monkeypatch):
    """The replay's verdict (tests/test_assessment_job.py runs it on real runs) reaches the instructor: a run whose
    epochs do not replay to its checkpoints, or that could not be replayed in time, is flagged with the evidence,
    in grades.csv's flags column and in the feedback; its points stand."""
    import argparse
    import csv

    from assessment.criteria import CRITERIA
    from assessment.grader import grade as grade_module, judging, sandbox
    monkeypatch.setattr(sandbox, "run", lambda *args, **kw: sandbox.Result(0, False, 1.0, "none"))
    answers = iter([{"flag": "checkpoint epoch_01.pt is not what its epoch's recorded steps give: 0.7 away"},
                    judging.JudgingError("judging took longer than 900 s and was stopped (replay)")])

    def call(step, *args, **kw):
        if step == "prepare":
            return {"refused": "", "notes": []}
        if step == "judge":
            return {"ran": True, "run_problem": "", "notes": [], "verdicts": {}, "target": [True, "held"],
                    "speed": [True, "fast"]}
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(judging, "call", call)
    options = argparse.Namespace(judge_timeout=5, quick=True, course=str(ROOT), course_dir=None, mode="none",
                                 cell_timeout=60, notebook_timeout=60, job_timeout=60, counted_seed=None, replay_timeout=900)
    rows = [grade_module.grade_one(ROOT / "assessment" / "assessment.ipynb", tmp_path, options, file=f"s{i}")
            for i in range(2)]
    assert [row.points["target"] for row in rows] == [CRITERIA["target"][0]] * 2, rows
    grade_module.write_outputs(rows, tmp_path)
    with open(tmp_path / "grades.csv") as f:
        flags = [row["flags"] for row in csv.DictReader(f)]
    assert "epoch_01.pt is not what its epoch's recorded steps give" in flags[0], flags
    assert "could not be replayed: judging took longer than 900 s" in flags[1], flags
    text = (tmp_path / "feedback" / "s0.md").read_text()
    assert "Flagged for your instructor (no points changed):" in text and "recorded steps give" in text, text


def _options(**more):
    import argparse
    return argparse.Namespace(judge_timeout=5, quick=True, course=str(ROOT), course_dir=None, mode="none", cell_timeout=60,
                              notebook_timeout=60, job_timeout=60, counted_seed=None, replay_timeout=900, **more)


def _returning_every_file(command, work, keep, out, *rest, **kw):
    """A sandbox run that returns each file it was asked to keep (here: empty ones)."""
    for name in keep:
        (Path(out) / Path(name).name).parent.mkdir(parents=True, exist_ok=True)
        (Path(out) / Path(name).name).write_bytes(b"")
    return sandbox.Result(0, False, 1.0, "none")


@pytest.mark.parametrize("returned", ["every checkpoint and record", "nothing"])
def test_the_replay_runs_beside_the_job_and_the_judging(tmp_path, monkeypatch, returned):
    """The replay needs only what the notebook returned: where the run left every checkpoint and record, it starts
    before the judging ends (the judging here waits for it); where it did not, it runs after the judging, only if
    the run is accepted. Its answer is read either way."""
    import threading

    from assessment.grader import judging
    monkeypatch.setattr(sandbox, "run", _returning_every_file if returned != "nothing" else
                        lambda *args, **kw: sandbox.Result(0, False, 1.0, "none"))
    started, order = threading.Event(), []

    def call(step, *args, cancel=None, **kw):
        if step == "prepare":
            return {"refused": "", "notes": []}
        if step == "replay":
            order.append("replay")
            started.set()
            return {"flag": "replayed"}
        started.wait(30 if returned != "nothing" else 0.5)
        order.append("judge")
        return {"ran": True, "run_problem": "", "notes": [], "verdicts": {}, "target": [True, "held"],
                "speed": [True, "fast"]}
    monkeypatch.setattr(judging, "call", call)
    row = grade_module.grade_one(ROOT / "assessment" / "assessment.ipynb", tmp_path, _options())
    assert row.flags == ["replayed"], (row.flags, row.reasons)
    assert order == (["replay", "judge"] if returned != "nothing" else ["judge", "replay"]), order


def test_a_run_not_accepted_has_its_replay_stopped_unread(tmp_path, monkeypatch):
    import threading

    from assessment.grader import judging
    stopped = threading.Event()

    def call(step, *args, cancel=None, **kw):
        if step == "prepare":
            return {"refused": "", "notes": []}
        if step == "replay":
            assert cancel.wait(60), "the replay was never stopped"
            stopped.set()
            raise judging.Cancelled(step)
        return {"ran": True, "run_problem": "", "notes": [], "verdicts": {}, "target": [False, "never held"],
                "speed": [False, "no target"]}
    monkeypatch.setattr(judging, "call", call)
    monkeypatch.setattr(sandbox, "run", _returning_every_file)
    row = grade_module.grade_one(ROOT / "assessment" / "assessment.ipynb", tmp_path, _options())
    assert stopped.is_set() and row.flags == [] and row.points["target"] == 0 and not row.failed, row


def test_a_judging_step_no_longer_wanted_is_stopped_with_its_child(tmp_path):
    """Cancelling a step kills its child within a second or so (here during the child's start: the replay imports
    torch first), and leaves no process behind."""
    import threading
    import time

    from assessment.grader import judging

    def children():
        found = set()
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and b"judging import _child" in open(f"/proc/{entry}/cmdline", "rb").read():
                    found.add(entry)
            except OSError:
                continue
        return found
    before, cancel = children(), threading.Event()
    threading.Timer(0.5, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(judging.Cancelled):
        judging.call("replay", str(tmp_path), 0, cancel=cancel)
    assert time.monotonic() - start < 30 and children() <= before
    with pytest.raises(judging.Cancelled):      # already cancelled: no child is started at all
        judging.call("prepare", str(tmp_path / "x.ipynb"), "a", "b", cancel=cancel)

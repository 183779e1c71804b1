"""The grader on a whole class: good, half-done, broken and hostile submissions, graded in one batch.

One batch of submissions is graded once (two at a time, quick mode) and every test reads its CSV,
feedback and the machine's process table. Each hostile submission is the instructor's solution
plus attacks, so the points it keeps show that the attacks neither helped it nor harmed the rest
(except where the attack replaces the grader's functions: that fails every probed criterion). The
escaper tries every way out of the sandbox an outside test found in the earlier grader and prints
ESCAPED for each that works; the thief looks everywhere for the instructor edition.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import nbformat
import pytest

from assessment import grade as grade_module
from assessment import sandbox
from assessment.criteria import CRITERIA
from assessment.submission import INSTRUCTOR, SubmissionError, restore
from utils.release import learner_notebook

ROOT = INSTRUCTOR.parent.parent
FULL = sum(points for points, _ in CRITERIA.values())
GRADER_ARGS = ["--quick", "--cell-timeout", "60", "--notebook-timeout", "600", "--probe-timeout", "120"]
pytestmark = pytest.mark.timeout(3600)  # the batch is graded once, in the first test's set-up


def instructor():
    return nbformat.read(INSTRUCTOR, as_version=4)


def cell(nb, cell_id):
    return next(c for c in nb.cells if c.id == cell_id)


def edited(changes: dict[str, str], base=None):
    """The instructor's notebook (or ``base``) with the sources of some cells replaced."""
    nb = base or instructor()
    for cell_id, source in changes.items():
        cell(nb, cell_id).source = textwrap.dedent(source).strip("\n")
    return nb


def appended(cell_id: str, code: str, base=None):
    """The solution with ``code`` added at the end of one of the learner's cells."""
    nb = base or instructor()
    cell(nb, cell_id).source += "\n\n" + textwrap.dedent(code).strip("\n")
    return nb


def half_solved():
    """Only make_train_loader (2 points) and global_mean (1 point) solved."""
    learner, solution = learner_notebook(instructor()), instructor()
    for cell_id in ("asmt-08", "asmt-14"):
        cell(learner, cell_id).source = cell(solution, cell_id).source
    return learner


def tampered():
    """Given cells deleted (two checks), moved and edited (the run that counts at a small batch)."""
    nb = instructor()
    nb.cells = [c for c in nb.cells if c.id not in ("asmt-09", "asmt-12")]
    nb.cells.insert(1, nb.cells.pop(5))
    cell(nb, "asmt-20").source = "%%px\nhistory = train(settings.EPOCHS * 3, settings.BASE_BATCH, settings.CHECKPOINT_DIR)"
    return nb


CHEATER = """
%%px
# Reports success without earning it, and tries to reach what it must not.
import glob, json, os
json.dump({"accuracy": 0.99}, open("metrics.json", "w"))
open("grades.csv", "w").write("submission,total\\ncheater,999\\n")
criteria.rank_job = lambda *args: {}
criteria.check_on_engines = lambda *a, **k: print("passed")
try:
    from assessment import verdicts        # the judges: not in the sandbox
    verdicts.judge = lambda *args: None
except ImportError:
    pass
try:
    open(os.path.join(os.path.dirname(criteria.__file__), "grade.py"), "a").write("\\n# edited")
except OSError:
    pass
seen = {p: open(f"/proc/{p}/environ", "rb").read() for p in os.listdir("/proc") if p.isdigit()
        and os.access(f"/proc/{p}/environ", os.R_OK)}

def train(epochs, global_batch, checkpoint_dir):      # no training: fake checkpoints and fake logs
    if rank == 0:
        os.makedirs(checkpoint_dir, exist_ok=True)
        for epoch in range(1, epochs + 1):
            torch.save({"weight": torch.zeros(3)}, os.path.join(checkpoint_dir, settings.checkpoint_name(epoch)))
        print("epoch 3  train loss 0.001  test accuracy 0.990")
    return [{"epoch": 3, "train_loss": 0.001, "test_accuracy": 0.99, "seconds": 0.1}]
"""

LEAVER = """
%%px
# Leaves processes behind: a daemon in its own session, and a second cluster never stopped.
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(987)"], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if rank == 0:
    import ipyparallel
    ipyparallel.Cluster(n=1, cluster_id="left-behind", log_level=40).start_cluster_sync()
"""

FLOODER = """
%%px
# Prints a flood and fills the disk, then cleans up its files and carries on.
if rank == 0:
    for _ in range(12):
        print("y" * 1_000_000)
    import os
    written = 0
    try:
        while True:
            with open(f"fill{written}.bin", "wb") as f:
                f.write(b"z" * (16 << 20))
            written += 1
    except OSError:
        pass
    for i in range(written + 1):
        if os.path.exists(f"fill{i}.bin"):
            os.remove(f"fill{i}.bin")
"""


HOST_MARKER = f"/tmp/course-grader-test-marker-{os.getpid()}"

ESCAPER = """
%%px --local
# Runs in the kernel and on every engine: tries every way out, prints ESCAPED for each that works.
import glob, os, site, subprocess
def _escaped(what):
    print(f"ESCAPED: {what}")
if os.getuid() == 0 or os.geteuid() == 0:
    _escaped("runs as root")
if subprocess.run(["mount", "-o", "remount,rw", "/course"], capture_output=True).returncode == 0:
    _escaped("remounted the course read-write")
for _target in [criteria.__file__, *(os.path.join(p, "course-evil.pth") for p in site.getsitepackages())]:
    try:
        open(_target, "a").write("\\n")
        _escaped(f"wrote {_target}")
    except OSError:
        pass
if glob.glob("HOST_MARKER*"):
    _escaped("sees the host's /tmp")
for _top in ("/", "/root", "/home", "/srv", "/work", "/run", "/var", "/mnt", "/opt"):
    for _dir, _subdirs, _files in os.walk(_top):
        if _dir.startswith(("/proc", "/sys", "/usr", "/dev")) or "site-packages" in _dir:
            _subdirs[:] = []
            continue
        for _name in _files:
            _path = os.path.join(_dir, _name)
            if _name.endswith(".ipynb") and not _path.startswith(("/course/", os.getcwd())):
                _escaped(f"sees another notebook {_path}")
            if _name == "grades.csv" or (_name.startswith("kernel-") and _name.endswith(".json")
                                         and not _path.startswith(os.getcwd())):
                _escaped(f"sees {_path}")
            if (_name.endswith(".ipynb") and not _path.startswith(os.getcwd())
                    and "BEGIN SOLUTION" in open(_path, errors="replace").read()):
                _escaped(f"found the instructor edition at {_path}")
# A flood of display updates (each replaces the output shown under one display id).
from IPython.display import display
_handle = display("start", display_id=True)
for _ in range(40 if _handle is not None else 0):   # None outside IPython (in the grader's probes)
    _handle.update("u" * 200_000)
# The model file the run saves is swapped for sparse tensors after the run that counts.
_train = train
def train(epochs, global_batch, checkpoint_dir):
    history = _train(epochs, global_batch, checkpoint_dir)
    if globals().get("rank", 0) == 0 and checkpoint_dir == settings.CHECKPOINT_DIR:
        import glob
        for path in glob.glob(f"{checkpoint_dir}/*.pt"):
            torch.save({k: v.to_sparse() for k, v in torch.load(path).items()}, path)
    return history
""".replace("HOST_MARKER", HOST_MARKER)

THIEF = """
# Looks for the instructor edition anywhere it can read and runs its solution of this cell.
import json, os
def _notebooks():
    for top, dirs, files in os.walk("/"):
        if top.startswith(("/proc", "/sys", "/dev", "/usr")) or "site-packages" in top:
            dirs[:] = []
            continue
        yield from (os.path.join(top, f) for f in files if f.endswith(".ipynb"))
def _solutions():
    for path in _notebooks():
        try:
            cells = json.load(open(path))["cells"]
        except (OSError, ValueError, KeyError):
            continue
        for c in cells:
            text = "".join(c["source"])
            if "BEGIN SOLUTION" in text and c["cell_type"] == "code":
                yield text.replace("%%px", "")
for _code in _solutions():
    exec(_code)
"""


# Found by an outside test. A cell without %%px ran in the notebook's kernel, where the given baseline
# lives, and saved its model; the grader now runs every learner cell where the course's cell runs.
BASELINE_IN_THE_KERNEL = """
import os
model, _ = train_one_process(settings.EPOCHS, settings.BASE_BATCH, settings.BASE_LR)
os.makedirs(settings.CHECKPOINT_DIR, exist_ok=True)
for epoch in range(1, settings.EPOCHS + 1):
    torch.save(model.state_dict(), os.path.join(settings.CHECKPOINT_DIR, settings.checkpoint_name(epoch)))
"""
# A lone surrogate in an error, and a status file planted read-only: each once ended the batch.
SURROGATE = "%%px\nraise ValueError('\\ud800')"
PLANTER = """%%px
import json, os
if rank == 0:
    json.dump({"completed": True, "cell_errors": [{"cell": "x", "message": "\\ud800 \\x1b[2J"}]}, open("status.json", "w"))
    os.chmod("status.json", 0o444)
"""


def batch() -> dict:
    learner = learner_notebook(instructor())
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('another course')")])
    return {
        "a_instructor": instructor(),
        "b_learner": learner,
        "c_half": half_solved(),
        "d_invalid_json": '{"cells": [ this is not json',
        "e_other_course": other,
        "f_tampered": tampered(),
        "g_infinite_loop": appended("asmt-17", "def train(epochs, global_batch, checkpoint_dir):\n    while True:\n        pass"),
        # sys.exit on the engines (and in the probe's ranks), then os._exit on the engines
        "h_exits": edited({"asmt-14": "import os\nos._exit(3)"}, appended("asmt-11", "import sys\nsys.exit(2)")),
        "i_cheater": appended("asmt-17", CHEATER.replace("%%px\n", "", 1)),
        "j_leaver_flooder": appended("asmt-14", FLOODER.replace("%%px\n", "", 1),
                                     appended("asmt-17", LEAVER.replace("%%px\n", "", 1))),
        "k_escaper": _escaper(),
        "l_thief": edited({"asmt-08": "%%px\n" + THIEF, "asmt-11": PLANTER, "asmt-14": SURROGATE,
                           "asmt-17": BASELINE_IN_THE_KERNEL}, learner_notebook(instructor())),
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


def _escaper():
    nb = instructor()
    source = cell(nb, "asmt-17").source.replace("%%px\n", "", 1)
    # The escaper's own lines come first; the solution's train() is defined after them, so wrap it last.
    head, wrap = ESCAPER.strip("\n").split("# The model file the run saves", 1)
    cell(nb, "asmt-17").source = head + "\n" + source + "\n\n# The model file the run saves" + wrap
    return nb


def write_batch(folder, submissions: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, nb in submissions.items():
        path = folder / f"{name}.ipynb"
        if isinstance(nb, str):
            path.write_text(nb)
        else:
            nbformat.write(nb, path)


def grade(folder, out, jobs: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "assessment.grade", str(folder), "--out", str(out),
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
    assert header == ["submission", *CRITERIA, "total", "max_total", "q1", "q2", "q3", "grader_error"]
    assert all(int(row["max_total"]) == FULL and row["q1"] == row["q2"] == row["q3"] == "" for row in table.values())
    assert len(feedback) == len(table), "two submissions' feedback went to one file"
    assert f"graded {len(batch())}:" in done.stderr and "failed to run" in done.stderr
    assert "isolation: bwrap" in done.stderr and "whole-submission caps" in done.stderr


def test_the_instructor_edition_scores_full_marks(graded):
    table, feedback, *_ = graded
    assert total(table["a_instructor"]) == FULL, feedback["a_instructor"]


def test_the_learner_edition_scores_zero_and_says_why(graded):
    table, feedback, *_ = graded
    assert total(table["b_learner"]) == 0
    text = feedback["b_learner"]
    for name in ("sharding", "ddp_step", "metrics", "training_job"):
        assert f"**{name}** (0/" in text
    assert "NotImplementedError" in text and "saved no checkpoint" in text


def test_a_half_solved_notebook_gets_exactly_the_points_it_earned(graded):
    table, feedback, *_ = graded
    row = table["c_half"]
    assert (int(row["sharding"]), int(row["metrics"]), int(row["ddp_step"]), int(row["training_job"]),
            int(row["target"])) == (2, 1, 0, 0, 0), feedback["c_half"]


@pytest.mark.parametrize("name, words", [("d_invalid_json", "not valid JSON"),
                                         ("e_other_course", "not this course's assessment")])
def test_files_that_are_not_the_assessment_score_zero_with_the_reason(graded, name, words):
    table, feedback, *_ = graded
    assert total(table[name]) == 0 and words in feedback[name]


def test_deleted_moved_and_edited_given_cells_are_restored(graded):
    table, feedback, *_ = graded
    assert total(table["f_tampered"]) == FULL, feedback["f_tampered"]
    for words in ("deleted: restored", "edited: restored", "moved"):
        assert words in feedback["f_tampered"]


def test_an_infinite_loop_costs_only_what_it_blocks(graded):
    table, feedback, *_ = graded
    row = table["g_infinite_loop"]
    assert int(row["training_job"]) == 0 and int(row["target"]) == 0
    assert int(row["sharding"]) + int(row["ddp_step"]) + int(row["metrics"]) == 5, feedback["g_infinite_loop"]
    assert "60 s" in feedback["g_infinite_loop"]


def test_sys_exit_and_engines_killed_by_os_exit_are_graded_with_the_reasons(graded):
    # A learner's cell runs on the engines (never in the notebook's kernel): os._exit ends the engines.
    table, feedback, *_ = graded
    assert total(table["h_exits"]) == 0
    text = feedback["h_exits"]
    assert "SystemExit" in text and "NoEnginesRegistered" in text


def test_fake_results_patched_checks_and_a_fake_model_earn_nothing(graded):
    table, feedback, out, _ = graded
    row = table["i_cheater"]
    # It replaced two of the grader's functions: every probed criterion fails, and says why.
    assert total(row) == 0, feedback["i_cheater"]
    assert "your code replaced" in feedback["i_cheater"]
    assert "assessment.criteria.rank_job" in feedback["i_cheater"]
    assert "assessment.criteria.check_on_engines" in feedback["i_cheater"]
    assert "every checkpoint in checkpoints/ was refused" in feedback["i_cheater"]
    assert not (out / "metrics.json").exists()
    assert "# edited" not in (ROOT / "assessment" / "grade.py").read_text()


def test_no_way_out_of_the_sandbox_works_and_the_attacks_cost_only_the_attacker(graded):
    table, feedback, out, _ = graded
    executed = out / "executed" / "k_escaper.ipynb"
    outputs = json.dumps([c.get("outputs", []) for c in nbformat.read(executed, as_version=4).cells])
    assert "ESCAPED" not in outputs, [line for line in outputs.split("\\n") if "ESCAPED" in line][:5]
    assert "your code raised" not in feedback["k_escaper"], feedback["k_escaper"]  # every attack ran to its end
    assert executed.stat().st_size < 4 << 20, "display updates went past the output cap"
    row = table["k_escaper"]
    assert total(row) == FULL - CRITERIA["target"][0], feedback["k_escaper"]
    assert "sparse" in feedback["k_escaper"]
    assert not list(sandbox.Path(sys.prefix).glob("lib/python*/site-packages/course-evil.pth"))
    assert total(table["z_after_the_attacks"]) == FULL, feedback["z_after_the_attacks"]


def test_the_instructor_edition_is_nowhere_a_submission_can_read(graded):
    table, feedback, *_ = graded
    assert total(table["l_thief"]) == 0, feedback["l_thief"]


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


def test_the_thiefs_and_breakers_notebook_scores_zero_and_breaks_nothing(graded):
    table, feedback, *_ = graded
    text = feedback["l_thief"]
    assert total(table["l_thief"]) == 0, text
    assert "\x1b" not in text and "\ud800" not in text
    assert "saved no checkpoint" in text, text   # the kernel's baseline was out of reach of the learner's cell


def test_left_processes_a_flood_of_output_and_a_full_disk_do_not_reach_the_grader(graded):
    table, feedback, out, _ = graded
    assert total(table["j_leaver_flooder"]) == FULL, feedback["j_leaver_flooder"]
    assert leftovers() == []
    assert (out / "executed" / "j_leaver_flooder.ipynb").stat().st_size < 8 << 20


def test_grading_in_parallel_gives_the_same_csv_as_grading_one_at_a_time(graded, tmp_path):
    table, *_ = graded                                  # the batch was graded two at a time
    names = ("a_instructor", "c_half", "h_exits")       # full marks, some points, none
    write_batch(tmp_path / "few", {name: nb for name, nb in batch().items() if name in names})
    assert grade(tmp_path / "few", tmp_path / "serial", 1).returncode == 0
    serial = rows(tmp_path / "serial")
    assert {name: serial[name] for name in names} == {name: table[name] for name in names}
    assert [total(serial[name]) for name in names] == [FULL, 3, 0]
    assert leftovers() == []


def test_the_gpu_time_budget_is_the_graders_own_timing_against_the_solutions_run(monkeypatch):
    """Only where every worker has a GPU; both times taken by the grader outside the sandbox."""
    import argparse

    import torch

    from assessment import settings
    options = argparse.Namespace(reference_seconds=lambda: 100.0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: settings.WORKERS)
    assert grade_module._over_time_budget(100.0 * settings.TIME_FACTOR, options) is None
    assert "took 250.0 s" in grade_module._over_time_budget(250.0, options)
    monkeypatch.setattr(grade_module, "_instructor_seconds", lambda options: None)  # no GPU per worker: no budget
    options = argparse.Namespace(reference_seconds=lambda: grade_module._instructor_seconds(options))
    assert grade_module._over_time_budget(1e6, options) is None


def test_restore_refuses_what_is_not_a_notebook_and_names_missing_cells(tmp_path):
    (tmp_path / "bad.ipynb").write_text("[1, 2]")
    with pytest.raises(SubmissionError, match="not a notebook"):
        restore(tmp_path / "bad.ipynb")
    nb = instructor()
    nb.cells = [c for c in nb.cells if c.id != "asmt-14"]
    nbformat.write(nb, tmp_path / "missing.ipynb")
    restored = restore(tmp_path / "missing.ipynb")
    assert any("asmt-14" in note and "stub" in note for note in restored.notes)
    assert "NotImplementedError" in cell(restored.restored, "asmt-14").source


def test_the_command_line_refuses_a_missing_folder(tmp_path):
    done = subprocess.run([sys.executable, "-m", "assessment.grade", str(tmp_path / "nowhere")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_the_learner_edition_has_no_solution_rubric_or_hidden_test():
    text = "\n".join(c.source for c in learner_notebook(instructor()).cells)
    for words in ("Rubric", "Model answer", "HIDDEN TESTS", "BEGIN SOLUTION", "DistributedSampler(train_set"):
        assert words not in text, f"the learner edition still shows {words!r}"
    assert text.count("YOUR ANSWER HERE") == 3 and text.count("raise NotImplementedError") == 6


def test_display_updates_count_against_the_output_cap(tmp_path):
    """An outside test kept 45 MB of display updates in an executed notebook whose cap is 2 MB."""
    from assessment import run_notebook
    flood = ("from IPython.display import display\n"
             "handle = display('start', display_id=True)\n"
             "for _ in range(40):\n"
             "    handle.update('u' * 200_000)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(flood)])
    nbformat.write(nb, tmp_path / "in.ipynb")
    run_notebook.main([str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), str(tmp_path / "status.json"), "120"])
    assert json.loads((tmp_path / "status.json").read_text())["dropped_output_bytes"] > 0
    assert (tmp_path / "out.ipynb").stat().st_size < run_notebook.OUTPUT_CAP + (1 << 20)

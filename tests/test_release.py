"""The learner edition: solutions stubbed, hidden tests gone, every check failing helpfully."""
from __future__ import annotations

import nbformat
import pytest

from notebook_runner import ROOT, exercise_cells, run_notebook
from tooling import release
from verdict_rules import contradictions

NOTEBOOKS = release.source_notebooks()
ids = [p.name for p in NOTEBOOKS]


def test_solution_becomes_stub_with_hint_and_indentation():
    source = ("def f(x):\n    # Hint: square it\n    ### BEGIN SOLUTION\n    y = x * x\n    return y\n"
              "    ### END SOLUTION\n\nprint(f)")
    learner = release.learner_source(source)
    assert learner == "def f(x):\n    raise NotImplementedError('Hint: square it')\n\nprint(f)"


@pytest.mark.parametrize("hint", [
    "the four calls of a step are named in the text above; which must come first, and why does "
    "the order of the other three matter for what the optimizer reads? (torch.optim.Optimizer)",
    # both kinds of quote: repr escapes one of them, and the escapes count towards the width
    "the model's \"own memory\" is what the 'average' must be written back into; which of MPI's calls "
    "writes its result over its input's buffer, and how does mpi4py's \"buffer\" reach a tensor's 'data'?",
], ids=["plain", "both-quotes"])
def test_a_long_hint_is_wrapped_to_the_notebooks_width_and_says_the_same(hint):
    source = f"def step(model):\n    # Hint: {hint}\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n"
    learner = release.learner_source(source)
    assert max(len(line) for line in learner.splitlines()) <= release.STUB_WIDTH, learner
    namespace = {}
    exec(learner, namespace)
    with pytest.raises(NotImplementedError) as raised:
        namespace["step"](None)
    assert str(raised.value) == f"Hint: {hint}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_stub_fits_the_notebooks_width(path):
    learner = release.learner_notebook(nbformat.read(path, as_version=4))
    for cell in learner.cells:
        lines = cell.source.splitlines()
        for start, line in enumerate(lines):
            if "raise NotImplementedError(" in line:
                stub = lines[start:start + 1 + next(i for i, rest in enumerate(lines[start:]) if rest.rstrip().endswith(")"))]
                assert max(map(len, stub)) <= release.STUB_WIDTH, "\n".join(stub)


def test_workspace_readme_lists_every_notebook_and_is_never_overwritten(tmp_path):
    readme = release.write_workspace_index(tmp_path)
    text = readme.read_text()
    for path in NOTEBOOKS:
        name = str(path.relative_to(ROOT))
        assert f"[{name}]({name})" in text
    readme.write_text("my notes")
    assert release.write_workspace_index(tmp_path) is None and readme.read_text() == "my notes"


def test_stub_without_hint_and_hidden_tests_vanish():
    source = ("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\nassert answer\n"
              "### BEGIN HIDDEN TESTS\nassert answer == 42\n### END HIDDEN TESTS\n")
    learner = release.learner_source(source)
    assert "42" not in learner and "HIDDEN" not in learner
    assert "raise NotImplementedError('write your solution here')" in learner
    assert "assert answer" in learner


def test_markdown_solution_becomes_placeholder():
    learner = release.learner_source("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "markdown")
    assert learner == "Why?\nYOUR ANSWER HERE"


@pytest.mark.parametrize("source", ["### BEGIN SOLUTION\nx = 1\n", "x = 1\n### END SOLUTION\n",
                                    "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n"])
def test_unbalanced_markers_are_an_error(source):
    with pytest.raises(release.ReleaseError, match="line"):
        release.learner_source(source)


def _blocks(source: str) -> tuple[list[str], list[str]]:
    """(lines inside solution/hidden blocks, lines outside them)."""
    inside, outside, depth = [], [], False
    for line in source.split("\n"):
        if line.strip().startswith(("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS")):
            depth = True
        elif line.strip().startswith(("### END SOLUTION", "### END HIDDEN TESTS")):
            depth = False
        else:
            (inside if depth else outside).append(line)
    return inside, outside


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_no_solution_line_survives(path, tmp_path):
    release.write_release(tmp_path / "release")
    learner = nbformat.read(tmp_path / "release" / path.relative_to(ROOT), as_version=4)
    instructor = nbformat.read(path, as_version=4)
    assert len(learner.cells) == len(instructor.cells)
    for index, (mine, theirs) in enumerate(zip(instructor.cells, learner.cells)):
        assert "### BEGIN" not in theirs.source and "### END" not in theirs.source
        inside, outside = _blocks(mine.source)
        kept = set(theirs.source.split("\n"))
        leaked = [line for line in inside if line.strip() and line in kept and line not in outside]
        assert not leaked, f"{path.name} cell {index}: solution lines survive in the learner edition: {leaked}"
        if theirs.cell_type == "code":
            assert theirs.outputs == [] and theirs.execution_count is None


@pytest.mark.slow   # runs notebooks: left out of make test-fast, unlike the edition and bundle rules here
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name == "labs"], ids=lambda p: p.name)
def test_learner_edition_stops_at_first_exercise_and_every_check_fails_helpfully(path, tmp_path):
    learner_path = tmp_path / "learner" / path.name
    learner_path.parent.mkdir()
    learner = release.learner_notebook(nbformat.read(path, as_version=4))
    pairs = exercise_cells(nbformat.read(path, as_version=4))
    # Only the checks are judged here: the lab's set-up (every cell before its first exercise), each exercise and
    # its check, and the final cell that stops the lab's cluster. The given experiments between the checks are left
    # out: they run, and their printed verdicts are judged, in the instructor edition's test (test_notebooks), and
    # here they would only run on the stubs' errors. A check that needed one of them fails below (not NotSolved).
    kept = set(range(pairs[0][0])) | {i for pair in pairs for i in pair}
    kept |= {len(learner.cells) - 1} if "cluster.stop()" in learner.cells[-1].source else set()
    learner.cells = [c for i, c in enumerate(learner.cells) if i in kept]
    position = {old: new for new, old in enumerate(sorted(kept))}
    pairs = [(position[exercise], position[check]) for exercise, check in pairs]
    nbformat.write(learner, learner_path)
    record = tmp_path / "verdicts.jsonl"
    result, nb = run_notebook(learner_path, tmp_path / "out", allow_errors=True, env={"COURSE_VERDICTS": str(record)})
    assert nb is not None, result.stderr
    wrong = contradictions(record)    # what the set-up cells printed, on this machine's cores
    assert not wrong, f"{path.name}'s learner edition:\n" + "\n".join(wrong)
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert errors, f"{path.name}: the learner edition ran without a single failing check"
    first_cell, first_error = errors[0]
    assert first_cell == pairs[0][1], (f"{path.name}: the learner edition first fails in cell {first_cell} "
                                       f"({first_error.ename}: {first_error.evalue}), not at the first check "
                                       f"(cell {pairs[0][1]})")
    for exercise, check in pairs:
        outputs = [o for o in nb.cells[check].outputs if o.output_type == "error"]
        assert outputs, f"{path.name}: the check in cell {check} passed although exercise {exercise} is a stub"
        assert outputs[0].ename == "NotSolved", f"{path.name} cell {check}: {outputs[0].ename}: {outputs[0].evalue}"
        assert "not solved yet" in outputs[0].evalue and "Hint:" in outputs[0].evalue
        # The learner sees the message, not a traceback from inside the course library.
        assert not any("site-packages" in line or "utils/checks" in line for line in outputs[0].traceback)


def test_workspace_is_filled_once_and_never_overwritten(tmp_path):
    added, kept = release.fill_workspace(tmp_path)
    assert {p.relative_to(tmp_path) for p in added} == {p.relative_to(ROOT) for p in NOTEBOOKS}
    assert not kept
    mine = added[0]
    mine.write_text("my own work")
    other = added[-1]
    other.unlink()
    added_again, kept_again = release.fill_workspace(tmp_path)
    assert mine.read_text() == "my own work"
    assert added_again == [other] and mine in kept_again


def test_release_cli_writes_learner_edition(tmp_path):
    release.main(["--out", str(tmp_path / "release")])
    for path in NOTEBOOKS:
        text = (tmp_path / "release" / path.relative_to(ROOT)).read_text()
        assert "BEGIN SOLUTION" not in text


def _assessment_secrets() -> list[str]:
    """Lines of the assessment's solutions, model answers, rubric and hidden tests that appear nowhere else:
    not in its given cells, the labs (even their solutions) or the library (so finding one means it leaked)."""
    nb = nbformat.read(ROOT / "assessment" / "assessment.ipynb", as_version=4)
    inside, outside = [], []
    for c in nb.cells:
        mine, theirs = _blocks(c.source)
        inside += mine
        outside += theirs
    public = [c.source for lab in (ROOT / "labs").glob("*.ipynb") for c in nbformat.read(lab, as_version=4).cells]
    public += [p.read_text() for p in (ROOT / "utils").rglob("*.py")]
    given = {line.strip() for text in [*outside, *public] for line in text.split("\n")}
    return sorted({line.strip() for line in inside if len(line.strip()) > 24 and line.strip() not in given})


@pytest.mark.slow   # runs the bundle's own tests in a child process
def test_the_learner_bundle_works_and_holds_none_of_the_assessments_secrets(tmp_path):
    import os
    import subprocess
    import sys
    bundle = tmp_path / "bundle"
    release.main(["--out", str(bundle)])
    secrets = _assessment_secrets()
    assert len(secrets) > 20  # the solutions, the model answers and rubric, the hidden tests
    for path in bundle.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            leaked = [line for line in secrets if line in text]
            assert not leaked, f"{path.relative_to(bundle)} holds the assessment's {leaked[:3]}"
    for name in ("Makefile", "pyproject.toml", "environment.yml", "README.md", "tests/conftest.py",
                 "assessment/assessment.ipynb", "assessment/job.py", "tooling/release.py", "tests/library/spawn_ranks.py"):
        assert (bundle / name).is_file(), f"the bundle lacks {name}"
    assert not (bundle / "assessment" / "grader").exists(), "the grader's package went into the learner bundle"
    assert all("BEGIN SOLUTION" not in p.read_text() for p in bundle.rglob("*.ipynb"))
    # Every module and data file of the assessment goes, by folder: its rules work inside the bundle.
    for path in (ROOT / "assessment").glob("*.*"):
        assert path.suffix not in (".py", ".json") or (bundle / "assessment" / path.name).is_file(), path.name
    done = subprocess.run([sys.executable, "-c", "from assessment import criteria, settings; print(criteria.speed("
                           "settings.REFERENCE_EPOCHS - 1, settings.GLOBAL_BATCH))"], cwd=bundle, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(bundle)})
    assert done.returncode == 0 and "True" in done.stdout, done.stderr[-2000:]
    # The instructors' and maintainers' guides stay out, and with them every word of what the grader does not catch.
    assert not (bundle / "TEACHING.md").exists() and not (bundle / "MAINTAINING.md").exists()
    learners = (ROOT / "README.md").read_text()
    guides = {line.strip() for name in ("TEACHING.md", "MAINTAINING.md") for line in (ROOT / name).read_text().split("\n")
              if len(line.strip()) > 40 and line.strip() not in learners}
    assert any("does not protect" in line for line in guides)
    for path in bundle.rglob("*"):
        if path.is_file() and path.suffix in (".md", ".py", ".ipynb", ".txt", ""):
            text = path.read_text(errors="replace")
            copied = [line for line in guides if line in text]
            assert not copied, f"{path.relative_to(bundle)} holds the guides' {copied[:2]}"
    # make lab's first step, and make test's collection, work inside the bundle on its own files.
    done = subprocess.run([sys.executable, "-m", "tooling.release", "--workspace", "ws"], cwd=bundle,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and len(list((bundle / "ws").rglob("*.ipynb"))) == len(NOTEBOOKS), done.stderr
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/library/test_config.py"],
                          cwd=bundle, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:]
    # The learner's cells are marked in the bundle, so the grader finds them in a handed-in notebook.
    from assessment.grader.submission import owned_cells
    owned = owned_cells(nbformat.read(bundle / "assessment" / "assessment.ipynb", as_version=4))
    assert owned == owned_cells(nbformat.read(ROOT / "assessment" / "assessment.ipynb", as_version=4))


def test_lab_solutions_go_in_only_when_asked_and_never_the_assessments(tmp_path):
    release.main(["--out", str(tmp_path / "with"), "--lab-solutions"])
    assert all("BEGIN SOLUTION" in p.read_text() for p in (tmp_path / "with" / "labs").glob("*.ipynb"))
    assert "BEGIN SOLUTION" not in (tmp_path / "with" / "assessment" / "assessment.ipynb").read_text()


def test_the_graders_sandbox_view_has_no_judge_reference_grader_or_tests(tmp_path):
    release.write_release(tmp_path / "view", for_grading=True)
    names = {str(p.relative_to(tmp_path / "view")) for p in (tmp_path / "view").rglob("*") if p.is_file()}
    for hidden in ("assessment/grader/grade.py", "assessment/grader/sandbox.py", "assessment/grader/model_file.py", "assessment/grader/cgroups.py"):
        assert hidden not in names
    assert not any(name.startswith(("tests/", "labs/")) for name in names)
    assert {"assessment/criteria.py", "assessment/job.py", "assessment/run_notebook.py", "assessment/settings.py",
            "assessment/step_cost.json", "utils/checks/job/check.py", "utils/checks/job/probe.py"} <= names


# The assessment leaves the learning-rate decision to the learner (lab 07 taught the options): no word
# of what the learner ships with may name a technique or the API that implements one.
ANSWER_WORDS = ("linear scaling", "scaling rule", "square root", "square-root", "sqrt", "warm-up", "warmup",
                "warm up", "ramp", "cosine", "decay", "anneal", "LinearLR", "LambdaLR", "StepLR", "OneCycle",
                "SequentialLR", "Goyal", "LARS", "LAMB", "scale the learning rate", "scaled learning rate")


def test_the_assessment_as_learners_get_it_names_no_learning_rate_technique(tmp_path):
    import re
    release.write_release(tmp_path / "bundle")
    nb = nbformat.read(tmp_path / "bundle" / "assessment" / "assessment.ipynb", as_version=4)
    texts = {f"cell {c.id}": c.source for c in nb.cells}
    texts.update({f"assessment/{p.name}": p.read_text() for p in (tmp_path / "bundle" / "assessment").glob("*.py")})
    found = {where: word for where, text in texts.items() for word in ANSWER_WORDS
             if re.search(rf"(?<![A-Za-z]){re.escape(word)}(?![A-Za-z])", text, re.IGNORECASE)}
    assert not found, f"the learner's assessment names the answer: {found}"
    # the instructor's edition does name them: the words would be found if they were there
    solution = nbformat.read(ROOT / "assessment" / "assessment.ipynb", as_version=4)
    assert any(re.search("warm-up", c.source, re.IGNORECASE) for c in solution.cells)


def test_the_bundle_is_made_by_folder_so_a_new_module_lands_on_its_side_unlisted(tmp_path):
    import shutil
    root = tmp_path / "course"
    for name in ("labs", "assessment", "utils", "tooling", "tests/library"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pt", "run_record"))
    for name in ("Makefile", "pyproject.toml", "environment.yml", "README.md", "tests/conftest.py"):
        shutil.copy(ROOT / name, root / name)
    added = {"utils/labs/lab09.py": True, "utils/brand_new.py": True, "tooling/new_tool.py": True,
             "tests/library/test_lab09.py": True, "assessment/new_rule.py": True,
             "assessment/grader/new_guard.py": False}
    for name in added:
        (root / name).write_text("VALUE = 1\n")
    release.write_release(tmp_path / "bundle", root=root)
    release.write_release(tmp_path / "view", root=root, for_grading=True)
    for name, shipped in added.items():
        assert (tmp_path / "bundle" / name).is_file() == shipped, name
        in_view = shipped and not name.startswith("tests/")
        assert (tmp_path / "view" / name).is_file() == in_view, name
    assert not (tmp_path / "bundle" / "assessment" / "grader").exists()
    assert not (tmp_path / "view" / "assessment" / "grader").exists()

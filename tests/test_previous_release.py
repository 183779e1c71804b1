"""Learners keep working across a new release: the notebooks a learner was given by the previous release
(their workspace keeps them; ``make lab`` never overwrites a file) still run against today's library up to
their first unsolved exercise, or stop at once with a message that names the moved module's new home.

``tests/previous_release/`` holds the learner editions of the release before the layout by audience
(commit ecbd0f1's parent), cut after the check of each one's first exercise (the assessment's after the
exercise itself: its check runs real jobs, a minute); they were made with ``tooling.release.learner_notebook``
from that commit's instructor editions.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from notebook_runner import run_notebook
from utils import moved

OLD = sorted((Path(__file__).parent / "previous_release").glob("*.ipynb"))

pytestmark = pytest.mark.slow


def _moved_imports(nb) -> list[str]:
    """The moved modules this notebook imports, in the order its cells import them."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            got = re.match(r"\s*from ([\w.]+) import (.+)|\s*import ([\w.]+)", line)
            if not got:
                continue
            if got.group(3):
                found += [got.group(3)] if got.group(3) in moved.MOVED else []
            else:
                names = [f"{got.group(1)}.{n.strip().split(' ')[0]}" for n in got.group(2).split(",")]
                found += [m for m in [got.group(1), *names] if m in moved.MOVED]
    return found


def test_the_previous_release_is_here_and_uses_moved_modules():
    assert len(OLD) == 9, [p.name for p in OLD]
    assert sum(bool(_moved_imports(nbformat.read(p, as_version=4))) for p in OLD) >= 4
    for path in OLD:   # each lab ends with its first exercise's check
        assert path.name == "assessment.ipynb" or "check_" in nbformat.read(path, as_version=4).cells[-1].source, path.name


@pytest.mark.parametrize("path", OLD, ids=[p.name for p in OLD])
def test_a_notebook_of_the_previous_release_runs_to_its_first_exercise_or_names_the_new_import(path, tmp_path):
    nb_in = nbformat.read(path, as_version=4)
    old_imports = _moved_imports(nb_in)
    result, nb = run_notebook(path, tmp_path / "out", allow_errors=False)
    assert nb is not None, result.stderr[-3000:]
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    if path.name == "assessment.ipynb" and not old_imports:   # it ends at the exercise: every cell runs
        assert not errors and result.returncode == 0, f"{errors[:1]}\n{result.stderr[-3000:]}"
        return
    assert errors, f"{path.name}: nothing failed, but its first exercise is a stub"
    cell, error = errors[0]
    if old_imports:
        # the first moved module it imports stops it, with the module's new home and what to do
        assert error.ename in ("ImportError", "ModuleNotFoundError"), f"{path.name}: {error.ename}: {error.evalue}"
        assert error.evalue == moved.message(old_imports[0]), f"{path.name}: {error.evalue}"
        assert all(home in error.evalue for home in moved.MOVED[old_imports[0]])
        assert "make lab" in error.evalue
    else:
        # nothing it imports before its first exercise has moved: it runs as it did, to that exercise's check
        check = len(nb_in.cells) - 1     # each notebook here ends with it
        assert (cell, error.ename) == (check, "NotSolved"), \
            f"{path.name}: failed in cell {cell}, not at its first check ({check}): {error.ename}: {error.evalue}"

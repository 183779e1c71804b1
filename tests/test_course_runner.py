"""utils.course runs notebooks in the project's own kernel and reports failures usefully."""
from __future__ import annotations

import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from notebook_runner import ROOT
from utils import course


def _write(tmp_path, *sources):
    path = tmp_path / "probe.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path


def test_kernel_is_this_interpreter_and_quick_mode_reaches_it(tmp_path):
    path = _write(tmp_path, "import os, sys; print(sys.executable); print(os.environ['COURSE_QUICK'])")
    nb = course.execute(path, quick=True)
    assert nb.cells[0].outputs[0].text.split() == [sys.executable, "1"]


def test_failure_prints_cell_source_and_traceback(tmp_path):
    path = _write(tmp_path, "x = 1", "def broken():\n    return 1 / 0\nbroken()", "print('never')")
    result = subprocess.run([sys.executable, "-m", "utils.course", "--no-html", str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "cell 1 raised ZeroDivisionError" in result.stderr
    assert "def broken():" in result.stderr and "return 1 / 0" in result.stderr
    assert "\x1b[" not in result.stderr, "ANSI colour codes should be stripped"


def test_executed_notebook_and_html_are_written(tmp_path):
    path = _write(tmp_path, "print(6 * 7)")
    assert course.main(["--out", str(tmp_path / "out"), str(path)]) == 0
    executed = nbformat.read(tmp_path / "out" / "probe.ipynb", as_version=4)
    assert executed.cells[0].outputs[0].text == "42\n"
    assert "42" in (tmp_path / "out" / "probe.html").read_text()


def test_quick_mode_can_come_from_the_environment(tmp_path):
    path = _write(tmp_path, "import os; print(os.environ.get('COURSE_QUICK'))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "COURSE_QUICK"}
    for setting, expected in (("1", "1"), ("0", "0")):
        result = subprocess.run([sys.executable, "-m", "utils.course", "--no-html", "--out", str(tmp_path / setting),
                                 str(path)], cwd=ROOT, env={**env, "COURSE_QUICK": setting}, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        executed = nbformat.read(tmp_path / setting / "probe.ipynb", as_version=4)
        assert executed.cells[0].outputs[0].text.strip() == expected

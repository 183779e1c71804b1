"""Runs a notebook through `python -m tooling.course` in its own process group, with a timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_TIMEOUT = int(os.environ.get("COURSE_NOTEBOOK_TIMEOUT", "420"))


def run_notebook(path: Path, out: Path, *, allow_errors: bool = False, timeout: int = NOTEBOOK_TIMEOUT,
                 env: dict | None = None):
    """Execute ``path`` in quick mode; return (completed process, executed notebook or None).

    ``env`` adds settings (such as ``COURSE_CORES``) to the notebook's environment."""
    command = [sys.executable, "-m", "tooling.course", "--quick", "--no-html", "--out", str(out), str(path)]
    if allow_errors:
        command.append("--allow-errors")
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, **(env or {})})
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the kernel is in the same process group
        stdout, stderr = process.communicate()
        raise AssertionError(f"{path.name} did not finish within {timeout} s in quick mode\n{stdout}\n{stderr}")
    executed = out / f"{path.stem}.ipynb"
    nb = nbformat.read(executed, as_version=4) if executed.exists() else None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), nb


def exercise_cells(nb) -> list[tuple[int, int]]:
    """(exercise cell index, check cell index): a check is the next code cell after a solution cell."""
    pairs = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            following = [j for j in range(index + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"]
            pairs.append((index, following[0] if following else None))
    return pairs

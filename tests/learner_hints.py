"""Shared by the labs' check tests: step-by-step hints (a check module's ``HINTS``) stay out of the learner edition."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from tooling import release

ROOT = Path(__file__).resolve().parent.parent


def learner_cells_hold_no_hint(path: Path, hints: dict[str, str]) -> None:
    """Fail if a line of any step-by-step hint appears in a cell of ``path``'s learner edition."""
    learner = release.learner_notebook(nbformat.read(path, as_version=4))
    text = "\n".join(cell.source for cell in learner.cells)
    for name, hint in hints.items():
        for line in hint.splitlines()[1:]:
            step = re.sub(r"^\s*\d+\.\s*", "", line).strip()
            if len(step) >= 20:
                assert step not in text, f"{path.name}: the step-by-step hint of {name} shows in a cell: {step!r}"

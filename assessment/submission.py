"""Reads a submitted notebook and rebuilds it around the learner's own cells.

The learner owns the cells that hold a solution block in the instructor edition (found by cell id);
every other cell is given. The notebook the grader runs is the learner edition of the instructor's
notebook with the learner's version of each owned cell put in: given cells that were deleted,
edited or moved come back as the course wrote them, and cells the learner added are not run
(nbgrader restores its locked cells the same way).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from utils.release import BEGIN_SOLUTION, learner_notebook

INSTRUCTOR = Path(__file__).resolve().parent / "assessment.ipynb"
_MAGIC = re.compile(r"^\s*[%!]")


class SubmissionError(ValueError):
    """The file cannot be graded at all; the message says why, for the learner."""


@dataclass
class Submission:
    restored: nbformat.NotebookNode                        # what the grader runs
    code: str                                              # the learner's code cells, for the probes
    answers: dict[str, str] = field(default_factory=dict)  # written answers, by cell id
    notes: list[str] = field(default_factory=list)         # what was restored or missing
    code_cells: list[str] = field(default_factory=list)    # ids of the code cells the learner writes


def owned_cells(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Cell id -> cell type, for every cell the learner writes (it holds a solution block)."""
    return {cell.id: cell.cell_type for cell in nb.cells if BEGIN_SOLUTION in cell.source}


def read(path: Path) -> nbformat.NotebookNode:
    text = Path(path).read_bytes()
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SubmissionError(f"the file is not a notebook: it is not valid JSON ({error}). Save it from "
                              f"Jupyter again (File > Save) and hand in the .ipynb file") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise SubmissionError("the file is JSON but not a notebook (it has no list of cells)")
    try:
        return nbformat.reads(text.decode(), as_version=4)
    except Exception as error:
        raise SubmissionError(f"the notebook could not be read ({type(error).__name__}: {error})") from None


def _python(source: str) -> str:
    """A %%px cell's body as plain Python; other magics and shell lines become comments."""
    lines = source.split("\n")
    if lines and lines[0].lstrip().startswith("%%px"):
        lines = lines[1:]
    return "\n".join(f"# (not run by the grader) {line}" if _MAGIC.match(line) else line for line in lines)


def restore(path: Path, instructor: Path = INSTRUCTOR) -> Submission:
    full = nbformat.read(instructor, as_version=4)
    given, owned = learner_notebook(full, "assessment"), owned_cells(full)
    # A given cell counts as edited when it matches neither edition (the instructor's has hidden tests).
    originals = {c.id: {c.source} for c in given.cells}
    for c in full.cells:
        originals[c.id].add(c.source)
    mine = read(path)
    theirs = {}
    for cell in mine.cells:
        cell_id = cell.get("id")
        if cell_id in owned and cell.cell_type == owned[cell_id] and cell_id not in theirs:
            theirs[cell_id] = cell.source
    if not theirs:
        raise SubmissionError(f"this is not this course's assessment notebook: none of its answer cells "
                              f"(ids {', '.join(sorted(owned))}) is in it. Hand in the assessment.ipynb you "
                              f"worked in (cell ids are kept when you edit and save it)")
    notes = [f"cell {cell_id} is missing from your notebook: it was graded as the unsolved stub"
             for cell_id in owned if cell_id not in theirs]
    given_ids = [c.id for c in given.cells if c.id not in owned]
    their_given = [c.get("id") for c in mine.cells if c.get("id") in set(given_ids)]
    by_id = {c.get("id"): c for c in mine.cells}
    changed = [i for i in given_ids if i in by_id and by_id[i].source not in originals[i]]
    if set(given_ids) - set(their_given):
        notes.append(f"{len(set(given_ids) - set(their_given))} given cell(s) were deleted: restored")
    if changed:
        notes.append(f"{len(changed)} given cell(s) were edited: restored as given ({', '.join(changed)})")
    if their_given != [i for i in given_ids if i in set(their_given)]:
        notes.append("given cells were moved: the notebook was run in the course's order")
    extra = [c for c in mine.cells if c.get("id") not in owned and c.get("id") not in set(given_ids)]
    if extra:
        notes.append(f"{len(extra)} cell(s) you added were kept in your file for your instructor, not run")
    for cell in given.cells:
        if cell.id in theirs:
            cell.source = theirs[cell.id]
    code = "\n\n".join(_python(theirs.get(c.id, c.source)) for c in given.cells
                       if c.id in owned and c.cell_type == "code")
    answers = {c.id: theirs.get(c.id, "") for c in given.cells if c.id in owned and c.cell_type == "markdown"}
    code_cells = [c.id for c in given.cells if c.id in owned and c.cell_type == "code"]
    return Submission(given, code, answers, notes, code_cells)

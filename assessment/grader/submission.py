"""Reads a submitted notebook and rebuilds it around the learner's own cells.

The learner owns the cells that hold a solution block in the instructor edition (found by cell id);
every other cell is given. The notebook the grader runs is the learner edition of the instructor's
notebook with the learner's version of each owned cell put in: given cells that were deleted,
edited or moved come back as the course wrote them, and cells the learner added are not run
(nbgrader restores its locked cells the same way).
"""
from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tooling.release import BEGIN_SOLUTION, learner_notebook

INSTRUCTOR = Path(__file__).resolve().parent.parent / "assessment.ipynb"


class SubmissionError(ValueError):
    """The file cannot be graded at all; the message says why, for the learner."""


@dataclass
class Submission:
    restored: nbformat.NotebookNode                        # what the grader runs
    answers: dict[str, str] = field(default_factory=dict)  # written answers, by cell id
    notes: list[str] = field(default_factory=list)         # what was restored or missing
    code_cells: list[str] = field(default_factory=list)    # ids of the code cells the learner writes


def owned_cells(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Cell id -> cell type, for every cell the learner writes: it holds a solution block (instructor
    edition) or is marked as the learner's answer (learner edition, so a learner bundle can grade too)."""
    return {cell.id: cell.cell_type for cell in nb.cells
            if BEGIN_SOLUTION in cell.source or cell.metadata.get("course", {}).get("answer")}


MAX_BYTES = 20_000_000      # the file, outputs included (the assessment as handed out is ~25 kB)
MAX_CELLS = 1000
MAX_SOURCE = 2_000_000      # characters of source in all cells together
MAX_DEPTH = 100             # nesting of JSON values: Jupyter's metadata and outputs stay far below it
CELL_TYPES = ("code", "markdown", "raw")
_RESAVE = "Save it from Jupyter again (File > Save) and hand in the .ipynb file"


def _depth(value) -> int:
    """How deeply lists and dicts nest in ``value``, walked without recursion (the input is hostile)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:  # deeper is refused anyway: no need to walk it
                stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def _check_cells(raw: dict) -> None:
    """The fields restore() and nbformat rely on, with the types Jupyter writes."""
    cells = raw["cells"]
    if len(cells) > MAX_CELLS:
        raise SubmissionError(f"the notebook has {len(cells)} cells; the grader reads at most {MAX_CELLS}. Delete the "
                              f"cells you added and hand in the assessment notebook")
    total = 0
    for n, cell in enumerate(cells):
        where = f"cell {n} of the notebook"
        if not isinstance(cell, dict):
            raise SubmissionError(f"{where} is of type {type(cell).__name__}, not a cell (a JSON object). {_RESAVE}")
        kind = cell.get("cell_type")
        if kind is None:
            raise SubmissionError(f"{where} has no cell_type. {_RESAVE}")
        if not isinstance(kind, str) or kind not in CELL_TYPES:
            raise SubmissionError(f"{where} has cell_type {kind!r:.40}; a cell is code, markdown or raw. {_RESAVE}")
        if "source" not in cell:
            raise SubmissionError(f"{where} has no source. {_RESAVE}")
        source = cell["source"]
        if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(s, str) for s in source)):
            raise SubmissionError(f"{where} has a source of type {type(source).__name__}, not text (a string or a "
                                  f"list of strings). {_RESAVE}")
        if "id" in cell and not isinstance(cell["id"], str):
            raise SubmissionError(f"{where} has an id of type {type(cell['id']).__name__}, not a string. {_RESAVE}")
        if "metadata" not in cell:  # nbformat refuses a cell without it, in words a learner cannot act on
            raise SubmissionError(f"{where} has no metadata. {_RESAVE}")
        if not isinstance(cell["metadata"], dict):
            raise SubmissionError(f"{where} has metadata of type {type(cell['metadata']).__name__}, not a JSON "
                                  f"object. {_RESAVE}")
        if "outputs" in cell and not isinstance(cell["outputs"], list):
            raise SubmissionError(f"{where} has outputs of type {type(cell['outputs']).__name__}, not a list. "
                                  f"{_RESAVE}")
        text = source if isinstance(source, str) else "".join(source)
        try:
            text.encode("utf-8")  # JSON may hold lone surrogates ("\ud800"); the grader could not write them out
        except UnicodeEncodeError:
            raise SubmissionError(f"{where} holds characters that are not valid Unicode text. {_RESAVE}") from None
        total += len(text)
        if total > MAX_SOURCE:
            raise SubmissionError(f"the notebook's cells hold more than {MAX_SOURCE:,} characters of source; the "
                                  f"grader reads at most that. Remove the large text or data you pasted into cells")


def read(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path``; any file that is not a sound notebook raises SubmissionError, and nothing else.

    Every check runs before nbformat sees the file: nbformat assumes the JSON's types (a wrong one
    raises whatever it raises), and of what its schema finds wrong it only logs some.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the grader, /dev/zero would never end
            raise SubmissionError(f"{Path(path).name} is not a regular file. {_RESAVE}")
        if info.st_size > MAX_BYTES:
            raise SubmissionError(f"the notebook file is {info.st_size / 1e6:.1f} MB; the grader reads at most "
                                  f"{MAX_BYTES / 1e6:.0f} MB. Clear the outputs (Edit > Clear Outputs of All Cells), "
                                  f"then save it from Jupyter again and hand in the .ipynb file")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise SubmissionError(f"the notebook file could not be read ({type(error).__name__}). {_RESAVE}") from None
    if len(data) > MAX_BYTES:  # it grew since stat()
        raise SubmissionError(f"the notebook file is over {MAX_BYTES / 1e6:.0f} MB. {_RESAVE}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SubmissionError(f"the file is not a notebook: it is not UTF-8 text. {_RESAVE}") from None
    try:
        raw = json.loads(text)
    except RecursionError:
        raise SubmissionError(f"the file is not a notebook: its JSON nests too deeply to read. {_RESAVE}") from None
    except json.JSONDecodeError as error:
        raise SubmissionError(f"the file is not a notebook: it is not valid JSON ({error}). {_RESAVE}") from None
    except ValueError:  # Python refuses integers of more than 4300 digits (sys.set_int_max_str_digits)
        raise SubmissionError(f"the file is not a notebook: it holds a number too long to read (over "
                              f"{sys.get_int_max_str_digits()} digits). {_RESAVE}") from None
    if not isinstance(raw, dict):
        raise SubmissionError(f"the file is JSON but not a notebook (it is a JSON {type(raw).__name__}, not an "
                              f"object with cells). {_RESAVE}")
    if not isinstance(raw.get("cells"), list):
        raise SubmissionError(f"the file is JSON but not a notebook (it has no list of cells). {_RESAVE}")
    if _depth(raw) > MAX_DEPTH:
        raise SubmissionError(f"the notebook's JSON nests more than {MAX_DEPTH} levels deep; Jupyter writes far "
                              f"fewer. Clear the outputs, then save it from Jupyter again")
    major = raw.get("nbformat")
    if type(major) is not int or major != 4:
        raise SubmissionError(f"the notebook is in format {major!r:.20}, not format 4 (Jupyter's since 2015). "
                              f"Save it from a current Jupyter (File > Save) and hand in the .ipynb file")
    if type(raw.get("nbformat_minor", 0)) is not int:
        raise SubmissionError(f"the notebook's nbformat_minor is not a whole number. {_RESAVE}")
    if not isinstance(raw.get("metadata"), dict):
        raise SubmissionError(f"the notebook has no metadata (a JSON object). {_RESAVE}")
    _check_cells(raw)
    try:
        return nbformat.reads(text, as_version=4)
    except Exception as error:
        raise SubmissionError(f"the notebook could not be read ({type(error).__name__}: {error}). {_RESAVE}") from None


def _same_magic(given: str, mine: str) -> str:
    """The learner's cell with the course's first-line cell magic: a cell the course runs on the engines
    (``%%px``) runs there, never in the notebook's own kernel (where the given baseline's code lives)."""
    given_magic = given.split("\n", 1)[0] if given.lstrip().startswith("%%") else ""
    lines = mine.split("\n")
    if lines and lines[0].lstrip().startswith("%%"):
        lines = lines[1:]
    return "\n".join(([given_magic] if given_magic else []) + lines)


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
            cell.source = _same_magic(cell.source, theirs[cell.id]) if cell.cell_type == "code" else theirs[cell.id]
    answers = {c.id: theirs.get(c.id, "") for c in given.cells if c.id in owned and c.cell_type == "markdown"}
    code_cells = [c.id for c in given.cells if c.id in owned and c.cell_type == "code"]
    return Submission(given, answers, notes, code_cells)

"""The learner edition: the instructor notebooks with solutions stubbed and hidden tests removed.

The notebooks in labs/ and assessment/ are the single source. In a code cell, the lines
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers) become
``raise NotImplementedError("<hint>")``, where the hint is the nearest ``# Hint:`` comment
above the block (a comment right above the block is then dropped, so the hint shows once); lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``
vanish. In a markdown cell a solution block becomes "YOUR ANSWER HERE".

    python -m utils.release --out build/release     # write the learner edition
    python -m utils.release --workspace workspace   # add missing learner copies, never overwrite
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

import nbformat

from .config import COURSE_ROOT

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOURCE_FOLDERS = ("labs", "assessment")
_HINT = re.compile(r"^\s*#\s*Hint:\s*(.*)$")


class ReleaseError(ValueError):
    """A notebook's solution or hidden-test markers do not pair up."""


def _strip_blocks(lines: list[str], begin: str, end: str, replace, where: str) -> list[str]:
    out, inside, start_line = [], False, 0
    for number, line in enumerate(lines, 1):
        marker = line.strip()
        if marker.startswith(begin):
            if inside:
                raise ReleaseError(f"{where}: line {number} opens '{begin}' inside another block")
            inside, start_line = True, number
            out.extend(replace(line, out))
        elif marker.startswith(end):
            if not inside:
                raise ReleaseError(f"{where}: line {number} has '{end}' with no '{begin}' before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ReleaseError(f"{where}: '{begin}' on line {start_line} is never closed by '{end}'")
    return out


def _code_stub(begin_line: str, lines_before: list[str]) -> list[str]:
    indent = begin_line[: len(begin_line) - len(begin_line.lstrip())]
    hint = next((m.group(1).strip() for line in reversed(lines_before) if (m := _HINT.match(line))), "")
    if lines_before and _HINT.match(lines_before[-1]):
        lines_before.pop()  # the stub's message carries the hint: the learner reads it once, not twice
    message = f"Hint: {hint}" if hint else "write your solution here"
    return [f"{indent}raise NotImplementedError({message!r})"]


def learner_source(source: str, cell_type: str = "code", where: str = "cell") -> str:
    """The learner's version of one cell's source."""
    lines = source.split("\n")
    if cell_type == "code":
        lines = _strip_blocks(lines, BEGIN_HIDDEN, END_HIDDEN, lambda line, before: [], where)
        lines = _strip_blocks(lines, BEGIN_SOLUTION, END_SOLUTION, _code_stub, where)
    else:
        lines = _strip_blocks(lines, BEGIN_SOLUTION, END_SOLUTION, lambda line, before: ["YOUR ANSWER HERE"], where)
    return "\n".join(lines)


def learner_notebook(nb: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """A copy of ``nb`` in the learner edition, with outputs cleared."""
    nb = nbformat.from_dict(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("code", "markdown"):
            cell.source = learner_source(cell.source, cell.cell_type, f"{name}, cell {index}")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def source_notebooks(root: Path = COURSE_ROOT) -> list[Path]:
    return sorted(p for folder in SOURCE_FOLDERS for p in (root / folder).glob("*.ipynb"))


def write_release(out: Path, root: Path = COURSE_ROOT) -> list[Path]:
    """Write the learner edition of every source notebook under ``out`` (replaced whole)."""
    out = Path(out)
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=out.parent if out.parent.exists() else None))
    written = []
    for path in source_notebooks(root):
        target = staging / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(learner_notebook(nbformat.read(path, as_version=4), path.name), target)
        written.append(out / path.relative_to(root))
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), out)
    return written


def fill_workspace(workspace: Path, root: Path = COURSE_ROOT) -> tuple[list[Path], list[Path]]:
    """Copy learner notebooks that ``workspace`` lacks; never touch a file already there.

    Returns (added, kept): the files written now and the learner's files left as they were.
    """
    workspace = Path(workspace)
    added, kept = [], []
    for path in source_notebooks(root):
        target = workspace / path.relative_to(root)
        if target.exists():
            kept.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = learner_notebook(nbformat.read(path, as_version=4), path.name)
        # Exclusive create: even if a file appeared since the check above, it is not overwritten.
        with open(target, "x", encoding="utf-8") as f:
            nbformat.write(nb, f)
        added.append(target)
    return added, kept


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the whole learner edition here (replaced)")
    parser.add_argument("--workspace", type=Path, help="add learner copies missing from this folder")
    args = parser.parse_args(argv)
    if not args.out and not args.workspace:
        parser.error("give --out DIR and/or --workspace DIR")
    if args.out:
        written = write_release(args.out)
        print(f"learner edition: {len(written)} notebooks in {args.out}/")
    if args.workspace:
        added, kept = fill_workspace(args.workspace)
        for path in added:
            print(f"new in your workspace: {path}")
        if kept:
            print(f"{len(kept)} notebook(s) already in {args.workspace}/ kept as you left them "
                  f"(delete one to get a fresh copy)")


if __name__ == "__main__":
    main()

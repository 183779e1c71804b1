"""The learner edition: the instructor notebooks with solutions stubbed and hidden tests removed.

The notebooks in labs/ and assessment/ are the single source. In a code cell, the lines
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers) become
``raise NotImplementedError("<hint>")``, where the hint is the nearest ``# Hint:`` comment
above the block (a comment right above the block is then dropped, so the hint shows once); lines between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``
vanish. In a markdown cell a solution block becomes "YOUR ANSWER HERE".

    python -m tooling.release --out build/release     # write the learner bundle (what learners get)
    python -m tooling.release --out build/release --lab-solutions   # ... with the labs' instructor editions
    python -m tooling.release --workspace workspace   # add missing learner copies, never overwrite

The learner bundle is a self-contained course: the learner editions, the library, the Makefile and
packaging, the assessment's public modules and the library's own tests, so ``make lab`` and
``make test`` work in it. It never holds the assessment's instructor edition, model answers, rubric
or hidden tests (``tests/test_release.py`` scans it for every one of them).
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

import nbformat

from utils.config import COURSE_ROOT

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOURCE_FOLDERS = ("labs", "assessment")
STUB_WIDTH = 100  # characters per line of a stub: JupyterLab's notebook shows about this many
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
    line = f"{indent}raise NotImplementedError({message!r})"
    if len(line) <= STUB_WIDTH:
        return [line]
    # Wrapped to the notebook's width (no horizontal scrollbar), as adjacent strings Python joins.
    # Measured as written, quotes and escapes included: a hint holding both kinds of quote gets backslashes.
    room = STUB_WIDTH - len(indent) - 4
    words = message.split(" ")
    strings, piece = [], words[0]
    for word in words[1:]:
        if len(repr(f"{piece} {word} ")) <= room:
            piece = f"{piece} {word}"
        else:
            strings.append(repr(piece + " "))
            piece = word
    strings.append(repr(piece))
    return ([f"{indent}raise NotImplementedError("] + [f"{indent}    {text}" for text in strings]
            + [f"{indent})"])


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
            if BEGIN_SOLUTION in cell.source:  # the learner's cell: marked, so a learner bundle can be graded
                cell.metadata["course"] = {"answer": True}
            cell.source = learner_source(cell.source, cell.cell_type, f"{name}, cell {index}")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def source_notebooks(root: Path = COURSE_ROOT) -> list[Path]:
    return sorted(p for folder in SOURCE_FOLDERS for p in (root / folder).glob("*.ipynb"))


# What the bundle holds besides the notebooks, by folder, so that a new module lands on the right side
# without being listed: the learners' library (utils/, with each lab's module and checks), the tooling that
# `make lab` and `make course` run, every module and data file at the top of assessment/ (its notebook and
# checks need them: a file left out once failed every grading) but none of its subfolders (assessment/grader/,
# the grader's own package, never leaves the course; the grader's sandbox sees this same view minus the
# tests and the files below), and the library's own tests (tests/library/ and the conftest.py they run under).
BUNDLE_FILES = ("Makefile", "pyproject.toml", "environment.yml", "README.md", ".gitignore")
BUNDLE_FOLDERS = ("utils", "tooling")
ASSESSMENT_SUFFIXES = (".py", ".json")   # its modules and what they read (the speed rule's step-cost table)
BUNDLE_TESTS = "tests/library"


def write_release(out: Path, root: Path = COURSE_ROOT, lab_solutions: bool = False,
                  for_grading: bool = False) -> list[Path]:
    """Write the learner bundle under ``out`` (replaced whole); returns the notebooks written.

    ``lab_solutions``: the labs' instructor editions instead of their learner editions (the
    assessment is always the learner edition). ``for_grading``: the grader's sandbox view: the
    assessment's notebook, modules and the library, without the labs, the tests and the packaging.
    """
    out, root = Path(out), Path(root)
    staging = Path(tempfile.mkdtemp(prefix=".release-", dir=out.parent if out.parent.exists() else None))
    written = []
    for path in source_notebooks(root):
        if for_grading and path.parent.name != "assessment":
            continue
        target = staging / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(path, as_version=4)
        if not (lab_solutions and path.parent.name == "labs"):
            nb = learner_notebook(nb, path.name)
        nbformat.write(nb, target)
        written.append(out / path.relative_to(root))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    for folder in BUNDLE_FOLDERS:
        shutil.copytree(root / folder, staging / folder, ignore=ignore)
    for path in sorted((root / "assessment").iterdir()):
        if path.is_file() and path.suffix in ASSESSMENT_SUFFIXES:
            shutil.copy(path, staging / "assessment" / path.name)
    if not for_grading:
        for name in BUNDLE_FILES:
            if (root / name).exists():
                shutil.copy(root / name, staging / name)
        shutil.copytree(root / BUNDLE_TESTS, staging / BUNDLE_TESTS, ignore=ignore)
        shutil.copy(root / "tests" / "conftest.py", staging / "tests" / "conftest.py")
    for path in [staging, *staging.rglob("*")]:  # readable by the sandbox's unprivileged user
        path.chmod(0o755 if path.is_dir() else 0o644)
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


def write_workspace_index(workspace: Path, root: Path = COURSE_ROOT) -> Path | None:
    """workspace/README.md: each notebook's full name, linked, with its topic (JupyterLab's file
    browser cuts long names). Written only where the workspace has none: a learner's file stays."""
    target = Path(workspace) / "README.md"
    if target.exists():
        return None
    rows = []
    for path in source_notebooks(root):
        topic = nbformat.read(path, as_version=4).metadata.get("course", {}).get("topic", "").split(":")[0]
        name = str(path.relative_to(root))
        rows.append(f"| [{name}]({name}) | {topic} |")
    text = ("# Your copies of the labs\n\nOpen a lab from the list below (a double click on a name in the\n"
            "file browser does the same). The files are yours: `make lab` adds new labs and never changes these.\n\n"
            "| Notebook | Topic |\n| --- | --- |\n" + "\n".join(rows) + "\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "x", encoding="utf-8") as f:
        f.write(text)
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the learner bundle here (replaced)")
    parser.add_argument("--lab-solutions", action="store_true",
                        help="put the labs' instructor editions in the bundle (never the assessment's)")
    parser.add_argument("--workspace", type=Path, help="add learner copies missing from this folder")
    args = parser.parse_args(argv)
    if not args.out and not args.workspace:
        parser.error("give --out DIR and/or --workspace DIR")
    if args.out:
        written = write_release(args.out, lab_solutions=args.lab_solutions)
        print(f"learner bundle: {len(written)} notebooks, the library and its tests in {args.out}/ "
              f"(labs: {'instructor' if args.lab_solutions else 'learner'} editions; assessment: learner edition)")
    if args.workspace:
        added, kept = fill_workspace(args.workspace)
        write_workspace_index(args.workspace)
        for path in added:
            print(f"new in your workspace: {path}")
        if kept:
            print(f"{len(kept)} notebook(s) already in {args.workspace}/ kept as you left them "
                  f"(delete one to get a fresh copy)")


if __name__ == "__main__":
    main()

"""Execute notebooks headless and keep what they printed.

    python -m utils.course --out build/course labs/*.ipynb           # full mode, .ipynb + .html
    python -m utils.course --quick --out /tmp/run labs/01_mlp_cpu.ipynb

Each notebook runs in a fresh kernel in its own folder. On failure the failing cell's
source and traceback are printed and the exit status is 1.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _project_kernel_manager():
    """A kernel manager that always starts this interpreter's kernel.

    A kernelspec named ``python3`` in the user's Jupyter folders would otherwise win over
    the course's environment and run the labs with another Python and other packages.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class ProjectKernelSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    return KernelManager(kernel_name="python3", kernel_spec_manager=ProjectKernelSpecs())


def execute(path: Path, *, quick: bool | None = None, cell_timeout: int = 900,
            allow_errors: bool = False) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in this interpreter's kernel; return the executed notebook.

    Errors stay in the failing cell's outputs (see ``failure_report``).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    if quick is not None:
        # The kernel inherits this process's environment.
        os.environ["COURSE_QUICK"] = "1" if quick else "0"
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, km=_project_kernel_manager(), timeout=cell_timeout, allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    try:
        client.execute()
    except CellExecutionError:
        pass  # the error is in the failing cell's outputs; failure_report() finds it
    return nb


def first_error(nb: nbformat.NotebookNode):
    """(cell index, cell, error output) of the first cell that raised, or None."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.output_type == "error":
                return index, cell, output
    return None


def failure_report(nb: nbformat.NotebookNode, name: str = "notebook") -> str:
    found = first_error(nb)
    if found is None:
        return ""
    index, cell, error = found
    trace = _ANSI.sub("", "\n".join(error.get("traceback", [])))
    return (f"{name}: cell {index} raised {error.ename}: {error.evalue}\n"
            f"---- cell source ----\n{cell.source}\n---- traceback ----\n{trace}")


def write_outputs(nb: nbformat.NotebookNode, out: Path, stem: str, html: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / f"{stem}.ipynb")
    if html:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nb)
        (out / f"{stem}.html").write_text(body, encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write executed notebooks (and HTML) here")
    parser.add_argument("--quick", action="store_true", help="quick mode (COURSE_QUICK=1)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML copies")
    parser.add_argument("--allow-errors", action="store_true", help="run every cell even after an error")
    parser.add_argument("--cell-timeout", type=int, default=900, help="seconds one cell may take")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.notebooks:
        start = time.perf_counter()
        # Without --quick the mode comes from the environment (COURSE_QUICK), never forced to full.
        nb = execute(path, quick=True if args.quick else None, cell_timeout=args.cell_timeout,
                     allow_errors=args.allow_errors)
        seconds = time.perf_counter() - start
        if args.out:
            write_outputs(nb, args.out, path.stem, html=not args.no_html)
        report = failure_report(nb, path.name)
        if report and not args.allow_errors:
            failed += 1
            print(report, file=sys.stderr)
            print(f"FAILED {path} after {seconds:.1f} s", file=sys.stderr)
        else:
            print(f"ran {path} in {seconds:.1f} s" + (" (with errors)" if report else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Execute notebooks headless and keep what they printed; build the course site.

    python -m tooling.course --out build/course labs/*.ipynb           # full mode, .ipynb + .html
    python -m tooling.course --quick --out /tmp/run labs/01_mlp_cpu.ipynb
    python -m tooling.course --out build/course --index --slides build/slides labs/*.ipynb

Each notebook runs in a fresh kernel in its own folder. On failure the failing cell's
source and traceback are printed, the other notebooks still run, and the exit status is 1.
At the end a table gives each notebook's run time. With --index, build/course/index.html is the
course map: lab, topic, based on, run time, and links to each lab's page, notebook, deck and PDF,
and the figures of the decks.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import sys
import time
import uuid
from pathlib import Path

import nbformat

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def project_kernel_manager():
    """A kernel manager that always starts this interpreter's kernel.

    A kernelspec named ``python3`` in the user's Jupyter folders would otherwise win over
    the course's environment and run the labs with another Python and other packages.
    """
    from ipykernel.kernelspec import RESOURCES, get_kernel_dict
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class ProjectKernelSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())

    settings = {}
    if os.name == "posix":
        # Unix sockets instead of TCP: the kernel's traffic never leaves the machine, and ipykernel
        # no longer warns, once per notebook, that TCP is unencrypted.
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = Path(jupyter_runtime_dir())
        runtime.mkdir(parents=True, exist_ok=True)
        settings = {"transport": "ipc", "ip": str(runtime / f"course-{uuid.uuid4().hex[:12]}")}
    # The asynchronous manager, as nbclient's own default: with a blocking client, waiting for a
    # cell's output blocks the event loop, and a cell that never ends is never timed out.
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ProjectKernelSpecs(), **settings)


def notebook_client(nb: nbformat.NotebookNode, folder: Path, *, cell_timeout: int, allow_errors: bool,
                    client_class=None):
    """The course's one way to run a notebook: an nbclient client (``client_class``, a subclass, or nbclient's
    own) on this interpreter's kernel, started in ``folder``, each cell limited to ``cell_timeout`` seconds.
    ``execute`` below and the grader's sandboxed runner (``assessment.run_notebook``) both run through it."""
    from nbclient import NotebookClient

    return (client_class or NotebookClient)(nb, km=project_kernel_manager(), timeout=cell_timeout,
                                            allow_errors=allow_errors, resources={"metadata": {"path": str(folder)}})


def execute(path: Path, *, quick: bool | None = None, cell_timeout: int = 900,
            allow_errors: bool = False) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in this interpreter's kernel; return the executed notebook.

    Errors stay in the failing cell's outputs (see ``failure_report``).
    """
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    if quick is not None:
        # The kernel inherits this process's environment.
        os.environ["COURSE_QUICK"] = "1" if quick else "0"
    nb = nbformat.read(path, as_version=4)
    client = notebook_client(nb, path.parent.resolve(), cell_timeout=cell_timeout, allow_errors=allow_errors)
    try:
        # A kernel manager passed in is not the client's own, so ask it to shut the kernel down (and
        # remove its sockets) when done: otherwise every kernel lives until this process exits.
        client.execute(cleanup_kc=True)
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


def _facts(nb: nbformat.NotebookNode) -> tuple[str, str]:
    """(topic, based on) from the notebook's ``metadata.course``."""
    meta = nb.metadata.get("course", {})
    return meta.get("topic", ""), meta.get("based_on", "")


def run_table(runs: list[dict]) -> str:
    """A plain-text table of each notebook's run time and result."""
    width = max(len("notebook"), *(len(run["notebook"]) for run in runs))
    lines = [f"{'notebook':<{width}}  {'mode':<5}  {'minutes':>7}  result", "-" * (width + 30)]
    for run in runs:
        result = "ok" if run["error"] is None else f"FAILED at {run['error']}"
        lines.append(f"{run['notebook']:<{width}}  {run['mode']:<5}  {run['seconds'] / 60:>7.1f}  {result}")
    lines.append(f"{'total':<{width}}  {'':<5}  {sum(r['seconds'] for r in runs) / 60:>7.1f}")
    return "\n".join(lines)


def _link(out: Path, target: Path, text: str) -> str:
    """A relative link to ``target`` if it exists, else the words 'not built'."""
    if not target.is_file():
        return '<span class="missing">not built</span>'
    return f'<a href="{html.escape(os.path.relpath(target, out))}">{html.escape(text)}</a>'


def write_index(out: Path, runs: list[dict], slides: Path | None = None) -> Path:
    """build/course/index.html: the course map with links to every page, deck and PDF, and the figures."""
    rows = []
    for run in runs:
        stem = Path(run["notebook"]).stem
        deck = (slides / f"{stem}.html") if slides else Path("/nonexistent")
        pdf = (slides / f"{stem}.pdf") if slides else Path("/nonexistent")
        status = "" if run["error"] is None else f'<br><span class="failed">failed at {html.escape(run["error"])}</span>'
        rows.append(f"<tr><td>{html.escape(stem)}</td><td>{html.escape(run['topic'])}</td>"
                    f"<td>{html.escape(run['based_on'])}</td><td class=\"num\">{run['seconds'] / 60:.1f}{status}</td>"
                    f"<td>{_link(out, out / f'{stem}.html', 'page')}</td>"
                    f"<td>{_link(out, out / f'{stem}.ipynb', 'notebook')}</td>"
                    f"<td>{_link(out, deck, 'slides')}</td><td>{_link(out, pdf, 'PDF')}</td></tr>")
    figures = sorted((slides / "figures").glob("*.svg")) if slides and (slides / "figures").is_dir() else []
    gallery = "\n".join(f'<figure><a href="{html.escape(os.path.relpath(f, out))}"><img src="'
                        f'{html.escape(os.path.relpath(f, out))}" alt="{f.stem}"></a><figcaption>{f.stem}'
                        f"</figcaption></figure>" for f in figures) or "<p>No figures: run <code>make slides</code>.</p>"
    modes = sorted({run["mode"] for run in runs})
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Course map</title><link rel="icon" href="data:,">
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 80em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; }}
.num {{ text-align: right; }} .failed {{ color: #b00; }} .missing {{ color: #888; }}
figure {{ display: inline-block; width: 30em; margin: 0.5em; }} figure img {{ width: 100%; }}
</style></head><body>
<h1>Parallel and distributed training of deep neural networks with PyTorch</h1>
<h2>Course map</h2>
<p>Executed in {html.escape(" and ".join(modes))} mode on {time.strftime("%Y-%m-%d")}; run time in minutes on the machine that built this page.</p>
<table><tr><th>Lab</th><th>Topic</th><th>Based on</th><th>Run time (min)</th><th>Page</th><th>Notebook</th><th>Deck</th><th>PDF</th></tr>
{chr(10).join(rows)}
</table>
<h2>Figures</h2>
{gallery}
</body></html>
"""
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write executed notebooks (and HTML) here")
    parser.add_argument("--quick", action="store_true", help="quick mode (COURSE_QUICK=1)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML copies")
    parser.add_argument("--allow-errors", action="store_true", help="run every cell even after an error")
    parser.add_argument("--cell-timeout", type=int, default=900, help="seconds one cell may take")
    parser.add_argument("--index", action="store_true", help="write OUT/index.html, the course map")
    parser.add_argument("--slides", type=Path, help="built decks to link from the index (make slides)")
    args = parser.parse_args(argv)
    if args.index and not args.out:
        parser.error("--index needs --out (the folder the index and the pages go to)")
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    runs = []
    for path in args.notebooks:
        start = time.perf_counter()
        # Without --quick the mode comes from the environment (COURSE_QUICK), never forced to full.
        nb = execute(path, quick=True if args.quick else None, cell_timeout=args.cell_timeout,
                     allow_errors=args.allow_errors)
        seconds = time.perf_counter() - start
        if args.out:
            write_outputs(nb, args.out, path.stem, html=not args.no_html)
        report = failure_report(nb, path.name)
        found = first_error(nb)
        topic, based_on = _facts(nb)
        runs.append({"notebook": path.name, "seconds": seconds, "topic": topic, "based_on": based_on,
                     "mode": "quick" if os.environ.get("COURSE_QUICK") == "1" else "full",
                     "error": None if found is None or args.allow_errors else f"cell {found[0]} ({found[2].ename})"})
        if report and not args.allow_errors:
            print(report, file=sys.stderr)
            print(f"FAILED {path} after {seconds:.1f} s", file=sys.stderr)
        else:
            print(f"ran {path} in {seconds:.1f} s" + (" (with errors)" if report else ""), flush=True)
    if len(runs) > 1 or args.index:
        print(run_table(runs))
    if args.index:
        print(f"course map: {write_index(args.out, runs, args.slides)}")
    failed = [run["notebook"] for run in runs if run["error"]]
    if failed:
        print(f"{len(failed)} of {len(runs)} notebooks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

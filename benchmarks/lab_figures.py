"""The figures a lab draws in full mode, kept as images so that its deck shows the lab's own run.

A lab marks each cell whose figure its deck shows with cell metadata ``{"course": {"figure": NAME}}``
(JupyterLab does not show it to the learner). ``benchmarks/lab_times.py``, when it runs a lab in full
mode, calls ``record``: the image each marked cell drew becomes ``results/figures/labNN_NAME.png``, and
``results/lab_figures.json`` notes the machine, the date and what the cell printed, so the deck's notes
can quote the same run. ``slides/build.py`` copies the images beside the decks.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def figure_name(cell) -> str | None:
    return cell.get("metadata", {}).get("course", {}).get("figure")


def file_name(notebook: str, name: str) -> str:
    """``07_batch_size.ipynb`` and ``sharp_minima`` -> ``lab07_sharp_minima.png``."""
    return f"lab{Path(notebook).name[:2]}_{name}.png"


def marked(nb) -> dict:
    """{figure name: cell} for every marked cell of a notebook; a name used twice is an error."""
    found = {}
    for cell in nb.cells:
        if (name := figure_name(cell)) is not None:
            if name in found:
                raise ValueError(f"two cells are marked as figure {name!r}")
            found[name] = cell
    return found


def record(nb, notebook: str, machine: str, date: str, results: Path = RESULTS) -> list[Path]:
    """Save the image of every marked cell of ``nb`` (executed in full mode) and index it."""
    index_path = results / "lab_figures.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    written = []
    for name, cell in marked(nb).items():
        images = [out["data"]["image/png"] for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
        if not images:
            raise SystemExit(f"{notebook}: the cell marked as figure {name!r} drew no image in this run")
        printed = "".join(out.get("text", "") for out in cell.get("outputs", [])
                          if out.get("output_type") == "stream" and out.get("name") == "stdout")
        target = results / "figures" / file_name(notebook, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(images[-1]))       # a cell that draws twice: its last figure
        index[target.name] = dict(notebook=notebook, figure=name, mode="full", machine=machine, date=date,
                                  printed=printed.rstrip("\n"))
        written.append(target)
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    return written

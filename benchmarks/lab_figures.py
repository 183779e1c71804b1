"""The figures a lab draws in full mode, kept as images so that its deck shows the lab's own run.

A lab marks each cell whose figure its deck shows with cell metadata ``{"course": {"figure": NAME}}``
(JupyterLab does not show it to the learner). ``benchmarks/lab_times.py``, when it runs a lab in full
mode, calls ``record``: the image each marked cell drew becomes ``results/figures/labNN_NAME.png``, and
``results/lab_figures.json`` notes the machine, the date and what the cell printed, so the deck's notes
can quote the same run. ``slides/build.py`` copies the images beside the decks.

One figure is drawn from a benchmark's recording instead (its cell's metadata also says
``"recorded_by"``, and a full-mode run of the lab leaves it alone): lab 06's scaling figure, measured by
``benchmarks/bench_lab06_scaling.py`` with a core per worker, beside the compute + alpha-beta model's
prediction, with the machine and its load named:

    .venv/bin/python benchmarks/lab_figures.py --lab06-scaling [benchmarks/results/lab06_scaling_16core.json]

(default: the recorded file with the most cores).
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
        if cell.get("metadata", {}).get("course", {}).get("recorded_by"):
            continue                                        # drawn from a benchmark's file: draw_lab06_scaling
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


def draw_lab06_scaling(path: Path | None = None, results: Path = RESULTS) -> Path:
    """Deck 06's scaling figure from a bench_lab06_scaling recording (default: the one with the most
    cores), drawn as lab 06's recorded-runs cell draws it, and indexed with that machine and its load."""
    import sys

    import matplotlib
    matplotlib.use("Agg")
    sys.path.insert(0, str(results.parent.parent))
    from utils.labs import lab06

    records = [dict(json.loads(path.read_text()), file=path.name)] if path else lab06.recorded_runs(results)
    if not records:
        raise SystemExit("no benchmarks/results/lab06_scaling_*.json: run benchmarks/bench_lab06_scaling.py first")
    record = records[-1]
    target = results / "figures" / file_name("06_realistic_model.ipynb", "scaling")
    target.parent.mkdir(parents=True, exist_ok=True)
    lab06.plot_recorded(record).savefig(target, dpi=100)
    ks, throughput, predicted, _ = lab06.recorded_curves(record)
    printed = "\n".join(f"{label}: " + ", ".join(f"k={k} {m:,.0f} (predicted {q:,.0f})" for k, m, q in
                                                zip(ks, throughput[label], predicted[label])) + " images/s"
                        for label in throughput)
    index_path = results / "lab_figures.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index[target.name] = dict(notebook="06_realistic_model.ipynb", figure="scaling", mode=f"recorded: {record['file']}",
                              machine=lab06.describe_record(record, date=False), date=record["date"], printed=printed)
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    return target


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Draw the figures that come from a benchmark's recording.")
    parser.add_argument("--lab06-scaling", nargs="?", const="", metavar="FILE", required=True,
                        help="deck 06's scaling figure from this bench_lab06_scaling file (default: most cores)")
    args = parser.parse_args()
    print(f"wrote {draw_lab06_scaling(Path(args.lab06_scaling) if args.lab06_scaling else None)}")

"""The labs' own figures on their decks: recorded from a full-mode run, tied to a marked cell."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import lab_figures  # noqa: E402

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")


def _executed(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _cell(figure=None, outputs=()):
    cell = nbformat.v4.new_code_cell("plot()")
    if figure:
        cell.metadata["course"] = {"figure": figure}
    cell.outputs = list(outputs)
    return cell


def _image(png=PNG):
    return nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode()})


def test_a_marked_cells_image_and_printed_lines_are_recorded_with_the_machine(tmp_path):
    other = b"\x89PNG second figure"
    nb = _executed(_cell(outputs=[_image()]),                       # not marked: not recorded
                   _cell("scaling", [nbformat.v4.new_output("stream", name="stdout", text="speed-up 1.7x\n"),
                                     nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
                                     _image(), _image(other)]))
    (written,) = lab_figures.record(nb, "06_realistic_model.ipynb", "2-core test box", "2026-11-27", tmp_path)
    assert written == tmp_path / "figures" / "lab06_scaling.png"
    assert written.read_bytes() == other, "a cell that draws twice: its last figure"
    index = json.loads((tmp_path / "lab_figures.json").read_text())
    assert index == {"lab06_scaling.png": dict(notebook="06_realistic_model.ipynb", figure="scaling", mode="full",
                                               machine="2-core test box", date="2026-11-27",
                                               printed="speed-up 1.7x")}
    # Recording another lab keeps this one's entry.
    lab_figures.record(_executed(_cell("psgd", [_image()])), "08_beyond_sync_sgd.ipynb", "box", "d", tmp_path)
    assert sorted(json.loads((tmp_path / "lab_figures.json").read_text())) == ["lab06_scaling.png", "lab08_psgd.png"]


def test_a_marked_cell_that_drew_nothing_or_a_name_used_twice_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="figure 'scaling' drew no image"):
        lab_figures.record(_executed(_cell("scaling")), "06_x.ipynb", "box", "d", tmp_path)
    with pytest.raises(ValueError, match="two cells are marked as figure 'scaling'"):
        lab_figures.marked(_executed(_cell("scaling"), _cell("scaling")))


def test_every_recorded_figure_belongs_to_a_marked_cell_of_its_lab_and_is_indexed():
    """A deck shows a lab's figure only while the lab still has the cell that draws it."""
    index_path = lab_figures.RESULTS / "lab_figures.json"
    images = sorted(path.name for path in (lab_figures.RESULTS / "figures").glob("lab*.png"))
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    assert sorted(index) == images, "every recorded image is indexed, and every index entry has its image"
    for image, entry in index.items():
        nb = nbformat.read(ROOT / "labs" / entry["notebook"], as_version=4)
        assert entry["figure"] in lab_figures.marked(nb), f"{image}: no cell of {entry['notebook']} is marked " \
                                                          f"as figure {entry['figure']!r} any more"
        assert image == lab_figures.file_name(entry["notebook"], entry["figure"])

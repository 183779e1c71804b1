"""tooling.course runs notebooks in the project's own kernel and reports failures usefully."""
from __future__ import annotations

import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from notebook_runner import ROOT
from tooling import course


def _write(tmp_path, *sources):
    path = tmp_path / "probe.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path


def test_kernel_is_this_interpreter_and_quick_mode_reaches_it(tmp_path):
    path = _write(tmp_path, "import os, sys; print(sys.executable); print(os.environ['COURSE_QUICK'])")
    nb = course.execute(path, quick=True)
    assert nb.cells[0].outputs[0].text.split() == [sys.executable, "1"]


def test_failure_prints_cell_source_and_traceback(tmp_path):
    path = _write(tmp_path, "x = 1", "def broken():\n    return 1 / 0\nbroken()", "print('never')")
    result = subprocess.run([sys.executable, "-m", "tooling.course", "--no-html", str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "cell 1 raised ZeroDivisionError" in result.stderr
    assert "def broken():" in result.stderr and "return 1 / 0" in result.stderr
    assert "\x1b[" not in result.stderr, "ANSI colour codes should be stripped"


def test_executed_notebook_and_html_are_written(tmp_path):
    path = _write(tmp_path, "print(6 * 7)")
    assert course.main(["--out", str(tmp_path / "out"), str(path)]) == 0
    executed = nbformat.read(tmp_path / "out" / "probe.ipynb", as_version=4)
    assert executed.cells[0].outputs[0].text == "42\n"
    assert "42" in (tmp_path / "out" / "probe.html").read_text()


def test_quick_mode_can_come_from_the_environment(tmp_path):
    path = _write(tmp_path, "import os; print(os.environ.get('COURSE_QUICK'))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "COURSE_QUICK"}
    for setting, expected in (("1", "1"), ("0", "0")):
        result = subprocess.run([sys.executable, "-m", "tooling.course", "--no-html", "--out", str(tmp_path / setting),
                                 str(path)], cwd=ROOT, env={**env, "COURSE_QUICK": setting}, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        executed = nbformat.read(tmp_path / setting / "probe.ipynb", as_version=4)
        assert executed.cells[0].outputs[0].text.strip() == expected


def _probe(folder, name, *sources, topic="a probe"):
    folder.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["course"] = {"topic": topic, "based_on": "nothing"}
    nbformat.write(nb, folder / name)
    return folder / name


def test_kernel_is_shut_down_after_its_notebook(tmp_path):
    import time

    import psutil

    nb = course.execute(_write(tmp_path, "import os; print(os.getpid())"), quick=True)
    pid = int(nb.cells[0].outputs[0].text)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the notebook's kernel still runs after execute() returned"
        time.sleep(0.1)


def test_a_failure_names_notebook_and_cell_and_the_others_still_run(tmp_path):
    bad = _probe(tmp_path / "labs", "01_bad.ipynb", "x = 1", "raise ValueError('no good')")
    good = _probe(tmp_path / "labs", "02_good.ipynb", "print('fine')")
    result = subprocess.run([sys.executable, "-m", "tooling.course", "--quick", "--no-html", "--out",
                             str(tmp_path / "out"), str(bad), str(good)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1
    assert "01_bad.ipynb: cell 1 raised ValueError: no good" in result.stderr
    assert (tmp_path / "out" / "02_good.ipynb").exists(), "the notebook after the failing one did not run"
    table = result.stdout[result.stdout.index("notebook"):]
    assert "01_bad.ipynb" in table and "FAILED at cell 1 (ValueError)" in table
    assert "02_good.ipynb" in table and " ok" in table
    # The instructor's output is what matters: no kernel warnings, once per notebook.
    assert "without encryption" not in result.stderr + result.stdout
    assert "WARNING" not in result.stderr, result.stderr


def _links(page):
    import re

    return re.findall(r'(?:href|src)="([^"]+)"', page)


def test_index_is_the_course_map_and_every_link_resolves(tmp_path):
    labs = [_probe(tmp_path / "labs", "01_first.ipynb", "print(1)", topic="first topic"),
            _probe(tmp_path / "labs", "02_second.ipynb", "print(2)", topic="second topic")]
    slides = tmp_path / "slides"
    (slides / "figures").mkdir(parents=True)
    (slides / "01_first.html").write_text("<p>deck</p>")
    (slides / "01_first.pdf").write_bytes(b"%PDF-1.4")
    (slides / "figures" / "ring.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>')
    out = tmp_path / "course"
    assert course.main(["--quick", "--out", str(out), "--index", "--slides", str(slides), *map(str, labs)]) == 0
    page = (out / "index.html").read_text()
    assert "first topic" in page and "second topic" in page and "nothing" in page
    links = [link for link in _links(page) if not link.startswith("data:")]
    for expected in ("01_first.html", "01_first.ipynb", "02_second.html", "../slides/01_first.html",
                     "../slides/01_first.pdf", "../slides/figures/ring.svg"):
        assert expected in links, f"no link to {expected}"
    for link in links:
        assert (out / link).is_file(), f"index.html links to {link}, which does not exist"
    assert page.count("not built") == 2, "lab 02 has no deck and no PDF: both should say 'not built'"


def test_index_opens_in_chromium_without_console_error(tmp_path):
    import pytest

    sys.path.insert(0, str(ROOT))
    from slides.chromium import Browser, INSTALL_HINT, find_chromium

    if find_chromium() is None:
        pytest.skip(f"no Chromium for the browser test: {INSTALL_HINT}")
    lab = _probe(tmp_path / "labs", "01_first.ipynb", "print(1)")
    assert course.main(["--quick", "--out", str(tmp_path / "course"), "--index", str(lab)]) == 0
    with Browser() as browser:
        page = browser.new_page()
        page.goto((tmp_path / "course" / "index.html").as_uri())
        assert page.evaluate("document.querySelectorAll('table tr').length") == 2
        assert page.errors() == [] and page.failed_requests() == []

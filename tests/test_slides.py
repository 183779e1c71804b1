"""The lab decks: sources complete, every deck built offline, opened and printed in headless Chromium.

The decks are built once per session. The browser tests need Chromium (and pdfinfo for the page
count); `.ci/setup/20-browser.sh` installs both in CI, and elsewhere they skip saying how to enable them.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slides import build as slides  # noqa: E402
from slides.chromium import INSTALL_HINT, Browser, find_chromium  # noqa: E402

LABS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
NEEDS_CHROMIUM = pytest.mark.skipif(find_chromium() is None, reason=f"no Chromium for the browser tests: {INSTALL_HINT}")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Every deck built once (PDFs too where Chromium is installed): (output folder, deck infos)."""
    if not slides.REVEAL.exists() and shutil.which("npm") is None:
        pytest.skip("reveal.js is not installed and npm is missing: install node and npm "
                    "(`apt-get install nodejs npm`, or `bash .ci/setup/20-browser.sh` as root)")
    out = tmp_path_factory.mktemp("slides")
    return out, slides.build(out, pdf=find_chromium() is not None)


@pytest.fixture(scope="session")
def browser():
    if find_chromium() is None:
        pytest.skip(f"no Chromium for the browser tests: {INSTALL_HINT}")
    with Browser() as b:
        yield b


def test_one_deck_per_lab_and_one_for_the_assessment():
    names = [p.stem for p in slides.decks()]
    assert names == [p.stem for p in LABS] + ["assessment"]


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem[:2])
def test_every_exercise_of_the_lab_has_its_slide(lab):
    exercises = set(re.findall(r"^### (Exercise \d+\.\d+)", "\n".join(
        c.source for c in nbformat.read(lab, as_version=4).cells if c.cell_type == "markdown"), re.MULTILINE))
    deck = (ROOT / "slides" / f"{lab.stem}.md").read_text()
    titles = set(re.findall(r"^## (Exercise \d+\.\d+)", deck, re.MULTILINE))
    assert exercises, f"{lab.name} has no exercise headings"
    assert titles == exercises, f"exercises without a slide: {sorted(exercises - titles)}; " \
                                f"slides for no exercise: {sorted(titles - exercises)}"


@pytest.mark.parametrize("deck", slides.decks(), ids=lambda p: p.stem)
def test_source_has_notes_on_every_slide_objectives_and_summary(deck):
    assert slides.check_source(deck) == []
    text = deck.read_text()
    assert "## Summary" in text
    if deck.stem != "assessment":
        assert "## Objectives" in text


def test_source_check_names_the_slide_without_notes_and_the_unknown_figure(tmp_path, monkeypatch):
    deck = tmp_path / "99_probe.md"
    deck.write_text("# Probe\n\nNote:\nhello\n\n---\n\n## No notes here\n\n![x](figures/nowhere.svg)\n")
    assert slides.check_source(deck) == ["99_probe.md: slide 2 has no speaker notes (add a `Note:` line and notes)"]
    with pytest.raises(SystemExit, match="figure nowhere.svg is not drawn"):
        slides.write_deck(deck, tmp_path)


def test_decks_reference_only_local_files_that_exist(built):
    out, decks = built
    for deck in decks:
        page = deck["html"].read_text()
        for ref in re.findall(r'(?:src|href)="([^"]+)"', page):
            assert not re.match(r"[a-z]+://", ref), f"{deck['deck']} loads {ref} from outside the build folder"
            if not ref.startswith("data:"):
                assert (out / ref).is_file(), f"{deck['deck']} refers to {ref}, which was not built"
    for css in (out / "reveal").rglob("*.css"):
        assert "@import" not in css.read_text(), f"{css.name} imports a file (fonts from the internet?)"


@NEEDS_CHROMIUM
def test_every_deck_runs_offline_with_its_slides_and_notes(built, browser):
    from PIL import Image

    out, decks = built
    for deck in decks:
        page = browser.new_page()
        page.goto(deck["html"].as_uri())
        page.wait_for("window.Reveal && Reveal.isReady()")
        name = deck["deck"]
        assert page.evaluate("Reveal.getTotalSlides()") == deck["slides"], name
        assert page.evaluate("Reveal.hasPlugin('notes') && Reveal.hasPlugin('markdown')"), name
        notes = page.evaluate("Array.from(document.querySelectorAll('.slides > section'))"
                              ".map(s => (s.querySelector('aside.notes') || {textContent: ''}).textContent.trim().length)")
        assert len(notes) == deck["slides"] and all(notes), f"{name}: slides without speaker notes: " \
            f"{[i + 1 for i, n in enumerate(notes) if not n]}"
        page.wait_for("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        image = Image.open(io.BytesIO(page.screenshot())).convert("L")
        low, high = image.getextrema()
        assert high - low > 100, f"{name}: the first slide looks blank"
        outside = [u for u in page.requests() if not (u.startswith(out.as_uri()) or u.startswith("data:"))]
        assert outside == [], f"{name} requested files outside the build folder: {outside}"
        assert page.failed_requests() == [], name
        assert page.errors() == [], name
        page.send("Page.close")


@NEEDS_CHROMIUM
def test_speaker_view_shows_the_notes_and_a_timer(built, browser):
    out, decks = built
    deck = decks[0]
    page = browser.new_page()
    page.goto(deck["html"].as_uri())
    page.wait_for("window.Reveal && Reveal.isReady()")
    page.evaluate("Reveal.getPlugin('notes').open(); true", user_gesture=True)   # what the S key does
    page.wait(lambda: [w for w in browser.windows() if w["title"] == "reveal.js - Speaker View"], 20,
              "the speaker view did not open")
    window = next(w for w in browser.windows() if w["title"] == "reveal.js - Speaker View")
    speaker = browser.attach(window["targetId"])
    first_note = slides.notes_of(slides.split_slides(Path(ROOT / "slides" / f"{deck['deck']}.md").read_text())[0])
    # The speaker view fills its notes once the deck in its frame has reported the current slide.
    words = json.dumps(" ".join(first_note.split()[:8]))
    speaker.wait_for(f"((document.querySelector('.speaker-controls-notes') || {{}}).textContent || '')"
                     f".split(/\\s+/).join(' ').includes({words})", timeout=20)
    assert speaker.evaluate("!!document.querySelector('.speaker-controls-time .timer')"), "no timer"
    assert speaker.evaluate("document.querySelectorAll('iframe').length") == 2, "current and upcoming slide"
    browser.send("Target.closeTarget", {"targetId": window["targetId"]})
    page.send("Page.close")


@NEEDS_CHROMIUM
def test_a_request_outside_and_a_console_error_are_seen(built, browser):
    """The offline check above can fail: a page that fetches from elsewhere and logs an error."""
    out, _ = built
    probe = out / "probe.html"
    probe.write_text('<link rel="stylesheet" href="http://127.0.0.1:9/theme.css"><script>console.error("boom")</script>')
    page = browser.new_page()
    page.goto(probe.as_uri())
    assert "http://127.0.0.1:9/theme.css" in page.requests()
    assert page.failed_requests() and "boom" in " ".join(page.errors())
    page.send("Page.close")
    probe.unlink()


@NEEDS_CHROMIUM
def test_pdf_has_one_page_per_slide(built):
    if shutil.which("pdfinfo") is None:
        pytest.skip("pdfinfo is missing: `apt-get install poppler-utils` (or `bash .ci/setup/20-browser.sh` as root)")
    _, decks = built
    for deck in decks:
        info = subprocess.run(["pdfinfo", str(deck["pdf"])], capture_output=True, text=True, check=True).stdout
        pages = int(re.search(r"^Pages:\s+(\d+)", info, re.MULTILINE).group(1))
        assert pages == deck["slides"], f"{deck['pdf'].name}: {pages} pages for {deck['slides']} slides"


# The computations behind the decks' figures (utils.plotting).

@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_allreduce_diagram_ends_with_every_chunk_complete_on_every_rank(p):
    from utils.plotting import ring_allreduce_states

    steps = ring_allreduce_states(p)
    assert len(steps) == 1 + 2 * (p - 1)
    for phase, sends, state in steps[1:]:
        assert sorted(rank for rank, _ in sends) == list(range(p)), "each rank sends one chunk per step"
    after_reduce_scatter = steps[p - 1][2]
    assert all(sum(len(cell) == p for cell in row) == 1 for row in after_reduce_scatter), \
        "after reduce-scatter each rank owns exactly one complete chunk"
    assert all(cell == set(range(p)) for row in steps[-1][2] for cell in row)

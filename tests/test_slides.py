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
    wanted = [p.stem for p in LABS] + ["assessment"]
    assert names == wanted, f"decks missing: {sorted(set(wanted) - set(names))}; decks for no lab: " \
                            f"{sorted(set(names) - set(wanted))} (one slides/NN_topic.md per lab, see MAINTAINING.md)"


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


PROBE_AGENDA = "## Agenda\n\n| part | slides | time |\n| --- | --- | --- |\n| a | 1-2 | 2 min |\n| b | 3-3 | 3 min |\n| c | 4-4 | 1 min |\n\nNote:\n[1 min]\nplan\n"


def _probe(tmp_path, *slides_text, name="99_probe.md"):
    deck = tmp_path / name
    deck.write_text("\n---\n\n".join(slides_text))
    return deck


def test_source_check_names_the_slide_without_notes_and_the_unknown_figure(tmp_path):
    deck = _probe(tmp_path, "# Probe\n\nNote:\n[1 min]\nhello\n", PROBE_AGENDA,
                  "## No notes here\n\n![x](figures/nowhere.svg)\n![y](figures/lab99_nowhere.png)\n",
                  "## Last\n\nNote:\n[1 min]\nbye\n")
    assert slides.check_source(deck) == ["99_probe.md: slide 3 has no speaker notes (add a `Note:` line and notes)",
                                         "99_probe.md: the agenda adds up to 6 min but the slides' notes to 3 min; "
                                         "make them agree",
                                         "99_probe.md: the agenda gives slides 3-3 3 min, their notes 0 min"]
    with pytest.raises(SystemExit, match="figure lab99_nowhere.png is neither drawn") as refused:
        slides.write_deck(deck, tmp_path, known={})
    assert "figure nowhere.svg is neither drawn" in str(refused.value)


def test_source_check_wants_a_timed_agenda_and_minutes_on_every_slide(tmp_path):
    good = _probe(tmp_path, "# Probe\n\nNote:\n[1 min]\nhi\n", PROBE_AGENDA,
                  "## Three\n\nNote:\n[3 min]\nsay this\n", "## Four\n\nNote:\n[1 min]\nbye\n")
    assert slides.check_source(good) == []
    untimed = _probe(tmp_path, "# Probe\n\nNote:\n[1 min]\nhi\n", PROBE_AGENDA,
                     "## Three\n\nNote:\nsay this, $x^2$\n", "## Four\n\nNote:\n[1 min]\nbye\n")
    problems = slides.check_source(untimed)
    assert "99_probe.md: slide 3's notes do not start with its time, e.g. `[3 min]`" in problems
    assert any("slide 3's notes hold an equation" in p for p in problems)
    no_agenda = _probe(tmp_path, "# Probe\n\nNote:\n[1 min]\nhi\n", "## Plan\n\nNote:\n[1 min]\nx\n")
    assert any("slide 2 must be the timed agenda" in p for p in slides.check_source(no_agenda))


def test_source_check_refuses_solution_code_on_an_exercise_slide(tmp_path):
    """Lab 03's solution of 3.2 all-reduces the partial product and slices A by start:stop; a slide
    that shows either gives it away, whatever the names; naming the API does not."""
    head = ("# Probe\n\nNote:\n[1 min]\nhi\n", PROBE_AGENDA)
    tail = "## Four\n\nNote:\n[1 min]\nbye\n"
    for code in ("`dist.all_reduce(partial)`", "`A[:, lo:hi] @ B[lo:hi]`", "```python\nresult = A[:, a:b] @ B[a:b]\n```"):
        deck = _probe(tmp_path, *head, f"## Exercise 3.2: by reduction\n\n- {code}\n\nNote:\n[3 min]\nx\n", tail,
                      name="03_collectives.md")
        problems = slides.check_source(deck)
        assert len(problems) == 1 and "shows solution code" in problems[0], (code, problems)
    fine = _probe(tmp_path, *head, "## Exercise 3.2: by reduction\n\n- read `dist.all_reduce`, `chunk_bounds`\n\n"
                  "Note:\n[3 min]\nx\n", tail, name="03_collectives.md")
    assert slides.check_source(fine) == []
    # The same code on a slide that is not an exercise, or in a deck without a notebook, is allowed.
    elsewhere = _probe(tmp_path, *head, "## The idea\n\n- `dist.all_reduce(partial)`\n\nNote:\n[3 min]\nx\n", tail,
                       name="03_collectives.md")
    assert slides.check_source(elsewhere) == []


def test_every_recorded_value_a_deck_names_exists_and_an_unknown_one_is_refused(tmp_path):
    known = slides.values.values()
    for deck in slides.decks():
        slides.fill_values(deck.read_text(), known, deck.name)
    with pytest.raises(SystemExit, match="no recorded value named ab.nowhere"):
        slides.fill_values("{{ab.nowhere}}", known, "probe.md")
    assert slides.fill_values("alpha = {{ab.2core.alpha_us}}", known, "probe.md") == f"alpha = {known['ab.2core.alpha_us']}"


def test_equations_reach_katex_as_written():
    text = "a `$code$` b $a_1 * b_2$ and $$\\frac{x}{y_{i}}$$"
    assert slides.equations_of(text) == ["$a_1 * b_2$", "$$\\frac{x}{y_{i}}$$"]
    assert slides.protect_math(text) == "a `$code$` b $a\\_1 \\* b\\_2$ and $$\\\\frac\\{x\\}\\{y\\_\\{i\\}\\}$$"


@pytest.mark.parametrize("p", [3, 4, 5])
def test_collective_diagrams_compose_as_the_collectives_do(p):
    from slides.diagrams import collective

    before, reduced = collective("reduce_scatter", p)
    _, gathered = collective("all_gather", p)
    _, all_reduced = collective("all_reduce", p)
    assert [[row[r] for r in range(p)] for row in all_reduced] == [[reduced[r][r] for r in range(p)]] * p
    assert [set(filter(None, row)) for row in gathered] == [{f"{'abcdefgh'[c]}{c}" for c in range(p)}] * p
    _, transposed = collective("all_to_all", p)
    assert all(transposed[j][i] == before[i][j] for i in range(p) for j in range(p))


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
        page.wait_for("Array.from(document.images).every(i => i.complete)")
        broken = page.evaluate("Array.from(document.images).filter(i => !i.naturalWidth).map(i => i.src)")
        assert broken == [], f"{name}: figures that did not load: {broken}"
        # Every equation rendered by KaTeX, none left as TeX, none that KaTeX could not parse.
        page.wait_for(f"document.querySelectorAll('.slides .katex').length >= {deck['equations']}")
        assert page.evaluate("document.querySelectorAll('.slides .katex').length") == deck["equations"], name
        shown = page.evaluate("Array.from(document.querySelectorAll('.slides section')).map(s => {"
                              " const c = s.cloneNode(true); c.querySelectorAll('aside, code, .katex').forEach(e => e.remove());"
                              " return c.textContent; }).join(' ')")
        assert "$" not in shown, f"{name}: TeX left unrendered: {shown[shown.index('$') - 40:shown.index('$') + 40]!r}"
        source = slides.split_slides((ROOT / "slides" / f"{name}.md").read_text())
        pictured = [i + 1 for i, s in enumerate(source) if 'class="diagram' in s or "$$" in s]
        for number in (1, *pictured[:2]):
            page.evaluate(f"Reveal.slide({number - 1}, 0, 99); true")
            image = Image.open(io.BytesIO(page.screenshot())).convert("L")
            low, high = image.getextrema()
            dark = sum(image.histogram()[:128]) / (image.width * image.height)
            assert high - low > 100 and dark > 0.003, f"{name}: slide {number} looks blank"
        # Nothing wider than its slide: an equation that needs scrolling, a figure past the edge.
        for number in [i + 1 for i, s in enumerate(source) if slides.equations_of(slides.visible_of(s)) or "<img" in s]:
            page.evaluate(f"Reveal.slide({number - 1}, 0, 99); true")
            wide = page.evaluate(
                "(() => { const s = Reveal.getCurrentSlide(), w = s.getBoundingClientRect();"
                " return Array.from(s.querySelectorAll('.katex, img')).filter(e => !e.closest('aside')).filter(e =>"
                " (e.classList.contains('katex') && e.scrollWidth > e.clientWidth + 2)"
                " || e.getBoundingClientRect().right > w.right + 2).map(e => (e.textContent || e.src).slice(0, 60)); })()")
            assert wide == [], f"{name}: slide {number} is wider than the slide: {wide}"
        outside = [u for u in page.requests() if not (u.startswith(out.as_uri()) or u.startswith("data:"))]
        assert outside == [], f"{name} requested files outside the build folder: {outside}"
        assert page.failed_requests() == [], name
        assert page.errors() == [], name
        page.send("Page.close")


@NEEDS_CHROMIUM
def test_the_ring_steps_one_key_press_at_a_time(built, browser):
    """The ring all-reduce slide: each right-arrow press shows the next step's figure, 2(p-1) in all."""
    out, decks = built
    deck = next(d for d in decks if d["deck"] == "03_collectives")
    number = next(i for i, s in enumerate(slides.split_slides((ROOT / "slides" / "03_collectives.md").read_text()))
                  if "ring_step_1.svg" in s)
    page = browser.new_page()
    page.goto(deck["html"].as_uri())
    page.wait_for("window.Reveal && Reveal.isReady()")
    page.evaluate(f"Reveal.slide({number}, 0); true")
    shown = "Array.from(Reveal.getCurrentSlide().querySelectorAll('img')).filter(i => !i.classList.contains('fragment') " \
            "|| i.classList.contains('visible')).pop().getAttribute('src')"
    seen = [page.evaluate(shown)]
    for _ in range(6):
        for kind in ("keyDown", "keyUp"):
            page.send("Input.dispatchKeyEvent", {"type": kind, "key": "ArrowRight", "code": "ArrowRight",
                                                 "windowsVirtualKeyCode": 39})
        page.wait_for(f"Reveal.getIndices().f === {len(seen) - 1}")
        seen.append(page.evaluate(shown))
    assert seen == [f"figures/ring_step_{k}.svg" for k in range(7)]
    assert page.evaluate("Reveal.getIndices().h") == number, "the last step is still on the ring's slide"
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
def test_printing_refuses_an_equation_katex_cannot_render(built, tmp_path):
    out, _ = built
    for tex, problem in (("$$\\nosuchcommand{x}$$", "2 equations, but KaTeX rendered 1: .*nosuchcommand"),
                         ("$$\\frac{1}{2$$", "2 equations, but KaTeX rendered 1")):  # never closed: left as text
        deck = _probe(tmp_path, f"# Probe\n\n$x$ and {tex}\n\nNote:\n[1 min]\nhi\n", PROBE_AGENDA,
                      "## Three\n\nNote:\n[3 min]\nx\n", "## Four\n\nNote:\n[1 min]\nbye\n")
        info = slides.write_deck(deck, out, known={})
        try:
            with pytest.raises(SystemExit, match=f"99_probe.md: {problem}"):
                slides.print_pdfs([info], out, math_wait_s=2)
        finally:
            info["html"].unlink()


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

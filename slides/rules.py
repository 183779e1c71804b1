"""The rules a deck source must meet before it is built, and the reading of its parts.

A deck is Markdown: slides separated by a line holding only `---`, each slide's speaker notes after
its `Note:` line. `check_source` refuses what an instructor could not teach from: a slide without
notes, notes that do not start with the slide's time (`[N min]`), a missing or wrong timed agenda
(slide 2, `## Agenda`, its minutes adding up to the slides'), an equation in the notes (the speaker
view shows notes unrendered), and an `## Exercise` slide that shows code from the lab's solution
blocks (`### BEGIN SOLUTION` ... `### END SOLUTION` in the notebook the deck belongs to).
"""
from __future__ import annotations

import json
import keyword
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEPARATOR = re.compile(r"\r?\n---[ \t]*\r?\n")  # the same as data-separator in build.TEMPLATE


def split_slides(text: str) -> list[str]:
    """The slides of a deck source, as the markdown plugin splits them."""
    return SEPARATOR.split(text.strip("\n"))


def notes_of(slide: str) -> str:
    """A slide's speaker notes (after its `Note:` line), or ''."""
    parts = re.split(r"^Note:", slide, maxsplit=1, flags=re.MULTILINE)
    return parts[1].strip() if len(parts) == 2 else ""


MINUTES = re.compile(r"\[(\d+) min\]")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.DOTALL)
PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")   # every ASCII punctuation mark: markdown may read each one


def visible_of(slide: str) -> str:
    """What a slide shows: its text before the `Note:` line."""
    return re.split(r"^Note:", slide, maxsplit=1, flags=re.MULTILINE)[0]


def title_of(slide: str) -> str:
    return next((line.lstrip("#").strip() for line in slide.splitlines() if line.startswith("#")), "")


def minutes_of(slide: str) -> int | None:
    """The minutes a slide's notes give it (`[N min]` at their start), or None."""
    found = MINUTES.match(notes_of(slide))
    return int(found.group(1)) if found else None


def _outside_code(text: str, pattern: re.Pattern, replace=None):
    """``pattern``'s matches in ``text`` outside code spans and blocks; with ``replace``, the text
    with each match replaced by ``replace(match)``."""
    pieces, found, last = [], [], 0
    for code in CODE.finditer(text):
        pieces += [(text[last:code.start()], False), (code.group(0), True)]
        last = code.end()
    pieces.append((text[last:], False))
    out = []
    for piece, is_code in pieces:
        if not is_code:
            found += pattern.findall(piece)
            if replace:
                piece = pattern.sub(replace, piece)
        out.append(piece)
    return "".join(out) if replace else found


def equations_of(text: str) -> list[str]:
    """The TeX of every `$...$` and `$$...$$` outside code."""
    return _outside_code(text, MATH)


def protect_math(text: str) -> str:
    """The deck with a backslash before every punctuation mark inside its equations, so that the
    markdown plugin hands KaTeX the TeX as written (it would read `_` as emphasis, `\\` as an escape)."""
    def escape(match):
        tex = match.group(0)
        fence = "$$" if tex.startswith("$$") else "$"
        return fence + PUNCTUATION.sub(r"\\\1", tex[len(fence):-len(fence)]) + fence
    return _outside_code(text, MATH, escape)


def _tokens(code: str) -> list[str]:
    """Python tokens with local names and numbers abstracted (attribute names and modules kept), so
    `A[:, a:b]` and `A[:, start:stop]` compare equal."""
    code = re.sub(r"#.*", "", code)
    out = []
    for token in re.findall(r"[A-Za-z_]\w*|\d+(?:\.\d*)?|\S", code):
        if token[0].isdigit():
            token = "0"
        elif (token[0].isalpha() or token[0] == "_") and not keyword.iskeyword(token) \
                and token not in ("dist", "torch", "nn", "F", "np", "math") and not (out and out[-1] == "."):
            token = "N"
        out.append(token)
    return out


def solution_lines(stem: str) -> list[str]:
    """Each line of the solution blocks of the notebook a deck belongs to, as joined tokens."""
    notebook = ROOT / "assessment" / "assessment.ipynb" if stem == "assessment" else ROOT / "labs" / f"{stem}.ipynb"
    if not notebook.exists():
        return []
    lines, inside = [], False
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for line in source.splitlines():
            if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                inside = "BEGIN" in line
            elif inside and cell["cell_type"] == "code" and _tokens(line):
                lines.append(" " + " ".join(_tokens(line)) + " ")
    return lines


def solution_code_in(slide: str, solutions: list[str]) -> list[str]:
    """The code on a slide that comes from a solution: a piece of 8 or more tokens of a solution line,
    or a whole solution line of 5 or more tokens."""
    pieces = [line for block in re.findall(r"```[^\n]*\n(.*?)```", slide, re.DOTALL) for line in block.splitlines()]
    pieces += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", slide)
    found = []
    for piece in pieces:
        tokens = _tokens(piece)
        joined = " " + " ".join(tokens) + " "
        if (len(tokens) >= 8 and any(joined in line for line in solutions)) or \
                any(line in joined for line in solutions if line.count(" ") - 1 >= 5):
            found.append(piece.strip())
    return found


def check_source(path: Path) -> list[str]:
    """What is wrong with a deck source, in words (empty when nothing)."""
    problems = []
    text = path.read_text(encoding="utf-8")
    slides = split_slides(text)
    solutions = solution_lines(path.stem)
    for i, slide in enumerate(slides, 1):
        notes = notes_of(slide)
        if not slide.strip():
            problems.append(f"{path.name}: slide {i} is empty (two `---` lines in a row?)")
            continue
        if not notes:
            problems.append(f"{path.name}: slide {i} has no speaker notes (add a `Note:` line and notes)")
            continue
        if minutes_of(slide) is None:
            problems.append(f"{path.name}: slide {i}'s notes do not start with its time, e.g. `[3 min]`")
        if equations_of(notes):
            problems.append(f"{path.name}: slide {i}'s notes hold an equation ($...$); the speaker view "
                            "shows notes unrendered, so say it in words")
        if title_of(slide).startswith("Exercise"):
            for code in solution_code_in(visible_of(slide), solutions):
                problems.append(f"{path.name}: slide {i} ({title_of(slide)}) shows solution code `{code}`; "
                                "name the idea and the API instead")
    agenda = slides[1] if len(slides) > 1 else ""
    if title_of(agenda) != "Agenda":
        problems.append(f"{path.name}: slide 2 must be the timed agenda (`## Agenda`, one line per part with its minutes)")
    else:
        planned = [int(m) for m in re.findall(r"(\d+) min", visible_of(agenda))]
        given = sum(m for m in map(minutes_of, slides) if m is not None)
        if len(planned) < 3:
            problems.append(f"{path.name}: the agenda gives minutes for {len(planned)} parts; give each part its `N min`")
        elif sum(planned) != given:
            problems.append(f"{path.name}: the agenda adds up to {sum(planned)} min but the slides' notes to "
                            f"{given} min; make them agree")
        for first, last, minutes in re.findall(r"\|\s*(\d+)-(\d+)\s*\|\s*(\d+) min", visible_of(agenda)):
            part = sum(minutes_of(s) or 0 for s in slides[int(first) - 1:int(last)])
            if part != int(minutes):
                problems.append(f"{path.name}: the agenda gives slides {first}-{last} {minutes} min, their notes {part} min")
    if "</textarea" in text.lower():
        problems.append(f"{path.name}: the text `</textarea` would end the deck early; reword it")
    return problems

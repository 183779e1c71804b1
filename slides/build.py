"""Build every deck in slides/ into reveal.js HTML and a PDF, offline.

    python -m slides.build                       # every deck into build/slides/ (HTML + PDF)
    python -m slides.build --no-pdf 03_collectives

A deck is Markdown: slides are separated by a line holding only `---`, and everything after a line
starting `Note:` is that slide's speaker notes; `slides/rules.py` says what a deck must hold (a timed
agenda, timed notes on every slide, no solution code on an exercise slide) and the build refuses one
that breaks a rule. `{{name}}` puts in a number recorded in benchmarks/results/ (`slides/values.py`).
Figures are drawn here by `utils.plotting` from the recorded runs (the machine named on each), or as
diagrams by `slides/diagrams.py`, into build/slides/figures/; a lab's own figures are the images its
full-mode run drew (`figures/labNN_NAME.png`, recorded by benchmarks/lab_figures.py). reveal.js and KaTeX come from their npm
packages (slides/package.json, pinned by slides/package-lock.json) and are copied beside the decks,
so opening a deck fetches nothing. Equations are TeX between `$...$` (inline) or `$$...$$`
(display); reveal.js's math plugin renders them with KaTeX when the deck opens.
The PDF is headless Chromium printing the deck's print view (`?print-pdf`), one page per slide.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
from slides import values  # noqa: E402
from slides.rules import (check_source, equations_of, notes_of, protect_math, split_slides,  # noqa: E402,F401
                          visible_of)   # (notes_of and visible_of for the tests, which read decks through here)
from slides.values import fill_values  # noqa: E402

REVEAL = SLIDES / "node_modules" / "reveal.js"
KATEX = SLIDES / "node_modules" / "katex"
# The only reveal.js files a deck loads. The white theme embeds its fonts; the highlight plugin and
# most other themes fetch from the internet, so they are left out. The math plugin fetches KaTeX
# from a CDN unless its `local` option names a folder: it then loads <local>/dist/katex.min.css,
# katex.min.js and contrib/auto-render.min.js, and the CSS loads fonts/ beside it.
REVEAL_FILES = ("dist/reset.css", "dist/reveal.css", "dist/theme/white.css", "dist/reveal.js",
                "dist/plugin/markdown.js", "dist/plugin/notes.js", "dist/plugin/math.js")
KATEX_FILES = ("dist/katex.min.css", "dist/katex.min.js", "dist/contrib/auto-render.min.js", "dist/fonts")
FIGURE = re.compile(r"figures/([\w.-]+\.(?:svg|png))")

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="reveal/dist/reset.css">
<link rel="stylesheet" href="reveal/dist/reveal.css">
<link rel="stylesheet" href="reveal/dist/theme/white.css">
<style>
  .reveal {{ font-size: 30px; }}
  .reveal h1 {{ font-size: 1.9em; }} .reveal h2 {{ font-size: 1.35em; }}
  .reveal section img {{ width: 82%; max-height: 470px; object-fit: contain; margin: 0.2em auto; background: white; }}
  .reveal .r-stack img {{ max-height: 460px; }}
  .reveal ul, .reveal ol {{ display: block; }}
  .reveal small {{ color: #555; }}
  .reveal .katex-display {{ margin: 0.4em 0; }}
  .reveal table {{ font-size: 0.8em; }}
  .reveal section img.diagram {{ width: 88%; max-height: 480px; }}
  .reveal section img.run {{ width: 92%; max-height: 400px; }}  /* a lab's recorded figure under one line of text */
  .reveal .algorithm {{ text-align: left; font-size: 0.78em; border: 1px solid #999; padding: 0.4em 0.8em; background: #f7f7f7; }}
</style>
</head>
<body>
<div class="reveal"><div class="slides">
<section data-markdown data-separator="\\r?\\n---[ \\t]*\\r?\\n" data-separator-notes="^Note:"><textarea data-template>
{markdown}
</textarea></section>
</div></div>
<script src="reveal/dist/reveal.js"></script>
<script src="reveal/dist/plugin/markdown.js"></script>
<script src="reveal/dist/plugin/notes.js"></script>
<script src="reveal/dist/plugin/math.js"></script>
<script>
  Reveal.initialize({{
    hash: true, slideNumber: "c/t", transition: "none",
    pdfSeparateFragments: false, pdfMaxPagesPerSlide: 1,
    katex: {{ local: "katex" }},
    plugins: [RevealMarkdown, RevealNotes, RevealMath.KaTeX]
  }});
</script>
</body>
</html>
"""


def decks(names: list[str] | None = None) -> list[Path]:
    """The deck sources, in course order; ``names`` picks decks by file-name prefix."""
    found = sorted(SLIDES.glob("*.md"), key=lambda p: (p.stem == "assessment", p.stem))
    found = [p for p in found if p.name != "README.md"]
    if names:
        picked = [p for p in found if any(p.stem.startswith(n) for n in names)]
        if not picked:
            raise SystemExit(f"no deck matches {names}; decks: {', '.join(p.stem for p in found)}")
        return picked
    return found


_recorded, _machine = values.recorded, values.machine
def figures() -> dict:
    """{file name: function returning a Figure}: every figure the decks may show."""
    from slides import diagrams
    from utils import collectives, plotting

    def mlp():
        model = _recorded("ddp_xeon16.json")["settings"]["models"]["lab-01"]
        return plotting.plot_mlp([model["d_in"]] + [model["d_hidden"]] * (model["n_layers"] - 1)
                                 + [model["n_classes"]])

    def alpha_beta():
        result = _recorded("allreduce_overlap_xeon16.json")
        return plotting.plot_alpha_beta(result["rows"], _machine(result))

    def ddp_variants():
        result = _recorded("ddp_xeon16.json")
        return plotting.plot_ddp_variants(result["rows"], "larger", _machine(result))

    def speedup():
        # Predicted from the measured alpha and beta (gloo, 2 ranks) and the measured compute step
        # (the no-communication variant); measured: p x compute step / DDP step.
        allreduce, ddp = _recorded("allreduce_overlap_xeon16.json"), _recorded("ddp_xeon16.json")
        two = [r for r in allreduce["rows"] if r["world_size"] == 2]
        alpha, beta = collectives.fit_alpha_beta([r["n_bytes"] for r in two], [r["gloo_seconds"] for r in two],
                                                 world_size=2)   # the ring's model, as labs 03-06 fit it
        workers = list(range(1, 17))
        curves, measured = {}, {}
        for model in ("lab-01", "larger"):
            rows = {(r["world_size"], r["variant"]): r for r in ddp["rows"] if r["model"] == model}
            compute = rows[(2, "no-comm")]["median_step_ms"] / 1e3
            grad_bytes = rows[(2, "no-comm")]["grad_mib"] * 2 ** 20
            label = f"{model} ({rows[(2, 'no-comm')]['grad_mib']:.1f} MiB of gradients)"
            curves[label] = collectives.predicted_speedup(workers, compute, grad_bytes, alpha, beta)
            sizes = sorted({p for p, _ in rows})
            measured[label] = (sizes, [p * rows[(p, "no-comm")]["median_step_ms"] / rows[(p, "torch-ddp")]["median_step_ms"]
                                       for p in sizes])
        return plotting.plot_speedup(workers, curves, _machine(ddp), measured)

    def warmup():
        import torch

        from utils.optim import linear_warmup

        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.8)
        total, warm = 300, 50
        after = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - warm)
        scheduler = linear_warmup(optimizer, warm, start_factor=0.1, after=after)
        lrs = []
        for _ in range(total):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return plotting.plot_lr_schedule(lrs, warm, "utils.optim.linear_warmup: from lr/10 to lr, then cosine")

    def lab_times():
        return plotting.plot_lab_times(_recorded("lab_times.json")["labs"])

    def gpu_settings():
        from utils.labs import lab06

        run = lab06.recorded_gpu_runs(RESULTS)[-1]  # the newest recorded GPU run
        return plotting.plot_gpu_settings(run["rows"], _machine(run))

    def buckets(cap_mb):
        from utils.models import mlp_layer_shapes

        model = _recorded("ddp_xeon16.json")["settings"]["models"]["larger"]   # the recorded larger MLP (labs 04-05)
        shapes = mlp_layer_shapes(**model)[::-1]                                 # backward meets the last layer first
        return diagrams.draw_buckets([4 * fan_in * fan_out for fan_in, fan_out in shapes],
                                     [f"layer {len(shapes) - k - 1}" for k in range(len(shapes))], cap_mb=cap_mb)

    made = {"mlp.svg": mlp, "alpha_beta.svg": alpha_beta, "ddp_variants.svg": ddp_variants,
            "speedup.svg": speedup, "warmup.svg": warmup, "lab_times.svg": lab_times, "gpu_settings.svg": gpu_settings,
            "sync_points.svg": plotting.plot_sync_points, "bucket_overlap.svg": plotting.plot_bucket_overlap,
            "critical_batch.svg": plotting.plot_critical_batch, "local_sgd.svg": plotting.plot_local_sgd}
    for step in range(7):
        made[f"ring_step_{step}.svg"] = lambda step=step: plotting.plot_ring_allreduce_step(4, step)
    made["ddp_buckets_default.svg"] = lambda: buckets(None)
    made["ddp_buckets_5mib.svg"] = lambda: buckets(5)
    made.update(diagrams.diagrams())   # SVG written directly (text, not a Figure)
    return made


def draw_figures(out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    # Text as paths: the SVG needs no font on the machine that shows it. No date, so a rebuild is stable.
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "course"}):
        for name, draw in figures().items():
            fig = draw()
            if isinstance(fig, str):
                (out / name).write_text(fig, encoding="utf-8")
            else:
                fig.savefig(out / name, facecolor="white", metadata={"Date": None})
                plt.close(fig)
            written.append(out / name)
    return written


def recorded_figures() -> dict:
    """{file name: path}: the images recorded from the labs' full-mode runs (benchmarks/lab_figures.py)."""
    return {path.name: path for path in sorted((RESULTS / "figures").glob("lab*.png"))}


def reveal_version() -> str:
    return json.loads((REVEAL / "package.json").read_text())["version"]


def ensure_reveal() -> None:
    """reveal.js and KaTeX from npm as the lock file pins them, installed with `npm ci` when missing."""
    pinned = json.loads((SLIDES / "package-lock.json").read_text())["packages"]
    installed = [(folder, pinned[f"node_modules/{folder.name}"]["version"]) for folder in (REVEAL, KATEX)]
    if all((folder / "package.json").exists() and json.loads((folder / "package.json").read_text())["version"] == version
           for folder, version in installed):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("reveal.js is not installed and npm is missing: install node and npm "
                         "(`sudo apt-get install nodejs npm`, or `bash .ci/setup/20-browser.sh` as root), "
                         "then run `make slides` again")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SLIDES, check=True)


def write_deck(source: Path, out: Path, known: dict | None = None) -> dict:
    text = source.read_text(encoding="utf-8")
    problems = check_source(source)
    missing = sorted({name for name in FIGURE.findall(text) if name not in figures() and name not in recorded_figures()})
    problems += [f"{source.name}: figure {name} is neither drawn by slides/build.py's figures() nor recorded "
                 f"from a lab (benchmarks/lab_figures.py)" for name in missing]
    if problems:
        raise SystemExit("\n".join(problems))
    text = fill_values(text, values.values() if known is None else known, source.name)
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), source.stem)
    page = TEMPLATE.format(title=html.escape(title), markdown=html.escape(protect_math(text.strip("\n")), quote=False))
    target = out / f"{source.stem}.html"
    target.write_text(page, encoding="utf-8")
    return {"deck": source.stem, "title": title, "html": target, "slides": len(split_slides(text)),
            "equations": len(equations_of(text))}


def print_pdfs(built: list[dict], out: Path, math_wait_s: float = 10) -> None:
    sys.path.insert(0, str(ROOT))
    from slides.chromium import Browser, BrowserError

    with Browser() as browser:
        for deck in built:
            page = browser.new_page()
            page.goto(deck["html"].resolve().as_uri() + "?print-pdf")
            # Print once reveal.js has laid out one page per slide, every figure has loaded and the
            # math plugin has rendered every equation (TeX it cannot read stays raw, with a console error).
            page.wait_for(f"window.Reveal && Reveal.isReady() && "
                          f"document.querySelectorAll('.pdf-page').length === {deck['slides']} && "
                          f"Array.from(document.images).every(i => i.complete)")
            count = "document.querySelectorAll('.katex').length"
            try:   # an equation KaTeX cannot parse logs an error at once; an unclosed one is never found
                page.wait(lambda: page.evaluate(count) >= deck["equations"] or page.errors(), math_wait_s, "the equations")
            except BrowserError:
                pass
            if page.evaluate(count) < deck["equations"]:
                raise SystemExit(f"{deck['deck']}.md: {deck['equations']} equations, but KaTeX rendered "
                                 f"{page.evaluate(count)}: "
                                 f"{'; '.join(page.errors()) or 'look for unbalanced braces or a stray $'}")
            page.evaluate("document.fonts.ready.then(() => true)")
            deck["pdf"] = out / f"{deck['deck']}.pdf"
            deck["pdf"].write_bytes(page.pdf())
            page.send("Page.close")


def build(out: Path = ROOT / "build" / "slides", names: list[str] | None = None, pdf: bool = True) -> list[dict]:
    ensure_reveal()
    out.mkdir(parents=True, exist_ok=True)
    for name in REVEAL_FILES:
        (out / "reveal" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REVEAL / name, out / "reveal" / name)
    shutil.copy2(REVEAL / "LICENSE", out / "reveal" / "LICENSE")
    for name in KATEX_FILES:
        (out / "katex" / name).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (KATEX / name).is_dir() else shutil.copy2
        copy(KATEX / name, out / "katex" / name, **({"dirs_exist_ok": True} if copy is shutil.copytree else {}))
    shutil.copy2(KATEX / "LICENSE", out / "katex" / "LICENSE")
    draw_figures(out / "figures")
    for name, path in recorded_figures().items():
        shutil.copy2(path, out / "figures" / name)
    known = values.values()
    built = [write_deck(source, out, known) for source in decks(names)]
    if pdf:
        print_pdfs(built, out)
    return built


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("decks", nargs="*", help="deck names or prefixes (default: every deck)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "slides")
    parser.add_argument("--no-pdf", action="store_true", help="HTML only (no Chromium needed)")
    args = parser.parse_args(argv)
    if not args.no_pdf:
        from slides.chromium import INSTALL_HINT, find_chromium

        if find_chromium() is None:
            print(f"make slides prints the PDFs with headless Chromium, which is missing: {INSTALL_HINT}. "
                  "For the HTML decks alone: python -m slides.build --no-pdf", file=sys.stderr)
            return 1
    built = build(args.out, args.decks, pdf=not args.no_pdf)
    for deck in built:
        files = deck["html"].name + (f" + {deck['pdf'].name}" if "pdf" in deck else "")
        print(f"{deck['deck']:<24} {deck['slides']:>3} slides  {files}")
    print(f"reveal.js {reveal_version()}; open {args.out / built[0]['html'].name} in a browser "
          "(S: speaker view with notes and timer, Esc: overview)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

"""Measure how long each lab takes in quick and full mode, and write the README's course map.

    .venv/bin/python benchmarks/lab_times.py                 # every lab, both modes
    .venv/bin/python benchmarks/lab_times.py --modes quick   # quick mode only
    .venv/bin/python benchmarks/lab_times.py --labs 06       # only the labs whose names start so
                                                             # (the others keep their recorded times)

Each notebook runs headless in a fresh process (python -m tooling.course). The minutes go to
benchmarks/results/lab_times.json with the machine's description, and the table between the
course-map markers in README.md is rewritten from that file (tests check they agree). A full-mode run
also records the figures the lab's deck shows (benchmarks/lab_figures.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import lab_figures  # noqa: E402
import machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "lab_times.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- course-map:begin -->", "<!-- course-map:end -->"


def time_notebook(path: Path, quick: bool) -> float:
    """Seconds the notebook takes headless; a full-mode run also records the figures its deck shows."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "tooling.course", "--no-html", "--out", out, str(path)]
        env = dict(os.environ, COURSE_QUICK="1" if quick else "0")
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"{path.name} failed in {'quick' if quick else 'full'} mode:\n{result.stderr}")
        if not quick:
            import nbformat

            executed = nbformat.read(Path(out) / f"{path.stem}.ipynb", as_version=4)
            for figure in lab_figures.record(executed, path.name, machine.one_line(), time.strftime("%Y-%m-%d")):
                print(f"{path.name}: recorded {figure.relative_to(ROOT)}", flush=True)
    return seconds


def course_map_table(results: dict) -> str:
    lines = ["| Lab | Topic | Based on | Quick mode (min) | Full mode (min) |",
             "| --- | --- | --- | ---: | ---: |"]
    for lab in results["labs"]:
        minutes = lambda mode: f"{lab[mode] / 60:.1f}" if lab.get(mode) is not None else "not measured"
        lines.append(f"| [{lab['notebook']}](labs/{lab['notebook']}) | {lab['topic']} | {lab['based_on']} "
                     f"| {minutes('quick_s')} | {minutes('full_s')} |")
    lines.append("")
    machines: dict[str, list[str]] = {}              # labs measured at different times may differ
    for lab in results["labs"]:
        where = f"{lab.get('machine', results['machine'])} ({lab.get('date', results['date'])})"
        machines.setdefault(where, []).append(lab["notebook"][:2])
    if len(machines) == 1:
        lines.append(f"Measured on {next(iter(machines))} by `benchmarks/lab_times.py`.")
    else:
        lines.append("Measured by `benchmarks/lab_times.py` on " + "; ".join(
            f"{where}: labs {', '.join(labs)}" for where, labs in machines.items()) + ".")
    return "\n".join(lines)


def write_readme_table(results: dict) -> None:
    text = README.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{course_map_table(results)}\n{END}{tail}")


def lab_facts(path: Path) -> dict:
    """Topic and sources from the notebook's metadata (``course`` key)."""
    import nbformat

    meta = nbformat.read(path, as_version=4).metadata.get("course", {})
    return {"notebook": path.name, "topic": meta.get("topic", ""), "based_on": meta.get("based_on", "")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", choices=["quick", "full"], default=["quick", "full"])
    parser.add_argument("--labs", nargs="+", default=None, metavar="NN",
                        help="measure only these labs (name prefixes); the others keep their recorded times")
    parser.add_argument("--readme-only", action="store_true", help="rewrite the README table from the JSON file")
    args = parser.parse_args(argv)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"labs": []}
    if not args.readme_only:
        old = {lab["notebook"]: lab for lab in previous["labs"]}
        labs = []
        for path in sorted((ROOT / "labs").glob("*.ipynb")):
            lab = {**old.get(path.name, {}), **lab_facts(path)}
            chosen = args.labs is None or any(path.name.startswith(prefix) for prefix in args.labs)
            for mode in args.modes if chosen else []:
                lab[f"{mode}_s"] = round(time_notebook(path, quick=(mode == "quick")), 1)
                lab["machine"], lab["date"] = machine.one_line(), time.strftime("%Y-%m-%d")
                print(f"{path.name}: {mode} mode {lab[f'{mode}_s']:.1f} s", flush=True)
            labs.append(lab)
        previous = {"machine": machine.one_line(), "date": time.strftime("%Y-%m-%d"), "labs": labs}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(previous, indent=2) + "\n")
    write_readme_table(previous)
    print(course_map_table(previous))


if __name__ == "__main__":
    main()

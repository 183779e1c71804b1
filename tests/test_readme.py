"""The README's course map is generated from measured lab times, and names every lab."""
from __future__ import annotations

import json
import re
import sys

from notebook_runner import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import lab_times  # noqa: E402


def test_course_map_matches_measurements_and_lists_every_lab():
    results = json.loads(lab_times.RESULTS.read_text())
    readme = (ROOT / "README.md").read_text()
    table = readme.split(lab_times.BEGIN, 1)[1].split(lab_times.END, 1)[0].strip()
    assert table == lab_times.course_map_table(results), \
        "the course map in README.md was edited by hand; run benchmarks/lab_times.py to regenerate it"
    measured = {lab["notebook"] for lab in results["labs"]}
    labs = {p.name for p in (ROOT / "labs").glob("*.ipynb")}
    assert labs <= measured, f"labs without measured times: {sorted(labs - measured)}"
    for lab in results["labs"]:
        assert lab["topic"] and lab["based_on"], f"{lab['notebook']}: set metadata.course.topic/based_on"


def test_quick_start_is_two_commands_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^(make \w+)\s*$", quick_start, re.M)
    assert commands == ["make lab", "make test"], commands
    assert "make test" in (ROOT / ".ci" / "run").read_text()

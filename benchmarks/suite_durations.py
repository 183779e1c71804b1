"""The test suite's time, per file and for its slowest tests, from a pytest JUnit XML report.

    .venv/bin/python -m pytest --junitxml=build/junit.xml        # (make test PYTEST_ARGS=--junitxml=...)
    .venv/bin/python benchmarks/suite_durations.py build/junit.xml --note "what else ran" --out benchmarks/results/suite_durations_2core.json

Records where the suite's minutes go, so that trimming it starts from numbers (CI allows 90 minutes
on a 2-core machine). Never a pass/fail test: the times depend on the machine and its load, which
the file names (``--note`` says what else ran beside it).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine  # noqa: E402


def summary(report: Path, slowest: int = 40) -> dict:
    cases = [(float(c.get("time") or 0), c.get("classname", ""), c.get("name", ""))
             for c in ET.parse(report).iter("testcase")]
    files = collections.Counter()
    for seconds, module, _ in cases:
        files[module.rsplit(".", 1)[-1]] += seconds
    return {"tests": len(cases), "total_s": round(sum(s for s, _, _ in cases)),
            "files_s": {name: round(s) for name, s in files.most_common()},
            "slowest_s": [[f"{module.rsplit('.', 1)[-1]}::{name}", round(s, 1)]
                          for s, module, name in sorted(cases, reverse=True)[:slowest]]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("report", type=Path, help="pytest's --junitxml file")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    info = machine.describe()
    info.pop("load_average")   # this script runs after the suite: the load during it is the note's to say
    result = {"machine": info, "note": options.note, **summary(options.report)}
    options.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['tests']} tests, {result['total_s'] / 60:.0f} min; slowest files: "
          + ", ".join(f"{k} {v} s" for k, v in list(result["files_s"].items())[:5]))


if __name__ == "__main__":
    main()

"""Labs 06 and 08 as an 8-core laptop runs them (COURSE_CORES=8, oversubscribed on this machine); lab 07 runs so
in tests/test_notebooks.py, as its only quick-mode run there.

The labs pick their worker counts from utils.config.cores(); here they pick what a learner's 8-core
laptop picks. The workers take turns on the real cores, so times mean nothing, but every accuracy
and every verdict is what that laptop computes: each verdict the lab printed through
utils.outcomes must follow from its own numbers (tests/library/verdict_rules.py), and every check passes.
"""
from __future__ import annotations

import pytest

from notebook_runner import ROOT, exercise_cells, run_notebook
from verdict_rules import contradictions, verdicts

LEARNER_CORES = 8
SCALED_LABS = ["06_realistic_model.ipynb", "08_beyond_sync_sgd.ipynb"]   # lab 07: tests/test_notebooks.py, CORES_FOR


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


@pytest.mark.parametrize("name", SCALED_LABS)
def test_lab_at_eight_cores_prints_only_verdicts_its_numbers_bear_out(name, tmp_path):
    record = tmp_path / "verdicts.jsonl"
    result, nb = run_notebook(ROOT / "labs" / name, tmp_path, timeout=900,
                              env={"COURSE_CORES": str(LEARNER_CORES), "COURSE_VERDICTS": str(record)})
    assert result.returncode == 0, f"{name} failed at COURSE_CORES={LEARNER_CORES}:\n{result.stderr}\n{result.stdout}"
    for _, check in exercise_cells(nb):
        printed = "".join(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
                          for o in nb.cells[check].outputs if o.output_type in ("stream", "display_data"))
        assert "passed" in printed, f"{name}: check cell {check} did not pass at {LEARNER_CORES} cores:\n{printed}"
    assert verdicts(record), f"{name} printed no verdict through utils.outcomes at {LEARNER_CORES} cores"
    wrong = contradictions(record)
    assert not wrong, f"{name} at {LEARNER_CORES} cores:\n" + "\n".join(wrong)

"""Lab 05's bucket-size sweep: its verdicts come from utils.outcomes and follow the rounds' numbers."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

from utils.labs import lab05  # noqa: E402
from verdict_rules import contradictions  # noqa: E402

CAPS = [0.1, 1.0, 25.0]
MINE, TORCHS = "yours (MyBucketedDDP)", "torch DDP"


def rounds(mine, torchs, flat=(0.010, 0.011)):
    return {MINE: mine, TORCHS: torchs, "no communication": [[0.004, 0.0041]], "naive": [[0.02, 0.021]],
            "flat": [list(flat)], "overlap": [[0.012, 0.013]]}


def test_each_bucket_size_is_judged_against_the_rounds_spread(monkeypatch, tmp_path):
    record = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(record))
    sweep = rounds(mine=[[0.0100, 0.0102], [0.0090, 0.0120], [0.0200, 0.0201]],
                   torchs=[[0.0080, 0.0081], [0.0095, 0.0100], [0.0150, 0.0151]])
    lines = lab05.say_bucket_sweep(CAPS, sweep, [MINE, TORCHS])
    assert "0.1: yours (MyBucketedDDP) against torch DDP: slower, beyond" in lines[0]
    assert "1: yours (MyBucketedDDP) against torch DDP: within the rounds' spread" in lines[1]
    assert "25: yours (MyBucketedDDP) against torch DDP: slower" in lines[2]
    # the fastest bucketed point (torch DDP at 0.1 MiB, 8.05 ms) against the flat wrapper's 10.5 ms
    assert "(torch DDP at bucket_cap_mb 0.1) against the flat wrapper's: faster, beyond" in lines[3]
    written = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(written) == 4 and not contradictions(record)


def test_one_round_is_not_judged_and_the_figure_draws_every_wrapper():
    sweep = {name: [[r[0]] for r in runs] for name, runs in rounds(
        mine=[[0.01], [0.02], [0.03]], torchs=[[0.01], [0.02], [0.03]]).items()}
    lines = lab05.say_bucket_sweep(CAPS, sweep, [MINE, TORCHS])
    assert all("not judged" in line for line in lines), lines
    predicted = {cap: {"yours": (3, 0.002), "torch DDP": (2, 0.0015)} for cap in CAPS}
    fig = lab05.plot_bucket_sweep(CAPS, rounds([[0.01, 0.011]] * 3, [[0.009, 0.01]] * 3), [MINE, TORCHS], predicted, "t")
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert {f"{MINE}: measured", f"{TORCHS}: measured", "flat", "naive", "no communication"} <= set(labels), labels

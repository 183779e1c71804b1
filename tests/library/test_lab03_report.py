"""utils.labs.lab03: lab 03's findings are decided by the numbers, and noise is not a finding."""
from __future__ import annotations

import pytest

from utils import collectives
from utils.labs import lab03 as report_module
from utils.labs.lab03 import GLOO, PING_PONG, REFERENCE, YOURS

SIZES = [1024, 4096, 16384, 65536]
P = 3


def _rows(seconds):
    return [dict(n_bytes=n, seconds=t, algbw=collectives.algorithm_bandwidth(n, t),
                 busbw=collectives.bus_bandwidth(n, t, P)) for n, t in zip(SIZES, seconds)]


def _round(scale=1.0, yours=None):
    alpha, beta = 50e-6, 1e-9
    model = [collectives.ring_all_reduce_seconds(n, P, alpha, beta) for n in SIZES]
    measured = {GLOO: _rows([t * scale for t in model]),
                REFERENCE: _rows([t * 2 * scale for t in model]),
                PING_PONG: _rows([2 * (alpha + beta * n) for n in SIZES])}
    if yours is not None:
        measured[YOURS] = _rows([t * yours * scale for t in model])
    return measured


def _findings(rounds, capsys):
    report = report_module.summarise(rounds, P)
    capsys.readouterr()
    return report, report_module.findings(report)


def test_quiet_rounds_give_verdicts(capsys):
    report, lines = _findings([_round(0.99, yours=4.0), _round(1.01, yours=4.0)], capsys)
    assert report["alpha"] == pytest.approx(50e-6, rel=1e-2)  # the ping-pong's link, recovered
    assert "differed by up to 2%" in lines[0]
    assert "latency, not bytes, sets the time" in lines[1]
    assert "as the model says" in lines[2]   # gloo equals the ring model here
    assert any(f"{REFERENCE} took 2.00x gloo's time: slower" in line for line in lines)
    assert any(f"{YOURS} took 4.00x gloo's time: slower" in line for line in lines)
    assert "reference ring took 0.50x the time of yours: faster" in lines[-1]
    assert "nothing to pipeline" in lines[-1]  # 64 KiB on 3 ranks: one piece per chunk


def test_noisy_rounds_call_differences_noise(capsys):
    _, lines = _findings([_round(yours=1.5), _round(3.0, yours=1.5)], capsys)
    assert "differed by up to 200%" in lines[0]
    assert any(f"{REFERENCE} took 2.00x gloo's time: within the rounds' spread: noise" in line for line in lines)
    assert "within the rounds' spread: noise" in lines[-1]


def test_best_of_takes_the_faster_round():
    slow, fast = _round(2.0), _round(1.0)
    best = report_module.best_of([slow, fast])
    assert [r["seconds"] for r in best[GLOO]] == [r["seconds"] for r in fast[GLOO]]
    assert report_module.spread([slow, fast])[GLOO] == pytest.approx([1.0] * len(SIZES))


def test_without_the_learners_ring_no_comparison_with_it(capsys):
    _, lines = _findings([_round(), _round()], capsys)
    assert not any(YOURS in line for line in lines)


def test_every_verdict_goes_through_outcomes_and_its_rule_agrees(capsys, tmp_path, monkeypatch):
    """Each comparison is recorded for the suite's verdict rules, which re-derive it from the rounds' times."""
    from verdict_rules import contradictions, verdicts

    monkeypatch.setenv("COURSE_VERDICTS", str(tmp_path / "verdicts.jsonl"))
    for rounds in ([_round(0.99, yours=4.0), _round(1.01, yours=4.0)], [_round(1.2, yours=1.5), _round(3.0, yours=1.5)]):
        report = report_module.summarise(rounds, P)
        report_module.print_findings(report)
    recorded = verdicts(tmp_path / "verdicts.jsonl")
    assert len(recorded) == 2 * (1 + 2 * 2 + 1)   # the model, 2 rings at 2 sizes, the reference against yours
    assert [v["conclusion"] for v in recorded[:6]] == ["within the spread", "higher", "higher", "higher", "higher", "lower"]
    assert [v["conclusion"] for v in recorded[6:]] == ["higher"] + ["within the spread"] * 5
    assert not contradictions(tmp_path / "verdicts.jsonl")

"""The verdict helpers and the suite's own rules agree, and a contradicted verdict is caught."""
import json

from utils import outcomes
from verdict_rules import contradictions


def _recorded(tmp_path, monkeypatch, call):
    path = tmp_path / "v.jsonl"
    monkeypatch.setenv("COURSE_VERDICTS", str(path))
    call()
    return path


def test_compare_within_and_beyond_the_spread(tmp_path, monkeypatch):
    path = _recorded(tmp_path, monkeypatch, lambda: [
        outcomes.compare("a", [0.90, 0.92], "b", [0.50, 0.52]),
        outcomes.compare("a", [0.90, 0.92], "b", [0.89, 0.93]),
        outcomes.compare("a", [0.9], "b", [0.5])])
    assert [json.loads(line)["conclusion"] for line in path.read_text().splitlines()] == \
        ["higher", "within the spread", "not judged"]
    assert contradictions(path) == []


def test_first_to_target_needs_a_gap_beyond_the_resolution(tmp_path, monkeypatch):
    close = {"P = 1": [8.3, 8.4], "K = 16": [9.1, 9.0]}
    clear = {"P = 1": [8.3, 8.4], "K = 16": [19.1, 19.0], "sync": [None, 4.0]}
    path = _recorded(tmp_path, monkeypatch, lambda: [
        outcomes.first_to_target(close, resolution=2.0), outcomes.first_to_target(clear, resolution=2.0)])
    assert [json.loads(line)["conclusion"] for line in path.read_text().splitlines()] == [None, "P = 1"]
    assert contradictions(path) == []


def test_first_to_target_names_no_winner_from_one_seed(tmp_path, monkeypatch):
    one = {"P = 1": [8.3], "K = 16": [19.1]}
    path = _recorded(tmp_path, monkeypatch, lambda: [outcomes.first_to_target(one, resolution=2.0)])
    verdict = json.loads(path.read_text())
    assert verdict["conclusion"] is None and "one seed" in verdict["text"]
    assert contradictions(path) == []


def test_a_verdict_its_numbers_contradict_is_caught(tmp_path):
    path = tmp_path / "v.jsonl"
    forged = [dict(kind="first_to_target", conclusion="P = 1", text="first: P = 1",
                   numbers=dict(resolution=2.0, seconds={"P = 1": [8.3], "K = 16": [9.1]})),
              dict(kind="compare", conclusion="higher", text="K = 1 beats P = 1",
                   numbers=dict(a=[0.1, 0.1], b=[0.9, 0.9], margin=0.0)),
              dict(kind="best", conclusion="K = 1", text="best: K = 1",
                   numbers=dict(higher_is_better=True, values={"K = 1": [0.1, 0.12], "K = 16": [0.9, 0.91]}))]
    path.write_text("".join(json.dumps(v) + "\n" for v in forged))
    assert len(contradictions(path)) == 3


def test_best_names_none_within_the_spread(tmp_path, monkeypatch):
    path = _recorded(tmp_path, monkeypatch, lambda: [
        outcomes.best({"x": [0.9, 0.91], "y": [0.5, 0.52]}), outcomes.best({"x": [0.9, 0.95], "y": [0.92, 0.93]}),
        outcomes.best({"x": [3.0, 3.1], "y": [5.0, 5.2]}, higher_is_better=False)])
    assert [json.loads(line)["conclusion"] for line in path.read_text().splitlines()] == ["x", None, "x"]
    assert contradictions(path) == []

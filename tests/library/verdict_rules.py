"""Independent rules for the verdicts labs print through utils.outcomes (one JSON line each).

Each rule re-derives the conclusion from the recorded numbers in its own words, so a lab whose
sentence contradicts its numbers fails here, whatever the library's own logic says.
"""
from __future__ import annotations

import json
from pathlib import Path


def _mean(values):
    return sum(values) / len(values)


def _half_range(values):
    return (max(values) - min(values)) / 2


def _compare(numbers, conclusion):
    a, b, margin = numbers["a"], numbers["b"], numbers["margin"]
    gap = _mean(a) - _mean(b)
    if conclusion == "not judged":
        return len(a) < 2 and len(b) < 2 and margin == 0
    beyond = abs(gap) > _half_range(a) + _half_range(b) + margin
    return {"within the spread": not beyond, "higher": beyond and gap > 0, "lower": beyond and gap < 0}[conclusion]


def _first_to_target(numbers, conclusion):
    every = {m: t for m, t in numbers["seconds"].items() if t and None not in t}
    if conclusion is None:
        # no winner: no method that reached the target on every seed beats all others clearly
        return not any(len(t) >= 2 and all(_mean(every[o]) - _mean(t) > _half_range(t) + _half_range(every[o])
                                           + numbers["resolution"] for o in every if o != m) for m, t in every.items())
    if conclusion not in every or len(every[conclusion]) < 2:   # one run has no spread: no winner from it
        return False
    mine = every[conclusion]
    return all(_mean(t) - _mean(mine) > _half_range(t) + _half_range(mine) + numbers["resolution"]
               for m, t in every.items() if m != conclusion)


def _best(numbers, conclusion):
    values, sign = numbers["values"], 1 if numbers["higher_is_better"] else -1
    if conclusion is None:
        ranked = sorted(values, key=lambda m: sign * _mean(values[m]), reverse=True)
        return len(ranked) < 2 or all(len(values[m]) < 2 for m in ranked[:2]) or \
            abs(_mean(values[ranked[0]]) - _mean(values[ranked[1]])) <= _half_range(values[ranked[0]]) + _half_range(values[ranked[1]])
    mine = values[conclusion]
    return all(sign * (_mean(mine) - _mean(v)) > _half_range(mine) + _half_range(v)
               for m, v in values.items() if m != conclusion)


RULES = {"compare": _compare, "first_to_target": _first_to_target, "best": _best}


def contradictions(path: Path) -> list[str]:
    """Every recorded verdict whose conclusion its own numbers do not bear out, as readable lines."""
    wrong = []
    for line in path.read_text().splitlines() if path.exists() else []:
        verdict = json.loads(line)
        rule = RULES.get(verdict["kind"])
        if rule is None:
            wrong.append(f"unknown verdict kind {verdict['kind']!r}: {verdict['text']}")
        elif not rule(verdict["numbers"], verdict["conclusion"]):
            wrong.append(f"{verdict['text']!r} does not follow from {verdict['numbers']}")
    return wrong


def verdicts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

"""Shared by the tests of the exercise checks."""
from __future__ import annotations

import pytest


def stub(*args):
    """What an unsolved exercise does in the learner edition."""
    raise NotImplementedError


def fails(check, solution, kind) -> str:
    """Run ``check(solution)``, expect exactly ``kind``, return its message."""
    with pytest.raises(kind) as info:
        check(solution)
    assert type(info.value) is kind
    return str(info.value)

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


def edited_script(text: str, path, *replacements):
    """Write ``text`` with each (old, new) replaced to ``path`` and return it; ``old`` must be there, so a
    test whose wrong answer no longer applies to the course's script fails instead of passing vacuously."""
    for old, new in replacements:
        assert old in text, f"the course's script no longer contains {old!r}: update this test"
        text = text.replace(old, new)
    path.write_text(text)
    return path

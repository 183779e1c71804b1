"""Exercise checks: each one runs the learner's code and says plainly what is wrong.

A check cell looks like ``lab01.check_forward(forward)``. It prints a tick when the
exercise is solved; otherwise it raises an ``ExerciseError`` whose notebook display is
the message alone (IPython's ``_render_traceback_`` hook), plus the learner's own
traceback when their code crashed, never a wall of frames from inside this package.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)


class ExerciseError(AssertionError):
    """An exercise is not solved yet, or its answer is wrong."""

    def _render_traceback_(self) -> list[str]:
        lines = [f"\u2717 {self}"]
        cause = self.__cause__
        if cause is not None:
            frames = [f for f in traceback.extract_tb(cause.__traceback__) if not f.filename.startswith(_HERE)]
            lines += ["", "Your code raised this (innermost call last):"]
            lines += [line.rstrip("\n") for line in traceback.format_list(frames)]
            lines += traceback.format_exception_only(type(cause), cause)
        return lines


class NotSolved(ExerciseError):
    """The exercise still holds its stub (it raised NotImplementedError)."""


class Incorrect(ExerciseError):
    """The exercise runs but gives a wrong answer, or crashes."""


def _is_stub(error: NotImplementedError) -> bool:
    """True when the error comes from a ``raise NotImplementedError`` line, as the exercise stubs do."""
    frames = traceback.extract_tb(error.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return not line or line.startswith("raise NotImplementedError")


@contextmanager
def exercise(name: str):
    """Run a check of exercise ``name``, turning every failure into a clear ExerciseError."""
    try:
        yield
    except ExerciseError:
        raise
    except NotImplementedError as stub:
        if not _is_stub(stub):  # raised inside a library, e.g. a CUDA kernel missing for a dtype: a crash
            raise Incorrect(f"{name}: your code raised NotImplementedError: {stub}") from stub
        hint = str(stub).strip()
        raise NotSolved(f"{name} is not solved yet: replace the `raise NotImplementedError` in the "
                        f"exercise cell with your code, run that cell, then this one."
                        + (f"\n  {hint}" if hint else "")) from None
    except Exception as error:
        raise Incorrect(f"{name}: your code raised {type(error).__name__}: {error}") from error
    print(f"\u2713 {name}: passed")


def expect(condition: bool, message: str) -> None:
    """Fail the current exercise with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Incorrect(message)


def hint_for(hints: dict[str, str]):
    """A lab module's ``hint(name)``: prints the step-by-step hint of exercise ``name`` (e.g. ``"3.2"``)."""
    def hint(name: str) -> None:
        """Print the step-by-step hint of exercise ``name`` (e.g. ``"1.3"``)."""
        show_hint(hints, name)

    return hint


def show_hint(hints: dict[str, str], name: str) -> None:
    """Print the step-by-step hint of exercise ``name`` from a lab's ``HINTS``.

    Step-by-step hints live in the check modules, never in the notebooks' cells, so the learner
    edition shows only the stub's pointer to the idea until the learner asks for more.
    """
    if name not in hints:
        raise ValueError(f"no step-by-step hint for {name!r}; there is one for: {', '.join(hints)}")
    print(hints[name])


def __getattr__(name):
    from utils import moved   # the job check of an earlier release: name its new home
    return moved.package_getattr(__name__, name)

"""Runs the grader's judging of one submission in a child process with its own time and memory limits.

Everything a submission controls reaches parsers and regular expressions: the notebook it handed in,
the executed notebook, records, outputs and checkpoints its sandboxes returned. None of it is read in
the grader's own process, where one pathological text (a regular expression that backtracks for
hours holds the interpreter lock and stops every grading thread) or one huge record would cost the
whole batch. Each step runs here instead, in ``python -I`` with the address space capped
(``MEMORY_BYTES`` beyond what the interpreter and torch map) and killed after ``seconds``; the
submission then gets a zero row saying which limit it hit, and the batch goes on.

    call(step, *args, seconds=..., memory_bytes=...) -> the step's result (JSON values only)

The steps are named in ``STEPS``; their arguments and results are JSON, so nothing the child returns
is unpickled in the grader.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SECONDS = 300                  # one judging step, wall clock (the correct solution's takes a few seconds)
MEMORY_BYTES = 2 << 30         # address space beyond the interpreter's with torch imported
ANSWER_BYTES = 1 << 20         # the most the grader reads of a step's answer


class JudgingError(RuntimeError):
    """A judging step could not finish; the message says which limit it hit, for the learner's row."""


class Cancelled(Exception):
    """The step's answer was no longer wanted (``cancel`` was set): its child was stopped."""


def call(step: str, *args, seconds: float = SECONDS, memory_bytes: int = MEMORY_BYTES,
         cancel: threading.Event | None = None):
    """Run ``STEPS[step](*args)`` in a limited child process and return its (JSON) result. Setting ``cancel``
    (from another thread) stops the child within a second and raises ``Cancelled``."""
    from utils.config import COURSE_ROOT
    if cancel is not None and cancel.is_set():
        raise Cancelled(step)
    request = json.dumps({"step": step, "args": args, "memory_bytes": int(memory_bytes)})
    # -I: neither the current folder nor PYTHONPATH decides what is imported; the course root is put first.
    bootstrap = f"import sys; sys.path.insert(0, {str(COURSE_ROOT)!r}); from assessment.grader.judging import _child; _child()"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    process = subprocess.Popen([sys.executable, "-I", "-c", bootstrap], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    deadline, given = time.monotonic() + seconds, request.encode()
    while True:
        try:
            # communicate may be called again after a timeout without losing output; the input goes once
            stdout, stderr = process.communicate(given, timeout=max(0.01, min(1.0, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            given = None
            late, cancelled = time.monotonic() >= deadline, cancel is not None and cancel.is_set()
            if late or cancelled:
                process.kill()
                process.communicate()
                if cancelled:
                    raise Cancelled(step) from None
                raise JudgingError(f"judging took longer than {seconds:g} s and was stopped ({step})") from None
    child = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if child.returncode < 0:
        if child.returncode == -signal.SIGKILL:
            raise JudgingError(f"judging was killed, most likely over its memory limit of {memory_bytes >> 20} MiB "
                               f"({step})")
        raise JudgingError(f"judging crashed with signal {-child.returncode} ({step})")
    lines = child.stdout[-ANSWER_BYTES:].decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "result" not in answer:
        tail = child.stderr[-8000:]
        if any(sign in tail for sign in (b"MemoryError", b"Cannot allocate memory", b"failed to map segment")):
            raise JudgingError(f"judging ran out of its memory limit of {memory_bytes >> 20} MiB ({step})")
        raise JudgingError(f"judging failed ({step}: exit status {child.returncode})")
    return answer["result"]


# ---- the child: everything below runs in the subprocess, on what the submission controls ----

def _prepare(submission: str, notebook_to: str, script_to: str) -> dict:
    """Read the handed-in notebook, rebuild it around the learner's cells and write what the sandboxes run:
    {"refused": why or "", "notes": [...]}."""
    import nbformat

    from assessment.grader import grade
    from assessment.grader.submission import SubmissionError, restore
    try:
        restored = restore(Path(submission))
    except SubmissionError as error:
        return {"refused": str(error), "notes": []}
    nbformat.write(grade.without_checks(restored.restored), notebook_to)
    Path(script_to).write_text(grade.job_script(restored.restored))
    return {"refused": "", "notes": restored.notes}


# step: (module, function, whether it needs torch). Preparing reads and writes notebooks only: without torch its
# child starts in about 1 s instead of 5.
STEPS = {"prepare": ("assessment.grader.judging", "_prepare", False), "judge": ("assessment.grader.grade", "judge_returned", True),
         "replay": ("assessment.grader.grade", "replay_returned", True)}


def _child() -> None:
    request = json.loads(sys.stdin.read())
    module, name, needs_torch = STEPS[request["step"]]
    if needs_torch:
        import torch   # imported before the limit: torch alone maps ~3 GB of address space
        torch.set_num_threads(1)
    # Everything the step imports is loaded before the limit too (a shared library that cannot be mapped
    # fails as an ImportError, not as the submission's doing); nbformat's schema validators load lazily.
    import nbformat
    nbformat.validate(nbformat.v4.new_notebook())
    step = getattr(importlib.import_module(module), name)
    from assessment.grader.model_file import cap_address_space
    cap_address_space(request["memory_bytes"])
    result = step(*request["args"])
    print("\n" + json.dumps({"result": result}), flush=True)

"""What a command run by the grader's sandbox supervisor (PID 1 of its namespace) does before it writes
the files the grader keeps: end every other process of the sandbox, so that nothing a submission left
running can rewrite them between this write and the supervisor's own sweep.

Nothing here acts outside that sandbox: ``supervised()`` is false on a learner's own machine.
"""
from __future__ import annotations

import os
import signal
import time

SUPERVISED = "COURSE_SANDBOX_SUPERVISED"   # set by the sandbox's supervisor for the command it runs


def supervised() -> bool:
    """Whether this process is the command of the grader's sandbox (its parent is the supervisor, PID 1)."""
    return os.environ.get(SUPERVISED) == "1" and os.getppid() == 1 and os.getpid() != 1


def protect() -> None:
    """Inside the sandbox: non-dumpable (PR_SET_DUMPABLE 0), so the submission's processes (same uid) can
    neither trace this one nor open its /proc files (memory, file descriptors)."""
    if supervised():
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)


def end_other_processes(seconds: float = 30) -> None:
    """Inside the sandbox: SIGKILL every process of its PID namespace but the supervisor and this one, until
    none is left (zombies aside: they run nothing). kill(-1) spares PID 1 and the caller."""
    if not supervised():
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:   # this process's own children
                pass
        except ChildProcessError:
            pass
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid()) and not _zombie(p)]:
            return
        time.sleep(0.05)


def _zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True   # gone already


def forget_working_folder() -> None:
    """Inside the sandbox: drop the working folder from ``sys.path`` (``python -m`` puts it first): the
    submission writes files there while this process runs, and a module imported later must never be one."""
    import sys
    if not supervised():
        return
    here = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]

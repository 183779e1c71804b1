"""The caps on a whole submission: its memory (files in tmpfs included), its number of processes, and
its share of the CPU.

Where the grader runs as root on a machine with cgroups (v1's ``memory``, ``pids`` and ``cpu``
controllers, or v2), each sandboxed run gets its own group under ``course-sandbox/``; every group has
the same CPU weight, so submissions graded at once (``--jobs N``) share the cores equally however many
processes each starts; the launched process joins it
before it drops its privileges, so everything the submission starts is counted and capped, and a fork
bomb or several processes each under the per-process limit end that submission only. Elsewhere there
is no such cap, and the grader says so.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

CGROUP_NAME = "course-sandbox"


class Cgroups:
    """The whole submission's memory and process caps, where the machine has cgroups we may write."""

    def __init__(self, limits, token: str):
        self.dirs: list[Path] = []
        self.caps: list[str] = []
        if os.geteuid() != 0:
            return
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists():
            self._v2(Path("/sys/fs/cgroup"), limits, token)
            return
        for controller, setting, value, words in (
                ("memory", "memory.limit_in_bytes", limits.total_memory_bytes,
                 f"memory {limits.total_memory_bytes >> 20} MiB for the whole submission"),
                ("pids", "pids.max", limits.max_processes, f"{limits.max_processes} processes and threads"),
                ("cpu", "cpu.shares", 1024, "an equal share of the CPU beside the other submissions")):
            root = Path("/sys/fs/cgroup") / controller
            if not (root / "cgroup.procs").exists():
                continue
            group = root / CGROUP_NAME / token
            try:
                group.mkdir(parents=True)
                (group / setting).write_text(str(value))
                if controller == "memory" and (group / "memory.memsw.limit_in_bytes").exists():
                    (group / "memory.memsw.limit_in_bytes").write_text(str(value))  # no escape into swap
            except OSError:
                _rmdir(group)
                continue
            self.dirs.append(group)
            self.caps.append(words + f" (cgroup v1 {controller})")

    def _v2(self, root: Path, limits, token: str) -> None:
        parent = root / CGROUP_NAME
        try:
            parent.mkdir(exist_ok=True)
            (root / "cgroup.subtree_control").write_text("+memory +pids")
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            group = parent / token
            group.mkdir()
            (group / "memory.max").write_text(str(limits.total_memory_bytes))
            (group / "pids.max").write_text(str(limits.max_processes))
        except OSError:
            return
        self.dirs.append(group)
        self.caps += [f"memory {limits.total_memory_bytes >> 20} MiB for the whole submission (cgroup v2)",
                      f"{limits.max_processes} processes and threads (cgroup v2)"]
        try:   # the cpu controller may be missing or taken: the other caps hold without it
            (root / "cgroup.subtree_control").write_text("+cpu")
            (parent / "cgroup.subtree_control").write_text("+cpu")
            (group / "cpu.weight").write_text("100")
            self.caps.append("an equal share of the CPU beside the other submissions (cgroup v2)")
        except OSError:
            pass

    def join(self) -> None:
        """In the launched child, before it drops privileges: put it (and so all it starts) in the groups."""
        for group in self.dirs:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        for group in self.dirs:
            kill_until_gone(lambda: _pids_in(group))
            _rmdir(group)


def whole_submission_caps(limits) -> list[str]:
    """The caps on a whole submission this machine gives (made and removed again to find out)."""
    groups = Cgroups(limits, uuid.uuid4().hex)
    groups.close()
    return groups.caps


def _pids_in(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _rmdir(group: Path) -> None:
    for _ in range(20):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def kill_until_gone(find_pids) -> None:
    for _ in range(5):  # a process may fork while being killed: look again until none is left
        pids = find_pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)

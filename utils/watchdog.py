"""Stops a cluster's processes when the kernel that started them is gone.

    python -m utils.watchdog [--files PROFILE_DIR CLUSTER_ID] KERNEL_PID PID [PID ...]

A kernel killed with SIGKILL runs no exit handler, and ipyparallel's controller, engines
and engine nannies would keep running. ``utils.cluster`` starts this process (in its own
session, so it outlives the kernel) to watch the kernel and end every listed process, and
every process they started, once the kernel is gone; then it removes the cluster's files
(connection files and logs) from the IPython profile.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil


def process_trees(pids) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants that are alive now."""
    procs = {}
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            for proc in [parent] + parent.children(recursive=True):
                procs[proc.pid] = proc
        except psutil.Error:
            continue
    return list(procs.values())


def terminate(procs: list[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM each process, then SIGKILL whatever is left after ``grace`` seconds."""
    for proc in procs:
        try:
            proc.terminate()  # psutil checks the process is still the one it saw (no PID reuse)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


def remove_cluster_files(profile_dir: str, cluster_id: str, logs: bool = True) -> None:
    """Delete what a cluster wrote into its IPython profile: connection files and, with ``logs``, logs."""
    if not profile_dir or not cluster_id:
        return
    folders = ("security", "log") if logs else ("security",)
    for folder in folders:
        for path in (Path(profile_dir) / folder).glob(f"*{cluster_id}*"):
            try:
                path.unlink()
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str]) -> None:
    profile_dir = cluster_id = ""
    if argv[:1] == ["--files"]:
        profile_dir, cluster_id, argv = argv[1], argv[2], argv[3:]
    kernel, *pids = (int(a) for a in argv)
    known: dict[int, psutil.Process] = {}
    while _alive(kernel):
        # Refresh: engines start nannies and helpers after this watchdog started.
        known.update({p.pid: p for p in process_trees(pids + list(known))})
        time.sleep(1.0)
    known.update({p.pid: p for p in process_trees(pids + list(known))})
    terminate(list(known.values()))
    remove_cluster_files(profile_dir, cluster_id)


if __name__ == "__main__":
    main(sys.argv[1:])

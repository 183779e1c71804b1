"""Shared by the tests that start JupyterLab or kernels with clusters: a free port, stopping a server's
process group, and finding the engines that belong to one IPython folder."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM the process group ``process`` leads (started with start_new_session), SIGKILL if needed."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def engines_of(ipython_dir: Path) -> list[psutil.Process]:
    """The ipyparallel processes (controller, engines, nannies) started with IPYTHONDIR=ipython_dir."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if ((proc.info["environ"] or {}).get("IPYTHONDIR") == str(ipython_dir)
                    and "ipyparallel" in " ".join(proc.info["cmdline"] or [])):
                found.append(proc)
        except psutil.Error:
            continue
    return found

"""Runs one command of a submission in isolation, with limits, and leaves no process behind.

Where the platform allows it (root, or unprivileged user namespaces), the command runs in new
Linux namespaces made by ``unshare``:

- network: only a loopback interface, so the submission reaches nothing, and no port clashes
  between submissions graded side by side;
- PID: the submission sees only its own processes, and when this module's init process (PID 1
  there) exits, the kernel kills everything left in the namespace, daemons included;
- mount: the working folder is a size-limited tmpfs (the disk it can fill), a fresh /proc, and
  the course repository is mounted read-only.

Everywhere, the command runs in its own session with resource limits (CPU time, file size, open
files, address space), its working folder as HOME and TMPDIR, a wall-clock limit, and a sweep that
kills every process carrying this run's marker in its environment. What is not protected is said
in the README (section "Grading"): the submission runs as the grader's own user.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = "COURSE_SANDBOX_RUN"
REPO = Path(__file__).resolve().parent.parent
_UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]


@dataclass
class Limits:
    wall_s: float = 600            # the whole command
    cpu_s: int = 1800              # CPU seconds, per process
    file_bytes: int = 64 << 20     # the largest file it may write
    disk_bytes: int = 256 << 20    # all its files together (tmpfs; namespaces only)
    open_files: int = 2048
    memory_bytes: int = 8 << 30    # address space per process (not set where CUDA needs more)


@dataclass
class Result:
    returncode: int | None
    timed_out: bool
    seconds: float
    isolation: str
    failure: str = ""   # the sandbox itself failed (its own error output), so the command may never have run


def isolation_mode() -> str:
    """'namespaces', 'user-namespaces' or 'none': what this machine lets the grader use."""
    if shutil.which("unshare") is None:
        return "none"
    for mode, extra in (("namespaces", []), ("user-namespaces", ["--user", "--map-root-user"])):
        try:
            done = subprocess.run(_UNSHARE[:1] + extra + _UNSHARE[1:] + ["true"], capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return mode
    return "none"


def run(command: list[str], workdir: Path, keep: list[str], outdir: Path, limits: Limits,
        env: dict | None = None, mode: str | None = None) -> Result:
    """Run ``command`` in ``workdir`` under ``limits``; copy the files named in ``keep`` to ``outdir``.

    ``workdir`` starts with the files already in it (copied into the tmpfs when namespaces are used).
    """
    mode = isolation_mode() if mode is None else mode
    token = uuid.uuid4().hex
    outdir.mkdir(parents=True, exist_ok=True)
    plan = {"command": command, "workdir": str(workdir), "keep": keep, "outdir": str(outdir),
            "limits": limits.__dict__, "env": dict(env or {}), "token": token, "mode": mode}
    plan_file = outdir / ".sandbox-plan.json"
    plan_file.write_text(json.dumps(plan))
    launcher = [sys.executable, "-m", "assessment.sandbox", str(plan_file)]
    if mode == "namespaces":
        launcher = _UNSHARE + launcher
    elif mode == "user-namespaces":
        launcher = _UNSHARE[:1] + ["--user", "--map-root-user"] + _UNSHARE[1:] + launcher
    start = time.monotonic()
    errors = outdir / ".sandbox-errors"  # the supervisor's own (the command's output goes nowhere)
    with open(errors, "wb") as stderr:
        process = subprocess.Popen(launcher, cwd=REPO, start_new_session=True, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={**os.environ, MARKER: token}, preexec_fn=_die_with_parent)
    timed_out = False
    try:
        process.wait(limits.wall_s + 60)  # the init enforces wall_s itself; this is the backstop
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.wait()
        timed_out = True
    sweep(token)
    plan_file.unlink(missing_ok=True)
    status_file = outdir / ".sandbox-status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else {}
    status_file.unlink(missing_ok=True)
    failure = ""
    if not status and not timed_out:
        lines = errors.read_bytes()[-4000:].decode(errors="replace").strip().splitlines()
        failure = (f"the sandbox's supervisor ({mode}) exited with {process.returncode} before the command "
                   f"ended: {lines[-1] if lines else 'no error output'}")
    errors.unlink(missing_ok=True)
    return Result(status.get("returncode"), status.get("timed_out", timed_out), time.monotonic() - start, mode,
                  failure)


def _die_with_parent() -> None:
    """If the grader is killed, its sandboxes go too (``unshare --kill-child`` then ends the rest)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the sweep at the end of each run still applies


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def marked_pids(token: str) -> list[int]:
    """Processes whose environment carries this run's marker: those that left the session too."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sweep(token: str) -> None:
    _kill_until_gone(lambda: marked_pids(token))


def _kill_until_gone(find_pids) -> None:
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


# --- inside: the init process of the namespaces (or a plain supervisor without them) -------------

def _set_limits(limits: dict, cuda: bool) -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = min(limits["open_files"], hard) if hard != resource.RLIM_INFINITY else limits["open_files"]
    resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
    if not cuda:  # the CUDA runtime reserves far more address space than it uses
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))


def _loopback_up() -> None:
    """Bring the new network namespace's loopback up (the engines talk over 127.0.0.1), with the
    SIOCGIFFLAGS/SIOCSIFFLAGS ioctls rather than iproute2's ``ip``, which a machine may not have."""
    import fcntl
    import socket
    import struct
    get_flags, set_flags, up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, get_flags, request))[1]
        fcntl.ioctl(s, set_flags, struct.pack("16sH14x", b"lo", flags | up))


def _prepare_namespaces(workdir: Path, disk_bytes: int) -> None:
    _loopback_up()
    staged = Path(f"/tmp/.sandbox-stage-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    shutil.copytree(workdir, staged)            # the files the command starts with
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_bytes},mode=0755", "tmpfs", str(workdir)], check=True)
    for item in staged.iterdir():
        shutil.move(str(item), workdir / item.name)
    staged.rmdir()
    # Read-only view of the course: a submission cannot edit the grader or the checks it runs.
    subprocess.run(["mount", "--bind", str(REPO), str(REPO)], check=False, capture_output=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(REPO)], check=False, capture_output=True)


def _become_subreaper() -> None:
    """Make orphaned descendants ours (Linux PR_SET_CHILD_SUBREAPER), not init's: a process that left
    the session and cleared its environment is still found among our descendants."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(root: int) -> list[int]:
    """Every process below ``root`` in the parent tree, read from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])  # the name in (...) may hold spaces
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def _kill_all_but_me(child: subprocess.Popen, token: str, in_namespace: bool) -> None:
    if in_namespace:
        try:
            os.kill(-1, signal.SIGKILL)  # as PID 1 of the namespace: every other process in it
        except ProcessLookupError:
            pass
    _kill_group(child.pid)
    # As subreaper, orphans are our descendants, whatever their session or environment.
    _kill_until_gone(lambda: descendants(os.getpid()))
    sweep(token)
    while True:  # reap: as init, orphans are ours
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


def _copy_out(workdir: Path, keep: list[str], outdir: Path, cap: int) -> None:
    for name in keep:
        source = workdir / name
        if source.is_file() and not source.is_symlink():
            with open(source, "rb") as src, open(outdir / Path(name).name, "wb") as dst:
                dst.write(src.read(cap))


def supervise(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    limits, workdir, outdir = plan["limits"], Path(plan["workdir"]), Path(plan["outdir"])
    in_namespace = plan["mode"] != "none"
    if in_namespace:
        _prepare_namespaces(workdir, limits["disk_bytes"])
    else:
        _become_subreaper()
    cuda = os.path.exists("/dev/nvidia0")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "TMPDIR": str(workdir),
           "IPYTHONDIR": str(workdir / ".ipython"), "JUPYTER_RUNTIME_DIR": str(workdir / ".jupyter-runtime"),
           "MPLCONFIGDIR": str(workdir / ".matplotlib"), "LANG": "C.UTF-8", MARKER: plan["token"],
           **plan["env"]}
    for name in ("CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    start = time.monotonic()
    child = subprocess.Popen(plan["command"], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: _set_limits(limits, cuda))
    timed_out = False
    try:
        returncode = child.wait(limits["wall_s"])
    except subprocess.TimeoutExpired:
        returncode, timed_out = None, True
    _kill_all_but_me(child, plan["token"], in_namespace)
    _copy_out(workdir, plan["keep"], outdir, limits["file_bytes"])
    (outdir / ".sandbox-status.json").write_text(json.dumps(
        {"returncode": returncode, "timed_out": timed_out, "seconds": time.monotonic() - start}))


if __name__ == "__main__":
    supervise(sys.argv[1])

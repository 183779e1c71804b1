"""Runs one command of a submission behind a boundary, with limits, and leaves no process behind.

The boundary is bubblewrap (``bwrap``, the sandbox Flatpak uses; Debian's ``bubblewrap``). It was
chosen over hand-made ``unshare`` plumbing because it is small, widely audited, runs without root,
and does in one step what a boundary needs: new user, PID, network, IPC, UTS and mount namespaces,
minimal bind mounts, no capabilities, ``no_new_privs``, and death with its parent.

What a command sees (``isolation_mode() == "bwrap"``):

- files: the system's ``/usr`` (and the ``/lib``, ``/bin`` links), a few files of ``/etc``, the
  Python it runs with, and the read-only folders it is given (the learner bundle, the venv); its
  own working folder ``/sandbox/work`` and ``/tmp``, both size-limited tmpfs that vanish with it;
  its own ``/proc`` and a minimal ``/dev``. No host ``/tmp``, ``/run``, home, submissions, grader
  output or repository: they are not there.
- user: an unprivileged uid (``COURSE_SANDBOX_UID``, default 65534 "nobody", when the grader runs
  as root; the grader's own uid otherwise), inside a user namespace of its own, with no capability
  and no way to make another user namespace: it can remount nothing.
- network: a loopback of its own; nothing else.
- limits: CPU seconds, file size, open files and address space per process; where the grader runs
  as root on a machine with cgroups (v1 or v2), the memory and the number of processes of the whole
  submission (tmpfs files count as memory); a wall clock kept by the grader.

The files named in ``keep`` come back framed (index, length, bytes) on the supervisor's standard output, read by the
grader up to a cap: nothing in the sandbox can write a host file. Everything that comes back is
untrusted data. When the command ends, its supervisor (PID 1) kills every other process of the
namespace and reaps them all before it reads a kept file, so no leftover process can rewrite what comes
back. Without bwrap or user namespaces ``isolation_mode()`` is "none": the grader then
refuses to grade untrusted work (``run`` with ``mode="none"`` is for notebooks the instructor trusts).
"""
from __future__ import annotations

import io
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from assessment.grader.cgroups import CGROUP_NAME, Cgroups, kill_until_gone

MARKER = "COURSE_SANDBOX_RUN"
WORK = "/sandbox/work"                 # the command's working folder inside the sandbox
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts", "localtime",
        "alternatives")
_MARK = b"\n--course-sandbox-files--\n"


@dataclass
class Limits:
    wall_s: float = 600                 # the whole command, kept by the grader
    cpu_s: int = 1800                   # CPU seconds, per process
    file_bytes: int = 64 << 20          # the largest file it may write (and the most that comes back per file)
    kept_bytes: int = 192 << 20         # all the kept files together, as they come back (the grader holds them)
    disk_bytes: int = 256 << 20         # its working folder and /tmp, each (tmpfs)
    open_files: int = 2048
    memory_bytes: int = 8 << 30         # address space per process (not set where CUDA needs more)
    total_memory_bytes: int = 6 << 30   # the whole submission, files in tmpfs included (cgroup): JOBS=2 fits 24 GiB
    max_processes: int = 512            # the whole submission, threads included (cgroup)


@dataclass
class Result:
    returncode: int | None
    timed_out: bool
    seconds: float
    isolation: str
    failure: str = ""   # the sandbox itself failed (its own error output), so the command may never have run
    caps: list[str] = field(default_factory=list)  # the limits that applied, in words


# --- what this machine allows ----------------------------------------------------------------------

def sandbox_uid() -> int | None:
    """The uid a submission runs as: a dedicated unprivileged one when the grader is root, else None (ours)."""
    if os.geteuid() != 0:
        return None
    return int(os.environ.get("COURSE_SANDBOX_UID", "65534"))


_MODE: list[str] = []


def isolation_mode() -> str:
    """'bwrap' when a submission can be run behind the boundary here, else 'none' (see ``why_none``)."""
    if not _MODE:
        _MODE.append("bwrap" if not _probe_bwrap() else "none")
    return _MODE[0]


def _probe_bwrap() -> str:
    """Why bwrap cannot make the boundary here ('' when it can)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
    with _Mounts() as mounts:
        argv = _bwrap_argv(mounts, [], Limits(), {}) + ["--", "/bin/true"]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=30, pass_fds=mounts.fds,
                                  preexec_fn=_Launch(sandbox_uid(), None, Limits(), mounts).child)
        except (OSError, subprocess.TimeoutExpired, subprocess.SubprocessError) as error:
            return f"bwrap could not start ({error})"
    if done.returncode:
        return ("bwrap cannot create a user namespace here (" + done.stderr.decode(errors="replace").strip()[-200:] +
                "): enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
                "user.max_user_namespaces > 0), or grade in a Linux VM or container that allows them")
    return ""


def why_none() -> str:
    return _probe_bwrap() or "the boundary is available"


# --- the outside: mounts, limits, cgroups -----------------------------------------------------------

class _Mounts:
    """Host folders the sandbox binds. A folder the sandbox's uid cannot reach (Python installed under
    /root, say) is first bound, in a mount namespace private to the launcher, onto a staging folder it
    can reach; bwrap then binds that to the folder's own path inside."""

    def __init__(self, view: dict[str, str] | None = None):
        self.view = {str(Path(k).resolve()): v for k, v in (view or {}).items()}
        python_home = str(Path(sys.base_prefix).resolve())
        self.view.setdefault(python_home, python_home)
        self.view.setdefault(str(Path(sys.prefix).resolve()), str(Path(sys.prefix).resolve()))  # the venv
        self.fds: list[int] = []
        self.staged: dict[str, str] = {}   # host folder -> staging folder
        self.stage_root: str | None = None

    def __enter__(self):
        uid = sandbox_uid()
        if uid is not None:
            reachable = [p for p in self.view if _reachable(p, uid)]
            hidden = [p for p in self.view if p not in reachable]
            if hidden:
                self.stage_root = f"/run/{CGROUP_NAME}-{uuid.uuid4().hex[:10]}"
                os.makedirs(self.stage_root, mode=0o755)
                for i, path in enumerate(hidden):
                    target = os.path.join(self.stage_root, str(i))
                    os.mkdir(target, 0o755)
                    self.staged[path] = target
        return self

    def __exit__(self, *exc):
        if self.stage_root:
            shutil.rmtree(self.stage_root, ignore_errors=True)

    def source(self, host: str) -> str:
        return self.staged.get(host, host)


def _reachable(path: str, uid: int) -> bool:
    """Whether ``uid`` (with no supplementary group) can traverse to ``path`` and read it."""
    parts = Path(path).parts
    current = Path("/")
    for part in parts[1:]:
        current = current / part
        try:
            st = current.stat()
        except OSError:
            return False
        mode = st.st_mode
        bit = 0o100 if st.st_uid == uid else 0o001
        if not mode & bit:
            return False
    return True


# seccomp: the syscalls that read or write another process's memory or stop it under a debugger. Processes of
# one sandbox share a uid, so without this filter a script could trace its own torchrun agent and hold it.
_ARCHES = {   # machine: (AUDIT_ARCH_*, (ptrace, process_vm_readv, process_vm_writev, pidfd_getfd), first x32 number)
    "x86_64": (0xC000003E, (101, 310, 311, 438), 0x40000000),
    "aarch64": (0xC00000B7, (117, 270, 271, 438), None),
}


def seccomp_program() -> bytes | None:
    """A classic BPF program for bwrap's --seccomp: EPERM for ptrace, process_vm_readv/writev and pidfd_getfd
    (taking another process's file descriptor), and for any
    other architecture's or ABI's syscalls (a 32-bit entry point would have other numbers); None on a
    machine not in ``_ARCHES``."""
    import platform
    import struct
    known = _ARCHES.get(platform.machine())
    if known is None:
        return None
    arch, denied, x32 = known
    LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1   # SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO | EPERM
    checks = ([(JGE_K, x32)] if x32 is not None else []) + [(JEQ_K, nr) for nr in denied]
    # Layout: load arch; not ours -> deny; load nr; each check -> deny; allow; deny.
    program = [(LD_W_ABS, 0, 0, 4), (JEQ_K, 0, len(checks) + 2, arch), (LD_W_ABS, 0, 0, 0)]
    for i, (op, k) in enumerate(checks):
        program.append((op, len(checks) - i, 0, k))   # true -> jump over the rest and the allow, to deny
    program += [(RET_K, 0, 0, ALLOW), (RET_K, 0, 0, DENY)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def _seccomp_fd() -> int | None:
    """A file descriptor holding ``seccomp_program()`` at offset 0, for bwrap to read; None without one."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("course-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _bwrap_argv(mounts: _Mounts, files: list[tuple[int, str]], limits: Limits, env: dict) -> list[str]:
    # --as-pid-1: no bwrap init inside; the supervisor (non-dumpable) is PID 1, so no process a submission
    # can read holds bwrap's memory (the --file copies) or the pipes back to the grader.
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--cap-drop", "ALL", "--clearenv", "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.disk_bytes), "--tmpfs", "/dev/shm",
            "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
            "--size", str(limits.disk_bytes), "--tmpfs", "/sandbox", "--dir", WORK]
    for top in ("bin", "sbin", "lib", "lib64", "lib32"):
        link = Path("/") / top
        if link.is_symlink():
            argv += ["--symlink", os.readlink(link), f"/{top}"]
        elif link.is_dir():
            argv += ["--ro-bind", str(link), f"/{top}"]
    for name in _ETC:
        if (Path("/etc") / name).exists():
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for host, inside in mounts.view.items():
        argv += ["--ro-bind", mounts.source(host), inside]
    if os.path.exists("/dev/nvidia0"):  # the GPUs, where there are some
        for dev in sorted(Path("/dev").glob("nvidia*")):
            argv += ["--dev-bind", str(dev), str(dev)]
        argv += ["--ro-bind", "/sys", "/sys"]
    for fd, name in files:
        argv += ["--file", str(fd), f"{WORK}/{name}"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK]  # bwrap's own tmpfs read-only


class _Launch:
    """What the launched process does between fork and exec: cgroups, private staging mounts, rlimits,
    then the sandbox's uid. Everything it needs is prepared before the fork."""

    def __init__(self, uid: int | None, cgroups: Cgroups | None, limits: Limits, mounts: _Mounts):
        import ctypes
        self.ctypes, self.libc = ctypes, ctypes.CDLL(None, use_errno=True)
        self.uid, self.cgroups, self.limits, self.mounts = uid, cgroups, limits, mounts
        self.cuda = os.path.exists("/dev/nvidia0")

    def child(self) -> None:
        self.libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed grader takes its sandboxes along
        if self.cgroups:
            self.cgroups.join()
        if self.mounts.staged:
            if self.libc.unshare(0x00020000) != 0:  # CLONE_NEWNS: the staging mounts stay private
                raise OSError(self.ctypes.get_errno(), "unshare(CLONE_NEWNS) for the staging mounts")
            self.libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None)  # MS_PRIVATE | MS_REC
            for host, stage in self.mounts.staged.items():
                if self.libc.mount(host.encode(), stage.encode(), None, 0x1000 | 0x4000, None) != 0:  # MS_BIND|MS_REC
                    raise OSError(f"cannot stage {host}")
        limits = self.limits
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = min(limits.open_files, hard) if hard != resource.RLIM_INFINITY else limits.open_files
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
        if not self.cuda:  # the CUDA runtime reserves far more address space than it uses
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        if self.uid is not None:
            os.setgroups([])
            os.setresgid(self.uid, self.uid, self.uid)
            os.setresuid(self.uid, self.uid, self.uid)
            self.libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: bwrap reads its own /proc/self/fd


# Runs inside as PID 1, the command's parent: non-dumpable (the submission, same uid, cannot read its
# memory, open its fds or ptrace it), it reaps orphans, the command's own output goes nowhere, and at the
# end, once every other process of the namespace is dead, the kept files go to standard output, each framed
# by its index in ``keep`` and its length: the supervisor is the only writer of that pipe, and the grader
# reads the frames from its first byte, so no file's content can pass for the frames (a submission can
# only forge its own results).
_SUPERVISOR = r"""
import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
keep, cap, budget = sys.argv[1].splitlines(), int(sys.argv[2]), int(sys.argv[3])
child = subprocess.Popen(sys.argv[4:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "COURSE_SANDBOX_SUPERVISED": "1"})
while True:
    pid, status = os.wait()
    if pid == child.pid:
        code = os.waitstatus_to_exitcode(status)
        break
# Every process left in the namespace ends before a kept file is read: nothing rewrites them afterwards.
# kill(-1) from PID 1 reaches every other process of the namespace; each is a descendant of this one, so
# when it has no child left, the namespace holds no other process.
while True:
    try:
        os.kill(-1, 9)
    except ProcessLookupError:
        pass
    try:
        os.wait()   # one ended; kill again before the next wait, in case something forked meanwhile
    except ChildProcessError:
        break
out = os.fdopen(1, "wb")
out.write(b"\n--course-sandbox-files--\n")
for index, name in enumerate(keep):   # each found file: its index in keep (2 bytes), its length (8), its bytes
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)   # a FIFO must not block
    except OSError:
        continue
    with os.fdopen(fd, "rb") as f:
        if not os.path.isfile(f"/proc/self/fd/{f.fileno()}"):
            continue
        data = f.read(max(0, min(cap, budget)))
    budget -= len(data)
    out.write(index.to_bytes(2, "big") + len(data).to_bytes(8, "big") + data)
out.flush()
os._exit(code if 0 <= code < 256 else 1)
"""


def run(command: list[str], workdir: Path, keep: list[str], outdir: Path, limits: Limits,
        env: dict | None = None, mode: str | None = None, view: dict | None = None) -> Result:
    """Run ``command`` on a copy of the files in ``workdir``; the files named in ``keep`` come back in ``outdir``.

    ``view``: host folder -> path inside, bound read-only (the learner bundle, for instance). The
    command runs in ``/sandbox/work`` (with ``mode="none"``, in ``workdir`` itself, unprotected).
    """
    mode = isolation_mode() if mode is None else mode
    outdir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": "learner", MARKER: token}
    for name in ("CUDA_VISIBLE_DEVICES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if name in os.environ:
            base_env[name] = os.environ[name]
    if mode == "none":
        return _run_unprotected(command, Path(workdir), keep, outdir, limits, {**base_env, **(env or {})}, token)
    inside_env = {**base_env, "HOME": WORK, "TMPDIR": "/tmp", "IPYTHONDIR": f"{WORK}/.ipython",
                  "JUPYTER_RUNTIME_DIR": f"{WORK}/.jupyter-runtime", "MPLCONFIGDIR": f"{WORK}/.matplotlib",
                  **(env or {})}
    start = time.monotonic()
    missing = [host for host in (view or {}) if not Path(host).is_dir()]
    if missing:
        return Result(None, False, 0.0, mode, f"the sandbox could not start: {missing[0]} (to be shown at "
                                              f"{view[missing[0]]}) is not a folder")
    inputs = [p for p in sorted(Path(workdir).iterdir()) if p.is_file()]
    files = [(os.open(p, os.O_RDONLY | os.O_CLOEXEC), p.name) for p in inputs]
    filter_fd = _seccomp_fd()
    cgroups = Cgroups(limits, token)
    caps = [f"CPU {limits.cpu_s} s, address space {limits.memory_bytes >> 20} MiB, files {limits.file_bytes >> 20} "
            f"MiB and {limits.open_files} open, per process", f"work folder and /tmp {limits.disk_bytes >> 20} MiB each",
            f"wall clock {limits.wall_s:.0f} s",
            "no ptrace, process_vm_readv/writev or pidfd_getfd (seccomp)" if filter_fd is not None else
            "no seccomp filter on this machine's architecture: processes of one submission may trace each other"
            ] + (cgroups.caps or ["no cgroup: no cap on the whole submission's memory or process count"])
    cap = min(len(keep) * limits.file_bytes, limits.kept_bytes) + (1 << 20)   # + the frames' headers
    try:
        with _Mounts(view) as mounts:
            argv = _bwrap_argv(mounts, files, limits, inside_env)
            if filter_fd is not None:
                argv += ["--seccomp", str(filter_fd)]
            argv += ["--", sys.executable, "-I", "-c", _SUPERVISOR, "\n".join(keep), str(limits.file_bytes),
                     str(limits.kept_bytes), *command]
            launch = _Launch(sandbox_uid(), cgroups, limits, mounts)
            passed = [fd for fd, _ in files] + ([filter_fd] if filter_fd is not None else [])
            for fd in passed:
                os.set_inheritable(fd, True)
            try:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, pass_fds=passed,
                                           start_new_session=True, preexec_fn=launch.child)
            except (OSError, subprocess.SubprocessError) as error:
                return Result(None, False, time.monotonic() - start, mode,
                              f"the sandbox could not start: {type(error).__name__}: {error}", caps)
            spool = tempfile.TemporaryFile(prefix="course-sandbox-out-")   # private to the grader
            stdout, stderr = _Capped(process.stdout, cap, spool), _Capped(process.stderr, 64 << 10)
            timed_out = _wait(process, limits.wall_s)
            stdout.join(), stderr.join()
    finally:
        for fd, _ in files:
            os.close(fd)
        if filter_fd is not None:
            os.close(filter_fd)
        cgroups.close()
    returncode = None if timed_out else process.returncode
    failure = ""
    with spool:
        found = _unframe(spool, keep, outdir, limits.file_bytes)
    if not timed_out and not found and stderr.data.startswith(b"bwrap:"):
        failure = f"bwrap could not start the sandbox: {printable(stderr.data.decode(errors='replace'))[:300]}"
    return Result(returncode, timed_out, time.monotonic() - start, mode, failure, caps)


def printable(text: str) -> str:
    """Text from a sandbox made safe to print and store: no control characters (terminal escapes), no lone
    surrogates (they cannot be written as UTF-8)."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    return "".join(c if c.isprintable() or c in "\n" else "?" for c in text).strip()


class _Capped(threading.Thread):
    """Reads a pipe to its end, keeping at most ``cap`` bytes (the rest is read and dropped) in ``into``: a
    temporary file for the kept files' stream (up to ``Limits.kept_bytes`` per sandbox, which the grader must not
    hold in memory: 2 sandboxes at a time held 574 MiB), else memory."""

    def __init__(self, pipe, cap: int, into=None):
        super().__init__(daemon=True)
        self.pipe, self.cap = pipe, cap
        self.into = io.BytesIO() if into is None else into
        self.start()

    def run(self):
        kept = 0
        while chunk := self.pipe.read(1 << 16):
            room = self.cap - kept
            if room > 0:
                self.into.write(chunk[:room])
                kept += min(room, len(chunk))

    @property
    def data(self) -> bytes:
        """What was kept in memory (a stream read into a file is read from that file)."""
        return self.into.getvalue()


def _unframe(stream, keep: list[str], outdir: Path, cap: int) -> bool:
    """Write the kept files the supervisor framed (see ``_SUPERVISOR``) from the binary file ``stream``; False
    when it does not start with its marker. Parsed from the first byte, with every length checked: no pattern, no
    tar parser; copied in chunks, never held whole."""
    total = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if stream.read(len(_MARK)) != _MARK:
        return False
    at, seen = len(_MARK), set()
    while at + 10 <= total:
        header = stream.read(10)
        index, size = int.from_bytes(header[:2], "big"), int.from_bytes(header[2:], "big")
        at += 10
        if index >= len(keep) or index in seen or size > cap or at + size > total:
            break   # the stream was cut by the grader's cap, or is not the supervisor's: keep what came before
        seen.add(index)
        with open(outdir / Path(keep[index]).name, "wb") as out:
            left = size
            while left and (chunk := stream.read(min(left, 1 << 20))):
                out.write(chunk)
                left -= len(chunk)
        at += size
    return True


def _wait(process: subprocess.Popen, seconds: float) -> bool:
    """Wait for ``process``; past ``seconds``, kill its process group. Returns whether it timed out."""
    try:
        process.wait(seconds)
        return False
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.wait()
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- no boundary: a notebook the instructor trusts -----------------------------------------------------

def marked_pids(token: str) -> list[int]:
    """Processes whose environment carries this run's marker."""
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


def _run_unprotected(command, workdir: Path, keep, outdir: Path, limits: Limits, env: dict, token: str) -> Result:
    """Limits, a session of its own and a sweep of what carries its marker: no protection from hostile code."""
    start = time.monotonic()
    env = {**env, "HOME": str(workdir), "TMPDIR": str(workdir), "IPYTHONDIR": str(workdir / ".ipython"),
           "JUPYTER_RUNTIME_DIR": str(workdir / ".jupyter-runtime"), "MPLCONFIGDIR": str(workdir / ".matplotlib"),
           "PYTHONPATH": env.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")}
    env = {k: v for k, v in env.items() if v}
    launch = _Launch(None, None, limits, _Mounts())
    try:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=launch.child)
    except OSError as error:
        return Result(None, False, 0.0, "none", f"the command could not start: {error}")
    timed_out = _wait(process, limits.wall_s)
    _kill_group(process.pid)
    kill_until_gone(lambda: marked_pids(token))
    budget = limits.kept_bytes
    for name in keep:
        source = workdir / name
        if source.is_file() and not source.is_symlink():
            with open(source, "rb") as src:
                data = src.read(max(0, min(limits.file_bytes, budget)))
            budget -= len(data)
            (outdir / Path(name).name).write_bytes(data)
    return Result(None if timed_out else process.returncode, timed_out, time.monotonic() - start, "none",
                  caps=["per-process limits only: no boundary (the submission runs as you)"])


def whole_submission_caps() -> list[str]:
    """The caps on a whole submission this machine gives, in words (none without root and cgroups)."""
    from assessment.grader import cgroups
    return cgroups.whole_submission_caps(Limits())

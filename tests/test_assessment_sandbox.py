"""The grader's sandbox: limits hold, nothing escapes the run, nothing is left behind."""
from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from assessment.grader import sandbox

MODE = sandbox.isolation_mode()
needs_namespaces = pytest.mark.skipif(MODE == "none", reason=f"no boundary here: {sandbox.why_none()}")


def run_script(tmp_path, body: str, keep=(), mode=None, **limits):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "script.py").write_text(textwrap.dedent(body))
    result = sandbox.run([sys.executable, "script.py"], work, list(keep), out, sandbox.Limits(**limits), mode=mode)
    return result, out


def test_a_command_that_never_ends_is_stopped_at_the_wall_limit(tmp_path):
    start = time.monotonic()
    result, _ = run_script(tmp_path, "while True:\n    pass\n", wall_s=3)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 30


def test_files_named_in_keep_come_back_and_the_exit_code_is_reported(tmp_path):
    result, out = run_script(tmp_path, """
        open("answer.txt", "w").write("42")
        raise SystemExit(3)
    """, keep=["answer.txt", "absent.txt"], wall_s=60)
    assert result.returncode == 3 and not result.timed_out
    assert (out / "answer.txt").read_text() == "42"
    assert not (out / "absent.txt").exists()


@pytest.mark.parametrize("mode", [MODE, "none"])
def test_the_kept_files_together_come_back_within_their_own_cap(tmp_path, mode):
    # Found by an outside test: each kept name could bring back file_bytes (hard links to one sparse file
    # cost no disk), so 22 names made the grader hold gigabytes. A FIFO among them must not block.
    result, out = run_script(tmp_path, """
        import os
        with open("big0.bin", "wb") as f:
            f.truncate(3 << 20)
        for i in (1, 2, 3):
            os.link("big0.bin", f"big{i}.bin")
        os.mkfifo("pipe.bin")
    """, keep=["pipe.bin", "big0.bin", "big1.bin", "big2.bin", "big3.bin"], wall_s=60, mode=mode,
                             file_bytes=4 << 20, kept_bytes=7 << 20)
    assert result.returncode == 0 and not result.timed_out
    sizes = [(out / f"big{i}.bin").stat().st_size if (out / f"big{i}.bin").exists() else 0 for i in range(4)]
    assert sizes[:2] == [3 << 20, 3 << 20] and sum(sizes) <= 7 << 20, sizes


@pytest.mark.parametrize("mode, environment", [(MODE, "marked"), (MODE, "cleared"), ("none", "marked")])
def test_a_process_that_leaves_the_session_is_killed_when_the_run_ends(tmp_path, mode, environment):
    # A grandchild in a new session; with its environment cleared, not even the run's marker names it
    # (only the boundary's PID namespace catches that one).
    env = ", env={}" if environment == "cleared" else ""
    result, _ = run_script(tmp_path, f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True{env})
    """, wall_s=60, mode=mode)
    assert result.returncode == 0
    time.sleep(0.5)
    leftovers = [pid for pid in _python_sleepers()]
    assert not leftovers, f"processes left behind: {leftovers}"


def _python_sleepers():
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"time.sleep(600)" in f.read():
                        yield int(entry)
            except OSError:
                pass


def test_a_file_larger_than_the_limit_cannot_be_written(tmp_path):
    result, out = run_script(tmp_path, """
        try:
            with open("big.bin", "wb") as f:
                f.write(b"x" * (8 << 20))
            print("wrote")
        except OSError as error:
            open("why.txt", "w").write(type(error).__name__)
    """, keep=["why.txt"], wall_s=60, file_bytes=1 << 20)
    assert (out / "why.txt").exists(), "an 8 MiB file was written under a 1 MiB limit"


@needs_namespaces
def test_the_disk_a_run_can_fill_is_its_own_and_small(tmp_path):
    result, out = run_script(tmp_path, """
        import os
        written = 0
        try:
            for i in range(1000):
                with open(f"fill{i}.bin", "wb") as f:
                    f.write(b"x" * (1 << 20))
                written += 1
        except OSError:
            pass
        for i in range(written + 1):  # make room for the answer
            if os.path.exists(f"fill{i}.bin"):
                os.remove(f"fill{i}.bin")
        open("written.txt", "w").write(str(written))
    """, keep=["written.txt"], wall_s=60, file_bytes=4 << 20, disk_bytes=16 << 20)
    written = int((out / "written.txt").read_text())
    assert written < 16, f"{written} MiB written on a 16 MiB disk"
    assert written >= 8, f"only {written} MiB fitted on a 16 MiB disk"


@needs_namespaces
def test_a_run_has_no_network_but_its_own_loopback(tmp_path):
    result, out = run_script(tmp_path, """
        import socket
        server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
        client = socket.create_connection(server.getsockname(), timeout=5)
        lines = ["loopback ok"]
        try:
            socket.create_connection(("10.255.255.1", 80), timeout=3)
            lines.append("outside reached")
        except OSError as error:
            lines.append(f"outside: {type(error).__name__}")
        open("net.txt", "w").write("\\n".join(lines))
    """, keep=["net.txt"], wall_s=60)
    text = (out / "net.txt").read_text()
    assert "loopback ok" in text and "outside reached" not in text


@needs_namespaces
def test_a_run_is_unprivileged_sees_only_its_own_processes_and_none_of_the_host(tmp_path):
    hidden = [str(sandbox.Path(__file__).resolve().parent.parent / "assessment" / "grader" / "grade.py"), str(tmp_path),
              "/home", "/run", "/var", "/etc/shadow", "/sys/fs/cgroup"]
    (tmp_path / "host-secret.txt").write_text("secret")
    result, out = run_script(tmp_path, f"""
        import os, subprocess
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        seen = [p for p in {hidden!r} if os.path.exists(p)]
        seen += [f"/root/{{name}}" for name in (os.listdir("/root") if os.path.isdir("/root") else [])
                 if name != ".pyenv"]  # only the Python the grader runs, where it lives under /root
        remount = subprocess.run(["mount", "-o", "remount,rw", "/usr"], capture_output=True).returncode
        import ctypes
        userns = "made" if ctypes.CDLL(None).unshare(0x10000000) == 0 else "refused"  # CLONE_NEWUSER
        try:
            open("/usr/course-edit", "w")
            usr = "written"
        except OSError as error:
            usr = type(error).__name__
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        writable = []
        for place in ("/", "/etc", "/usr", "/dev"):
            try:
                open(os.path.join(place, "x"), "w").close()
                writable.append(place)
            except OSError:
                pass
        supervisor = []   # PID 1 holds the grader's pipes: its memory and fds must be out of reach
        for what in ("mem", "fd/1", "fd/2", "environ"):
            try:
                open(f"/proc/1/{{what}}", "rb").close()
                supervisor.append(what)
            except OSError:
                pass
        shm = os.statvfs("/dev/shm")
        open("seen.txt", "w").write(repr(dict(uid=os.getuid(), caps=status["CapEff"].strip(),
            nnp=status["NoNewPrivs"].strip(), seen=seen, remount=remount, userns=userns, usr=usr, pids=len(pids),
            writable=writable, supervisor=supervisor, shm=shm.f_blocks * shm.f_frsize)))
    """, keep=["seen.txt"], wall_s=60)
    seen = eval((out / "seen.txt").read_text())
    assert seen["uid"] != 0 and (os.geteuid() != 0 or seen["uid"] == sandbox.sandbox_uid()), seen
    assert seen["caps"] == "0000000000000000" and seen["nnp"] == "1", seen
    assert seen["seen"] == [], f"host paths visible in the sandbox: {seen['seen']}"
    assert seen["remount"] != 0 and seen["usr"] != "written" and seen["userns"] != "made", seen
    assert seen["pids"] < 10, f"the run saw {seen['pids']} processes: the machine's, not only its own"
    assert seen["writable"] == [], f"writable outside its work folder and /tmp: {seen['writable']}"
    assert seen["supervisor"] == [], f"the supervisor's {seen['supervisor']} can be opened from inside"
    assert seen["shm"] <= sandbox.Limits().disk_bytes, "/dev/shm is not size-limited"


@needs_namespaces
def test_a_kept_file_that_is_a_link_to_a_host_file_does_not_come_back(tmp_path):
    result, out = run_script(tmp_path, """
        import os
        os.symlink("/etc/passwd", "answer.txt")
    """, keep=["answer.txt"], wall_s=60)
    assert not (out / "answer.txt").exists()


needs_cgroups = pytest.mark.skipif(MODE == "none" or not sandbox.whole_submission_caps(),
                                   reason="the whole-submission caps need root and cgroups (v1 memory and pids, or v2)")


@needs_cgroups
def test_several_processes_each_under_the_per_process_limit_hit_the_submissions_memory_cap(tmp_path):
    # Four processes of 200 MiB each, under a 1 GiB address-space limit but over a 400 MiB total.
    result, out = run_script(tmp_path, """
        import subprocess, sys
        code = "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(3); print('held')"
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(4)]
        held = sum(p.communicate()[0].strip() == b"held" for p in procs)
        open("held.txt", "w").write(str(held))
    """, keep=["held.txt"], wall_s=90, memory_bytes=1 << 30, total_memory_bytes=400 << 20)
    held = int((out / "held.txt").read_text()) if (out / "held.txt").exists() else 0
    assert held < 4, "four processes held 800 MiB under a 400 MiB cap for the submission"
    assert any("memory" in cap for cap in result.caps), result.caps


BUSY = "import time\nwhile time.time() < END:\n    pass\n"   # END: the same wall-clock instant for all


@needs_cgroups
def test_submissions_graded_at_once_share_the_cpu_equally_however_many_processes_they_start(tmp_path):
    """Six busy processes in one sandbox, one in another, at once: with a CPU share per sandbox the one gets
    about as much CPU as the six together. Without it, about a sixth: each process in a session of its own
    is its own scheduling group (the kernel's autogroup), measured 1.5 s against 8.9 s."""
    import threading
    if not any("CPU" in cap for cap in sandbox.whole_submission_caps()):
        pytest.skip("no cpu cgroup controller here")
    busy = f"END = {time.time() + 8}\n" + BUSY
    greedy = f"""
        import resource, subprocess, sys
        procs = [subprocess.Popen([sys.executable, "-c", {busy!r}], start_new_session=True) for _ in range(6)]
        [p.wait() for p in procs]
        open("cpu.txt", "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime))
    """
    modest = f"""
        import time
        exec({busy!r})
        open("cpu.txt", "w").write(str(time.process_time()))
    """
    outs = {}
    runs = [threading.Thread(target=lambda name, body: outs.update({name: run_script(tmp_path / name, body,
                                                                                    keep=["cpu.txt"], wall_s=60)}),
                             args=(name, body)) for name, body in (("greedy", greedy), ("modest", modest))]
    for name in ("greedy", "modest"):
        (tmp_path / name).mkdir()
    [t.start() for t in runs]
    [t.join() for t in runs]
    cpu = {name: float((out / "cpu.txt").read_text()) for name, (_, out) in outs.items()}
    assert cpu["modest"] > 0.5 * cpu["greedy"], cpu


@needs_cgroups
def test_a_fork_bomb_ends_that_run_only(tmp_path):
    start = time.monotonic()
    result, out = run_script(tmp_path, """
        import os
        made = 0
        try:
            while made < 100000:
                if os.fork() == 0:
                    import time
                    time.sleep(30)
                    os._exit(0)
                made += 1
        except OSError:
            pass
        open("made.txt", "w").write(str(made))
        os._exit(0)
    """, keep=["made.txt"], wall_s=60, max_processes=64)
    assert int((out / "made.txt").read_text()) < 64
    assert time.monotonic() - start < 60
    assert not list(_python_sleepers())


def test_a_sandbox_that_cannot_start_says_why_instead_of_a_timeout(tmp_path):
    if MODE == "none":
        pytest.skip("no boundary here")
    work = tmp_path / "work"
    work.mkdir()
    result = sandbox.run([sys.executable, "-c", "pass"], work, [], tmp_path / "out", sandbox.Limits(wall_s=30),
                         view={str(tmp_path / "missing"): "/course"})
    assert not result.timed_out
    assert "sandbox could not start" in result.failure and "missing" in result.failure, result.failure


def test_without_the_boundary_nothing_untrusted_is_graded(tmp_path):
    """The grader refuses (and says what to install) where bwrap cannot make the boundary."""
    from assessment.grader import grade
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "x.ipynb").write_text("{}")
    saved = list(sandbox._MODE)
    sandbox._MODE[:] = ["none"]
    try:
        with pytest.raises(SystemExit) as stop:
            grade.main([str(tmp_path / "subs"), "--out", str(tmp_path / "out")])
        assert stop.value.code not in (0, None)
    finally:
        sandbox._MODE[:] = saved


@needs_namespaces
@pytest.mark.skipif(sandbox.seccomp_program() is None, reason="no seccomp filter for this architecture")
def test_processes_of_one_sandbox_cannot_trace_or_read_each_other(tmp_path):
    """Without the filter, PTRACE_ATTACH to a sibling succeeds (same uid) and process_vm_readv is let through."""
    result, out = run_script(tmp_path, """
        import ctypes, subprocess, sys, time
        libc = ctypes.CDLL(None, use_errno=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        time.sleep(0.3)
        attach = libc.ptrace(16, child.pid, 0, 0), ctypes.get_errno()          # PTRACE_ATTACH
        class Iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(8)
        local, remote = Iovec(ctypes.cast(buf, ctypes.c_void_p), 8), Iovec(0x400000, 8)
        read = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0), ctypes.get_errno()
        child.kill()
        open("seen.txt", "w").write(repr([attach, read]))
    """, keep=["seen.txt"], wall_s=60)
    assert eval((out / "seen.txt").read_text()) == [(-1, 1), (-1, 1)]   # EPERM, both
    assert any("seccomp" in cap for cap in result.caps), result.caps


@needs_namespaces
def test_a_kept_file_cannot_pass_for_the_frames_of_the_others(tmp_path):
    """An outside review: the grader once parsed what came back from the last marker, so a kept file holding
    the marker and a tar of its own replaced every other file (and a pax header there made Python's tar
    parser backtrack for minutes, in the grader's own process)."""
    result, out = run_script(tmp_path, """
        import io, tarfile
        forged = io.BytesIO()
        with tarfile.open(fileobj=forged, mode="w") as tar:
            info = tarfile.TarInfo("answer.txt")
            info.size = 6
            tar.addfile(info, io.BytesIO(b"forged"))
        frame = (1).to_bytes(2, "big") + (6).to_bytes(8, "big") + b"forged"
        marker = b"\\n--course-sandbox-files--\\n"
        open("carrier.bin", "wb").write(marker + forged.getvalue() + marker + frame)
        open("answer.txt", "w").write("honest")
    """, keep=["carrier.bin", "answer.txt"], wall_s=60)
    assert result.returncode == 0 and (out / "answer.txt").read_text() == "honest"

"""The grader's sandbox: limits hold, nothing escapes the run, nothing is left behind."""
from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from assessment import sandbox

MODE = sandbox.isolation_mode()
needs_namespaces = pytest.mark.skipif(MODE == "none", reason="unshare cannot make namespaces here (not root and no "
                                      "user namespaces): the grader falls back to sessions and limits only")


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


@pytest.mark.parametrize("mode", [MODE, "none"], ids=["this-machine", "no-namespaces"])
@pytest.mark.parametrize("environment", ["marked", "cleared"])
def test_a_process_that_leaves_the_session_is_killed_when_the_run_ends(tmp_path, mode, environment):
    # A grandchild in a new session; with its environment cleared, not even the run's marker names it.
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
def test_a_run_sees_only_its_own_processes_and_cannot_edit_the_course(tmp_path):
    from assessment.sandbox import REPO
    result, out = run_script(tmp_path, f"""
        import os
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        try:
            open({str(REPO / "assessment" / "criteria.py")!r}, "a").write("# changed")
            edit = "edited"
        except OSError as error:
            edit = type(error).__name__
        open("seen.txt", "w").write(f"{{len(pids)}} {{edit}}")
    """, keep=["seen.txt"], wall_s=60)
    count, edit = (out / "seen.txt").read_text().split()
    assert int(count) < 10, f"the run saw {count} processes: the machine's, not only its own"
    assert edit != "edited"


def test_a_sandbox_that_cannot_start_says_why_instead_of_a_timeout(tmp_path):
    # The supervisor cannot enter a working folder that does not exist: its own error must come back.
    result = sandbox.run([sys.executable, "-c", "pass"], tmp_path / "missing", [], tmp_path / "out",
                         sandbox.Limits(wall_s=30), mode="none")
    assert not result.timed_out and result.returncode is None
    assert "supervisor" in result.failure and "FileNotFoundError" in result.failure, result.failure

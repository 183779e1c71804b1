"""utils.cluster with engines="ssh": engines started over ssh, by a private sshd on this machine.

The fixture needs no system-wide ssh set-up and does not read or write ~/.ssh: it generates a
host key and a client key in a temporary directory and runs its own sshd (Debian:
apt-get install openssh-server openssh-client) on 127.0.0.1 and a free port, then stops it.
Tested with OpenSSH 9.2, as root.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from ipyparallel import interactive

from test_cluster import (_all_reduce_rank_plus_one, _wait_until_gone, clean,  # noqa: F401  (clean: fixture)
                          processes_where)
from utils import cluster

pytestmark = pytest.mark.timeout(300)


def _sshd_binary() -> str | None:
    return shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")


@dataclass
class Sshd:
    port: int
    folder: Path
    ssh_args: list  # for ssh: port, key, no host-key checks, no config files, no password prompts
    scp_args: list  # the same for scp (-P for the port)

    def log(self) -> str:
        return (self.folder / "sshd.log").read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """An sshd of its own on 127.0.0.1 that lets this user in with a key made for the test."""
    missing = [name for name, path in (("sshd", _sshd_binary()), ("ssh", shutil.which("ssh")),
                                       ("scp", shutil.which("scp")), ("ssh-keygen", shutil.which("ssh-keygen")))
               if path is None]
    if missing:
        pytest.skip(f"needs OpenSSH ({', '.join(missing)} not found): apt-get install openssh-server openssh-client")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdl-test", "-f", str(tmp_path / name)],
                       check=True, capture_output=True, timeout=30)
    shutil.copy(tmp_path / "client_key.pub", tmp_path / "authorized_keys")
    if os.geteuid() == 0:
        # sshd started by root insists on its privilege separation directory, which the system's
        # ssh service creates at boot (and which is absent where that service never ran).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    port = _free_port()
    config = tmp_path / "sshd_config"
    config.write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {tmp_path / "host_key"}
AuthorizedKeysFile {tmp_path / "authorized_keys"}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin {"prohibit-password" if os.geteuid() == 0 else "no"}
StrictModes no
UsePAM no
PidFile {tmp_path / "sshd.pid"}
# Sessions get the suite's home (tests/conftest.py), not the user's real one: what they write stays there.
SetEnv HOME={os.environ["HOME"]}
# scp uses the sftp protocol (OpenSSH 9)
Subsystem sftp internal-sftp
""")
    with open(tmp_path / "sshd.log", "w") as log:
        server = subprocess.Popen([_sshd_binary(), "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT)
    common = ["-F", "/dev/null", "-i", str(tmp_path / "client_key"), "-o", "IdentitiesOnly=yes",
              "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
              "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]
    found = Sshd(port=port, folder=tmp_path, ssh_args=["-p", str(port)] + common, scp_args=["-P", str(port)] + common)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, f"sshd exited with {server.returncode}:\n{found.log()}"
            probe = subprocess.run(["ssh", *found.ssh_args, "127.0.0.1", "true"], capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=30)
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, f"cannot ssh to the test's sshd: {probe.stderr}\n{found.log()}"
            time.sleep(0.2)
        yield found
    finally:
        sessions = psutil.Process(server.pid).children(recursive=True)
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        for proc in sessions:
            try:
                proc.kill()
            except psutil.Error:
                pass


def _processes_of(cluster_id: str) -> list[psutil.Process]:
    """Every process of the cluster, wherever it came from: ipyparallel gives the controller and
    each engine (and so the engine's nanny) the cluster id in IPP_CLUSTER_ID."""
    return processes_where(lambda proc: proc.environ().get("IPP_CLUSTER_ID") == cluster_id
                           or cluster_id in " ".join(proc.cmdline()))


@interactive  # sent by value: the engines cannot import this test module
def _interpreter_and_utils():
    import os
    import sys

    import utils

    return sys.executable, os.path.dirname(utils.__file__)


def test_ssh_engines_start_reduce_and_stop(sshd, clean, monkeypatch):
    """The README's SSH example, with the ssh settings of the test's sshd and two engines on 127.0.0.1."""
    workers = cluster.start(2, engines="ssh", backend="gloo", activate=False, controller_ip="*",
                            launcher_config={"SSHEngineSetLauncher": {"engines": {"127.0.0.1": 2},
                                                                      "ssh_args": sshd.ssh_args,
                                                                      "scp_args": sshd.scp_args}})
    clean()
    cluster_id = workers.cluster.cluster_id
    procs = _processes_of(cluster_id)
    try:
        engines = {proc.pid: proc for proc in procs if proc.pid in workers.pids}
        assert sorted(engines) == sorted(workers.pids), "each engine's pid must be a process of the cluster"
        for proc in engines.values():
            # Started by sshd, not by this process: the session's variables name the test's sshd,
            # and this process is not among the engine's ancestors (local engines are its children).
            assert proc.environ().get("SSH_CONNECTION", "").split()[-1:] == [str(sshd.port)], proc.environ()
            assert os.getpid() not in [parent.pid for parent in proc.parents()]
        assert "Accepted publickey" in sshd.log()

        assert workers.view.pull("rank") == [0, 1]
        assert workers.view.targets == [0, 1], "engine ids (the labels of %%px output) must be the ranks"
        assert workers.view.pull("world_size") == [2, 2]
        assert workers.hosts == [socket.gethostname()] * 2
        assert workers.master.startswith(socket.gethostname() + ":")
        assert workers.run(_all_reduce_rank_plus_one) == [(0, 2, [3.0] * 3), (1, 2, [3.0] * 3)]
        # No remote_python was given: the ssh session's python3 is not this environment's.
        utils_dir = str(Path(cluster.__file__).parent)
        assert workers.run(_interpreter_and_utils) == [(sys.executable, utils_dir)] * 2
    finally:
        # As with engines on other machines, stop() must not signal the engines' pids here:
        # ipyparallel's ssh launcher has to stop them (over ssh), or the check below fails.
        pids_here = cluster._cluster_pids
        monkeypatch.setattr(cluster, "_cluster_pids", lambda w: [p for p in pids_here(w) if p not in w.pids])
        cluster.stop()
    assert cluster.running() is None
    left = _wait_until_gone(procs + _processes_of(cluster_id), 20)
    assert not left, f"processes left behind: {[' '.join(p.cmdline()) for p in left]}"
    assert not _processes_of(cluster_id)


def test_pids_of_engines_on_other_hosts_are_never_signalled_here():
    """An ssh engine's pid (from the engine or its launcher) is a process on the engine's host; a
    process here with that number is another program, which stop() and the watchdog must spare."""
    from ipyparallel.cluster.launcher import SSHEngineLauncher

    here, mine = socket.gethostname(), os.getpid()
    engine_set = SimpleNamespace(launchers={"node1/0": SSHEngineLauncher(pid=mine)}, pid=-1)
    remote = cluster.Workers(cluster=SimpleNamespace(controller=None, engines={"set": engine_set}), client=None,
                             view=None, n=1, backend="gloo", engines="ssh", timeout=60, hosts=[here + "-other-node"],
                             pids=[mine])
    assert cluster._cluster_pids(remote) == []
    remote.hosts = [here]  # an engine that ssh started on this machine is stopped here too
    assert cluster._cluster_pids(remote) == [mine]

"""Two "machines" on this one: Linux network namespaces joined by a veth pair.

Each host is a network namespace (its own interfaces, addresses and ports) with its own host
name (a UTS namespace), its own /etc/hosts naming both hosts (``ip netns exec`` mounts
/etc/netns/NAME/hosts over /etc/hosts) and its own sshd on port 22, which logs this user in with
a key made for the run. Every process that sshd starts inherits the host's name, addresses and
/etc/hosts, as on a real machine; the file system and the Python environment are shared, as on
a cluster with a shared home. Only the addresses made here (10.200.0.1 and .2, on the veth)
and loopback are used: nothing is routed out of the namespaces.

Everything made here is named with PREFIX; ``sweep()`` kills every process in a namespace of
that name and removes the namespaces and their /etc/netns folders, so a run that was killed
leaves nothing behind for the next. One set of hosts at a time on a machine: a lock file (freed
by the kernel when its holder dies, however it dies) makes a second run wait instead of sweeping
away the hosts of one that is still running. Needs root, iproute2 and OpenSSH (Debian: apt-get install
iproute2 openssh-server openssh-client); used by tests/test_multihost.py and
benchmarks/bench_multihost.py.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "pdlmh"  # "parallel deep learning, multi-host": namespaces, links, host names, /etc/netns
SUBNET = "10.200.0"
SSH_PORT = 22  # each host has its own port space: every sshd listens on 22, as on real machines
LOCK = Path("/tmp") / f".{PREFIX}.lock"
_lock_depth = 0


@contextlib.contextmanager
def exclusive(seconds: float = 900):
    """Hold the machine-wide lock (re-entrant within this process) for at most ``seconds`` of waiting."""
    global _lock_depth
    if _lock_depth:
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
        return
    with open(LOCK, "a") as handle:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another run has held {LOCK} for {seconds:g} s; is it stuck?") from None
                time.sleep(1)
        _lock_depth = 1
        try:
            yield
        finally:
            _lock_depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _sshd_binary() -> str | None:
    return shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")


def namespaces() -> list[str]:
    """This machine's network namespaces that carry PREFIX."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.startswith(PREFIX + "-")]


def pids_in(netns: str) -> list[int]:
    result = _ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in result.stdout.split()]


def _kill_all(netns: str, seconds: float = 10) -> list[int]:
    """SIGKILL every process in ``netns`` until none is left; returns the ones that would not go."""
    deadline = time.monotonic() + seconds
    while True:
        pids = [pid for pid in pids_in(netns) if pid != os.getpid()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)
        for pid in pids:  # reap our own children (sshd, drivers) so they are not left as zombies
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def sweep() -> list[str]:
    """Remove every namespace, process and /etc/netns folder that carries PREFIX; returns what
    was found (leftovers of an earlier run that was killed, or of the run that ends now)."""
    with exclusive():
        return _sweep()


def _sweep() -> list[str]:
    found = []
    for netns in namespaces():
        found.append(netns)
        _kill_all(netns)
        _ip("netns", "delete", netns, check=False)  # its veth end goes with it, and so the pair
    for folder in Path("/etc/netns").glob(PREFIX + "-*"):
        shutil.rmtree(folder, ignore_errors=True)
    return found


def unavailable() -> str | None:
    """Why hosts cannot be made here (a sentence to skip with), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nsenter", "unshare", "hostname", "ssh", "ssh-keygen") if not shutil.which(tool)]
    if _sshd_binary() is None:
        missing.append("sshd")
    if missing:
        return f"needs {', '.join(missing)}: apt-get install iproute2 util-linux openssh-server openssh-client"
    probe = f"{PREFIX}-probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    _ip("netns", "delete", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here ({made.stderr.strip()})"
    return None


@dataclass
class Host:
    index: int
    netns: str  # pdlmh-h1
    name: str  # its host name: pdlmh-node1
    address: str  # 10.200.0.1, on its end of the veth
    link: str  # its end of the veth: pdlmh-v1
    sshd: subprocess.Popen | None = None
    log: Path | None = None

    def command(self, *args: str) -> list[str]:
        """``args`` run on this host: in its network, host-name and mount (/etc/hosts) namespaces."""
        return ["nsenter", "-t", str(self.sshd.pid), "-n", "-u", "-m", "--", *args]

    def run(self, *args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout, **kwargs)

    def popen(self, *args: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args), **kwargs)

    def pids(self) -> list[int]:
        """Every process on this host (its sshd included)."""
        return pids_in(self.netns)

    def link_bytes(self) -> int:
        """Bytes sent plus received by this host's end of the veth so far."""
        (link,) = json.loads(_ip("-n", self.netns, "-s", "-j", "link", "show", "dev", self.link).stdout)
        return link["stats64"]["rx"]["bytes"] + link["stats64"]["tx"]["bytes"]

    def set_link(self, up: bool) -> None:
        _ip("-n", self.netns, "link", "set", self.link, "up" if up else "down")

    def limit_rate(self, rate: str | None) -> None:
        """Shape what this host sends to ``rate`` (tc's units, e.g. "1gbit"), or remove the limit.
        A token bucket (tbf) only: netem, which adds delay, is not in every kernel (not in this
        machine's), and the rate alone shows beta of the alpha-beta model."""
        _ip("-n", self.netns, "link", "show", self.link)  # fails clearly if the host is gone
        base = ["ip", "netns", "exec", self.netns, "tc", "qdisc"]
        subprocess.run(base + ["del", "dev", self.link, "root"], capture_output=True, timeout=30)
        if rate:
            subprocess.run(base + ["add", "dev", self.link, "root", "tbf", "rate", rate, "burst", "256kb",
                                   "latency", "100ms"], capture_output=True, text=True, timeout=30, check=True)


@dataclass
class Hosts:
    hosts: list
    folder: Path
    ssh_args: list = field(default_factory=list)  # for ssh from any host to any host: key, port, no prompts
    scp_args: list = field(default_factory=list)

    def __getitem__(self, i) -> Host:
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def logs(self) -> str:
        return "\n".join(f"--- {host.name} sshd:\n{host.log.read_text(errors='replace')[-2000:]}"
                         for host in self.hosts if host.log and host.log.exists())


def _start_sshd(host: Host, folder: Path) -> None:
    config = folder / f"sshd_config_{host.name}"
    config.write_text(f"""\
Port {SSH_PORT}
ListenAddress {host.address}
ListenAddress 127.0.0.1
HostKey {folder / "host_key"}
AuthorizedKeysFile {folder / "authorized_keys"}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {folder / f"sshd_{host.name}.pid"}
# Sessions get the suite's home (tests/conftest.py), not the user's real one: what they write stays there.
SetEnv HOME={os.environ["HOME"]}
Subsystem sftp internal-sftp
""")
    host.log = folder / f"sshd_{host.name}.log"
    # ip netns exec and unshare exec (no fork), so the Popen's pid becomes sshd's: the host's
    # other processes join its namespaces through it (Host.command).
    with open(host.log, "w") as log:
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
             host.name, _sshd_binary(), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def two_hosts(folder: Path, timeout: float = 30):
    """Two hosts joined by a veth, each with its sshd; everything is removed on the way out, also
    after an error. Leftovers of an earlier run are swept first."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    with exclusive():
        yield from _two_hosts(Path(folder), timeout)


def _two_hosts(folder: Path, timeout: float):
    _sweep()
    hosts = [Host(index=i, netns=f"{PREFIX}-h{i}", name=f"{PREFIX}-node{i}", address=f"{SUBNET}.{i}",
                  link=f"{PREFIX}-v{i}") for i in (1, 2)]
    try:
        etc_hosts = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in hosts)
        for host in hosts:
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            os.makedirs(f"/etc/netns/{host.netns}", exist_ok=True)
            Path(f"/etc/netns/{host.netns}/hosts").write_text(etc_hosts)
        _ip("link", "add", hosts[0].link, "netns", hosts[0].netns, "type", "veth",
            "peer", "name", hosts[1].link, "netns", hosts[1].netns)
        for host in hosts:
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.link)
            host.set_link(True)
        for name in ("host_key", "client_key"):
            for old in (folder / name, folder / f"{name}.pub"):  # ssh-keygen would ask before overwriting
                old.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", PREFIX, "-f", str(folder / name)],
                           check=True, capture_output=True, timeout=30)
        shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for host in hosts:
            _start_sshd(host, folder)
        common = ["-F", "/dev/null", "-i", str(folder / "client_key"), "-o", "IdentitiesOnly=yes",
                  "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                  "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"]
        made = Hosts(hosts=hosts, folder=folder, ssh_args=["-p", str(SSH_PORT)] + common,
                     scp_args=["-P", str(SSH_PORT)] + common)
        deadline = time.monotonic() + timeout
        for source in hosts:  # every host logs in to every host by name, and finds its name there
            for target in hosts:
                while True:
                    for host in hosts:
                        assert host.sshd.poll() is None, f"sshd of {host.name} exited:\n{made.logs()}"
                    probe = source.run("ssh", *made.ssh_args, target.name, "hostname", timeout=30)
                    if probe.returncode == 0 and probe.stdout.strip() == target.name:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{source.name} cannot ssh to {target.name}: {probe.stdout}"
                                           f"{probe.stderr}\n{made.logs()}")
                    time.sleep(0.2)
        yield made
    finally:
        for host in hosts:
            if host.sshd is not None and host.sshd.poll() is None:
                host.sshd.kill()
        _sweep()
        for host in hosts:
            if host.sshd is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.sshd.wait(10)

"""What a learner's notebook does on the first of two hosts (tests/netns.py), run there by
tests/test_multihost.py:

    python multihost_notebook.py SCENARIO SETTINGS_JSON

It starts engines on both hosts with utils.cluster exactly as the README's SSH example does,
does what SCENARIO says, stops the cluster and prints one line of JSON with what it saw, for
the test to check. Every process it waits for has a deadline.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import netns  # noqa: E402
from utils import cluster  # noqa: E402


def _where():
    """On each engine: who am I, where, and does engine 0's host name resolve from here."""
    import os
    import socket

    import torch
    import torch.distributed as dist

    master = os.environ["MASTER_ADDR"]
    x = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    return dict(rank=dist.get_rank(), host=socket.gethostname(), local_rank=int(os.environ["LOCAL_RANK"]),
                master=master, master_ip=socket.gethostbyname(master), sum=x.tolist())


def _mpi_where():
    import socket

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.Get_rank(), socket.gethostname(), world.allreduce(world.Get_rank() + 1)


def _all_reduce_mib(mib: int, times: int):
    import torch
    import torch.distributed as dist

    x = torch.ones(mib * 2**18)  # float32
    for _ in range(times):
        dist.all_reduce(x)
    return x[0].item()


def _all_reduce_for(seconds: float):
    """All-reduces for ``seconds`` (the killed host's ranks never finish theirs)."""
    import time

    import torch
    import torch.distributed as dist

    x = torch.ones(2**16)
    end = time.monotonic() + seconds
    calls = 0
    while time.monotonic() < end:
        dist.all_reduce(x)
        calls += 1
    return calls


def _others_alive(hosts, allowed) -> dict:
    """Processes on each host other than ``allowed`` (the sshds and this process); zombies (ended,
    not yet reaped by their parent) do not count."""
    return {host.name: [pid for pid in netns.pids_in(host.netns) if pid not in allowed and not _zombie(pid)]
            for host in hosts}


def _zombie(pid: int) -> bool:
    try:  # the state follows the command name in parentheses, which may itself hold spaces
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def _wait_for_nothing_left(hosts, allowed, seconds: float = 30) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        left = _others_alive(hosts, allowed)
        if not any(left.values()) or time.monotonic() > deadline:
            return {name: [_cmdline(pid) for pid in pids] for name, pids in left.items()}
        time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid} (gone)"


def main(scenario: str, settings: dict) -> dict:
    hosts = [netns.Host(**host) for host in settings["hosts"]]
    allowed = set(settings["sshd_pids"]) | {os.getpid()}
    report: dict = {"scenario": scenario}
    if scenario == "mpi":
        # mpich's mpiexec starts its proxies on the other hosts over ssh; on a cluster plain ssh
        # logs in, here ssh needs the test's key and options, so mpiexec runs a wrapper with them.
        wrapper = Path(settings["folder"]) / "ssh-for-mpiexec"
        wrapper.write_text("#!/bin/sh\nexec ssh " + " ".join(settings["ssh_args"]) + ' "$@"\n')
        wrapper.chmod(0o755)
        hosts_arg = ",".join(f"{host.name}:2" for host in hosts)
        launcher = {"MPIEngineSetLauncher": {"mpi_args": ["-launcher", "ssh", "-launcher-exec", str(wrapper),
                                                          "-hosts", hosts_arg]}}
        engines = "mpi"
    else:
        launcher = {"SSHEngineSetLauncher": {"engines": {host.name: 2 for host in hosts},
                                             "ssh_args": settings["ssh_args"], "scp_args": settings["scp_args"]}}
        engines = "ssh"
    started = time.monotonic()
    workers = cluster.start(4, engines=engines, backend="gloo", activate=False, controller_ip="*",
                            timeout=settings["cluster_timeout"], launcher_config=launcher)
    report.update(start_s=time.monotonic() - started, hosts=workers.hosts, master=workers.master)
    try:
        report["ranks"] = workers.run(_where)
        if scenario == "mpi":
            report["mpi"] = workers.run(_mpi_where)
        if scenario in ("ssh", "mpi"):
            before = hosts[0].link_bytes()
            report["all_reduce"] = workers.run(_all_reduce_mib, 4, 2)
            report["link_bytes"] = hosts[0].link_bytes() - before
        elif scenario == "host-dies":
            victim = hosts[1]

            def kill_host():
                report["killed"] = netns._kill_all(victim.netns) == []  # every process, its sshd too
            killer = threading.Timer(settings["kill_after"], kill_host)
            killer.start()
            began = time.monotonic()
            try:
                workers.run(_all_reduce_for, 120)
                report["error"] = None
            except Exception as error:  # what the learner's cell shows
                report["error"] = f"{type(error).__name__}: {error}"
            report["error_after_s"] = time.monotonic() - began - settings["kill_after"]
            killer.join()
    finally:
        began = time.monotonic()
        cluster.stop()
        report["stop_s"] = time.monotonic() - began
    report["left"] = _wait_for_nothing_left(hosts, allowed)
    return report


if __name__ == "__main__":
    try:
        result = main(sys.argv[1], json.loads(sys.argv[2]))
    except Exception:
        result = {"crash": traceback.format_exc()}
    print("RESULT " + json.dumps(result), flush=True)

"""utils.cluster with engines="slurm": engines as a batch job on a private one-node Slurm cluster.

The fixture needs no system-wide Slurm set-up: it starts its own munged, slurmctld and slurmd
(Debian: apt-get install slurm-wlm munge) with a slurm.conf in a temporary directory, and stops
them afterwards. Tested with Slurm 22.05 and munge 0.5.15, as root.
"""
from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from ipyparallel import interactive

from test_cluster import (_all_reduce_rank_plus_one, _wait_until_gone, clean,  # noqa: F401  (clean: fixture)
                          processes_where)
from utils import cluster

DAEMONS = ("munged", "slurmctld", "slurmd")  # often in /usr/sbin, which a user's PATH may lack
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")  # ipyparallel runs these from PATH


@dataclass
class Slurm:
    conf: Path
    folder: Path
    daemons: dict  # name -> Popen

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str) -> str:
        return subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=30,
                              check=True).stdout

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.folder.glob("*.log")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _stop(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=15)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A private Slurm cluster of this machine alone: its own munged, slurmctld and slurmd."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    which = {name: shutil.which(name, path=path) for name in DAEMONS} | {name: shutil.which(name) for name in CLIENTS}
    missing = [name for name, found in which.items() if found is None]
    if missing:
        pytest.skip(f"needs Slurm and munge ({', '.join(missing)} not found): apt-get install slurm-wlm munge")
    folder = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = folder / "munge.socket"
    host = socket.gethostname().split(".")[0]  # slurmd finds its node by the short host name
    user = getpass.getuser()
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=pdltest
SlurmctldHost={host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
StateSaveLocation={folder / 'state'}
SlurmdSpoolDir={folder / 'spool'}
SlurmctldPidFile={folder / 'slurmctld.pid'}
SlurmdPidFile={folder / 'slurmd.pid'}
SlurmctldLogFile={folder / 'slurmctld.log'}
SlurmdLogFile={folder / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
NodeName={host} CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    cluster_ = Slurm(conf=conf, folder=folder, daemons={})
    env = cluster_.env()
    # --force: munged refuses a socket in a directory that not everyone may enter (pytest's tmp
    # directories are 0700); -F: in the foreground, so that it is our child and stops with us.
    commands = {
        "munged": [which["munged"], "-F", "--force", f"--socket={socket_path}", f"--key-file={key}",
                   f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                   f"--seed-file={folder / 'munged.seed'}"],
        "slurmctld": [which["slurmctld"], "-D", "-f", str(conf)],
        "slurmd": [which["slurmd"], "-D", "-f", str(conf)],
    }
    try:
        for name, command in commands.items():
            with open(folder / f"{name}.out", "w") as out:
                cluster_.daemons[name] = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                                          stderr=subprocess.STDOUT)
            if name == "munged":
                deadline = time.monotonic() + 20
                while not socket_path.exists() and time.monotonic() < deadline:
                    assert cluster_.daemons[name].poll() is None, f"munged exited:\n{cluster_.logs()}"
                    time.sleep(0.1)
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            for name, proc in cluster_.daemons.items():
                assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{cluster_.logs()}"
            result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True,
                                    timeout=30)
            state = result.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        assert state == "idle", f"the Slurm node is {state or 'not up'} after 60 s:\n{cluster_.logs()}"
        yield cluster_
    finally:
        # Jobs first: slurmstepd detaches from slurmd, and a job's steps outlive stopped daemons.
        if all(p.poll() is None for p in cluster_.daemons.values()):
            subprocess.run(["scancel", "--user", user], env=env, capture_output=True, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "-h"], env=env, capture_output=True, text=True, timeout=30).stdout.strip():
                time.sleep(0.5)
        daemons = {name: psutil.Process(p.pid) for name, p in cluster_.daemons.items() if p.poll() is None}
        _stop([p for name, p in daemons.items() if name != "munged"])  # they need munged to stop cleanly
        _stop(list(daemons.values()))
        for popen in cluster_.daemons.values():
            popen.wait(timeout=10)
        left = _wait_until_gone(_private_slurm_processes(cluster_), 15)
        _stop(left)
        assert not left, f"processes of the private Slurm left: {[p.cmdline() for p in left]}"


def _private_slurm_processes(slurm: Slurm) -> list[psutil.Process]:
    """Every process that runs with this Slurm's configuration: daemons, slurmstepd, jobs, engines."""
    return processes_where(lambda proc: proc.environ().get("SLURM_CONF") == str(slurm.conf)
                           or str(slurm.folder) in " ".join(proc.cmdline()))


@interactive  # sent by value: the engines cannot import this test module
def _where_am_i():
    import os
    import sys

    import utils

    return (os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_PROCID"), sys.executable,
            os.path.dirname(os.path.dirname(utils.__file__)))


def _processes_of(slurm: Slurm, cluster_id: str, job_id: str) -> list[psutil.Process]:
    """The job's processes: engines, srun and the batch script (their environment names the
    ipyparallel cluster), and its slurmstepd processes ("slurmstepd: [JOB.STEP]")."""
    def of_the_job(proc) -> bool:
        environ = proc.environ()
        return environ.get("IPP_CLUSTER_ID") == cluster_id or (
            environ.get("SLURM_CONF") == str(slurm.conf) and f"[{job_id}." in " ".join(proc.cmdline()))

    return processes_where(of_the_job)


def _active_jobs(slurm: Slurm) -> dict:
    lines = slurm.run("squeue", "-h", "-o", "%i|%j|%T|%k").splitlines()
    return {line.split("|")[0]: line.split("|")[1:] for line in lines}


@pytest.mark.timeout(300)
def test_slurm_engines_form_a_group_and_stop_with_their_job(slurm, monkeypatch, clean):  # noqa: F811
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # sbatch, squeue and scancel read it
    started = time.monotonic()
    try:
        # As README.md's example: sbatch's options go in submit_command (ipyparallel 9 writes
        # SlurmLauncher.options into no script).
        workers = cluster.start(2, engines="slurm", backend="gloo", timeout=120, activate=False, controller_ip="*",
                                launcher_config={"SlurmEngineSetLauncher": {
                                    "timelimit": "00:10:00",
                                    "submit_command": ["sbatch", "--ntasks-per-node=2", "--comment=pdl-slurm-test"]}})
    except cluster.ClusterError as error:
        pytest.fail(f"{error}\n{slurm.logs()}")
    print(f"slurm engines started in {time.monotonic() - started:.1f} s")
    clean()
    (engine_set,) = workers.cluster.engines.values()
    job = engine_set.job_id
    cluster_id = workers.cluster.cluster_id
    assert _active_jobs(slurm).get(job) == [f"ipengine-{cluster_id}", "RUNNING", "pdl-slurm-test"]

    assert workers.view.pull("rank") == [0, 1]
    assert workers.view.targets == [0, 1], "engine ids (the labels of %%px output) must be the ranks"
    assert workers.view.pull("world_size") == [2, 2]
    assert workers.run(_all_reduce_rank_plus_one) == [(0, 2, [3.0] * 3), (1, 2, [3.0] * 3)]
    where = workers.run(_where_am_i)
    root = str(Path(cluster.__file__).resolve().parent.parent)
    assert [w[0] for w in where] == [job, job], "every engine runs inside the batch job"
    assert sorted(w[1] for w in where) == ["0", "1"], "one engine per Slurm task"
    assert {w[2] for w in where} == {sys.executable}, "engines use this environment's Python"
    assert {w[3] for w in where} == {root}, "engines import this repository's utils"
    assert Path(engine_set.batch_file).parent == Path(workers.cluster.profile_dir), "not in the notebook's folder"

    procs = _processes_of(slurm, cluster_id, job)
    assert set(workers.pids) <= {p.pid for p in procs}
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not set(workers.pids) & mine, "engines are Slurm's processes, not this test's"

    cluster.stop()
    deadline = time.monotonic() + 30
    while job in _active_jobs(slurm) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job not in _active_jobs(slurm), "cluster.stop() must end the batch job"
    assert "JobState=CANCELLED" in slurm.run("scontrol", "show", "job", job), "scancel ended it"
    left = _wait_until_gone(procs + _processes_of(slurm, cluster_id, job), 30)
    assert not left, f"processes left behind: {[' '.join(p.cmdline()) for p in left]}"


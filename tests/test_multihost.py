"""Several machines, on this one: engines and torchrun across two hosts made of network namespaces.

tests/netns.py makes two hosts joined by a veth, each with its own host name, addresses and
sshd. The notebook's side runs on host 1 (tests/multihost_notebook.py, as a learner's kernel on
the first node of a cluster), engines on both. Skipped, with the reason, where namespaces
cannot be made (not root, no iproute2 or OpenSSH: .ci/setup/11-netns.sh installs them).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import netns
from utils import export

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "multihost_notebook.py"


@pytest.fixture(scope="module", autouse=True)
def _sweep_leftovers():
    """A run that was killed (no teardown) left namespaces and processes: remove them first."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"several hosts need network namespaces: {reason}")
    netns.sweep()
    yield
    assert netns.sweep() == [], "a test left a namespace behind"


@pytest.fixture
def hosts(tmp_path):
    with netns.two_hosts(tmp_path) as made:
        yield made
    assert netns.namespaces() == [], "namespaces left after the hosts were removed"


def _settings(hosts, **extra) -> str:
    return json.dumps(dict(hosts=[dict(index=h.index, netns=h.netns, name=h.name, address=h.address, link=h.link)
                                  for h in hosts],
                           sshd_pids=[h.sshd.pid for h in hosts], ssh_args=hosts.ssh_args,
                           scp_args=hosts.scp_args, **extra))


def _notebook(hosts, scenario: str, timeout: float = 420, **settings) -> dict:
    """Run the notebook's side on host 1; its report, or a failure with its output and the sshd logs."""
    done = hosts[0].run(sys.executable, str(NOTEBOOK), scenario, _settings(hosts, **settings), timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the notebook printed no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    report = json.loads(lines[-1][len("RESULT "):])
    assert "crash" not in report, f"{report['crash']}\n{done.stderr[-3000:]}\n{hosts.logs()}"
    return report


def _mpi_missing() -> str:
    import importlib.util
    if shutil.which("mpiexec", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}") is None:
        return "mpiexec"
    return "" if importlib.util.find_spec("mpi4py") else "mpi4py"


@pytest.mark.parametrize("engines", ["ssh", "mpi"])
def test_engines_on_two_hosts(hosts, engines):
    """cluster.start(4, engines=...) with 2 engines per host, over ssh (ipyparallel's SSH launcher)
    or mpiexec (mpich's hydra, which starts the other host's ranks over ssh): ranks, LOCAL_RANK,
    rendezvous by host name, an all-reduce over the veth, nothing left on either host after stop()."""
    if engines == "mpi" and (missing := _mpi_missing()):
        pytest.skip(f"MPI engines need {missing}: `make venv` installs mpich and mpi4py")
    report = _notebook(hosts, engines, cluster_timeout=60, folder=str(hosts.folder))
    names = [h.name for h in hosts]
    assert sorted(report["hosts"]) == sorted(names * 2), f"2 engines per host: {report['hosts']}"
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["host"] for r in ranks] == report["hosts"], "each engine runs on the host it reported"
    for r in ranks:
        assert r["local_rank"] == report["hosts"][:r["rank"]].count(r["host"]), f"LOCAL_RANK is its index on its host: {ranks}"
        assert r["sum"] == [10.0] * 3, "1 + 2 + 3 + 4 on every rank"
        # The rendezvous is engine 0's host name, found by each host's /etc/hosts.
        assert r["master"] == report["hosts"][0]
        assert r["master_ip"] == hosts[names.index(r["master"])].address
    assert report["master"].split(":")[0] == report["hosts"][0]
    assert report["all_reduce"] == [4.0 ** 2] * 4, "two all-reduces of ones over 4 ranks"
    # A 4 MiB all-reduce twice between two hosts sends at least 4 MiB through the veth.
    assert report["link_bytes"] > 4 * 2**20, f"only {report['link_bytes']} bytes crossed the veth"
    if engines == "mpi":  # ranks follow MPI's, whose ranks 0, 1 are on the first host of -hosts
        assert report["hosts"] == [names[0]] * 2 + [names[1]] * 2
        assert report["mpi"] == [[rank, report["hosts"][rank], 10] for rank in range(4)], report["mpi"]
    assert report["left"] == {name: [] for name in names}, f"processes left after cluster.stop(): {report['left']}"


def test_a_host_that_dies_during_a_collective(hosts):
    """Every process of host 2 (its sshd too) is killed while all ranks all-reduce: the notebook
    gets an error naming the lost ranks before the run's deadline, stop() ends what is left."""
    report = _notebook(hosts, "host-dies", cluster_timeout=60, kill_after=3)
    assert report["killed"], "host 2's processes would not die"
    lost = [rank for rank, host in enumerate(report["hosts"]) if host == hosts[1].name]
    error = report["error"] or ""
    # A RankError, not the TimeoutError of a run that waited until its deadline: the heartbeat finds
    # the dead engines within 30 s, the survivors' all_reduce fails at the group's 60 s timeout, and
    # the error comes before the run's deadline, the group's timeout + 10 s.
    assert error.startswith(f"RankError: rank(s) {lost} lost"), error[:2000]
    assert report["error_after_s"] < 60 + 10, f"the error came {report['error_after_s']:.0f} s after the kill"
    for rank in lost:
        assert f"rank {rank} on {hosts[1].name}: its engine died" in error, error[:2000]
    for rank in set(range(4)) - set(lost):  # the survivors saw their peer go, over the veth
        assert f"rank {rank}: RuntimeError" in error and hosts[1].address in error, error[:2000]
    assert report["left"] == {h.name: [] for h in hosts}, f"processes left after cluster.stop(): {report['left']}"


def train_to_file(out: str, steps: int = 4):
    """Exported to a torchrun script: a small DDP job on a global batch of 32 split over the ranks;
    each rank records where it ran, rank 0 saves the final weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(steps, 32, 8, generator=data)
    y = x.sum(dim=2, keepdim=True).sin()
    share = 32 // world_size
    for step in range(steps):
        mine = slice(rank * share, (rank + 1) * share)
        loss = torch.nn.functional.mse_loss(ddp(x[step, mine]), y[step, mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    Path(out, f"rank{rank}.json").write_text(json.dumps(dict(
        rank=rank, world_size=world_size, host=socket.gethostname(), local_rank=int(os.environ["LOCAL_RANK"]),
        master=os.environ["MASTER_ADDR"])))
    if rank == 0:
        torch.save(model.state_dict(), Path(out, "weights.pt"))


def _finish(jobs: list, seconds: float) -> list[str]:
    """Wait for every job; on a deadline kill them all (the fixture's sweep ends the rest)."""
    deadline = time.monotonic() + seconds
    outputs = []
    for job in jobs:
        try:
            out, _ = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in jobs:
                other.kill()
            out, _ = job.communicate()
            out += f"\n(killed after {seconds:g} s)"
        outputs.append(f"exit {job.returncode}:\n{out[-3000:]}")
    return outputs


def test_torchrun_across_two_hosts_matches_one_host(hosts, tmp_path):
    """The script utils.export writes, run by torchrun on both hosts (2 processes each, c10d
    rendezvous on host 1), ends with the weights of the same 4-process job on one host."""
    script = export.torchrun_script(tmp_path / "job.py", train_to_file, call=f"train_to_file({str(tmp_path)!r})",
                                    imports="import json\nimport socket\nfrom pathlib import Path")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    common = [torchrun, "--nproc-per-node", "2", "--max-restarts", "0"]
    # One torch thread per process: 4 processes share this machine's cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [host.popen(*common, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "pdl-multihost",
                       "--rdzv-endpoint", f"{hosts[0].name}:29400", "--rdzv-conf", "join_timeout=120",
                       str(script), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       cwd=tmp_path) for host in hosts]
    outputs = _finish(jobs, 240)
    assert all(job.returncode == 0 for job in jobs), "\n".join(outputs)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    names = [r["host"] for r in ranks]
    assert sorted(names) == sorted([h.name for h in hosts] * 2), ranks
    for r in ranks:
        assert r["world_size"] == 4 and r["local_rank"] == names[:r["rank"]].count(r["host"]), ranks
        assert r["master"] == names[0], "MASTER_ADDR is the host name of rank 0's node"
    across = torch.load(tmp_path / "weights.pt")
    for made in [tmp_path / "weights.pt", *tmp_path.glob("rank*.json")]:
        made.unlink()  # the one-host run writes them again

    one = tmp_path / "one_host"
    one.mkdir()
    (single,) = [hosts[0].popen(torchrun, "--standalone", "--nproc-per-node", "4", "--max-restarts", "0",
                                str(script), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=one)]
    outputs = _finish([single], 240)
    assert single.returncode == 0, outputs[0]
    # The script writes into tmp_path: the one-host run's files replace the two-host run's.
    alone = torch.load(tmp_path / "weights.pt")
    assert {json.loads((tmp_path / f"rank{r}.json").read_text())["host"] for r in range(4)} == {hosts[0].name}
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).state_dict()
    assert not torch.equal(across["0.weight"], start["0.weight"]), "the job did not train"
    for name in across:
        torch.testing.assert_close(across[name], alone[name], rtol=0, atol=1e-6,
                                   msg=lambda text, name=name: f"{name}: two hosts and one host differ: {text}")


def test_sweep_removes_what_a_killed_run_left():
    """A run killed without its teardown leaves a namespace with processes in it: the sweep ends them."""
    leftover = f"{netns.PREFIX}-h9"
    with netns.exclusive():
        subprocess.run(["ip", "netns", "add", leftover], check=True, capture_output=True, timeout=30)
        os.makedirs(f"/etc/netns/{leftover}", exist_ok=True)
        sleeper = subprocess.Popen(["ip", "netns", "exec", leftover, "sleep", "600"], start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while netns.pids_in(leftover) != [sleeper.pid] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert netns.pids_in(leftover) == [sleeper.pid]
            assert netns.sweep() == [leftover]
            sleeper.wait(timeout=30)  # the sweep killed it (and, as its parent's, reaped it)
            assert not os.path.exists(f"/proc/{sleeper.pid}"), "the sweep kills what runs in the namespace"
            assert leftover not in netns.namespaces() and not os.path.exists(f"/etc/netns/{leftover}")
        finally:
            sleeper.kill()
            sleeper.wait()
            netns.sweep()


def test_hosts_are_removed_when_a_test_fails(tmp_path):
    class Failed(Exception):
        pass

    with pytest.raises(Failed):
        with netns.two_hosts(tmp_path) as hosts:
            sshds = [host.sshd for host in hosts]
            job = hosts[1].popen("sleep", "600")  # an engine, say, still running on host 2
            raise Failed()
    assert netns.namespaces() == []
    assert all(sshd.poll() is not None for sshd in sshds), "every sshd stopped"
    assert job.wait(timeout=30) is not None
    assert not list(Path("/etc/netns").glob(netns.PREFIX + "-*"))

"""utils.cluster: engines with a process group that start, fail and stop cleanly."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import torch
from ipyparallel import interactive

from notebook_runner import ROOT
from utils import cluster, export

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _cluster_processes(root: int | None = None) -> list[psutil.Process]:
    """ipyparallel and watchdog processes started from ``root`` (default: this test process)."""
    try:
        descendants = psutil.Process(root or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in descendants:
        try:
            cmdline = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "ipyparallel" in cmdline or "utils.watchdog" in cmdline:
            found.append(proc)
    return found


def processes_where(test) -> list[psutil.Process]:
    """Every process on this machine (but this one) for which ``test(proc)`` holds; processes that
    end or deny access while being looked at are skipped."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and test(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _wait_until_gone(procs, seconds: float = 20) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
            except psutil.Error:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.fixture
def clean():
    """Stops the cluster after the test and checks that every process it started is gone."""
    seen: dict[int, psutil.Process] = {}

    def track(root: int | None = None):
        seen.update({p.pid: p for p in _cluster_processes(root)})
        return list(seen.values())

    yield track
    track()
    cluster.stop()
    left = _wait_until_gone(list(seen.values()))
    assert not left, f"processes left behind: {[' '.join(p.cmdline()) for p in left]}"


@interactive  # sent by value: the engines cannot import this test module
def _torch_threads():
    import torch

    return torch.get_num_threads()


@interactive
def _all_reduce_rank_plus_one():
    import torch
    import torch.distributed as dist

    x = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    return dist.get_rank(), dist.get_world_size(), x.tolist()


def test_start_runs_collectives_restarts_and_stops(clean):
    workers = cluster.start(2, activate=False)
    clean()
    assert workers.view.pull("rank") == [0, 1]
    # %%px labels output by engine id ([stdout:0] ...): it must be the rank.
    assert workers.view.targets == [0, 1] and workers.rank_of_engine == {0: 0, 1: 1}
    assert workers.view.pull("world_size") == [2, 2]
    assert workers.view.pull("device") == [torch.device("cpu")] * 2
    assert workers.run(_all_reduce_rank_plus_one) == [(0, 2, [3.0] * 3), (1, 2, [3.0] * 3)]
    threads = workers.run(_torch_threads)
    assert threads == [max(1, (os.cpu_count() or 1) // 2)] * 2, "engines must not oversubscribe the cores"

    started = time.monotonic()
    again = cluster.start(2, activate=False)
    assert again is workers and time.monotonic() - started < 5, "re-running start must reuse the cluster"
    first_pids = list(workers.pids)

    bigger = cluster.start(3, activate=False)
    assert bigger is not workers and bigger.n == 3
    clean()
    assert bigger.run(_all_reduce_rank_plus_one) == [(r, 3, [6.0] * 3) for r in range(3)]
    assert not any(psutil.pid_exists(pid) for pid in first_pids), "the old engines must be gone"
    cluster.stop()
    assert cluster.running() is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), "whole number >= 1"),
    (dict(n=2, backend="mpi"), "unknown backend"),
    (dict(n=2, engines="kubernetes"), "unknown engines"),
    (dict(n=10_000), "at most"),
])
def test_bad_settings_name_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cluster.start(**kwargs)
    assert cluster.running() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpu_says_to_use_gloo():
    with pytest.raises(ValueError, match="backend='gloo'"):
        cluster.start(2, backend="nccl")


@interactive
def _cuda_all_reduce():
    x = torch.ones(3, device=device) * (rank + 1)
    dist.all_reduce(x)
    return str(x.device), dist.get_backend(), x.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_engines_get_a_gpu_each_and_reduce_on_it(clean):
    n = min(torch.cuda.device_count(), 2)
    workers = cluster.start(n, backend="nccl", activate=False)
    results = workers.run(_cuda_all_reduce)
    total = n * (n + 1) / 2
    assert results == [(f"cuda:{r}", "nccl", [total] * 3) for r in range(n)]
    cluster.stop()


def test_port_in_use_is_reported(clean):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(cluster.ClusterError, match=f"port {port} .* in use"):
            cluster.start(2, port=port, activate=False)
    assert cluster.running() is None


@interactive  # sent by value: the engines cannot import this test module
def _rank_one_fails():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank 1 gave up")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for a partner that never comes


@interactive  # sent by value: the engines cannot import this test module
def _rank_one_dies():
    import os

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def test_failing_rank_is_named_and_nothing_hangs(clean):
    workers = cluster.start(2, timeout=10, activate=False)
    clean()
    started = time.monotonic()
    with pytest.raises(cluster.RankError) as error:
        workers.run(_rank_one_fails)
    assert "rank 1: ValueError: rank 1 gave up" in str(error.value)
    assert 'raise ValueError("rank 1 gave up")' in str(error.value), "the failing rank's traceback is shown"
    assert "rank 0:" in str(error.value), "rank 0's collective must fail too, not hang"
    assert time.monotonic() - started < 60
    # gloo's group is broken after a timeout: re-running the set-up cell must give a working one.
    again = cluster.start(2, timeout=10, activate=False)
    clean()
    assert again is not workers
    assert again.run(_all_reduce_rank_plus_one) == [(0, 2, [3.0] * 3), (1, 2, [3.0] * 3)]


def test_dead_rank_ends_in_an_error_within_the_timeout(clean):
    workers = cluster.start(2, timeout=10, activate=False)
    clean()
    started = time.monotonic()
    with pytest.raises((cluster.RankError, TimeoutError)):
        workers.run(_rank_one_dies)
    assert time.monotonic() - started < 60


def test_killed_kernel_leaves_no_process(clean):
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        reply = client.execute_interactive("from utils import cluster\nworkers = cluster.start(2)", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        kernel = manager.provisioner.process.pid
        procs = clean(kernel)
        assert len(procs) >= 4  # controller, 2 engines, watchdog (and nannies)
        os.kill(kernel, signal.SIGKILL)
        left = _wait_until_gone(procs, 30)
        assert not left, f"still running after the kernel was killed: {[p.cmdline() for p in left]}"
    finally:
        client.stop_channels()
        manager.cleanup_resources()


@interactive  # sent by value: the engines cannot import this test module
def _mpi_allreduce():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)


def test_mpi_engines_run_mpi4py_and_torch(clean):
    workers = cluster.start(2, engines="mpi", activate=False)
    clean()
    assert workers.run(_mpi_allreduce) == [(0, 3), (1, 3)], "ranks must follow MPI's order"
    assert workers.view.targets == [0, 1], "engine ids (the labels of %%px output) must be the ranks"
    assert workers.run(_all_reduce_rank_plus_one) == [(0, 2, [3.0] * 3), (1, 2, [3.0] * 3)]


def test_exported_script_runs_under_torchrun(tmp_path):
    out = tmp_path / "result"

    def all_reduce_to_file(folder):
        x = torch.full((2,), float(rank + 1))
        dist.all_reduce(x)
        (folder / f"rank{rank}.txt").write_text(f"{world_size} {device} {x.tolist()}")

    out.mkdir()
    script = export.torchrun_script(tmp_path / "job.py", all_reduce_to_file, imports="from pathlib import Path",
                                    call=f"all_reduce_to_file(Path({str(out)!r}))", timeout=60)
    with pytest.raises(FileExistsError):
        export.torchrun_script(script, all_reduce_to_file, call="pass")
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    result = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(script)], cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.read_text() for p in out.iterdir()) == ["2 cpu [3.0, 3.0]"] * 2
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0 and "run this script with torchrun" in plain.stderr

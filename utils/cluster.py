"""Distributed cells: ipyparallel engines with torch.distributed initialised on each one.

    from utils import cluster
    workers = cluster.start(4)          # 4 local engines, gloo on CPU (nccl: one GPU each)

    %%px
    print(rank, world_size, device)     # runs on every engine, output grouped by engine

Each engine gets ``rank`` (0..N-1, fixed), ``world_size``, ``device``, ``torch`` and ``dist``
in its namespace; the default process group is initialised once, with a timeout, on a free
port of engine 0's host. Calling ``start`` again with the same settings returns the running
cluster; other settings restart it. ``stop()`` (also run when the kernel exits, and by a
watchdog process if the kernel is killed) leaves no process behind. Taught in lab 03.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

from . import px
from .px import RankError, describe_errors  # noqa: F401  (RankError: part of this module's API)

BACKENDS = ("gloo", "nccl")
LAUNCHERS = ("local", "mpi", "ssh", "slurm")
MAX_LOCAL_ENGINES_PER_CORE = 4
HEARTBEAT_MS = 250  # how often the controller pings the engines (ipyparallel's default: 3000)

_running: "Workers | None" = None


class ClusterError(RuntimeError):
    """The engines or their process group could not be started; the message says what to do."""


def _done(result) -> list[bool]:
    return [child.done() for child in getattr(result, "_children", [])] or [result.done()]


@dataclass
class Workers:
    """A running set of engines: ``view`` runs code on all of them, rank order."""
    cluster: object
    client: object
    view: object
    n: int
    backend: str
    engines: str
    timeout: float
    rank_of_engine: dict = field(default_factory=dict)
    hosts: list = field(default_factory=list)
    pids: list = field(default_factory=list)
    master: str = ""
    watchdog: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return (f"<{self.n} {self.engines} engine(s), backend {self.backend}, rendezvous {self.master}, "
                f"timeout {self.timeout:g} s>")

    def run(self, function, *args, timeout: float | None = None, **kwargs) -> list:
        """Call ``function(*args, **kwargs)`` on every engine; results in rank order.

        An exception on any rank raises ``RankError`` naming each failing rank with its
        error; ranks still running after ``timeout`` (default: the cluster's) raise
        ``TimeoutError``, and the cluster should then be restarted.
        """
        import ipyparallel as ipp

        result = self.view.apply_async(function, *args, **kwargs)
        limit = self.timeout + 10 if timeout is None else timeout
        try:
            return result.get(timeout=limit)
        except ipp.error.CompositeError as error:
            raise RankError(self._describe(error.elist)) from None
        except ipp.error.RemoteError as error:
            raise RankError(self._describe([(error.ename, error.evalue, error.traceback, error.engine_info)])) from None
        except TimeoutError:
            waiting = [self.rank_of_engine.get(e, e) for e, done in zip(result._targets, _done(result)) if not done]
            where = sorted({self.hosts[r] for r in waiting if isinstance(r, int) and r < len(self.hosts)})
            on = f" (on {', '.join(where)})" if self.engines != "local" and where else ""
            raise TimeoutError(f"rank(s) {waiting}{on} did not finish within {limit:g} s: a collective that not "
                               f"every rank joined, a deadlock, or a host that went away. Restart the cluster: "
                               f"cluster.stop(); cluster.start(...)") from None

    def _describe(self, errors) -> str:
        return describe_errors(errors, self.rank_of_engine, self.hosts, self.n)

    def stop(self) -> None:
        stop()


def _default_backend(n: int) -> str:
    # nccl needs a GPU of its own per engine; with fewer GPUs than engines gloo still runs (on CPUs).
    return "nccl" if torch.cuda.device_count() >= n else "gloo"


def _check_settings(n: int, backend: str, engines: str) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of engines must be a whole number >= 1, got {n!r}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use 'gloo' (CPU) or 'nccl' (one GPU per engine)")
    if engines not in LAUNCHERS:
        raise ValueError(f"unknown engines {engines!r}; use one of {', '.join(LAUNCHERS)}")
    if backend == "nccl" and engines == "local":
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise ValueError("backend 'nccl' needs CUDA GPUs and this machine has none; "
                             "use backend='gloo' (it runs on the CPU)")
        if n > gpus:
            raise ValueError(f"backend 'nccl' needs one GPU per engine: {n} engines asked for, "
                             f"{gpus} GPU(s) here; use n <= {gpus} or backend='gloo'")
    cores = os.cpu_count() or 1
    if engines == "local" and n > MAX_LOCAL_ENGINES_PER_CORE * cores:
        raise ValueError(f"{n} local engines on {cores} cores would spend their time waiting for a core; "
                         f"use at most {MAX_LOCAL_ENGINES_PER_CORE * cores}")


# --- functions that run on the engines --------------------------------------------------

# Set by the MPI launchers (mpich's hydra, Open MPI, PMIx, Slurm's PMI) in the processes they start.
MPI_LAUNCHER_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")


def _engine_identity():
    import os
    import socket
    import sys

    mpi_rank = None
    # Only where an MPI launcher started this engine: importing mpi4py initialises MPI, and a build of
    # Open MPI can abort a process that no launcher started (an engine died that way in a sandbox).
    if "mpi4py.MPI" in sys.modules or any(name in os.environ for name in MPI_LAUNCHER_VARIABLES):
        try:
            from mpi4py import MPI  # the launcher's rank order
            mpi_rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else None
        except ImportError:
            pass
    return socket.gethostname(), os.getpid(), mpi_rank


def _free_port(port: int | None):
    import socket

    with socket.socket() as s:
        try:
            s.bind(("", port or 0))
        except OSError as error:
            return None, str(error)
        return s.getsockname()[1], ""


def _init_process_group(rank, local_rank, world_size, master_addr, master_port, backend, timeout_s, threads):
    import datetime
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    if threads:
        torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return device


def _destroy_process_group():
    import torch.distributed as dist

    from utils import ddp

    if dist.is_initialized():
        ddp.destroy_process_group()    # dist's, with gloo's threads ended too (read its docstring)


# --- the notebook side ------------------------------------------------------------------

# ipyparallel logs each stopped engine's whole output as a warning (an engine ended by SIGTERM
# exits non-zero): on every stop or kernel restart that filled the server's terminal. Its own logger,
# at ERROR, keeps real errors and drops the rest; the engines' own logs are files in the profile.
_IPP_LOG = logging.getLogger("utils.cluster.ipyparallel")
_IPP_LOG.setLevel(logging.ERROR)


class _Progress:
    """One line in the notebook saying how far the start has got; it ends as the cluster's summary.

    Outside IPython (scripts, tests) it shows nothing."""

    def __init__(self):
        from IPython import get_ipython

        self.handle, self.started, self.text = None, time.monotonic(), ""
        if get_ipython() is not None:
            from IPython.display import display

            self.handle = display({"text/plain": "starting the cluster ..."}, raw=True, display_id=True)

    def say(self, text: str) -> None:
        if self.handle is not None and text != self.text:
            self.text = text
            self.handle.update({"text/plain": text}, raw=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@contextlib.contextmanager
def _quiet():
    """Keep ipyparallel's start/stop chatter (and engine logs) out of the learner's notebook."""
    buffer = io.StringIO()
    loggers = [logging.getLogger(name) for name in ("ipyparallel", "IPClusterApp", "traitlets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def start(n: int = 2, *, backend: str | None = None, engines: str = "local", timeout: float = 60,
          threads_per_engine: int | None = None, port: int | None = None, activate: bool = True,
          launcher_config: dict | None = None, **cluster_options) -> Workers:
    """Start ``n`` engines with torch.distributed initialised on each, or return the running ones.

    backend: ``gloo`` (CPU) or ``nccl`` (one GPU per engine); default nccl when there is a GPU per engine.
    engines: ipyparallel's launcher: ``local``, ``mpi`` (mpiexec), ``ssh`` or ``slurm``. Settings of
      the launcher classes go in ``launcher_config``, e.g.
      ``{"SSHEngineSetLauncher": {"engines": {"node1": 2, "node2": 2}}}``; other keyword
      arguments go to ``ipyparallel.Cluster`` (e.g. ``controller_ip="*"`` so that engines on
      other machines can reach the controller). README.md has worked examples.
    timeout: seconds allowed for the engines to start, for the process group to form, and for any
      collective to complete before it fails with an error.
    threads_per_engine: torch threads per engine; default: this machine's cores / n (local engines).
    port: the rendezvous port on engine 0's host; default: a free one.
    activate: register ``%%px`` and ``%px`` for these engines.
    """
    global _running
    backend = backend or _default_backend(n)
    _check_settings(n, backend, engines)
    if _running is not None:
        same = (_running.n, _running.backend, _running.engines) == (n, backend, engines)
        if same and _alive(_running):
            if activate:
                px.activate(_running)
            _Progress().say(f"{_running!r}, already running")
            return _running
        stop()
    import ipyparallel as ipp

    if engines == "local" and threads_per_engine is None:
        threads_per_engine = max(1, (os.cpu_count() or 1) // n)
    # The controller completes an engine's registration only once it has seen the engine's
    # heartbeat, and by default it pings every 3 s: most of a start was spent waiting for that.
    # Pinging every 0.25 s, with 120 missed pings allowed, keeps the default 30 s before an
    # engine counts as dead.
    controller_args = [f"--HeartMonitor.period={HEARTBEAT_MS}",
                       f"--HeartMonitor.max_heartmonitor_misses={30_000 // HEARTBEAT_MS}",
                       *cluster_options.pop("controller_args", [])]
    # ipyparallel waits a fixed second between starting the controller and the engines; the
    # engines wait for the controller's connection file anyway, so the second is pure delay.
    cluster_options.setdefault("delay", 0)
    # No cluster file: ipyparallel would write one into the learner's IPython profile, where
    # JupyterLab's IPython Parallel panel adopts it (and lists it, stopped, after a crash).
    cluster_options.setdefault("cluster_file", "")
    # This module stops its clusters at exit (and its watchdog when the kernel is killed): ipyparallel's
    # own exit handler would run first, print "Stopping cluster" into the server's terminal and spend
    # the seconds Jupyter gives a restarting kernel on a graceful stop of every engine.
    cluster_options.setdefault("shutdown_atexit", False)
    with _quiet():
        cluster = ipp.Cluster(n=n, engines=engines, log_level=logging.ERROR, log=_IPP_LOG,
                              controller_args=controller_args, **cluster_options)
    if engines == "local":
        # Each engine imports torch while it starts, before it registers, instead of after: the
        # imports of all engines then overlap with each other and with the registrations.
        cluster.config.LocalEngineSetLauncher.engine_cmd = [
            sys.executable, "-c", "import torch; from ipyparallel.engine.app import main; main()"]
        # ipyparallel starts the engines only once the controller has written its connection
        # file. Local engines can read that file themselves: started with the controller, they
        # import torch while it starts, then wait for the file (up to the timeout).
        cluster.send_engines_connection_env = False
        cluster.config.LocalEngineSetLauncher.engine_args = [f"--IPEngine.wait_for_url_file={timeout:g}"]
    if engines == "slurm":
        # ipyparallel writes the job's batch script into the current directory (the notebook's):
        # keep it in the profile directory, beside the job's log.
        cluster.config.SlurmEngineSetLauncher.batch_file_name = os.path.join(cluster.profile_dir,
                                                                             "slurm_engine.sbatch")
    if engines == "mpi":
        # The MPI that pip installs (the mpich wheel) puts mpiexec beside this interpreter,
        # which may not be on PATH when the kernel was not started from an activated venv.
        mpiexec = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                 os.environ.get("PATH", "")]))
        if mpiexec is None:
            raise ClusterError("engines='mpi' needs mpiexec: pip install mpich mpi4py (or load your "
                               "site's MPI module), then restart the kernel")
        cluster.config.MPILauncher.mpi_cmd = [mpiexec]
    if engines == "ssh":
        # ipyparallel runs "python3" over ssh, which is not this environment's Python (the ssh
        # session has no venv on PATH) and lacks ipyparallel: the engines' machines share this
        # file system and Python environment, so use this interpreter unless told otherwise.
        cluster.config.SSHEngineSetLauncher.remote_python = sys.executable
        # The same profile folder on every machine, by its full path: ipyparallel's default, the
        # path relative to the home folder, is another folder where the ssh session's home differs
        # from this process's (another user, or the test suite's own home), and files were left there.
        cluster.config.SSHEngineSetLauncher.remote_profile_dir = cluster.profile_dir
        cluster.config.SSHEngineSetLauncher.environment = {"IPYTHONDIR": os.path.dirname(cluster.profile_dir)}
    for launcher, settings in (launcher_config or {}).items():
        for name, value in settings.items():
            setattr(getattr(cluster.config, launcher), name, value)
    if engines == "ssh" and "engine_cmd" not in cluster.config.SSHEngineSetLauncher:
        # Engines import torch while they start, as local ones do.
        cluster.config.SSHEngineSetLauncher.engine_cmd = [
            cluster.config.SSHEngineSetLauncher.remote_python, "-c",
            "import torch; from ipyparallel.engine.app import main; main()"]
    workers = Workers(cluster=cluster, client=None, view=None, n=n, backend=backend, engines=engines,
                      timeout=timeout)
    _running = workers
    progress = _Progress()
    try:
        _start_engines(workers, timeout, progress)
        workers.watchdog = _start_watchdog(workers)
        progress.say(f"{n}/{n} engines up; forming the {backend} process group ...")
        _start_process_group(workers, port, threads_per_engine)
    except BaseException as error:
        progress.say(f"the cluster did not start ({type(error).__name__}: see below)")
        _stop(keep_logs=True)  # the error may point to them
        raise
    if activate:
        px.activate(workers)
    progress.say(f"{workers!r}, started in {progress.elapsed():.1f} s; engines' logs in "
                 f"{os.path.join(cluster.profile_dir, 'log')} while it runs")
    return workers


def _wait_for_engines(workers: Workers, timeout: float, progress: _Progress) -> None:
    deadline = time.monotonic() + timeout
    while (up := len(workers.client.ids)) < workers.n:
        if time.monotonic() > deadline:
            raise TimeoutError
        progress.say(f"starting {workers.n} {workers.engines} engines: {up}/{workers.n} up")
        time.sleep(0.2)


def _start_engines(workers: Workers, timeout: float, progress: _Progress) -> None:
    progress.say(f"starting {workers.n} {workers.engines} engines: 0/{workers.n} up")
    with _quiet():
        try:
            workers.cluster.start_cluster_sync()
            workers.client = workers.cluster.connect_client_sync()
            _wait_for_engines(workers, timeout, progress)
        except TimeoutError:
            raise ClusterError(f"only {len(workers.client.ids) if workers.client else 0} of {workers.n} engines "
                               f"started within {timeout:g} s; check the launcher's log "
                               f"({workers.cluster.profile_dir}/log), or pass a larger timeout") from None
        except Exception as error:
            raise ClusterError(f"the {workers.engines} engines could not be started: "
                               f"{type(error).__name__}: {error}") from error
    identities = workers.client[:].apply_sync(_engine_identity)
    engine_ids = list(workers.client.ids)
    # Ranks follow MPI's order for MPI engines, the engines' ids otherwise: fixed and 0..n-1.
    # Each cluster has a fresh controller, which numbers engines 0..n-1 (an MPI engine asks for
    # its MPI rank), so an engine's id is its rank, and %%px's [stdout:i] labels name ranks.
    order = sorted(range(len(engine_ids)), key=lambda i: (identities[i][2] is None, identities[i][2] or 0,
                                                           engine_ids[i]))
    workers.rank_of_engine = {engine_ids[i]: rank for rank, i in enumerate(order)}
    workers.view = workers.client[[engine_ids[i] for i in order]]
    workers.view.block = True
    workers.hosts = [identities[i][0] for i in order]
    workers.pids = [identities[i][1] for i in order]


def _start_process_group(workers: Workers, port: int | None, threads: int | None) -> None:
    rank0 = workers.client[workers.view.targets[0]]
    free, reason = rank0.apply_sync(_free_port, port)
    if free is None:
        raise ClusterError(f"port {port} on {workers.hosts[0]} is in use ({reason}); "
                           f"pass another port, or port=None to pick a free one")
    master = workers.hosts[0] if workers.engines != "local" else "127.0.0.1"
    workers.master = f"{master}:{free}"
    # The GPU of a rank is its index among the ranks on the same host (torchrun's LOCAL_RANK).
    local_ranks = [workers.hosts[:rank].count(host) for rank, host in enumerate(workers.hosts)]
    pending = [workers.client[engine].apply_async(_init_process_group, rank, local_ranks[rank], workers.n, master,
                                                  free, workers.backend, workers.timeout, threads)
               for engine, rank in sorted(workers.rank_of_engine.items(), key=lambda item: item[1])]
    devices = []
    for rank, result in enumerate(pending):
        try:
            devices.append(result.get(timeout=workers.timeout + 10))
        except TimeoutError:
            raise ClusterError(f"the {workers.backend} process group did not form within {workers.timeout:g} s "
                               f"(rank {rank} still waiting at {workers.master}); a firewall between the "
                               f"engines' hosts, or an engine stuck in earlier work, are the usual causes") from None
        except Exception as error:
            raise ClusterError(f"rank {rank} could not join the {workers.backend} process group at "
                               f"{workers.master}: {error}") from error
    for (engine, rank), device in zip(sorted(workers.rank_of_engine.items(), key=lambda item: item[1]), devices):
        workers.client[engine].push(dict(rank=rank, world_size=workers.n, device=device), block=True)
    workers.view.execute("import torch\nimport torch.distributed as dist", block=True)


def _probe_process_group():
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def _alive(workers: Workers) -> bool:
    """Engines answer and their process group still completes a collective.

    After a collective timed out, gloo's group is broken for good; engines busy in a
    deadlocked call do not answer. Either way the cluster is restarted.
    """
    try:
        if len(workers.client.ids) != workers.n:
            return False
        return workers.view.apply_async(_probe_process_group).get(timeout=10) == [float(workers.n)] * workers.n
    except Exception:
        return False


def _cluster_pids(workers: Workers) -> list[int]:
    import socket

    from ipyparallel.cluster.launcher import SSHLauncher

    # Engines on other machines (ssh, slurm) report their machine's pids: here those numbers are
    # other processes, which stop() and the watchdog must not kill. Those engines stop with their
    # launcher (scancel, ssh) or, at the latest, when the controller's heartbeat stops.
    pids = [pid for host, pid in zip(workers.hosts, workers.pids) if host == socket.gethostname()]
    controller = getattr(workers.cluster, "controller", None)
    if controller is not None and getattr(controller, "pid", -1) > 0:
        pids.append(controller.pid)
    for engine_set in getattr(workers.cluster, "engines", {}).values():
        # An ssh launcher's pid is its engine's pid on the engine's host (kept above when that is
        # this machine), not a process here.
        pids += [launcher.pid for launcher in getattr(engine_set, "launchers", {}).values()
                 if getattr(launcher, "pid", -1) > 0 and not isinstance(launcher, SSHLauncher)]
        if getattr(engine_set, "pid", -1) > 0:  # mpiexec and batch launchers have one process
            pids.append(engine_set.pid)
    return sorted(set(pids))


def _start_watchdog(workers: Workers) -> subprocess.Popen:
    """A process that stops the cluster's processes if this kernel dies without stopping them."""
    command = [sys.executable, "-m", "utils.watchdog", "--files", workers.cluster.profile_dir,
               workers.cluster.cluster_id, str(os.getpid())] + [str(p) for p in _cluster_pids(workers)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop() -> None:
    """Destroy the process group, stop engines and controller, make sure none is left, and remove the
    cluster's files from the IPython profile."""
    _stop(keep_logs=False)


def _stop(keep_logs: bool) -> None:
    global _running
    workers, _running = _running, None
    if workers is None:
        return
    from .watchdog import process_trees, remove_cluster_files, terminate

    procs = process_trees(_cluster_pids(workers))  # before stopping: nannies detach on the way out
    if workers.view is not None:
        try:
            workers.view.apply_async(_destroy_process_group).get(timeout=10)
        except Exception:
            pass  # a broken group is torn down with its processes below
    with _quiet():
        try:
            if workers.client is not None:
                workers.client.close()
            # Local processes hold nothing worth a graceful exit once the group is gone: ended
            # together below, a stop takes about a second instead of 5-8 s, well within the 5 s
            # Jupyter gives a restarting kernel before it kills it.
            if workers.engines != "local":
                workers.cluster.stop_cluster_sync()
        except Exception:
            pass  # an engine's host that went away cannot be reached (ssh fails): what runs here ends below
    terminate(procs, grace=1.0)
    remove_cluster_files(workers.cluster.profile_dir, workers.cluster.cluster_id, logs=not keep_logs)
    # Last: a kernel killed before this point (Jupyter kills one that takes over 5 s to shut down)
    # leaves the watchdog to finish the stop.
    if workers.watchdog is not None:
        workers.watchdog.kill()
        workers.watchdog.wait()
    _forget_magics()


def _forget_magics() -> None:
    """After a stop, ``%%px`` says to run the set-up cell again instead of reaching dead engines."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            px.install_placeholder(shell)
    except Exception:
        pass  # at the interpreter's exit IPython may already be gone: nothing to tell anyone then


def running() -> Workers | None:
    """The running cluster started by ``start``, or None."""
    return _running


import atexit  # noqa: E402  (the clusters' only exit handler: ipyparallel's is switched off in start)

atexit.register(stop)

"""Write notebook code out as a script that ``torchrun`` runs, for the day a lab moves to a cluster.

    from utils import export
    export.torchrun_script("train_ddp.py", train, call="train()")
    # then: torchrun --standalone --nproc-per-node 4 train_ddp.py

The script defines ``rank``, ``world_size`` and ``device`` as globals, exactly as
``utils.cluster`` does on the engines, so code written for ``%%px`` cells runs unchanged.
``run`` runs a script (or module) under ``torchrun`` on this machine, as lab 06 and its check do, also
as several simulated nodes (one torchrun agent each).
"""
from __future__ import annotations

import inspect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

_HEADER = '''#!/usr/bin/env python
"""{description}

Run with:  torchrun --standalone --nproc-per-node N {name}
(several machines: torchrun --nnodes M --node-rank I --rdzv-endpoint HOST:PORT ...)
"""
import datetime
import os

import torch
import torch.distributed as dist
{imports}

def _setup_process_group(timeout_s={timeout}):
    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for every process.
    if "RANK" not in os.environ:
        raise SystemExit("run this script with torchrun, e.g. torchrun --standalone --nproc-per-node 2 {name}")
    local_rank = int(os.environ["LOCAL_RANK"])
    # nccl needs a GPU of its own per process on this machine; with fewer, gloo runs on the CPUs.
    if torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1)):
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", torch.device("cuda", local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device

'''

_FOOTER = '''


{forget}


if __name__ == "__main__":
    rank, world_size, device = _setup_process_group()
    try:
{call}
        dist.barrier()  # no rank tears the group down while another still sends to it
    finally:
        dist.destroy_process_group()
        # Frees the group, so gloo's threads end here and not while the interpreter shuts down: one
        # that lets go of a tensor then aborts the process (see forget_destroyed_group).
        forget_destroyed_group()
'''


def _source(item) -> str:
    if isinstance(item, str):
        return textwrap.dedent(item).strip("\n")
    if not callable(item):
        raise TypeError(f"export a function, a class or source text, not {type(item).__name__}")
    try:
        return textwrap.dedent(inspect.getsource(item)).strip("\n")
    except (OSError, TypeError) as error:
        raise ValueError(f"cannot read the source of {getattr(item, '__name__', item)!r} ({error}); "
                         f"pass its source as a string instead") from None


def torchrun_script(path, *code, call: str, imports: str = "", timeout: float = 300,
                    description: str = "Exported from the course's notebooks.", overwrite: bool = False) -> Path:
    """Write ``code`` (functions, classes or source strings) and ``call`` to a torchrun script.

    ``call`` is the statement the script runs on every rank, e.g. ``"train(epochs=3)"``.
    An existing file is kept unless ``overwrite=True``: a learner's edited script is never lost.
    """
    from .ddp import forget_destroyed_group    # the footer's teardown: one copy of the code

    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it, or choose another name")
    compile(call, "<call>", "exec")  # a typo in the call is reported now, not on every rank later
    body = "\n\n\n".join(_source(item) for item in code)
    text = (_HEADER.format(description=description, name=path.name, imports=imports.strip(), timeout=timeout)
            + "\n" + body + _FOOTER.format(forget=_source(forget_destroyed_group),
                                           call=textwrap.indent(call.strip(), " " * 8)))
    compile(text, str(path), "exec")
    path.write_text(text)
    return path


@dataclass
class JobResult:
    code: int | None        # the exit status; None when the job ran past its time limit and was killed
    output: str             # stdout and stderr together, in the order the processes wrote them
    seconds: float          # wall time, starting Python and importing torch included


def run(program: list, nproc: int | list[int] | None = None, *, cwd, threads: int | None = None,
        env: dict | None = None, timeout: float = 1800, host: str = "127.0.0.1") -> JobResult:
    """Run ``python *program`` (a script and its arguments, or ``-m module ...``), under ``torchrun
    --standalone --nproc-per-node=nproc`` unless ``nproc`` is None.

    ``nproc`` a list (e.g. ``[2, 1]``): the job runs as that many "nodes" on this machine, one torchrun
    agent per node with its count of processes, meeting at a c10d rendezvous on ``host`` (a loopback
    address; it becomes the workers' MASTER_ADDR), as agents on separate machines do; ``LOCAL_RANK`` then differs from ``RANK`` on every node after the first to
    join. ``threads``: torch threads per process (OMP_NUM_THREADS), so that the processes share the
    cores instead of fighting for them. ``env``: extra environment variables. A job past ``timeout``
    seconds is killed with every process it started (each agent leads a process group of its own)."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if threads is not None:
        environment["OMP_NUM_THREADS"] = str(threads)
    if nproc is None:
        launchers = [[sys.executable]]
    elif isinstance(nproc, int):
        # --local-addr: without it the agent names itself by the machine's hostname, which a machine without
        # name resolution (a sandbox, a laptop offline) cannot look up, and the workers wait for it forever.
        launchers = [[sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                      "--local-addr=127.0.0.1"]]
    else:
        endpoint = f"{host}:{_free_port(host)}"
        launchers = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nproc)}", f"--nproc-per-node={n}",
                      "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=course-job",
                      f"--local-addr={host}"] for n in nproc]
    start = time.perf_counter()
    outputs = [tempfile.TemporaryFile("w+") for _ in launchers]
    processes = [subprocess.Popen(launcher + [str(part) for part in program], cwd=cwd, env=environment, stdout=out,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
                 for launcher, out in zip(launchers, outputs)]
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.1, timeout - (time.perf_counter() - start))))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for process, code in zip(processes, codes):
        if code is None or any(c is None for c in codes):
            _kill_group(process)
    texts = []
    for out in outputs:
        out.seek(0)
        texts.append(out.read())
        out.close()
    output = texts[0] if len(texts) == 1 else "".join(f"--- node {i} ---\n{text}" for i, text in enumerate(texts))
    failed = [c for c in codes if c != 0]
    return JobResult(None if None in codes else (failed[0] if failed else 0), output, time.perf_counter() - start)


def _kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]

"""Spawn real gloo (or nccl) ranks for a test: ``run_ranks(job, world_size, *args)`` returns each rank's result.

Nothing can hang: workers have a gloo timeout, the parent a deadline, and pytest-timeout a last
resort. A job must be importable (a module-level function of a test module).
"""
from __future__ import annotations

import datetime
import multiprocessing
import queue
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist

from utils import ddp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, job, args, results, backend):
    try:
        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank)        # one GPU per rank
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=60))
        try:
            result = job(rank, world_size, *args)
            # Rank 0 hosts the rendezvous store: had it torn its group down while another rank was
            # still setting up a subgroup (dist.new_group returns early on non-members), that rank
            # would lose its connection. So every rank finishes before any leaves.
            dist.barrier()
            results.put(("ok", rank, result))
        finally:
            ddp.destroy_process_group()    # gloo's threads end here, not as the interpreter shuts down
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def run_ranks(job, world_size, *args, deadline_s=75.0, backend="gloo"):
    """``job(rank, world_size, *args)`` on ``world_size`` spawned ranks (gloo, or nccl with one GPU
    each); results in rank order."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, job, args, results, backend), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    got, errors, end = {}, [], time.monotonic() + deadline_s
    try:
        while len(got) + len(errors) < world_size:
            try:
                status, rank, value = results.get(timeout=0.5)
            except queue.Empty:
                silent = [p for p in procs if p.exitcode not in (None, 0)]
                if silent and not errors:
                    pytest.fail(f"a worker died without a report (exit codes {[p.exitcode for p in procs]})")
                if time.monotonic() > end:
                    pytest.fail(f"workers still running after {deadline_s} s; reports so far: {got}, {errors}")
                if errors and all(p.exitcode is not None for p in procs):
                    break
                continue
            if status == "ok":
                got[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            pytest.fail("worker failed:\n" + "\n".join(errors), pytrace=False)
        return [got[r] for r in range(world_size)]
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()

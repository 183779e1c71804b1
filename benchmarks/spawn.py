"""Start one process per rank for a benchmark and collect rank 0's report; nothing can hang.

``worker(rank, world_size, port, *args, results)`` runs in each process, initialises its process
group on 127.0.0.1:port and puts ``("ok", rank, report)`` or ``("error", rank, traceback)`` on
``results``. A rank that fails, dies or outlives the deadline ends the benchmark with a message.
"""
from __future__ import annotations

import multiprocessing
import queue
import socket
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_world(worker, world_size: int, args: tuple, deadline_s: float):
    """Rank 0's report (the benchmarks MAX-reduce their times, so every rank holds the same)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world_size, port, *args, results), daemon=True)
             for r in range(world_size)]
    for proc in procs:
        proc.start()
    reports, end = {}, time.monotonic() + deadline_s
    try:
        while len(reports) < world_size:
            try:
                status, rank, value = results.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > end or any(p.exitcode not in (None, 0) for p in procs):
                    raise SystemExit(f"world size {world_size}: workers failed or timed out "
                                     f"(exit codes {[p.exitcode for p in procs]}); reports from ranks {sorted(reports)}")
                continue
            if status == "error":
                raise SystemExit(f"world size {world_size}, rank {rank} failed:\n{value}")
            reports[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return reports[0]

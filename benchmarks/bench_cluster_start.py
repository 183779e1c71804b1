"""Time to a usable process group: utils.cluster (ipyparallel engines) against torch.multiprocessing.spawn.

    .venv/bin/python benchmarks/bench_cluster_start.py [--workers 4] [--repeats 3] [--json PATH]

Both sides start ``--workers`` fresh Python processes, import torch, initialise a gloo
process group and complete one all_reduce; the clock stops when the caller has the
result. Runs alternate (cluster, spawn, cluster, ...) in the same process. Target: the
cluster within 2x of spawn (it also starts a controller and connects a client).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from utils import cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine as machine_info  # noqa: E402


def _spawned_worker(rank: int, world_size: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    x = torch.ones(1)
    dist.all_reduce(x)
    if rank == 0:
        queue.put(x.item())
    dist.destroy_process_group()


def time_spawn(n: int) -> float:
    start = time.perf_counter()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    context = mp.spawn(_spawned_worker, args=(n, port, queue), nprocs=n, join=False)
    result = queue.get()  # the all_reduce is done: the group is usable
    seconds = time.perf_counter() - start
    context.join()
    assert result == n
    return seconds


def _all_reduce_one():
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def time_cluster(n: int) -> float:
    start = time.perf_counter()
    workers = cluster.start(n, activate=False)
    result = workers.run(_all_reduce_one)
    seconds = time.perf_counter() - start
    cluster.stop()
    assert result == [float(n)] * n
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    times = {"utils.cluster": [], "mp.spawn": []}
    for _ in range(args.repeats):
        times["utils.cluster"].append(time_cluster(args.workers))
        times["mp.spawn"].append(time_spawn(args.workers))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["utils.cluster"] / medians["mp.spawn"]
    machine = f"{machine_info.one_line()}, load {os.getloadavg()[0]:.1f}"
    print(f"{args.workers} workers, gloo, {args.repeats} repeats each, on {machine}\n")
    print("| start-up to first all_reduce | median (s) | all runs (s) |\n| --- | ---: | --- |")
    for name, values in times.items():
        print(f"| {name} | {medians[name]:.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print(f"\nutils.cluster / mp.spawn = {ratio:.2f} (target <= 2)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "workers": args.workers, "times_s": times,
                                         "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()

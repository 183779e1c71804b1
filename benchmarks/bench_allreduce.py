"""The hand-written ring all-reduce (utils.collectives) against gloo's dist.all_reduce on the CPU.

For each world size (default 2 and 4) the script spawns that many processes, each with one
torch thread, and initialises a gloo process group on 127.0.0.1. For each message size
(float32, 1 KiB .. 64 MiB in powers of 4) both ops get untimed warm-up calls, then
``--rounds`` rounds that time each op ``repeats`` times with ``utils.collectives.time_collective``
(a barrier before each call). The two ops alternate within a size and the order flips every
round, so a slower or faster spell of the machine hits both alike. Reported per op: the median
of the round medians, the slowest rank's (an all-reduce is done when every rank is done),
and the bus bandwidth (nccl-tests' busbw = size / time * 2(p-1)/p).

Target: the ring reaches >= 0.8x gloo's bus bandwidth from 1 MiB up. Below that, latency
dominates: the ring pays 2(p-1) Python-level isend/irecv round trips per call.

    .venv/bin/python benchmarks/bench_allreduce.py [--world-sizes 2 4] [--rounds R]
        [--max-bytes N] [--segment-bytes B] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils import collectives  # noqa: E402
from utils.collectives import bus_bandwidth, ring_all_reduce, time_collective  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine as machine_info  # noqa: E402
import spawn  # noqa: E402

MIB = 1 << 20


def repeats_for(n_bytes: int, quick: bool) -> int:
    """Timed calls per op per round: many for small messages (noisy), few for 16 MiB and up (slow)."""
    if quick:
        return 3
    return 30 if n_bytes < MIB else 10 if n_bytes < 16 * MIB else 4


def worker(rank, world_size, port, sizes, rounds, quick, segment_bytes, results):
    try:
        if segment_bytes:
            collectives.SEGMENT_BYTES = segment_bytes
        torch.set_num_threads(1)  # one core's worth per rank: the ranks share the machine's cores
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=120))
        ops = {"ring": ring_all_reduce, "gloo": dist.all_reduce}
        rows = []
        for n_bytes in sizes:
            tensor = torch.zeros(n_bytes // 4, dtype=torch.float32)  # zeros: repeated sums never overflow
            repeats = repeats_for(n_bytes, quick)
            per_round = {name: [] for name in ops}
            for name, op in ops.items():  # warm-up, untimed
                time_collective(lambda: op(tensor), warmup=2, repeats=1)
            for r in range(rounds):
                order = list(ops) if r % 2 == 0 else list(ops)[::-1]
                for name in order:
                    op = ops[name]
                    per_round[name].append(time_collective(lambda: op(tensor), warmup=0, repeats=repeats))
            medians = torch.tensor([statistics.median(per_round[name]) for name in ops], dtype=torch.float64)
            dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # the slowest rank decides
            ring_s, gloo_s = medians.tolist()
            rows.append(dict(world_size=world_size, n_bytes=n_bytes, repeats=repeats, rounds=rounds,
                             ring_seconds=ring_s, gloo_seconds=gloo_s,
                             ring_busbw=bus_bandwidth(n_bytes, ring_s, world_size),
                             gloo_busbw=bus_bandwidth(n_bytes, gloo_s, world_size)))
        dist.destroy_process_group()
        results.put(("ok", rank, rows))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def size_label(n_bytes: int) -> str:
    for unit, factor in (("MiB", MIB), ("KiB", 1024)):
        if n_bytes >= factor:
            return f"{n_bytes / factor:g} {unit}"
    return f"{n_bytes} B"


def time_label(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def markdown(rows: list[dict]) -> str:
    lines = ["| ranks | size | ring time | gloo time | ring busbw (GB/s) | gloo busbw (GB/s) | ring / gloo |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['world_size']} | {size_label(r['n_bytes'])} | {time_label(r['ring_seconds'])} | "
                     f"{time_label(r['gloo_seconds'])} | {r['ring_busbw'] / 1e9:.3f} | {r['gloo_busbw'] / 1e9:.3f} | "
                     f"{r['ring_busbw'] / r['gloo_busbw']:.2f} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> tuple[bool, str]:
    big = [r for r in rows if r["n_bytes"] >= MIB]
    if not big:
        return False, "no size of 1 MiB or more was measured: the target was not tested"
    worst = min(big, key=lambda r: r["ring_busbw"] / r["gloo_busbw"])
    ratio = worst["ring_busbw"] / worst["gloo_busbw"]
    met = ratio >= 0.8
    return met, (f"target ring >= 0.8x gloo's bus bandwidth from 1 MiB up: {'met' if met else 'NOT met'} "
                 f"(lowest ratio {ratio:.2f} at {size_label(worst['n_bytes'])}, {worst['world_size']} ranks)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-bytes", type=int, default=64 * MIB, help="largest message (default 64 MiB)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per size (default 5)")
    parser.add_argument("--segment-bytes", type=int, default=0,
                        help="the ring's piece size (default: utils.collectives.SEGMENT_BYTES)")
    parser.add_argument("--quick", action="store_true", help="sanity run: 2 ranks, up to 1 MiB, 1 round")
    parser.add_argument("--json", type=Path, help="write every number and the machine to this file")
    args = parser.parse_args()
    if args.quick:
        args.world_sizes, args.max_bytes, args.rounds = [2], min(args.max_bytes, MIB), 1
    if min(args.world_sizes) < 2 or args.rounds < 1 or args.max_bytes < 1024:
        parser.error("world sizes must be >= 2, --rounds >= 1 and --max-bytes >= 1024")
    sizes = [1024 * 4 ** k for k in range(12) if 1024 * 4 ** k <= args.max_bytes]
    info = machine_info.describe()
    segment = args.segment_bytes or collectives.SEGMENT_BYTES
    print(f"Ring pieces of {size_label(segment)}")
    print(f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, Python {info['python']}, "
          f"{info['system']}; load average before: {info['load_average']}", flush=True)
    start, rows = time.perf_counter(), []
    for world_size in args.world_sizes:
        rows += spawn.run_world(worker, world_size, (sizes, args.rounds, args.quick, args.segment_bytes), deadline_s=600.0)
        print(f"  {world_size} ranks done ({time.perf_counter() - start:.0f} s)", flush=True)
    info["load_average_after"] = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
    met, sentence = verdict(rows)
    print()
    print(markdown(rows))
    print()
    print(sentence)
    print(f"Load average after: {info['load_average_after']}; total {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(dict(machine=info, rows=rows, segment_bytes=segment, target_met=met,
                                             verdict=sentence,
                                             quick=args.quick, rounds=args.rounds,
                                             seconds=time.perf_counter() - start), indent=2) + "\n")


if __name__ == "__main__":
    main()

"""How often a rank of a finished gloo job dies with SIGABRT as its interpreter exits, by teardown.

    python benchmarks/bench_exit_aborts.py --teardown plain --jobs 100 --streams 2
    python benchmarks/bench_exit_aborts.py --teardown course --jobs 100 --streams 2

Each job is a fresh pair of ranks (the "spawn" method) that wraps a tiny model in NaiveDDP, trains
three steps with torch.optim.SGD, then ends with ``dist.barrier()`` and a teardown: ``plain`` is
``dist.destroy_process_group()``, ``course`` is ``utils.ddp.destroy_process_group()`` (see its
docstring for the cause). ``--streams`` runs that many jobs at once: the abort needs gloo's thread
to be late, which a busy machine makes likelier. Each rank also reports whether gloo's threads were
still running after the teardown. Results go to benchmarks/results/exit_aborts_<teardown>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import machine  # noqa: E402


def _gloo_threads() -> bool:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            pass
    return any(name.startswith(("pt_gloo", "gloo_")) for name in names)


def _rank(rank: int, rendezvous: str, teardown: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from utils import ddp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(rank)
    wrapped = ddp.NaiveDDP(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(wrapped(torch.randn(8, 6)), torch.randint(0, 3, (8,))).backward()
        wrapped.finish_gradient_synchronization()
        optimizer.step()
    dist.barrier()
    (dist.destroy_process_group if teardown == "plain" else ddp.destroy_process_group)()
    if _gloo_threads():
        raise SystemExit(3)          # exit code 3: gloo's threads outlived the teardown


def _job(folder: str, index: int, teardown: str) -> tuple[int | None, int | None]:
    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_rank, args=(rank, f"{folder}/rendezvous-{index}", teardown)) for rank in (0, 1)]
    for proc in ranks:
        proc.start()
    codes = []
    for proc in ranks:
        proc.join(120)
        if proc.is_alive():
            proc.kill()
            proc.join()
        codes.append(proc.exitcode)
    return tuple(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teardown", choices=["plain", "course"], required=True)
    parser.add_argument("--jobs", type=int, default=50, help="jobs per stream")
    parser.add_argument("--streams", type=int, default=1, help="jobs running at once")
    args = parser.parse_args()
    outcomes: Counter = Counter()
    lock = threading.Lock()
    start = time.perf_counter()

    def stream(number: int, folder: str) -> None:
        for index in range(args.jobs):
            codes = _job(folder, number * args.jobs + index, args.teardown)
            with lock:
                outcomes[str(list(codes))] += 1
                print(f"job {sum(outcomes.values())}: exit codes {list(codes)}", flush=True)

    with tempfile.TemporaryDirectory() as folder:
        threads = [threading.Thread(target=stream, args=(number, folder)) for number in range(args.streams)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    jobs = sum(outcomes.values())
    aborted = sum(n for codes, n in outcomes.items() if "-6" in codes)
    report = dict(teardown=args.teardown, jobs=jobs, streams=args.streams, aborted_jobs=aborted,
                  exit_codes=dict(outcomes), seconds=round(time.perf_counter() - start), machine=machine.describe())
    print(f"{args.teardown}: {aborted} of {jobs} jobs had a rank die with SIGABRT; exit codes {dict(outcomes)}")
    out = ROOT / "benchmarks" / "results" / f"exit_aborts_{args.teardown}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

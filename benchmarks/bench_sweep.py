"""A sweep of K equal training runs on N engines (``utils.sweep.run``) against the same K runs one
after another in this process, in the same session.

Each run trains a small MLP (256 -> 512 -> 512 -> 10, tanh) with SGD on synthetic data made inside
the run from its seed, for a fixed number of steps: equal work, a few seconds each. Both sides get
the same total torch threads: the sequential side ``cores`` threads in one process, the sweep
``cores // N`` threads on each of its N engines. A third line, sequential with ``cores // N``
threads, shows what each run costs alone at the engines' setting (how well the MLP uses more
threads, and how much the engines slow each other down).

Rounds alternate the order of the two sides (sequential first, then the sweep first, ...); the
cluster is started once, before the first round, and one untimed sweep warms the engines up (its
start-up is reported, not counted). The sweep's time is the wall time of ``sweep.run``, from the
call to the last result back. Speed-up = sequential time / sweep time, median over the rounds;
target: at least 0.8 x N with N = the number of cores (issue 10). Also reported: the speed-up
against the runs one after another at the engines' thread count (the gain from the engines alone,
without the difference that another thread count makes to each run). Every run's final loss is
compared between the two sides (same seed, same steps: they must agree up to the summation order
that another thread count gives).

    .venv/bin/python benchmarks/bench_sweep.py [--engines N] [--configs K] [--steps S] [--rounds R] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from utils import cluster, sweep  # noqa: E402
from utils.train import train_step  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def train_one(seed: int, steps: int, batch: int = 256, d_in: int = 256, hidden: int = 512, classes: int = 10) -> dict:
    """One run of the sweep: defined here, so cloudpickle sends it to the engines by value."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, d_in, generator=generator)
    y = (x @ torch.randn(d_in, classes, generator=generator)).argmax(1)  # a fixed linear teacher
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                torch.nn.Tanh(), torch.nn.Linear(hidden, classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        start = (step * batch) % (len(x) - batch)
        loss = train_step(model, optimizer, x[start:start + batch], y[start:start + batch])
        losses.append(loss.item())
    return {"loss": losses}


def sequential(configs: list[dict], threads: int) -> tuple[float, list[float], list[float]]:
    """Wall time of all runs, each run's time, each run's final loss."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seconds, finals = [], []
        start = time.perf_counter()
        for config in configs:
            t = time.perf_counter()
            finals.append(train_one(**config)["loss"][-1])
            seconds.append(time.perf_counter() - t)
        return time.perf_counter() - start, seconds, finals
    finally:
        torch.set_num_threads(saved)


def on_engines(configs: list[dict], workers, threads: int) -> tuple[float, list[float], list[float]]:
    start = time.perf_counter()
    runs = sweep.run(train_one, configs, workers, progress=False, threads_per_engine=threads)
    wall = time.perf_counter() - start
    failed = [run for run in runs if not run.ok]
    if failed:
        raise RuntimeError(f"a run of the sweep failed: {failed[0].config}\n{failed[0].error}")
    return wall, [run.seconds for run in runs], [run.result["loss"][-1] for run in runs]


def main(argv=None) -> dict:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=cores, help=f"N (default: the cores, {cores})")
    parser.add_argument("--configs", type=int, default=None, help="K (default 2 N)")
    parser.add_argument("--steps", type=int, default=250, help="training steps per run (default 250)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both sides (default 2)")
    parser.add_argument("--json", metavar="PATH", default=str(RESULTS / f"sweep_{cores}core.json"))
    args = parser.parse_args(argv)
    n = args.engines
    k = args.configs or 2 * n
    threads_per_engine = max(1, cores // n)
    total_threads = n * threads_per_engine
    configs = [dict(seed=i, steps=args.steps) for i in range(k)]

    info = machine.describe()
    print(f"{machine.one_line(info)}; load average before {info['load_average']}")
    print(f"{k} runs of {args.steps} steps; sweep: {n} engines x {threads_per_engine} thread(s); "
          f"sequential: 1 process x {total_threads} thread(s) (and x {threads_per_engine} for reference)")
    start = time.perf_counter()
    workers = cluster.start(n, backend="gloo", activate=False, threads_per_engine=threads_per_engine)
    startup_s = time.perf_counter() - start
    try:
        on_engines([dict(seed=0, steps=2)] * n, workers, threads_per_engine)  # engines import and warm up
        for threads in (total_threads, threads_per_engine):                     # and so does this process
            sequential([dict(seed=0, steps=2)], threads)
        rounds = []
        for r in range(args.rounds):
            sides = ["sequential", "sweep"] if r % 2 == 0 else ["sweep", "sequential"]
            measured = {}
            for side in sides:
                if side == "sweep":
                    measured[side] = on_engines(configs, workers, threads_per_engine)
                else:
                    measured[side] = sequential(configs, total_threads)
            measured["sequential_engine_threads"] = sequential(configs, threads_per_engine)
            speedup = measured["sequential"][0] / measured["sweep"][0]
            per_run_threads = measured["sequential_engine_threads"][0] / measured["sweep"][0]
            loss_diff = max(abs(a - b) for a, b in zip(measured["sequential"][2], measured["sweep"][2]))
            rounds.append(dict(order=sides, speedup=speedup, speedup_vs_engine_threads=per_run_threads,
                               max_final_loss_diff=loss_diff,
                               **{f"{side}_wall_s": m[0] for side, m in measured.items()},
                               **{f"{side}_run_s": m[1] for side, m in measured.items()}))
            print(f"round {r}: sequential {measured['sequential'][0]:.2f} s, sweep {measured['sweep'][0]:.2f} s, "
                  f"speed-up {speedup:.2f}; sequential at {threads_per_engine} thread(s) "
                  f"{measured['sequential_engine_threads'][0]:.2f} s, speed-up against it {per_run_threads:.2f}; "
                  f"final losses agree within {loss_diff:.1e}")
    finally:
        cluster.stop()

    speedup = statistics.median(r["speedup"] for r in rounds)
    speedup_engine_threads = statistics.median(r["speedup_vs_engine_threads"] for r in rounds)
    target = 0.8 * n
    median_run = {side: statistics.median(s for r in rounds for s in r[f"{side}_run_s"])
                  for side in ("sequential", "sweep", "sequential_engine_threads")}
    report = {"date": datetime.date.today().isoformat(), "machine": machine.one_line(info), "details": info,
              "engines": n, "configs": k, "steps": args.steps, "threads_per_engine": threads_per_engine,
              "sequential_threads": total_threads, "cluster_start_s": startup_s, "rounds": rounds,
              "median_run_s": median_run, "speedup": speedup, "target": target, "met": speedup >= target,
              "speedup_vs_engine_threads": speedup_engine_threads,
              "load_average_after": machine.describe()["load_average"]}
    print(f"cluster start {startup_s:.1f} s (not counted); median run: sequential {median_run['sequential']:.2f} s "
          f"({total_threads} threads), on an engine {median_run['sweep']:.2f} s, alone at {threads_per_engine} "
          f"thread(s) {median_run['sequential_engine_threads']:.2f} s")
    print(f"speed-up {speedup:.2f} on {n} engines (median of {len(rounds)} rounds); target >= {target:.1f}: "
          f"{'met' if speedup >= target else 'NOT met'}; against the runs one after another at "
          f"{threads_per_engine} thread(s): {speedup_engine_threads:.2f}; load average after "
          f"{report['load_average_after']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()

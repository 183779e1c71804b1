"""Step time of the course's data-parallel wrappers (utils.ddp) against torch's DDP, on gloo CPU ranks.

For each world size (default 2 and 4) the script spawns that many processes on 127.0.0.1 with a
gloo process group; each rank gets max(1, cores // world size) torch threads. Two models:

- ``lab-01``: ``MLP(n_layers=4, d_in=1024, d_hidden=256, n_classes=32)``, 0.40 M parameters (1.6 MB of
  gradients);
- ``larger``: ``MLP(n_layers=6, d_in=1024, d_hidden=1024, n_classes=32)``, 5.28 M parameters (21 MB).

Variants: ``torch-ddp`` (``nn.parallel.DistributedDataParallel(model)``, its default 25 MiB
buckets), ``naive``, ``flat``, ``overlap``, ``bucketed`` (``BucketedDDP(model, bucket_cap_mb)``,
25 MiB unless ``--bucket-cap-mb``) and ``no-comm``: the bare model, no wrapper, every rank on its
own, the compute-only floor. Every variant builds its model from the same seed, with SGD lr 0.1,
per-rank batch 64, and trains on the same few random batches per rank (fixed seed per rank,
generated once, not timed), in the same order: all of them do the same arithmetic.

A step: zero_grad, forward, cross_entropy, backward, ``finish_gradient_synchronization()`` (the
course's wrappers), optimizer.step; each timed alone with ``time.perf_counter``. The variants run
in ``--rounds`` rounds; in a round each (model, variant) gets ``--warmup`` untimed steps, a
barrier, then ``--steps`` timed steps. The variants' order rotates each round and flips every
other round, so a slow or fast spell of the machine falls on all of them alike. After each timed
block the ranks' step times are all-reduced with MAX, step by step: a step is over when the
slowest rank is done. Reported per (world size, model, variant): the median step time over all
rounds, samples/s over the global batch (64 x world size), and throughput relative to torch's
DDP (torch DDP's median / the variant's median), with the lowest and highest per-round ratio
(round medians) so the noise is visible.

Sanity check: after the last round every variant that communicates must hold exactly equal
weights on every rank (``utils.replicas.assert_replicas_equal``); the run fails otherwise. The
largest weight difference from torch DDP's model (rank 0) is reported too: small, not zero, since
the wrappers sum in another order.

Target: BucketedDDP reaches at least 0.95x torch DDP's throughput, for each world size and model.

    .venv/bin/python benchmarks/bench_ddp.py [--world-sizes 2 4] [--models lab-01 larger]
        [--rounds 5] [--steps 30] [--warmup 5] [--bucket-cap-mb 25] [--max-seconds 900]
        [--quick] [--json PATH]
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
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils import ddp  # noqa: E402
from utils.models import MLP  # noqa: E402
from utils.replicas import assert_replicas_equal  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine as machine_info  # noqa: E402
import spawn  # noqa: E402

MODELS = {  # MLP keyword arguments
    "lab-01": dict(n_layers=4, d_in=1024, d_hidden=256, n_classes=32),
    "larger": dict(n_layers=6, d_in=1024, d_hidden=1024, n_classes=32),
}
VARIANTS = ["torch-ddp", "naive", "flat", "overlap", "bucketed", "no-comm"]
BASELINE, TARGETED, TARGET = "torch-ddp", "bucketed", 0.95
BATCH, LR, N_BATCHES, MODEL_SEED = 64, 0.1, 4, 0
GLOO_TIMEOUT_S = 180


def threads_per_rank(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def build(variant: str, model_name: str, bucket_cap_mb: float):
    """(the model to call, the optimizer, the synchronisation to call after backward or None)."""
    torch.manual_seed(MODEL_SEED)                          # every variant starts from the same weights
    model = MLP(**MODELS[model_name])
    if variant == "torch-ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif variant == "bucketed":
        model = ddp.BucketedDDP(model, bucket_cap_mb=bucket_cap_mb)
    elif variant != "no-comm":
        model = ddp.VARIANTS[variant](model)
    sync = getattr(model, "finish_gradient_synchronization", None)
    return model, torch.optim.SGD(model.parameters(), lr=LR), sync


def inner(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def worker(rank, world_size, port, settings, results):
    try:
        threads = threads_per_rank(world_size)
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
        results.put(("ok", rank, run_rank(rank, world_size, threads, settings)))
        dist.destroy_process_group()
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))


def run_rank(rank, world_size, threads, s) -> dict:
    models, variants = s["models"], s["variants"]
    # Random data, once per rank (its own seed): N_BATCHES batches, cycled through in the same
    # order by every variant, so that all variants do the same work.
    gen = torch.Generator().manual_seed(1000 + rank)
    data = {}
    for name in models:
        d_in, n_classes = MODELS[name]["d_in"], MODELS[name]["n_classes"]
        data[name] = [(torch.randn(BATCH, d_in, generator=gen), torch.randint(n_classes, (BATCH,), generator=gen))
                      for _ in range(N_BATCHES)]
    runs = {(m, v): build(v, m, s["bucket_cap_mb"]) for m in models for v in variants}
    done_steps = {key: 0 for key in runs}

    def step(key):
        model, optimizer, sync = runs[key]
        x, y = data[key[0]][done_steps[key] % N_BATCHES]
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if sync is not None:
            sync()
        optimizer.step()
        done_steps[key] += 1

    times = {key: [] for key in runs}                      # per round: the slowest rank's step times (s)
    rounds_done, stopped_early, last_round_s = 0, False, 0.0
    for r in range(s["rounds"]):
        if r:   # rank 0 decides whether another round fits the budget; every rank follows
            over = time.time() - s["started"] + last_round_s > s["max_seconds"]
            flag = torch.tensor([1 if over else 0])
            dist.broadcast(flag, src=0)
            if flag.item():
                stopped_early = True
                break
        round_began = time.perf_counter()
        order = variants[r % len(variants):] + variants[:r % len(variants)]   # rotate ...
        if r % 2:
            order = order[::-1]                                                # ... and flip
        for m in models:
            for v in order:
                key = (m, v)
                for _ in range(s["warmup"]):
                    step(key)
                block = []
                dist.barrier()
                for _ in range(s["steps"]):
                    began = time.perf_counter()
                    step(key)
                    block.append(time.perf_counter() - began)
                slowest = torch.tensor(block, dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)   # a step ends when the slowest rank ends
                times[key].append(slowest.tolist())
        rounds_done += 1
        last_round_s = time.perf_counter() - round_began
        if rank == 0:
            print(f"  {world_size} ranks: round {r + 1}/{s['rounds']} done in {last_round_s:.1f} s", flush=True)

    # Same data, same start, mean gradients: every rank must hold the same weights (not so
    # for no-comm, whose ranks never talk). And every variant should be close to torch DDP.
    for (m, v), (model, _, _) in runs.items():
        if v != "no-comm":
            assert_replicas_equal(model)                   # raises, naming the tensors that differ
    diffs = {}
    for (m, v), (model, _, _) in runs.items():
        if BASELINE in variants:
            ref = inner(runs[(m, BASELINE)][0])
            diffs[(m, v)] = max((a - b).abs().max().item()
                                for a, b in zip(inner(model).parameters(), ref.parameters()))

    rows = []
    for m in models:
        n_params = sum(p.numel() for p in inner(runs[(m, variants[0])][0]).parameters())
        for v in variants:
            pooled = [t for block in times[(m, v)] for t in block]
            rows.append(dict(world_size=world_size, model=m, variant=v, threads_per_rank=threads,
                             n_params=n_params, grad_mib=n_params * 4 / 2 ** 20, global_batch=BATCH * world_size,
                             rounds=rounds_done, steps_per_round=s["steps"],
                             median_step_ms=statistics.median(pooled) * 1e3,
                             round_medians_ms=[statistics.median(b) * 1e3 for b in times[(m, v)]],
                             max_weight_diff_vs_ddp=diffs.get((m, v))))
    add_ratios(rows)
    return dict(rows=rows, rounds_done=rounds_done, stopped_early=stopped_early)


def add_ratios(rows: list[dict]) -> None:
    """samples/s, and throughput / torch DDP's: pooled, and round by round (round medians)."""
    base = {(r["world_size"], r["model"]): r for r in rows if r["variant"] == BASELINE}
    for r in rows:
        r["samples_per_s"] = r["global_batch"] / (r["median_step_ms"] * 1e-3)
        b = base.get((r["world_size"], r["model"]))
        if b is None:
            r["throughput_vs_ddp"] = r["round_ratios_vs_ddp"] = None
            continue
        r["throughput_vs_ddp"] = b["median_step_ms"] / r["median_step_ms"]
        r["round_ratios_vs_ddp"] = [bm / vm for bm, vm in zip(b["round_medians_ms"], r["round_medians_ms"])]


def markdown(rows: list[dict]) -> str:
    lines = ["| ranks | model | variant | median step (ms) | samples/s | vs torch DDP | per-round range |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["throughput_vs_ddp"] is None:
            ratio = spread = "-"
        elif r["variant"] == BASELINE:
            ratio, spread = "1.00x", "-"
        else:
            ratio = f"{r['throughput_vs_ddp']:.2f}x"
            spread = f"{min(r['round_ratios_vs_ddp']):.2f}-{max(r['round_ratios_vs_ddp']):.2f}"
        lines.append(f"| {r['world_size']} | {r['model']} | {r['variant']} | {r['median_step_ms']:.2f} | "
                     f"{r['samples_per_s']:.0f} | {ratio} | {spread} |")
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        if r["variant"] != TARGETED or r["throughput_vs_ddp"] is None:
            continue
        lo, hi = min(r["round_ratios_vs_ddp"]), max(r["round_ratios_vs_ddp"])
        met = r["throughput_vs_ddp"] >= TARGET
        note = " (the rounds fall on both sides of 0.95: noise)" if lo < TARGET <= hi else ""
        out.append(dict(world_size=r["world_size"], model=r["model"], ratio=r["throughput_vs_ddp"], met=met,
                        round_min=lo, round_max=hi,
                        sentence=f"{r['world_size']} ranks, {r['model']}: bucketed / torch DDP throughput "
                                 f"{r['throughput_vs_ddp']:.2f} (rounds {lo:.2f}-{hi:.2f}, {r['rounds']} round(s)): "
                                 f"target >= {TARGET} {'met' if met else 'NOT met'}{note}"))
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS,
                        help="default: all; leave torch-ddp in to get the ratios")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant per round (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="BucketedDDP's bucket size (default 25)")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="start no round that would end after this (every world size runs >= 1 round)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 ranks, lab-01, 1 round, 2+5 steps")
    parser.add_argument("--json", type=Path, help="write the machine, the settings and every number here")
    args = parser.parse_args(argv)
    if args.quick:
        args.world_sizes, args.models, args.rounds, args.warmup, args.steps = [2], ["lab-01"], 1, 2, 5
    if min(args.world_sizes) < 2 or args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.bucket_cap_mb <= 0:
        parser.error("world sizes must be >= 2, --rounds and --steps >= 1, --warmup >= 0, --bucket-cap-mb > 0")
    variants = list(dict.fromkeys(args.variants))
    models = list(dict.fromkeys(args.models))

    info = machine_info.describe()
    began, wall_began = time.perf_counter(), time.time()
    settings = dict(models=models, variants=variants, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                    bucket_cap_mb=args.bucket_cap_mb, max_seconds=args.max_seconds, started=wall_began)
    print(f"Machine: {machine_info.one_line(info)}; load average before: {info['load_average']}", flush=True)
    print(f"Per-rank batch {BATCH}, SGD lr {LR}; {args.rounds} round(s) x ({args.warmup} warm-up + {args.steps} timed "
          f"steps) per variant; torch threads per rank: "
          + ", ".join(f"{threads_per_rank(w)} at {w} ranks" for w in args.world_sizes), flush=True)
    rows, stops = [], []
    for world_size in args.world_sizes:
        # Nothing hangs: gloo times out each collective, and this deadline catches the rest.
        left = max(0.0, args.max_seconds - (time.perf_counter() - began))
        report = spawn.run_world(worker, world_size, (settings,), deadline_s=max(600.0, 3 * left))
        rows += report["rows"]
        if report["stopped_early"]:
            stops.append(f"--max-seconds {args.max_seconds:g} reached: {world_size} ranks ran "
                         f"{report['rounds_done']} of {args.rounds} rounds")
        print(f"  {world_size} ranks done ({time.perf_counter() - began:.0f} s)", flush=True)
    info["load_average_after"] = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
    checks = verdicts(rows)

    print()
    print(f"Machine: {machine_info.one_line(info)}")
    print()
    print(markdown(rows))
    print()
    for stop in stops:
        print(stop)
    for check in checks:
        print(check["sentence"])
    if not checks:
        print("target not tested: needs both torch-ddp and bucketed in --variants")
    communicating = [r for r in rows if r["variant"] != "no-comm"]
    print(f"Replicas equal on every rank after training: checked for "
          f"{', '.join(dict.fromkeys(r['variant'] for r in communicating))}: OK")
    diffs = [r["max_weight_diff_vs_ddp"] for r in communicating if r["max_weight_diff_vs_ddp"] is not None]
    if diffs:
        print(f"Largest weight difference from torch DDP's model (rank 0, all models): {max(diffs):.2g}")
    total = time.perf_counter() - began
    print(f"Load average after: {info['load_average_after']}; total {total:.0f} s")

    result = dict(machine=info, date=datetime.date.today().isoformat(),
                  settings=dict(world_sizes=args.world_sizes, models={m: MODELS[m] for m in models},
                                variants=variants, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                                bucket_cap_mb=args.bucket_cap_mb, max_seconds=args.max_seconds, quick=args.quick,
                                per_rank_batch=BATCH, lr=LR, n_batches=N_BATCHES, target=TARGET),
                  rows=rows, verdicts=checks, stopped_early=stops, seconds=total)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

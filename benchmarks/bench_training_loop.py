"""Step time of the course's training loop against a plain PyTorch loop, and against the FLOP bound.

Trains the lab-01 configuration (MLP 1024 -> 256 -> 256 -> 256 -> 32, synthetic data with
10000 training samples, batch 64, SGD lr 0.1 with LinearLR 1.0 -> 0.3) twice per repeat:

  A. course: ``utils.train.train`` (progress and log printing off, one evaluation at the
     first and the last step only), step times read from ``History.step_time_ms``;
  B. plain:  the classic minimal loop written below, timed per step the same way.

Runs are interleaved in pairs (A B, B A, A B, ...), every run starts from the same initial
weights, and the first ``--warmup`` steps of each run are left out. Reported: the median step
time of each loop, their ratio (course / plain, median over the pairs, with a 95% bootstrap
interval; target <= 1.0), the achieved GFLOP/s (FLOPs from ``utils.perf.mlp_train_flops``)
and the ratio of step time to the FLOP-bound time (FLOPs / ``utils.perf.matmul_peak_gflops()``
measured in this run; target <= 2).

    .venv/bin/python benchmarks/bench_training_loop.py [--steps N] [--repeats R]
        [--warmup W] [--threads T] [--device cpu|cuda] [--max-seconds S] [--json PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.data import synthetic  # noqa: E402
from utils.models import MLP  # noqa: E402
from utils.perf import matmul_peak_gflops, mlp_train_flops  # noqa: E402
from utils.train import train, train_step  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine as machine_info  # noqa: E402
from stats import paired_ratio  # noqa: E402

# The lab-01 configuration.
N_LAYERS, D_IN, D_HIDDEN, N_CLASSES = 4, 1024, 256, 32
TRAIN_SIZE, BATCH, LR, LR_END_FACTOR = 10000, 64, 0.1, 0.3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def course_loop(model, data, n_steps: int, device: torch.device) -> list[float]:
    """Step times (ms) of the course's loop.

    Timed region (inside utils.train.train): forward, cross_entropy, zero_grad, backward,
    optimizer.step, scheduler.step. Outside it: taking the next batch (a view, from
    ``next(batches)``) and the two evaluations (after step 0 and after the last step, as
    log_every = n_steps). shuffle=False walks the training set in order, as the seed's loop
    and the plain loop do: both loops see the same batches, so from the same init they must
    end at the same weights (checked in main).
    """
    history = train(model, data, batch_size=BATCH, lr=LR, lr_end_factor=LR_END_FACTOR, n_steps=n_steps,
                    log_every=n_steps, eval_size=1000, device=device, shuffle=False,
                    progress=False, print_log=False)
    return history.step_time_ms


def plain_loop(model, data, n_steps: int, device: torch.device) -> list[float]:
    """Step times (ms) of the classic minimal loop: the next 64 samples of the training tensor per step.

    Timed region: forward, cross_entropy, zero_grad, backward, optimizer.step,
    scheduler.step -- the same as the course's; the batch, a view (slice) of the training
    tensor as in the course's loop, is taken just before the timer starts. On CUDA each
    step is bracketed by CUDA events read back at the end, as the course's StepTimer does;
    on the CPU the work is synchronous and wall-clock time is exact.
    """
    model.to(device).train()
    x, y = data.x_train.to(device), data.y_train.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=LR_END_FACTOR,
                                                  total_iters=n_steps)
    batches_per_epoch = len(x) // BATCH  # the last partial batch is dropped, as in the course's loop
    cuda = device.type == "cuda"
    events, times = [], []
    for step in range(n_steps):
        start = (step % batches_per_epoch) * BATCH
        xb, yb = x[start:start + BATCH], y[start:start + BATCH]
        if cuda:
            events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            events[-1][0].record()
        else:
            t0 = time.perf_counter()
        train_step(model, optimizer, xb, yb)
        scheduler.step()
        if cuda:
            events[-1][1].record()
        else:
            times.append((time.perf_counter() - t0) * 1e3)
    if cuda:
        events[-1][1].synchronize()
        times = [a.elapsed_time(b) for a, b in events]
    return times


def machine(device: torch.device) -> dict:
    info = machine_info.describe()
    info.update(torch_threads=torch.get_num_threads(), device=str(device))
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=12, help="runs of each loop, interleaved (default 12)")
    parser.add_argument("--warmup", type=int, default=30, help="steps left out at the start of each run (default 30)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--max-seconds", type=float, default=150,
                        help="start no pair of runs that would end after this many seconds (default 150)")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup or args.repeats < 1:
        parser.error("--steps must be larger than --warmup, and --repeats at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device}: only cpu and cuda[:N] are timed correctly here")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda asked for, but this machine has no CUDA GPU")
    load_before = load_average()

    data = synthetic(train_size=TRAIN_SIZE, d_in=D_IN, n_classes=N_CLASSES, seed=0)
    torch.manual_seed(0)
    init_state = MLP(N_LAYERS, D_IN, D_HIDDEN, N_CLASSES).state_dict()  # one init shared by every run

    def fresh_model():
        model = MLP(N_LAYERS, D_IN, D_HIDDEN, N_CLASSES)
        model.load_state_dict(init_state)
        return model.to(device)

    loops = {"course": course_loop, "plain": plain_loop}
    kept = {name: [] for name in loops}        # post-warm-up step times of all runs, pooled
    run_medians = {name: [] for name in loops}
    final, peaks = {}, []
    began = pair_began = time.perf_counter()
    for repeat in range(args.repeats):
        now = time.perf_counter()
        if repeat and (now - began) + (now - pair_began) > args.max_seconds:  # the next pair would overrun
            print(f"stopped after {repeat} of {args.repeats} pairs: --max-seconds {args.max_seconds:g} reached")
            break
        pair_began = now
        # Interleaved in pairs, the order flipped every pair (A B, B A, A B, ...) so that a
        # slow drift of the machine's speed falls on both loops alike.
        order = list(loops) if repeat % 2 == 0 else list(loops)[::-1]
        for name in order:
            model = fresh_model()
            times = loops[name](model, data, args.steps, device)[args.warmup:]
            sync(device)
            kept[name] += times
            run_medians[name].append(statistics.median(times))
            final.setdefault(name, [p.detach().cpu().clone() for p in model.parameters()])
        peaks.append(matmul_peak_gflops(device, repeats=3))  # the peak, sampled through the run
    peak = max(peaks)

    # Same work: from the same init, both loops must end at the same weights.
    weight_diff = max((a - b).abs().max().item() for a, b in zip(final["course"], final["plain"]))
    flops = mlp_train_flops(BATCH, N_LAYERS, D_IN, D_HIDDEN, N_CLASSES)
    bound_ms = flops / (peak * 1e9) * 1e3
    results = {}
    for name in loops:
        median = statistics.median(kept[name])
        results[name] = {"median_step_ms": median, "best_run_median_ms": min(run_medians[name]),
                         "run_medians_ms": run_medians[name],
                         "gflops": flops / (median * 1e-3) / 1e9, "step_over_flop_bound": median / bound_ms}
    pooled_ratio = results["course"]["median_step_ms"] / results["plain"]["median_step_ms"]
    # Each course run against the plain run next to it: robust to the machine's speed changing.
    pair_ratio, ratio_ci = paired_ratio(run_medians["course"], run_medians["plain"])
    all_medians = run_medians["course"] + run_medians["plain"]
    spread = max(all_medians) / min(all_medians)
    report = {"date": datetime.date.today().isoformat(), "machine": machine(device),
              "load_average_1min": [load_before, load_average()],
              "config": {"n_layers": N_LAYERS, "d_in": D_IN, "d_hidden": D_HIDDEN, "n_classes": N_CLASSES,
                         "train_size": TRAIN_SIZE, "batch_size": BATCH, "lr": LR, "lr_end_factor": LR_END_FACTOR,
                         "steps": args.steps, "warmup": args.warmup, "repeats": len(run_medians["plain"])},
              "flops_per_step": flops, "matmul_peak_gflops": peak, "matmul_peak_gflops_samples": peaks,
              "flop_bound_ms": bound_ms, "course_over_plain_paired": pair_ratio,
              "course_over_plain_paired_ci95": list(ratio_ci),
              "course_over_plain_pooled": pooled_ratio, "run_median_spread": spread,
              "max_final_weight_diff": weight_diff, "results": results}

    m = report["machine"]
    print(f"Machine: {machine_info.one_line(m)}; {m['torch_threads']} torch threads, device {m['device']}; "
          f"1-min load average {load_before} before, {report['load_average_1min'][1]} after")
    print(f"Lab-01 MLP {D_IN}-{D_HIDDEN}x{N_LAYERS - 1}-{N_CLASSES}, batch {BATCH}: "
          f"{flops / 1e6:.1f} MFLOP/step; matmul peak {peak:.1f} GFLOP/s -> FLOP-bound step {bound_ms:.3f} ms")
    print(f"{len(run_medians['plain'])} interleaved runs x {args.steps} steps per loop, first {args.warmup} steps of each run "
          f"left out; final weights course vs plain: max |diff| = {weight_diff:.2g}\n")
    print("| loop | median step (ms) | best run (ms) | slowest run (ms) | GFLOP/s | step / FLOP-bound |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in loops:
        r = results[name]
        print(f"| {name} | {r['median_step_ms']:.3f} | {r['best_run_median_ms']:.3f} | "
              f"{max(r['run_medians_ms']):.3f} | {r['gflops']:.1f} | {r['step_over_flop_bound']:.2f}x |")
    course_bound = results["course"]["step_over_flop_bound"]
    print(f"\ncourse / plain = {pair_ratio:.3f} (median of the {len(run_medians['plain'])} paired runs, 95% interval "
          f"{ratio_ci[0]:.3f}-{ratio_ci[1]:.3f}; pooled medians: {pooled_ratio:.3f}); target <= 1.0: "
          f"{'met' if round(pair_ratio, 3) <= 1.0 else 'NOT met'}"
          + (" (1.0 is inside the interval: no difference this run can resolve)"
             if ratio_ci[0] <= 1.0 <= ratio_ci[1] else ""))
    print(f"course step / FLOP-bound step = {course_bound:.2f}x; target <= 2: "
          f"{'met' if course_bound <= 2 else 'NOT met'}")
    if spread > 1.5:
        print(f"WARNING: the slowest run's median is {spread:.1f}x the fastest's: something else was using "
              f"the machine, so these numbers are noisy; rerun on an idle machine.")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"numbers written to {args.json}")
    return report


if __name__ == "__main__":
    main()

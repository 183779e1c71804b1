"""Lab 06's training step of the CNN against a plain PyTorch loop of the same model and data.

  A. lab: the step as lab 06's scripts take it: batches from a ``DataLoader`` over a ``TensorDataset``
     (shuffled), moved to the device, forward, cross_entropy, zero_grad, backward, step, and the loss
     sum and sample count kept in a device tensor (no host sync per step);
  B. plain: the textbook PyTorch loop over the same shuffled ``DataLoader``: forward, loss, zero_grad,
     backward, step, nothing else;
  C. slices: the same step on consecutive slices of the training tensors, with no loader at all.

A against B is what the course's step adds (target lab / plain <= 1.02); B against C is what the
``DataLoader`` costs (indexing one sample at a time, then collating), which lab 06's section 2 measures.
Runs rotate (A B C, C B A, ...), every run starts from the same initial weights and trains one epoch of
the offline ``shapes`` set at batch 64; reported: the median epoch time of each, and the ratios
(median over the rounds, with a 95% bootstrap interval).

    .venv/bin/python benchmarks/bench_cnn_step.py [--repeats 8] [--train-size 4000] [--threads T] [--json PATH]
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
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from stats import paired_ratio  # noqa: E402
from utils import data, models  # noqa: E402
from utils.train import train_step  # noqa: E402

BATCH, LR = 64, 0.05


def lab_epoch(model, x, y, device) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    totals = torch.zeros(2, device=device)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = train_step(model, optimizer, xb, yb)
        totals[0] += loss.detach() * len(yb)
        totals[1] += len(yb)
    totals.tolist()                                    # waits for the device, as the epoch's log line does
    return time.perf_counter() - start


def plain_epoch(model, x, y, device) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = train_step(model, optimizer, xb, yb)
    loss.item()                                        # waits for the device
    return time.perf_counter() - start


def slices_epoch(model, x, y, device) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = x.to(device), y.to(device)
    start = time.perf_counter()
    for i in range(0, len(x), BATCH):
        train_step(model, optimizer, x[i:i + BATCH], y[i:i + BATCH])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="pairs of runs (default 8)")
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    shapes = data.load("shapes", train_size=args.train_size, test_size=100)
    torch.manual_seed(0)
    init = models.CNN(shapes.input_shape).state_dict()
    loops = {"lab": lab_epoch, "plain": plain_epoch, "slices": slices_epoch}
    seconds = {name: [] for name in loops}
    info = machine.describe()
    for repeat in range(args.repeats + 1):            # the first pair warms up and is left out
        for name in (list(loops) if repeat % 2 == 0 else list(loops)[::-1]):
            model = models.CNN(shapes.input_shape).to(device)
            model.load_state_dict(init)
            elapsed = loops[name](model, shapes.x_train, shapes.y_train, device)
            if repeat:
                seconds[name].append(elapsed)
    ratio, interval = paired_ratio(seconds["lab"], seconds["plain"])
    loader_ratio, loader_interval = paired_ratio(seconds["plain"], seconds["slices"])
    report = {"date": datetime.date.today().isoformat(), "machine": machine.one_line(info), "details": info,
              "torch_threads": torch.get_num_threads(), "device": str(device), "train_size": args.train_size,
              "batch": BATCH, "epoch_seconds": seconds, "lab_over_plain": ratio, "lab_over_plain_ci95": list(interval),
              "plain_over_slices": loader_ratio, "plain_over_slices_ci95": list(loader_interval),
              "load_average_after": machine.describe()["load_average"]}
    print(f"{machine.one_line(info)}; {torch.get_num_threads()} torch threads; load average {info['load_average']}")
    for name, values in seconds.items():
        print(f"{name:>6}: median epoch {statistics.median(values):.3f} s over {len(values)} runs "
              f"({args.train_size} images, batch {BATCH})")
    print(f"lab / plain = {ratio:.3f} (95% interval {interval[0]:.3f}-{interval[1]:.3f}); target <= 1.02: "
          f"{'met' if ratio <= 1.02 else 'NOT met'}")
    print(f"plain / slices = {loader_ratio:.3f} (95% interval {loader_interval[0]:.3f}-{loader_interval[1]:.3f}): "
          f"what the DataLoader costs against slicing the tensors")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()

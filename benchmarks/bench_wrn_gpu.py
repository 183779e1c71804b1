"""Record lab 06's GPU numbers: a WideResNet on one GPU under the lab's settings.

    .venv/bin/python benchmarks/bench_wrn_gpu.py [--depth 16 --width 4 --batch 256 --steps 30 --epochs 15]

Needs a CUDA GPU. Measures (``utils.labs.lab06``):
- images per second of a training step in fp32, bf16 autocast, bf16 autocast + channels_last, and the
  last with each batch copied from host memory instead of kept on the device;
- the time of a training epoch of the offline colour ``shapes`` set, sized like CIFAR-10 (50,000 training
  and 10,000 validation images of 3x32x32), with the lab's settings (bf16 autocast, channels_last, data on
  the device) against fp32 without channels_last;
- the training time the lab's settings take to reach 0.75 validation accuracy in two epochs in a row,
  the NVIDIA course assessment's target (whose 4 GPUs get 240 s for it on CIFAR-10).
Writes benchmarks/results/wrn_gpu_<gpu name>.json, which lab 06 shows to learners who have no GPU
(with the machine named).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe, one_line  # noqa: E402
from utils import data  # noqa: E402
from utils.labs import lab06

TARGET = 0.75


def epoch_s(run: dict) -> float:
    """Seconds of the second epoch: the first also pays for cuDNN's kernel search and the allocator's warm-up."""
    first, second = run["epochs"][:2]
    return second["train_s"] - first["train_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=15, help="most epochs of the run to the target")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_wrn_gpu.py needs a CUDA GPU; this machine has none")
    device = torch.device("cuda")
    model = dict(depth=args.depth, width=args.width, batch=args.batch)
    rows = lab06.wrn_settings(device, (3, 32, 32), steps=args.steps, **model)
    for row in rows:
        print(f"{row['setting']:<72} {row['images_per_s']:>10,.0f} images/s", flush=True)

    start = time.perf_counter()
    colour = data.shapes(num_samples=60000, size=32, channels=3, test_fraction=1 / 6)
    print(f"{colour} drawn in {time.perf_counter() - start:.1f} s", flush=True)
    plain = lab06.train_to_accuracy(colour, device, epochs=2, target=None, dtype=None, channels_last=False, **model)
    lab = lab06.train_to_accuracy(colour, device, epochs=args.epochs, target=TARGET, **model)
    for epoch in lab["epochs"]:
        print(f"epoch {epoch['epoch']:>2}: {epoch['train_s']:6.1f} s of training, validation accuracy "
              f"{epoch['val_accuracy']:.3f}", flush=True)
    epochs = {"fp32": epoch_s(plain), "bf16 autocast + channels_last": epoch_s(lab)}
    print(f"one epoch: fp32 {epochs['fp32']:.2f} s, lab's settings {epochs['bf16 autocast + channels_last']:.2f} s")
    print(f"{TARGET} validation accuracy twice in a row: "
          + (f"epoch {lab['reached_epoch']}, after {lab['reached_s']:.1f} s of training" if lab["reached_s"]
             else f"not reached in {args.epochs} epochs"))

    info = describe()
    record = {**info, "machine": one_line(info), "date": datetime.date.today().isoformat(), "rows": rows,
              "dataset": f"shapes, colour 3x32x32, {len(colour.x_train)} training and {len(colour.x_test)} "
                         f"validation images",
              "model": f"WRN-{args.depth}-{args.width}, batch {args.batch}",
              "epoch_s": epochs, "target": TARGET, "time_to_accuracy": lab}
    name = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")
    path = lab06.RESULTS / f"wrn_gpu_{name}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()

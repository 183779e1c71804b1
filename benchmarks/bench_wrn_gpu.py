"""Record lab 06's GPU numbers: WideResNet step throughput in fp32, bf16 autocast and bf16 + channels_last.

    .venv/bin/python benchmarks/bench_wrn_gpu.py [--depth 16 --width 4 --batch 256 --steps 30]

Needs a CUDA GPU. Writes benchmarks/results/wrn_gpu_<gpu name>.json, which lab 06 shows to learners
who have no GPU (with the machine named).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import datetime  # noqa: E402

from machine import describe, one_line  # noqa: E402
from utils import gpu_speed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_wrn_gpu.py needs a CUDA GPU; this machine has none")
    rows = gpu_speed.wrn_settings(torch.device("cuda"), (3, 32, 32), depth=args.depth, width=args.width,
                                  batch=args.batch, steps=args.steps)
    info = describe()
    record = {**info, "machine": one_line(info), "date": datetime.date.today().isoformat(), "rows": rows}
    name = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")
    path = gpu_speed.RESULTS / f"wrn_gpu_{name}.json"
    path.write_text(json.dumps(record, indent=1))
    for row in rows:
        print(f"{row['setting']:<50} {row['images_per_s']:>10,.0f} images/s")
    print(f"written to {path}")


if __name__ == "__main__":
    main()

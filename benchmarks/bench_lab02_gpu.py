"""Record lab 02's GPU measurements for learners who have no GPU.

    .venv/bin/python benchmarks/bench_lab02_gpu.py

Needs a CUDA GPU. Runs the measurements of ``utils.labs.lab02`` (copy rates, when copies return,
naive against synchronised timing, the cost of a sync point per step, throughput against batch size,
the caching allocator's counters, a pinned and prefetched training loop) and writes
benchmarks/results/lab02_gpu_<gpu name>.json with the machine, versions and date. Lab 02 shows the
newest such file, machine named, where there is no GPU.
"""
from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from machine import describe, one_line  # noqa: E402
from utils.labs import lab02  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_lab02_gpu.py needs a CUDA GPU; this machine has none")
    device = torch.device("cuda:0")
    info = describe()
    record = {**info, "machine": one_line(info), "date": datetime.date.today().isoformat(),
              **lab02.measure_all(device)}
    name = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(device).lower()).strip("_")
    path = lab02.RESULTS / f"lab02_gpu_{name}.json"
    path.write_text(json.dumps(record, indent=1))
    for key in lab02.SECTIONS:
        print(key)
        lab02.print_table(record[key])
    print(f"written to {path}")


if __name__ == "__main__":
    main()

"""Images per second of a WideResNet training step on a GPU under the settings lab 06 (section 5) names:
fp32, bf16 autocast, bf16 autocast with ``channels_last``. ``benchmarks/bench_wrn_gpu.py`` records the
numbers on a GPU machine (``benchmarks/results/wrn_gpu_*.json``) and the lab shows them where there is
no GPU; ``recorded_runs`` reads them back.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .config import COURSE_ROOT
from .models import WideResNet

RESULTS = COURSE_ROOT / "benchmarks" / "results"
SETTINGS = {"fp32": (None, False),
            "bf16 autocast": (torch.bfloat16, False),
            "bf16 autocast + channels_last": (torch.bfloat16, True)}


def _images_per_s(model, x, y, dtype, channels_last: bool, steps: int, warmup: int) -> float:
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize(x.device)
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize(x.device)
    return steps * len(x) / (time.perf_counter() - start)


def wrn_settings(device, input_shape=(3, 32, 32), *, depth: int = 16, width: int = 4, batch: int = 256,
                 steps: int = 30, warmup: int = 5) -> list[dict]:
    """One row per setting: ``{"setting", "images_per_s"}``, the data already on the device."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"wrn_settings measures a CUDA GPU, got device {device!r}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *input_shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    rows = []
    for name, (dtype, channels_last) in SETTINGS.items():
        torch.manual_seed(0)
        model = WideResNet(depth=depth, width=width, in_channels=input_shape[0]).to(device)
        rows.append({"setting": f"WRN-{depth}-{width}, batch {batch}, {name}",
                     "images_per_s": _images_per_s(model, x, y, dtype, channels_last, steps, warmup)})
    return rows


def recorded_runs(folder: Path = RESULTS) -> list[dict]:
    """The recorded GPU runs, oldest first (by date), each ``{"machine", "date", "rows", ...}``."""
    runs = [json.loads(path.read_text()) for path in Path(folder).glob("wrn_gpu_*.json")]
    return sorted(runs, key=lambda run: run.get("date", ""))

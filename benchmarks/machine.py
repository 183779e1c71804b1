"""One description of the machine a benchmark ran on, shared by every script here."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict:
    """CPU, cores, GPU, torch and Python versions, and the load when the benchmark ran."""
    import torch

    return dict(cpu=cpu_model(), cores=os.cpu_count(),
                gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                torch=torch.__version__, python=platform.python_version(),
                system=f"{platform.system()} {platform.release()}",
                load_average=[round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None)


def one_line(info: dict | None = None) -> str:
    info = info or describe()
    gpu = f"GPU {info['gpu']}" if info["gpu"] else "no GPU"
    return f"{info['cpu']}, {info['cores']} logical cores, {gpu}, {info['system']}, torch {info['torch']}"

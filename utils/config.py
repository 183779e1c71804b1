"""Course settings read from the environment.

Every lab calls into this module instead of hard-coding sizes or devices, so one
setting changes all of them:

- ``COURSE_QUICK=1``: quick mode, small sizes for the test suite (about a minute a lab).
- ``COURSE_DEVICE``: ``auto`` (default: cuda, then mps, then cpu), ``cpu``, ``cuda``,
  ``cuda:N`` or ``mps``.
- ``COURSE_DATA_DIR``: where datasets are read from and downloaded to, and drawn ``shapes`` sets kept
  (default: ``data/`` at the top of the course).
- ``COURSE_DATASET``: the image dataset the later labs use (see ``utils.data.DATASETS``).
- ``COURSE_DOWNLOAD=0``: never try the network; missing files raise an error instead.
- ``COURSE_CORES=N``: pick worker counts as a machine with ``N`` cores would (the suite runs
  labs 06-08 as an 8-core laptop does, oversubscribed: accuracy-level claims, not timings).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that need it: the grader's own process reads COURSE_ROOT and the
# settings here and never loads torch (about 500 MB).
COURSE_ROOT = Path(__file__).resolve().parent.parent
_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default).strip().lower() in _TRUE


def quick_mode() -> bool:
    """True when the labs should run their small, test-sized version."""
    return _flag("COURSE_QUICK")


def pick(quick, full):
    """Return ``quick`` in quick mode and ``full`` otherwise."""
    return quick if quick_mode() else full


def cores() -> int:
    """The cores the labs plan for: ``COURSE_CORES`` if set, else the cores this process may use.

    Labs pick their worker counts from this number. Setting it above the real count runs the
    workers oversubscribed (they take turns on the cores): what they compute is what a learner's
    machine with that many cores computes, but their times measure the turns.
    """
    value = os.environ.get("COURSE_CORES", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"COURSE_CORES={value!r}: give a whole number of cores, 1 or more (or unset it)")
        return int(value)
    return real_cores()


def real_cores() -> int:
    """The cores this process may really use, whatever ``COURSE_CORES`` says."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def oversubscribed() -> bool:
    """True when ``COURSE_CORES`` plans for more cores than this process has: timings are not claims."""
    return cores() > real_cores()


def download_allowed() -> bool:
    return _flag("COURSE_DOWNLOAD", "1")


def data_dir() -> Path:
    return Path(os.environ.get("COURSE_DATA_DIR", COURSE_ROOT / "data")).expanduser()


def dataset_name(default: str = "mnist1d") -> str:
    return os.environ.get("COURSE_DATASET", default).strip().lower()


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def get_device(name: str | None = None) -> torch.device:
    """The device to compute on: ``name``, else ``COURSE_DEVICE``, else the best present.

    ``auto`` prefers cuda, then mps (Apple GPUs), then cpu. Asking for a device this
    machine does not have raises a ValueError that says what to use instead.
    """
    import torch

    name = (name or os.environ.get("COURSE_DEVICE") or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not _mps_available():
            raise ValueError("device 'mps' is not available on this machine; "
                             "use device='auto' or 'cpu' (or unset COURSE_DEVICE)")
        return torch.device("mps")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} was asked for but this machine has no CUDA GPU; "
                             "use device='auto' or 'cpu' (or unset COURSE_DEVICE)")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} does not exist: this machine has "
                             f"{torch.cuda.device_count()} GPU(s), cuda:0..cuda:{torch.cuda.device_count() - 1}")
        return device
    raise ValueError(f"unknown device {name!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def describe_device(device: torch.device) -> str:
    """A one-line description of ``device`` for printing next to a measurement."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} logical cores)"
    return str(device)

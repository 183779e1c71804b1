"""Lab 02's measurements of one GPU, as functions: ``benchmarks/bench_lab02_gpu.py`` runs them on a GPU
machine and stores the results (``benchmarks/results/lab02_gpu_*.json``, machine named), and
labs/02_single_gpu.ipynb shows those recorded numbers where the learner has no GPU.

Each function is the measurement the lab teaches in its cells: host-to-device copy rates, when a
non-blocking copy returns, naive against synchronised timing, the cost of a sync point per step,
the caching allocator's counters, and pinned, prefetched batches in a training loop.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from utils.config import COURSE_ROOT
from utils.models import MLP
from utils.perf import best_ms, synchronize
from utils.train import train_step

RESULTS = COURSE_ROOT / "benchmarks" / "results"
PATTERN = "lab02_gpu_*.json"


def _cuda(device) -> torch.device:
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"this measurement needs a CUDA GPU, got device {device!r}; on a machine without "
                         f"one, read the recorded runs with utils.labs.lab02.recorded_runs()")
    return device


def copy_rates(device, sizes_mb=(1, 4, 16, 64, 256), repeats: int = 20) -> list[dict]:
    """GB/s of host-to-GPU copies: from pageable memory, from pinned memory, and pin_memory() + copy."""
    device = _cuda(device)
    rows = []
    for mb in sizes_mb:
        pageable = torch.randn(mb * 2**20 // 4)
        pinned = pageable.pin_memory()
        n_bytes = pageable.numel() * 4
        rate = lambda copy: n_bytes / (best_ms(copy, device, repeats) / 1e3) / 1e9  # noqa: E731
        rows.append({"mb": mb,
                     "pageable_gbps": rate(lambda: pageable.to(device)),
                     "pinned_gbps": rate(lambda: pinned.to(device, non_blocking=True)),
                     "pin_then_copy_gbps": rate(lambda: pageable.pin_memory().to(device, non_blocking=True))})
    return rows


def copy_return_times(device, mb: int = 64) -> list[dict]:
    """How long ``.to(device)`` takes to return, and until the data has arrived, by memory and flag."""
    device = _cuda(device)
    source = torch.randn(mb * 2**20 // 4)
    rows = []
    for memory, tensor in (("pageable", source), ("pinned", source.pin_memory())):
        for non_blocking in (False, True):
            tensor.to(device, non_blocking=non_blocking)  # warm-up
            synchronize(device)
            start = time.perf_counter()
            tensor.to(device, non_blocking=non_blocking)
            returned = time.perf_counter()
            synchronize(device)
            arrived = time.perf_counter()
            rows.append({"memory": memory, "non_blocking": non_blocking, "mb": mb,
                         "returned_ms": (returned - start) * 1e3, "arrived_ms": (arrived - start) * 1e3})
    return rows


def matmul_timings(device, size: int = 2048, n_matmuls: int = 10, rounds: int = 3) -> dict:
    """One call of ``n_matmuls`` products timed four ways: first call, naive, synchronised, CUDA events."""
    device = _cuda(device)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)

    def matmuls():
        for _ in range(n_matmuls):
            a @ b
    synchronize(device)
    start = time.perf_counter()
    matmuls()
    synchronize(device)
    first = (time.perf_counter() - start) * 1e3
    naive = synced = events = float("inf")
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        start = time.perf_counter()
        matmuls()
        naive = min(naive, (time.perf_counter() - start) * 1e3)  # the GPU is still busy here
        synchronize(device)
        start = time.perf_counter()
        matmuls()
        synchronize(device)
        synced = min(synced, (time.perf_counter() - start) * 1e3)
        start_event.record()
        matmuls()
        end_event.record()
        end_event.synchronize()
        events = min(events, start_event.elapsed_time(end_event))
    return {"size": size, "n_matmuls": n_matmuls, "first_ms": first, "naive_ms": naive, "synced_ms": synced,
            "events_ms": events, "gflops": 2 * size**3 * n_matmuls / synced / 1e6}


def _steps(model, optimizer, batches, read_every_step: bool):
    losses = []
    for x, y in batches:
        loss = train_step(model, optimizer, x, y)
        losses.append(loss.item() if read_every_step else loss.detach())
    return losses


def sync_point_cost(device, batch_sizes=(16, 64, 256), steps: int = 20) -> list[dict]:
    """ms per SGD step of lab 01's MLP with the losses kept on the device, and with .item() every step."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for batch in batch_sizes:
        batches = [(torch.randn(batch, 1024, device=device), torch.randint(0, 32, (batch,), device=device))
                   for _ in range(steps)]
        on_device = best_ms(lambda: _steps(model, optimizer, batches, False), device, 1) / steps
        with_item = best_ms(lambda: _steps(model, optimizer, batches, True), device, 1) / steps
        rows.append({"batch": batch, "on_device_ms": on_device, "item_every_step_ms": with_item})
    return rows


def throughput(device, batch_sizes=(16, 64, 256, 1024, 4096, 8192), steps: int = 10) -> list[dict]:
    """Samples per second of lab 01's MLP training step against the batch size (data on the device)."""
    from utils.train import time_steps

    device = torch.device(device)
    torch.manual_seed(0)
    x, y = torch.randn(max(batch_sizes), 1024), torch.randint(0, 32, (max(batch_sizes),))
    rows = []
    for batch in batch_sizes:
        ms = time_steps(MLP(), x, y, batch, n_steps=steps, warmup=3, device=device)
        rows.append({"batch": batch, "ms_per_step": ms, "samples_per_s": batch / (ms / 1e3)})
    return rows


def allocator_counters(device, batch: int = 4096) -> list[dict]:
    """The caching allocator's counters (MB) along one training step, then after del and empty_cache()."""
    device = _cuda(device)
    mb = lambda n: n / 2**20  # noqa: E731
    rows = []

    def note(stage):
        rows.append({"stage": stage, "allocated_mb": mb(torch.cuda.memory_allocated(device)),
                     "max_allocated_mb": mb(torch.cuda.max_memory_allocated(device)),
                     "reserved_mb": mb(torch.cuda.memory_reserved(device))})
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    note("start")
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 1024, device=device), torch.randint(0, 32, (batch,), device=device)
    note("model and batch on the GPU")
    loss = F.cross_entropy(model(x), y)
    note("after the forward pass")
    loss.backward()
    optimizer.step()
    note("after backward and step")
    del model, optimizer, x, y, loss
    note("after del (memory back in the cache)")
    torch.cuda.empty_cache()
    note("after torch.cuda.empty_cache()")
    return rows


def pinned_loop(device, batch: int = 1024, steps: int = 50, n_samples: int = 16384) -> list[dict]:
    """ms per training step when every batch comes from host memory: pageable and blocking, against
    pinned with the next batch's copy issued (non_blocking) before the current step runs."""
    device = _cuda(device)
    torch.manual_seed(0)
    x_host, y_host = torch.randn(n_samples, 1024), torch.randint(0, 32, (n_samples,))
    x_pinned, y_pinned = x_host.pin_memory(), y_host.pin_memory()
    starts = [(i * batch) % (n_samples - batch) for i in range(steps + 1)]
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        train_step(model, optimizer, x, y)

    def pageable():
        for s in starts[:-1]:
            step(x_host[s:s + batch].to(device), y_host[s:s + batch].to(device))

    def pinned_prefetch():
        nxt = (x_pinned[:batch].to(device, non_blocking=True), y_pinned[:batch].to(device, non_blocking=True))
        for s in starts[1:]:
            x, y = nxt
            nxt = (x_pinned[s:s + batch].to(device, non_blocking=True),
                   y_pinned[s:s + batch].to(device, non_blocking=True))
            step(x, y)
    return [{"loop": "pageable, blocking copies", "batch": batch, "ms_per_step": best_ms(pageable, device, 1) / steps},
            {"loop": "pinned, non_blocking, next batch copied ahead", "batch": batch,
             "ms_per_step": best_ms(pinned_prefetch, device, 1) / steps}]


def measure_all(device) -> dict:
    """Every section's measurement on ``device`` (a CUDA GPU), keyed as ``SECTIONS``."""
    device = _cuda(device)
    return {"copy_rates": copy_rates(device),
            "copy_return_times": copy_return_times(device),
            "matmul_timings": [matmul_timings(device)],
            "sync_point_cost": sync_point_cost(device),
            "throughput_gpu": throughput(device),
            "throughput_cpu": throughput(torch.device("cpu"), batch_sizes=(16, 64, 256, 1024, 4096)),
            "allocator": allocator_counters(device),
            "pinned_loop": pinned_loop(device)}


SECTIONS = ("copy_rates", "copy_return_times", "matmul_timings", "sync_point_cost", "throughput_gpu",
            "throughput_cpu", "allocator", "pinned_loop")


def show_recorded(section: str, run: dict | None = None, folder: Path = RESULTS) -> list[dict] | None:
    """Print one section of the newest recorded run (machine and date named); None if none is recorded."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}; the recorded sections are {', '.join(SECTIONS)}")
    run = run or latest_run(folder)
    if run is None:
        print(no_record_note(section))
        return None
    print(f"No CUDA GPU here. Recorded by benchmarks/bench_lab02_gpu.py on {run['machine']}, {run['date']} "
          f"({run.get('file', 'results file')}):")
    print_table(run[section])
    return run[section]


def recorded_runs(folder: Path = RESULTS) -> list[dict]:
    """The recorded GPU runs of lab 02, oldest first (by date), each ``{"machine", "date", ...}``."""
    runs = []
    for path in sorted(Path(folder).glob(PATTERN)):
        run = json.loads(path.read_text())
        run["file"] = path.name
        runs.append(run)
    return sorted(runs, key=lambda run: run.get("date", ""))


def latest_run(folder: Path = RESULTS) -> dict | None:
    """The newest recorded run, or None when none has been recorded."""
    runs = recorded_runs(folder)
    return runs[-1] if runs else None


def no_record_note(section: str) -> str:
    return (f"No CUDA GPU here, and no GPU run of lab 02 recorded yet ({section}). On a GPU machine, "
            f"`python benchmarks/bench_lab02_gpu.py` records one in benchmarks/results/, and this cell "
            f"then shows it.")


def print_table(rows: list[dict]) -> None:
    """Print rows of numbers as an aligned table (floats with 3 significant digits)."""
    if not rows:
        return
    keys = list(rows[0])
    cells = [[f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))

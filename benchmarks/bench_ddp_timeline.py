"""One training step of lab 05's MLP drawn as a timeline, BucketedDDP against FlatDDP: the recording
lab 05's section 6 needs from a GPU node (on CPUs the lab draws its own).

One process per GPU with nccl (``--cpu``: gloo ranks on the CPU, to try the script anywhere). Each
rank wraps ``MLP(n_layers=8, d_in=1024, d_hidden=1024, n_classes=10)`` (lab 05's full-mode model) in
``utils.ddp.BucketedDDP(bucket_cap_mb)`` and then in ``FlatDDP``, runs ``--warmup`` steps, then records
one step with a ``utils.ddp.Timeline(device)``: on CUDA, events on the streams (NCCL completes a
collective's future when it is queued, so host clocks would end every all-reduce at its launch).
Rank 0's spans, in seconds from the timeline's start, go to the JSON file with the machine, the
versions and the date. Nothing here is typed in: a GPU machine writes the file.

    .venv/bin/python benchmarks/bench_ddp_timeline.py [--world-size N] [--bucket-cap-mb 4]
        [--warmup 5] [--cpu] [--quick] [--json benchmarks/results/ddp_timeline_<machine>.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine as machine_info  # noqa: E402
from spawn import run_world  # noqa: E402
from utils import ddp  # noqa: E402
from utils.models import MLP  # noqa: E402

FULL = dict(n_layers=8, d_in=1024, d_hidden=1024, n_classes=10)
QUICK = dict(n_layers=3, d_in=64, d_hidden=64, n_classes=10)


def _record(wrapped, x, y, device, warmup: int):
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    for step in range(warmup + 1):
        timeline = ddp.Timeline(device) if step == warmup else None
        wrapped.timeline = timeline
        dist.barrier()
        with timeline.span("compute", "backward") if timeline else _nothing():
            optimizer.zero_grad()
            loss = F.cross_entropy(wrapped(x), y)
            loss.backward()
        with timeline.span("compute", "wait") if timeline else _nothing():
            wrapped.finish_gradient_synchronization()
        with timeline.span("compute", "step") if timeline else _nothing():
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    time.sleep(0.05)                                     # on CPUs: the last completion callbacks
    return [list(span) for span in timeline.spans]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def worker(rank, world_size, port, settings, results):
    try:
        backend = "gloo" if settings["cpu"] else "nccl"
        device = torch.device("cpu") if settings["cpu"] else torch.device("cuda", rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        shape = settings["shape"]
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(64, shape["d_in"], generator=g).to(device)
        y = torch.randint(0, shape["n_classes"], (64,), generator=g).to(device)
        spans = {}
        for name, wrap in (("bucketed", lambda m: ddp.BucketedDDP(m, bucket_cap_mb=settings["bucket_cap_mb"])),
                           ("flat", ddp.FlatDDP)):
            torch.manual_seed(0)
            wrapped = wrap(MLP(**shape).to(device))
            spans[name] = _record(wrapped, x, y, device, settings["warmup"])
            buckets = len(wrapped.buckets) if name == "bucketed" else 1
            spans[f"{name} buckets"] = buckets
        dist.destroy_process_group()
        results.put(("ok", rank, spans))
    except Exception:
        results.put(("error", rank, traceback.format_exc()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=None, help="default: the number of GPUs (2 with --cpu)")
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU instead of nccl on GPUs")
    parser.add_argument("--quick", action="store_true", help="a tiny model, one warm-up step (to try the script)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    world_size = args.world_size or (2 if args.cpu else gpus)
    if not args.cpu and (gpus < 2 or world_size > gpus):
        raise SystemExit(f"nccl needs one GPU per rank and at least 2 ranks: {gpus} GPU(s) here, world size "
                         f"{world_size}. Use --cpu to try the script on CPU ranks.")
    settings = dict(cpu=args.cpu, shape=QUICK if args.quick else FULL, bucket_cap_mb=args.bucket_cap_mb,
                    warmup=1 if args.quick else args.warmup)
    report = run_world(worker, world_size, (settings,), deadline_s=600)
    info = machine_info.describe()
    out = dict(machine=machine_info.one_line(info), machine_details=info,
               date=datetime.date.today().isoformat(), backend="gloo" if args.cpu else "nccl",
               world_size=world_size, model=settings["shape"], bucket_cap_mb=args.bucket_cap_mb,
               warmup=settings["warmup"], clock="host perf_counter" if args.cpu else "CUDA events",
               spans_rank0={name: report[name] for name in ("bucketed", "flat")},
               buckets=report["bucketed buckets"])
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text if not args.json else f"wrote {args.json}")


if __name__ == "__main__":
    main()

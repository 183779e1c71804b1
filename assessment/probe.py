"""Runs a submission's functions on freshly spawned ranks and saves what each rank produced.

    python -m assessment.probe LEARNER_CODE.py OUT_DIR SEED SECONDS_PER_WORLD [WORLD ...]

The grader starts this inside the sandbox (``assessment.sandbox``). For each world size, every rank
starts a gloo process group, defines the names the assessment's engines have (``rank``, ``device``,
``torch``, ``DistributedSampler``, ...), executes the learner's code cells, then runs each
criterion's ``rank_*`` half, saving the results so far to OUT_DIR/world{W}_rank{R}.pt after each
one (a criterion that hangs costs only itself and those after it). The verdicts are
taken later, in the grader's own process (``assessment.criteria.judge_*``).
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from pathlib import Path

GROUP_TIMEOUT_S = 30     # a rank waiting for a collective the others never reach gives up after this


def engine_names(rank: int, world: int) -> dict:
    """The names the notebook's engine set-up cell defines, less the data (each criterion brings its own)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from assessment import criteria, settings
    from utils import data, models
    return {"__name__": "__main__", "criteria": criteria, "settings": settings, "data": data, "models": models,
            "torch": torch, "dist": dist, "nn": nn, "F": F, "DDP": DDP,
            "DataLoader": DataLoader, "DistributedSampler": DistributedSampler, "TensorDataset": TensorDataset,
            "rank": rank, "world_size": world, "device": torch.device("cpu"),
            "BASE_LR": settings.BASE_LR, "BASE_BATCH": settings.BASE_BATCH}


def _error(error: BaseException) -> dict:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == "<your code>"]
    where = f" (line {frames[-1].lineno} of your code cells)" if frames else ""
    return {"error": f"your code raised {type(error).__name__}: {error}{where}"}


def _rank(rank: int, world: int, port: int, code: str, out: str, seed: int) -> None:
    import torch
    import torch.distributed as dist

    from assessment import criteria

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    results = {}
    ns = engine_names(rank, world)
    try:
        exec(compile(code, "<your code>", "exec"), ns)
    except BaseException as error:  # SystemExit included: a cell that exits must not end the probe silently
        results = {name: _error(error) for name in ("sharding", "ddp_step", "metrics", "training_job")}
    model_path = str(Path(out) / f"job_world{world}.pt")
    runs = {"sharding": lambda: criteria.rank_sharding(ns, 4 * world, seed),
            "ddp_step": lambda: criteria.rank_ddp_step(ns, seed),
            "metrics": lambda: criteria.rank_metrics(ns, seed),
            "training_job": lambda: criteria.rank_job(ns, seed, model_path)}
    for name, run in runs.items():
        if name in results:
            continue
        try:
            results[name] = run()
        except BaseException as error:
            results[name] = _error(error)
        torch.save(results, Path(out) / f"world{world}_rank{rank}.pt")
        try:
            dist.barrier()  # ranks start each criterion together; a lost rank shows up here
        except Exception:
            break
    torch.save(results, Path(out) / f"world{world}_rank{rank}.pt")
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)  # learner threads or hooks must not keep a rank alive


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, code: str, out: Path, seed: int, seconds: float) -> None:
    context = mp.get_context("spawn")
    port = _free_port()
    ranks = [context.Process(target=_rank, args=(r, world, port, code, str(out), seed)) for r in range(world)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + seconds
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    code_file, out, seed, seconds = Path(argv[0]), Path(argv[1]), int(argv[2]), float(argv[3])
    out.mkdir(parents=True, exist_ok=True)
    code = code_file.read_text()
    for world in [int(w) for w in argv[4:]] or [2, 3]:
        run_world(world, code, out, seed, seconds)


if __name__ == "__main__":
    main()

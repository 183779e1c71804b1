"""Runs a submission's functions on freshly spawned ranks and saves what each rank produced.

    python -m assessment.probe LEARNER_CODE.py OUT_DIR SEED_FILE SECONDS_PER_WORLD [WORLD ...]

The grader starts this inside the sandbox (``assessment.sandbox``). The grader's secret is read from
SEED_FILE, which is deleted before any learner code runs (it is in no command line, environment or
file a submission could read). This process then makes itself non-dumpable (no other process of the
sandbox's user may read its memory) and hands each rank only its own seed
(``criteria.rank_seed``); each rank makes itself non-dumpable too before the process group forms, so
by the time any learner code runs, no process it can read holds another rank's data or the secret.
For each world size, every rank starts a gloo process group,
defines the names the assessment's engines have (``rank``, ``device``, ``torch``,
``DistributedSampler``, ...), executes the learner's code cells, then runs each criterion's
``rank_*`` half, saving the results so far to OUT_DIR/world{W}_rank{R}.pt after each one (a
criterion that hangs costs only itself and those after it). The verdicts are taken later, in the
grader's own process (``assessment.verdicts``, which is not in the sandbox).

The learner's code runs in the rank's own process, so it could replace the functions that produce
the results. The rank binds its ``rank_*`` functions before that code runs, and ``Guard`` compares
the grader's and torch's modules and classes with a snapshot taken before it: a submission that
replaced any of them fails every criterion with a message that names what it replaced. Code that
reads the probe's frames or memory is not stopped here; the accuracy criterion does not depend on
the probe at all (the grader evaluates the saved model in its own process).
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
CRITERIA = ("sharding", "ddp_step", "metrics", "training_job")

# What learner code must leave as it found it: the grader's modules, and the torch modules and classes
# whose functions produce the probe's results (collectives, DDP, optimizers, the loader, saving).
GUARDED_MODULES = ("assessment.criteria", "assessment.probe", "assessment.settings", "utils.models", "builtins",
                   "torch", "torch.distributed", "torch.distributed.distributed_c10d", "torch.nn.functional",
                   "torch.nn.parallel.distributed", "torch.optim", "torch.optim.sgd", "torch.optim.optimizer",
                   "torch.nn.modules.module", "torch.serialization", "torch.utils.data",
                   "torch.utils.data.distributed", "torch.utils.data.dataloader")


class Guard:
    """A snapshot of the guarded modules' and classes' attributes; ``replaced()`` names those changed since."""

    def __init__(self):
        import torch
        import torch._dynamo  # noqa: F401  (importing it wraps torch.manual_seed and others: do it first)
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        from assessment import criteria
        from utils.models import CNN
        owners = {name: vars(sys.modules[name]) for name in GUARDED_MODULES if name in sys.modules}
        for cls in (torch.Tensor, torch.nn.Module, torch.optim.Optimizer, torch.optim.SGD, DistributedDataParallel,
                    DataLoader, DistributedSampler, CNN, criteria.IndexSet, criteria.LoggedImages):
            owners[f"{cls.__module__}.{cls.__qualname__}"] = vars(cls)
        self.owners = owners
        # torch wraps an optimizer class's step() the first time one is built: let that happen first.
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()
        # Functions and classes only (flags and counters change as torch runs); values, not ids: a
        # replaced object that was freed could hand its id to the replacement.
        self.snapshot = {(owner, key): value for owner, space in owners.items()
                         for key, value in list(space.items()) if not key.startswith("__") and callable(value)}

    def replaced(self) -> list[str]:
        return [f"{owner}.{key}" for (owner, key), value in self.snapshot.items()
                if self.owners[owner].get(key, _MISSING) is not value]


_MISSING = object()


def _tampered(names: list[str]) -> dict:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return {"error": f"your code replaced {shown}: the grader's and torch's own functions must stay as they are, "
                     f"so every criterion fails"}


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


def _not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same user can no longer read this one's memory or fds."""
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)


def _rank(rank: int, world: int, port: int, code: str, out: str, seeds: dict) -> None:
    """``seeds``: this rank's own seed and the shared one, never another rank's."""
    _not_dumpable()
    import functools

    import torch
    import torch.distributed as dist

    from assessment import criteria

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    ns = engine_names(rank, world)
    checkpoint_dir = str(Path(out) / f"job_world{world}_rank{rank}")   # each rank its own: see criteria.rank_job
    # Bound now, before the learner's code runs: replacing criteria.rank_* later changes nothing here.
    mine, shared = seeds["rank"], seeds["shared"]
    runs = {"sharding": functools.partial(criteria.rank_sharding, ns, 4 * world, shared),
            "ddp_step": functools.partial(criteria.rank_ddp_step, ns, mine),
            "metrics": functools.partial(criteria.rank_metrics, ns, mine),
            "training_job": functools.partial(criteria.rank_job, ns, shared, checkpoint_dir)}
    del seeds, mine
    barrier, result_file = dist.barrier, Path(out) / f"world{world}_rank{rank}.pt"
    save = functools.partial(_save, torch.save)
    guard = Guard()
    results = {}
    try:
        exec(compile(code, "<your code>", "exec"), ns)
    except BaseException as error:  # SystemExit included: a cell that exits must not end the probe silently
        results = {name: _error(error) for name in CRITERIA}
    for name, run in runs.items():
        if name not in results:
            try:
                results[name] = run()
            except BaseException as error:
                results[name] = _error(error)
        if replaced := guard.replaced():
            results = {name: _tampered(replaced) for name in CRITERIA}
            break
        save(results, result_file, tries=1)
        try:
            barrier()  # ranks start each criterion together; a lost rank shows up here
        except Exception:
            break
    save(results, result_file, tries=20)
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)  # learner threads or hooks must not keep a rank alive


def _save(torch_save, results: dict, path: Path, tries: int) -> None:
    """Write the results whole (a temporary file renamed), retrying while the disk is full: learner code
    that fills its own disk for a moment must not leave a truncated file (that is judged as a crash)."""
    for attempt in range(tries):
        try:
            torch_save(results, path.with_suffix(".part"))
            os.replace(path.with_suffix(".part"), path)
            return
        except OSError:
            if attempt + 1 < tries:
                time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, code: str, out: Path, secret: int, seconds: float) -> None:
    from assessment.criteria import SHARED, rank_seed
    context = mp.get_context("spawn")
    port = _free_port()
    shared = rank_seed(secret, world, SHARED)
    ranks = [context.Process(target=_rank, args=(r, world, port, code, str(out),
                                                 {"rank": rank_seed(secret, world, r), "shared": shared}))
             for r in range(world)]
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
    code_file, out, seed_file, seconds = Path(argv[0]), Path(argv[1]), Path(argv[2]), float(argv[3])
    seed = int(seed_file.read_text())
    seed_file.unlink()  # gone before the ranks start: no learner code can read it
    _not_dumpable()     # nor this process's memory
    out.mkdir(parents=True, exist_ok=True)
    code = code_file.read_text()
    for world in [int(w) for w in argv[4:]] or [2, 3]:
        run_world(world, code, out, seed, seconds)


if __name__ == "__main__":
    main()

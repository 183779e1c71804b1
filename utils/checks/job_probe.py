"""Run a learner's torchrun script and record what each rank did, for the check of lab 06's exercise 6.1.

    torchrun --standalone --nproc-per-node 2 -m utils.checks.job_probe train_ddp.py --epochs 2 ...

Each process runs the script as ``__main__`` (exactly as ``torchrun train_ddp.py`` would) after
wrapping a few torch functions so that they also write down their calls: ``init_process_group``
(its explicit ``rank`` and ``world_size``, if any), ``DistributedSampler`` (its replicas, rank, seed and
``set_epoch`` calls), ``DistributedDataParallel``, ``torch.save``, ``destroy_process_group``, and the
lines the rank printed. The record goes to ``$COURSE_PROBE_DIR/rank<RANK>.json`` when the script ends,
however it ends. ``COURSE_PROBE_FAIL_AT=N`` makes the N-th DDP forward raise, to see whether the
script still tears its process group down when training fails.

Behaviour is observed, not the source text: a learner may write the script any way they like.
"""
from __future__ import annotations

import inspect
import io
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

INJECTED = "error injected by the check into the 3rd training step"


class _Tee(io.TextIOBase):
    """Passes writes on to the real stream and keeps the text, to count what this rank printed."""

    def __init__(self, stream, kept: list[str]):
        self.stream, self.kept = stream, kept

    def write(self, text):
        self.kept.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def _record_calls(record: dict) -> None:
    init, destroy, save = dist.init_process_group, dist.destroy_process_group, torch.save
    sampler_init, set_epoch = DistributedSampler.__init__, DistributedSampler.set_epoch
    ddp_init, ddp_forward = DistributedDataParallel.__init__, DistributedDataParallel.forward
    fail_at = int(os.environ.get("COURSE_PROBE_FAIL_AT", "0"))

    def init_process_group(*args, **kwargs):
        given = inspect.signature(init).bind(*args, **kwargs).arguments
        record["init"] = {key: given.get(key) for key in ("rank", "world_size")}
        result = init(*args, **kwargs)
        record["init"]["backend"] = str(dist.get_backend())
        return result

    def destroy_process_group(*args, **kwargs):
        record["destroyed"] = True
        return destroy(*args, **kwargs)

    def saved(obj, f, *args, **kwargs):
        record["saves"].append(str(f))
        return save(obj, f, *args, **kwargs)

    def distributed_sampler(self, *args, **kwargs):
        given = inspect.signature(sampler_init).bind(self, *args, **kwargs).arguments
        # What the script passed, recorded before the sampler can refuse it (a rank >= num_replicas raises).
        entry = {"given": {key: given.get(key) for key in ("num_replicas", "rank")},
                 "size": len(given["dataset"]), "epochs": []}
        record["samplers"].append(entry)
        self._probe_index = len(record["samplers"]) - 1
        sampler_init(self, *args, **kwargs)
        entry.update(seed=self.seed, shuffle=self.shuffle, drop_last=self.drop_last)

    def sampler_set_epoch(self, epoch):
        if hasattr(self, "_probe_index"):
            record["samplers"][self._probe_index]["epochs"].append(int(epoch))
        return set_epoch(self, epoch)

    def ddp(self, *args, **kwargs):
        record["ddp"] += 1
        return ddp_init(self, *args, **kwargs)

    def forward(self, *args, **kwargs):
        record["forwards"] += 1
        if fail_at and record["forwards"] == fail_at:
            raise RuntimeError(INJECTED)
        return ddp_forward(self, *args, **kwargs)

    dist.init_process_group, dist.destroy_process_group, torch.save = init_process_group, destroy_process_group, saved
    DistributedSampler.__init__, DistributedSampler.set_epoch = distributed_sampler, sampler_set_epoch
    DistributedDataParallel.__init__, DistributedDataParallel.forward = ddp, forward


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: torchrun ... -m utils.checks.job_probe SCRIPT [ARGS...]")
    script = argv[0]
    out = Path(os.environ.get("COURSE_PROBE_DIR", "."))
    rank = os.environ.get("RANK", "?")
    record = {"rank": rank, "world_size": os.environ.get("WORLD_SIZE"), "init": None, "destroyed": False,
              "samplers": [], "ddp": 0, "forwards": 0, "saves": [], "error": None, "printed": ""}
    printed: list[str] = []
    _record_calls(record)
    sys.stdout = _Tee(sys.stdout, printed)
    sys.argv = list(argv)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            record["error"] = f"SystemExit: {stop.code}"
        raise
    except BaseException as error:
        record["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        record["printed"] = "".join(printed)[-20000:]
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1:])

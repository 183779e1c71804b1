"""Modules of an earlier release of the course, and where their code is now.

A learner's workspace keeps the notebooks it was given (``make lab`` never overwrites them), so a notebook
from an earlier release can meet this library. Importing a module that has moved then stops with a
message that names its new home and what to do, instead of Python's bare "No module named ...".
"""
from __future__ import annotations

import importlib.abc
import sys

# The release before the layout by audience: one module per lab (utils.labs), the job check behind
# utils.checks.job, the course's tools in tooling/.
MOVED = {
    "utils.single_gpu": ["utils.labs.lab02"],
    "utils.collectives_report": ["utils.labs.lab03"],
    "utils.ddp_costs": ["utils.labs.lab04"],
    "utils.equivalence": ["utils.labs.lab05"],
    "utils.scaling": ["utils.labs.lab06", "utils.ddp_timing"],
    "utils.loaders": ["utils.labs.lab06"],
    "utils.gpu_speed": ["utils.labs.lab06", "utils.labs.lab02"],
    "utils.batch_runs": ["utils.labs.lab07"],
    "utils.batch_size": ["utils.labs.lab07"],
    "utils.landscape": ["utils.labs.lab07"],
    "utils.checks.job_check": ["utils.checks.job"],
    "utils.checks.job_probe": ["utils.checks.job"],
    "utils.release": ["tooling.release"],
    "utils.course": ["tooling.course"],
}


def message(old: str) -> str:
    homes = " and ".join(MOVED[old])
    return (f"{old} is not in this release of the course: its code is now in {homes}. This notebook comes from "
            f"an earlier release. Keep your copy under another name (your answers stay in it), run `make lab` to "
            f"get this release's notebook beside it, and carry your answers over.")


class MovedModules(importlib.abc.MetaPathFinder):
    """Consulted after the usual finders, so only for a module that no longer exists."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            raise ModuleNotFoundError(message(fullname), name=fullname)
        return None


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())


def package_getattr(package: str, name: str):
    """The ``__getattr__`` of a package: ``from utils import scaling`` reads the attribute before it looks
    for a submodule, so the message must come from here too."""
    if f"{package}.{name}" in MOVED:
        raise ImportError(message(f"{package}.{name}"), name=f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

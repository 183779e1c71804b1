"""utils.moved: a module of an earlier release names its new home, and the table stays true."""
from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from utils import moved


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_every_new_home_exists_and_the_old_name_is_gone(old):
    for home in moved.MOVED[old]:
        importlib.import_module(home)
    parent, _, leaf = old.rpartition(".")
    package = importlib.import_module(parent)
    spec = importlib.machinery.PathFinder.find_spec(old, package.__path__)
    assert spec is None, f"{old} exists again: take it out of utils.moved.MOVED"


@pytest.mark.parametrize("statement", ["import utils.scaling", "from utils.scaling import ddp_bucket_bytes",
                                       "from utils import config, single_gpu", "from utils.checks import job_check",
                                       "import utils.release"])
def test_each_way_of_importing_a_moved_module_gets_the_message(statement):
    done = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "is not in this release of the course: its code is now in" in last and "make lab" in last, last


def test_a_name_that_never_existed_keeps_pythons_own_error():
    import utils

    with pytest.raises(AttributeError):
        utils.no_such_module
    with pytest.raises(ModuleNotFoundError, match="No module named 'utils.no_such_module'"):
        importlib.import_module("utils.no_such_module")

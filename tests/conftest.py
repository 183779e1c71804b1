"""Generic fixtures shared by the unit tests, and a home of the suite's own.

The suite runs with HOME (and so IPython's, Jupyter's and matplotlib's folders) in a temporary
folder, so that nothing it starts (kernels, clusters, engines over ssh, Chromium) writes into the
user's home; the user's npm and git settings are still read. At the end the suite fails if the real
home's top level or its IPython and Jupyter folders changed.
"""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# tests/library/ holds the library's own tests and their helper (spawn_ranks), which the learner bundle ships;
# the course's other tests import that helper too, whichever file pytest collects first.
sys.path.insert(0, str(Path(__file__).resolve().parent / "library"))

REAL_HOME = Path(os.path.expanduser("~")).resolve()
WATCHED = (".ipython", ".jupyter", ".local/share/jupyter")


def _snapshot(home: Path) -> dict:
    """The home's top-level names and every file (size, mtime) under its IPython and Jupyter folders."""
    seen = {"top level": sorted(p.name for p in home.iterdir())} if home.is_dir() else {}
    for folder in WATCHED:
        for path in sorted((home / folder).rglob("*")) if (home / folder).is_dir() else []:
            if path.is_file():
                stat = path.stat()
                seen[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return seen


_BEFORE = _snapshot(REAL_HOME)
SUITE_HOME = Path(tempfile.mkdtemp(prefix="course-tests-home-"))
atexit.register(shutil.rmtree, SUITE_HOME, ignore_errors=True)
for _name, _real in (("npm_config_userconfig", REAL_HOME / ".npmrc"), ("GIT_CONFIG_GLOBAL", REAL_HOME / ".gitconfig")):
    if _real.is_file():
        os.environ.setdefault(_name, str(_real))  # read, never written
for _name in ("IPYTHONDIR", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "MPLCONFIGDIR",
              "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
    os.environ.pop(_name, None)
os.environ["HOME"] = str(SUITE_HOME)

import matplotlib  # noqa: E402  (after HOME: matplotlib finds its config folder on import)

matplotlib.use("Agg")  # no display in tests; must run before pyplot is imported

import pytest  # noqa: E402


DURATIONS = Path(__file__).resolve().parent.parent / "build" / "test-durations.json"
_SECONDS: dict = {}   # test id -> seconds of its set-up, call and teardown


def pytest_runtest_logreport(report):
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def _write_durations(exitstatus) -> None:
    """The run's 20 slowest tests and every test file's total, with the machine and its load, for a maintainer
    trimming the suite (every run rewrites it; MAINTAINING.md says how to read it)."""
    import json
    import time

    slowest = sorted(_SECONDS.items(), key=lambda item: -item[1])[:20]
    by_file: dict = {}
    for name, seconds in _SECONDS.items():
        by_file[name.split("::")[0]] = by_file.get(name.split("::")[0], 0.0) + seconds
    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    DURATIONS.write_text(json.dumps({
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "exit_status": int(exitstatus), "tests": len(_SECONDS),
        "total_s": round(sum(_SECONDS.values()), 1), "cores": os.cpu_count(),
        "load_average": [round(v, 2) for v in os.getloadavg()], "ci": os.environ.get("CI") == "true",
        "slowest_s": [[name, round(seconds, 1)] for name, seconds in slowest],
        "files_s": [[name, round(seconds, 1)] for name, seconds in sorted(by_file.items(), key=lambda item: -item[1])]},
        indent=1) + "\n")


def pytest_sessionfinish(session, exitstatus):
    if _SECONDS and not hasattr(session.config, "workerinput"):
        _write_durations(exitstatus)
    after = _snapshot(REAL_HOME)
    changed = sorted(key for key in set(_BEFORE) | set(after) if _BEFORE.get(key) != after.get(key))
    if changed:
        detail = "; ".join(f"{key}: {_BEFORE.get(key)} -> {after.get(key)}" if key == "top level" else key
                           for key in changed[:10])
        session.config.get_terminal_writer().line(
            f"FAILED: the suite wrote into the real home {REAL_HOME}: {detail}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def close_figures():
    """Close every matplotlib figure a test opened."""
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


@pytest.fixture
def course_env(monkeypatch):
    """Clear the COURSE_* settings so a test starts from the defaults."""
    for name in ("COURSE_QUICK", "COURSE_DEVICE", "COURSE_DATA_DIR", "COURSE_DATASET", "COURSE_DOWNLOAD", "COURSE_CORES",
                 "COURSE_VERDICTS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: tiny tensors run faster on one thread than on two that fight
    other jobs for a 2-core machine (the noise-scale test was 40x slower with two)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Generic fixtures shared by the unit tests."""
import matplotlib

matplotlib.use("Agg")  # no display in tests; must run before pyplot is imported

import pytest


@pytest.fixture
def close_figures():
    """Close every matplotlib figure a test opened."""
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


@pytest.fixture
def course_env(monkeypatch):
    """Clear the COURSE_* settings so a test starts from the defaults."""
    for name in ("COURSE_QUICK", "COURSE_DEVICE", "COURSE_DATA_DIR", "COURSE_DATASET", "COURSE_DOWNLOAD"):
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

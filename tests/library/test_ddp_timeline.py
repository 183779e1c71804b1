"""utils.ddp.Timeline: host clocks on the CPU, CUDA events on a GPU (where NCCL completes a
collective's future when it is queued, so host clocks would end each all-reduce at its launch)."""
from __future__ import annotations

import time

import pytest
import torch

from utils import ddp


class _Work:
    """An async collective's handle, whose future completes when the test says so."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future

    def wait(self):
        self.future.wait()


def test_cpu_spans_are_host_time_and_a_collective_ends_when_its_future_completes():
    timeline = ddp.Timeline()
    with timeline.span("compute", "backward"):
        time.sleep(0.01)
    work = _Work()
    timeline.add_work("bucket 0", work)
    assert [lane for lane, *_ in timeline.spans] == ["compute"]        # still in flight: not drawn yet
    time.sleep(0.02)
    work.future.set_result(None)
    (_, _, b0, b1), (lane, label, c0, c1) = timeline.spans
    assert (lane, label) == ("bucket 0", "all_reduce")
    assert 0 <= b0 < b1 <= c0 and c1 - c0 >= 0.015                    # the span lasts until completion


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the CUDA-event path")
def test_cuda_spans_end_when_the_device_is_done():
    device = torch.device("cuda")
    timeline = ddp.Timeline(device)
    a = torch.randn(4096, 4096, device=device)
    with timeline.span("compute", "matmul"):
        for _ in range(5):
            a = a @ a / 4096
    (_, _, start, end), = timeline.spans
    assert end > start                                                 # device time, read after a synchronise

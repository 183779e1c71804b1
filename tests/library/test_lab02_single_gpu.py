"""utils.labs.lab02: lab 02's GPU measurements, and the recorded runs shown where there is no GPU."""
import json

import pytest
import torch

from utils.labs import lab02


def _record(date, machine="GPU box"):
    return {"machine": machine, "date": date,
            **{section: [{"batch": 16, "ms_per_step": 1.25}] for section in lab02.SECTIONS}}


def test_recorded_runs_newest_last_and_shown_with_the_machine(tmp_path, capsys):
    assert lab02.latest_run(tmp_path) is None
    assert lab02.show_recorded("allocator", folder=tmp_path) is None
    assert "no GPU run of lab 02 recorded yet (allocator)" in capsys.readouterr().out
    (tmp_path / "lab02_gpu_b.json").write_text(json.dumps(_record("2026-01-02", "new box")))
    (tmp_path / "lab02_gpu_a.json").write_text(json.dumps(_record("2026-01-01", "old box")))
    (tmp_path / "other.json").write_text("{}")
    assert [run["machine"] for run in lab02.recorded_runs(tmp_path)] == ["old box", "new box"]
    rows = lab02.show_recorded("pinned_loop", folder=tmp_path)
    out = capsys.readouterr().out
    assert rows == [{"batch": 16, "ms_per_step": 1.25}]
    assert "Recorded by benchmarks/bench_lab02_gpu.py on new box, 2026-01-02 (lab02_gpu_b.json)" in out
    assert "batch  ms_per_step" in out and "1.25" in out
    with pytest.raises(ValueError, match="unknown section 'nope'"):
        lab02.show_recorded("nope", folder=tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without a GPU")
@pytest.mark.parametrize("measure", [lab02.copy_rates, lab02.copy_return_times, lab02.matmul_timings,
                                     lab02.allocator_counters, lab02.pinned_loop, lab02.measure_all])
def test_gpu_measurements_say_they_need_a_gpu(measure):
    with pytest.raises(ValueError, match="needs a CUDA GPU, got device device\\(type='cpu'\\)"):
        measure(torch.device("cpu"))


def test_measurements_that_also_run_on_the_cpu():
    rows = lab02.sync_point_cost("cpu", batch_sizes=(4,), steps=1)
    assert rows[0]["batch"] == 4 and rows[0]["on_device_ms"] > 0 and rows[0]["item_every_step_ms"] > 0
    rows = lab02.throughput("cpu", batch_sizes=(4, 8), steps=1)
    assert [row["batch"] for row in rows] == [4, 8]
    assert all(row["samples_per_s"] == pytest.approx(row["batch"] / row["ms_per_step"] * 1e3) for row in rows)

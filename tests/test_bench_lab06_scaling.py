"""Lab 06's recorded-scaling benchmark runs end to end, tiny, and writes what the lab's recorded-runs cell
and deck 06's figure read (its numbers go to benchmarks/results/, never into a test)."""
import json
import subprocess
import sys

import pytest

from notebook_runner import ROOT
from utils import config
from utils.labs import lab06


@pytest.mark.skipif(config.real_cores() < 2, reason="two workers need two cores")
def test_bench_lab06_scaling_tiny(tmp_path):
    out = tmp_path / "lab06_scaling_test.json"
    result = subprocess.run([sys.executable, "benchmarks/bench_lab06_scaling.py", "--quick", "--workers", "2", "1",
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    assert record["complete"] and record["machine"]["cores"] >= 2 and record["settings"]["global_batch"] == 64
    assert [r["workers"] for r in record["runs"]] == [1, 2]
    one, two = record["runs"]
    assert one["alpha"] is None and two["alpha"] >= 0 and two["beta"] >= 0 and len(two["load_average"]) == 3
    for name in lab06.MODELS:
        # k = 1: strong and weak scaling are the same step, timed once
        assert one["models"][name]["weak"]["same_run_as"] == "strong"
        assert one["models"][name]["weak"]["ddp_steps"] == one["models"][name]["strong"]["ddp_steps"]
        assert two["models"][name]["strong"]["per_rank"] == 32 and two["models"][name]["weak"]["per_rank"] == 64
        assert len(two["models"][name]["weak"]["ddp_steps"]) == record["settings"]["repeats"]
    record["file"] = out.name
    ks, throughput, predicted, _ = lab06.recorded_curves(record)
    assert ks == [1, 2] and all(v > 0 for rates in (*throughput.values(), *predicted.values()) for v in rates)


def test_bench_lab06_scaling_refuses_more_workers_than_cores(tmp_path):
    result = subprocess.run([sys.executable, "benchmarks/bench_lab06_scaling.py", "--workers", "1",
                             str(config.real_cores() + 1), "--out", str(tmp_path / "x.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "would take turns" in result.stderr and not (tmp_path / "x.json").exists()


def _tiny_record(cores):
    def entry(per_rank, ddp, compute):
        return dict(per_rank=per_rank, ddp_steps=ddp, compute_steps=compute)

    models = lambda k: {name: dict(grad_bytes=[4000, 400], strong=entry(64 // k, [10.0 / k + 1] * 3, [9.0 / k] * 3),
                                   weak=entry(64, [11.0] * 3, [9.0] * 3)) for name in lab06.MODELS}
    return dict(benchmark="lab06_scaling", machine=dict(cpu=f"cpu{cores}", cores=cores, torch="t"), date="2026-11-28",
                complete=True, runs=[dict(workers=k, alpha=1e-5 if k > 1 else None, beta=1e-9 if k > 1 else None,
                                          load_average=[0.2, 0.1, 0.1], models=models(k)) for k in (1, 2)])


def test_deck_figure_is_drawn_from_the_recording_with_most_cores_and_indexed_with_its_machine(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lab_figures
    import nbformat

    for cores in (2, 16):
        (tmp_path / f"lab06_scaling_{cores}core.json").write_text(json.dumps(_tiny_record(cores)))
    written = lab_figures.draw_lab06_scaling(results=tmp_path)
    assert written == tmp_path / "figures" / "lab06_scaling.png" and written.read_bytes()[:4] == b"\x89PNG"
    entry = json.loads((tmp_path / "lab_figures.json").read_text())["lab06_scaling.png"]
    assert entry["figure"] == "scaling" and entry["mode"] == "recorded: lab06_scaling_16core.json"
    assert entry["machine"].startswith("cpu16, 16 cores") and "load average 0.2" in entry["machine"]
    assert "predicted" in entry["printed"]
    # the lab's cell that draws it is marked as the deck's figure, and a full-mode run of the lab leaves it alone
    nb = nbformat.read(ROOT / "labs" / "06_realistic_model.ipynb", as_version=4)
    cell = lab_figures.marked(nb)["scaling"]
    assert cell.metadata["course"]["recorded_by"] == "benchmarks/bench_lab06_scaling.py"
    assert "lab.plot_recorded" in cell.source
    for drawn in lab_figures.marked(nb).values():
        drawn.outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    before = written.read_bytes()
    lab_figures.record(nb, "06_realistic_model.ipynb", "another machine", "d", tmp_path)
    assert written.read_bytes() == before
    assert json.loads((tmp_path / "lab_figures.json").read_text())["lab06_scaling.png"]["machine"] == entry["machine"]

"""The numbers the decks quote, read from the recorded runs in benchmarks/results/.

A deck writes `{{name}}` where a recorded number belongs (slide or notes); the build puts the value in,
and refuses a name it does not know. So no number that a results file holds is typed into a deck.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


VALUE = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")


def fill_values(text: str, known: dict, name: str) -> str:
    """The deck with every `{{name}}` replaced by its recorded value (slides/values.py)."""
    unknown = sorted(set(VALUE.findall(text)) - set(known))
    if unknown:
        raise SystemExit(f"{name}: no recorded value named {', '.join(unknown)} (slides/values.py lists them)")
    return VALUE.sub(lambda m: known[m.group(1)], text)


def recorded(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def machine(result: dict) -> str:
    """The machine a results file was recorded on, in words, with its date."""
    found = result["machine"]
    if isinstance(found, str):
        return f"{found} ({result.get('date', 'date not recorded')})"
    gpu = f", {found['gpu']}" if found.get("gpu") else ", no GPU"
    return (f"{found['cpu']}, {found['cores']} cores{gpu}, torch {found['torch']}"
            f" ({result.get('date', 'date not recorded')})")


def _alpha_beta(name: str, prefix: str, out: dict) -> None:
    """Lab 03's fit (the ring's model on 2 ranks, as the labs fit it) and what it predicts."""
    from utils.collectives import fit_alpha_beta, ring_all_reduce_seconds

    result = recorded(name)
    two = [r for r in result["rows"] if r["world_size"] == 2]
    alpha, beta = fit_alpha_beta([r["n_bytes"] for r in two], [r["gloo_seconds"] for r in two], world_size=2)
    out[f"{prefix}.machine"] = machine(result)
    out[f"{prefix}.alpha_us"] = f"{alpha * 1e6:.0f} µs"
    out[f"{prefix}.bandwidth"] = f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "unbounded (beta fitted as 0)"
    half = alpha / beta if beta > 0 else float("inf")   # the size where latency and bandwidth cost the same
    out[f"{prefix}.n_half"] = f"{half / 2 ** 10:.0f} KiB"
    for p in (2, 4, 16):
        out[f"{prefix}.ring_100mib_p{p}_ms"] = f"{ring_all_reduce_seconds(100 * 2 ** 20, p, alpha, beta) * 1e3:.0f} ms"
    out[f"{prefix}.verdict"] = result["verdict"]
    largest = max(r["n_bytes"] for r in result["rows"])
    for p in (2, 4):
        row = next(r for r in result["rows"] if r["world_size"] == p and r["n_bytes"] == largest)
        out[f"{prefix}.gloo_{largest >> 20}mib_p{p}_ms"] = f"{row['gloo_seconds'] * 1e3:.1f} ms"
        out[f"{prefix}.ring_{largest >> 20}mib_p{p}_ms"] = f"{row['ring_seconds'] * 1e3:.1f} ms"


def _ddp(name: str, prefix: str, out: dict) -> None:
    result = recorded(name)
    out[f"{prefix}.machine"] = machine(result)
    for r in result["rows"]:
        key = f"{prefix}.{r['model'].replace('-', '')}.p{r['world_size']}.{r['variant'].replace('-', '')}"
        out[f"{key}_ms"] = f"{r['median_step_ms']:.1f} ms"
        out[f"{prefix}.{r['model'].replace('-', '')}.grad_mib"] = f"{r['grad_mib']:.2f} MiB"
    for r in result["rows"]:
        if r["variant"] == "torch-ddp":
            alone = next(s for s in result["rows"] if s["variant"] == "no-comm" and s["model"] == r["model"]
                         and s["world_size"] == r["world_size"])
            out[f"{prefix}.{r['model'].replace('-', '')}.p{r['world_size']}.speedup"] = \
                f"{r['world_size'] * alone['median_step_ms'] / r['median_step_ms']:.1f}x"


def _buckets(out: dict) -> None:
    """How many buckets DDP makes for the recorded MLPs (utils.ddp_timing.ddp_bucket_bytes, torch's rule)."""
    from utils.models import mlp_layer_shapes
    from utils.ddp_timing import ddp_bucket_bytes

    for name, model in recorded("ddp_xeon16.json")["settings"]["models"].items():
        grads = [4 * fan_in * fan_out for fan_in, fan_out in mlp_layer_shapes(**model)[::-1]]
        out[f"buckets.{name.replace('-', '')}.default"] = str(len(ddp_bucket_bytes(grads)))


def _lab02_gpu(out: dict) -> None:
    """The newest recorded run of benchmarks/bench_lab02_gpu.py."""
    name = sorted(p.name for p in RESULTS.glob("lab02_gpu_*.json"))[-1]
    run = recorded(name)
    out["gpu02.machine"] = f"{run['machine']} ({run.get('date', 'date not recorded')})"
    big = run["copy_rates"][-1]
    out["gpu02.copy_mb"] = f"{big['mb']} MB"
    out["gpu02.pageable_gbps"], out["gpu02.pinned_gbps"] = f"{big['pageable_gbps']:.0f} GB/s", f"{big['pinned_gbps']:.0f} GB/s"
    for row in run["copy_return_times"]:
        key = f"gpu02.{row['memory']}_{'nb' if row['non_blocking'] else 'blocking'}"
        out[f"{key}_returned_ms"], out[f"{key}_arrived_ms"] = f"{row['returned_ms']:.2f} ms", f"{row['arrived_ms']:.2f} ms"
    matmul = run["matmul_timings"][0]
    out["gpu02.matmul"] = f"{matmul['n_matmuls']} products of {matmul['size']} x {matmul['size']}"
    for key in ("first_ms", "naive_ms", "synced_ms", "events_ms"):
        out[f"gpu02.matmul_{key}"] = f"{matmul[key]:.2f} ms"
    gpu, cpu = run["throughput_gpu"], run["throughput_cpu"]
    out["gpu02.gpu_batches"] = f"{gpu[0]['batch']} to {gpu[-1]['batch']}"
    out["gpu02.gpu_low"], out["gpu02.gpu_high"] = (f"{gpu[0]['samples_per_s']:,.0f}", f"{gpu[-1]['samples_per_s']:,.0f}")
    out["gpu02.cpu_batches"] = f"{cpu[0]['batch']} to {cpu[-1]['batch']}"
    out["gpu02.cpu_low"], out["gpu02.cpu_high"] = (f"{cpu[0]['samples_per_s']:,.0f}", f"{cpu[-1]['samples_per_s']:,.0f}")
    for row in run["pinned_loop"]:
        key = "pinned" if row["loop"].startswith("pinned") else "pageable"
        out[f"gpu02.loop_{key}_ms"] = f"{row['ms_per_step']:.2f} ms"
    out["gpu02.loop_batch"] = str(run["pinned_loop"][0]["batch"])
    sync = run["sync_point_cost"][0]
    out["gpu02.sync_batch"] = str(sync["batch"])
    out["gpu02.sync_on_device_ms"], out["gpu02.sync_item_ms"] = (f"{sync['on_device_ms']:.2f} ms",
                                                                 f"{sync['item_every_step_ms']:.2f} ms")


def _assessment(out: dict) -> None:
    """The assessment's settings (in the mode the build runs in) and its automatic criteria."""
    from assessment import criteria, settings

    for key in ("WORKERS", "BASE_BATCH", "SCALE", "GLOBAL_BATCH", "MIN_GLOBAL_BATCH", "MAX_GLOBAL_BATCH", "EPOCHS",
                "TARGET", "FLOOR", "EVAL_SIZE", "REFERENCE_EPOCHS"):
        out[f"assessment.{key.lower()}"] = f"{getattr(settings, key):g}"
    out["assessment.speed_factor"] = f"{settings.SPEED_FACTOR:g}"
    steps = criteria.steps_to_target(settings.REFERENCE_EPOCHS - 1, settings.GLOBAL_BATCH, settings.TRAIN_SIZE,
                                     settings.WORKERS)
    seconds = criteria.modelled_seconds(steps, settings.GLOBAL_BATCH // settings.WORKERS)
    out["assessment.reference_seconds"] = f"{seconds:.1f} s for {steps} steps"
    rows = [f"| {name} | {points} | {what} |" for name, (points, what) in criteria.CRITERIA.items()]
    out["assessment.criteria"] = "| criterion | points | what the grader checks |\n| --- | --- | --- |\n" + "\n".join(rows)
    out["assessment.points"] = str(sum(points for points, _ in criteria.CRITERIA.values()))


def values() -> dict:
    """{name: text} for every `{{name}}` a deck may use."""
    out: dict = {}
    _alpha_beta("allreduce_overlap_xeon16.json", "ab.xeon16", out)
    _alpha_beta("allreduce_overlap_2core.json", "ab.2core", out)
    _ddp("ddp_xeon16.json", "ddp.xeon16", out)
    _ddp("ddp_2core_lab01.json", "ddp.2core", out)
    _assessment(out)
    _buckets(out)
    _lab02_gpu(out)
    sweep = recorded("sweep_2core.json")
    out["sweep.machine"] = machine(sweep)
    out["sweep.speedup"] = f"{sweep['speedup']:.1f}x"
    out["sweep.speedup_vs_engine_threads"] = f"{sweep['speedup_vs_engine_threads']:.1f}x"
    for lab in recorded("lab_times.json")["labs"]:
        out[f"lab_times.{lab['notebook'][:2]}.full_min"] = f"{lab['full_s'] / 60:.1f} min"
    out["lab_times.machine"] = machine(recorded("lab_times.json"))
    _lab_figures(out)
    return out


def _lab_figures(out: dict) -> None:
    """For each figure recorded from a lab's full-mode run: its machine and what its cell printed."""
    if not (RESULTS / "lab_figures.json").exists():
        return
    for image, entry in recorded("lab_figures.json").items():
        key = f"figure.{image.removesuffix('.png')}"
        out[f"{key}.machine"] = machine(entry)
        out[f"{key}.printed"] = "\n".join(f"    {line}" for line in entry["printed"].splitlines())  # a code block

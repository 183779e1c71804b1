"""The numbers the decks quote, read from the recorded runs in benchmarks/results/.

A deck writes `{{name}}` where a recorded number belongs (slide or notes); the build puts the value in,
and refuses a name it does not know. So no number that a results file holds is typed into a deck.
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


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
    """How many buckets DDP makes for the recorded MLPs (utils.scaling.ddp_bucket_bytes, torch's rule)."""
    from utils.models import mlp_layer_shapes
    from utils.scaling import ddp_bucket_bytes

    for name, model in recorded("ddp_xeon16.json")["settings"]["models"].items():
        grads = [4 * fan_in * fan_out for fan_in, fan_out in mlp_layer_shapes(**model)[::-1]]
        out[f"buckets.{name.replace('-', '')}.default"] = str(len(ddp_bucket_bytes(grads)))


def _strategies(out: dict) -> None:
    result = recorded("assessment_strategies.json")
    settings = result["settings"]
    out["strategies.machine"] = machine(result)
    for key in ("scale", "global_batch", "base_batch", "base_lr", "epochs", "warmup_epochs"):
        out[f"strategies.{key}"] = str(settings[key])
    out["strategies.target"] = f"{result['target']:.2f}"
    for name, run in result["strategies"].items():
        key = name.replace("+", "_")
        out[f"strategies.{key}.passed"] = f"{run['passed']}/{run['seeds']}"
        out[f"strategies.{key}.lr"] = f"{run['lr']:g}"
        out[f"strategies.{key}.final"] = ", ".join(f"{v:.2f}" for v in run["final"])
    base = result["baseline"]
    out["strategies.baseline.final"] = ", ".join(f"{v:.2f}" for v in base["final"])


def values() -> dict:
    """{name: text} for every `{{name}}` a deck may use."""
    out: dict = {}
    _alpha_beta("allreduce_overlap_xeon16.json", "ab.xeon16", out)
    _alpha_beta("allreduce_overlap_2core.json", "ab.2core", out)
    _ddp("ddp_xeon16.json", "ddp.xeon16", out)
    _ddp("ddp_2core_lab01.json", "ddp.2core", out)
    _strategies(out)
    _buckets(out)
    sweep = recorded("sweep_2core.json")
    out["sweep.machine"] = machine(sweep)
    out["sweep.speedup"] = f"{sweep['speedup']:.1f}x"
    out["sweep.speedup_vs_engine_threads"] = f"{sweep['speedup_vs_engine_threads']:.1f}x"
    for lab in recorded("lab_times.json")["labs"]:
        out[f"lab_times.{lab['notebook'][:2]}.full_min"] = f"{lab['full_s'] / 60:.1f} min"
    out["lab_times.machine"] = machine(recorded("lab_times.json"))
    return out

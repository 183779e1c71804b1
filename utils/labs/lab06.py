"""Lab 06's measurements, figures and printed verdicts: a realistic model's data loading, scaling over
workers, and WideResNet settings on a GPU.

Section 2, what reading batches costs against training on them: ``loader_rates`` times one pass over a
training set for each way of reading batches (tensors in memory, ``DataLoader`` with 0 or some worker
processes, with or without a per-sample random shift, pinned memory where a GPU is present);
``training_rate`` times the model's training step on batches of the same size; ``print_rates`` prints
them side by side with the share of a step spent loading when loading and training take turns.

Section 3, how a data-parallel step scales with the number of workers, measured on the engines and
predicted: ``time_scaling`` runs on every engine at once. For each k asked for (``worker_counts``: every k
up to the cores, at most 8, that divides the global batch) it times, on ranks 0 .. k-1 together (the
others wait at a barrier), one training step of a DDP model on a subgroup of k ranks and the same step
of the bare model (the computation alone), in turns, for each per-rank batch asked for, with
``utils.ddp_timing.time_ddp_against_bare``; a step that two series share (k = 1 of strong and weak
scaling) is timed once. ``predicted_step_ms`` predicts the step from lab 03's alpha-beta model and DDP's
buckets (``utils.ddp_timing``); ``speedup_verdict`` judges a speed-up through ``utils.outcomes``;
``LiveScaling`` turns every rank's timings into the throughput and communication the lab draws and says
what they show (no timing verdict where workers shared cores).
``recorded_runs`` and ``plot_recorded`` read and draw benchmarks/bench_lab06_scaling.py's recordings (a
core per worker).

Section 5, a WideResNet on a GPU: images per second of a training step in fp32, with bf16 autocast, with
bf16 autocast and ``channels_last``, and with batches copied from host memory each step instead of kept
on the device (``wrn_settings``); and a whole training run to a target validation accuracy, timed per
epoch (``train_to_accuracy``). ``benchmarks/bench_wrn_gpu.py`` records both on a GPU machine
(``benchmarks/results/wrn_gpu_*.json``) and the lab shows them where there is no GPU;
``recorded_gpu_runs`` reads them back.

Section 4, time to accuracy: ``run_job_script`` runs the learner's job with 1, 2 and N processes;
``plot_time_to_accuracy`` draws the runs and ``time_to_accuracy_verdicts`` says what they show.
"""
from __future__ import annotations

import json
import math
import re
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from utils.config import COURSE_ROOT
from utils.ddp_timing import Workload, predicted_comm_seconds, time_ddp_against_bare
from utils.models import WideResNet
from utils.perf import synchronize


# Lab 06 section 3's experiment, shared by the lab and benchmarks/bench_lab06_scaling.py (which records it).
GLOBAL_BATCH = 64                  # strong scaling: k workers take GLOBAL_BATCH // k each
PER_RANK_BATCH = 64                # weak scaling: every worker keeps this batch (at k = 1 the same step)
MODELS = {"CNN": {}, "CNN, FC1 2048": dict(hidden=2048)}      # utils.models.CNN settings
SWEEP_BYTES = [2 ** e for e in range(12, 23, 2)]            # the alpha-beta fit's all-reduces: 4 KiB .. 4 MiB
MAX_WORKERS = 8


def worker_counts(cores: int, global_batch: int = GLOBAL_BATCH, most: int = MAX_WORKERS) -> list[int]:
    """The k section 3 times on ``cores`` cores: every k up to min(cores, ``most``) that divides the global batch."""
    return [k for k in range(1, min(cores, most) + 1) if global_batch % k == 0]
















def time_scaling(build_model, input_shape, n_classes: int, per_rank_batches: dict, device, *,
                 warmup: int = 3, repeats: int = 10, ks=None) -> dict:
    """On every engine: ``{(label, k): {"ddp": ms, "compute": ms, "ddp_steps": [...], "compute_steps": [...],
    "per_rank": b}}`` for this rank, for each k in ``ks`` (default 1 .. world size).

    ``per_rank_batches[label]`` maps k to the per-rank batch (e.g. strong scaling ``G // k``, weak
    scaling a constant). A step the same as an earlier label's at that k (the same per-rank batch: at
    k = 1 strong and weak scaling run the same step when ``G = b``) is timed once and shared, its entry
    saying ``"same_run_as": label``: both series then divide by the same one-worker time. Times are
    this rank's; the step of k ranks is as slow as the slowest, so merge ranks with ``slowest_steps``.
    Every rank must call it, with the same arguments.
    """
    labels = list(per_rank_batches)

    def first_with(label, k):            # the first label that runs this label's step at k
        b = per_rank_batches[label](k)
        return next(other for other in labels if per_rank_batches[other](k) == b)

    workloads = {label: Workload(build_model, input_shape, n_classes,
                                 lambda k, label=label: per_rank_batches[label](k) if first_with(label, k) == label else None)
                 for label in labels}
    results = time_ddp_against_bare(workloads, device, warmup=warmup, repeats=repeats, ks=ks,
                                    more=lambda label, group, model, x, y: {"per_rank": len(x)})
    for (label, k) in [key for key in results]:
        for other in labels:
            if other != label and first_with(other, k) == label:
                results[(other, k)] = dict(results[(label, k)], same_run_as=label)
    return results


def slowest_steps(per_rank: list[dict]) -> dict:
    """``time_scaling``'s results of every rank merged: per (label, k) the slowest rank's ``ddp`` and
    ``compute`` medians (a step of k ranks ends when the slowest rank's does) and, where recorded, each
    timed step's slowest rank (``ddp_steps``, ``compute_steps``: the steps started together at a barrier)."""
    merged = {}
    for key in per_rank[0]:
        ranks = [t[key] for t in per_rank if key in t]
        merged[key] = {what: max(t[what] for t in ranks) for what in ("ddp", "compute")}
        for what in ("ddp_steps", "compute_steps"):
            if all(what in t for t in ranks):
                merged[key][what] = [max(steps) for steps in zip(*(t[what] for t in ranks))]
    return merged


def predicted_step_ms(compute_ms_one: float, k: int, grad_bytes, alpha: float, beta: float, *,
                      strong: bool) -> float:
    """The compute + communication model of a step of k workers: one worker's computation (divided by k
    under strong scaling: at best k times less work each) plus the predicted all-reduce of DDP's buckets
    (``predicted_comm_seconds``, no overlap). ``grad_bytes`` in the order backward produces them."""
    return compute_ms_one / (k if strong else 1) + 1e3 * predicted_comm_seconds(grad_bytes, k, alpha, beta)


def speedup_verdict(label: str, k: int, rates_one, rates_k) -> str:
    """A sentence on the throughput of k workers against k times one worker's, from each timed step's
    images/s (``rates_one``, ``rates_k``), through ``utils.outcomes.compare``: an efficiency only when
    it is below 100% beyond the steps' spread; above it, no efficiency is printed (not a speed-up)."""
    from utils import outcomes

    ideal = [k * r for r in rates_one]
    conclusion = outcomes.compare(f"{label}: {k} workers", rates_k, f"{k} x one worker", ideal, unit=" img/s")
    mean_k, mean_ideal = statistics.fmean(rates_k), statistics.fmean(ideal)
    head = f"{label}: {mean_k:,.0f} images/s at {k} workers against {mean_ideal:,.0f} ideal ({k} x one worker)"
    if conclusion == "lower":
        return f"{head}: efficiency {mean_k / mean_ideal:.0%}, below 100% beyond the steps' spread"
    if conclusion == "higher":
        return f"{head}: above 100%: not a speed-up; measurement noise or contention (no efficiency printed)"
    return f"{head}: not told apart from 100% within the steps' spread (no efficiency printed)"


def plot_scaling(ks, throughput: dict, predicted: dict, communication: dict, title: str):
    """Throughput against workers, measured (``throughput[label]``: images/s per k) beside the compute +
    communication model's (``predicted[label]``, dashed), then per model the communication per step,
    measured (DDP step - computation) beside the prediction (``communication[model] = (measured ms per k,
    predicted ms per k)``). No efficiency panel: an efficiency is printed only where the steps' spread
    bears it out (``speedup_verdict``)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 1 + len(communication), figsize=(5.5 * (1 + len(communication)), 4))
    for label, rates in throughput.items():
        line, = axes[0].plot(ks, rates, "o-", label=f"{label}, measured")
        if label in predicted:
            axes[0].plot(ks, predicted[label], "--", color=line.get_color(), label=f"{label}, predicted")
    axes[0].set(ylabel="images / s", title="Throughput (dashed: compute + alpha-beta model)")
    for ax, (model, (measured, expected)) in zip(axes[1:], communication.items()):
        ax.bar([k - 0.2 for k in ks], measured, width=0.4, label="measured: DDP step - computation")
        ax.bar([k + 0.2 for k in ks], expected, width=0.4, label="predicted: buckets x alpha-beta")
        ax.set(ylabel="ms per step", title=f"Communication, {model}")
    for ax in axes:
        ax.set(xlabel="workers", xticks=list(ks))
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# Recorded runs of section 3 (benchmarks/bench_lab06_scaling.py: one process per worker, each on a core
# of its own), which lab 06 shows beside its live run and deck 06 shows as its figure.

# --- Section 3, live: every rank's timings, the figure's numbers and the verdicts -----------------------------

class LiveScaling:
    """Section 3's live measurement, from every rank's ``time_scaling`` results (``per_rank_timings``): per model
    (``models``: name -> CNN options) and mode ("strong": a global batch of ``global_batch`` shared by k workers;
    "weak": ``per_rank`` each) the throughput measured (``throughput``, images/s per k) and predicted by the compute +
    communication model (``predicted``), and per model the communication measured and predicted (``communication``:
    (ms per k, ms per k)). ``rates`` and ``comm_ms`` give each timed step's numbers; ``verdicts`` says what they show."""

    def __init__(self, per_rank_timings: list, models: dict, ks: list, global_batch: int, per_rank: int, input_shape,
                 alpha: float, beta: float):
        from utils.models import CNN

        self.ks, self.models = list(ks), models
        self.gradients = {name: [p.numel() * p.element_size() for p in CNN(input_shape, **options).parameters()][::-1]
                          for name, options in models.items()}             # in the order backward produces them
        self.step = {name: slowest_steps([t[name] for t in per_rank_timings]) for name in models}   # the slowest rank's
        self.batch = {"strong": lambda k: global_batch // k, "weak": lambda k: per_rank}           # per worker
        if not all(self.step[name][("weak", 1)]["ddp_steps"] == self.step[name][("strong", 1)]["ddp_steps"] for name in models):
            raise ValueError("the timings at k = 1 must be one measurement for both modes (time_scaling takes them once)")
        modes = [(name, mode) for name in models for mode in self.batch]
        self.throughput = {f"{name}, {mode}": [statistics.median(self.rates(name, mode, k)) for k in self.ks]
                           for name, mode in modes}
        self.predicted = {f"{name}, {mode}": [k * self.batch[mode](k) * 1e3 / predicted_step_ms(
                              self.step[name][("weak", 1)]["compute"], k, self.gradients[name], alpha, beta,
                              strong=mode == "strong") for k in self.ks] for name, mode in modes}
        self.communication = {name: ([max(statistics.median(self.comm_ms(name, k)), 0.0) for k in self.ks],
                                     [1e3 * predicted_comm_seconds(self.gradients[name], k, alpha, beta) for k in self.ks])
                              for name in models}

    def rates(self, name: str, mode: str, k: int) -> list[float]:
        """Images/s of each timed step of k workers (each step as slow as its slowest rank)."""
        return [k * self.batch[mode](k) / ms * 1e3 for ms in self.step[name][(mode, k)]["ddp_steps"]]

    def comm_ms(self, name: str, k: int) -> list[float]:
        """Each timed step's DDP time minus the bare step taken just after it: communication and bookkeeping."""
        entry = self.step[name][("weak", k)]
        return [d - c for d, c in zip(entry["ddp_steps"], entry["compute_steps"])]

    def table(self) -> list[str]:
        return [f"{label:>22}: " + "; ".join(f"k={k} {m:,.0f} img/s (model {q:,.0f})"
                                              for k, m, q in zip(self.ks, self.throughput[label], self.predicted[label]))
                for label in self.throughput]

    def verdicts(self, *, load: float, repeats: int, real_cores: int, cores: int, oversubscribed: bool) -> list[str]:
        """What the timings of the largest k show, each comparison through ``utils.outcomes``; none when the
        workers shared cores (``oversubscribed``: COURSE_CORES above the real cores; or a load average that left
        too few idle)."""
        from utils import outcomes

        n = self.ks[-1]
        small, wide = self.models
        if oversubscribed:
            return [f"No timing verdict: {n} engines took turns on {real_cores} real cores (COURSE_CORES={cores}), so "
                    f"these times measure turn-taking. What {n} workers on {n} cores of their own do is in the recorded "
                    f"runs below."]
        if n == 1:
            return ["One core: nothing to scale over here; the recorded runs below had more."]
        if not load + n <= real_cores:          # the rule the recorded files are held to (contended)
            return [f"No timing verdict: the load average before the run, {load:.1f}, left fewer idle cores than the {n} "
                    f"engines on these {real_cores} cores, so their times also measure the other load. The recorded "
                    f"runs below had a core per worker."]
        lines = [f"On this machine, {real_cores} cores, load average {load:.1f} before the run "
                 f"(each line compares the {repeats} timed steps of each side, beyond their spread or not):"]
        for label in self.throughput:
            name, mode = label.rsplit(", ", 1)
            lines.append("  " + speedup_verdict(label, n, self.rates(name, mode, 1), self.rates(name, mode, n)))
        for name in self.models:
            said = outcomes.compare(f"{name}: strong scaling at {n} workers", self.rates(name, "strong", n),
                                    "weak scaling", self.rates(name, "weak", n), unit=" img/s")
            lines.append(f"  {name}, strong against weak scaling (the same one-worker step divides both): " + {
                "lower": "strong scaling is lower, as its smaller per-worker batch predicts.",
                "higher": "strong scaling is higher, against what its smaller per-worker batch predicts: "
                          "something other than the batch (the machine's load) set these steps.",
                "within the spread": "not told apart within the steps' spread."}[said])
        said = outcomes.compare(f"{wide}: communication at {n} workers", self.comm_ms(wide, n),
                                f"{small}'s", self.comm_ms(small, n), unit=" ms")
        ratio = sum(self.gradients[wide]) / sum(self.gradients[small])
        lines.append(f"  {wide} sends {ratio:.0f}x the bytes; its measured communication was " + {
            "higher": "the larger, as the bytes predict.",
            "lower": "the smaller: here 'DDP step - computation' follows the machine's load, not the bytes.",
            "within the spread": "not told apart from the small CNN's within the steps' spread."}[said])
        for name, (measured, expected) in self.communication.items():
            lines.append(f"  {name}: communication at {n} workers measured {measured[-1]:.2f} ms (median of the paired "
                         f"differences; {measured[0]:.2f} ms at 1 worker, where nothing is sent: DDP's bookkeeping), "
                         f"predicted {expected[-1]:.2f} ms for the all-reduces alone")
        return lines


def recorded_runs(folder=None) -> list[dict]:
    """Every ``lab06_scaling_*.json`` in ``folder`` (default benchmarks/results), fewest cores first."""
    import json
    from pathlib import Path

    from utils.config import COURSE_ROOT

    folder = Path(folder) if folder else COURSE_ROOT / "benchmarks" / "results"
    records = [dict(json.loads(path.read_text()), file=path.name) for path in folder.glob("lab06_scaling_*.json")]
    return sorted(records, key=lambda r: (r["machine"]["cores"], r["date"]))


def recorded_curves(record: dict):
    """(ks, throughput, predicted, communication) of a recorded file, as ``plot_scaling`` takes them:
    images/s from each run's median step (slowest rank), the model's prediction from the one-worker run's
    computation and each run's own alpha-beta fit, and per model the communication (median of the paired
    differences DDP step - computation) beside the buckets' predicted all-reduce time."""
    runs = sorted(record["runs"], key=lambda r: r["workers"])
    ks = [r["workers"] for r in runs]
    one = runs[0]["models"]
    throughput, predicted, communication = {}, {}, {}
    for name in one:
        compute_one = statistics.median(one[name]["weak"]["compute_steps"])
        for mode in ("strong", "weak"):
            label = f"{name}, {mode}"
            throughput[label], predicted[label] = [], []
            for run in runs:
                entry, k = run["models"][name][mode], run["workers"]
                samples = k * entry["per_rank"]
                throughput[label].append(samples / statistics.median(entry["ddp_steps"]) * 1e3)
                model_ms = predicted_step_ms(compute_one, k, run["models"][name]["grad_bytes"], run["alpha"] or 0.0,
                                             run["beta"] or 0.0, strong=mode == "strong")
                predicted[label].append(samples / model_ms * 1e3)
        communication[name] = (
            [max(statistics.median([d - c for d, c in zip(r["models"][name]["weak"]["ddp_steps"],
                                                          r["models"][name]["weak"]["compute_steps"])]), 0.0)
             for r in runs],
            [1e3 * predicted_comm_seconds(r["models"][name]["grad_bytes"], r["workers"], r["alpha"] or 0.0,
                                          r["beta"] or 0.0) for r in runs])
    return ks, throughput, predicted, communication


def contended(record: dict) -> bool:
    """Whether some k of a recorded file started with fewer idle cores than workers (1-minute load average
    + k > cores): its times then measure the machine's other load too, and draw no verdict."""
    cores = record["machine"]["cores"]
    return any(r.get("load_average") is None or r["load_average"][0] + r["workers"] > cores for r in record["runs"])


def describe_record(record: dict, *, date: bool = True) -> str:
    """The machine, its load and (``date``) the date of a recorded file, in one line."""
    m = record["machine"]
    loads = [r.get("load_average") for r in record["runs"] if r.get("load_average")]
    load = f"load average {min(l[0] for l in loads):.1f}-{max(l[0] for l in loads):.1f} as its runs started" if loads else "load not recorded"
    return (f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}{', ' + record['date'] if date else ''}; one process per worker, "
            f"each pinned to a core of its own, {load}"
            + (": contended, fewer idle cores than workers, so its times measure that load too" if contended(record) else ""))


def plot_recorded(record: dict):
    """``plot_scaling`` of a recorded file, titled with its machine and load."""
    ks, throughput, predicted, communication = recorded_curves(record)
    return plot_scaling(ks, throughput, predicted, communication, f"recorded: {describe_record(record)}")


class Shifted(Dataset):
    """The images, each moved by a random offset of up to 2 pixels: per-sample work, as augmentation does."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        height, width = self.x.shape[-2:]
        padded = F.pad(self.x[i], (2, 2, 2, 2))
        dy, dx = torch.randint(0, 5, (2,)).tolist()
        return padded[:, dy:dy + height, dx:dx + width], self.y[i]


class InMemory:
    """Batches by indexing the whole tensors with a shuffled index (what the earlier labs do)."""

    def __init__(self, x, y, batch: int):
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self):
        for index in torch.randperm(len(self.x)).split(self.batch):
            yield self.x[index], self.y[index]


def images_per_s(make, n: int, passes: int = 3) -> tuple[float, float]:
    """Images per second of the fastest of ``passes`` passes over the loader ``make()`` returns, and of its
    first pass (which includes starting worker processes: persistent_workers keeps them for the later passes)."""
    batches, seconds = make(), []
    for _ in range(passes):
        start = time.perf_counter()
        for _ in batches:
            pass
        seconds.append(time.perf_counter() - start)
    return n / min(seconds), n / seconds[0]


def loader_rates(x, y, batch: int, workers: int) -> dict:
    """``{way: (images/s of the best pass, images/s of the first pass)}`` for each way of reading (x, y)."""
    plain = TensorDataset(x, y)
    ways = {
        "tensors in memory, indexed": lambda: InMemory(x, y, batch),
        "DataLoader, 0 workers": lambda: DataLoader(plain, batch, shuffle=True),
        f"DataLoader, {workers} workers": lambda: DataLoader(plain, batch, shuffle=True, num_workers=workers,
                                                             persistent_workers=True),
        "shifted, DataLoader, 0 workers": lambda: DataLoader(Shifted(x, y), batch, shuffle=True),
        f"shifted, DataLoader, {workers} workers": lambda: DataLoader(Shifted(x, y), batch, shuffle=True,
                                                                      num_workers=workers, persistent_workers=True),
    }
    if torch.cuda.is_available():
        ways["DataLoader, 0 workers, pin_memory"] = lambda: DataLoader(plain, batch, shuffle=True, pin_memory=True)
    return {name: images_per_s(make, len(x)) for name, make in ways.items()}


def training_rate(model, x, y, steps: int, warmup: int = 3) -> float:
    """Images per second of ``model``'s SGD training step on the batch (x, y), after ``warmup`` steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return steps * len(x) / (time.perf_counter() - start)


def print_rates(measured: dict, training: float, batch: int) -> None:
    """The table of ``loader_rates`` beside the training rate, with the share of a step spent loading."""
    print(f"{'way of reading batches of ' + str(batch):<40} {'images/s':>10} {'first pass':>11} "
          f"{'share of a step spent loading':>30}")
    for name, (rate, first) in measured.items():
        print(f"{name:<40} {rate:>10,.0f} {first:>11,.0f} {training / (training + rate):>30.0%}")
    print(f"{'the CNN training on batches of ' + str(batch) + f' ({torch.get_num_threads()} threads)':<40} "
          f"{training:>10,.0f}")


RESULTS = COURSE_ROOT / "benchmarks" / "results"
# name: (autocast dtype or None for fp32, channels_last, batch copied from pageable host memory each step)
SETTINGS = {"fp32": (None, False, False),
            "bf16 autocast": (torch.bfloat16, False, False),
            "bf16 autocast + channels_last": (torch.bfloat16, True, False),
            "bf16 autocast + channels_last + batches copied from host": (torch.bfloat16, True, True)}


def _images_per_s(model, x, y, dtype, channels_last: bool, from_host: bool, steps: int, warmup: int) -> float:
    device = x.device
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    # The naive loop: each step's batch sits in ordinary (pageable) host memory and is copied before use.
    x_host, y_host = (x.cpu(), y.cpu()) if from_host else (None, None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize(device)
            start = time.perf_counter()
        if from_host:
            x, y = x_host.to(device), y_host.to(device)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize(device)
    return steps * len(x) / (time.perf_counter() - start)


def wrn_settings(device, input_shape=(3, 32, 32), *, depth: int = 16, width: int = 4, batch: int = 256,
                 steps: int = 30, warmup: int = 5) -> list[dict]:
    """One row per setting: ``{"setting", "images_per_s"}``, the data already on the device."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"wrn_settings measures a CUDA GPU, got device {device!r}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *input_shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    rows = []
    for name, (dtype, channels_last, from_host) in SETTINGS.items():
        torch.manual_seed(0)
        model = WideResNet(depth=depth, width=width, in_channels=input_shape[0]).to(device)
        rows.append({"setting": f"WRN-{depth}-{width}, batch {batch}, {name}",
                     "images_per_s": _images_per_s(model, x, y, dtype, channels_last, from_host, steps, warmup)})
    return rows


def train_to_accuracy(data, device, *, depth: int = 16, width: int = 4, batch: int = 256, lr: float = 0.1,
                      epochs: int = 15, target: float | None = 0.75, in_a_row: int = 2, dtype=torch.bfloat16,
                      channels_last: bool = True, seed: int = 0) -> dict:
    """Train a WideResNet on ``data`` (a ``utils.data.Dataset``) with the whole set on ``device`` and
    return its training time and validation accuracy after every epoch.

    Stops once the validation accuracy reached ``target`` in ``in_a_row`` consecutive epochs (the
    NVIDIA course's assessment asks for 0.75 twice in a row), or after ``epochs``. SGD with Nesterov
    momentum 0.9 and weight decay 5e-4; the learning rate rises linearly over the first epoch and
    then falls on a cosine to 0 at ``epochs``. Only training counts in the time (each epoch ends on a
    synchronisation), not the evaluation. ``dtype=None`` trains in fp32. Returns
    ``{"epochs": [{"epoch", "train_s", "val_accuracy"}], "reached_epoch", "reached_s"}`` where
    ``train_s`` is cumulative and ``reached_*`` are None if the target was not reached.
    """
    device = torch.device(device)
    if batch > len(data.x_train):
        raise ValueError(f"batch={batch} is larger than the {len(data.x_train)} training images; lower it")
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # fixed shapes (drop_last): let cuDNN pick its fastest kernels once
    try:
        return _train(data, device, depth, width, batch, lr, epochs, target, in_a_row, dtype, channels_last, seed)
    finally:
        torch.backends.cudnn.benchmark = benchmark


def _train(data, device, depth, width, batch, lr, epochs, target, in_a_row, dtype, channels_last, seed) -> dict:
    torch.manual_seed(seed)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    x_train = data.x_train.to(device).contiguous(memory_format=memory)
    x_val = data.x_test.to(device).contiguous(memory_format=memory)
    y_train, y_val = data.y_train.to(device), data.y_test.to(device)
    model = WideResNet(depth=depth, width=width, n_classes=data.n_classes,
                       in_channels=x_train.shape[1]).to(device, memory_format=memory)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps_per_epoch = len(x_train) // batch
    warmup = steps_per_epoch
    total = steps_per_epoch * epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / warmup if step < warmup
                                                 else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))
    autocast = dict(device_type=device.type, dtype=dtype, enabled=dtype is not None)
    history, train_s, streak = [], 0.0, 0
    reached_epoch = reached_s = None
    for epoch in range(1, epochs + 1):
        model.train()
        synchronize(device)
        start = time.perf_counter()
        order = torch.randperm(len(x_train), device=device)
        for step in range(steps_per_epoch):
            index = order[step * batch:(step + 1) * batch]
            with torch.autocast(**autocast):
                loss = F.cross_entropy(model(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        synchronize(device)
        train_s += time.perf_counter() - start
        model.eval()
        with torch.no_grad(), torch.autocast(**autocast):
            correct = sum(int((model(x_val[i:i + 1024]).argmax(1) == y_val[i:i + 1024]).sum())
                          for i in range(0, len(x_val), 1024))
        accuracy = correct / len(x_val)
        history.append({"epoch": epoch, "train_s": train_s, "val_accuracy": accuracy})
        streak = streak + 1 if target is not None and accuracy >= target else 0
        if target is not None and streak == in_a_row:
            reached_epoch, reached_s = epoch, train_s
            break
    return {"epochs": history, "reached_epoch": reached_epoch, "reached_s": reached_s}


def recorded_gpu_runs(folder: Path = RESULTS) -> list[dict]:
    """The recorded GPU runs, oldest first (by date), each ``{"machine", "date", "rows", ...}``."""
    runs = [json.loads(path.read_text()) for path in Path(folder).glob("wrn_gpu_*.json")]
    return sorted(runs, key=lambda run: run.get("date", ""))


def print_report(rows: list[dict], source: str | None, run: dict | None) -> None:
    """Lab 06's GPU report: images/s of each setting (``rows``, from ``source``), then the recorded whole
    training run of ``run`` (epoch times, time to its target), compared with the NVIDIA course's
    assessment only when the run trained on the same data set, CIFAR-10."""
    if rows:
        print(f"WideResNet step, images/s ({source}):")
        width = max(len(row["setting"]) for row in rows)
        for row in rows:
            print(f"  {row['setting']:<{width}} {row['images_per_s']:>10,.0f}  "
                  f"({row['images_per_s'] / rows[0]['images_per_s']:.2f}x fp32)")
    else:
        print("No GPU here, and no GPU run recorded yet: run `python benchmarks/bench_wrn_gpu.py` on a machine with a "
              "CUDA GPU to record one (benchmarks/results/wrn_gpu_*.json); this cell will then show it.")
    if not run or "time_to_accuracy" not in run:
        return
    fp32, lab = run["epoch_s"]["fp32"], run["epoch_s"]["bf16 autocast + channels_last"]
    reached = run["time_to_accuracy"]
    print(f"\nA whole training run, recorded on {run['machine']} ({run['date']}): {run['model']}, {run['dataset']}.")
    print(f"One epoch takes {lab:.1f} s with bf16 autocast, channels_last and the data on the GPU, against "
          f"{fp32:.1f} s in fp32 without channels_last ({fp32 / lab:.1f}x).")
    for epoch in reached["epochs"]:
        print(f"  epoch {epoch['epoch']:>2}: {epoch['train_s']:6.1f} s of training, validation accuracy "
              f"{epoch['val_accuracy']:.3f}")
    print(f"Validation accuracy {run['target']} in two epochs in a row: "
          + (f"after epoch {reached['reached_epoch']}, {reached['reached_s']:.0f} s of training on one GPU."
             if reached["reached_s"] else f"not reached in {len(reached['epochs'])} epochs."))
    if run["dataset"].lower().startswith("cifar-10"):
        print("The NVIDIA course's assessment gives 4 GPUs 240 s for the same target on the same data set, CIFAR-10.")
    else:
        print(f"The NVIDIA course's assessment gives 4 GPUs 240 s for this target on CIFAR-10; this run trained on "
              f"another data set ({run['dataset']}), where the same accuracy is a different goal, so the two times "
              f"cannot be compared.")


# --- Section 1: the job as a torchrun script, run from the notebook ----------------------------------------

JOB_LOG = re.compile(r"^epoch (\d+) train_loss (\S+) test_accuracy (\S+) seconds (\S+)", re.MULTILINE)


def run_job_script(job_dir, name: str, nproc: int | None = None, *, cores: int, **options):
    """Run ``job_dir/name`` (under torchrun with ``nproc`` processes; None: plain Python) with ``--key=value``
    for each option; return its epochs (from the lines it logs), wall seconds and output.

    Each process gets (real cores) / nproc torch threads, so that the processes share the cores, not fight
    for them (with ``cores`` above the real count, threads beyond the real cores would only take turns)."""
    from utils import config, export

    arguments = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    result = export.run([Path(job_dir) / name, *arguments], nproc, cwd=job_dir,
                        threads=max(1, min(cores, config.real_cores()) // (nproc or 1)))
    if result.code != 0:
        raise RuntimeError(f"{name} exited with {result.code}:\n{result.output[-4000:]}")
    epochs = [dict(epoch=int(e), train_loss=float(l), test_accuracy=float(a), seconds=float(s))
              for e, l, a, s in JOB_LOG.findall(result.output)]
    return epochs, result.seconds, result.output


def plot_time_to_accuracy(job_runs: dict, global_batch: int, epochs: int):
    """Test accuracy against the job's own training time, one curve per process count (``job_runs``:
    ``{nproc: (epochs, wall seconds, output)}`` from ``run_job_script``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for nproc, (logged, wall, _) in sorted(job_runs.items()):
        elapsed = torch.tensor([e["seconds"] for e in logged]).cumsum(0)
        ax.plot(elapsed, [e["test_accuracy"] for e in logged], "o-", label=f"{nproc} process(es): {wall:.0f} s wall in all")
    ax.set_xlabel("training time (s, from the job's own log)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Time to accuracy, global batch {global_batch}, {epochs} epochs")
    ax.legend(fontsize=8)
    return fig


# --- Section 4: the runs to accuracy, and what they show ------------------------------------------------------

def same_global_batches(nprocs, train_size: int, global_batch: int, seed: int = 0) -> bool:
    """Whether every global step of the job's first epoch holds the same samples whatever the number of processes
    in ``nprocs``: each DistributedSampler (the script's, at ``seed``) cuts one shuffled order into its share."""
    from torch.utils.data import DistributedSampler

    def global_steps(nproc):
        shares = []
        for rank in range(nproc):
            sampler = DistributedSampler(range(train_size), num_replicas=nproc, rank=rank, shuffle=True, seed=seed)
            sampler.set_epoch(0)
            shares.append(list(sampler))
        per = global_batch // nproc
        return [sorted(i for share in shares for i in share[t * per:(t + 1) * per]) for t in range(len(shares[0]) // per)]

    return all(global_steps(nproc) == global_steps(1) for nproc in nprocs)


def time_to_accuracy_verdicts(job_runs: dict, *, train_size: int, global_batch: int, real_cores: int, cores: int,
                              oversubscribed: bool) -> list[str]:
    """Section 4's verdicts on its runs (``{nproc: (epochs, wall seconds, output)}``, one run each): the time each
    took to the accuracy every run reached, a winner only through ``utils.outcomes.first_to_target`` (none from
    single runs, none when processes shared cores), and the final accuracies compared, with why they differ."""
    from utils import outcomes

    target = min(epochs[-1]["test_accuracy"] for epochs, _, _ in job_runs.values())   # every run reached it
    lines, reached = [], {}
    for nproc, (epochs, wall, _) in sorted(job_runs.items()):
        seconds = 0.0
        for e in epochs:
            seconds += e["seconds"]
            if e["test_accuracy"] >= target:
                reached[nproc] = seconds
                break
        lines.append(f"{nproc} process(es): final test accuracy {epochs[-1]['test_accuracy']:.1%}, {target:.1%} reached "
                     f"after {reached[nproc]:.1f} s of training, {sum(e['seconds'] for e in epochs):.1f} s for all epochs")
    epoch_s = max(e["seconds"] for epochs, _, _ in job_runs.values() for e in epochs)    # one evaluation per epoch
    if oversubscribed:
        lines.append(f"No verdict on time: the {max(job_runs)}-process run took turns on {real_cores} real cores "
                     f"(COURSE_CORES={cores}), so its seconds measure turn-taking.")
    else:
        # one run each: first_to_target names no winner from a single run (no spread to set against the gap)
        _, sentence = outcomes.first_to_target({f"{n} process(es)": [s] for n, s in reached.items()}, epoch_s)
        lines.append(f"To {target:.1%} on this machine ({real_cores} cores), one run each: {sentence}")
    finals = [epochs[-1]["test_accuracy"] for epochs, _, _ in job_runs.values()]
    most, one = (job_runs[n][0][-1]["test_accuracy"] for n in (max(job_runs), 1))
    said = outcomes.compare(f"{max(job_runs)} processes' final test accuracy", [most], "one process's", [one], percent=True)
    lines.append(f"{max(job_runs)} processes' final test accuracy {most:.1%} against one process's {one:.1%}: "
                 + ("one run each, not judged: a single run cannot tell a difference from the noise of dropout masks "
                    "and the order of sums" if said == "not judged" else said))
    same = same_global_batches(job_runs, train_size, global_batch)
    lines.append(f"Final test accuracies span {min(finals):.1%} to {max(finals):.1%} "
                 f"({100 * (max(finals) - min(finals)):.1f} points). "
                 + ("Every global step held the same samples whatever the number of processes (each DistributedSampler "
                    "cuts the same shuffled order), so the runs differ only by the dropout masks each process draws "
                    "and the order of the sums." if same else
                    "The runs' global steps held different samples (the processes do not divide the data set evenly), "
                    "and each process draws its own dropout masks."))
    return lines

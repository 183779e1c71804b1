"""Many short training runs at once: one configuration per engine, results in the configurations' order.

Taught in labs/07 (batch size and learning rate), where a figure needs a dozen runs:

    from utils import cluster, sweep
    workers = cluster.start(2)

    def train_one(lr, batch_size):               # defined in the notebook: sent to the engines by value
        ...
        return {"train_loss": losses, "test_accuracy": accuracy}

    runs = sweep.run(train_one, [dict(lr=lr, batch_size=256) for lr in (0.05, 0.1, 0.2)], workers)
    print(sweep.table(runs))
    results = sweep.results(runs)                # what each returned; stops here if one failed

``fn(**config)`` runs on whichever engine is free next (ipyparallel's load-balanced view), so a
slow configuration does not hold up the others. The runs are independent: ``fn`` must not use the
engines' torch.distributed process group (the engines run different configurations at different
times, so a collective would wait for ranks that never join it, until the cluster's timeout, after
which gloo's group is broken for good).
"""
from __future__ import annotations

import dataclasses
import inspect
import linecache
import math
import numbers
import re
import types
import warnings
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import as_completed
from dataclasses import dataclass
from typing import Any

from .train import progress_bar


@dataclass
class Run:
    """One configuration's outcome. ``error`` is None when ``fn`` returned (then ``result`` is what
    it returned), else the remote traceback as text (then ``result`` is None); ``print(run.output)``
    shows what fn printed on its engine."""
    config: dict
    result: Any = None
    error: str | None = None
    seconds: float | None = None       # fn's wall time on its engine (None if it never ran)
    engine: int | None = None          # the rank of the engine that ran it
    output: str = ""                   # what fn printed there (stdout, then stderr)

    @property
    def ok(self) -> bool:
        return self.error is None


# --- on an engine ------------------------------------------------------------------------------

def _engine_threads(threads: int | None, engines_on_host: dict) -> int:
    import os
    import socket

    if threads is not None:
        return threads
    # This machine's cores shared by the engines on it (all of them for local engines): N engines
    # of cores // N threads each keep every core busy without two threads fighting for one.
    return max(1, (os.cpu_count() or 1) // max(1, engines_on_host.get(socket.gethostname(), 1)))


def _traceback_text(error: BaseException) -> str:
    """The traceback from fn down, without this module's own frame."""
    import traceback

    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename != __file__]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames),
             *traceback.format_exception_only(type(error), error)]
    return "".join(lines).rstrip("\n")


def _run_on_engine(payload: bytes, config: dict, threads: int | None, engines_on_host: dict) -> dict:
    """Run one configuration here; never raises, so every outcome comes back as a record."""
    import time

    import cloudpickle
    import torch

    try:
        fn = cloudpickle.loads(payload)
    except Exception as error:
        return dict(error=f"the function could not be loaded on the engine: {type(error).__name__}: {error}. "
                          f"Functions defined in the notebook (or inside another function) travel by value; a "
                          f"function from a module travels by name, so that module must be importable on the "
                          f"engines.")
    before = torch.get_num_threads()
    torch.set_num_threads(_engine_threads(threads, engines_on_host))
    start = time.perf_counter()
    try:
        result = fn(**config)
    except BaseException as error:  # fn may raise anything, KeyboardInterrupt from an interrupt included
        return dict(error=_traceback_text(error), seconds=time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)  # the engine's own setting (cluster.start's), for %%px cells after
    seconds = time.perf_counter() - start
    try:
        # Pickled here, so that a result that cannot travel is this configuration's error, not the sweep's.
        return dict(result=cloudpickle.dumps(result), seconds=seconds)
    except Exception as error:
        return dict(error=f"fn returned a {type(result).__name__}, which could not be sent back: "
                          f"{type(error).__name__}: {error}. Return numbers, lists, dicts or tensors.",
                    seconds=seconds)


# --- in the notebook ---------------------------------------------------------------------------

def _check(fn, configs, workers, threads_per_engine) -> list[dict]:
    if workers is None or not hasattr(workers, "client") or not hasattr(workers, "view"):
        raise ValueError("workers must be what cluster.start(n) returned (it has .client and .view); "
                         f"got {workers!r}")
    if not callable(fn):
        raise ValueError(f"fn must be a function, called as fn(**config); got a {type(fn).__name__}")
    if isinstance(configs, Mapping):
        raise ValueError("configs must be a list of dicts, one per run; got a single dict: wrap it in a list")
    configs = list(configs)
    for i, config in enumerate(configs):
        if not isinstance(config, Mapping) or not all(isinstance(key, str) for key in config):
            raise ValueError(f"configuration {i} must be a dict of keyword arguments for fn, got {config!r}")
    if threads_per_engine is not None and (not isinstance(threads_per_engine, int) or threads_per_engine < 1):
        raise ValueError(f"threads_per_engine must be a whole number >= 1 (or None: cores / engines), "
                         f"got {threads_per_engine!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the engines will tell
        signature = None
    for i, config in enumerate(configs):
        # A misspelt setting would fail on the engines anyway, after the other runs took their time.
        try:
            if signature is not None:
                signature.bind(**config)
        except TypeError as error:
            raise ValueError(f"configuration {i} {dict(config)} does not fit {fn.__name__}{signature}: {error}. "
                             f"Each configuration's keys must be the names of fn's arguments.") from None
    return [dict(config) for config in configs]


def _code_spans(fn) -> list[tuple[str, int, int, str]]:
    """(name, first line, last line, file) of fn's code, the functions and lambdas inside it, and the
    functions it calls by a global name or holds in a closure, recursively."""
    spans, seen, todo = [], set(), [fn]
    while todo:
        item = todo.pop()
        code = getattr(item, "__code__", item)
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        lines = [line for _, _, line in code.co_lines() if line is not None]
        if lines:
            spans.append((code.co_name, min(lines), max(lines), code.co_filename))
        todo += [const for const in code.co_consts if isinstance(const, types.CodeType)]
        if isinstance(item, types.FunctionType):
            todo += [item.__globals__.get(name) for name in code.co_names]
            todo += [cell.cell_contents for cell in item.__closure__ or () if _filled(cell)]
    return spans


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return False
    return True


def _with_sources(trace: str, spans) -> str:
    """Put back the file names and source lines of fn's frames: cloudpickle sends a function's code
    without them (its frames read ``File "<dynamic-code>"``), but this process still has them."""
    def restore(match):
        line, name = int(match[1]), match[2]
        for span_name, first, last, filename in spans:
            if span_name == name and first <= line <= last:
                source = linecache.getline(filename, line).strip()
                return f'File "{filename}", line {line}, in {name}' + (f"\n    {source}" if source else "")
        return match[0]

    return re.sub(r'File "<dynamic-code>", line (\d+), in (\S+)', restore, trace)


def _record(future, config: dict, workers, spans) -> Run:
    import cloudpickle

    engine = workers.rank_of_engine.get(getattr(future, "engine_id", None))
    future.wait_for_output(5)  # the engine's output travels apart from the result, and may come later
    metadata = future.metadata if isinstance(future.metadata, Mapping) else {}
    output = (metadata.get("stdout") or "") + (metadata.get("stderr") or "")
    try:
        outcome = future.get(0)
    except Exception as error:  # the engine died, or ipyparallel could not run the task at all
        return Run(config, error=f"{getattr(error, 'ename', type(error).__name__)}: "
                                 f"{getattr(error, 'evalue', error)}", engine=engine, output=output)
    if "error" in outcome:
        return Run(config, error=_with_sources(outcome["error"], spans), seconds=outcome.get("seconds"),
                   engine=engine, output=output)
    return Run(config, result=cloudpickle.loads(outcome["result"]), seconds=outcome["seconds"], engine=engine,
               output=output)


def run(fn, configs, workers, *, progress: bool = True, threads_per_engine: int | None = None) -> list[Run]:
    """Run ``fn(**config)`` for each configuration, one per engine at a time; one ``Run`` per
    configuration, in the order of ``configs`` however the engines finish.

    fn: sent by value with cloudpickle (with what it refers to in the notebook), so a function or
      closure defined in the notebook runs as it is; a function from an importable module (e.g.
      ``utils.train.train``) travels by name. Data it refers to travels once per configuration:
      for a large set, load it inside fn. fn must not use torch.distributed (see the module's
      docstring); its return value must be picklable.
    workers: what ``cluster.start(n)`` returned; every engine of it takes configurations.
    progress: a tqdm bar that advances as runs finish (and counts the failures).
    threads_per_engine: torch threads while fn runs; default cores // engines on each machine, at
      least 1, so that N engines do not oversubscribe the cores. The engine's own setting comes
      back after each run.

    A configuration whose fn raises does not stop the others: its ``Run`` holds the traceback in
    ``error`` (``table`` shows it), and a warning names each failed configuration. Interrupting
    (Ctrl-C, or the notebook's stop button) cancels the configurations not yet started; one that is
    running ends on its engine before that engine answers again.
    """
    configs = _check(fn, configs, workers, threads_per_engine)
    if not configs:
        return []
    import cloudpickle

    payload = cloudpickle.dumps(fn)  # once, not once per configuration
    spans = _code_spans(fn)
    view = workers.client.load_balanced_view(targets=list(workers.view.targets))
    engines_on_host = dict(Counter(getattr(workers, "hosts", None) or []))
    pending = [view.apply_async(_run_on_engine, payload, config, threads_per_engine, engines_on_host)
               for config in configs]
    position = {id(future): i for i, future in enumerate(pending)}
    runs: list[Run | None] = [None] * len(configs)
    bar = progress_bar(len(configs), progress, desc="sweep", unit="run", leave=True)
    failed = 0
    try:
        for future in as_completed(pending):
            i = position[id(future)]
            runs[i] = _record(future, configs[i], workers, spans)
            failed += not runs[i].ok
            if failed:
                bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)
    except KeyboardInterrupt:
        for future in pending:
            if not future.done():
                future.abort()
        raise
    finally:
        bar.close()
    if failed:
        lines = [f"  {i}: {run.config}: {run.error.splitlines()[-1]}" for i, run in enumerate(runs) if not run.ok]
        warnings.warn(f"{failed} of {len(runs)} configurations failed (their Run.error holds the traceback):\n"
                      + "\n".join(lines), stacklevel=2)
    return runs


# --- reading the results -----------------------------------------------------------------------

def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Number):
        return value
    if hasattr(value, "numel") and hasattr(value, "item") and value.numel() == 1:  # a tensor or array of one
        return value.item()
    return None


def final_metrics(result) -> dict:
    """The numbers of a result, one per name: a number as is, a list (or 1-D tensor) of numbers by
    its last element (a history's final value). A number alone is ``{"result": x}``; a dict, or a
    dataclass such as ``utils.train.History``, gives one entry per field; other values are left out."""
    if _number(result) is not None:
        return {"result": _number(result)}
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = {field.name: getattr(result, field.name) for field in dataclasses.fields(result)}
    if not isinstance(result, Mapping):
        return {}
    metrics = {}
    for name, value in result.items():
        if _number(value) is None and hasattr(value, "tolist") and getattr(value, "ndim", 0) == 1:
            value = value.tolist()
        if isinstance(value, (list, tuple)) and value:
            value = value[-1]
        if _number(value) is not None:
            metrics[str(name)] = _number(value)
    return metrics


def results(runs: list[Run]) -> list:
    """The results of a sweep, in the configurations' order; if a configuration failed, a
    RuntimeError with the table of the failed ones and the first one's whole traceback."""
    failed = [run for run in runs if not run.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(runs)} configuration(s) failed:\n{table(failed)}\n\n"
                           f"The first one's traceback:\n{failed[0].error}")
    return [run.result for run in runs]


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def table(runs: list[Run], metrics: list[str] | None = None) -> str:
    """A plain-text table, one row per run in order: its settings, its final metrics (see
    ``final_metrics``; ``metrics`` picks and orders them), its time, and for a failed run the
    error's last line (``runs[i].error`` has the whole traceback)."""
    settings = list(dict.fromkeys(key for run in runs for key in run.config))
    finals = [final_metrics(run.result) if run.ok else {} for run in runs]
    names = metrics if metrics is not None else list(dict.fromkeys(name for final in finals for name in final))
    # A result that echoes a setting gets its own column, named apart from the setting's.
    header = settings + [f"{name} (result)" if name in settings else name for name in names] + ["time (s)"] + (["error"] if any(not run.ok for run in runs) else [])
    rows = []
    for run, final in zip(runs, finals):
        row = [_cell(run.config.get(key)) for key in settings] + [_cell(final.get(name)) for name in names]
        row.append("" if run.seconds is None else f"{run.seconds:.1f}")
        if header[-1] == "error":
            row.append("" if run.ok else run.error.strip().splitlines()[-1][:80])
        rows.append(row)
    widths = [max(len(text) for text in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(text.ljust(width) for text, width in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * width for width in widths]), *map(line, rows)])

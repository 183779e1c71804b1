"""utils.px: %%px output in rank order, an error on several ranks shown once, a hint before the set-up
cell, and a cluster that leaves nothing in the IPython profile."""
from __future__ import annotations

import os
import signal
import time

import nbformat
import pytest

from server_helpers import engines_of
from utils import px
from tooling import course


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def _trace(line: int, code: list[str], ename: str, evalue: str, engine_cell: int = 2) -> str:
    """An engine's traceback as ipykernel formats it (colours included)."""
    body = "".join(f"\x1b[32m{'---->' if i == line else '     '} \x1b[39m\x1b[32m{i}\x1b[39m {text}\n"
                   for i, text in enumerate(code, 1))
    return (f"\x1b[31m{'-' * 75}\x1b[39m\n\x1b[31m{ename}\x1b[39m{' ' * 33}Traceback (most recent call last)\n"
            f"\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[{engine_cell}]\x1b[39m\x1b[32m, line {line}\x1b[39m\n"
            f"{body}\n\x1b[31m{ename}\x1b[39m: {evalue}")


def _error(rank: int, ename: str, evalue: str, trace: str):
    return (ename, evalue, trace, {"engine_id": rank})


RANKS = {engine: engine for engine in range(4)}
CODE = ["x = 1", "print(undefined_name)"]


def test_the_same_error_on_every_rank_is_shown_once_in_the_notebooks_terms():
    trace = _trace(2, CODE, "NameError", "name 'undefined_name' is not defined")
    text = px.describe_errors([_error(r, "NameError", "name 'undefined_name' is not defined", trace)
                               for r in (2, 0, 3, 1)], RANKS, ["h"] * 4, 4, cell_number=7)
    assert text.startswith("ranks 0-3 (every rank): NameError: name 'undefined_name' is not defined"), text
    assert text.count("Cell In[") == 1 and text.count("print(undefined_name)") == 1, text
    # The engine ran the cell without its %%px line, as its own cell 2: the notebook's is cell 7, line 3.
    assert "Cell In[7], line 3" in text and "----> 3 print(undefined_name)" in text and "2 x = 1" in text, text
    assert "\x1b[" not in text and "Traceback (most recent call last)" not in text


def test_errors_that_differ_are_shown_per_rank_in_rank_order():
    errors = [_error(r, "ValueError", f"rank {r} bad", _trace(1, ["raise ValueError(...)"], "ValueError", f"rank {r} bad"))
              for r in (3, 1)]
    same = _trace(2, CODE, "NameError", "oops")
    errors += [_error(r, "NameError", "oops", same) for r in (2, 0)]
    text = px.describe_errors(errors, RANKS, ["h"] * 4, 4, cell_number=5)
    heads = [line for line in text.splitlines() if line.startswith("rank")]
    assert heads == ["ranks 0 and 2: NameError: oops", "rank 1: ValueError: rank 1 bad",
                     "rank 3: ValueError: rank 3 bad"], text


def test_a_lost_engine_comes_first():
    errors = [("EngineError", "Engine 1 died while running task 'abc'", "", {}),
              _error(0, "RuntimeError", "Connection closed by peer", "")]
    text = px.describe_errors(errors, {0: 0, 1: 1}, ["a", "b"], 2)
    assert text.splitlines()[0].startswith("rank(s) [1] lost"), text
    assert "rank 1 on b: its engine died" in text and "rank 0: RuntimeError: Connection closed by peer" in text


@pytest.mark.parametrize("ranks, n, expected", [([2], 4, "rank 2"), ([0, 1], 2, "ranks 0 and 1 (every rank)"),
                                                ([0, 2, 3], 4, "ranks 0, 2 and 3"), ([4, 5, 6, 7], 8, "ranks 4-7")])
def test_rank_list(ranks, n, expected):
    assert px.rank_list(ranks, n) == expected


def test_install_keeps_an_environments_own_kernel_config(tmp_path):
    target = px.install_kernel_hook(str(tmp_path))
    assert target == tmp_path / "etc" / "ipython" / "ipython_kernel_config.py"
    assert px.HOOK_LINE in target.read_text()
    target.write_text("c = get_config()\nc.InteractiveShell.colors = 'nocolor'\n")
    px.install_kernel_hook(str(tmp_path))
    px.install_kernel_hook(str(tmp_path))
    text = target.read_text()
    assert "colors = 'nocolor'" in text and text.count(px.HOOK_LINE) == 1


CELLS = [
    "%%px\nprint(1)",                                                                # 0: before the set-up cell
    "from utils import cluster\nworkers = cluster.start(4, timeout=60)",             # 1
    "%%px\nimport time\ntime.sleep(0.4 * (3 - rank))   # rank 3 finishes first\nprint(f'rank {rank} done')",
    "%%px\nx = 1\nprint(undefined_name)",                                            # 3
    "%%px\nif rank in (1, 2):\n    raise ValueError(f'rank {rank} gave up')",       # 4
    "cluster.stop()",                                                                # 5
    "%%px\nprint(1)",                                                                # 6: after a stop
    "workers = cluster.start(2, timeout=60)",                                        # 7: left running at the end
]


def _text(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("display_data", "execute_result"):
            parts.append(out.data.get("text/plain", ""))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "".join(parts)


def test_px_in_a_kernel_and_a_profile_left_clean(tmp_path, monkeypatch):
    """The real thing: a notebook run by a kernel of the course's environment (whose kernel config
    loads utils.px: `make`'s first step installs it)."""
    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in CELLS])
    nbformat.write(nb, tmp_path / "px.ipynb")
    nb = course.execute(tmp_path / "px.ipynb", quick=True, cell_timeout=180, allow_errors=True)
    cells = nb.cells

    for index in (0, 6):
        error = [o for o in cells[index].outputs if o.output_type == "error"]
        assert error and "Run the lab's set-up cell first" in error[0].evalue, _text(cells[index])
    started = [o for o in cells[1].outputs if o.output_type == "display_data"]
    assert len(started) == 1, "one progress line, updated in place"
    assert started[0].data["text/plain"].startswith("<4 local engine(s)") and "started in" in started[0].data["text/plain"]

    printed = _text(cells[2])
    order = [printed.index(f"[stdout:{r}]") for r in range(4)]
    assert order == sorted(order), f"output must come in rank order:\n{printed}"
    assert all(printed.count(f"rank {r} done") == 1 for r in range(4)), printed

    errors = [o for o in cells[3].outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "RankError", _text(cells[3])
    shown = course._ANSI.sub("", "\n".join(errors[0].traceback))
    assert shown.count("print(undefined_name)") == 1, shown
    # The notebook's own counter and line (the %%px line is line 1), not the engine's.
    cell_ref = f"Cell In[{cells[3].execution_count}], line 3"
    assert "ranks 0-3 (every rank): NameError" in shown and cell_ref in shown, shown

    shown = course._ANSI.sub("", "\n".join(o for out in cells[4].outputs if out.output_type == "error"
                                            for o in out.traceback))
    assert "rank 1: ValueError: rank 1 gave up" in shown and "rank 2: ValueError: rank 2 gave up" in shown, shown
    assert "rank 0" not in shown and "rank 3" not in shown, shown

    # The kernel was shut down with a cluster running (cell 7): nothing of it is left, files included.
    assert not engines_of(ipython_dir), "engines outlived their kernel"
    left = [str(p.relative_to(ipython_dir)) for folder in ("security", "log")
            for p in (ipython_dir / "profile_default" / folder).glob("*")]
    assert not left, f"the cluster left files in the IPython profile: {left}"


def test_a_killed_kernel_leaves_nothing_in_the_profile(tmp_path, monkeypatch):
    from jupyter_client.manager import start_new_kernel

    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        reply = client.execute_interactive("from utils import cluster\nworkers = cluster.start(2)", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert list((ipython_dir / "profile_default" / "security").glob("*")), "connection files expected while it runs"
        os.kill(manager.provisioner.process.pid, signal.SIGKILL)
    finally:
        client.stop_channels()
    security, log = (ipython_dir / "profile_default" / name for name in ("security", "log"))
    deadline = time.monotonic() + 30
    while (list(security.glob("*")) or list(log.glob("*")) or engines_of(ipython_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engines_of(ipython_dir)
    assert not list(security.glob("*")) and not list(log.glob("*")), \
        f"left in the profile: {list(security.glob('*')) + list(log.glob('*'))}"


def test_an_interrupted_px_cell_stops_every_rank_and_says_so_once(tmp_path, monkeypatch):
    """The notebook's stop button on a %%px cell: the engines get SIGINT, the cell ends with one error
    naming every rank, and the next %%px cell runs on the same cluster."""
    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        assert client.execute_interactive("from utils import cluster\nworkers = cluster.start(2)",
                                          timeout=120)["content"]["status"] == "ok"
        outputs = []
        msg_id = client.execute("%%px\nimport time\nprint('started', flush=True)\ntime.sleep(60)")
        started, interrupted = time.monotonic(), False
        while True:
            try:
                message = client.get_iopub_msg(timeout=1)
            except Exception:
                message = None
            if not interrupted and time.monotonic() - started > 4:
                manager.interrupt_kernel()
                interrupted = True
            if message is None or message["parent_header"].get("msg_id") != msg_id:
                assert time.monotonic() - started < 40, "the interrupted cell did not end"
                continue
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
            outputs.append(message)
        errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
        assert len(errors) == 1 and errors[0]["ename"] == "RankError", outputs
        assert errors[0]["evalue"].startswith("ranks 0 and 1 (every rank): KeyboardInterrupt"), errors[0]["evalue"]
        assert time.monotonic() - started < 30, "the ranks must stop soon after the interrupt, not sleep on"
        reply = client.execute_interactive("%%px\nprint('still here', rank)", timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)

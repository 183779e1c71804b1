"""The course's ``%%px``: engines' output in rank order, and an error raised on several ranks shown once.

ipyparallel's own ``%%px`` prints each engine's output as it arrives (``[stdout:2]`` before
``[stdout:0]``) and an error once per engine, each traceback naming the engine's cell counter. The
magics registered here (by ``cluster.start``) run the cell the same way and differ only in what they
show: rank 0's output live, each further rank's once the ranks before it have finished, and errors
grouped by rank, with the notebook's own cell number and line. Before any cluster runs, ``%%px``
says which cell to run first (``load_ipython_extension``, loaded in every kernel of the course's
environment once ``python -m utils.px --install`` has run; make's first step runs it).
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ENGINE_CELL = re.compile(r"Cell In\[\d+\], line (\d+)")
_CODE_LINE = re.compile(r"^(\s*(?:-*>\s*)?)(\d+)(\s.*)?$")
POLL_S = 0.1


class RankError(RuntimeError):
    """Code run on the engines raised on one or more ranks; the message names each rank.

    IPython shows the message alone (``_render_traceback_``): the kernel's own frames, inside the
    magic, would only hide the ranks' tracebacks.
    """

    def _render_traceback_(self):
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


def rank_list(ranks: list[int], n: int | None = None) -> str:
    """'rank 2', 'ranks 0, 1 and 3', 'ranks 0-7 (every rank)'."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    every = n is not None and ranks == list(range(n))
    if len(ranks) > 3 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        text = f"ranks {ranks[0]}-{ranks[-1]}"
    else:
        text = "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
    return text + (" (every rank)" if every else "")


def _notebook_traceback(trace: str, cell_number: int | None) -> str:
    """An engine's traceback in the notebook's terms: the engine ran the cell without its ``%%px``
    line, under its own counter, so 'Cell In[2], line 3' is the notebook's 'Cell In[7], line 4'."""
    trace = _ANSI.sub("", trace or "").strip("\n")
    if cell_number is None:
        return trace
    lines, in_cell = [], False
    for line in trace.split("\n"):
        header = _ENGINE_CELL.search(line)
        if header:
            in_cell = True
            line = _ENGINE_CELL.sub(lambda m: f"Cell In[{cell_number}], line {int(m.group(1)) + 1}", line)
        elif line.startswith("File ") or (line.strip() and set(line.strip()) == {"-"}):
            in_cell = False
        elif in_cell and (code := _CODE_LINE.match(line)):
            width = len(code.group(2))
            line = f"{code.group(1)}{int(code.group(2)) + 1:>{width}}{code.group(3) or ''}"
        lines.append(line)
    # ipyparallel's banner (dashes, then the error's name and 'Traceback') says nothing the header doesn't.
    while lines and (set(lines[0].strip()) <= {"-"} or lines[0].rstrip().endswith("Traceback (most recent call last)")):
        lines.pop(0)
    return "\n".join(lines)


def describe_errors(errors, rank_of_engine: dict, hosts: list, n: int, cell_number: int | None = None) -> str:
    """One paragraph per distinct error, in rank order, each naming the ranks that raised it.

    ``errors``: ipyparallel's (ename, evalue, traceback, engine_info) tuples. An error raised
    identically on several ranks is shown once; one that differs (a rank number in its message, a
    different line) is shown per rank. Lost engines come first: the other ranks' errors (a peer
    that closed its connection) follow from them.
    """
    groups: dict[tuple, list] = {}
    lost, parts = [], []
    for ename, evalue, traceback, info in errors:
        rank = rank_of_engine.get((info or {}).get("engine_id"))
        died = re.match(r"Engine (\d+) died", str(evalue)) if ename == "EngineError" else None
        if died:  # the controller gave up on the engine (its process or its host is gone)
            rank = rank_of_engine.get(int(died.group(1)))
            lost.append(rank)
            where = f" on {hosts[rank]}" if rank is not None and rank < len(hosts) else ""
            parts.append((rank if rank is not None else n, f"rank {rank}{where}: its engine died"))
            continue
        key = (ename, str(evalue), _notebook_traceback(traceback, cell_number))
        groups.setdefault(key, []).append(rank if rank is not None else n)
    for (ename, evalue, trace), ranks in groups.items():
        known = [r for r in ranks if r < n]
        who = rank_list(known, n) if known else "an engine (it died or was stopped)"
        if len(known) < len(ranks) and known:
            who += " and an engine that died or was stopped"
        parts.append((min(ranks), f"{who}: {ename}: {evalue}" + ("\n    " + trace.replace("\n", "\n    ") if trace else "")))
    head = []
    if lost:
        known = sorted(r for r in lost if r is not None)
        head = [f"rank(s) {known} lost: their engines died or their host went away. "
                f"Restart the cluster: cluster.stop(); cluster.start(...)"]
    return "\n".join(head + [text for _, text in sorted(parts, key=lambda part: part[0])])


class RankOrderedOutput:
    """Shows an AsyncResult's output rank by rank: the current rank's as it arrives, the next rank's
    once the current one has finished and all its output has come in."""

    def __init__(self, result, labels: list):
        self.result, self.labels = result, labels
        self.current = 0
        self.shown = [{"stdout": 0, "stderr": 0, "outputs": 0} for _ in labels]
        self.last_prefix = ""

    def _print(self, text: str, prefix: str, file) -> None:
        if not text:
            return
        if prefix != self.last_prefix:
            print(prefix, file=file)  # the label on its own line, as ipyparallel does
            self.last_prefix = prefix
        print(text, end="", file=file, flush=True)

    def _show_new(self, index: int) -> None:
        from IPython import get_ipython

        md, shown, label = self.result._children[index].output.metadata, self.shown[index], self.labels[index]
        for name, file in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            text = md.get(name) or ""
            self._print(text[shown[name]:], f"[{name}:{label}]", file)
            shown[name] = len(text)
        shell = get_ipython()
        outputs = md.get("outputs") or []
        for output in outputs[shown["outputs"]:]:
            if shell is not None:
                self._print("", "", sys.stdout)
                print(f"[output:{label}]", flush=True)
                shell.display_pub.publish(data=output["data"], metadata=output.get("metadata") or {})
        shown["outputs"] = len(outputs)

    def pump(self) -> bool:
        """Show what can be shown now; True once every rank's output is complete and shown."""
        while self.current < len(self.labels):
            child = self.result._children[self.current]
            complete = child.done() and child.output.done()
            self._show_new(self.current)
            if not complete:
                return False
            self._show_execute_result(self.current)
            self.current += 1
        return True

    def _show_execute_result(self, index: int) -> None:
        from IPython import get_ipython

        execute_result = self.result._children[index].output.metadata.get("execute_result")
        shell = get_ipython()
        if execute_result and shell is not None:
            print(f"Out[{self.labels[index]}:{execute_result.get('execution_count')}]:", flush=True)
            shell.display_pub.publish(data=execute_result["data"], metadata=execute_result.get("metadata") or {})

    def wait(self, live: bool, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self.pump() if live else self.result.done() and self._outputs_complete() and self.pump()):
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def _outputs_complete(self) -> bool:
        return all(child.output.done() for child in self.result._children)


def _magics_class():
    from ipyparallel import error
    from ipyparallel.client.magics import ParallelMagics

    class CourseMagics(ParallelMagics):
        """ipyparallel's magics with the display above; ``rank_of_engine`` labels output by rank."""

        rank_of_engine: dict = {}
        hosts: list = []
        n: int = 0

        def parallel_execute(self, cell, block=None, groupby="type", save_name=None, stream_output=None,
                             progress_after=None, signal_on_interrupt=None):
            block = self.view.block if block is None else block
            if not block:
                return super().parallel_execute(cell, block=False, save_name=save_name)
            live = self.stream_output if stream_output is None else stream_output
            result = self.view.execute(cell, silent=False, block=False)
            result._fname = "%px"
            self.last_result = result
            if save_name:
                self.shell.user_ns[save_name] = result
            labels = [self.rank_of_engine.get(engine, engine) for engine in result._targets]
            shown = RankOrderedOutput(result, labels)
            try:
                shown.wait(live)
            except KeyboardInterrupt:
                signal = signal_on_interrupt or self.signal_on_interrupt
                print(f"Interrupted: sending {signal} to the engines", file=sys.stderr)
                self.view.client.send_signal(signal, targets=result._targets, block=True)
                shown.wait(live=True, timeout=10)
            try:
                result.get(timeout=0)
            except error.CompositeError as failure:
                # IPython counts the running cell before running it (ipykernel replies count - 1).
                raise RankError(describe_errors(failure.elist, self.rank_of_engine, self.hosts, self.n,
                                                self.shell.execution_count - 1)) from None
            except TimeoutError:
                raise RankError("the engines did not finish after the interrupt: restart the cluster "
                                "(cluster.stop(); cluster.start(...))") from None

    return CourseMagics


def activate(workers) -> None:
    """Register ``%%px``, ``%px``, ``%autopx``, ``%pxresult`` and ``%pxconfig`` for ``workers``."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    magics = _magics_class()(shell, workers.view)
    magics.rank_of_engine, magics.hosts, magics.n = dict(workers.rank_of_engine), list(workers.hosts), workers.n
    shell.magics_manager.register(magics)


SETUP_HINT = ("%%px runs a cell on the cluster's engines, and none is running in this kernel (a new or "
              "restarted kernel starts without one). Run the lab's set-up cell first: the one that calls "
              "cluster.start(...).")


class NoClusterError(RankError):
    """``%%px`` before any cluster runs. An error (not IPython's UsageError, printed as text) so
    that "Run All" stops there."""


def install_placeholder(shell) -> None:
    """``%%px`` and ``%px`` that say which cell to run, until ``cluster.start`` registers the real ones."""
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    @magics_class
    class NoCluster(Magics):
        @line_magic
        def px(self, line=""):
            raise NoClusterError(SETUP_HINT.replace("%%px", "%px"))

        @cell_magic("px")
        def cell_px(self, line="", cell=None):
            raise NoClusterError(SETUP_HINT)

    shell.magics_manager.register(NoCluster(shell))


def load_ipython_extension(shell) -> None:
    if "px" not in shell.magics_manager.magics["cell"]:
        install_placeholder(shell)


HOOK = Path(__file__).parent / "etc" / "ipython_kernel_config.py"
HOOK_LINE = 'c.InteractiveShellApp.extensions.append("utils.px")'


def install_kernel_hook(prefix: str = sys.prefix) -> Path:
    """Make every kernel of the environment at ``prefix`` load this module (IPython reads
    ``<prefix>/etc/ipython/``). An existing config of the environment's own is kept, with our line added."""
    target = Path(prefix) / "etc" / "ipython" / "ipython_kernel_config.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.write_text(HOOK.read_text())
    elif HOOK_LINE not in target.read_text():
        with target.open("a") as config:
            config.write(f"\n# The course's %%px hint (utils/px.py):\n{HOOK_LINE}\n")
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python -m utils.px --install   (every kernel of this environment loads utils.px)")
    print(f"%%px hint for kernels of this environment: {install_kernel_hook()}")

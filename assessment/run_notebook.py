"""Executes a restored submission inside the sandbox and records, cell by cell, what happened.

    python -m assessment.run_notebook IN.ipynb OUT.ipynb CELL_TIMEOUT_S

Every cell runs, even after one fails, as nbgrader does: a failing check must not cost the run that
counts. The run's own facts (completed or why not, each cell's seconds, output bytes dropped) go into
OUT.ipynb's metadata (``course_run``) and the exit status (0: every cell ran); the grader derives its
report from those and from the cells' error outputs. Outputs are capped, display updates included: a
cell that prints without end fills OUT.ipynb with at most ``OUTPUT_CAP`` bytes, not the grader's memory.

Inside the grader's sandbox (its supervisor, PID 1, is this process's parent) the runner makes itself
non-dumpable, so the learner's processes (same uid) can neither trace it nor open its files, and
before it writes OUT.ipynb it ends every other process of the sandbox: what the grader gets back is
what the run produced, not what a process left behind rewrote afterwards.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from assessment import supervised
from tooling.course import notebook_client

OUTPUT_CAP = 2 << 20  # bytes of outputs kept per notebook
EXIT_INCOMPLETE = 3   # some cell never ran (a cell timed out, the kernel died, the runner failed)


class CappedClient(NotebookClient):
    """A notebook client that keeps at most OUTPUT_CAP bytes of outputs and times every cell."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept, self.dropped, self.cells = 0, 0, []

    def _room_for(self, msg, copies: int = 1) -> bool:
        size = len(json.dumps(msg.get("content", {}))) * copies
        if self.kept + size > OUTPUT_CAP:
            self.dropped += size
            return False
        self.kept += size
        return True

    def output(self, outs, msg, display_id, cell_index):
        return super().output(outs, msg, display_id, cell_index) if self._room_for(msg) else None

    def _update_display_id(self, display_id, msg):
        # An update rewrites every output shown under its display id: each copy counts against the cap.
        copies = sum(len(indices) for indices in self._display_id_map.get(display_id, {}).values())
        if self._room_for(msg, max(copies, 1)):
            super()._update_display_id(display_id, msg)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        start = time.monotonic()
        record = {"id": cell.get("id"), "index": cell_index}
        self.cells.append(record)
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            record["seconds"] = round(time.monotonic() - start, 3)


def main(argv=None) -> int:
    source, target, cell_timeout = (argv or sys.argv[1:])[:3]
    supervised.protect()   # in the grader's sandbox: the kernel (same uid) cannot trace this runner
    supervised.forget_working_folder()
    nb = nbformat.read(source, as_version=4)
    client = notebook_client(nb, Path("."), cell_timeout=int(cell_timeout), allow_errors=True, client_class=CappedClient)
    run = {"completed": False, "error": None}
    try:
        client.execute(cleanup_kc=True)
        run["completed"] = True
    except CellTimeoutError:
        run["error"] = {"kind": "timeout", "message": f"a cell ran longer than {cell_timeout} s"}
    except DeadKernelError:
        run["error"] = {"kind": "dead_kernel", "message": "the kernel died (a cell exited the process or crashed it)"}
    except Exception as error:  # the grader must learn why, whatever it was
        run["error"] = {"kind": "runner", "message": f"{type(error).__name__}: {error}"[:500]}
    if run["error"] and client.cells:
        run["error"]["cell"] = client.cells[-1]["id"]
    run["cells"], run["dropped_output_bytes"] = client.cells, client.dropped
    supervised.end_other_processes()   # in the grader's sandbox: nothing left running rewrites OUT.ipynb
    nb.metadata["course_run"] = run
    nbformat.write(nb, target)
    return 0 if run["completed"] else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())

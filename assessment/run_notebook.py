"""Executes a restored submission inside the sandbox and records, cell by cell, what happened.

    python -m assessment.run_notebook IN.ipynb OUT.ipynb STATUS.json CELL_TIMEOUT_S

Every cell runs, even after one fails, as nbgrader does: a failing check must not cost the run that
counts. STATUS.json lists every cell that ran (id, seconds) and the cells that failed; it runs inside
the sandbox, so the grader takes it as the learner's own report, for the feedback's notes only (no
point and no time budget depends on it). Outputs are capped, display updates included: a cell that
prints without end fills OUT.ipynb with at most ``OUTPUT_CAP`` bytes, not the grader's memory.
"""
from __future__ import annotations

import json
import re
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from utils.course import project_kernel_manager

OUTPUT_CAP = 2 << 20  # bytes of outputs kept per notebook


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


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _error_message(cell, error) -> str:
    """The error in words; for a %%px cell, the engines' own error (utils.px's RankError names the ranks)."""
    if error.get("ename") == "RankError":
        first = (_ANSI.sub("", str(error.get("evalue") or "")).splitlines() or [""])[0]
        return f"(on the engines) {first}"[:300]
    return f"{error.get('ename')}: {error.get('evalue')}"[:300]


def main(argv=None) -> None:
    source, target, status_file, cell_timeout = (argv or sys.argv[1:])[:4]
    nb = nbformat.read(source, as_version=4)
    client = CappedClient(nb, km=project_kernel_manager(), timeout=int(cell_timeout), allow_errors=True,
                          resources={"metadata": {"path": "."}})
    status = {"completed": False, "error": None}
    try:
        client.execute(cleanup_kc=True)
        status["completed"] = True
    except CellTimeoutError:
        status["error"] = {"kind": "timeout", "message": f"a cell ran longer than {cell_timeout} s"}
    except DeadKernelError:
        status["error"] = {"kind": "dead_kernel", "message": "the kernel died (a cell exited the process or crashed it)"}
    except Exception as error:  # the grader must learn why, whatever it was
        status["error"] = {"kind": "runner", "message": f"{type(error).__name__}: {error}"[:500]}
    if status["error"] and client.cells:
        status["error"]["cell"] = client.cells[-1]["id"]
    status["cells"], status["dropped_output_bytes"] = client.cells, client.dropped
    # Every cell runs even after one fails (a wrong check must not cost the run that counts);
    # the errors are listed for the feedback.
    status["cell_errors"] = [{"cell": cell.get("id"), "message": _error_message(cell, out)}
                             for cell in nb.cells if cell.cell_type == "code"
                             for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    nbformat.write(nb, target)
    with open(status_file, "w") as f:
        json.dump(status, f)


if __name__ == "__main__":
    main()

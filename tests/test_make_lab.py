"""`make lab` serves the learner copies in a workspace through JupyterLab."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from notebook_runner import ROOT
from server_helpers import free_port, stop_group
from tooling import release


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_make_lab_serves_the_workspace_and_keeps_learner_files(tmp_path):
    workspace = tmp_path / "workspace"
    (workspace / "labs").mkdir(parents=True)
    first = next(p for p in release.source_notebooks() if p.parent.name == "labs").relative_to(ROOT)
    (workspace / first).write_text("{}")  # a learner's file: must survive `make lab`
    port, token = free_port(), "course-test-token"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token}"
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"WORKSPACE={workspace}", f"LAB_ARGS={args}"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline, listing = time.monotonic() + 180, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                listing = _get(f"http://127.0.0.1:{port}/api/contents/labs?token={token}")
                break
            except OSError:
                time.sleep(1)
        assert listing is not None, f"JupyterLab did not answer on port {port}:\n{server.stdout.read() if server.poll() is not None else ''}"
        served = {item["path"] for item in listing["content"]}
        expected = {str(p.relative_to(ROOT)) for p in release.source_notebooks() if p.parent.name == "labs"}
        assert expected <= served
        assert (workspace / first).read_text() == "{}"
        learner = json.loads((workspace / str(sorted(expected)[-1])).read_text())
        assert "BEGIN SOLUTION" not in json.dumps(learner)
    finally:
        stop_group(server)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _get(f"http://127.0.0.1:{port}/api/contents?token={token}")
        except OSError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("JupyterLab still answers after being stopped")

"""A learner's JupyterLab in a real browser: the set-up cell, a %%px cell, an error on every rank, a
restart. Playwright drives the system's Chromium (.ci/setup/20-browser.sh installs it; no browser is
downloaded); the test skips, saying why, where Chromium is missing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from notebook_runner import ROOT
from server_helpers import engines_of, free_port, stop_group
from tooling import release

sys.path.insert(0, str(ROOT))
from slides.chromium import INSTALL_HINT, find_chromium  # noqa: E402

pytestmark = [pytest.mark.timeout(420),
              pytest.mark.skipif(find_chromium() is None, reason=f"no Chromium for the browser test: {INSTALL_HINT}")]

LAB = "labs/03_collectives.ipynb"
IDLE = '.jp-Notebook-ExecutionIndicator[data-status="idle"]'
TOKEN = "course-browser-test"
# What ipyparallel used to print into the server's terminal on every stop or restart.
TERMINAL_NOISE = ("Output for", "Stopping cluster", "received signal", "KeyboardInterrupt", "Event loop stopped",
                  "Traceback")


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a workspace with the learner editions, in quick mode, logging to a file."""
    workspace, ipython_dir, log = tmp_path / "workspace", tmp_path / "ipython", tmp_path / "server.log"
    release.fill_workspace(workspace)
    port = free_port()
    env = {**os.environ, "COURSE_QUICK": "1", "IPYTHONDIR": str(ipython_dir)}
    command = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={TOKEN}", f"--notebook-dir={workspace}",
               "--ServerApp.open_browser=False"] + (["--allow-root"] if os.geteuid() == 0 else [])
    with open(log, "w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=5)
                break
            except OSError:
                assert server.poll() is None, log.read_text()[-3000:]
                time.sleep(1)
        yield url, ipython_dir, log
    finally:
        stop_group(server)


def _run_and_wait(page, cell, timeout_s: float = 180) -> None:
    """Select ``cell``, Shift+Enter, and wait until its prompt shows a number, not [*].

    JupyterLab may still be swapping kernels when the page first says idle (it sometimes starts two
    for one notebook and shuts one down): a run request that never reached a kernel leaves the
    prompt at [ ], and is sent again after a minute, and only while the kernel is idle. On a loaded
    machine a request can wait more than 15 s before the page shows [*] for it; sending it again then
    ran the set-up cell twice ("already running")."""
    prompt = cell.locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog")
        if dialog.count():   # on a loaded machine JupyterLab once asked for a kernel here, and the dialog took every click
            text = dialog.first.inner_text()
            assert "kernel" in text.lower(), f"JupyterLab showed a dialog: {text[:1000]}"
            page.locator(".jp-Dialog .jp-mod-accept").first.click()   # its default: the notebook's own kernel
            continue
        prompt.click()
        page.keyboard.press("Shift+Enter")
        resend = time.monotonic() + 60
        while (time.monotonic() < min(deadline, resend) or prompt.inner_text().strip() == "[*]:"
               or not page.locator(IDLE).count()):
            if re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
    raise AssertionError(f"the cell did not finish within {timeout_s:g} s: {cell.inner_text()[-2000:]}")


def test_setup_px_one_error_and_restart_in_a_real_browser(jupyterlab):
    from playwright.sync_api import sync_playwright

    url, ipython_dir, log = jupyterlab
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=find_chromium(),
                                             args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/lab/tree/{LAB}?token={TOKEN}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector(IDLE, state="attached", timeout=120_000)   # the kernel is up
            cells = page.locator(".jp-Notebook .jp-CodeCell")   # the setup and %%px cells are adjacent
            cells.filter(has_text="cluster.start(").first.wait_for(timeout=120_000)   # cells render lazily
            setup = page.evaluate("""() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell'))
                                       .findIndex(cell => cell.textContent.includes('cluster.start('))""")
            px_cell = setup + 1

            _run_and_wait(page, cells.nth(setup))
            summary = cells.nth(setup).locator(".jp-OutputArea").inner_text()
            assert "local engine(s)" in summary and "started in" in summary, summary

            _run_and_wait(page, cells.nth(px_cell))
            printed = cells.nth(px_cell).locator(".jp-OutputArea").inner_text()
            ranks = re.findall(r"^rank (\d+) of (\d+)", printed, re.MULTILINE)
            world = int(ranks[0][1]) if ranks else 0
            assert [int(r) for r, _ in ranks] == list(range(world)) and world >= 3, \
                f"one line per rank, in rank order:\n{printed}"

            # A new cell right after the %%px cell, failing the same way on every rank: one error.
            cells.nth(px_cell).locator(".jp-InputPrompt").click()
            page.keyboard.press("b")
            page.keyboard.press("Enter")
            page.keyboard.type("%%px\nprint(undefined_name)")
            failing = cells.nth(px_cell + 1)
            _run_and_wait(page, failing)
            shown = failing.locator(".jp-OutputArea").inner_text()
            assert shown.count("every rank") == 1 and shown.count("print(undefined_name)") == 1, shown
            assert f"ranks 0-{world - 1} (every rank): NameError" in shown or "ranks 0, 1 and 2 (every rank)" in shown, shown
            assert engines_of(ipython_dir), "the engines should be running before the restart"

            before_restart = len(log.read_text(errors="replace"))
            page.keyboard.press("Escape")
            page.get_by_text("Kernel", exact=True).first.click()
            page.get_by_text("Restart Kernel…", exact=True).first.click()
            page.locator(".jp-Dialog .jp-mod-accept").click()
            deadline = time.monotonic() + 30
            while engines_of(ipython_dir) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not engines_of(ipython_dir), "engines outlived the restarted kernel"
            page.wait_for_selector(IDLE, state="attached", timeout=60_000)
        finally:
            browser.close()
    profile = ipython_dir / "profile_default"
    left = [str(p) for folder in ("security", "log") for p in (profile / folder).glob("*")]
    assert not left, f"the restart left files in the IPython profile: {left}"
    terminal = log.read_text(errors="replace")
    assert "_jupyter_server_extension_paths" not in terminal, "ipyparallel's server extension warns at start"
    # From the restart on (JupyterLab itself sometimes starts and ends a spare kernel when a notebook opens).
    noise = [line for line in terminal[before_restart:].splitlines() if any(word in line for word in TERMINAL_NOISE)
             and "ServerApp] received signal" not in line]   # the fixture's own stop of the server
    assert not noise, "the server's terminal should stay quiet on a restart:\n" + "\n".join(noise[:20])

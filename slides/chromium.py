"""Headless Chromium driven over the DevTools protocol on a pipe (no extra package, no open port).

The slide build prints each deck's print view to PDF with it, and the tests open the decks and the
course index in it and record every request, console message and exception.

    with Browser() as browser:
        page = browser.new_page()
        page.goto("file:///.../deck.html")
        page.wait_for("Reveal.isReady()")
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

# Debian's /usr/bin/chromium is a shell wrapper; the binary behind it starts with less noise.
CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome", "chrome")
INSTALL_HINT = ("install Chromium: `sudo apt-get install chromium` (Debian/Ubuntu), or run "
                "`bash .ci/setup/20-browser.sh` as root; or set CHROMIUM=/path/to/chrome")


def find_chromium() -> str | None:
    """The Chromium (or Chrome) executable: $CHROMIUM, else the first candidate found."""
    if os.environ.get("CHROMIUM"):
        chosen = shutil.which(os.environ["CHROMIUM"])
        return chosen if chosen and os.access(chosen, os.X_OK) else None
    for name in CANDIDATES:
        found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium process; ``close()`` (or leaving the ``with`` block) ends it."""

    def __init__(self, executable: str | None = None, timeout: float = 60):
        executable = executable or find_chromium()
        if executable is None:
            raise BrowserError(f"no Chromium found: {INSTALL_HINT}")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="course-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4: move our ends out of the way first.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)

        def child_fds():
            os.dup2(moved[0], 3)
            os.dup2(moved[1], 4)

        args = [executable, "--headless", "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--allow-file-access-from-files"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")          # Chromium refuses to run its sandbox as root
        self.process = subprocess.Popen(args + ["about:blank"], preexec_fn=child_fds, pass_fds=(3, 4),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        for fd in moved:
            os.close(fd)
        self._next_id = 0
        self._answers: dict[int, dict] = {}
        self.events: list[dict] = []
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.send("Target.setDiscoverTargets", {"discover": False})

    def _read_loop(self):
        buffer = b""
        while True:
            try:
                chunk = os.read(self._read, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._lock:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self.events.append(message)
                self._lock.notify_all()

    _closed = False

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._lock:
            while ident not in self._answers:
                if self._closed:
                    raise BrowserError(f"Chromium exited while answering {method}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"Chromium did not answer {method} within {timeout or self.timeout} s")
                self._lock.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message')}")
        return answer.get("result", {})

    def attach(self, target: str) -> "Page":
        """A Page for an existing target (a window the page opened, such as the speaker view)."""
        return Page(self, self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"])

    def windows(self) -> list[dict]:
        """Every open page: ``targetId``, ``title`` and ``url``."""
        return [t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"]

    def new_page(self, width: int = 1280, height: int = 720) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        page = self.attach(target)
        for domain in ("Page", "Runtime", "Network", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self):
        if self.process.poll() is None:
            try:
                self.send("Browser.close", timeout=10)
            except BrowserError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Page:
    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session
        self._first_event = len(browser.events)

    def send(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def events(self, method: str | None = None) -> list[dict]:
        """This page's events since it opened (or since ``goto``), optionally of one method."""
        with self.browser._lock:
            mine = [e for e in self.browser.events[self._first_event:] if e.get("sessionId") == self.session]
        return [e for e in mine if method is None or e["method"] == method]

    def goto(self, url: str, timeout: float = 30):
        self._first_event = len(self.browser.events)
        self.send("Page.navigate", {"url": url})
        self.wait(lambda: self.events("Page.loadEventFired"), timeout, f"{url} did not finish loading")

    def wait(self, condition, timeout: float, message: str):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise BrowserError(f"{message} within {timeout} s")
            time.sleep(0.05)

    def evaluate(self, expression: str, user_gesture: bool = False):
        """The value of ``expression`` in the page; ``user_gesture`` lets it open a window, as a key press would."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": user_gesture})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails'].get('text')} "
                               f"{result['exceptionDetails'].get('exception', {}).get('description', '')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30):
        """Wait until ``expression`` is truthy in the page; return its value."""
        values = []
        self.wait(lambda: values.append(self.evaluate(expression)) or values[-1], timeout,
                  f"{expression!r} did not become true")
        return values[-1]

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events("Network.requestWillBeSent")]

    def failed_requests(self) -> list[str]:
        ids = {e["params"]["requestId"]: e["params"]["request"]["url"]
               for e in self.events("Network.requestWillBeSent")}
        return [f"{ids.get(e['params']['requestId'], '?')}: {e['params'].get('errorText')}"
                for e in self.events("Network.loadingFailed")]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (a missing file, a blocked fetch)."""
        found = [" ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"])
                 for e in self.events("Runtime.consoleAPICalled") if e["params"]["type"] in ("error", "assert")]
        found += [e["params"]["exceptionDetails"].get("exception", {}).get("description")
                  or e["params"]["exceptionDetails"].get("text", "") for e in self.events("Runtime.exceptionThrown")]
        found += [f"{e['params']['entry'].get('url', '')}: {e['params']['entry']['text']}"
                  for e in self.events("Log.entryAdded") if e["params"]["entry"]["level"] == "error"]
        return found

    def screenshot(self) -> bytes:
        return base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])

    def pdf(self) -> bytes:
        """The page printed with its own CSS page size (reveal.js's print view sets one per slide)."""
        result = self.send("Page.printToPDF", {"preferCSSPageSize": True, "printBackground": True,
                                               "displayHeaderFooter": False}, timeout=120)
        return base64.b64decode(result["data"])

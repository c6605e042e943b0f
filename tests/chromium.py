"""A page in headless Chromium through the DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON
messages ended by NUL on file descriptors 3 and 4), with the standard library only.

``load(url)`` opens the page and returns what a reviewer would look for: console errors (console.error, uncaught
exceptions, browser log entries at level error, such as a Content-Security-Policy refusal), every request the
page made (data: URLs aside: they are the page's own bytes), the answer of a JavaScript expression evaluated on the loaded DOM, and a PNG screenshot.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time

BINARY = "/usr/bin/chromium"


def find() -> str | None:
    return BINARY if os.access(BINARY, os.X_OK) else shutil.which("chromium")


def browser_or_skip(**size) -> "Browser":
    """A started Browser (``size``: width, height), or the calling test skipped naming what is missing: failed
    instead under BENCH_REQUIRE_CHROMIUM=1 (.ci/run), where the browser test must run."""
    import pytest

    binary = find()
    if binary is None:
        why = "chromium not found at /usr/bin/chromium (apt-get install chromium)"
        if os.environ.get("BENCH_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"{why}, and BENCH_REQUIRE_CHROMIUM=1")
        pytest.skip(why)
    return Browser(binary, **size)


class Browser:
    def __init__(self, binary: str, width: int = 1400, height: int = 3000):
        self.profile = tempfile.mkdtemp(prefix="bench-chromium-")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()

        def fds():  # the protocol's fixed descriptors in the child: 3 reads commands, 4 writes answers
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]  # never clobber each other
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--disable-extensions", "--disable-background-networking", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._buf, self._id, self.events = b"", 0, []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))

    def load(self, url: str, expression: str = "null") -> dict:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        s = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=s)
        self.events.clear()
        self.send("Page.navigate", session=s, url=url)
        self.wait_for("Page.loadEventFired")
        value = self.send("Runtime.evaluate", session=s, expression=expression, returnByValue=True)
        shot = self.send("Page.captureScreenshot", session=s, format="png")["data"]
        time.sleep(0.2)  # late log entries (a refused load) arrive just after the load event
        self.send("Runtime.evaluate", session=s, expression="0")
        mine = [e for e in self.events if e.get("sessionId") == s]
        self.send("Target.closeTarget", targetId=target)
        urls = [e["params"]["request"]["url"] for e in mine if e.get("method") == "Network.requestWillBeSent"]
        return {"errors": console_errors(mine), "requests": [u[:120] for u in urls if not u.startswith("data:")],
                "value": value["result"].get("value"), "screenshot": base64.b64decode(shot)}

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)


def console_errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif e.get("method") == "Runtime.exceptionThrown":
            out.append("exception: " + p["exceptionDetails"].get("text", ""))
        elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
    return out

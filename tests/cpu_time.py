"""Where `make test`'s CPU goes, printed at the end of every pytest run (tests/conftest.py calls this module).

On a 2-core machine the suite is CPU-bound (most of its CPU is rank processes importing torch), so wall time alone
says little: the same code took 541 and 978 s of pytest on one VM within a day. Two readings make a run judgeable:

- ``calibrate()``: before the tests start, the CPU time and wall time of ``import torch`` in a fresh process, the
  unit every rank, launcher and ``python -m bench`` pays (1.9 s of CPU, user and system, on this project's 2-core VM
  when quiet). A slow hour shows there, in a run's own log, instead of in a guess about the machine.
- ``measure(item)``: each test's CPU time, set-up and teardown included, in its pytest process and in every process
  that process waited for (the launches' harness, launchers and ranks: ``RUSAGE_CHILDREN`` counts a process once its
  parent has reaped it, all the way down), written one JSON line per test into the session's folder; ``summary`` adds
  the workers' lines up per module: the CPU, the wall time, and how many cores the run kept busy.

A process nobody reaped (killed and left to init) is not counted: the figures are a floor.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def measure(nodeid: str, folder: Path):
    """Appends ``{"test", "start", "wall", "cpu"}`` for the test run inside, to ``folder/<pid>.jsonl``."""
    start, cpu = time.time(), _cpu()
    try:
        yield
    finally:
        line = {"test": nodeid, "start": start, "wall": time.time() - start, "cpu": _cpu() - cpu}
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")


def calibrate() -> dict:
    """``import torch`` in a fresh interpreter: its CPU time (user + system) and wall time, in seconds. Called before
    the tests start, when this process has no other child to reap."""
    start, cpu = time.monotonic(), _cpu()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return {"cpu": _cpu() - cpu, "wall": time.monotonic() - start}


def summary(folder: Path, calibration: dict | None = None, top: int = 10) -> list[str]:
    """The lines `make test` prints: the calibration, the run's CPU against its wall time, and the ``top`` modules
    by CPU time (module: CPU, wall summed over its tests, tests)."""
    lines = []
    if calibration is not None:
        lines.append(f"this machine: a fresh `import torch` took {calibration['cpu']:.2f} s of CPU, "
                     f"{calibration['wall']:.2f} s of wall time, before the tests")
    by_worker = [[json.loads(ln) for ln in f.read_text().splitlines() if ln]
                 for f in sorted(Path(folder).glob("*.jsonl"))]
    tests = [t for worker in by_worker for t in worker]
    if not tests:
        return lines
    span = max(t["start"] + t["wall"] for t in tests) - min(t["start"] for t in tests)
    cpu = sum(t["cpu"] for t in tests)
    lines.append(f"CPU time: {cpu:,.0f} s in {span:,.0f} s of wall time ({cpu / span:.2f} cores busy on average; the "
                 f"tests' own processes and those they reaped)")
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for t in tests:
        m = modules[t["test"].split("::")[0]]
        m[0], m[1], m[2] = m[0] + t["cpu"], m[1] + t["wall"], m[2] + 1
    for name, (c, w, n) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{c:8.1f} s CPU {w:8.1f} s wall {n:4d} tests  {name}")
    return lines + _workers([w for w in by_worker if w], min(t["start"] for t in tests))


def _workers(by_worker: list[list[dict]], began: float) -> list[str]:
    """Under xdist, a line per worker (one file each): when its last test ended, counted from the run's first test,
    and what that test was. A worker that ends long before the other idled while the run went on."""
    ends = []
    for tests in by_worker:
        last = max(tests, key=lambda t: t["start"] + t["wall"])
        ends.append((last["start"] + last["wall"] - began, len(tests), sum(t["cpu"] for t in tests), last))
    if len(ends) < 2:
        return []
    return [f"worker {i}: {n} tests, {cpu:,.0f} s CPU, its last test ended at {end:,.0f} s "
            f"({last['test']}, {last['wall']:.1f} s)"
            for i, (end, n, cpu, last) in enumerate(sorted(ends, key=lambda e: e[0]), 1)]

"""The measured matmul peak (``bench peak``, and the first run of a sweep that finds none): its cache and record
vocabulary. No torch here; the measurement is bench/rank/peak.py.

A datasheet's dense peak is a rate no kernel sustains (a large bf16 matmul on an H100 SXM reaches roughly 80% of its
989 TFLOP/s), so every record also gives MFU against what this device, this software and this precision mode were
measured to sustain: the largest rate over a small sweep of large matrix multiplications, each shape warmed up, then
timed in batches of iterations, the best batch kept (as ml-engineering's maximum-achievable-matmul-FLOPS finder
does). On the CPU the same measurement of the CPU's own rate, at the run's threads per rank, gives CPU records an MFU
too.

One entry per (machine, device, torch, CUDA, precision, TF32 mode, threads on the CPU) in the cache directory
(``BENCH_PEAK_CACHE``, else ``$XDG_CACHE_HOME/torch-parallel-bench/peak``, else ``~/.cache/...``): measured once,
reused by every later run and sweep of any checkout on this machine, re-measured by ``--refresh-peak`` (``bench run``,
``bench tune``, ``bench peak``). The machine (its host name) is part of the key: a home directory shared by several
machines (a cluster's) holds each one's own entries.

Each entry stores the load it was measured under (``load``: the load average before, the share of the CPUs other
processes used while it ran, and whether that disturbed it, judged as a run is: bench/core/trust.py). A rate measured
beside other work reads low, and every MFU against it high: a run that uses such an entry says so, once per sweep, in
one ``warning:`` line, its record carries the load, and the report marks its MFU; ``--refresh-peak`` on a quiet
machine measures it again. A record names the entry it used and when it was measured.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from bench.core.results import user_cache_dir

PEAK_SCHEMA = "peak-1"
PRECISIONS = ("fp32", "bf16", "fp16")


def cache_dir() -> Path:
    return user_cache_dir("peak", "BENCH_PEAK_CACHE")


def mode(precision: str, tf32: bool | None) -> str:
    """The precision mode a peak is for: ``bf16``, ``fp32 (TF32 on)``, ``fp32 (TF32 off)``, or ``fp32`` on a CPU."""
    if precision != "fp32" or tf32 is None:
        return precision
    return f"fp32 (TF32 {'on' if tf32 else 'off'})"


def key(device_type: str, device_name: str, torch_version: str, cuda_version: str | None, precision: str,
        tf32: bool | None, threads: int | None, machine: str | None = None) -> dict:
    """What a measured peak depends on: the machine (default: this host's name), the device, the software, the
    precision mode and, on the CPU, the threads."""
    return {"machine": machine or socket.gethostname(), "device_type": device_type, "device_name": device_name,
            "torch": torch_version, "cuda": cuda_version, "precision": precision,
            "tf32": tf32 if device_type == "cuda" and precision == "fp32" else None,
            "threads": threads if device_type == "cpu" else None}


def entry_path(k: dict, directory: Path | None = None) -> Path:
    """The cache file of a key: every part of it in the name, readable."""
    parts = [k["machine"], k["device_name"], f"torch{k['torch']}", f"cuda{k['cuda']}" if k["cuda"] else "nocuda",
             mode(k["precision"], k["tf32"]), f"{k['threads']}threads" if k["threads"] else ""]
    name = re.sub(r"[^A-Za-z0-9.+]+", "-", "-".join(p for p in parts if p)).strip("-")
    return (directory or cache_dir()) / f"{name}.json"


def read(k: dict, directory: Path | None = None) -> dict | None:
    """The cached entry of a key, with its path as ``cache``; None when absent, unreadable or for another key."""
    path = entry_path(k, directory)
    try:
        entry = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(entry, dict) or entry.get("schema") != PEAK_SCHEMA or entry.get("key") != k:
        return None
    return {**entry, "cache": str(path)}


def stale(entry: dict | None, since: str | None) -> bool:
    """Whether an entry must be measured (again): none yet, or measured before ``since`` (a refresh's start, ISO)."""
    return entry is None or (since is not None and str(entry.get("measured_at")) < since)


def record_fields(entry: dict | None, why: str | None = None) -> dict:
    """What a run's record says of the measured peak it used (``peak_measured``): the rate, the entry, its date, the
    mode, the shape that reached it and the load it was measured under."""
    if entry is None:
        return {"tflops": None, "reason": why or "not measured"}
    return {"tflops": entry["tflops"], "cache": entry.get("cache"), "measured_at": entry["measured_at"],
            "measured_now": bool(entry.get("measured_now")), "mode": mode(entry["key"]["precision"], entry["key"]["tf32"]),
            "shape": entry.get("best_shape"), "threads": entry["key"]["threads"], "device_name": entry["key"]["device_name"],
            "machine": entry["key"].get("machine"), "load_average": entry.get("load_average"), "cpus": entry.get("cpus"),
            "load": entry.get("load"), "how": entry.get("how")}


def _busy_seconds(cpus: list[int]) -> float | None:
    """Busy CPU seconds of ``cpus`` since boot, every process's (steal included), from /proc/stat; None without it."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    busy, ticks = 0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for line in lines:
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in vals[:8]] + [0] * (8 - len(vals[:8]))
        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user, nice, system, irq, softirq, steal
    return busy / ticks


def load_probe(device_type: str):
    """Start watching the machine; the returned function, called when the measurement is done, gives the load it ran
    under: ``load_average_before`` (1, 5, 15 minutes), ``others_cpu_share`` and ``others_cpu_cores`` (the CPU time of
    every process but this one over the span, of the CPUs this process may use), ``cpus``, ``seconds``, ``disturbed``
    and ``reason`` (bench/core/trust.py's rule for a run's timed windows)."""
    from bench.core import trust

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    before, t0, own0, busy0 = list(os.getloadavg()), time.monotonic(), time.process_time(), _busy_seconds(cpus)

    def done() -> dict:
        span, own = time.monotonic() - t0, time.process_time() - own0
        busy1 = _busy_seconds(cpus)
        part = None
        if busy0 is not None and busy1 is not None and span > 0:
            others = max(0.0, busy1 - busy0 - own)
            part = {"others_cpu_share": others / (len(cpus) * span), "others_cpu_cores": others / span}
        reason = trust.cpu_reason(part, len(cpus), device_type, "the measurement")
        return {"load_average_before": [round(x, 2) for x in before], "cpus": len(cpus), "seconds": round(span, 2),
                "others_cpu_share": None if part is None else round(part["others_cpu_share"], 4),
                "others_cpu_cores": None if part is None else round(part["others_cpu_cores"], 3),
                "disturbed": bool(reason), "reason": reason}

    return done


def under_load(measured: dict | None) -> str | None:
    """What the machine was doing when a peak was measured, where it was loaded (other processes used the CPUs while it
    ran; an entry of an earlier version: its load average was above the CPUs); None for a quiet measurement."""
    measured = measured or {}
    load = measured.get("load") or {}
    if load:
        return load.get("reason") if load.get("disturbed") else None
    average, cpus = measured.get("load_average"), measured.get("cpus")
    if average is None or not cpus or average <= cpus:
        return None
    return f"the load average was {average:.1f} on {cpus} CPUs"


def busy(measured: dict | None) -> str | None:
    """Why a measured peak may read low, or None. Cached and reused, a peak measured under load makes every MFU against
    it read high until ``--refresh-peak`` on a quiet machine measures it again."""
    why = under_load(measured)
    if why is None:
        return None
    return (f"the measured peak was measured under load ({why}): it may read low and the MFU against it high "
            "(--refresh-peak on a quiet machine measures it again)")


def warning(measured: dict | None) -> str | None:
    """The one line a sweep prints for a peak measured under load, naming the entry and when; None otherwise."""
    why = under_load(measured)
    if why is None:
        return None
    when = "measured now" if measured.get("measured_now") else f"cached, measured {measured.get('measured_at')}"
    return (f"the matmul peak of {measured.get('device_name')} {measured.get('mode')} ({when}: {measured.get('cache')}) "
            f"was measured under load ({why}): it may read low and every MFU against it high; --refresh-peak on a "
            "quiet machine measures it again")


def load_text(e: dict) -> str | None:
    """An entry's load in a cell: "⚠ others 45% of 2 CPUs (load average 3.5)", or the load average alone (older)."""
    load = e.get("load") or {}
    if load.get("others_cpu_share") is not None:
        mark = "⚠ " if load.get("disturbed") else ""
        return (f"{mark}others {100 * load['others_cpu_share']:.0f}% of {load['cpus']} CPUs (load average "
                f"{load['load_average_before'][0]:.1f})")
    return None if e.get("load_average") is None else f"{e['load_average']:.1f} on {e.get('cpus')} CPUs"


def table(entries: list[dict]) -> str:
    """Measured peaks as a Markdown table (bench peak prints it)."""
    from bench.core.text import md_table

    rows = [[e["key"]["device_name"], mode(e["key"]["precision"], e["key"]["tf32"]), e["key"]["threads"] or "",
             f"{e['tflops']:,.3f}" if e["tflops"] < 10 else f"{e['tflops']:,.1f}",
             "x".join(map(str, e.get("best_shape") or [])), e["measured_at"], load_text(e),
             "measured now" if e.get("measured_now") else "cached", e.get("cache") or ""] for e in entries]
    return md_table(["device", "mode", "threads", "TFLOP/s", "best shape (m×n×k)", "measured at", "load then",
                     "", "cache entry"], rows, {2, 3})

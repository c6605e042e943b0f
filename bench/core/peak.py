"""The measured matmul peak (``bench peak``, and the first run of a sweep that finds none): its cache and record
vocabulary. No torch here; the measurement is bench/rank/peak.py.

A datasheet's dense peak is a rate no kernel sustains (a large bf16 matmul on an H100 SXM reaches roughly 80% of its
989 TFLOP/s), so every record also gives MFU against what this device, this software and this precision mode were
measured to sustain: the largest rate over a small sweep of large matrix multiplications, each shape warmed up, then
timed in batches of iterations, the best batch kept (as ml-engineering's maximum-achievable-matmul-FLOPS finder
does). On the CPU the same measurement of the CPU's own rate, at the run's threads per rank, gives CPU records an MFU
too.

One entry per (device, torch, CUDA, precision, TF32 mode, threads on the CPU) in the cache directory
(``BENCH_PEAK_CACHE``, else ``$XDG_CACHE_HOME/torch-parallel-bench/peak``, else ``~/.cache/...``): measured once,
reused by every later run and sweep, re-measured by ``bench peak --refresh`` or ``bench run --refresh-peak``. A
record names the entry it used and when it was measured.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

PEAK_SCHEMA = "peak-1"
PRECISIONS = ("fp32", "bf16", "fp16")


def cache_dir() -> Path:
    if os.environ.get("BENCH_PEAK_CACHE"):
        return Path(os.environ["BENCH_PEAK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torch-parallel-bench" / "peak"


def mode(precision: str, tf32: bool | None) -> str:
    """The precision mode a peak is for: ``bf16``, ``fp32 (TF32 on)``, ``fp32 (TF32 off)``, or ``fp32`` on a CPU."""
    if precision != "fp32" or tf32 is None:
        return precision
    return f"fp32 (TF32 {'on' if tf32 else 'off'})"


def key(device_type: str, device_name: str, torch_version: str, cuda_version: str | None, precision: str,
        tf32: bool | None, threads: int | None) -> dict:
    """What a measured peak depends on: the device, the software, the precision mode and, on the CPU, the threads."""
    return {"device_type": device_type, "device_name": device_name, "torch": torch_version, "cuda": cuda_version,
            "precision": precision, "tf32": tf32 if device_type == "cuda" and precision == "fp32" else None,
            "threads": threads if device_type == "cpu" else None}


def entry_path(k: dict, directory: Path | None = None) -> Path:
    """The cache file of a key: every part of it in the name, readable."""
    parts = [k["device_name"], f"torch{k['torch']}", f"cuda{k['cuda']}" if k["cuda"] else "nocuda",
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
    mode and the shape that reached it."""
    if entry is None:
        return {"tflops": None, "reason": why or "not measured"}
    return {"tflops": entry["tflops"], "cache": entry.get("cache"), "measured_at": entry["measured_at"],
            "measured_now": bool(entry.get("measured_now")), "mode": mode(entry["key"]["precision"], entry["key"]["tf32"]),
            "shape": entry.get("best_shape"), "threads": entry["key"]["threads"], "device_name": entry["key"]["device_name"],
            "load_average": entry.get("load_average"), "cpus": entry.get("cpus"), "how": entry.get("how")}


def busy(measured: dict | None) -> str | None:
    """Why a measured peak may read low (its load average above the CPUs when it was measured), or None. Cached and
    reused, such a peak makes every MFU against it read high until ``bench peak --refresh`` on a quiet machine."""
    load, cpus = (measured or {}).get("load_average"), (measured or {}).get("cpus")
    if load is None or not cpus or load <= cpus:
        return None
    return (f"the measured peak was measured while the load average was {load:.1f} on {cpus} CPUs: it may read low "
            "and the MFU against it high (bench peak --refresh on a quiet machine)")


def table(entries: list[dict]) -> str:
    """Measured peaks as a Markdown table (bench peak prints it)."""
    from bench.core.text import md_table

    rows = [[e["key"]["device_name"], mode(e["key"]["precision"], e["key"]["tf32"]), e["key"]["threads"] or "",
             f"{e['tflops']:,.3f}" if e["tflops"] < 10 else f"{e['tflops']:,.1f}",
             "x".join(map(str, e.get("best_shape") or [])), e["measured_at"],
             None if e.get("load_average") is None else f"{e['load_average']:.1f} on {e.get('cpus')} CPUs",
             "measured now" if e.get("measured_now") else "cached", e.get("cache") or ""] for e in entries]
    return md_table(["device", "mode", "threads", "TFLOP/s", "best shape (m×n×k)", "measured at", "load average then",
                     "", "cache entry"], rows, {2, 3})

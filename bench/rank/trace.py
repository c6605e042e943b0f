"""``bench run --trace [STEPS]``: a short profiled window on every rank, after everything the record reports was
measured (the timed windows, memory, evaluation, the replica checksum and the compute-only reference), so the
profiler's overhead never touches a reported number.

``torch.profiler`` records CPU activity (and CUDA kernels on GPUs) over STEPS steps, each inside a ``bench step``
range, with the backend's phases marked inside it (``Backend.phase``: data, forward, backward, all-reduce,
optimizer). Each rank writes one gzip-compressed Chrome trace next to the run's log,
``logs/<run id>.rank<r>.trace.json.gz`` (open it in https://ui.perfetto.dev), and summarises its phases
(bench/core/traces.py) for the record; a GPU trace is also read by Holistic Trace Analysis (communication/computation
overlap, idle time, kernel types: ``traces.gpu_analysis``). A trace larger than ``MAX_TRACE_BYTES`` compressed is not kept.
"""
from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path

import torch

from bench.core import traces

MAX_TRACE_BYTES = 64 * 2 ** 20  # per rank, compressed


def trace_path(spec: dict, rank: int) -> Path:
    return Path(spec["results_dir"]) / "logs" / f"{spec['run_id']}.rank{rank}.trace.json.gz"


def profiler_active() -> bool:
    """Whether a torch profiler is recording in this process now (the profiler's own state)."""
    return bool(torch.autograd._profiler_enabled())


def capture(backend, steps: int, sync, path: Path) -> dict:
    """Profile ``steps`` training steps of ``backend`` and write the trace to ``path``; returns the record's part."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if any(d.type == "cuda" for d in backend.devices()):
        activities.append(ProfilerActivity.CUDA)
    t0 = time.perf_counter()
    rank = backend.rank
    backend.phase_marker = record_function
    try:
        with profile(activities=activities) as prof:
            for _ in range(steps):
                with record_function(traces.STEP):
                    backend.train(1)
                    sync()
    finally:
        backend.phase_marker = None
    profiled = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    raw, tmp = path.with_name(f".{path.name}.json"), path.with_name(f".{path.name}.tmp")
    try:
        t1 = time.perf_counter()
        prof.export_chrome_trace(str(raw))
        trace = traces.load(raw)
        phases = traces.phase_times(trace)
        t2 = time.perf_counter()
        gpu = traces.gpu_analysis(raw, rank, phases["steps"]) if traces.has_kernels(trace) else None
        analysed = time.perf_counter() - t2
        del trace
        with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        size = tmp.stat().st_size
        kept = size <= MAX_TRACE_BYTES
        if kept:
            os.replace(tmp, path)
        written = time.perf_counter() - t1 - analysed
    finally:
        for p in (raw, tmp):
            p.unlink(missing_ok=True)
    return {"file": str(path) if kept else None, "bytes": size, "steps": steps, "profiled_seconds": profiled,
            "export_seconds": written, "phase_times": phases, "gpu": gpu, "analysis_seconds": analysed,
            "reason": None if kept else f"trace of {size} bytes compressed is over the {MAX_TRACE_BYTES}-byte cap; "
                                        "trace fewer steps (--trace N)"}

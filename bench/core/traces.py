"""Reading a step's time off a profiler trace (``bench run --trace``): one Chrome trace per rank, as
``torch.profiler`` exports it, with a ``bench step`` range around every traced step and one range per phase inside it
(``backends.base.PHASES``: data, forward, backward, all-reduce, optimizer). Pure Python on the trace's JSON: the ranks
summarise their own trace with it, and reports re-read traces with it.

Per step, a phase's time is the sum of its ranges inside that step; ``other`` is the step's time outside every phase
(zero_grad, the loop itself). Times are milliseconds of wall time on the rank's main thread: on a GPU the ranges
mark when the host issued the work, not when the kernels ran.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

STEP = "bench step"  # the range around each traced step
PHASES = ("data", "forward", "backward", "all-reduce", "optimizer")  # the same names as backends.base.PHASES
RANGE_CATEGORIES = ("user_annotation",)  # host-side record_function ranges (the GPU copies: gpu_user_annotation)
DEFAULT_STEPS = 3  # bench run --trace with no number
MAX_STEPS = 20  # a trace is for reading a step, not for statistics; each ResNet step adds thousands of events


def load(path) -> dict:
    """A Chrome trace file, gzip-compressed (``.gz``) or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _ranges(trace: dict, name: str) -> list[tuple[float, float]]:
    """The host-side ranges called ``name`` (``NAME*``: every name starting with NAME, as ``ProfilerStep*``)."""
    prefix = name[:-1] if name.endswith("*") else None
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in trace.get("traceEvents", ())
                  if e.get("ph") == "X" and e.get("cat") in RANGE_CATEGORIES
                  and (e.get("name") == name if prefix is None else str(e.get("name", "")).startswith(prefix)))


def phase_times(trace: dict, step: str = STEP, phases: tuple = PHASES) -> dict:
    """``{"steps": n, "step_ms": [...], "phase_ms": {phase: [ms per step]}, "timeline": ...}`` from one rank's trace
    (phases with no range in any step are left out; ``other`` is always there; ``timeline``: the last step's ranges).
    ``step`` and ``phases`` name other ranges, for a trace of another training script (``bench trace``)."""
    steps = _ranges(trace, step)
    found = {p: _ranges(trace, p) for p in phases}
    step_ms = [(end - start) / 1e3 for start, end in steps]
    per_phase = {}
    for p, ranges in found.items():
        if ranges:
            per_phase[p] = [sum(min(e, end) - max(s, start) for s, e in ranges if s < end and e > start) / 1e3
                            for start, end in steps]
    per_phase["other"] = [total - sum(v[i] for v in per_phase.values()) for i, total in enumerate(step_ms)]
    return {"steps": len(steps), "step_ms": step_ms, "phase_ms": per_phase, "timeline": timeline(trace, step, phases)}


def is_communication_kernel(name: str) -> bool:
    """A GPU kernel that communicates (NCCL's kernels: ncclDevKernel_AllReduce_..., ncclKernel_...)."""
    return "nccl" in name.lower()


def timeline(trace: dict, step: str = STEP, phases: tuple = PHASES) -> dict | None:
    """The last traced step on one rank, for the report's timeline figure: its start (``start_us``, the trace's
    clock: comparable between the ranks of one host) and length, each phase range as ``[phase, start_ms, ms]`` from
    the step's start, and the communication kernels (``comm``, GPU traces only) as ``[start_ms, ms]``. The last
    step: the first one under a profiler pays the profiler's own start-up."""
    steps = _ranges(trace, step)
    if not steps:
        return None
    start, end = steps[-1]
    ranges = [[p, (max(s, start) - start) / 1e3, (min(e, end) - max(s, start)) / 1e3]
              for p in phases for s, e in _ranges(trace, p) if s < end and e > start]
    comm = sorted([(e["ts"] - start) / 1e3, e["dur"] / 1e3] for e in trace.get("traceEvents", ())
                  if e.get("ph") == "X" and e.get("cat") == "kernel" and is_communication_kernel(e.get("name", ""))
                  and start <= e["ts"] < end)
    return {"start_us": start, "ms": (end - start) / 1e3, "ranges": sorted(ranges, key=lambda r: r[1]), "comm": comm}


def summarise(per_rank: list[dict]) -> dict:
    """Across the ranks' ``phase_times``: the mean ms per step of every phase on each rank, and which rank was the
    slowest in each step (the one the others waited for)."""
    steps = min(r["steps"] for r in per_rank) if per_rank else 0
    return {
        "steps": steps,
        "phase_ms_per_step": [{p: sum(v[:steps]) / steps for p, v in r["phase_ms"].items()} if steps else {}
                              for r in per_rank],
        "step_ms": [r["step_ms"][:steps] for r in per_rank],
        "slowest_rank_per_step": [max(range(len(per_rank)), key=lambda k: per_rank[k]["step_ms"][i])
                                  for i in range(steps)],
        "timeline": [r.get("timeline") for r in per_rank],
    }

"""Reading a step's time off a profiler trace (``bench run --trace``): one Chrome trace per rank, as
``torch.profiler`` exports it, with a ``bench step`` range around every traced step and one range per phase inside it
(``backends.base.PHASES``: data, forward, backward, all-reduce, optimizer). Pure Python on the trace's JSON: the ranks
summarise their own trace with it, and reports re-read traces with it.

Per step, a phase's time is the sum of its ranges inside that step; ``other`` is the step's time outside every phase
(zero_grad, the loop itself). The libraries' own ranges inside the steps (FSDP2's ``FSDP::pre_forward (layer1.0)``,
torch's ``Optimizer.step#SGD.step``, ...) are summed the same way, one name per kind: they say where a backend's extra
time goes inside a phase. Times are milliseconds of wall time on the rank's main thread: on a GPU the ranges
mark when the host issued the work, not when the kernels ran.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from bench.core.text import md_table

STEP = "bench step"  # the range around each traced step
PHASES = ("data", "forward", "backward", "all-reduce", "optimizer")  # the same names as backends.base.PHASES
RANGE_CATEGORIES = ("user_annotation",)  # host-side record_function ranges (the GPU copies: gpu_user_annotation)
LIBRARY_RANGES_KEPT = 12  # the libraries' largest range kinds a rank's summary keeps (FSDP2 has about 10)
_FOR_WHAT = re.compile(r" \([^()]*\)$| for \S+$")  # "FSDP::pre_forward (layer1.0)", "... for layer4.1": the module
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
    """``{"steps": n, "step_ms": [...], "phase_ms": {phase: [ms per step]}, "library_ms": {range: [ms per step]},
    "timeline": ...}`` from one rank's trace (phases with no range in any step are left out; ``other`` is always there;
    ``library_ms``: library_ranges; ``timeline``: the last step's ranges). ``step`` and ``phases`` name other ranges,
    for a trace of another training script (``bench trace``)."""
    steps = _ranges(trace, step)
    found = {p: _ranges(trace, p) for p in phases}
    step_ms = [(end - start) / 1e3 for start, end in steps]
    per_phase = {}
    for p, ranges in found.items():
        if ranges:
            per_phase[p] = [sum(min(e, end) - max(s, start) for s, e in ranges if s < end and e > start) / 1e3
                            for start, end in steps]
    per_phase["other"] = [total - sum(v[i] for v in per_phase.values()) for i, total in enumerate(step_ms)]
    return {"steps": len(steps), "step_ms": step_ms, "phase_ms": per_phase,
            "library_ms": library_ranges(trace, steps, {step, *phases}), "timeline": timeline(trace, step, phases)}


def library_ranges(trace: dict, steps: list[tuple[float, float]], own: set) -> dict:
    """The host ranges inside the steps that are not ``own`` (the step's and the phases' names, ``NAME*`` as in
    _ranges): the libraries' own record_function ranges, one name per kind (the module a range is for dropped: FSDP2
    marks every block), as ms per step, the LIBRARY_RANGES_KEPT largest. Inclusive: a range inside another counts in
    both."""
    prefixes = tuple(name[:-1] for name in own if name.endswith("*"))  # ProfilerStep*: every ProfilerStep#N
    out: dict[str, list[float]] = {}
    for e in trace.get("traceEvents", ()):
        if (e.get("ph") != "X" or e.get("cat") not in RANGE_CATEGORIES or e.get("name") in own
                or (prefixes and str(e.get("name", "")).startswith(prefixes))):
            continue
        s, t = e["ts"], e["ts"] + e["dur"]
        row = out.setdefault(_FOR_WHAT.sub("", str(e.get("name", ""))), [0.0] * len(steps))
        for i, (start, end) in enumerate(steps):
            if s < end and t > start:
                row[i] += (min(t, end) - max(s, start)) / 1e3
    largest = sorted((k for k, v in out.items() if any(v)), key=lambda k: -sum(out[k]))[:LIBRARY_RANGES_KEPT]
    return {k: out[k] for k in largest}


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
        "library_ms_per_step": [{k: sum(v[:steps]) / steps for k, v in (r.get("library_ms") or {}).items()}
                                if steps else {} for r in per_rank],
        "step_ms": [r["step_ms"][:steps] for r in per_rank],
        "slowest_rank_per_step": [max(range(len(per_rank)), key=lambda k: per_rank[k]["step_ms"][i])
                                  for i in range(steps)],
        "timeline": [r.get("timeline") for r in per_rank],
    }


HTA = "holistictraceanalysis==0.5.0"  # pyproject.toml's `trace` extra, installed by make install


def has_kernels(trace: dict) -> bool:
    """Whether the trace holds GPU kernels (a trace with CUDA activity), which Holistic Trace Analysis reads."""
    return any(e.get("cat") == "kernel" for e in trace.get("traceEvents", ()))


def gpu_analysis(path, rank: int, steps: int) -> dict:
    """Holistic Trace Analysis (HTA) on one rank's GPU trace, per traced step: the communication kernels' time, the
    share of it overlapped by computation kernels (HTA's ``get_comm_comp_overlap``), the part left alone on the GPU
    (``exposed_comm_ms``), computation and memory-copy kernel time (``get_gpu_kernel_breakdown``), the GPU's idle time
    (``get_temporal_breakdown``) and, on the busiest stream, that idle time by cause (``get_idle_time_breakdown``:
    host_wait, the host did not launch work fast enough; kernel_wait, the stream waited on another stream's kernel;
    other). ``{"reason": ...}`` when HTA cannot run."""
    import contextlib
    import io
    import logging
    import warnings

    path = Path(path)
    out = io.StringIO()
    try:
        # HTA's progress lines and its pandas deprecation warnings (its own code, dozens per call) stay out of the log
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from hta.configs.config import logger
            from hta.trace_analysis import TraceAnalysis

            logger.setLevel(logging.ERROR)
            analysis = TraceAnalysis(trace_files={rank: path.name}, trace_dir=str(path.parent),
                                     include_last_profiler_step=True)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            temporal = analysis.get_temporal_breakdown(visualize=False)
            by_type, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
            idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
    except ImportError as e:
        return {"reason": f"Holistic Trace Analysis is not installed ({e.name}): make install, or pip install {HTA}"}
    except Exception as e:  # noqa: BLE001 - HTA's parser on a trace it does not expect: say so, keep the run
        return {"reason": f"Holistic Trace Analysis failed on {path.name}: {type(e).__name__}: {e}"}
    steps = max(steps, 1)
    kind = {k: v / 1e3 / steps for k, v in zip(by_type["kernel_type"], by_type["sum"])}
    alone, overlapped = kind.get("COMMUNICATION", 0.0), kind.get("COMPUTATION overlapping COMMUNICATION", 0.0)
    pct = float(overlap["comp_comm_overlap_pctg"].iloc[0]) if len(overlap) else float("nan")
    t = temporal.iloc[0]
    kernels = analysis.t.get_trace(rank)
    kernels = kernels[kernels["stream"].ge(0)]
    busiest = int(kernels.groupby("stream")["dur"].sum().idxmax()) if len(kernels) else None
    causes = {c: float(v) / 1e3 / steps for c, v in
              idle[idle["stream"] == busiest].groupby("idle_category")["idle_time"].sum().items()} if busiest is not None else {}
    return {"analysis": HTA.replace("==", " "), "comm_ms": alone + overlapped, "exposed_comm_ms": alone,
            "overlap_pct": None if pct != pct else pct,
            "compute_ms": kind.get("COMPUTATION", 0.0) + overlapped, "memory_ms": kind.get("MEMORY", 0.0),
            "idle_ms": float(t["idle_time(us)"]) / 1e3 / steps, "idle_pct": float(t["idle_time_pctg"]),
            "busiest_stream": busiest, "idle_ms_by_cause": causes}


def gpu_table(gpu: list[dict | None], key: str, names) -> str:
    """``gpu_analysis`` of several ranks (or files) as a Markdown table, ms per step, a row per entry of ``gpu``."""
    rows = []
    for name, g in zip(names, gpu):
        if not g or g.get("reason"):
            rows.append([name, *["-"] * 7, (g or {}).get("reason", "no GPU kernels in the trace")])
            continue
        causes = ", ".join(f"{c} {v:.2f}" for c, v in sorted(g["idle_ms_by_cause"].items()))
        rows.append([name, f"{g['comm_ms']:.2f}", "-" if g["overlap_pct"] is None else f"{g['overlap_pct']:.0f} %",
                     f"{g['exposed_comm_ms']:.2f}", f"{g['compute_ms']:.2f}", f"{g['memory_ms']:.2f}",
                     f"{g['idle_ms']:.2f} ({g['idle_pct']:.0f} %)", causes or "-"])
    return md_table([key, "communication", "overlapped by computation", "communication alone", "computation",
                     "memory copies", "GPU idle", "idle by cause"], rows, {1, 2, 3, 4, 5, 6})

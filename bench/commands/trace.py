"""``python -m bench trace FILE [FILE ...]``: where a step's time goes, read again from Chrome traces: the ones
``bench run --trace`` wrote (one per rank), or a trace of your own training script (``--step`` names the range around
each step, ``--phases`` the ranges inside it). One row per file: the mean milliseconds per step of every phase, and
*other* (the step outside every phase); with several files (the ranks of one run), the slowest file in each step.
Files with GPU kernels also get Holistic Trace Analysis's view (communication/computation overlap, idle time, kernel
types: bench/core/traces.py ``gpu_analysis``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.core import traces
from bench.core.errors import UsageError
from bench.core.text import md_table


def register(sub) -> None:
    p = sub.add_parser("trace", help="phases per step from Chrome traces (bench run --trace, or your own script's)")
    p.add_argument("files", nargs="+", metavar="FILE", help="Chrome trace JSON, gzip-compressed (.gz) or not")
    p.add_argument("--step", default=traces.STEP,
                   help=f"the range around each step (default {traces.STEP!r}; NAME* matches every name starting with "
                        "NAME, e.g. 'ProfilerStep*' for torch.profiler's schedule)")
    p.add_argument("--phases", default=",".join(traces.PHASES),
                   help=f"comma-separated ranges inside a step, which must not nest (default {','.join(traces.PHASES)})")
    p.add_argument("--format", default="md", choices=("md", "json"), help="a table (md, default) or JSON")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases:
        raise UsageError(f"--phases {args.phases!r}: expected comma-separated range names")
    per_file, gpu = [], []  # gpu: Holistic Trace Analysis of the files with GPU kernels
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"{name}: no such file")
        try:
            trace = traces.load(path)
        except (OSError, ValueError, EOFError) as e:  # gzip and JSON errors are ValueError/OSError/EOFError
            raise UsageError(f"{name}: not a Chrome trace (JSON, or gzip-compressed JSON): {e}") from None
        if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
            raise UsageError(f"{name}: not a Chrome trace (no traceEvents list)")
        got = traces.phase_times(trace, args.step, phases)
        if not got["steps"]:
            raise UsageError(f"{name}: no {args.step!r} range in the trace; name the range around each step with "
                             "--step (e.g. --step 'ProfilerStep*')")
        per_file.append(got)
        gpu.append(traces.gpu_analysis(path, len(gpu), got["steps"]) if traces.has_kernels(trace) else None)
        del trace
    summary = traces.summarise(per_file)
    if args.format == "json":
        print(json.dumps({"files": args.files, **summary, "gpu": gpu}, indent=1))
        return 0
    columns = [c for c in (*phases, "other") if any(c in p for p in summary["phase_ms_per_step"])]
    rows = [[name, *[f"{p[c]:.2f}" if c in p else "-" for c in columns], f"{sum(s) / len(s):.2f}"]
            for name, p, s in zip(args.files, summary["phase_ms_per_step"], summary["step_ms"])]
    print(f"{summary['steps']} step(s) in every file; mean ms per step:\n")
    print(md_table(["file", *columns, "step"], rows, set(range(1, len(columns) + 2))))
    libraries = sorted({k for r in summary["library_ms_per_step"] for k in r},
                       key=lambda k: -max(r.get(k, 0.0) for r in summary["library_ms_per_step"]))
    if libraries:
        print("\nthe libraries' own ranges inside the steps, mean ms per step (inclusive: one inside another counts in "
              "both):\n")
        print(md_table(["range", *args.files], [[k, *[f"{r[k]:.2f}" if k in r else "-"
                                                     for r in summary["library_ms_per_step"]]] for k in libraries],
                       set(range(1, len(args.files) + 1))))
    if len(args.files) > 1:
        print(f"\nslowest file per step: {', '.join(str(k) for k in summary['slowest_rank_per_step'])} "
              "(0 = the first file)")
    if any(gpu):
        print("\nGPU kernels, ms per step (Holistic Trace Analysis; idle by cause on the stream with the most kernel "
              "time):\n")
        print(traces.gpu_table(gpu, "file", args.files))
    sys.stdout.flush()
    return 0

"""The one-table console summary printed at the end of a sweep, and one line saying which kinds of warning its
numbers carry (bench/core/trust.py: disturbed runs, unstable repeats, a slow first window, world size 1 far from
single). The warnings themselves are told once, by ``bench report``'s verdict (one line per kind, with counts and what
to do) and under each workload's tables in REPORT.md, not here: ``make bench`` prints both consoles."""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.core import traces, trust, workloads


def one_line(rec: dict) -> str:
    if rec.get("record_elsewhere"):
        return f"ok: {rec['reason']}"
    if rec["status"] == "ok":
        lo, hi = rec["throughput_ci95"]
        unit = workloads.sample_unit(rec)
        line = (f"ok: {rec['throughput']:.1f} {unit}/s global (95% CI {lo:.1f}-{hi:.1f}), "
                f"{rec['per_device_throughput']:.1f} {unit}/s per device")
        if rec.get("tokens_per_second"):
            line += f", {rec['tokens_per_second']:,.0f} tokens/s global"
        if rec.get("disturbed"):
            line += f" ⚠ disturbed ({trust.disturbed_brief(rec)})"
        return line + trace_line(rec.get("trace"))
    return f"{rec['status']}: {rec['reason']}"


def trace_line(trace: dict | None) -> str:
    """--trace: rank 0's phases in ms per step, and where the trace files are."""
    if not trace:
        return ""
    rank0 = (trace["phase_ms_per_step"] or [{}])[0]
    phases = ", ".join(f"{p} {rank0[p]:.1f}" for p in (*traces.PHASES, "other") if p in rank0)
    kept = [f for f in trace["files"] if f]
    where = f"{len(kept)} trace file(s) in {Path(kept[0]).parent}" if kept else "no trace file kept"
    gpu = (trace.get("gpu") or [None])[0]
    hta = ""
    if gpu and gpu.get("reason"):
        hta = f"; {gpu['reason']}"
    elif gpu:
        overlap = "-" if gpu["overlap_pct"] is None else f"{gpu['overlap_pct']:.0f}%"
        hta = (f"; GPU (HTA): communication kernels {gpu['comm_ms']:.1f} ms, {overlap} overlapped by computation, "
               f"idle {gpu['idle_pct']:.0f}%")
    return (f"\n    trace, rank 0, ms per step over {trace['steps']} step(s): {phases}{hta}; {where}"
            + "".join(f"; {r}" for r in trace["reasons"]))


def print_table(records: list[dict], console: Console | None = None) -> None:
    if not records:
        return
    device = records[0]["device_type"]
    first = records[0]
    unit = workloads.sample_unit(first)
    table = Table(title=f"{first['model']} {workloads.shape(first)}, batch {first['batch_per_device']}"
                        f"/device, {first.get('optimizer') or 'sgd'}, {first['data']} data, {device}")
    for col, justify in (("backend", "left"), ("world size", "right"), (f"global {unit}/s", "right"),
                         (f"per-device {unit}/s", "right"), ("precision", "left"), ("status", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for r in records:
        ok = r["status"] == "ok" and not r.get("record_elsewhere")
        status = f"{r['status']}: {r['reason']}" if r["status"] != "ok" or r.get("record_elsewhere") else "ok"
        if ok and r.get("replicas_consistent") is False:
            status = "ok, but replicas DIFFER after training"
        elif ok and r.get("disturbed"):
            status = "ok, ⚠ disturbed"
        table.add_row(r["backend"], str(r["world_size"]), f"{r['throughput']:.1f}" if ok else "-",
                      f"{r['per_device_throughput']:.1f}" if ok else "-", r["precision"], escape(status))
    (console or Console(width=160)).print(table)


def print_warnings(records: list[dict], stream=None) -> None:
    """One line naming the kinds of warning about the sweep's numbers, and where they are told; nothing when none."""
    found = trust.sweep_warnings(records)
    if not found:
        return
    kinds = ", ".join(dict.fromkeys(w["kind"] for w in found))
    print(f"\n⚠ warnings about these numbers ({kinds}): `python -m bench report` tells them with its verdict, one "
          "line per kind, with what to do", file=stream or sys.stdout)

"""The report's "Where a step's time goes" section, from runs made with ``bench run --trace``: for each traced
configuration (its last traced run), the phases per step on every rank as a table, one traced step drawn as a
timeline (one lane per rank, the same colour for a phase in every figure, and on GPUs a lane per rank for the
communication kernels on their own stream), and the trace files to open in Perfetto."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from bench.report.comm import split
from bench.report.common import label, md_table, save_figure, slug, withheld
from bench.core import traces, workloads

COLORS = {"data": "#8c8c8c", "forward": "#1f77b4", "backward": "#ff7f0e", "all-reduce": "#d62728",
          "optimizer": "#2ca02c", "communication kernels": "#9467bd"}
COLUMNS = (*traces.PHASES, "other")


def section(rows: list[dict], out: Path) -> list[str]:
    traced = []  # (row, its newest ok traced record)
    for r in rows:
        recs = [rec for rec in r["_recs"] if rec["status"] == "ok" and rec.get("trace")]
        if recs:
            traced.append((r, max(recs, key=lambda rec: str(rec["run_id"]))))
    if not traced:
        return []
    md = ["## Where a step's time goes (traces)", "",
          "Runs made with `bench run --trace`: a few steps profiled on every rank after everything above was measured "
          "(no profiler runs in a timed window). The table gives each rank's mean milliseconds per traced step in each "
          "phase; *other* is the step outside every phase. The figure draws the last traced step, one lane per rank "
          "from the earliest rank's start (ranks on other hosts from their own start), with the phases as the host "
          "issued them and, on GPUs, the communication kernels where they ran. DDP, FSDP2 and ZeRO communicate inside "
          "*backward* and *optimizer*; the exposed communication of the *Where the scaling goes* table is measured, "
          "instead, against the compute-only windows; the next table sets the two side by side.", ""]
    md += agreement(traced)
    for row, rec in traced:
        trace = rec["trace"]
        title = (f"{label(row)} × {rec['world_size']}, {rec['model']} {workloads.shape(rec)} b{rec['batch_per_device']} "
                 f"{rec['precision']} ({rec['device_type']})")
        present = [c for c in COLUMNS if any(c in p for p in trace["phase_ms_per_step"])]
        table = [[rank, *[_ms(p.get(c)) for c in present], _ms(sum(s) / len(s) if s else None)]
                 for rank, (p, s) in enumerate(zip(trace["phase_ms_per_step"], trace["step_ms"]))]
        md += [f"### {title}", "", f"{trace['steps']} traced step(s); slowest rank per step: "
               f"{', '.join(map(str, trace['slowest_rank_per_step'])) or '-'}.", "",
               md_table(["rank", *present, "step"], table, set(range(1, len(present) + 2))), ""]
        md += library_line(trace)
        stem = out / "plots" / slug("timeline", rec["run_id"], hw=str(row.get("hardware")))
        if draw(trace.get("timeline") or [], rec.get("hosts"), stem, title):
            md += [f"![timeline](plots/{stem.name}.png)", ""]
        if any(trace.get("gpu") or []):
            md += ["GPU kernels per rank, ms per traced step (Holistic Trace Analysis; *idle by cause* on the stream "
                   "with the most kernel time: *host_wait*, the host did not launch work in time; *kernel_wait*, the "
                   "stream waited for another stream):", "", traces.gpu_table(trace["gpu"], "rank", range(len(trace["gpu"]))), ""]
        links = [f"[rank {rank}]({quote(Path(os.path.relpath(Path(f).resolve(), out.resolve())).as_posix())})"
                 for rank, f in enumerate(trace["files"]) if f]
        md += [f"Trace files (open one at https://ui.perfetto.dev: drag the file in): "
               f"{', '.join(links) or 'none kept'}" + "".join(f"; {reason}" for reason in trace.get("reasons") or []),
               ""]
    return md


def library_line(trace: dict, shown: int = 6) -> list[str]:
    """Where the time goes inside the phases: rank 0's library ranges (traces.library_ranges), largest first."""
    ranges = (trace.get("library_ms_per_step") or [{}])[0]
    if not ranges:
        return []
    top = sorted(ranges.items(), key=lambda kv: -kv[1])[:shown]
    return ["Inside the phases, the libraries' own ranges on rank 0, ms per traced step (inclusive: one inside "
            f"another counts in both; the module each is for left out): {', '.join(f'`{k}` {_ms(v)}' for k, v in top)}"
            f"{f' and {len(ranges) - shown} more' if len(ranges) > shown else ''}.", ""]


AGREE = 0.25  # within 25% (or 0.5 ms): "agree"


def trace_side(trace: dict) -> dict:
    """The trace's view of communication per step, mean over the ranks: on GPUs, Holistic Trace Analysis's
    communication kernels (all of them, the share overlapped by computation kernels, and the rest: exposed); on CPUs,
    the explicit collectives' ranges (``all-reduce``), which the host waits for (nothing overlaps them); else a
    reason."""
    gpu = [g for g in trace.get("gpu") or [] if g and not g.get("reason")]
    if gpu:
        mean = lambda k: sum(g[k] for g in gpu) / len(gpu)  # noqa: E731
        overlap = [g["overlap_pct"] for g in gpu if g["overlap_pct"] is not None]
        return {"comm_ms": mean("comm_ms"), "exposed_ms": mean("exposed_comm_ms"),
                "overlap_pct": sum(overlap) / len(overlap) if overlap else None, "source": "GPU kernels (HTA)"}
    reasons = [g["reason"] for g in trace.get("gpu") or [] if g and g.get("reason")]
    if reasons:
        return {"reason": reasons[0]}
    ar = [p["all-reduce"] for p in trace["phase_ms_per_step"] if "all-reduce" in p]
    if ar:
        ms = sum(ar) / len(ar)
        return {"comm_ms": ms, "exposed_ms": ms, "overlap_pct": 0.0, "source": "all-reduce ranges (host)"}
    return {"reason": "communicates inside backward and the optimizer step; a CPU trace has no kernels to tell it "
                      "apart"}


def agreement(traced: list[tuple[dict, dict]]) -> list[str]:
    """Exposed communication two ways, side by side: the compute-only reference (timed windows) and the trace."""
    rows, both, close = [], 0, 0
    for row, rec in traced:
        if rec["world_size"] < 2:
            continue
        ref = split(row)
        why = withheld(row, "exposed")  # from a disturbed run, or below -5% of the step: the reason, no comparison
        t = trace_side(rec["trace"])
        verdict = "-"
        if ref and not why and "exposed_ms" in t:
            both += 1
            diff = t["exposed_ms"] - ref["exposed_ms"]
            agree = abs(diff) <= max(AGREE * abs(ref["exposed_ms"]), 0.5)
            close += agree
            verdict = f"{'agree' if agree else 'differ'} ({diff:+.1f} ms)"
        rows.append([label(row), rec["world_size"], rec["precision"],
                     (f"⚠ {why}" if why else _ms(ref["exposed_ms"])) if ref else "not measured",
                     _ms(t.get("comm_ms")), "-" if t.get("overlap_pct") is None else f"{t['overlap_pct']:.0f} %",
                     _ms(t.get("exposed_ms")), t.get("source") or t["reason"], verdict])
    if not rows:
        return []
    return ["### Exposed communication, two ways", "",
            "*Reference*: step time minus the compute-only step time, from the timed windows (the *Where the scaling "
            "goes* table). *Trace*: from the profiled steps; on GPUs the communication kernels that Holistic Trace "
            "Analysis finds running with no computation kernel beside them, on CPUs the explicit collectives' ranges. "
            f"Both measured for {both} configuration(s); within 25% (or 0.5 ms) of each other in {close}. They answer "
            "different questions and may differ: the reference is a difference of two noisy means and also counts "
            "what the synchronisation costs outside communication kernels (waiting for the slowest rank, the "
            "host's launch stalls, NCCL's kernels taking SMs from computation); the trace counts only what ran in a "
            "few profiled steps, under the profiler's overhead, and on CPUs sees no communication hidden inside "
            "*backward* (DDP's buckets, FSDP2's reduce-scatters).", "",
            md_table(["backend", "ranks", "precision", "reference: exposed ms / step", "trace: communication ms / step",
                      "trace: overlapped", "trace: exposed ms / step", "trace source", "agreement"], rows,
                     {1, 3, 4, 5, 6}), ""]


def _ms(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def draw(timelines: list[dict | None], hosts: list[str] | None, stem: Path, title: str) -> bool:
    """One step, one lane per rank (and one for its communication kernels where the trace has them); False when no
    rank has a timeline."""
    if not any(timelines):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one_host = hosts is None or len(set(hosts)) <= 1
    origin = min(t["start_us"] for t in timelines if t) if one_host else None
    lanes = []  # (label, [(start_ms, ms, colour)])
    for rank, t in enumerate(timelines):
        if not t:
            continue
        shift = (t["start_us"] - origin) / 1e3 if origin is not None else 0.0
        lanes.append((f"rank {rank}", [(shift + s, d, COLORS[p]) for p, s, d in t["ranges"]]))
        if t["comm"]:
            lanes.append((f"rank {rank} comm", [(shift + s, d, COLORS["communication kernels"]) for s, d in t["comm"]]))
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(lanes) + 1.6))
    for y, (_, bars) in enumerate(reversed(lanes)):
        ax.broken_barh([(s, d) for s, d, _ in bars], (y - 0.35, 0.7), facecolors=[c for _, _, c in bars])
    ax.set_yticks(range(len(lanes)), [name for name, _ in reversed(lanes)])
    ax.set_xlabel("ms from the " + ("earliest rank's step start" if one_host else "rank's own step start"))
    used = {c for _, bars in lanes for _, _, c in bars}
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=p) for p, c in COLORS.items() if c in used],
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(lanes) < 3 else -0.2), ncol=6, fontsize=8,
              frameon=False)
    ax.set_title(f"One traced step\n{title}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, stem, tight=True)
    return True

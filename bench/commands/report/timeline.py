"""The report's "Where a step's time goes" section, from runs made with ``bench run --trace``: for each traced
configuration (its last traced run), the phases per step on every rank as a table, one traced step drawn as a
timeline (one lane per rank, the same colour for a phase in every figure, and on GPUs a lane per rank for the
communication kernels on their own stream), and the trace files to open in Perfetto."""
from __future__ import annotations

from pathlib import Path

from bench.commands.report.common import label, md_table, slug
from bench.core import traces

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
          "instead, against the compute-only windows. Open a trace file at https://ui.perfetto.dev (drag it in).", ""]
    for row, rec in traced:
        trace = rec["trace"]
        title = (f"{label(row)} × {rec['world_size']}, {rec['model']} {rec['image_size']}px b{rec['batch_per_device']} "
                 f"{rec['precision']} ({rec['device_type']})")
        present = [c for c in COLUMNS if any(c in p for p in trace["phase_ms_per_step"])]
        table = [[rank, *[_ms(p.get(c)) for c in present], _ms(sum(s) / len(s) if s else None)]
                 for rank, (p, s) in enumerate(zip(trace["phase_ms_per_step"], trace["step_ms"]))]
        md += [f"### {title}", "", f"{trace['steps']} traced step(s); slowest rank per step: "
               f"{', '.join(map(str, trace['slowest_rank_per_step'])) or '-'}.", "",
               md_table(["rank", *present, "step"], table, set(range(1, len(present) + 2))), ""]
        stem = out / "plots" / slug("timeline", rec["run_id"], hw=str(row.get("hardware")))
        if draw(trace.get("timeline") or [], rec.get("hosts"), stem, title):
            md += [f"![timeline](plots/{stem.name}.png)", ""]
        files = [f for f in trace["files"] if f]
        md += [f"Trace files: {', '.join(f'`{f}`' for f in files) or 'none kept'}"
               + "".join(f"; {reason}" for reason in trace.get("reasons") or []), ""]
    return md


def _ms(x) -> str:
    return "-" if x is None else f"{x:.1f}"


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
    stem.parent.mkdir(parents=True, exist_ok=True)
    for ext in ("png", "svg"):
        fig.savefig(f"{stem}.{ext}", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True

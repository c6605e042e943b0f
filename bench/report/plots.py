"""Plots: one figure per kind per workload, PNG (dpi 120, for the README) and SVG.

Every backend has one colour and one marker, the same in every plot (report/style.py: a fixed colour-blind-safe
palette); the world sizes sit on a log2 axis, evenly spaced, and the points of one world size are dodged side by side,
never stacked; a warning is a black ring, a mark no backend uses.

Legends stand outside the axes (``common.legend_outside``, under the constrained layout) and no label is written
among the data, so nothing covers a point or a bar (tests/test_plot_overlap.py measures it). A figure derived from a
disturbed or impossible input (report/caution.py ``withheld``) is not drawn; the panel's title says how many were left
out and why."""
from __future__ import annotations

from pathlib import Path

from bench.report.common import BASELINE, MARK, GiB, flagged, label, legend_outside, rate, save_figure, withheld
from bench.report.style import WARNING, dodge, series_styles
from bench.report.summary import device_memory
from bench.core.trust import SAME_COMPUTATION


def plot_workload(ok: list[dict], stem: Path, title: str, unit: str, device: str) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11})
    stem.parent.mkdir(parents=True, exist_ok=True)
    multi_precision = len({r["precision"] for r in ok}) > 1
    series: dict[str, list[dict]] = {}
    for r in ok:
        series.setdefault(label(r) + (f" {r['precision']}" if multi_precision else ""), []).append(r)
    color = series_styles(series)  # per series: its backend's colour and marker (report/style.py)
    files = []
    for kind, draw in (("throughput", _plot_throughput), ("efficiency", _plot_efficiency),
                       ("memory", _plot_memory), ("step-time", _plot_step_time)):
        fig, heading = draw(plt, ok, series, color, unit, device)
        fig.suptitle(f"{heading}\n{title}", fontsize=10)
        save_figure(fig, f"{stem}-{kind}")
        files.append((kind, f"{stem.name}-{kind}.png"))
    return files


def _world_size_axis(ax, rows, unit):
    """World sizes on a log2 axis (1, 2, 4, 8 evenly spaced), a tick at each one measured."""
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
    ax.set_xlabel(f"{unit} (world size)")
    ax.grid(alpha=0.3)


def _dodged(ax, series, value) -> dict:
    """Each row's x, its world size moved sideways so the points of one world size sit side by side (style.dodge)."""
    return dodge(ax, [(id(r), r["world_size"], value(r)) for rs in series.values() for r in rs if value(r) is not None])


def _plot_throughput(plt, ok, series, color, unit, device):
    fig, ax = plt.subplots(figsize=(10, 4.8), layout="constrained")
    _world_size_axis(ax, ok, unit)
    ax.set_ylabel(f"global throughput ({rate(ok[0])})")
    # the y range before the points are placed (dodging reads the settled layout): the intervals and the ideal line
    top = max(r["world_size"] for r in ok)
    highs = [r["global_img_s"] if r["ci95_high_img_s"] is None else r["ci95_high_img_s"] for r in ok]
    ones = [r["global_img_s"] for r in ok if r["world_size"] == 1]
    ax.set_ylim(0, 1.08 * max(highs + [top * max(ones)] if ones else highs))
    x = _dodged(ax, series, lambda r: r["global_img_s"])
    for name, rs in series.items():
        y = [r["global_img_s"] for r in rs]
        err = [[r["global_img_s"] - r["ci95_low_img_s"] for r in rs],
               [r["ci95_high_img_s"] - r["global_img_s"] for r in rs]]
        ax.errorbar([x[id(r)] for r in rs], y, yerr=err, capsize=3, label=name, **color[name])
    _ring(ax, [(x[id(r)], r["global_img_s"]) for r in ok if flagged(r, "throughput", "cv")])
    # ideal linear scaling from single@1 (one line per precision); without it, from the best world-size-1 run; none
    # from a disturbed run (its throughput says how busy the machine was)
    base = [r for r in ok if r["backend"] == BASELINE and r["world_size"] == 1]
    base = base or sorted((r for r in ok if r["world_size"] == 1), key=lambda r: -r["global_img_s"])[:1]
    for b in base:
        if not b.get("runs_disturbed"):
            xs = sorted({1, *(r["world_size"] for r in ok)})  # N x single@1 at each world size measured
            ax.plot(xs, [n * b["global_img_s"] for n in xs], "--", color="gray",
                    label=f"ideal linear: N × {label(b)}@1 {b['precision']}")
    if any(b.get("runs_disturbed") for b in base):
        ax.set_title("no ideal line from a disturbed baseline", fontsize=8, color="dimgray")
    legend_outside(fig, [ax])
    return fig, f"Throughput vs {unit}: median and 95% interval"


def _plot_efficiency(plt, ok, series, color, unit, device):
    """A panel per baseline (single@1, the backend's own @1) that draws a point beyond world size 1; the single@1
    panel also where it left points out (its title says how many and why); it alone where no panel has a point."""
    candidates = []
    for col, what, field in (("eff_vs_single_pct", f"vs {BASELINE}@1", "eff_vs_single"),
                             ("eff_vs_own_ws1_pct", "vs own@1", "eff_vs_own")):
        known = [r for r in ok if r[col] is not None]
        drawn = [r for r in known if not withheld(r, field)]
        candidates.append((col, what, field, drawn, [r for r in known if withheld(r, field)]))
    panels = [c for i, c in enumerate(candidates) if any(r["world_size"] > 1 for r in c[3]) or (i == 0 and c[4])]
    panels = panels or candidates[:1]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels) + 2.5, 4.8), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, (col, what, field, drawn, left_out) in zip(axes[0], panels):
        note = (f"\n{len(left_out)} not drawn: {', '.join(sorted({str(withheld(r, field)) for r in left_out}))}" if left_out
                else "" if drawn else "\nno such baseline in these records")
        _world_size_axis(ax, ok, unit)
        ax.set_title(what + note, fontsize=9)
    axes[0][0].set_ylabel("scaling efficiency (%)")
    axes[0][0].set_ylim(0, 1.08 * max([110.0] + [r[col] for (col, _, _, drawn, _) in panels for r in drawn]))
    for ax, (col, what, field, drawn, left_out) in zip(axes[0], panels):
        ids = {id(r) for r in drawn}
        x = _dodged(ax, {name: [r for r in rs if id(r) in ids] for name, rs in series.items()}, lambda r: r[col])
        for name, rs in series.items():
            pts = [(x[id(r)], r[col]) for r in rs if id(r) in ids]
            if pts:
                ax.plot(*zip(*pts), label=name, **color[name])
        _ring(ax, [(x[id(r)], r[col]) for r in drawn if flagged(r, field, "throughput", kinds=(SAME_COMPUTATION,))])
        ax.axhline(100, ls="--", color="gray", label="ideal (100 %)")
    legend_outside(fig, axes[0])
    return fig, "Scaling efficiency: thr(N) / (N × thr(baseline, 1))"


def _ring(ax, points) -> None:
    """A black ring around each point a warning is about (report/caution.py), with a legend entry saying so: a mark no
    backend uses (report/style.py, WARNING)."""
    if points:
        ax.scatter(*zip(*points), s=WARNING["size"], marker=WARNING["marker"], facecolors="none",
                   edgecolors=WARNING["color"], linewidths=WARNING["linewidth"], zorder=4,
                   label=f"{MARK.strip()} not to be believed as it stands (see Warnings)")


def _panels(plt, ok, series, unit):
    """Small multiples: one panel per world size, each grouping that world size's configurations by backend."""
    sizes = sorted({r["world_size"] for r in ok})
    cols, rows = min(len(sizes), 2), -(-len(sizes) // 2)
    fig, axes = plt.subplots(rows, cols, figsize=(9, 4.8) if len(sizes) == 1 else (11, 1.2 + 3.4 * rows),
                             sharey=True, squeeze=False, layout="constrained")
    for ax in axes.flat[len(sizes):]:
        ax.set_visible(False)
    name_of, panels = {id(r): name for name, rs in series.items() for r in rs}, []
    for ax, n in zip(axes.flat, sizes):
        group = [r for r in ok if r["world_size"] == n]
        ax.set_xticks(range(len(group)), [name_of[id(r)] for r in group], rotation=20 if len(group) > 3 else 0,
                      ha="right" if len(group) > 3 else "center")
        ax.set_xlim(-0.6, max(len(group), 2) - 0.4)  # one group does not fill the panel
        ax.set_title(f"{n} {unit.removesuffix('s') if n == 1 else unit}")
        ax.grid(axis="y", alpha=0.3)
        panels.append((ax, group))
    return fig, panels


def _plot_memory(plt, ok, series, color, unit, device):
    """Grouped bars per backend (its latest ok run): one bar per GPU, or per rank on CPU."""
    gpu = device == "cuda"
    fig, panels = _panels(plt, ok, series, unit)
    for ax, group in panels:
        for g, r in enumerate(group):
            rec = [x for x in r["_recs"] if x["status"] == "ok"][-1]
            devs = ([(m["index"], m["reserved"] or 0, m["allocated"] or 0) for m in device_memory(rec)] if gpu
                    else [(i, b or 0, 0) for i, b in enumerate(rec.get("host_peak_rss_bytes") or [])])
            width = 0.8 / max(1, len(devs))
            for d, (index, main, inner) in enumerate(devs):
                x, c = g + width * (d - (len(devs) - 1) / 2), plt.cm.tab10(d % 10)
                ax.bar(x, main / GiB, width * 0.95, color=c, alpha=0.45 if gpu else 0.9,
                       label=f"{'GPU' if gpu else 'rank'} {index}")
                if gpu:
                    ax.bar(x, inner / GiB, width * 0.55, color=c)
            if devs and r["memory_imbalance"] and r["world_size"] > 1:
                off = " (cudnn off)" if r.get("memory_imbalance_from") else ""  # dp: summary.dp_imbalance_from_cudnn_off
                ax.annotate(f"{r['memory_imbalance']:.2f}×{off}", (g, max(m for _, m, _ in devs) / GiB), ha="center",
                            va="bottom", fontsize=9, textcoords="offset points", xytext=(0, 3))  # clear of the bar
        ax.margins(y=0.15)
    panels[0][0].set_ylabel("peak memory per GPU (GiB)" if gpu else "host peak RSS per rank (GiB)")
    legend_outside(fig, [ax for ax, _ in panels])
    return fig, (("Per-GPU peak memory: reserved (light), allocated (dark); above the bars: imbalance of peak allocated, "
                  "max/mean" if gpu else "Per-rank host peak memory; above the bars: imbalance max/mean"))


def _plot_step_time(plt, ok, series, color, unit, device):
    """Box per configuration over its raw windows (time per step), the windows themselves as points."""
    import numpy as np

    rng = np.random.default_rng(0)
    color_of = {id(r): color[name]["color"] for name, rs in series.items() for r in rs}
    fig, panels = _panels(plt, ok, series, unit)
    for ax, group in panels:
        data = [[1000 * t / rec["steps_per_window"] for rec in r["_recs"] if rec["status"] == "ok"
                 for t in rec["window_seconds"]] for r in group]
        ax.boxplot(data, positions=range(len(group)), widths=0.5, medianprops={"color": "black"}, showfliers=False,
                   manage_ticks=False)
        for i, (d, r) in enumerate(zip(data, group)):
            ax.scatter(i + rng.uniform(-0.12, 0.12, len(d)), d, s=16, color=color_of[id(r)], zorder=3)
    panels[0][0].set_ylim(bottom=0)  # after all panels have data: the y axis is shared
    panels[0][0].set_ylabel("time per step (ms)")
    return fig, "Step-time distribution from the raw window times (one point per timed window)"

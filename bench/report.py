"""``python -m bench report``: REPORT.md, summary.csv and plots from the raw records.

Runs of one configuration (``results.config_key``) are pooled: every timed window of every ok run is one
throughput sample, summarised by its median and a 95% bootstrap interval. Different device types or
hardware models never share a table: one section per (device type, hardware), each with its own header.
Inside a section, one block per workload (model, image size, per-device batch, data); precision is a
column there because comparing AMP against fp32 backends is part of the question.

Scaling efficiency is computed here, never stored: thr(backend, N) / (N x thr(single, 1)), the baseline
matched on ``BASELINE_MATCH``. Backend options (e.g. Horovod compression) are backend-specific knobs and
are not matched against ``single``; the own-world-size-1 baseline matches the full configuration.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

GiB = 2 ** 30
BASELINE = "single"
BASELINE_MATCH = ("model", "image_size", "precision", "batch_per_device", "data", "device_type", "hardware")
OWN_MATCH = BASELINE_MATCH + ("backend", "options")  # own@1: everything but the world size
SECTION = ("device_type", "hardware")
WORKLOAD = ("model", "image_size", "batch_per_device", "data")
ORDER = ("single", "dp", "ddp", "ddp_spawn", "ddp_amp_syncbn", "horovod")
STAR = "★"
CSV_FIRST = ["device_type", "hardware", "model", "image_size", "batch_per_device", "data", "precision", "backend",
             "options", "world_size"]
CPU_CAVEAT = ("**CPU figures.** These numbers come from CPU worker processes over gloo on this host; "
              "they say nothing about GPU scaling.")


def register(sub) -> None:
    p = sub.add_parser("report", help="tables (REPORT.md, summary.csv) and plots from the records")
    p.add_argument("--results", default="results/raw", help="directory of JSON records (default results/raw)")
    p.add_argument("--out", default="results/report", help="output directory (default results/report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    src, out = Path(args.results), Path(args.out)
    if not src.is_dir():
        print(f"bench: error: results directory {str(src)!r} does not exist", file=sys.stderr)
        return 2
    skipped = []

    def warn(msg):
        skipped.append(msg)
        print(f"warning: {msg}", file=sys.stderr)

    recs = usable_records(src, warn)
    if not recs:
        print(f"bench: error: no readable schema-1 records in {src}", file=sys.stderr)
        return 1
    summary = summarise(recs)
    out.mkdir(parents=True, exist_ok=True)
    md, console = render(summary, out, src, skipped)
    (out / "REPORT.md").write_text(md)
    csv = summary.drop(columns=["_recs", "_samples"]).infer_objects().round(3)
    csv[CSV_FIRST + [c for c in csv.columns if c not in CSV_FIRST]].to_csv(out / "summary.csv", index=False)
    print("\n".join(console))
    print(f"\nreport: {(out / 'REPORT.md').resolve()}")
    return 0


# ---------------------------------------------------------------------------------------------------
# Loading and pooling

def usable_records(src: Path, warn) -> list[dict]:
    """Records that can be grouped; a malformed one is skipped with one warning, never raised."""
    from bench import results

    out = []
    for rec in results.load(src, warn=warn):
        try:
            rec["_key"] = dict(zip(results.CONFIG_KEYS, results.config_key(rec)))
            if not isinstance(rec["world_size"], int) or rec["world_size"] < 1:
                raise ValueError(f"world_size {rec['world_size']!r}")
            if rec["status"] == "ok" and not window_throughputs(rec):
                raise ValueError("status ok but no timed windows or throughput")
            out.append(rec)
        except Exception as e:  # noqa: BLE001 - any malformed field: skip this record, keep the report
            warn(f"skipping {rec.get('_path')}: malformed record ({type(e).__name__}: {e})")
    return out


def window_throughputs(rec: dict) -> list[float]:
    """Global img/s of each raw window (falls back to the stored median if the windows are missing)."""
    from bench import stats

    secs = [float(s) for s in rec.get("window_seconds") or []]
    if secs and min(secs) > 0:
        return list(stats.window_throughputs(secs, rec["global_batch"] * rec["steps_per_window"]))
    return [float(rec["throughput"])] if isinstance(rec.get("throughput"), (int, float)) else []


def summarise(recs: list[dict]):
    """One row per configuration: pooled throughput, efficiency, memory, counts."""
    import pandas as pd
    from bench import results, stats

    df = pd.DataFrame([{**r["_key"], "_rec": r} for r in recs])
    rows = []
    for key, g in df.groupby(list(results.CONFIG_KEYS), sort=False, dropna=False):
        group = sorted(g["_rec"], key=lambda r: str(r["run_id"]))
        ok = [r for r in group if r["status"] == "ok"]
        samples = [x for r in ok for x in window_throughputs(r)]
        row = dict(zip(results.CONFIG_KEYS, key), runs_ok=len(ok), runs_not_ok=len(group) - len(ok),
                   status="ok" if ok else group[-1]["status"], reason=None if ok else group[-1]["reason"],
                   note="; ".join(sorted({r["note"] for r in group if r.get("note")})) or None,
                   global_img_s=None, ci95_low_img_s=None, ci95_high_img_s=None, per_device_img_s=None)
        if samples:
            med, (lo, hi) = stats.median_ci95(samples)
            row.update(global_img_s=med, ci95_low_img_s=lo, ci95_high_img_s=hi,
                       per_device_img_s=med / row["world_size"])
        dev = [device_memory(r) for r in ok]
        res = [m["reserved"] for d in dev for m in d if m["reserved"] is not None]
        alloc = [m["allocated"] for d in dev for m in d if m["allocated"] is not None]
        rss = [b for r in ok for b in r.get("host_peak_rss_bytes") or [] if b is not None]
        # GPU: reserved per device; CPU: host RSS per rank, the only memory measure there
        imb = [stats.imbalance([m["reserved"] for m in d] if d else r.get("host_peak_rss_bytes") or [])
               for d, r in zip(dev, ok)]
        imb = [x for x in imb if x is not None]
        row.update(peak_reserved_max_gib=max(res) / GiB if res else None,
                   peak_allocated_max_gib=max(alloc) / GiB if alloc else None,
                   host_rss_max_gib=max(rss) / GiB if rss else None, memory_imbalance=max(imb) if imb else None,
                   _recs=group, _samples=samples)
        rows.append(row)
    s = add_efficiency(pd.DataFrame(rows)).astype(object)
    return s.where(s.notna(), None)  # None, not NaN: an empty cell in the tables


def add_efficiency(s):
    """Efficiency (%) against single@1 and against the backend's own world-size-1 run; None if no baseline."""
    rows = s.to_dict("records")
    key = lambda r, keys: tuple(r[k] for k in keys)  # noqa: E731
    at1 = [r for r in rows if r["world_size"] == 1 and r["global_img_s"]]
    single = {key(r, BASELINE_MATCH): r["global_img_s"] for r in at1 if r["backend"] == BASELINE}
    own = {key(r, OWN_MATCH): r["global_img_s"] for r in at1}
    for col, base, keys in (("eff_vs_single_pct", single, BASELINE_MATCH), ("eff_vs_own_ws1_pct", own, OWN_MATCH)):
        s[col] = [100.0 * r["global_img_s"] / (r["world_size"] * base[key(r, keys)])
                  if r["global_img_s"] and key(r, keys) in base else None for r in rows]
    best = {}
    for i, r in enumerate(rows):
        k = tuple(r[c] for c in SECTION + WORKLOAD) + (r["world_size"],)
        if r["global_img_s"] and (k not in best or r["global_img_s"] > rows[best[k]]["global_img_s"]):
            best[k] = i
    s["best_at_world_size"] = [i in best.values() for i in range(len(rows))]
    return s


def device_memory(rec: dict) -> list[dict]:
    """Per-device peak memory in bytes, ordered by device index (empty on CPU)."""
    mem = sorted(rec.get("memory") or [], key=lambda m: (m.get("device_index") is None, m.get("device_index")))
    return [{"index": m.get("device_index"), "reserved": m.get("peak_reserved_bytes"),
             "allocated": m.get("peak_allocated_bytes"), "nvml": m.get("nvml_used_bytes")} for m in mem]


# ---------------------------------------------------------------------------------------------------
# Markdown

def md_table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    esc = lambda c: "" if c is None else str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if i in right else "---"
                                                          for i in range(len(headers))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])


def fmt(x, unit: str, digits: int = 1) -> str | None:
    return None if x is None else f"{x:,.{digits}f} {unit}"


def sort_rows(rows: list[dict]) -> list[dict]:
    rank = lambda b: (ORDER.index(b), "") if b in ORDER else (len(ORDER), str(b))  # noqa: E731
    return sorted(rows, key=lambda r: (r["world_size"], rank(r["backend"]), str(r["precision"]), r["options"]))


def label(r: dict) -> str:
    """The backend, with its options when they are not off (``horovod (compression=fp16)``)."""
    extra = ", ".join(f"{k}={v}" for k, v in json.loads(r["options"] or "{}").items() if v not in (None, False, "none"))
    return f"{r['backend']}" + (f" ({extra})" if extra else "")


def groups(rows: list[dict], keys: tuple) -> list[tuple[tuple, list[dict]]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return sorted(out.items(), key=lambda kv: tuple(str(v) for v in kv[0]))


def render(summary, out: Path, src: Path, skipped: list[str]) -> tuple[str, list[str]]:
    """REPORT.md text and the console lines (workload titles and throughput tables)."""
    import datetime as dt

    rows = summary.to_dict("records")
    n_recs = sum(len(r["_recs"]) for r in rows)
    n_ok = sum(r["runs_ok"] for r in rows)
    md = ["# Parallel backend comparison", "",
          f"{n_recs} records from `{src}` ({n_ok} ok, {n_recs - n_ok} skipped or failed) in {len(rows)} "
          f"configurations; generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}.", "",
          "Throughput is global images per second: the median over every timed window of every ok run of a "
          "configuration, with its 95% bootstrap interval. Per-device = global / world size. "
          f"{STAR} marks the highest median global throughput at each world size within its table; "
          "overlapping intervals mean the difference is not established.", ""]
    console = []
    sections = sorted(groups(rows, SECTION), key=lambda kv: (kv[0][0] != "cuda", kv[0]))
    for (device, hw), srows in sections:
        unit = "GPUs" if device == "cuda" else "CPU workers"
        md += [f"## {hw} ({device})", ""] + env_header(srows) + [""]
        console += ["", f"== {hw} ({device})" + (" -- CPU figures: nothing about GPU scaling" if device == "cpu" else "")]
        for wl, wrows in groups(srows, WORKLOAD):
            ok = sort_rows([r for r in wrows if r["runs_ok"]])
            if not ok:
                continue
            precisions = "/".join(sorted({r["precision"] for r in ok}))
            title = f"{wl[0]} {wl[1]}px, batch {wl[2]}/device, {precisions}, {wl[3]} data"
            thr = throughput_table(ok, unit)
            md += [f"### {title}", "", "**1. Throughput**", "", thr, "", "**2. Scaling efficiency**", "",
                   f"Efficiency = thr(backend, N) / (N × thr(baseline, 1)). *vs single@1*: baseline `{BASELINE}` at "
                   "world size 1 with the same model, image size, precision, per-device batch, data and hardware "
                   "(backend options not matched). *vs own@1*: the same backend and options at world size 1. "
                   "An empty cell means that baseline is not in these records.", "",
                   efficiency_table(ok, unit), "", "**3. Memory** (per device, peak over the run)", "",
                   memory_table(ok, device), ""]
            md += notes(ok)
            stem = out / "plots" / slug(device, wl[0], f"{wl[1]}px", f"b{wl[2]}", wl[3], hw=hw)
            files = plot_workload(ok, stem, f"{title}\n{hw} ({device})", unit, device)
            md += [f"![{kind}](plots/{Path(f).name})" for kind, f in files] + [""]
            console += ["", title, thr]
        bad = [(rec, r) for r in srows for rec in r["_recs"] if rec["status"] != "ok"]
        md += ["**4. Skipped and failed runs**", ""]
        md += [md_table(["backend", unit, "workload", "precision", "status", "reason", "run"],
                        [[r["backend"], r["world_size"], f"{r['model']} {r['image_size']}px b{r['batch_per_device']}",
                          r["precision"], rec["status"], rec["reason"], rec["run_id"]]
                         for rec, r in sorted(bad, key=lambda x: str(x[0]["run_id"]))], {1}) if bad else "None.", ""]
    if skipped:
        md += ["## Files not read", ""] + [f"- {m}" for m in skipped] + [""]
    return "\n".join(md), console


def throughput_table(ok: list[dict], unit: str) -> str:
    return md_table(
        ["backend", unit, "precision", "runs (windows)", "global throughput", "95% interval", "per-device throughput"],
        [[f"**{label(r)}** {STAR}" if r["best_at_world_size"] else label(r), r["world_size"], r["precision"],
          f"{r['runs_ok']} ({len(r['_samples'])})", fmt(r["global_img_s"], "img/s"),
          f"{r['ci95_low_img_s']:,.1f} – {r['ci95_high_img_s']:,.1f} img/s", fmt(r["per_device_img_s"], "img/s")]
         for r in ok], {1, 3, 4, 5, 6})


def efficiency_table(ok: list[dict], unit: str) -> str:
    return md_table(["backend", unit, "precision", "global throughput", "efficiency vs single@1",
                     "efficiency vs own@1"],
                    [[label(r), r["world_size"], r["precision"], fmt(r["global_img_s"], "img/s"),
                      fmt(r["eff_vs_single_pct"], "%"), fmt(r["eff_vs_own_ws1_pct"], "%")] for r in ok], {1, 3, 4, 5})


def memory_table(ok: list[dict], device: str) -> str:
    per = lambda xs: " · ".join(f"{i}: {b / GiB:.2f}" for i, b in xs) + " GiB" if xs else None  # noqa: E731
    from bench import stats

    rows = []
    for r in ok:
        for rec in [x for x in r["_recs"] if x["status"] == "ok"]:
            mem = device_memory(rec)
            if device == "cuda":
                res = [m["reserved"] for m in mem if m["reserved"] is not None]
                excess = res[0] - sum(res[1:]) / len(res[1:]) if len(res) > 1 else None
                rows.append([label(r), r["world_size"], rec["run_id"],
                             per([(m["index"], m["reserved"]) for m in mem if m["reserved"] is not None]),
                             per([(m["index"], m["allocated"]) for m in mem if m["allocated"] is not None]),
                             per([(m["index"], m["nvml"]) for m in mem if m["nvml"] is not None]),
                             fmt(stats.imbalance(res), "× (max/mean)", 2),
                             None if excess is None else f"{excess / GiB:+.2f} GiB"])
            else:
                rss = rec.get("host_peak_rss_bytes") or []
                rows.append([label(r), r["world_size"], rec["run_id"], per(list(enumerate(rss))),
                             fmt(stats.imbalance(rss), "× (max/mean)", 2)])
    if device == "cuda":
        return md_table(["backend", "GPUs", "run", "peak reserved, device: GiB", "peak allocated, device: GiB",
                         "NVML used, device: GiB", "imbalance (reserved)", "device 0 − mean of others"],
                        rows, {1, 6, 7})
    return md_table(["backend", "CPU workers", "run", "host peak RSS, rank: GiB", "imbalance (RSS)"], rows, {1, 4})


def notes(ok: list[dict]) -> list[str]:
    lines = [f"- `{label(r)}` ×{r['world_size']}: {r['note']}" for r in ok if r["note"]]
    lines += [f"- ⚠ `{label(r)}` ×{r['world_size']} run {rec['run_id']}: replicas hold DIFFERENT parameters "
              "after training" for r in ok for rec in r["_recs"] if rec.get("replicas_consistent") is False]
    return (["Notes:", ""] + lines + [""]) if lines else []


def slug(*parts, hw: str) -> str:
    """A file name stem; the hardware enters as a short hash (two GPU models never share a file)."""
    text = re.sub(r"[^a-z0-9]+", "-", "-".join(map(str, parts)).lower()).strip("-")
    return f"{text}-{hashlib.sha1(hw.encode()).hexdigest()[:6]}"


# ---------------------------------------------------------------------------------------------------
# Plots: one figure per kind per workload, PNG (for the README) and SVG.

def plot_workload(ok: list[dict], stem: Path, title: str, unit: str, device: str) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "figure.dpi": 120})
    stem.parent.mkdir(parents=True, exist_ok=True)
    multi_prec = len({r["precision"] for r in ok}) > 1
    series: dict[str, list[dict]] = {}
    for r in ok:
        series.setdefault(label(r) + (f" {r['precision']}" if multi_prec else ""), []).append(r)
    color = {k: plt.cm.tab10(i % 10) for i, k in enumerate(series)}
    files = []
    for kind, draw in (("throughput", _plot_throughput), ("efficiency", _plot_efficiency),
                       ("memory", _plot_memory), ("step-time", _plot_step_time)):
        fig = draw(plt, ok, series, color, unit, device)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(f"{stem}-{kind}.{ext}", dpi=120)
        plt.close(fig)
        files.append((kind, f"{stem}-{kind}.png"))
    return files


def _xticks(ax, rows, unit):
    ax.set_xticks(sorted({r["world_size"] for r in rows}))
    ax.set_xlabel(f"{unit} (world size)")
    ax.grid(alpha=0.3)


def _plot_throughput(plt, ok, series, color, unit, device):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, rs in series.items():
        n = [r["world_size"] for r in rs]
        y = [r["global_img_s"] for r in rs]
        err = [[r["global_img_s"] - r["ci95_low_img_s"] for r in rs], [r["ci95_high_img_s"] - r["global_img_s"] for r in rs]]
        ax.errorbar(n, y, yerr=err, marker="o", capsize=4, color=color[name], label=name)
    top = max(r["world_size"] for r in ok)
    base = [r for r in ok if r["backend"] == BASELINE and r["world_size"] == 1]
    base = base or sorted([r for r in ok if r["world_size"] == 1], key=lambda r: -r["global_img_s"])[:1]
    for b in base:
        ax.plot([1, top], [b["global_img_s"], top * b["global_img_s"]], "--", color="gray",
                label=f"ideal linear: N × {label(b)}@1 {b['precision']}")
    _xticks(ax, ok, unit)
    ax.set_ylabel("global throughput (img/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Throughput vs {unit} (median, 95% interval)")
    ax.legend(fontsize=9)
    return fig


def _plot_efficiency(plt, ok, series, color, unit, device):
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.8), sharey=True)
    for ax, col, what in ((axes[0], "eff_vs_single_pct", f"vs {BASELINE}@1"), (axes[1], "eff_vs_own_ws1_pct", "vs own@1")):
        drawn = False
        for name, rs in series.items():
            pts = [(r["world_size"], r[col]) for r in rs if r[col] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color[name], label=name)
                drawn = True
        ax.axhline(100, ls="--", color="gray", label="ideal (100 %)")
        if not drawn:
            ax.text(0.5, 0.5, "no baseline in these records", transform=ax.transAxes, ha="center", color="gray")
        _xticks(ax, ok, unit)
        ax.set_title(f"Scaling efficiency {what}")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("scaling efficiency (%)")
    axes[0].set_ylim(bottom=0)
    return fig


def _plot_memory(plt, ok, series, color, unit, device):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    groups_ = []
    for r in ok:
        rec = [x for x in r["_recs"] if x["status"] == "ok"][-1]  # the latest ok run
        if device == "cuda":
            mem = device_memory(rec)
            groups_.append((r, [m["reserved"] or 0 for m in mem], [m["allocated"] or 0 for m in mem]))
        else:
            groups_.append((r, list(rec.get("host_peak_rss_bytes") or []), None))
    width = 0.8 / max(1, max(len(g[1]) for g in groups_))
    for gi, (r, main, inner) in enumerate(groups_):
        for d, v in enumerate(main):
            x = gi + width * (d - (len(main) - 1) / 2)
            ax.bar(x, v / GiB, width * 0.95, color=plt.cm.tab10(d % 10), alpha=0.45 if inner else 0.9,
                   label=f"{'GPU' if inner else 'rank'} {d}")
            if inner:
                ax.bar(x, inner[d] / GiB, width * 0.55, color=plt.cm.tab10(d % 10))
        if r["memory_imbalance"]:
            ax.annotate(f"{r['memory_imbalance']:.2f}×", (gi, max(main) / GiB), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(groups_)), [f"{label(r)}\n×{r['world_size']}" for r, _, _ in groups_])
    gpu = device == "cuda"
    ax.set_ylabel("peak memory per GPU (GiB)" if gpu else "host peak RSS per rank (GiB)")
    ax.set_xlabel("backend × world size (above the bars: imbalance, max/mean)")
    ax.set_title("Per-GPU memory: peak reserved (light), allocated (dark)" if gpu else "Per-rank host memory (CPU run)")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), fontsize=8, ncol=min(4, len(seen)))
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)
    return fig


def _plot_step_time(plt, ok, series, color, unit, device):
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.8))
    data, names, colors = [], [], []
    for name, rs in series.items():
        for r in rs:
            data.append([1000 * t / rec["steps_per_window"] for rec in r["_recs"] if rec["status"] == "ok"
                         for t in rec.get("window_seconds") or []])
            names.append(f"{label(r)}\n×{r['world_size']}")
            colors.append(color[name])
    ax.boxplot(data, tick_labels=names, widths=0.5, medianprops={"color": "black"})
    rng = np.random.default_rng(0)
    for i, (d, c) in enumerate(zip(data, colors), 1):
        ax.scatter(i + rng.uniform(-0.12, 0.12, len(d)), d, s=18, color=c, zorder=3)
    ax.set_ylabel("time per step (ms), one point per timed window")
    ax.set_xlabel("backend × world size")
    ax.set_title("Step-time distribution from the raw window times")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    return fig


def env_header(rows: list[dict]) -> list[str]:
    recs = [rec for r in rows for rec in r["_recs"]]
    env = [rec.get("env") or {} for rec in recs]
    vals = lambda k: ", ".join(sorted({str(e.get(k)) for e in env if e.get(k) not in (None, "", [])})) or "—"  # noqa
    device, hw = rows[0]["device_type"], rows[0]["hardware"]
    if device == "cuda":
        count = max([e.get("gpu_count") or 0 for e in env] + [len(device_memory(rec)) for rec in recs])
        used = max(r["world_size"] for r in rows)
        lines = [f"- **Hardware:** {count} × {hw} on the host (up to {used} used); driver {vals('driver')}"]
    else:
        cores = vals("cpu_count")
        lines = [f"> {CPU_CAVEAT}", "", f"- **Hardware:** CPU, {cores} cores ({hw.removeprefix('CPU: ')}); "
                                        f"no GPU used"]
    lines.append(f"- **Software:** torch {vals('torch')}, torchvision {vals('torchvision')}, CUDA {vals('cuda')}, "
                 f"cuDNN {vals('cudnn')}, NCCL {vals('nccl')}, Python {vals('python')}"
                 + (" (CPU runs: gloo; the CUDA/NCCL builds were not used)" if device == "cpu" else ""))
    hvd = dict.fromkeys(json.dumps(e["horovod"]) for e in env if e.get("horovod"))
    builds = [json.loads(h) for h in hvd]
    lines.append("- **Horovod build:** " + (" | ".join(f"{b.pop('version', '?')} (" + "; ".join(
        f"{k}: {v}" for k, v in b.items()) + ")" for b in builds) or "not used"))
    lines.append(f"- **Host:** {vals('hostname')}; git {vals('git_commit')}; runs from "
                 f"{min(str(e.get('started_at')) for e in env)} to "
                 f"{max(str(rec.get('finished_at') or e.get('started_at')) for rec, e in zip(recs, env))}")
    topo = sorted({e["topology"] for e in env if e.get("topology")})
    if topo:
        lines.append("\n<details><summary>GPU topology (nvidia-smi topo -m)</summary>\n\n```\n"
                     + topo[0] + "\n```\n</details>")
    return lines

"""``python -m bench report``: REPORT.md, summary.csv and plots from the raw records.

Runs of one configuration (``results.config_key``) are summarised with the run as the unit
(``stats.summarise_runs``): the median of the run medians, a hierarchical bootstrap interval (runs, then
windows within a run) and the run-to-run CV; a configuration with one run gets the window bootstrap, marked
"within-run only". Different device types or
hardware models never share a table: one section per (device type, hardware), each with its own header.
Inside a section, one block per workload (model, image size, per-device batch, data); precision is a
column there, because AMP against fp32 is one of the comparisons the suite exists for.

Scaling efficiency is computed here, never stored: thr(backend, N) / (N x thr(single, 1)) with the
baseline matched on ``BASELINE_MATCH``. Backend options (Horovod compression) are the backend's own knobs
and are not matched against ``single``; the own-world-size-1 baseline matches everything but N. The cuDNN
knob is matched where such a baseline exists, else the baseline with the default (on) is used.
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
OWN_MATCH = BASELINE_MATCH + ("backend", "options")
KNOB = "cudnn_benchmark"  # matched when the baseline has it, else the default (on)
SECTION = ("device_type", "hardware")
WORKLOAD = ("model", "image_size", "batch_per_device", "data")
ORDER = ("single", "dp", "ddp", "ddp_spawn", "ddp_amp_syncbn", "horovod")  # table order; others follow
STAR = "★"
CSV_FIRST = ["device_type", "hardware", "model", "image_size", "batch_per_device", "data", "precision", "backend",
             "options", "world_size"]
WITHIN_RUN = "within-run only"
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
    print("\n".join(console) + f"\n\nreport: {(out / 'REPORT.md').resolve()}")
    return 0


# ---------------------------------------------------------------------------------------------------
# Loading and pooling

def usable_records(src: Path, warn) -> list[dict]:
    """Records that can be grouped and summarised; a malformed one is skipped with one warning."""
    from bench import results

    out = []
    for rec in results.load(src, warn=warn):
        try:
            rec["_key"] = dict(zip(results.CONFIG_KEYS, results.config_key(rec)))
            if not isinstance(rec["world_size"], int) or rec["world_size"] < 1:
                raise ValueError(f"world_size {rec['world_size']!r}")
            device_memory(rec)  # raises on malformed memory entries
            if rec["status"] == "ok" and not window_throughputs(rec):
                raise ValueError("status ok but no timed windows")
            out.append(rec)
        except Exception as e:  # noqa: BLE001 - whatever is malformed: skip this record, keep the report
            warn(f"skipping {rec.get('_path')}: malformed record ({type(e).__name__}: {e})")
    return out


def window_throughputs(rec: dict) -> list[float]:
    """Global img/s of each raw timed window (empty when the record has none)."""
    from bench import stats

    thr = stats.record_throughputs(rec)
    return [] if thr is None else thr.tolist()


def device_memory(rec: dict) -> list[dict]:
    """Per-device peak memory in bytes, ordered by device index (empty on CPU)."""
    mem = sorted(rec.get("memory") or [], key=lambda m: (m.get("device_index") is None, m.get("device_index")))
    return [{"index": m.get("device_index", i), "reserved": m.get("peak_reserved_bytes"),
             "allocated": m.get("peak_allocated_bytes"), "nvml": m.get("nvml_used_bytes"),
             "warmup_reserved": m.get("warmup_peak_reserved_bytes")} for i, m in enumerate(mem)]


def summarise(recs: list[dict]):
    """One row per configuration: run-level throughput, memory, counts, then efficiency and the best mark."""
    import pandas as pd
    from bench import results, stats

    df = pd.DataFrame([{**r["_key"], "_rec": r} for r in recs])
    rows = []
    for key, g in df.groupby(list(results.CONFIG_KEYS), sort=False, dropna=False):
        group = sorted(g["_rec"], key=lambda r: str(r["run_id"]))
        ok = [r for r in group if r["status"] == "ok"]
        thr = stats.summarise_runs([stats.record_throughputs(r) for r in ok])
        samples = [x for r in ok for x in window_throughputs(r)]
        row = dict(zip(results.CONFIG_KEYS, key), runs_ok=len(ok), runs_not_ok=len(group) - len(ok),
                   status="ok" if ok else group[-1]["status"], reason=None if ok else group[-1]["reason"],
                   note="; ".join(sorted({r["note"] for r in group if r.get("note")})) or None,
                   global_img_s=thr["median"], ci95_low_img_s=None, ci95_high_img_s=None, interval=thr["interval"],
                   cv_runs_pct=None if thr["cv_runs"] is None else 100 * thr["cv_runs"],
                   per_device_img_s=None if thr["median"] is None else thr["median"] / key[1])
        if thr["ci95"]:
            row.update(ci95_low_img_s=thr["ci95"][0], ci95_high_img_s=thr["ci95"][1])
        dev = [device_memory(r) for r in ok]
        peak = lambda field: max([m[field] for d in dev for m in d if m[field]], default=None)  # noqa: E731
        rss = [b for r in ok for b in r.get("host_peak_rss_bytes") or [] if b]
        # imbalance: reserved bytes over the GPUs; on CPU, host RSS over the ranks (the only measure there)
        imb = [stats.imbalance([m["reserved"] for m in d] if d else r.get("host_peak_rss_bytes") or [])
               for d, r in zip(dev, ok)]
        gib = lambda b: b / GiB if b else None  # noqa: E731
        row.update(peak_reserved_max_gib=gib(peak("reserved")), peak_allocated_max_gib=gib(peak("allocated")),
                   warmup_peak_reserved_max_gib=gib(peak("warmup_reserved")), host_rss_max_gib=gib(max(rss, default=None)),
                   memory_imbalance=max([x for x in imb if x is not None], default=None),
                   skipped_steps=sum(sum(r.get("skipped_steps") or []) for r in ok), _recs=group, _samples=samples)
        rows.append(row)
    return nones(add_efficiency(nones(pd.DataFrame(rows))))


def nones(df):
    """Missing values as None, never NaN (NaN is truthy, and prints as "nan" where a cell must stay empty)."""
    df = df.astype(object)
    return df.where(df.notna(), None)


def add_efficiency(s):
    """Efficiency (%) against single@1 and against the backend's own world-size-1 run; None: no baseline.
    The best mark goes to the highest median at each world size, per precision (fp16 is not ranked
    against fp32)."""
    rows = s.to_dict("records")
    key = lambda r, keys: tuple(r[k] for k in keys)  # noqa: E731
    at1 = [r for r in rows if r["world_size"] == 1 and r["global_img_s"]]
    single = {(key(r, BASELINE_MATCH), r[KNOB]): r["global_img_s"] for r in at1 if r["backend"] == BASELINE}
    own = {(key(r, OWN_MATCH), r[KNOB]): r["global_img_s"] for r in at1}

    def base_of(r, table, keys):
        for knob in dict.fromkeys((r[KNOB], True, None)):  # the same cuDNN setting, else the default
            if (key(r, keys), knob) in table:
                return table[(key(r, keys), knob)]
        return None

    for col, table, keys in (("eff_vs_single_pct", single, BASELINE_MATCH), ("eff_vs_own_ws1_pct", own, OWN_MATCH)):
        bases = [base_of(r, table, keys) if r["global_img_s"] else None for r in rows]
        s[col] = [100.0 * r["global_img_s"] / (r["world_size"] * b) if b else None for r, b in zip(rows, bases)]
    best = {}
    for i, r in enumerate(rows):
        k = key(r, SECTION + WORKLOAD + ("world_size", "precision"))
        if r["global_img_s"] and (k not in best or r["global_img_s"] > rows[best[k]]["global_img_s"]):
            best[k] = i
    s["best_at_world_size"] = [i in best.values() for i in range(len(rows))]
    return s


# ---------------------------------------------------------------------------------------------------
# Markdown

def md_table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    esc = lambda c: "" if c is None else str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
    return "\n".join(["| " + " | ".join(headers) + " |", rule] + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def fmt(x, unit: str, digits: int = 1) -> str | None:
    return None if x is None else f"{x:,.{digits}f} {unit}"


def label(r: dict) -> str:
    """The backend, with its options where they are switched on: ``horovod (compression=fp16)``, and the cuDNN
    knob where it is off (``dp (cudnn.benchmark off)``)."""
    options = r["options"] if isinstance(r["options"], dict) else json.loads(r["options"] or "{}")
    extra = [f"{k}={v}" for k, v in options.items() if v not in (None, False, "none")]
    if r.get(KNOB) is False:
        extra.append("cudnn.benchmark off")
    return r["backend"] + (f" ({', '.join(extra)})" if extra else "")


def groups(rows: list[dict], keys: tuple) -> list[tuple[tuple, list[dict]]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return sorted(out.items(), key=lambda kv: [str(v) for v in kv[0]])


def sort_rows(rows: list[dict]) -> list[dict]:
    rank = lambda b: (ORDER.index(b), "") if b in ORDER else (len(ORDER), str(b))  # noqa: E731
    return sorted(rows, key=lambda r: (r["world_size"], rank(r["backend"]), str(r["precision"]), r["options"],
                                       r.get(KNOB) is False))


def render(summary, out: Path, src: Path, skipped: list[str]) -> tuple[str, list[str]]:
    """REPORT.md and the console lines (each workload's throughput table); draws the plots on the way."""
    import datetime as dt

    rows = summary.to_dict("records")
    n_recs, n_ok = sum(len(r["_recs"]) for r in rows), sum(r["runs_ok"] for r in rows)
    md = ["# Parallel backend comparison", "",
          f"{n_recs} records from `{src}` ({n_ok} ok, {n_recs - n_ok} skipped or failed) in {len(rows)} "
          f"configurations; generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}.", "",
          "Throughput is global images per second. The run is the statistical unit: a configuration's figure is "
          "the median of its runs' medians, its 95% interval a hierarchical bootstrap (runs, then windows within a "
          "run), and *CV* the run-to-run spread. With one run only the spread between its windows is known: the "
          "interval then says *within-run only* and understates the uncertainty (`bench run --repeat 3`). "
          f"Per-device = global / world size. {STAR} marks the highest median global throughput at each world "
          "size and precision in its table; where the intervals overlap, the difference is not established.", ""]
    console = []
    for (device, hw), srows in sorted(groups(rows, SECTION), key=lambda kv: (kv[0][0] != "cuda", kv[0])):
        unit = "GPUs" if device == "cuda" else "CPU workers"
        md += [f"## {hw} ({device})", ""] + env_header(srows) + [""]
        caveat = " -- CPU figures: nothing about GPU scaling" if device == "cpu" else ""
        console += ["", f"== {hw} ({device}){caveat}"]
        for wl, wrows in groups(srows, WORKLOAD):
            ok = sort_rows([r for r in wrows if r["runs_ok"]])
            if not ok:  # only skipped/failed runs: they are listed in table 4
                continue
            title = (f"{wl[0]} {wl[1]}px, batch {wl[2]}/device, {'/'.join(sorted({r['precision'] for r in ok}))}, "
                     f"{wl[3]} data")
            thr = throughput_table(ok, unit)
            stem = out / "plots" / slug(device, wl[0], f"{wl[1]}px", f"b{wl[2]}", wl[3], hw=hw)
            plots = plot_workload(ok, stem, f"{title} · {hw} ({device})", unit, device)
            md += [f"### {title}", "", "**1. Throughput**", "", thr, "", "**2. Scaling efficiency**", "",
                   f"Efficiency = thr(backend, N) / (N × thr(baseline, 1)). *vs single@1*: baseline `{BASELINE}` at "
                   "world size 1 with the same model, image size, precision, per-device batch, data and hardware "
                   "(backend options not matched). *vs own@1*: the same backend and options at world size 1. "
                   "An empty cell means that baseline is not in these records.", "",
                   efficiency_table(ok, unit), "", "**3. Memory** (timed-window peak per GPU, or per rank on CPU, after warm-up; warm-up's own peak "
                   "in the last column; every ok run)", "",
                   memory_table(ok, device), ""] + notes(ok)
            md += [f"![{kind}](plots/{name})" for kind, name in plots] + [""]
            console += ["", title, thr]
        bad = sorted(((rec, r) for r in srows for rec in r["_recs"] if rec["status"] != "ok"),
                     key=lambda x: str(x[0]["run_id"]))
        bad_rows = [[r["backend"], r["world_size"], f"{r['model']} {r['image_size']}px b{r['batch_per_device']}",
                     r["precision"], rec["status"], rec["reason"], rec["run_id"]] for rec, r in bad]
        md += ["**4. Skipped and failed runs**", "", md_table(["backend", unit, "workload", "precision", "status",
                                                               "reason", "run"], bad_rows, {1}) if bad else "None.", ""]
    if skipped:
        md += ["## Files not read", ""] + [f"- {m}" for m in skipped] + [""]
    return "\n".join(md), console


def env_header(rows: list[dict]) -> list[str]:
    """What produced the numbers: hardware, driver, software versions, Horovod build, host and dates."""
    recs = [rec for r in rows for rec in r["_recs"]]
    env = [rec.get("env") or {} for rec in recs]
    vals = lambda k: ", ".join(sorted({str(e[k]) for e in env if e.get(k) not in (None, "", [])})) or "—"  # noqa
    device, hw = rows[0]["device_type"], rows[0]["hardware"]
    if device == "cuda":
        count = max([e.get("gpu_count") or 0 for e in env] + [r["world_size"] for r in rows])
        lines = [f"- **Hardware:** {count} × {hw} on the host (up to {max(r['world_size'] for r in rows)} used); "
                 f"driver {vals('driver')}"]
    else:
        lines = [f"> {CPU_CAVEAT}", "", f"- **Hardware:** CPU, {vals('cpu_count')} cores ({hw.removeprefix('CPU: ')}); "
                                        "no GPU used"]
    lines.append(f"- **Software:** torch {vals('torch')}, torchvision {vals('torchvision')}, CUDA {vals('cuda')}, "
                 f"cuDNN {vals('cudnn')}, NCCL {vals('nccl')}, Python {vals('python')}"
                 + (" (CPU runs use gloo: the CUDA and NCCL builds were not exercised)" if device == "cpu" else ""))
    builds = [json.loads(h) for h in dict.fromkeys(json.dumps(e["horovod"]) for e in env if e.get("horovod"))]
    builds = [f"{b.pop('version', '?')} (" + "; ".join(f"{k}: {v}" for k, v in b.items()) + ")" for b in builds]
    lines.append("- **Horovod build:** " + (" | ".join(builds) or "not used"))
    lines.append(f"- **Host:** {vals('hostname')}; git {vals('git_commit')}; runs from "
                 f"{min(str(e.get('started_at')) for e in env)} to "
                 f"{max(str(rec.get('finished_at') or e.get('started_at')) for rec, e in zip(recs, env))}")
    topo = sorted({e["topology"] for e in env if e.get("topology")})
    if topo:
        lines.append(f"\n<details><summary>GPU topology (nvidia-smi topo -m)</summary>\n\n```\n{topo[0]}\n```\n"
                     "</details>")
    return lines


def throughput_table(ok: list[dict], unit: str) -> str:
    def interval(r):
        text = f"{r['ci95_low_img_s']:,.1f} – {r['ci95_high_img_s']:,.1f} img/s"
        return text + (" (within-run only)" if r["interval"] == WITHIN_RUN else "")

    return md_table(
        ["backend", unit, "precision", "runs (windows)", "global throughput", "95% interval", "CV across runs",
         "per-device throughput"],
        [[f"**{label(r)}** {STAR}" if r["best_at_world_size"] else label(r), r["world_size"], r["precision"],
          f"{r['runs_ok']} ({len(r['_samples'])})", fmt(r["global_img_s"], "img/s"), interval(r),
          fmt(r["cv_runs_pct"], "%"), fmt(r["per_device_img_s"], "img/s")]
         for r in ok], {1, 3, 4, 5, 6, 7})


def efficiency_table(ok: list[dict], unit: str) -> str:
    return md_table(["backend", unit, "precision", "global throughput", "efficiency vs single@1",
                     "efficiency vs own@1"],
                    [[label(r), r["world_size"], r["precision"], fmt(r["global_img_s"], "img/s"),
                      fmt(r["eff_vs_single_pct"], "%"), fmt(r["eff_vs_own_ws1_pct"], "%")] for r in ok], {1, 3, 4, 5})


def memory_table(ok: list[dict], device: str) -> str:
    """One row per ok run; on GPU, device 0's excess over the others shows nn.DataParallel's imbalance."""
    from bench import stats

    per = lambda xs: " · ".join(f"{i}: {b / GiB:.2f}" for i, b in xs) + " GiB" if xs else None  # noqa: E731
    rows = []
    for r in ok:
        for rec in (x for x in r["_recs"] if x["status"] == "ok"):
            if device != "cuda":
                rss = rec.get("host_peak_rss_bytes") or []
                warm = max([b for b in rec.get("warmup_host_peak_rss_bytes") or [] if b], default=None)
                rows.append([label(r), r["world_size"], rec["run_id"], per(list(enumerate(rss))),
                             fmt(stats.imbalance(rss), "× (max/mean)", 2), fmt(warm and warm / GiB, "GiB", 2)])
                continue
            mem = device_memory(rec)
            res = [m["reserved"] for m in mem if m["reserved"] is not None]
            excess = res[0] - sum(res[1:]) / len(res[1:]) if len(res) > 1 else None
            nvml = max([m["nvml"] for m in mem if m["nvml"]], default=None)
            per_device = [per([(m["index"], m[k]) for m in mem if m[k] is not None]) for k in ("reserved", "allocated")]
            warm = max([m["warmup_reserved"] for m in mem if m["warmup_reserved"]], default=None)
            rows.append([label(r), r["world_size"], rec["run_id"], *per_device, fmt(nvml and nvml / GiB, "GiB", 2),
                         fmt(stats.imbalance(res), "× (max/mean)", 2),
                         None if excess is None else f"{excess / GiB:+.2f} GiB", fmt(warm and warm / GiB, "GiB", 2)])
    if device != "cuda":
        return md_table(["backend", "CPU workers", "run", "host peak RSS, rank: GiB", "imbalance (RSS)",
                         "warm-up peak RSS, max"], rows, {1, 4, 5})
    return md_table(["backend", "GPUs", "run", "peak reserved, device: GiB", "peak allocated, device: GiB",
                     "NVML used, max", "imbalance (reserved)", "device 0 − mean of the others",
                     "warm-up peak reserved, max"], rows, {1, 5, 6, 7, 8})


def notes(ok: list[dict]) -> list[str]:
    lines = [f"- `{label(r)}` ×{r['world_size']}: {r['note']}" for r in ok if r["note"]]
    lines += [f"- ⚠ `{label(r)}` ×{r['world_size']} run {rec['run_id']}: replicas hold DIFFERENT parameters after "
              "training" for r in ok for rec in r["_recs"] if rec.get("replicas_consistent") is False]
    for r in ok:
        for rec in r["_recs"]:
            hit = [i + 1 for i, n in enumerate(rec.get("skipped_steps") or []) if n]
            if hit:
                lines.append(f"- ⚠ `{label(r)}` ×{r['world_size']} run {rec['run_id']}: GradScaler skipped "
                             f"{sum(rec['skipped_steps'])} optimizer step(s) (fp16 overflow) in window(s) "
                             f"{', '.join(map(str, hit))}: those windows timed fewer real updates")
    lines += cudnn_lines(ok)
    return ["Notes:", ""] + lines + [""] if lines else []


def cudnn_lines(ok: list[dict]) -> list[str]:
    """Where a backend ran with cudnn.benchmark on and off at one world size: both figures and what they mean."""
    out = []
    for (backend, n, precision), rs in groups(ok, ("backend", "world_size", "precision")):
        on = [r for r in rs if r[KNOB] is True]
        off = [r for r in rs if r[KNOB] is False]
        if not (on and off and on[0]["global_img_s"] and off[0]["global_img_s"]):
            continue
        a, b = on[0], off[0]
        ratio = a["global_img_s"] / b["global_img_s"]
        overlap = a["ci95_low_img_s"] <= b["ci95_high_img_s"] and b["ci95_low_img_s"] <= a["ci95_high_img_s"]
        if overlap:
            verdict = "Here the 95% intervals overlap: no difference is established."
        elif ratio < 1:
            verdict = ("Here off is faster: the on figure includes that repeated search, which says more about "
                       "cuDNN's cache than about DataParallel's design.")
        else:
            verdict = "Here on is faster: the search is not repeated at a cost that shows, and the on figure stands."
        out.append(
            f"- `{backend}` ×{n} {precision}, cudnn.benchmark on vs off: {on[0]['global_img_s']:,.1f} vs "
            f"{off[0]['global_img_s']:,.1f} img/s (on/off = {ratio:.2f}). cuDNN keeps its benchmark cache per "
            "thread, and nn.DataParallel runs each replica in a new thread on every forward, so with the knob on "
            "its replicas may repeat the algorithm search every step. " + verdict)
    return out


def slug(*parts, hw: str) -> str:
    """A file-name stem; the hardware enters as a short hash, so two GPU models never share a file."""
    text = re.sub(r"[^a-z0-9]+", "-", "-".join(map(str, parts)).lower()).strip("-")
    return f"{text}-{hashlib.sha1(hw.encode()).hexdigest()[:6]}"


# ---------------------------------------------------------------------------------------------------
# Plots: one figure per kind per workload, PNG (dpi 120, for the README) and SVG.

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
    color = {name: plt.cm.tab10(i % 10) for i, name in enumerate(series)}
    files = []
    for kind, draw in (("throughput", _plot_throughput), ("efficiency", _plot_efficiency),
                       ("memory", _plot_memory), ("step-time", _plot_step_time)):
        fig, heading = draw(plt, ok, series, color, unit, device)
        fig.suptitle(f"{heading}\n{title}", fontsize=10)
        fig.tight_layout()
        for ext in ("png", "svg"):
            fig.savefig(f"{stem}-{kind}.{ext}", dpi=120)
        plt.close(fig)
        files.append((kind, f"{stem.name}-{kind}.png"))
    return files


def _world_size_axis(ax, rows, unit):
    sizes = sorted({r["world_size"] for r in rows})
    ax.set_xticks(sizes)
    ax.set_xlim(0.5, sizes[-1] + 0.5)
    ax.set_xlabel(f"{unit} (world size)")
    ax.grid(alpha=0.3)


def _plot_throughput(plt, ok, series, color, unit, device):
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, rs in series.items():
        y = [r["global_img_s"] for r in rs]
        err = [[r["global_img_s"] - r["ci95_low_img_s"] for r in rs],
               [r["ci95_high_img_s"] - r["global_img_s"] for r in rs]]
        ax.errorbar([r["world_size"] for r in rs], y, yerr=err, marker="o", capsize=4, color=color[name], label=name)
    # ideal linear scaling from single@1 (one line per precision); without it, from the best world-size-1 run
    top = max(r["world_size"] for r in ok)
    base = [r for r in ok if r["backend"] == BASELINE and r["world_size"] == 1]
    for b in base or sorted((r for r in ok if r["world_size"] == 1), key=lambda r: -r["global_img_s"])[:1]:
        ax.plot([1, top], [b["global_img_s"], top * b["global_img_s"]], "--", color="gray",
                label=f"ideal linear: N × {label(b)}@1 {b['precision']}")
    _world_size_axis(ax, ok, unit)
    ax.set_ylabel("global throughput (img/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    return fig, f"Throughput vs {unit}: median and 95% interval"


def _plot_efficiency(plt, ok, series, color, unit, device):
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.8), sharey=True)
    for ax, col, what in zip(axes, ("eff_vs_single_pct", "eff_vs_own_ws1_pct"), (f"vs {BASELINE}@1", "vs own@1")):
        drawn = False
        for name, rs in series.items():
            pts = [(r["world_size"], r[col]) for r in rs if r[col] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color[name], label=name)
                drawn = True
        ax.axhline(100, ls="--", color="gray", label="ideal (100 %)")
        if not drawn:
            ax.text(0.5, 0.5, "no such baseline in these records", transform=ax.transAxes, ha="center", color="gray")
        _world_size_axis(ax, ok, unit)
        ax.set_title(what)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("scaling efficiency (%)")
    axes[0].set_ylim(bottom=0)
    return fig, "Scaling efficiency: thr(N) / (N × thr(baseline, 1))"


def _panels(plt, ok, series, unit):
    """Small multiples: one panel per world size, each grouping that world size's configurations by backend."""
    sizes = sorted({r["world_size"] for r in ok})
    cols, rows = min(len(sizes), 2), -(-len(sizes) // 2)
    fig, axes = plt.subplots(rows, cols, figsize=(8, 4.8) if len(sizes) == 1 else (10, 1.2 + 3.4 * rows),
                             sharey=True, squeeze=False)
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
                ax.annotate(f"{r['memory_imbalance']:.2f}×", (g, max(m for _, m, _ in devs) / GiB), ha="center",
                            va="bottom", fontsize=9)
        ax.margins(y=0.15)
    panels[0][0].set_ylabel("peak memory per GPU (GiB)" if gpu else "host peak RSS per rank (GiB)")
    ax, _ = panels[-1]
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    if handles:
        ax.legend(handles.values(), handles.keys(), fontsize=8, ncol=min(4, len(handles)))
    return fig, (("Per-GPU peak memory: reserved (light), allocated (dark)" if gpu else "Per-rank host peak memory")
                 + "; above the bars: imbalance max/mean")


def _plot_step_time(plt, ok, series, color, unit, device):
    """Box per configuration over its raw windows (time per step), the windows themselves as points."""
    import numpy as np

    rng = np.random.default_rng(0)
    color_of = {id(r): color[name] for name, rs in series.items() for r in rs}
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

"""REPORT.md: one section per hardware, one block per workload, the tables and the notes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.report import accuracy, caution, comm, reference, tune, verdict
from bench.report.common import (
    BASELINE,
    rate,
    shown,
    workload_title,
    CPU_CAVEAT,
    KNOB,
    SECTION,
    STAR,
    WITHIN_RUN,
    WORKLOAD,
    GiB,
    fmt,
    groups,
    label,
    mark,
    md_table,
    slug,
    sort_rows,
)
from bench.report.equivalence import eval_table
from bench.report.equivalence import section as equivalence_section
from bench.report.headroom import section as headroom_section
from bench.report.maxmodel import section as maxmodel_section
from bench.report.overhead import section as overhead_section
from bench.report.inputbound import section as input_bound_section
from bench.report.plots import plot_workload
from bench.report.settings import section as settings_section
from bench.report.timeline import section as timeline_section
from bench.report.summary import IMBALANCE_WORDS, VERDICT_IMBALANCE, device_memory, imbalances
from bench.report.verdict import duration, epoch_seconds
from bench.core import workloads
from bench.core.trust import SAME_COMPUTATION


def render(summary, out: Path, src: Path, skipped: list[str]) -> tuple[str, list[str], list[dict]]:
    """REPORT.md, the console lines (each workload's throughput table) and the verdicts; draws the plots on the
    way."""
    import datetime as dt

    rows = summary.to_dict("records")
    n_recs, n_ok = sum(len(r["_recs"]) for r in rows), sum(r["runs_ok"] for r in rows)

    def warn(m):
        skipped.append(m)
        print(f"warning: {m}", file=sys.stderr)

    best = tune.latest(src, warn)  # bench tune: the backends at their best, beside the shared defaults
    verdicts = verdict.verdicts(rows) + tune.verdicts(best) \
        + accuracy.verdicts(src, lambda m: None)  # time to accuracy: report/accuracy.py
    md = ["# Parallel backend comparison", "",
          f"{n_recs} records from `{src}` ({n_ok} ok, {n_recs - n_ok} skipped or failed) in {len(rows)} "
          f"configurations; generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}.", ""]
    md += verdict.markdown(verdicts, rows)
    md += ["## How to read the tables", "",
           "Throughput is global samples per second: images (img/s), or sequences (seq/s) for a language model, whose "
          "tables also give tokens per second. The run is the statistical unit: a configuration's figure is "
          "the median of its runs' medians, its 95% interval a hierarchical bootstrap (runs, then windows within a "
          "run), and *CV* the run-to-run spread. With one run only the spread between its windows is known: the "
          "interval then says *within-run only* and understates the uncertainty (`bench run --repeat 3`). "
          f"Per-device = global / world size. {STAR} marks the highest median global throughput at each world "
          "size and precision in its table; where the intervals overlap, the difference is not established. A "
           "figure with the warning mark should not be believed as it stands (the warnings under each workload's tables "
           "say why); a figure derived from a disturbed or impossible input is not shown: the mark and the reason "
           "stand in its place.", ""]
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
            w = dict(zip(WORKLOAD, wl))
            title = (f"{workload_title(w)}, batch {w['batch_per_device']}/device, "
                     f"{'/'.join(sorted({r['precision'] for r in ok}))}, {w['data']} data")
            thr = throughput_table(ok, unit)
            stem = out / "plots" / slug(device, w["model"], workloads.shape(w), w["optimizer"], f"b{w['batch_per_device']}",
                                        w["data"], hw=hw)
            plots = plot_workload(ok, stem, f"{title} · {hw} ({device})", unit, device)
            md += [f"### {title}", "", "**1. Throughput**", "", thr, "", "**2. Scaling efficiency**", "",
                   f"Efficiency = thr(backend, N) / (N × thr(baseline, 1)). *vs single@1*: baseline `{BASELINE}` at "
                   "world size 1 with the same model, image size, precision, per-device batch, data and hardware "
                   "and the same workload settings it shares with every backend (channels_last, `--compile`, ...) and cuDNN setting "
                   "(a backend's own options not matched). *vs own@1*: the same backend and options at world size 1. "
                   "An empty cell means that baseline is not in these records. Runs over several nodes (`k nodes × m`) also "
                   "show *intra-node* efficiency (the same backend on one node at m, vs own@1) and *inter-node* "
                   "efficiency (thr / (k × thr of that one-node run)): what crossing the network costs.", "",
                   efficiency_table(ok, unit), "", "**3. Memory** (timed-window peak per GPU, or per rank on CPU, after warm-up; warm-up's own peak "
                   "in the last column; every ok run)" + (f". {MEMORY_WORDS}" if device == "cuda" else ""), "",
                   memory_table(ok, device), ""] + eval_table(ok, label) + comm.comm_table(ok, unit) \
                + comm.overlap_table(ok, unit) \
                + comm.hardware_table(ok, unit) + reference.twin_table(ok) + reference.compile_table(ok) + notes(ok) \
                + caution.section(ok)
            plots += comm.plot_split(ok, stem, f"{title} · {hw} ({device})", unit)
            md += [f"![{kind}](plots/{name})" for kind, name in plots] + [""]
            console += ["", title, thr]
        bad = sorted(((rec, r) for r in srows for rec in r["_recs"] if rec["status"] != "ok"),
                     key=lambda x: str(x[0]["run_id"]))
        bad_rows = [[r["backend"], r["world_size"], f"{workload_title(r)} b{r['batch_per_device']}",
                     r["precision"], rec["status"], rec["reason"], rec["run_id"]] for rec, r in bad]
        md += [f"### {verdict.SKIPPED_SECTION}", "", md_table(["backend", unit, "workload", "precision", "status",
                                                               "reason", "run"], bad_rows, {1}) if bad else "None.", ""]
    md += tune.section(best) + settings_section(rows) + overhead_section(src, warn) + timeline_section(rows, out)
    md += input_bound_section(src, rows, warn) + headroom_section(src, rows, warn) \
        + maxmodel_section(src, out, warn) + accuracy.section(src, out, warn) + equivalence_section(src, warn) \
        + comm.collectives_section(src, out, rows, warn) + comm.prediction_section(src)
    if skipped:
        md += ["## Files not read", ""] + [f"- {m}" for m in skipped] + [""]
    return "\n".join(md), console, verdicts


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
    torches = sorted({str(e["torch"]) for e in env if e.get("torch")})
    if len(torches) > 1:
        lines.append(f"- **Warning: {len(torches)} torch versions** ({', '.join(torches)}) produced these records: a "
                     "difference between rows may come from torch, not the backend. Compare runs of one version "
                     "(install from requirements.lock on every machine, or one `TORCH=system` build).")
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
    """The last column: tokens/s for a language model, the ImageNet-1k epoch for an image classifier, none for a
    user's model."""
    seq = workloads.size(ok[0], "seq_len")  # one workload per table
    epoch = workloads.of_record(ok[0]).kind == "vision"
    def interval(r):
        text = f"{r['ci95_low_img_s']:,.1f} – {r['ci95_high_img_s']:,.1f} {rate(r)}"
        return text + (" (within-run only)" if r["interval"] == WITHIN_RUN else "")

    last = ["global tokens/s"] if seq else ["ImageNet-1k epoch"] if epoch else []
    return md_table(
        ["backend", unit, "precision", "runs (windows)", "global throughput", "95% interval", "CV across runs",
         "per-device throughput", *last],
        [[f"**{label(r)}** {STAR}" if r["best_at_world_size"] else label(r), r["world_size"], r["precision"],
          f"{r['runs_ok']} ({len(r['_samples'])})",
          mark(fmt(r["global_img_s"], rate(r)), r, "throughput") + reference.host_bound_mark(r), interval(r),
          mark(fmt(r["cv_runs_pct"], "%"), r, "cv"), fmt(r["per_device_img_s"], rate(r))]
         + ([fmt(r["global_img_s"] and r["global_img_s"] * seq, "tokens/s", 0)] if seq
            else [duration(epoch_seconds(r["global_img_s"]))] if epoch else [])
         for r in ok], {1, 3, 4, 5, 6, 7, 8})


def efficiency_table(ok: list[dict], unit: str) -> str:
    """With runs over several nodes, two more columns split their efficiency: within a node (the same backend on
    one node at the processes per node, vs its own @1) and across nodes (vs node count × that one-node run)."""
    nodes = any((r.get("nnodes") or 1) > 1 for r in ok)
    extra = ["intra-node efficiency", "inter-node efficiency"] if nodes else []
    return md_table(["backend", unit, "precision", "global throughput", "efficiency vs single@1",
                     "efficiency vs own@1", *extra],
                    [[label(r), r["world_size"], r["precision"], mark(fmt(r["global_img_s"], rate(r)), r, "throughput"),
                      shown(fmt(r["eff_vs_single_pct"], "%"), r, "eff_vs_single",
                            kinds=(SAME_COMPUTATION,) if r["world_size"] == 1 else ()),
                      shown(fmt(r["eff_vs_own_ws1_pct"], "%"), r, "eff_vs_own")]
                     + ([fmt(r.get("intra_node_eff_pct"), "%"), fmt(r.get("inter_node_eff_pct"), "%")] if nodes else [])
                     for r in ok], {1, 3, 4, 5, 6, 7})


def memory_table(ok: list[dict], device: str) -> str:
    """One row per ok run; on GPU, device 0's excess over the others shows nn.DataParallel's imbalance."""
    from bench.core import stats

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
            mine = [m[VERDICT_IMBALANCE] for m in mem if m[VERDICT_IMBALANCE] is not None]
            excess = mine[0] - sum(mine[1:]) / len(mine[1:]) if len(mine) > 1 else None
            gibs = lambda *xs: " / ".join("–" if x is None else f"{x / GiB:.2f}" for x in xs)  # noqa: E731
            side = " · ".join(f"{m['index']}: {gibs(m['allocated'], m['reserved'], m['nvml'])}" for m in mem)
            imb = imbalances(mem, rec)
            warm = max([m["warmup_reserved"] for m in mem if m["warmup_reserved"]], default=None)
            rows.append([label(r), r["world_size"], rec["run_id"], side and side + " GiB",
                         *[fmt(imb[k], "×", 2) for k in IMBALANCE_WORDS],
                         None if excess is None else f"{excess / GiB:+.2f} GiB", fmt(warm and warm / GiB, "GiB", 2)])
    if device != "cuda":
        return md_table(["backend", "CPU workers", "run", "host peak RSS, rank: GiB", "imbalance (RSS)",
                         "warm-up peak RSS, max"], rows, {1, 4, 5})
    return md_table(["backend", "GPUs", "run", "GPU: peak allocated / peak reserved / NVML used", "imbalance (allocated)",
                     "imbalance (reserved)", "imbalance (NVML used)", "GPU 0 − mean of the others (allocated)",
                     "warm-up peak reserved, max"], rows, {1, 4, 5, 6, 7, 8})


MEMORY_WORDS = ("Per GPU, side by side: peak allocated (what the tensors held), peak reserved (that plus the caching "
                "allocator's slack) and NVML's used bytes (the whole GPU, read after the windows: that plus the CUDA "
                "context, NCCL's buffers and any other process, what going from 1 to N GPUs adds). Imbalance = max / "
                "mean over the GPUs, on each; the verdict reads the imbalance of peak allocated, where "
                "nn.DataParallel's GPU-0 load (gathered outputs, reduced gradients) shows.")


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
    lines += reference.notes(ok)  # --compile slower than eager, graphs compiled inside a window
    lines += [f"- `{label(r)}` ×{r['world_size']}: memory imbalance {r['memory_imbalance']:.2f}× (max/mean "
              f"{IMBALANCE_WORDS[VERDICT_IMBALANCE]}) "
              f"is reported from its cudnn.benchmark-off run; with the knob on it measured "
              f"{r['memory_imbalance_with_search']:.2f}×, which holds cuDNN's algorithm search repeated in "
              "DataParallel's new replica threads every step (cuDNN's cache is per thread)"
              for r in ok if r.get("memory_imbalance_from")]
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

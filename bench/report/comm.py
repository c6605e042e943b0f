"""Why the scaling is what it is: exposed communication per backend (the compute-only reference), the hardware
efficiency (FLOPs, MFU, energy), collective bandwidth (bench collectives) and predicted vs measured scaling
(bench predict)."""
from __future__ import annotations

from pathlib import Path

from bench.report.common import (fmt, label, legend_outside, md_table, plain, rate, save_figure, shown, slug,
                                 withheld)
from bench.core import workloads

BUCKET_MB = 25.0  # DDP's default bucket_cap_mb, for the predictions in the report


def split(r: dict) -> dict | None:
    """Scaling loss of a configuration at N >= 2 in two parts that add up to 1 - efficiency vs single@1:
    communication (compute-only at N vs the backend at N) and everything else (compute-only at N vs N x single@1:
    core contention on CPU, host and launch overhead on GPUs). Exposed communication per step =
    step time - compute-only step time, and its share 1 - thr / thr(compute-only)."""
    thr, co, eff = r["global_img_s"], r.get("compute_only_img_s"), r.get("eff_vs_single_pct")
    if not (thr and co and r["world_size"] > 1):
        return None
    step, co_step = r["batch_per_device"] / (thr / r["world_size"]), r["batch_per_device"] / (co / r["world_size"])
    out = {"exposed_ms": 1000 * (step - co_step), "exposed_share": 1 - thr / co, "comm_loss": None, "other_loss": None}
    if eff:
        ideal = thr / (eff / 100)  # N x thr(single@1)
        out.update(comm_loss=(co - thr) / ideal, other_loss=1 - co / ideal)
    return out


def comm_table(ok: list[dict], unit: str) -> list[str]:
    rows = []
    for r in ok:
        if r["world_size"] < 2 or not (r.get("compute_only_img_s") or r.get("compute_only_reason")):
            continue
        s = split(r)
        pct = lambda x: None if x is None else f"{100 * x:.1f} %"  # noqa: E731
        rows.append([label(r), r["world_size"], r["precision"], fmt(r.get("global_img_s"), rate(r)),
                     fmt(r.get("compute_only_img_s"), rate(r)), s and shown(f"{s['exposed_ms']:.1f} ms", r, "exposed"),
                     s and shown(pct(s["exposed_share"]), r, "exposed"),
                     s and shown(pct(s["comm_loss"]), r, "comm_loss"),
                     s and shown(pct(s["other_loss"]), r, "other_loss"),
                     r.get("compute_only_keeps") or (None if s else f"not measured: {r.get('compute_only_reason')}")])
    if not rows:
        return []
    return ["**4. Where the scaling goes** (compute-only reference: the same processes with the gradient "
            "synchronisation skipped, right after the timed windows)", "",
            md_table(["backend", unit, "precision", "global throughput", "compute-only throughput",
                      "exposed communication / step", "exposed share", "scaling loss: communication",
                      "scaling loss: everything else", "still communicated / why not measured"], rows,
                     {1, 3, 4, 5, 6, 7, 8}), ""]


MANUAL = "allreduce_manual"


def overlap_table(ok: list[dict], unit: str) -> list[str]:
    """What DDP's buckets and overlap buy, at each world size and precision where the hand-written all-reduce ran both
    ways beside ``ddp``: per tensor against bucketed is the launch overhead of many small collectives, bucketed against
    ddp what overlapping them with the backward buys (bench run --variants plans the bucketed one)."""
    at: dict[tuple, dict] = {}
    for r in ok:
        if not r["global_img_s"] or r["world_size"] < 2:
            continue
        which = ("naive" if r.get("mode", "default") == "default" else "bucketed") if r["backend"] == MANUAL else \
            "ddp" if r["backend"] == "ddp" and plain(r) else None
        if which:
            at.setdefault((r["world_size"], r["precision"]), {})[which] = r
    rows = []
    for (n, precision), got in sorted(at.items()):
        if len(got) < 3:
            continue
        naive, bucketed, ddp = (got[k]["global_img_s"] for k in ("naive", "bucketed", "ddp"))
        rows.append([n, precision, fmt(naive, rate(got["ddp"])), fmt(bucketed, rate(got["ddp"])),
                     fmt(ddp, rate(got["ddp"])), f"{100 * (1 - naive / ddp):.1f} %",
                     f"{100 * (1 - naive / bucketed):.1f} %", f"{100 * (1 - bucketed / ddp):.1f} %"])
    if not rows:
        return []
    return ["**What DDP's buckets and overlap buy** (the hand-written all-reduce after backward, one collective per "
            "gradient tensor, then the same gradients in DDP-sized buckets, against `ddp`; medians of the runs)", "",
            md_table([unit, "precision", "hand-written, per tensor", "hand-written, bucketed", "ddp",
                      "gap to ddp", "of it: launch overhead (per tensor vs bucketed)",
                      "of it: overlap (bucketed vs ddp)"], rows, {0, 2, 3, 4, 5, 6, 7}), ""]


def hardware_table(ok: list[dict], unit: str) -> list[str]:
    if not any(r.get("flops_per_sample") for r in ok):
        return []
    rate = lambda t: None if t is None else f"{t:,.1f} TFLOP/s" if t >= 1 else f"{1000 * t:,.1f} GFLOP/s"  # noqa: E731
    rows = [[label(r), r["world_size"], r["precision"], fmt(r["flops_per_sample"] and r["flops_per_sample"] / 1e9, "GFLOP", 2),
             rate(r.get("achieved_tflops_per_device")), fmt(r.get("mfu_pct"), "%"),
             fmt(r.get("joules_per_image"), "J", 3), fmt(r.get("mean_watts"), "W", 0)] for r in ok]
    head = ["backend", unit, "precision", "FLOPs / sample", "achieved per device", "MFU", "energy / sample",
            "power (all GPUs)"]
    measured = any(r.get("mfu_measured_pct") is not None for r in ok)
    if measured:  # MFU against the device's measured matmul peak too (bench peak), and the mode both peaks are for
        head[5] = "MFU (datasheet)"
        head += ["MFU (measured peak)", "measured peak per device", "precision mode"]
        for row, r in zip(rows, ok):
            row += [fmt(r.get("mfu_measured_pct"), "%"), rate(r.get("peak_measured_tflops")), r.get("peak_mode")]
    return ["**5. Hardware efficiency** (training FLOPs per sample, an image or a sequence, from torch.utils.flop_counter; MFU against the "
            "device's dense peak at the run's precision, bench/core/mfu.py"
            + ("; and against the matmul rate this device was measured to sustain in the same precision mode, "
               "bench peak" if measured else "") + "; energy from NVML's counter around each "
            "window, all GPUs of the run)", "",
            md_table(head, rows, {1, 3, 4, 5, 6, 7, 8, 9}), ""] + [
        f"⚠ MFU (measured peak): {why}" for why in dict.fromkeys(r.get("peak_measured_busy") for r in ok) if why] \
        + ([""] if any(r.get("peak_measured_busy") for r in ok) else [])


def plot_split(ok: list[dict], stem: Path, title: str, unit: str) -> list[tuple[str, str]]:
    """Stacked bars per backend and world size: efficiency, communication loss, everything else (sum 100%). A split
    built on a disturbed or impossible input (report/caution.py ``withheld``) is not drawn; the title says which."""
    bars = [(f"{label(r)}\n×{r['world_size']}", r, split(r)) for r in ok]
    bars = [(name, r, s) for name, r, s in bars if s and s["comm_loss"] is not None]
    left_out = [f"{label(r)} ×{r['world_size']} ({withheld(r, 'comm_loss')})" for _, r, _ in bars
                if withheld(r, "comm_loss")]
    bars = [(name, r, s) for name, r, s in bars if not withheld(r, "comm_loss")]
    if not bars:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(10, 1.1 * len(bars) + 4), 4.8), layout="constrained")  # the legend's room
    x = range(len(bars))
    eff = [r["eff_vs_single_pct"] for _, r, _ in bars]
    comm = [100 * s["comm_loss"] for _, _, s in bars]  # a share below trust.LOSS_MIN is withheld: none is negative
    other = [100 * s["other_loss"] for _, _, s in bars]
    ax.bar(x, eff, color="tab:green", label="efficiency vs single@1")
    ax.bar(x, comm, bottom=eff, color="tab:red", label="lost to exposed communication")
    ax.bar(x, other, bottom=[e + c for e, c in zip(eff, comm)], color="tab:gray",
           label="lost to everything else (contention, overhead)")
    ax.set_ylim(0, max(110, max(e + max(c, 0) + max(o, 0) for e, c, o in zip(eff, comm, other)) * 1.1))
    ax.set_xticks(list(x), [name for name, _, _ in bars], fontsize=8)
    ax.axhline(100, ls="--", color="black", lw=0.8)
    ax.set_ylabel("% of ideal N × single@1 throughput")
    if left_out:
        ax.set_title(f"not drawn ({len(left_out)}): " + "; ".join(left_out[:3]) + (" ..." if len(left_out) > 3 else ""),
                     fontsize=8, color="dimgray", wrap=True)
    legend_outside(fig, [ax])
    fig.suptitle(f"Where the scaling goes ({unit})\n{title}", fontsize=10)
    save_figure(fig, f"{stem}-comm-split")
    return [("comm-split", f"{stem.name}-comm-split.png")]


def gradient_sizes(summary_rows: list[dict]) -> tuple[dict[str, int], dict[str, str]]:
    """Each model's gradient bytes, from its ok records (``scaling.gradient_bytes``; ``single``'s first, the DDP
    baseline's fp32 parameters: a DeepSpeed run holds bf16 ones), named with the sequence length for a GPT (its
    position embedding grows with it); and for a model whose size no record gives, why."""
    from bench.report import scaling

    sizes, unknown = {}, {}
    for r in sorted(summary_rows, key=lambda r: r["backend"] != "single"):
        name = f"{r['model']} {workloads.shape(r)}" if workloads.size(r, "seq_len") else r["model"]
        for rec in (r.get("_recs") or []) if r["model"] != "none" else []:
            if rec["status"] != "ok" or name in sizes:
                continue
            size, why = scaling.gradient_bytes(rec)
            if size:
                sizes[name] = size
                unknown.pop(name, None)
            else:
                unknown.setdefault(name, why)
    return sizes, unknown


def collectives_section(src: Path, out: Path, summary_rows: list[dict], warn) -> list[str]:
    from bench.core import comm
    from bench.core.text import human

    recs = comm.load(src, warn)
    if not recs:
        return []
    grads, unknown = gradient_sizes(summary_rows)
    md = ["## Collectives (bench collectives)", "",
          "Bus bandwidth (GB/s) over the process group the backends use, nccl-tests' definitions: algbw = bytes / "
          "time; busbw = algbw × 2(n-1)/n for all_reduce, × (n-1)/n for reduce_scatter and all_gather, × 1 for "
          "broadcast. Timed as nccl-tests does: after warm-up, the timed operations run back to back between one "
          "pair of clock reads closed by one synchronize; time per operation, the slowest rank's. Every rank runs "
          "the sizes that fit the tightest rank's free memory. The dashed lines: each model's gradient, what DDP "
          "all-reduces per step.", ""]
    md += [f"- {name}: gradient size unknown, not drawn: {why}" for name, why in sorted(unknown.items())]
    md += [""] if unknown else []
    for rec in sorted(recs, key=lambda r: (r["device_type"], r["world_size"], r["process_group"])):
        ops = list(dict.fromkeys(x["op"] for x in rec["results"]))
        by = {(x["op"], x["bytes"]): x["busbw_gbps"] for x in rec["results"]}
        sizes = list(dict.fromkeys(x["bytes"] for x in rec["results"]))
        md += [f"**{rec['process_group']}, {rec['world_size']} ranks ({rec['device_type']})**", "",
               md_table(["message", *ops], [[human(b), *[f"{by[(o, b)]:.3f}" if (o, b) in by else None
                                                        for o in ops]] for b in sizes],
                        set(range(1, len(ops) + 1))), ""]
        stem = out / "plots" / slug("collectives", rec["process_group"], f"n{rec['world_size']}",
                                    hw=rec["device_type"] + str((rec.get("env") or {}).get("gpu_names")))
        md += [f"![collectives]({_plot_collectives(rec, ops, by, sizes, grads, stem)})", ""]
    return md


def _plot_collectives(rec, ops, by, sizes, grads, stem: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.core.comm import DDP_BUCKET_MB

    fig, ax = plt.subplots(figsize=(10, 4.8), layout="constrained")
    for op in ops:
        pts = [(b, by[(op, b)]) for b in sizes if (op, b) in by]
        ax.plot(*zip(*pts), marker="o", label=op)
    ax.axvline(DDP_BUCKET_MB * 2 ** 20, ls=":", color="gray", label=f"DDP bucket ({DDP_BUCKET_MB} MiB)")
    for model, b in sorted(grads.items()):
        ax.axvline(b, ls="--", color="black", lw=0.8, label=f"{model} gradient ({b / 2 ** 20:.0f} MiB)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(alpha=0.3)
    legend_outside(fig, [ax])
    fig.suptitle(f"{rec['process_group']}: bus bandwidth, {rec['world_size']} ranks ({rec['device_type']})", fontsize=10)
    save_figure(fig, stem)
    return f"plots/{stem.name}.png"


def prediction_section(src: Path) -> list[str]:
    """Reads the same files the other sections read; their warnings were given once already."""
    from bench.report import scaling

    md = []
    for inp in scaling.inputs(src, warn=lambda msg: None, unsized=True):
        title = " ".join(filter(None, [inp["model"], workloads.shape(inp), f"b{inp['batch_per_device']}/device",
                                       inp["precision"], "on", inp["hardware"]]))
        if inp["grad_bytes"] is None:
            md += [f"**{title}**: no prediction: {inp['grad_source']}", ""]
            continue
        rows = scaling.rows(inp, [2, 4, 8, 16, 64], "ddp", BUCKET_MB)
        body = []
        for r in rows:
            lo, hi, m = r["efficiency_low"], r["efficiency_high"], r["measured_efficiency"]
            base, run = scaling.withheld(inp, r)  # built on a disturbed single@1, or a disturbed measured run
            inside = None if m is None or base or run else ("yes" if lo - 0.02 <= m <= hi + 0.02 else "no")
            body.append([r["world_size"], f"{r['curve_world_size']} ranks", f"{1000 * r['t_allreduce']:.1f} ms",
                         f"⚠ {base}" if base else f"{100 * lo:.1f} – {100 * hi:.1f} %",
                         None if m is None else f"⚠ {base or run}" if base or run else f"{100 * m:.1f} %", inside])
        md += [f"**{title}**: t_compute {1000 * inp['t_compute']:.1f} ms (single@1"
               + (", ⚠ disturbed: the predictions built on it are not shown" if inp["base_disturbed"] else "")
               + "), gradient "
               f"{inp['grad_bytes'] / 2 ** 20:.1f} MiB ({inp['grad_source']}) in {BUCKET_MB:g} MiB buckets", "",
               md_table(["N", "all_reduce busbw from", "all-reduce", "predicted efficiency (no .. full overlap)",
                         "measured ddp", "inside (±2 pts)"], body, {0, 1, 2, 3, 4}), ""]
    if not md:
        return []
    return ["## Predicted vs measured scaling (bench predict)", "",
            "DDP-style training at larger N from the compute time at world size 1 and the measured all-reduce "
            "bandwidth: no overlap = t_compute + t_allreduce, full overlap = max of the two. Where N was measured, "
            "the measured efficiency shows how far the model can be trusted. Each N uses the all_reduce curve measured "
            "at N, or at the nearest world size measured. `python -m bench predict "
            "--gpus-per-node G --inter-node-gbps X` adds several nodes.", ""] + md


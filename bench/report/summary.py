"""Records to one row per configuration: run-level throughput, memory, efficiency and the best mark."""
from __future__ import annotations

from pathlib import Path

from bench.report.common import BASELINE, BASELINE_MATCH, KNOB, OWN_MATCH, SECTION, WORKLOAD, GiB, workload_options


def usable_records(src: Path, warn) -> list[dict]:
    """Records that can be grouped and summarised; a malformed one is skipped with one warning."""
    from bench.core import results

    out = []
    for rec in results.load(src, warn=warn):
        if rec.get("task") == "accuracy":  # bench run --to-accuracy's (report/accuracy.py): no timed windows
            continue
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
    from bench.core import stats

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

    from bench.report import reference
    from bench.core import results, stats

    df = pd.DataFrame([{**r["_key"], "_rec": r} for r in recs])
    rows = []
    for key, g in df.groupby(list(results.CONFIG_KEYS), sort=False, dropna=False):
        group = sorted(g["_rec"], key=lambda r: str(r["run_id"]))
        ok = [r for r in group if r["status"] == "ok"]
        thr = stats.summarise_runs([stats.record_throughputs(r) for r in ok])  # ok is in run_id order: started
        samples = [x for r in ok for x in window_throughputs(r)]
        row = dict(zip(results.CONFIG_KEYS, key), runs_ok=len(ok), runs_not_ok=len(group) - len(ok),
                   status="ok" if ok else group[-1]["status"], reason=None if ok else group[-1]["reason"],
                   note="; ".join(sorted({r["note"] for r in group if r.get("note")})) or None,
                   global_img_s=thr["median"], ci95_low_img_s=None, ci95_high_img_s=None, interval=thr["interval"],
                   cv_runs_pct=None if thr["cv_runs"] is None else 100 * thr["cv_runs"],
                   drift_pct=drift_pct(thr["run_medians"]),
                   per_device_img_s=None if thr["median"] is None else thr["median"] / key[1])
        if thr["ci95"]:
            row.update(ci95_low_img_s=thr["ci95"][0], ci95_high_img_s=thr["ci95"][1])
        dev = [device_memory(r) for r in ok]
        peak = lambda field: max([m[field] for d in dev for m in d if m[field]], default=None)  # noqa: E731
        rss = [b for r in ok for b in r.get("host_peak_rss_bytes") or [] if b]
        imb = [imbalances(d, r) for d, r in zip(dev, ok)]
        worst = lambda k: max([x[k] for x in imb if x.get(k) is not None], default=None)  # noqa: E731
        gib = lambda b: b / GiB if b else None  # noqa: E731
        row.update(peak_reserved_max_gib=gib(peak("reserved")), peak_allocated_max_gib=gib(peak("allocated")),
                   nvml_used_max_gib=gib(peak("nvml")),
                   warmup_peak_reserved_max_gib=gib(peak("warmup_reserved")), host_rss_max_gib=gib(max(rss, default=None)),
                   memory_imbalance=worst(VERDICT_IMBALANCE) if any(dev) else worst("rss"),
                   memory_imbalance_reserved=worst("reserved"), memory_imbalance_nvml=worst("nvml"),
                   skipped_steps=sum(sum(r.get("skipped_steps") or []) for r in ok), _recs=group, _samples=samples,
                   numerics=numerics(ok), runs_disturbed=sum(bool(r.get("disturbed")) for r in ok),
                   mode=mode(key, group[-1]))
        row.update(hardware_fields(ok, row["global_img_s"], row["world_size"]))
        row.update(reference.config_fields(ok))  # the plain twin, --compile's figures, the attention kernel
        rows.append(row)
    dp_imbalance_from_cudnn_off(rows)
    from bench.report import caution

    return caution.attach(nones(add_efficiency(nones(pd.DataFrame(rows)))))


# Which per-GPU memory figure the verdict's imbalance reads (``memory_imbalance``): peak allocated, what the tensors
# held, where nn.DataParallel's GPU-0 load (gathered outputs, reduced gradients) shows. Peak reserved adds the caching
# allocator's slack; NVML's used bytes (the whole GPU, read after the windows) add the CUDA context, NCCL's buffers and
# any other process: what going from 1 to N GPUs adds. Each has its own column; on CPU, host RSS per rank.
VERDICT_IMBALANCE = "allocated"
IMBALANCE_WORDS = {"allocated": "peak allocated", "reserved": "peak reserved", "nvml": "NVML used"}


def imbalances(dev: list[dict], rec: dict) -> dict:
    """max / mean over a run's GPUs of each memory figure (``device_memory``): allocated, reserved, nvml; on CPU,
    ``rss``: host peak RSS over the ranks (the only measure there)."""
    from bench.core import stats

    if not dev:
        return {"rss": stats.imbalance(rec.get("host_peak_rss_bytes") or [])}
    return {k: stats.imbalance([m[k] for m in dev]) for k in IMBALANCE_WORDS}


def mode(key: tuple, rec: dict) -> str:
    """Whether a configuration is its backend's default ("default"), a labelled variant of it ("variant": another version
    of the same idea, computing the same), or its library's recommended mode ("recommended": FSDP2 as torchtitan runs
    it, DeepSpeed's own half sections), by the options its backend's ``variants`` plan (backends/base.py)."""
    import backends
    from bench.core import results

    row = dict(zip(results.CONFIG_KEYS, key))
    if row["backend"] not in backends.REGISTRY:
        return "default"
    options = rec.get("options") or {}
    for extra, _, recommended in backends.create(row["backend"]).variants(row["precision"]):
        if all(options.get(k) == v for k, v in extra.items()):
            return "recommended" if recommended else "variant"
    return "default"


def drift_pct(run_medians: list[float]) -> float | None:
    """How far a configuration's repetitions moved, slowest run to fastest, as % of their median (None under 2 runs).
    The verdict reads single@1's: the baseline of every efficiency, run in every repetition, is the sweep's witness of
    drift in clocks, heat and neighbours (report/verdict.py)."""
    if len(run_medians) < 2:
        return None
    import statistics

    mid = statistics.median(run_medians)
    return 100.0 * (max(run_medians) - min(run_medians)) / mid if mid else None


def numerics(ok: list[dict]) -> str | None:
    """What the configuration's runs computed in which dtype (bench/rank/numerics.py's signature); None where no record
    says (older records, --compile), "mixed" where its runs disagree."""
    sigs = {(r.get("numerics") or {}).get("signature") for r in ok} - {None}
    return sigs.pop() if len(sigs) == 1 else ("mixed" if sigs else None)


def dp_imbalance_from_cudnn_off(rows: list[dict]) -> None:
    """DataParallel's memory imbalance, where it ran with cudnn.benchmark both on and off, is the off run's.

    cuDNN keeps its benchmark cache per thread, and nn.DataParallel runs each replica in a new thread on every
    forward, so with the knob on every step may repeat the algorithm search, and its workspaces land in the
    timed windows' peaks, on some GPUs more than others. The on run's own figure stays as
    ``memory_imbalance_with_search``; ``memory_imbalance_from`` says where the reported one comes from."""
    from bench.core import results

    same = lambda r: tuple(str(r[k]) for k in results.CONFIG_KEYS if k != KNOB)  # noqa: E731
    knob = lambda r: None if r[KNOB] is None or r[KNOB] != r[KNOB] else bool(r[KNOB])  # numpy bool, NaN  # noqa: E731
    off = {same(r): r for r in rows if knob(r) is False and r["memory_imbalance"] is not None}
    for r in rows:
        r["memory_imbalance_from"] = r["memory_imbalance_with_search"] = None
        if r["backend"] == "dp" and knob(r) is True and same(r) in off:
            r["memory_imbalance_with_search"] = r["memory_imbalance"]
            r["memory_imbalance"] = off[same(r)]["memory_imbalance"]
            r["memory_imbalance_from"] = "cudnn.benchmark off"


def hardware_fields(ok: list[dict], throughput, world_size) -> dict:
    """The compute-only reference (run level, like the throughput), FLOPs, MFU and energy of a configuration."""
    import numpy as np

    from bench.core import mfu, stats
    from bench.core.peak import busy

    co = stats.summarise_runs([stats.window_throughputs(r["compute_only_window_seconds"],
                                                        r["global_batch"] * r["steps_per_window"])
                               for r in ok if r.get("compute_only_window_seconds")])
    keeps = {(r.get("compute_only") or {}).get("keeps") for r in ok} - {None}
    why = {(r.get("compute_only") or {}).get("reason") for r in ok} - {None}
    per_sample = next((r["flops_per_sample"] for r in ok if r.get("flops_per_sample")), None)
    peak = next((r["peak_tflops_per_device"] for r in ok if r.get("peak_tflops_per_device")), None)
    measured = [r["peak_measured"] for r in ok if (r.get("peak_measured") or {}).get("tflops")]
    measured_peak = float(np.median([m["tflops"] for m in measured])) if measured else None
    med = lambda k: float(np.median([r[k] for r in ok if r.get(k) is not None])) if any(  # noqa: E731
        r.get(k) is not None for r in ok) else None
    return {"compute_only_img_s": co["median"], "compute_only_keeps": "; ".join(sorted(keeps)) or None,
            "compute_only_reason": "; ".join(sorted(why)) or None, "flops_per_sample": per_sample,
            "achieved_tflops_per_device": per_sample * throughput / world_size / 1e12 if per_sample and throughput
            else None, "mfu_pct": 100 * mfu.mfu(per_sample, throughput, peak, world_size) if peak and per_sample
            and throughput else None, "peak_tflops_per_device": peak,
            "mfu_measured_pct": 100 * mfu.mfu(per_sample, throughput, measured_peak, world_size) if measured_peak and
            per_sample and throughput else None, "peak_measured_tflops": measured_peak,
            "peak_mode": next((r["peak_mode"] for r in ok if r.get("peak_mode")), None),
            "peak_measured_at": max((m["measured_at"] for m in measured), default=None),
            "peak_measured_busy": next((busy(m) for m in measured if busy(m)), None),
            "joules_per_image": med("joules_per_image"),
            "mean_watts": med("mean_watts")}


def nones(df):
    """Missing values as None, never NaN (NaN is truthy, and prints as "nan" where a cell must stay empty)."""
    df = df.astype(object)
    return df.where(df.notna(), None)


def add_efficiency(s):
    """Efficiency (%) against single@1 and against the backend's own world-size-1 run, each of the same cuDNN setting;
    None: no baseline.
    ``_base_disturbed`` says, per efficiency, how many of its baseline's runs were disturbed (report/caution.py
    shows no efficiency built on one). The best mark goes to the highest median at each world size, per precision
    (fp16 is not ranked against fp32)."""
    rows = s.to_dict("records")
    key = lambda r, keys: tuple(r[k] for k in keys)  # noqa: E731
    at1 = [r for r in rows if r["world_size"] == 1 and r["global_img_s"]]
    # single@1 of the same workload settings too (the memory layout, --compile, ...: common.workload_options)
    single = {(key(r, BASELINE_MATCH) + (workload_options(r),), r[KNOB]): r for r in at1 if r["backend"] == BASELINE}
    own = {(key(r, OWN_MATCH), r[KNOB]): r for r in at1}

    def base_of(r, table, keys):
        # the same cuDNN setting (on and not given are one: on is CUDA's default); a variant with a setting of its own
        # (DataParallel's cudnn.benchmark off) has no efficiency without a baseline of that setting (the planner plans
        # one: bench/plan/sweep.py), nor a run without a single@1 of its workload settings (dp's NCHW beside a
        # channels_last sweep: planned too)
        k = key(r, keys) + ((workload_options(r),) if table is single else ())
        for knob in dict.fromkeys((r[KNOB], True, None) if r[KNOB] in (True, None) else (r[KNOB],)):
            if (k, knob) in table:
                return table[(k, knob)]
        return None

    base_disturbed = [{} for _ in rows]
    for col, table, keys, field in (("eff_vs_single_pct", single, BASELINE_MATCH, "eff_vs_single"),
                                    ("eff_vs_own_ws1_pct", own, OWN_MATCH, "eff_vs_own")):
        bases = [base_of(r, table, keys) if r["global_img_s"] else None for r in rows]
        s[col] = [100.0 * r["global_img_s"] / (r["world_size"] * b["global_img_s"]) if b else None
                  for r, b in zip(rows, bases)]
        for d, b in zip(base_disturbed, bases):
            d[field] = b["runs_disturbed"] if b else 0
    s["_base_disturbed"] = base_disturbed
    # Several nodes: intra-node = the same backend on one node at the processes per node, against its own @1;
    # inter-node = thr(N over k nodes) / (k x thr(N/k on one node)), what crossing the network costs.
    one_node = {(key(r, OWN_MATCH), r["world_size"], r[KNOB]): r for r in rows
                if (r.get("nnodes") or 1) == 1 and r["global_img_s"]}
    own_eff, intra, inter = list(s["eff_vs_own_ws1_pct"]), [], []
    for r in rows:
        nodes = r.get("nnodes") or 1
        local = one_node.get((key(r, OWN_MATCH), r["world_size"] // nodes, r[KNOB])) if nodes > 1 else None
        intra.append(own_eff[rows.index(local)] if local is not None else None)
        inter.append(100.0 * r["global_img_s"] / (nodes * local["global_img_s"])
                     if local is not None and r["global_img_s"] else None)
    s["intra_node_eff_pct"], s["inter_node_eff_pct"] = intra, inter
    best = {}
    for i, r in enumerate(rows):
        k = key(r, SECTION + WORKLOAD + ("world_size", "precision")) + (r.get("nnodes") or 1,)
        if r["global_img_s"] and (k not in best or r["global_img_s"] > rows[best[k]]["global_img_s"]):
            best[k] = i
    s["best_at_world_size"] = [i in best.values() for i in range(len(rows))]
    return s

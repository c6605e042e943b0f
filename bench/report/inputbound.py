"""The "Input bound" section: real-data runs whose ranks waited for input a large share of the timed windows,
next to the same configuration on synthetic data (what the model alone does) and the loaders' ceilings measured by
``bench loader --results`` (records in RESULTS/loader/), naming the faster loader where both were measured. Also "Real-data memory": on a GPU, DALI and nvJPEG allocate
outside torch's caching allocator, so for real-data runs the allocator's peaks miss the loader's buffers and NVML's
used memory is the figure that holds them."""
from __future__ import annotations

import json
from pathlib import Path

from bench.report.common import fmt, label, md_table
from bench.core import workloads

THRESHOLD_PCT = 20.0  # data wait at or above this share of the window time: the run is input bound
SAME = ("backend", "world_size", *workloads.FIELDS, "precision", "batch_per_device", "device_type", "hardware", "options",
        "cudnn_benchmark", "nnodes")


def wait_pct(recs: list[dict]) -> float | None:
    """Median over ok runs of the data wait's share of the window time, in %."""
    import numpy as np

    shares = [100 * sum(r["data_wait_seconds"]) / sum(r["window_seconds"]) for r in recs
              if r["status"] == "ok" and r.get("data_wait_seconds") and sum(r.get("window_seconds") or []) > 0]
    return float(np.median(shares)) if shares else None


def loader_records(src: Path, warn) -> list[dict]:
    from bench.core.results import LOADER_SCHEMA as SCHEMA
    from bench.core.results import read_json

    out = []
    for f, rec in read_json(sorted((src / "loader").glob("*.json")), "loader record", warn):
        if isinstance(rec, dict) and rec.get("schema") == SCHEMA and isinstance(rec.get("results"), list):
            out.append(rec)
        else:
            warn(f"skipping {f}: not a {SCHEMA} record")
    return out


def ceilings(loader_recs: list[dict], row: dict) -> dict:
    """{(loader, decode): (node img/s, ranks)} from the latest loader record matching the row's device, hardware
    and image size; records with the row's ranks per node and batch are preferred."""
    per_node = row["world_size"] // (row.get("nnodes") or 1)
    match = [r for r in loader_recs if (r.get("device_type"), r.get("hardware"), r.get("image_size"))
             == (row["device_type"], row["hardware"], row["image_size"])]
    match.sort(key=lambda r: (r.get("ranks") == per_node, r.get("batch_per_rank") == row["batch_per_device"],
                              str(r.get("finished_at"))))
    if not match:
        return {}
    rec = match[-1]
    return {(x["loader"], x["decode"]): (x["node_img_s"], rec.get("ranks")) for x in rec["results"]
            if x.get("status") == "ok" and x.get("node_img_s")}


GiB = 1024 ** 3


def memory_section(real: list[dict]) -> list[str]:
    """Real-data GPU runs: torch's peak reserved next to NVML's used memory (max over the run's GPUs, median over
    its ok runs), and what the difference holds."""
    import numpy as np

    table = []
    for r in real:
        if r["device_type"] != "cuda":
            continue
        reserved, nvml = [], []
        for rec in (x for x in r["_recs"] if x["status"] == "ok"):
            mem = rec.get("memory") or []
            res = [m["peak_reserved_bytes"] for m in mem if m.get("peak_reserved_bytes") is not None]
            used = [m["nvml_used_bytes"] for m in mem if m.get("nvml_used_bytes") is not None]
            if res:
                reserved.append(max(res))
            if used:
                nvml.append(max(used))
        res = float(np.median(reserved)) if reserved else None
        used = float(np.median(nvml)) if nvml else None
        table.append([label(r), r["world_size"], f"{r['loader']} / decode {r['decode']}", fmt(res and res / GiB, "GiB", 2),
                      fmt(used and used / GiB, "GiB", 2) or "not measured (no NVML)",
                      f"{(used - res) / GiB:+.2f} GiB" if used is not None and res is not None else None])
    if not table:
        return []
    return ["## Real-data memory", "",
            ("DALI and nvJPEG allocate GPU memory outside torch's caching allocator (DALI's own pools; nvJPEG's "
             "decode buffers), so for real-data runs *peak reserved* leaves the input pipeline out. NVML's used "
             "memory (the whole GPU, every process, read after the timed windows) holds it: compare real-data runs "
             "by *NVML used*. The difference also holds the CUDA context (several hundred MiB) and any other "
             "process on the GPU."), "",
            md_table(["backend", "GPUs", "loader", "peak reserved, max", "NVML used, max", "NVML − reserved"], table,
                     {1, 3, 4, 5}), ""]


def settings_section(real: list[dict]) -> list[str]:
    """What each real-data configuration's loader ran with (the record's ``loader_info``): loaders ship different
    defaults (shuffling, pinned memory, who copies to the GPU), which are part of what is compared."""
    table = []
    for r in real:
        infos = {json.dumps(rec["loader_info"], sort_keys=True): rec["loader_info"] for rec in r["_recs"]
                 if rec["status"] == "ok" and rec.get("loader_info")}
        for _, info in sorted(infos.items()):
            table.append([label(r), r["world_size"], f"{r['loader']} / decode {r['decode']}",
                          "; ".join(f"{k}: {v}" for k, v in info.items())])
    if not table:
        return []
    return ["## Input pipeline settings", "", md_table(["backend", "devices", "loader", "settings"], table, {1}), ""]


def same(row: dict) -> tuple:
    """The configuration a real-data row is matched on with its synthetic twin (sizes as ints: a table mixing
    workloads holds NaN where one has none)."""
    return tuple(workloads.size(row, k) if k in ("image_size", "seq_len") else row[k] for k in SAME)


def section(src: Path, rows: list[dict], warn) -> list[str]:
    real = [r for r in rows if r["runs_ok"] and r["data"] not in (None, "synthetic")]
    return bound_section(src, rows, real, warn) + memory_section(real) + settings_section(real)


def bound_section(src: Path, rows: list[dict], real: list[dict], warn) -> list[str]:
    bound = [(r, p) for r in real for p in [wait_pct(r["_recs"])] if p is not None and p >= THRESHOLD_PCT]
    if not bound:
        return []
    synth = {same(r): r for r in rows if r["runs_ok"] and r["data"] == "synthetic"}
    recs = loader_records(src, warn)
    table, verdicts = [], []
    for r, pct in bound:
        syn = synth.get(same(r))
        ceil = ceilings(recs, r)
        own = ceil.get((r["loader"], r["decode"]))
        table.append([label(r), r["world_size"], f"{r['model']} {r['image_size']}px b{r['batch_per_device']}",
                      f"{r['loader']} / decode {r['decode']}", fmt(pct, "%"), fmt(r["global_img_s"], "img/s"),
                      fmt(syn and syn["global_img_s"], "img/s") or "not measured",
                      f"{own[0]:,.1f} img/s ({own[1]} ranks)" if own else "not measured"])
        if len({k[0] for k in ceil}) > 1:
            (best, decode), (thr, _) = max(ceil.items(), key=lambda kv: kv[1][0])
            others = ", ".join(f"{n}/{d} {v[0]:,.1f}" for (n, d), v in sorted(ceil.items()) if (n, d) != (best, decode))
            verdicts.append(f"- `{label(r)}` ×{r['world_size']}: the faster loader here is **{best}** (decode {decode}, "
                            f"{thr:,.1f} img/s; {others} img/s)"
                            + (f"; the model alone trains at {syn['global_img_s']:,.1f} img/s" if syn else ""))
    md = ["## Input bound", "",
          (f"Real-data runs whose ranks waited for input {THRESHOLD_PCT:.0f}% or more of the timed window time: the "
          "input pipeline, not the backend, sets their pace. *Synthetic* is the same configuration on a fixed batch "
          "already on the device (the model alone); *ceiling* is what the loader delivers on this node with no model "
          "(`bench loader --results`). A ceiling near the real-data throughput, with the synthetic figure well above "
          "it, says: a faster loader (or more loader workers, or GPU decode) would pay."), "",
          md_table(["backend", "N", "workload", "loader", "data wait", "real data", "synthetic", "loader ceiling"],
                   table, {1, 4, 5, 6, 7}), ""]
    if not recs:
        md += [(f"No `bench loader` record in this results directory: `python -m bench loader --data-dir DIR "
                f"--results {src}` measures the ceilings."), ""]
    return md + verdicts + ([""] if verdicts else [])

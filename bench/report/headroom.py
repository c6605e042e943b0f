"""The "Memory headroom" section: the largest per-device batch each backend fits (``bench run
--find-max-batch``, ``RESULTS/maxbatch/summary-*.json``), next to its peak memory at the sweep's common batch,
so the trade sharded backends make (communication for memory) shows beside their throughput."""
from __future__ import annotations

import json
from pathlib import Path

from bench.report.common import label, latest_summary, md_table


def latest(src: Path, warn) -> dict | None:
    return latest_summary(src, "maxbatch", "max-batch", warn)


def section(src: Path, summary_rows: list[dict], warn) -> list[str]:
    from bench.core.searches import max_batch as describe

    doc = latest(src, warn)
    if doc is None:
        return []
    key = lambda backend, options, n, precision: (backend, json.dumps(options or {}, sort_keys=True), n, precision)  # noqa: E731
    peaks = {}  # the throughput sweep's peak for the same configuration: (batch, text)
    for r in summary_rows:
        gpu, rss = r["peak_reserved_max_gib"], r["host_rss_max_gib"]
        text = f"{gpu:.2f} GiB reserved" if gpu else f"{rss:.2f} GiB host RSS" if rss else None
        if r["runs_ok"] and text:
            peaks[key(r["backend"], json.loads(r["options"] or "{}"), r["world_size"], r["precision"])] = (
                r["batch_per_device"], text)
    rows = []
    for row in doc["rows"]:
        found = peaks.get(key(row["backend"], row["options"], row["world_size"], row["precision"]))
        rows.append([label({"backend": row["backend"], "options": row["options"] or {}}), row["world_size"],
                     row["precision"], describe(row), f"{found[1]} at batch {found[0]}" if found else None,
                     len(row["probes"])])
    budget = (f" with a heap budget of {doc['memory_limit_gib']:g} GiB per rank (the CPU stand-in for GPU memory)"
              if doc.get("memory_limit_gib") else "")
    return ["## Memory headroom (bench run --find-max-batch)", "",
            f"From `{doc['_path']}` ({doc['created_at']}): the largest per-device batch that fits, by a bounded search "
            f"of short isolated runs (doubling from the configured batch up to the cap {doc['cap']}, then bisecting to "
            f"within 1/8){budget}. Sharded backends (fsdp2, ds_zero2/3) exist for this trade: compare their "
            "headroom with their throughput above.", "",
            md_table(["backend", "N", "precision", "max batch per device", "peak memory at the sweep's batch", "probes"],
                     rows, {1, 5}), ""]

"""The host-overhead record's vocabulary (``bench overhead``), shared by the rank that measures it
(bench/rank/overhead.py), the command that prints it and the report: its schema, how it is read back, its table."""
from __future__ import annotations

from pathlib import Path

from bench.core.results import read_json

OVERHEAD_SCHEMA = "overhead-1"


def latest(results_dir: Path, warn) -> dict | None:
    """The newest readable ok overhead record in RESULTS/overhead, with its path as ``_path``."""
    for f, rec in read_json(sorted((Path(results_dir) / "overhead").glob("*.json"), reverse=True),
                            "overhead record", warn):
        if isinstance(rec, dict) and rec.get("schema") == OVERHEAD_SCHEMA and rec.get("status") == "ok":
            rec["_path"] = str(f)
            return rec
    return None


def table(rec: dict) -> str:
    """The record as a Markdown table: µs per step (CPU time), wall time, the ratio to single's."""
    from bench.core.text import md_table

    rows = []
    for r in rec["rows"]:
        if r["status"] != "ok":
            rows.append([r["backend"], None, None, None, f"{r['status']}: {r['reason']}"])
            continue
        rows.append([r["backend"], f"{r['cpu_us_per_step']:,.0f}", f"{r['wall_us_per_step']:,.0f}",
                     None if r["vs_single"] is None else f"{r['vs_single']:.2f}", ""])
    return md_table(["backend", "host µs / step (CPU)", "wall µs / step", "vs single", "note"], rows, {1, 2, 3})

"""Warnings next to the report's numbers: which figures should not be believed as they stand, why, and what to do.

bench/core/trust.py judges (its thresholds are the only ones): disturbed runs, unstable repeats, a slow first window
and a backend at world size 1 far from single@1 come from the records (``trust.sweep_warnings``, the same lines the
console prints after ``bench run``); impossible efficiencies and negative loss components from the summary rows.
Each row gets ``_warnings`` (the dicts), ``warnings`` (their kinds, for summary.csv) and ``runs_disturbed``; tables
mark the cell a warning is about with ``common.MARK`` and list the warnings under the workload's tables.
"""
from __future__ import annotations

from bench.commands.report import comm
from bench.commands.report.common import BASELINE, MARK, label
from bench.core import trust


def who(r: dict) -> str:
    return f"`{label(r)}` ×{r['world_size']} {r['precision']}"


def attach(df):
    """The summary frame with each configuration's warnings."""
    from bench.core import results

    rows = df.to_dict("records")
    by_key: dict[tuple, list[dict]] = {}
    for w in trust.sweep_warnings([rec for r in rows for rec in r["_recs"]]):
        by_key.setdefault(w["key"], []).append(w)
    found = []
    for r in rows:
        ws = [{**w, "subject": who(r)} for w in by_key.get(results.config_key(r["_recs"][0]), [])]
        if r["world_size"] > 1:  # at 1, efficiency vs single is the same-computation check above
            for col, base, field in (("eff_vs_single_pct", f"{BASELINE}@1", "eff_vs_single"),
                                     ("eff_vs_own_ws1_pct", "its own @1", "eff_vs_own")):
                w = trust.efficiency(who(r), r.get(col), base, field, r["device_type"])
                if w:
                    ws.append(w)
            s = comm.split(r)
            if s:
                ws += trust.loss_split(who(r), s["comm_loss"], s["other_loss"])
        found.append(ws)
    df["_warnings"] = found
    df["warnings"] = ["; ".join(dict.fromkeys(w["kind"] for w in ws)) or None for ws in found]
    df["runs_disturbed"] = [sum(bool(rec.get("disturbed")) for rec in r["_recs"] if rec["status"] == "ok")
                            for r in rows]
    return df


def lines(rows: list[dict]) -> list[str]:
    """Every warning of these rows, one line each (``trust.text``), in row order, each once."""
    return list(dict.fromkeys(trust.text(w) for r in rows for w in r.get("_warnings") or []))


def section(rows: list[dict]) -> list[str]:
    """The Markdown under a workload's tables: every warning with its reason and what to do."""
    found = lines(rows)
    if not found:
        return []
    return [f"**{MARK.strip()} Warnings** (the figures marked {MARK.strip()} above should not be believed as they "
            "stand):", ""] + [f"- {x}" for x in found] + [""]


def banner(rows: list[dict]) -> list[str]:
    """One line at the top of the report when any figure carries a warning."""
    n = sum(len(r.get("_warnings") or []) for r in rows)
    if not n:
        return []
    disturbed = sum(r.get("runs_disturbed") or 0 for r in rows)
    return [f"> {MARK.strip()} **{n} warning{'s' if n > 1 else ''}**: some figures below should not be believed as "
            f"they stand ({disturbed} disturbed run{'s' if disturbed != 1 else ''}; unstable repeats, impossible "
            "efficiencies and the like). Each is marked ⚠ in its table and explained under it, with what to do.", ""]

"""Warnings next to the report's numbers: which figures should not be believed as they stand, why, and what to do.

bench/core/trust.py judges (its thresholds are the only ones): disturbed runs, unstable repeats, a slow first window
and a backend at world size 1 far from single@1 come from the records (``trust.sweep_warnings``, the same lines the
console prints after ``bench run``); impossible efficiencies and negative loss components from the summary rows.
Each row gets ``_warnings`` (the dicts) and ``warnings`` (their kinds, for summary.csv); tables mark the cell a warning
is about with ``common.MARK`` and list the warnings under the workload's tables. The verdict's first screen gives them
one line per kind (``kinds``).

No figure derived from a disturbed or impossible input is shown as a result: each row's ``_withheld`` maps such a
figure (``eff_vs_single``, ``eff_vs_own``, ``exposed``, ``comm_loss``, ``other_loss``) to the reason tables show in its
place and plots leave it out for (``withheld``).
"""
from __future__ import annotations

from bench.report import comm
from bench.report.common import BASELINE, MARK, label
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
        key = results.config_key(r["_recs"][0])
        ws = [{**w, "subject": who(r)} for w in by_key.get(key, [])]
        if r["world_size"] > 1:  # at 1, efficiency vs single is the same-computation check above
            for col, base, field in (("eff_vs_single_pct", f"{BASELINE}@1", "eff_vs_single"),
                                     ("eff_vs_own_ws1_pct", "its own @1", "eff_vs_own")):
                w = trust.efficiency(who(r), r.get(col), base, field, r["device_type"], key)
                if w:
                    ws.append(w)
            s = comm.split(r)
            if s:
                ws += trust.loss_split(who(r), s["comm_loss"], s["other_loss"], key, s["exposed_share"])
        found.append(ws)
    df["_warnings"] = found
    df["warnings"] = ["; ".join(dict.fromkeys(w["kind"] for w in ws)) or None for ws in found]
    df["_withheld"] = [withheld(r) for r in rows]
    df["withheld"] = ["; ".join(f"{k}: {v}" for k, v in w.items()) or None for w in df["_withheld"]]
    return df


def withheld(r: dict) -> dict[str, str]:
    """The figures of a row derived from a disturbed or impossible input, each with the reason shown in its place:
    an efficiency of a disturbed run or over a disturbed baseline, or outside trust's limits (at world size > 1; at 1
    it is the same-computation ratio, marked, not withheld); exposed communication of a disturbed run, or below
    trust.LOSS_MIN of the step; the scaling split where its efficiency is withheld or a share is below LOSS_MIN."""
    out = {}
    run = "run disturbed" if r.get("runs_disturbed") else None
    for col, field in (("eff_vs_single_pct", "eff_vs_single"), ("eff_vs_own_ws1_pct", "eff_vs_own")):
        pct = r.get(col)
        if pct is None:
            continue
        why = run or ("baseline disturbed" if (r.get("_base_disturbed") or {}).get(field) else None)
        if not why and r["world_size"] > 1 and pct > trust.EFFICIENCY_MAX_PCT:
            why = f"above {trust.EFFICIENCY_MAX_PCT:g}%"
        elif not why and r["world_size"] > 1 and pct < trust.EFFICIENCY_MIN_PCT:
            why = f"below {trust.EFFICIENCY_MIN_PCT:g}%"
        if why:
            out[field] = why
    s = comm.split(r)
    if s:
        exposed = run or ("negative: noise" if s["exposed_share"] < trust.LOSS_MIN else None)
        if exposed:
            out["exposed"] = exposed
        if s["comm_loss"] is not None:
            split = out.get("eff_vs_single")  # the split's ideal is N x single@1
            split = f"efficiency {split}" if split and split.startswith(("above", "below")) else split
            split = split or ("a negative share" if min(s["comm_loss"], s["other_loss"]) < trust.LOSS_MIN else None)
            if split:
                out["comm_loss"] = out["other_loss"] = split
    return out


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


def kinds(rows: list[dict]) -> list[str]:
    """Every warning of these rows, one line per kind (``trust.by_kind``): counts, the range of the figures, what to
    do. Disturbed runs are counted against every ok run of the rows."""
    return trust.by_kind([w for r in rows for w in r.get("_warnings") or []], sum(r["runs_ok"] for r in rows))

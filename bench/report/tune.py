"""The backends at their best (the newest ``bench tune`` summary in RESULTS/tune): a section beside the shared
defaults, and one line of the verdict naming the fastest at its best. A difference is called only where the 95%
intervals do not overlap, as everywhere else in the report."""
from __future__ import annotations

from pathlib import Path

from bench.core import tune


def latest(src: Path, warn) -> dict | None:
    return tune.latest(src, warn)


def _thr(t: dict | None) -> str | None:
    if not t or t.get("median") is None:
        return None
    return f"{t['median']:,.1f} {t.get('unit', '/s')} ({t['ci95'][0]:,.1f}–{t['ci95'][1]:,.1f})"


def _ok(doc: dict) -> list[dict]:
    return [s for s in doc["backends"] if s["status"] == "ok" and s.get("best") and s["best"].get("median")]


def _model(s: dict, doc: dict) -> str | None:
    return s.get("model") or (doc.get("workload") or {}).get("model")


def _mfu(d: dict | None, b: dict | None) -> str | None:
    """MFU against the measured peak at the shared defaults and at the best: ``31.2% → 44.0%``."""
    def pct(t):
        return None if not t or t.get("mfu_measured") is None else f"{100 * t['mfu_measured']:.1f}%"

    got = [pct(d), pct(b)]
    return None if got == [None, None] else f"{got[0] or '—'} → {got[1] or '—'}"


def section(doc: dict | None) -> list[str]:
    if not doc:
        return []
    from bench.core.text import md_table

    rows = []
    for s in doc["backends"]:
        d, b = s.get("default"), s.get("best")
        note = f" ⚠ {s['disturbed_trials']} disturbed" if s.get("disturbed_trials") else ""
        rows.append([s["backend"], _model(s, doc), s["world_size"], _thr(d), _thr(b),
                     f"{b['median'] / d['median']:.2f}×" if b and d and d.get("median") else None, _mfu(d, b),
                     tune.describe(b["settings"]) if b else f"{s['status']}: {s.get('reason')}",
                     f"{len(s.get('trials') or [])}{note}", f"`{s['command']}`" if s.get("command") else None])
    w = doc.get("workload") or {}
    models = list(dict.fromkeys(filter(None, (_model(s, doc) for s in doc["backends"]))))
    if len(models) > 1:  # each workload's own sizes are in its trials' records
        what = ", ".join([f"models {', '.join(models)}"] + [f"precision {w['precision']}"] * bool(w.get("precision")))
    else:
        what = ", ".join(f"{k} {w[k]}" for k in ("model", "image_size", "seq_len", "precision") if w.get(k))
    return ["## At their best (bench tune)", "",
            f"From `{doc['_path']}` ({doc['hardware']}, {doc['device_type']}, {what}; budget {doc['budget_s']:g} s, "
            f"{doc['spent_s']:.0f} s spent): each backend searched from the shared defaults, one setting at a time "
            "(batch, channels_last, cuDNN benchmark, its own knobs, --compile); a candidate replaced the incumbent only "
            "when its 95% interval lay above the incumbent's and neither run was disturbed (⚠: trials another process "
            "disturbed, which decided nothing). MFU is against the matmul peak measured on this machine (`bench "
            "peak`). The command reproduces the best.", "",
            md_table(["backend", "workload", "world size", "at the shared defaults", "at its best", "best / defaults",
                      "MFU (measured peak) defaults → best", "best settings", "trials", "bench run"], rows, {2, 5, 8}),
            ""]


def verdicts(doc: dict | None) -> list[dict]:
    """One verdict entry per workload: the fastest backend at its best, and at the shared defaults, from the tune
    summary."""
    ok = _ok(doc) if doc else []
    groups: dict = {}
    for s in ok:
        groups.setdefault(_model(s, doc), []).append(s)
    return [_verdict(doc, model, group, len(groups) > 1) for model, group in groups.items()]


def _verdict(doc: dict, model: str | None, ok: list[dict], named: bool) -> dict:
    at_best = sorted(ok, key=lambda s: -s["best"]["median"])
    at_default = sorted([s for s in ok if s["default"].get("median")], key=lambda s: -s["default"]["median"])
    top, unit = at_best[0], at_best[0]["best"].get("unit", "/s")
    tied = [s["backend"] for s in at_best[1:] if s["best"]["ci95"][1] >= top["best"]["ci95"][0]]
    # a best or a starting point another process disturbed decides nothing (bench tune exits 3 on them)
    disturbed = [s["backend"] for s in ok if s["best"].get("disturbed") or (s.get("default") or {}).get("disturbed")]
    mfu = top["best"].get("mfu_measured")
    head = (f"At their best (bench tune){f', {model}' if named else ''}: {top['backend']} is fastest, "
            f"{top['best']['median']:,.1f} {unit} with {tune.describe(top['best']['settings'])}"
            + (f", {100 * mfu:.1f}% MFU against the measured peak" if mfu is not None else "")
            + (f" (its interval overlaps {', '.join(tied)}: not established)" if tied else "")
            + (f" (trials of {', '.join(disturbed)} were disturbed: not established; bench tune again on a quiet "
               "machine)" if disturbed and not tied else "")
            + (f"; at the shared defaults {at_default[0]['backend']} was, {at_default[0]['default']['median']:,.1f} "
               f"{unit}." if at_default else "."))
    short = (f"{top['backend']} is fastest at its best ({top['best']['median']:,.1f} {unit})"
             + (f", within noise of {', '.join(tied)}." if tied else
                f", but trials of {', '.join(disturbed)} were disturbed: no winner established." if disturbed else "."))\
        if len(ok) > 1 else None
    return {"title": f"{doc['hardware']}, {doc['device_type']}{f', {model}' if named else ''}: the backends at their "
                     "best (bench tune)",
            "hardware": doc["hardware"], "established": not tied and not disturbed and len(ok) > 1,
            "best": top["backend"],
            "headline": head, "short": short, "evidence": [], "alternatives": [], "warnings": []}


def report_alone(src: Path, out: Path, warn) -> int:
    """``bench report`` on the results of ``bench tune`` alone (RESULTS/tune, no sweep's records): REPORT.md and
    REPORT.html with the verdict line and the "At their best" section, the trials' records as its runs, the verdict
    printed last."""
    import datetime as dt
    import sys

    from bench.report import html, verdict
    from bench.report.common import write_atomic
    from bench.core import results
    from bench.core.errors import EXIT_BAD_INPUT, EXIT_OK

    doc = latest(src, warn)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"bench: error: cannot create --out {str(out)!r}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    raw = Path(src) / "tune" / "raw"
    trials = results.load(raw, warn=warn) if raw.is_dir() else []
    vs = verdicts(doc)
    md = ["# Parallel backend comparison", "",
          f"The `bench tune` summary `{doc['_path']}` and {len(trials)} trial record(s) from `{raw}`, no sweep's "
          f"records; generated {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}.", ""]
    if vs:
        md += ["## Verdict", ""] + [f"**{v['headline']}**" for v in vs] + [""]
    md += section(doc)
    text = "\n".join(md)
    write_atomic(out / "REPORT.md", text)
    page = out / "REPORT.html"
    write_atomic(page, html.page(text, [{"_recs": trials}], raw, out))
    print(f"report: {(out / 'REPORT.md').resolve()}\nhtml:   {page.resolve()}")
    print("\n".join(["", "== Verdict"] + (verdict.console_lines(vs, []) or
                                           [f"{s['backend']} x{s['world_size']}: {s['status']}"
                                            for s in doc["backends"]])))
    return EXIT_OK

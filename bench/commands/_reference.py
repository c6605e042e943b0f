"""``bench run --reference``: where each configuration's plain twin goes in the sweep, and what the world-size-1
runs' records get from it (the vocabulary is bench/core/reference.py; the twin's process, bench/launch/twin.py).

One twin per configuration key (``reference.key``: workload, precision, batch, memory format, compile, data, device)
and repetition, next to the world-size-1 runs it is compared with: before them in odd repetitions, after them in even
ones, so slow drift favours neither side. Every backend at world size 1 of that key is compared with the same twin."""
from __future__ import annotations

import json
from pathlib import Path

from bench.core import reference, results
from bench.core.config import RunConfig

TWIN, RUN = "twin", "run"


def _key(cfg) -> tuple:
    return reference.key(results.skeleton(cfg.to_dict(), "", {}), hardware="this machine")


def plan(configs: list, runnable) -> list[tuple[str, RunConfig]]:
    """``(RUN, cfg)`` for every configuration in its order, with ``(TWIN, cfg)`` placed beside the world-size-1 runs
    of each key and repetition; ``runnable(cfg)``: whether that run can run here (a twin of runs that are all skipped
    is not planned)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        if c.world_size == 1 and runnable(c) and reference.unavailable(c.to_dict()) is None:
            groups.setdefault((c.repeat_index, _key(c)), []).append(i)
    before: dict[int, list] = {}
    for (rep, _), idx in groups.items():
        before.setdefault(idx[0] if rep % 2 else idx[-1] + 1, []).append(configs[idx[0]])
    out = []
    for i in range(len(configs) + 1):
        out += [(TWIN, c) for c in before.get(i, [])]
        if i < len(configs):
            out.append((RUN, configs[i]))
    return out


def attach(records: list[dict], twins: list[dict], results_dir: Path) -> list[dict]:
    """Every ok world-size-1 record with its ``reference`` field (its repetition's twin, the overhead, under
    --compile the eager twin), written into its file atomically; the records returned updated."""
    by: dict[tuple, list[dict]] = {}
    for t in twins:
        by.setdefault((reference.key(t, t["hardware"]), t["repeat_index"]), []).append(t)
    out = []
    for rec in records:
        if rec.get("status") != "ok" or rec.get("world_size") != 1 or rec.get("record_elsewhere"):
            out.append(rec)
            continue
        why = reference.unavailable(rec)
        rec = {**rec, "reference": {"reason": why} if why else
               reference.fields(rec, by.get((reference.key(rec), rec.get("repeat_index", 1)), []))}
        path = Path(results_dir) / f"{rec['run_id']}.json"
        try:
            on_disk = json.loads(path.read_text())
        except (OSError, ValueError):
            out.append(rec)
            continue
        on_disk["reference"] = rec["reference"]
        results.write_json_atomic(on_disk, path, overwrite=True)
        out.append(rec)
    return out


def twin_line(rec: dict) -> str:
    """The progress line of a finished twin."""
    if rec["status"] != "ok":
        return f"{rec['status']}: {rec['reason']}"
    lo, hi = rec["throughput_ci95"]
    unit = "seq" if rec.get("seq_len") else "img"
    eager = f"; eager twin {rec['eager_throughput']:.1f} {unit}/s" if rec.get("eager_throughput") else ""
    disturbed = f"; ⚠ disturbed: {'; '.join(rec.get('disturbed_reasons') or [])}" if rec.get("disturbed") else ""
    return f"ok: {rec['throughput']:.1f} {unit}/s (95% CI {lo:.1f}-{hi:.1f}){eager}{disturbed}"


def lines(records: list[dict]) -> list[str]:
    """The console's summary: each world-size-1 run against its plain twin."""
    out = []
    for rec in records:
        f = rec.get("reference")
        if not f:
            continue
        opts = ", ".join(k for k, v in (rec.get("options") or {}).items() if v)
        who = f"{rec['backend']} x1 {rec['precision']}{' (' + opts + ')' if opts else ''}" + (
            f" repeat {rec['repeat_index']}" if rec.get("repeats", 1) > 1 else "")
        if f.get("overhead") is None:
            out.append(f"  {who}: no overhead figure ({f.get('reason') or 'no valid windows'})")
            continue
        o = {"overhead": f["overhead"], "ci95": f["overhead_ci95"], "interval": f["interval"]}
        verdict = {"over": f" ⚠ over {100 * reference.THRESHOLD:g}%",
                   "over by the median": f" ⚠ over {100 * reference.THRESHOLD:g}% by the median (its interval reaches below)",
                   "within": ""}[reference.judge(o)]
        line = f"  {who}: harness overhead {reference.describe(o, f['timing'])}{verdict}"
        if f.get("compiled_vs_eager") is not None:
            slower = " ⚠ the compiled run is slower than its eager twin" if f["compiled_slower_than_eager"] else ""
            line += f"; compiled / eager twin {f['compiled_vs_eager']:.2f}x{slower}"
        out.append(line)
    return ["", "Harness vs its plain twin (1 - harness / twin; > 0: the harness is slower):"] + out if out else []

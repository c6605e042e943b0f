"""The regression gate: ``python -m bench compare BASELINE CURRENT``.

What is compared. BASELINE and CURRENT are record files, directories of records, or saved baselines
(``results/baselines/NAME.json``, see ``bench/commands/baseline.py``). Only ``ok`` records count. Records are grouped
with ``results.config_key`` (the report's grouping). **The run is the unit**: each run is summarised by the
median of its per-window throughputs (``global_batch * steps_per_window / window_seconds[i]``), a side by the
median of its run medians (``stats.summarise_runs``, as in the report), and ``ratio = current / baseline``.
Windows of one run share its conditions (algorithm picks, clocks, neighbours), so testing windows as if
they were independent samples raises false alarms whenever runs differ by a few percent; runs are the
samples here.

When a change counts. A configuration is ``slower`` (or ``faster``) only when the difference is
statistically significant across runs AND larger than the threshold: ``p < alpha`` and
``ratio < 1 - threshold`` (``> 1 + threshold``). A significant change inside the threshold, or any change
without significance, is ``no significant change`` (the notes column says which). pyperf and asv gate the
same way.

The test (``stats.significance``). Default: Welch's t-test on the log of the run medians, which reaches any
alpha from 2 runs a side. ``--test mwu``: Mann-Whitney U on the run medians (no normality assumed, but
with n runs a side it cannot go below p = 2 / C(2n, n): 0.1 for 3 vs 3, 0.0079 for 5 vs 5). The gate
computes this floor for the actual numbers of runs; when it is above alpha (one run a side: the run-to-run
spread is unknown) the configuration is NOT gated: the verdict is ``no significant change`` with the note
"too few runs for significance", and a warning goes to stderr. ``make regress`` runs 3 repeats a side.

Memory. Peak device memory of a run is the largest timed-window ``peak_reserved_bytes`` over its devices
(the caching allocator's reservation after warm-up: what decides whether a batch fits); runs of one
configuration give their median. Growth above the threshold is ``more memory`` and fails the gate like
``slower``. CPU records have no device memory; their host peak RSS (largest over ranks) is reported but not
gated, because it is mostly the interpreter and libraries, not the training step; ``--gate-host-memory``
gates it.

Hardware. Throughput from different GPU models (or CPU vs GPU) is not comparable, so the gate refuses,
exit 2, when the two sides were measured on different hardware, unless ``--allow-different-hardware``
is given (then configurations are matched ignoring the hardware). Differing torch / CUDA / cuDNN / NCCL /
driver versions are allowed, with one warning line each: they are often the change being tested.

Disturbed runs (bench/core/trust.py: another process used the CPUs or a GPU, or a GPU was throttled, while a run
was timed). A configuration with a disturbed run on either side is not judged on throughput: its throughput verdict
is ``inconclusive`` (what it would have been is in the notes), it never fails the gate on speed, and the gate exits
3 when nothing else failed, so CI can run it again instead of paging someone (``make regress`` does, once, waiting
for a quiet machine). Memory, failed runs and diverged replicas are judged as always: another process does not
change them. Unstable repeats and slow first windows are listed as warnings and change nothing.

Time to accuracy (``bench run --to-accuracy``, records in ``RESULTS/accuracy``). Its records are grouped by
configuration, target and schedule (``accuracy_records.settings_key``), and judged on two things apart: convergence, the
median epochs to the target over the runs (a run that never reached it counts as infinitely many): more than the
baseline's is ``more epochs to accuracy``, a regression in convergence with its own summary line, whatever the
speed; and speed, the runs' training throughput (samples/s of training, evaluation excluded), judged exactly as
throughput is (significant AND beyond the threshold; inconclusive on disturbed runs).

Exit codes (docs/command-line.md, "Exit codes"): 0 nothing regressed; 1 something is slower or uses more memory, or a
current run failed (also where every current run failed); 2 bad input (a missing path, no records, a baseline with no ok
run, bad option values, different hardware, or no configuration present on both sides: a gate that compared nothing
must not pass); 3 inconclusive: nothing regressed, but at least one configuration was
compared on disturbed runs (a regression in convergence exits 1 too; its summary line says which kind). New and
missing configurations are listed but do not fail; a
configuration with a *failed* current run (crash, hang, out of memory), even beside ok repeats, fails the
gate, and so does a current run whose replicas ended with different parameters
(``replicas_consistent: false``).
"""
from __future__ import annotations

import math
from pathlib import Path

from bench.report.compare import hw_text as _hw_text
from bench.report.compare import pct as _pct
from bench.report.compare import render_json, render_md
from bench.core import workloads
from bench.core.errors import UsageError, warn
from bench.core.stats import TESTS

FORMATS = ("md", "json")
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
ENV_VERSIONS = ("torch", "cuda", "cudnn", "nccl", "driver")

SLOWER, FASTER, SAME, NEW, MISSING = "slower", "faster", "no significant change", "new", "missing"
INCONCLUSIVE = "inconclusive"
EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE = 0, 1, 2, 3
FAILED, REPLICAS_DIFFER = "failed", "replicas differ"
MORE_MEMORY, LESS_MEMORY = "more memory", "less memory"


# ---------------------------------------------------------------------------------------------------
# CLI

def register(sub) -> None:
    c = sub.add_parser(
        "compare", help="regression gate: compare CURRENT records with a BASELINE (exit 1 on a regression)",
        description="Compare throughput (run medians) and peak memory of every configuration present in "
                    "both BASELINE and CURRENT. Exit 0: nothing regressed; 1: something is slower or uses more "
                    "memory; 2: bad input; 3: inconclusive (nothing regressed, but runs on either side were disturbed "
                    "by other processes or GPU throttling: run again on a quiet machine).")
    c.add_argument("baseline", metavar="BASELINE", help="record file, directory of records, or saved baseline")
    c.add_argument("current", metavar="CURRENT", help="record file, directory of records, or saved baseline")
    c.add_argument("--threshold", default=str(DEFAULT_THRESHOLD),
                   help=f"relative change that counts, 0 <= t < 1 (default {DEFAULT_THRESHOLD}: 5%%)")
    c.add_argument("--alpha", default=str(DEFAULT_ALPHA),
                   help=f"significance level, 0 < alpha < 1 (default {DEFAULT_ALPHA})")
    c.add_argument("--test", default="welch",
                   help="welch: Welch's t-test on log run medians (default, >= 2 runs a side) | mwu: Mann-Whitney U "
                        "on run medians (>= 5 runs a side at alpha 0.01)")
    c.add_argument("--format", default="md", help="md (default: a Markdown table) | json")
    c.add_argument("--out", help="also write the report to this file")
    c.add_argument("--allow-different-hardware", action="store_true",
                   help="compare records from different GPU models / device types (matched ignoring hardware)")
    c.add_argument("--gate-host-memory", action="store_true",
                   help="also fail on host peak RSS growth (CPU runs); reported but not gated by default")
    c.set_defaults(func=cmd_compare)


def _fraction(text: str, name: str, low_inclusive: bool) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    ok = (0 <= value < 1) if low_inclusive else (0 < value < 1)
    if not ok:
        rng = "0 <= threshold < 1 (0.05 = 5%)" if low_inclusive else "0 < alpha < 1 (e.g. 0.01)"
        raise UsageError(f"--{name} {text!r}: expected a number with {rng}")
    return value


def cmd_compare(args) -> int:
    threshold = _fraction(args.threshold, "threshold", low_inclusive=True)
    alpha = _fraction(args.alpha, "alpha", low_inclusive=False)
    if args.format not in FORMATS:
        raise UsageError(f"--format {args.format!r}: unknown format; choose from {', '.join(FORMATS)}")
    if args.test not in TESTS:
        raise UsageError(f"--test {args.test!r}: unknown test; choose from welch (Welch's t), mwu (Mann-Whitney U)")
    base = _load_side(args.baseline, "baseline")
    cur = _load_side(args.current, "current")
    result = compare(base, cur, threshold=threshold, alpha=alpha, test=args.test,
                     allow_different_hardware=args.allow_different_hardware,
                     gate_host_memory=args.gate_host_memory, warn=warn)
    result["baseline_path"], result["current_path"] = str(args.baseline), str(args.current)
    text = render_json(result) if args.format == "json" else render_md(result)
    print(text, end="")
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
        except OSError as e:
            raise UsageError(f"cannot write --out {args.out!r}: {e.strerror or e}")
    if result["regressed"]:  # a failed current run fails the gate even where nothing else could be compared
        return EXIT_REGRESSION
    if not result["compared"]:
        raise UsageError(f"no configuration is present in both baseline and current ({len(result['missing'])} "
                         f"missing, {len(result['new'])} new): nothing was compared")
    return EXIT_INCONCLUSIVE if result["inconclusive"] else EXIT_OK


def _load_side(path: str, side: str) -> dict:
    from bench.core import results

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{side} {path!r} does not exist")
    recs = results.load(p, warn=warn)
    if not recs:
        raise UsageError(f"{side} {path!r} holds no readable schema-{results.SCHEMA} records")
    ok = [r for r in recs if r.get("status") == "ok"]
    # a current side whose runs all failed is not bad input: those runs failed, and fail the gate (exit 1)
    if not ok and not (side == "current" and any(r.get("status") == "failed" for r in recs)):
        counts = ", ".join(f"{sum(r.get('status') == s for r in recs)} {s}" for s in ("failed", "skipped"))
        raise UsageError(f"{side} {path!r} holds no ok records ({counts})")
    return {"path": str(path), "ok": ok, "other": [r for r in recs if r.get("status") != "ok"]}


# ---------------------------------------------------------------------------------------------------
# Per-record numbers

def peak_device_memory(rec: dict) -> float | None:
    """Largest peak reserved bytes over the run's devices; None on CPU (no device memory)."""
    values = [m.get("peak_reserved_bytes") for m in rec.get("memory") or []]
    values = [v for v in values if v is not None]
    return float(max(values)) if values else None


def peak_host_rss(rec: dict) -> float | None:
    values = [v for v in rec.get("host_peak_rss_bytes") or [] if v is not None]
    return float(max(values)) if values else None


def _median(values) -> float | None:
    import numpy as np

    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


# ---------------------------------------------------------------------------------------------------
# Grouping and hardware

def _hw(rec: dict) -> tuple[str, str]:
    from bench.core import results

    return rec.get("device_type"), results.hardware(rec)


def _match_key(rec: dict, ignore_hardware: bool) -> tuple:
    from bench.core import results

    key = dict(zip(results.CONFIG_KEYS, results.config_key(rec)))
    if ignore_hardware:
        key.pop("hardware", None)
        key.pop("device_type", None)
    return tuple(key.items())


def label(rec: dict) -> str:
    """A short, readable name for a configuration (hardware is in the report header)."""
    opt = rec.get("optimizer")
    text = (f"{rec['backend']} x{rec['world_size']} {rec['model']} {workloads.shape(rec)} "
            f"b{rec['batch_per_device']}/dev {rec['precision']}" + (f" {opt}" if opt and opt != "sgd" else ""))
    if rec.get("data") not in (None, "synthetic"):
        text += f" {rec['data']} data"
    if rec.get("options"):
        text += " " + " ".join(f"{k}={v}" for k, v in sorted(rec["options"].items()))
    return text


def check_hardware(base: list[dict], cur: list[dict], allow: bool, warn) -> tuple[list, list]:
    b, c = {_hw(r) for r in base}, {_hw(r) for r in cur}
    if b != c:
        if not allow:
            raise UsageError(f"refusing to compare across hardware: baseline measured on {_hw_text(b)}, current on "
                             f"{_hw_text(c)}; throughput is only comparable on the same GPU model and device type "
                             f"(pass --allow-different-hardware to compare anyway)")
        warn(f"comparing different hardware (--allow-different-hardware): baseline {_hw_text(b)}, "
             f"current {_hw_text(c)}")
    return sorted(b, key=str), sorted(c, key=str)


def env_differences(base: list[dict], cur: list[dict]) -> list[str]:
    """One message per environment version that differs between the two sides."""
    out = []
    for key in ENV_VERSIONS:
        b = sorted({str((r.get("env") or {}).get(key)) for r in base})
        c = sorted({str((r.get("env") or {}).get(key)) for r in cur})
        if b != c:
            out.append(f"{key} differs: baseline {', '.join(b)}, current {', '.join(c)} "
                       f"(a change may come from the software, not the code)")
    return out


# ---------------------------------------------------------------------------------------------------
# The comparison

def compare(base: dict, cur: dict, threshold: float, alpha: float, test: str = "welch",
            allow_different_hardware: bool = False, gate_host_memory: bool = False, warn=warn) -> dict:
    """The whole comparison as a dict (what ``--format json`` prints); raises UsageError on mismatched hardware."""
    # the current side's hardware and versions from its ok runs, or from its failed ones where none was ok
    cur_runs = cur["ok"] or [r for r in cur["other"] if r.get("status") == "failed"]
    base_hw, cur_hw = check_hardware(base["ok"], cur_runs, allow_different_hardware, warn)
    env_warnings = env_differences(base["ok"], cur_runs)
    for msg in env_warnings:
        warn(msg)

    from bench.core.accuracy_records import is_accuracy

    rows = []
    # timed runs by configuration; bench run --to-accuracy's by configuration, target and schedule
    for accuracy, key_of, one in ((False, _match_key, _compare_one), (True, _accuracy_key, _compare_accuracy)):
        def groups(recs):
            out = {}
            for r in recs:
                if is_accuracy(r) == accuracy:
                    out.setdefault(key_of(r, allow_different_hardware), []).append(r)
            return out

        rows += _rows(groups(base["ok"]), groups(cur["ok"]), groups(base["other"]), groups(cur["other"]), one,
                      threshold, alpha, test, gate_host_memory)
    return _result(rows, base_hw, cur_hw, env_warnings, threshold, alpha, test, allow_different_hardware,
                   gate_host_memory, warn)


def _rows(bg, cg, b_other, c_other, one, threshold, alpha, test, gate_host_memory) -> list[dict]:
    """A row per configuration on either side: compared by ``one`` where both have ok runs, else new, missing or
    failed."""
    rows = []
    for key in sorted(set(bg) | set(cg), key=_sort_key):
        if key in bg and key in cg:
            row = one(bg[key], cg[key], threshold, alpha, test, gate_host_memory)
            failed = [r for r in c_other.get(key, []) if r["status"] == "failed"]
            if failed:  # a repeat that crashes beside ok ones is flaky, and flaky fails the gate
                row["verdict"] = FAILED if row["verdict"] == SAME else f"{row['verdict']}, {FAILED}"
                row["regression"] = True
                row["notes"].append(f"{len(failed)} of {len(failed) + len(cg[key])} current runs failed: "
                                    f"{failed[-1].get('reason') or 'no reason recorded'}")
            rows.append(row)
        elif key in cg:
            why = "not in the baseline"
            if key in b_other:
                r = b_other[key][-1]
                why = f"baseline run {r['status']}: {r.get('reason') or 'no reason recorded'}"
            rows.append(_one_sided(cg[key], NEW, why, "current"))
        elif key in c_other and c_other[key][-1]["status"] == "failed":
            # It ran and broke (a crash, a hang, out of memory): that is a regression, not an absence.
            r = c_other[key][-1]
            row = _one_sided(bg[key], FAILED, f"current run failed: {r.get('reason') or 'no reason recorded'}",
                             "baseline")
            row["regression"] = True
            rows.append(row)
        else:
            why = "no ok run in current"
            if key in c_other:
                r = c_other[key][-1]
                why = f"current run {r['status']}: {r.get('reason') or 'no reason recorded'}"
            rows.append(_one_sided(bg[key], MISSING, why, "baseline"))
    return rows


def _result(rows, base_hw, cur_hw, env_warnings, threshold, alpha, test, allow_different_hardware, gate_host_memory,
            warn) -> dict:
    compared = [r for r in rows if r["status"] == "compared"]
    inconclusive = [r for r in compared if r["inconclusive"]]
    if inconclusive:
        warn(f"{len(inconclusive)} configuration(s) compared on disturbed runs: their throughput was NOT judged "
             "(inconclusive); run the gate again on a quiet machine")
    underpowered = [r for r in compared if r["underpowered"]]
    if underpowered:
        worst = max(r["min_p_value"] for r in underpowered)
        warn(f"{len(underpowered)} configuration(s) have too few runs for significance at alpha {alpha:g} "
             f"with {TESTS[test]} (smallest attainable p {worst:.2g}): their throughput was NOT gated; repeat the "
             f"runs (bench run --repeat 3; with --test mwu, 5 a side at alpha 0.01)")
    return {
        "schema": 1,
        "test": test,
        "test_name": TESTS[test],
        "alpha": alpha,
        "threshold": threshold,
        "gate_host_memory": gate_host_memory,
        "hardware": {"baseline": [list(h) for h in base_hw], "current": [list(h) for h in cur_hw]},
        "allow_different_hardware": allow_different_hardware,
        "env_warnings": env_warnings,
        "rows": rows,
        "compared": len(compared),
        "new": [r["config"] for r in rows if r["status"] == NEW],
        "missing": [r["config"] for r in rows if r["status"] == MISSING],
        "regressions": [r["config"] for r in rows if r["regression"]],
        # bench run --to-accuracy: more epochs to the target than the baseline, apart from any slowdown
        "convergence_regressions": [r["config"] for r in rows if r.get("convergence") == MORE_EPOCHS],
        "regressed": any(r["regression"] for r in rows),
        "inconclusive": [r["config"] for r in inconclusive],
        "warnings": list(dict.fromkeys(w for r in rows for w in r["warnings"])),
    }


def _sort_key(key: tuple) -> tuple:
    # numbers as numbers (world size 2 before 16), everything else as text; None sorts like "None"
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for _, v in key)


def _side_summary(recs: list[dict]) -> dict:
    from bench.core.stats import record_throughputs, summarise_runs

    runs = summarise_runs([record_throughputs(r) for r in recs])
    return {
        "runs": len(recs),
        "windows": runs["windows"],
        "median_throughput": runs["median"],
        "run_medians": runs["run_medians"],
        "cv_runs": runs["cv_runs"],
        "peak_reserved_bytes": _median(peak_device_memory(r) for r in recs),
        "host_peak_rss_bytes": _median(peak_host_rss(r) for r in recs),
        "run_ids": [r.get("run_id") for r in recs],
    }


def _public(side: dict) -> dict:
    return {k: v for k, v in side.items() if not k.startswith("_")}


def _row(recs, status) -> dict:
    return {"config": label(recs[0]), "key": {k: v for k, v in _match_key(recs[0], False)}, "status": status,
            "baseline": None, "current": None, "ratio": None, "p_value": None, "min_p_value": None,
            "underpowered": False, "throughput_verdict": None, "memory_ratio": None, "memory_kind": None,
            "memory_verdict": None, "verdict": status, "regression": False, "inconclusive": False, "notes": [],
            "warnings": []}


def _one_sided(recs, status, why, side) -> dict:
    from bench.core.accuracy_records import is_accuracy

    row = _row(recs, status)
    if is_accuracy(recs[0]):
        row["config"], row["kind"] = _accuracy_label(recs[0]), "accuracy"
        row[side] = _accuracy_side(recs)
    else:
        row[side] = _public(_side_summary(recs))
    row["notes"].append(why)
    return row


def _compare_one(brecs, crecs, threshold, alpha, test, gate_host_memory) -> dict:
    row = _row(crecs, "compared")
    b, c = _side_summary(brecs), _side_summary(crecs)
    row["baseline"], row["current"] = _public(b), _public(c)
    verdicts, notes = [], row["notes"]
    if b["windows"] == 0 or c["windows"] == 0:
        verdicts.append(SAME)
        notes.append("no valid window times on one side: throughput not compared")
    else:
        verdicts.append(_speed(row, b, c, threshold, alpha, test, "throughput"))
    from bench.core import trust

    for side, recs in (("baseline", brecs), ("current", crecs)):
        row["warnings"] += [trust.text({**w, "subject": f"{side} {w['subject']}"}) for w in trust.config_warnings(recs)]
    if b["windows"] and c["windows"]:
        verdicts[0] = _disturbed(row, brecs, crecs, verdicts[0])
    row["throughput_verdict"] = verdicts[0]

    regression = verdicts[0] == SLOWER
    if any(r.get("replicas_consistent") is False for r in crecs):
        # Replicas that drift apart mean gradients were not (all) synchronised: any speed-up is not real.
        verdicts.append(REPLICAS_DIFFER)
        regression = True
        notes.append("ranks ended with different parameters (replicas_consistent: false)")
    kind, bm, cm, gated = "device", b["peak_reserved_bytes"], c["peak_reserved_bytes"], True
    if bm is None or cm is None:
        kind, bm, cm, gated = "host RSS", b["host_peak_rss_bytes"], c["host_peak_rss_bytes"], gate_host_memory
    if bm and cm:
        mratio = cm / bm
        row.update(memory_ratio=mratio, memory_kind=kind)
        mchange = f"{(mratio - 1) * 100:+.1f}%"
        if mratio > 1 + threshold and gated:
            row["memory_verdict"] = MORE_MEMORY
            verdicts.append(MORE_MEMORY)
            regression = True
            notes.append(f"peak {'device memory' if kind == 'device' else 'host RSS'} {mchange}, beyond the "
                         f"{_pct(threshold)} threshold")
        elif mratio < 1 - threshold and gated:
            row["memory_verdict"] = LESS_MEMORY
            verdicts.append(LESS_MEMORY)
        elif not gated and abs(mratio - 1) > threshold:
            notes.append(f"host RSS {mchange} (not gated; --gate-host-memory gates it)")
    if verdicts[0] == SAME and len(verdicts) > 1:
        verdicts = verdicts[1:]  # "more memory" alone reads better than "no significant change, more memory"
    row["verdict"] = ", ".join(verdicts)
    row["regression"] = regression
    return row


def _speed(row: dict, b: dict, c: dict, threshold: float, alpha: float, test: str, what: str) -> str:
    """The speed verdict from the two sides' run medians (``median_throughput``, ``run_medians``): slower or faster
    only when significant across runs AND beyond the threshold; the ratio, p-values and a note go into ``row``."""
    from bench.core.stats import significance

    notes = row["notes"]
    ratio = c["median_throughput"] / b["median_throughput"]
    p, min_p = significance(b["run_medians"], c["run_medians"], test)
    row.update(ratio=ratio, p_value=p, min_p_value=min_p)
    change = f"{(ratio - 1) * 100:+.1f}%"
    if min_p > alpha:
        row["underpowered"] = True
        notes.append(f"{change}: too few runs for significance at alpha {alpha:g} ({len(b['run_medians'])} vs "
                     f"{len(c['run_medians'])} runs; {TESTS[test]} cannot go below p={min_p:.2g}): NOT gated")
        return SAME
    if p >= alpha:
        notes.append(f"{change}, not significant (p={p:.2g} >= alpha {alpha:g})")
        return SAME
    if ratio < 1 - threshold:
        notes.append(f"{change} {what}, beyond the {_pct(threshold)} threshold")
        return SLOWER
    if ratio > 1 + threshold:
        notes.append(f"{change} {what}, beyond the {_pct(threshold)} threshold")
        return FASTER
    notes.append(f"{change} is significant (p={p:.2g}) but within the {_pct(threshold)} threshold")
    return SAME


def _disturbed(row: dict, brecs: list[dict], crecs: list[dict], verdict: str) -> str:
    """INCONCLUSIVE where a run on either side was disturbed (another process or a throttled GPU set its pace: no
    verdict on speed either way), with a note of what the verdict would have been; else ``verdict``."""
    disturbed = [(side, r) for side, recs in (("baseline", brecs), ("current", crecs))
                 for r in recs if r.get("disturbed")]
    if not disturbed:
        return verdict
    row["inconclusive"] = True
    sides = ", ".join(f"{sum(s == side for s, _ in disturbed)} {side}" for side in ("baseline", "current")
                      if any(s == side for s, _ in disturbed))
    why = list(dict.fromkeys(x for _, r in disturbed for x in r.get("disturbed_reasons") or []))
    row["notes"].append(f"inconclusive: {sides} run(s) disturbed ({'; '.join(why[:2]) or 'no reason recorded'}); "
                        f"on these runs the verdict would be '{verdict}'"
                        + ("; re-record the baseline on a quiet machine" if any(s == "baseline" for s, _ in disturbed)
                           else "; run the gate again on a quiet machine"))
    return INCONCLUSIVE


# ---------------------------------------------------------------------------------------------------
# Time to accuracy (bench run --to-accuracy): convergence, apart from speed

MORE_EPOCHS, FEWER_EPOCHS = "more epochs to accuracy", "fewer epochs to accuracy"


def _accuracy_key(rec: dict, ignore_hardware: bool) -> tuple:
    from bench.core import accuracy_records

    return _match_key(rec, ignore_hardware) + accuracy_records.settings_key(rec)


def _accuracy_label(rec: dict) -> str:
    a = rec.get("accuracy_settings") or {}
    return f"{label(rec)} to {100 * a.get('target', 0):g}% top-1, {a.get('scaling')} scaling"


def _accuracy_side(recs: list[dict]) -> dict:
    """A side of a to-accuracy configuration: epochs to accuracy (median over runs; infinity where most did not reach
    the target) and its training throughput by run (samples/s of training, evaluation excluded: the speed part)."""
    import statistics

    from bench.core import accuracy_records

    thr = [r["train_throughput"] for r in recs if r.get("train_throughput")]
    epochs = [accuracy_records.reached_epochs(r) for r in recs]
    times = [r["time_to_accuracy_seconds"] for r in recs if r.get("reached")]
    return {"runs": len(recs), "reached": sum(bool(r.get("reached")) for r in recs),
            "epochs_to_accuracy": statistics.median(epochs), "run_epochs": epochs,
            "time_to_accuracy_seconds": statistics.median(times) if times else None,
            "best_accuracy": max(r["best_accuracy"] for r in recs), "median_throughput": _median(thr),
            "run_medians": thr, "run_ids": [r.get("run_id") for r in recs]}


def _compare_accuracy(brecs, crecs, threshold, alpha, test, gate_host_memory) -> dict:
    """Convergence first: the current side needs more epochs to reach the target than the baseline (or misses it) is
    a regression of its own (MORE_EPOCHS, ``convergence``), whatever the speed. Then speed, judged as throughput is:
    the training throughput of the runs (significant across runs AND beyond the threshold is slower or faster)."""
    row = _row(crecs, "compared")
    row["config"], row["kind"] = _accuracy_label(crecs[0]), "accuracy"
    b, c = _accuracy_side(brecs), _accuracy_side(crecs)
    row["baseline"], row["current"] = b, c
    inf = float("inf")
    be, ce = b["epochs_to_accuracy"], c["epochs_to_accuracy"]
    shown = lambda e: "not reached" if e == inf else f"{e:g}"  # noqa: E731
    if ce > be:
        row["convergence"] = MORE_EPOCHS
        row["notes"].append(f"needs more epochs to reach the target: {shown(ce)} against {shown(be)} in the baseline "
                            f"(median over {c['runs']} and {b['runs']} runs; best top-1 {100 * c['best_accuracy']:.1f}%)")
    elif ce < be:
        row["convergence"] = FEWER_EPOCHS
        row["notes"].append(f"fewer epochs to the target: {shown(ce)} against {shown(be)}")
    else:
        row["convergence"] = None
        row["notes"].append(f"the same epochs to the target ({shown(ce)})")
    if b["median_throughput"] and c["median_throughput"]:
        speed = _disturbed(row, brecs, crecs, _speed(row, b, c, threshold, alpha, test, "training throughput"))
    else:
        speed = SAME
        row["notes"].append("no training throughput on one side: speed not compared")
    row["throughput_verdict"] = speed
    verdicts = [v for v in (row["convergence"], speed if speed != SAME else None) if v]
    regression = row["convergence"] == MORE_EPOCHS or speed == SLOWER
    if any(r.get("replicas_consistent") is False for r in crecs):
        verdicts.append(REPLICAS_DIFFER)
        regression = True
        row["notes"].append("ranks ended with different parameters (replicas_consistent: false)")
    row["verdict"] = ", ".join(verdicts) or SAME
    row["regression"] = regression
    return row

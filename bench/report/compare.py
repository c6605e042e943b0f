"""The regression gate's output (``bench compare``, bench/commands/compare.py): the Markdown table, the time-to-accuracy
table and the summary line, or the comparison as JSON. Reads the result dict ``compare.compare`` builds; decides
nothing."""
from __future__ import annotations

import json

GiB = 2 ** 30


def hw_text(hws) -> str:
    return ", ".join(f"{name} ({dev})" for dev, name in sorted(hws, key=str))


def pct(x: float) -> str:
    return f"{x * 100:g}%"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _side_cell(side: dict | None) -> str:
    if not side:
        return "-"
    cv = f", CV {side['cv_runs'] * 100:.1f}%" if side.get("cv_runs") is not None else ""
    return f"{_num(side['median_throughput'])} ({side['runs']} runs, {side['windows']} windows{cv})"


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _memory_cell(row: dict) -> str:
    b, c = row["baseline"], row["current"]
    if row["status"] != "compared":
        side = b or c
        if side["peak_reserved_bytes"] is not None:
            return _gib(side["peak_reserved_bytes"])
        return f"host RSS {_gib(side['host_peak_rss_bytes'])}" if side["host_peak_rss_bytes"] else "-"
    if row["memory_ratio"] is None:
        return "-"
    key = "peak_reserved_bytes" if row["memory_kind"] == "device" else "host_peak_rss_bytes"
    prefix = "" if row["memory_kind"] == "device" else "host RSS "
    return f"{prefix}{_gib(b[key])} → {_gib(c[key])} ({(row['memory_ratio'] - 1) * 100:+.0f}%)"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_md(result: dict) -> str:
    hw = result["hardware"]
    if hw["baseline"] == hw["current"]:
        hw_line = f"**Hardware:** {hw_text(map(tuple, hw['current']))}"
    else:
        hw_line = (f"**Hardware differs** (--allow-different-hardware): baseline {hw_text(map(tuple, hw['baseline']))}"
                   f"; current {hw_text(map(tuple, hw['current']))}")
    lines = [
        f"## Regression gate: {result.get('current_path', 'current')} vs {result.get('baseline_path', 'baseline')}",
        "",
        hw_line + "  ",
        f"**Test:** {result['test_name']} on per-window throughput; a change counts when p < {result['alpha']:g} "
        f"AND it exceeds {pct(result['threshold'])}. The run is the unit: throughput is the median of the run "
        f"medians of global samples/s (runs, windows; CV = run-to-run spread); ratio = current / baseline. Peak memory: "
        f"timed-window device reserved bytes (max over GPUs)"
        f"{'; host RSS is gated' if result['gate_host_memory'] else '; host RSS (CPU) is reported, not gated'}.",
        "",
    ]
    for w in result["env_warnings"]:
        lines.append(f"> warning: {w}  ")
    if result["env_warnings"]:
        lines.append("")
    timed = [r for r in result["rows"] if r.get("kind") != "accuracy"]
    # a row's unit is its workload's: images, or sequences for a GPT configuration (its config names "seq N")
    unit = "img/s" if not any(" seq " in r["config"] for r in timed) else "samples/s (img or seq)"
    lines += [f"| config | baseline {unit} | current {unit} | ratio | p-value | peak memory (GiB) | verdict | notes |",
              "|---|--:|--:|--:|--:|---|---|---|"] if timed else []
    for r in timed:
        b, c = r["baseline"], r["current"]
        base = _side_cell(b)
        cur = _side_cell(c)
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        p = f"{r['p_value']:.2g}" if r["p_value"] is not None else "-"
        verdict = f"**{r['verdict']}**" if r["regression"] else r["verdict"]
        lines.append("| " + " | ".join(_cell(x) for x in (r["config"], base, cur, ratio, p, _memory_cell(r), verdict,
                                                           "; ".join(r["notes"]))) + " |")
    lines += accuracy_table([r for r in result["rows"] if r.get("kind") == "accuracy"])
    if result["warnings"]:
        lines += ["", "**Warnings** (figures that should not be believed as they stand):", ""]
        lines += [f"- {w}" for w in result["warnings"]]
    lines += ["", summary_line(result), ""]
    return "\n".join(lines)


def accuracy_table(rows: list[dict]) -> list[str]:
    """bench run --to-accuracy's configurations: epochs to the target (the convergence verdict) beside the training
    throughput (the speed verdict, judged as throughput is)."""
    if not rows:
        return []

    def side(x: dict | None) -> str:
        if not x:
            return "-"
        e = x["epochs_to_accuracy"]
        epochs = "not reached" if e == float("inf") else f"{e:g} epochs"
        t = f", {x['time_to_accuracy_seconds']:.1f} s" if x.get("time_to_accuracy_seconds") is not None else ""
        thr = f", {_num(x['median_throughput'])}/s training" if x.get("median_throughput") else ""
        return f"{epochs}{t}{thr} ({x['reached']} of {x['runs']} runs reached)"

    out = ["", "### Time to accuracy (bench run --to-accuracy)", "",
           "Convergence and speed apart: *more epochs to accuracy* (the current side needs more epochs than the "
           "baseline to reach the same target, or misses it) fails the gate as a regression in convergence; the "
           "training throughput (samples/s of training, evaluation excluded) is judged as throughput is.", "",
           "| config | baseline | current | throughput ratio | p-value | verdict | notes |", "|---|---|---|--:|--:|---|---|"]
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        p = f"{r['p_value']:.2g}" if r["p_value"] is not None else "-"
        verdict = f"**{r['verdict']}**" if r["regression"] else r["verdict"]
        out.append("| " + " | ".join(_cell(x) for x in (r["config"], side(r["baseline"]), side(r["current"]), ratio, p,
                                                        verdict, "; ".join(r["notes"]))) + " |")
    return out


def summary_line(result: dict) -> str:
    rows = [r for r in result["rows"] if r["status"] == "compared"]
    counts = {}
    for r in rows:
        for v in r["verdict"].split(", "):
            counts[v] = counts.get(v, 0) + 1
    parts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    tail = f"{result['compared']} compared ({parts}); {len(result['new'])} new, {len(result['missing'])} missing"
    if not result["compared"]:
        return f"**ERROR:** nothing compared; {len(result['new'])} new, {len(result['missing'])} missing. Exit 2."
    slow = [c for c in result["regressions"] if c not in result.get("convergence_regressions", [])]
    if result.get("convergence_regressions"):
        line = (f"**REGRESSION IN CONVERGENCE** in {len(result['convergence_regressions'])} configuration(s): more "
                f"epochs to the target than the baseline ({'; '.join(result['convergence_regressions'])}).")
        if slow:
            line += f"\n\n**REGRESSION** in {len(slow)} more configuration(s)."
        return f"{line} {tail}. Exit 1."
    if result["regressed"]:
        return f"**REGRESSION** in {len(result['regressions'])} configuration(s): {tail}. Exit 1."
    if result["inconclusive"]:
        return (f"**INCONCLUSIVE**: {len(result['inconclusive'])} configuration(s) compared on disturbed runs, their "
                f"throughput not judged; nothing else regressed: {tail}. Run the gate again on a quiet machine. Exit 3.")
    return f"**PASS**: {tail}. Exit 0."


def render_json(result: dict) -> str:
    return json.dumps(result, indent=1, sort_keys=False, default=str) + "\n"

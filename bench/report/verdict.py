"""The verdict: for each hardware / workload / precision / world size, the backend to train with, its evidence,
and what every alternative costs relative to it.

Pure functions on the summary rows (``summary.summarise``), using the intervals it computed. A difference is
*established* only when the two 95% intervals do not overlap, both come from several runs, and the lead is at least
WINNER_MIN_LEAD and more than the drift the baseline's repetitions show; where the best median's interval overlaps
another's, or the intervals are within-run only (one run each), no winner is named.
Nor is one named from disturbed runs (bench/core/trust.py): another process used the machine while they were timed.

What a user reads first (the console's last lines, the top of REPORT.md and REPORT.html) is ``first_screen``: a list
of blocks, each left out when it has nothing to say: one line per group that compares backends (``short``), the CPU
caveat, what was not measured, and the warnings, one line per kind (report/caution.py ``kinds``). The evidence and
every alternative's cost follow in *Verdict in detail*; each warning, by configuration, under its workload's tables.
"""
from __future__ import annotations

import re

from bench.report import caution, comm, reference
from bench.report.common import (
    BASELINE,
    SECTION,
    WITHIN_RUN,
    WORKLOAD,
    groups,
    label,
    plain,
    rate,
    sort_rows,
    withheld,
    workload_title,
)
from bench.report.summary import IMBALANCE_WORDS, VERDICT_IMBALANCE, device_memory
from bench.core import workloads

IMAGENET_TRAIN_IMAGES = 1_281_167  # ImageNet-1k (ILSVRC 2012) training set
GROUP = SECTION + WORKLOAD + ("precision", "world_size")
# The smallest lead that names a winner, beyond intervals that do not overlap (pyperf's and asv's rule: a difference is
# called only when it is significant AND larger than a threshold): a 2% lead between two backends is the machine's
# mood more often than the backends', and a user would not change backends for it. The regression gate counts the same 5%
# as a change (bench compare --threshold).
WINNER_MIN_LEAD = 0.05
BASELINE_KEY = SECTION + WORKLOAD + ("precision",)  # where single@1's drift applies: every world size of its workload


def epoch_seconds(img_s) -> float | None:
    """Estimated time of one ImageNet-1k epoch at this global throughput (compute only: no input pipeline)."""
    return IMAGENET_TRAIN_IMAGES / img_s if img_s else None


def duration(seconds) -> str | None:
    if seconds is None:
        return None
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{seconds:.1f} s"


def overlap(a: dict, b: dict) -> bool:
    """Whether the 95% intervals of two summary rows overlap (a row without an interval overlaps everything)."""
    lo_a, hi_a, lo_b, hi_b = a["ci95_low_img_s"], a["ci95_high_img_s"], b["ci95_low_img_s"], b["ci95_high_img_s"]
    if None in (lo_a, hi_a, lo_b, hi_b):
        return True
    return lo_a <= hi_b and lo_b <= hi_a


def device0_ratio(r: dict) -> float | None:
    """Device 0's peak memory over the mean of the other devices (nn.DataParallel's GPU-0 problem), of the figure the
    verdict reads (summary.VERDICT_IMBALANCE: peak allocated); the largest over the ok runs. None with fewer than two
    devices measured."""
    ratios = []
    for rec in r["_recs"]:
        res = [m[VERDICT_IMBALANCE] for m in device_memory(rec) if m[VERDICT_IMBALANCE]] if rec["status"] == "ok" else []
        if len(res) > 1:
            ratios.append(res[0] / (sum(res[1:]) / len(res[1:])))
    return max(ratios, default=None)


def peak_memory(r: dict) -> tuple[float | None, str]:
    """The largest peak per device (reserved GiB on GPU, host RSS per rank on CPU) and what it is."""
    if r["peak_reserved_max_gib"]:
        return r["peak_reserved_max_gib"], "GiB peak reserved per GPU (largest)"
    return r["host_rss_max_gib"], "GiB host peak RSS per rank (largest)"


def evidence(r: dict) -> str:
    """Throughput with its interval, efficiency, memory, exposed communication, and tokens/s for a language model or
    the ImageNet-1k epoch for an image classifier. A figure built on a disturbed or impossible input is named with the
    reason instead (report/caution.py ``withheld``)."""
    parts = [f"{r['global_img_s']:,.1f} {rate(r)} (95% interval {r['ci95_low_img_s']:,.1f}–{r['ci95_high_img_s']:,.1f}"
             + (", within-run only)" if r["interval"] == WITHIN_RUN else f", {r['runs_ok']} runs)")]
    for col, field, base in (("eff_vs_single_pct", "eff_vs_single", f"{BASELINE}@1"),
                             ("eff_vs_own_ws1_pct", "eff_vs_own", "its own @1")):
        if r["world_size"] > 1 and r[col] is not None:
            why = withheld(r, field)
            parts.append(f"scaling efficiency vs {base} not shown ({why})" if why
                         else f"{r[col]:.0f}% scaling efficiency vs {base}")
            break
    gib, what = peak_memory(r)
    if gib:
        parts.append(f"{gib:.2f} {what}")
    s = comm.split(r)
    if s:
        why = withheld(r, "exposed")
        parts.append(f"exposed communication not shown ({why})" if why else f"exposed communication "
                     f"{s['exposed_ms']:.1f} ms/step ({100 * s['exposed_share']:.0f}% of the step)")
    if workloads.size(r, "seq_len"):
        parts.append(f"{r['global_img_s'] * workloads.size(r, 'seq_len'):,.0f} tokens/s")
    elif workloads.of_record(r).kind == "vision":  # an image classifier: the epoch the source articles compare by
        parts.append(f"ImageNet-1k epoch ≈ {duration(epoch_seconds(r['global_img_s']))}")
    return ", ".join(parts)


def gap(alt: dict, best: dict) -> tuple[float, float | None, float | None]:
    """How much slower ``alt`` is than ``best`` by the medians, and the conservative range of that over both 95%
    intervals, 1 - hi(alt)/lo(best) .. 1 - lo(alt)/hi(best); None for the range where the intervals overlap."""
    slower = 1 - alt["global_img_s"] / best["global_img_s"]
    if overlap(alt, best):
        return slower, None, None
    return (slower, 1 - alt["ci95_high_img_s"] / best["ci95_low_img_s"],
            1 - alt["ci95_low_img_s"] / best["ci95_high_img_s"])


def margin(best: dict, second: dict) -> str:
    """The fastest's lead over the next and how sure it is: ``33% ahead of dp (95% CI 31–36%, 3 runs each)``."""
    slower, lo, hi = gap(second, best)
    if lo is None:
        sure = "within noise: the 95% intervals overlap"
    elif WITHIN_RUN in (second["interval"], best["interval"]):
        sure = f"95% CI {100 * lo:.0f}–{100 * hi:.0f}%, within-run only"
    else:
        runs = sorted({second["runs_ok"], best["runs_ok"]})
        sure = f"95% CI {100 * lo:.0f}–{100 * hi:.0f}%, {'-'.join(map(str, runs))} runs each"
    return f"{100 * slower:.0f}% ahead of {label(second)} ({sure})"


def cost(alt: dict, best: dict) -> str:
    """What choosing ``alt`` instead of ``best`` costs: speed (with an interval for the difference), memory."""
    slower, lo, hi = gap(alt, best)
    if lo is None:
        parts = [f"{100 * abs(slower):.0f}% {'slower' if slower >= 0 else 'faster'} by the medians, within noise "
                 "(the 95% intervals overlap: the difference is not established)"]
    else:  # the conservative range of the ratio over both intervals
        within = WITHIN_RUN in (alt["interval"], best["interval"])
        parts = [f"{100 * slower:.0f}% slower (CI {100 * lo:.0f}–{100 * hi:.0f}%{', within-run only' if within else ''})"]
    ratio = device0_ratio(alt)
    if ratio and ratio >= 1.2:
        parts.append(f"GPU 0 holds {ratio:.1f}× the {IMBALANCE_WORDS[VERDICT_IMBALANCE]} memory of the others")
    mem_alt, mem_best = peak_memory(alt)[0], peak_memory(best)[0]
    if mem_alt and mem_best and abs(mem_alt / mem_best - 1) >= 0.1:
        parts.append(f"{mem_alt / mem_best:.2f}× the peak memory per {'GPU' if alt['peak_reserved_max_gib'] else 'rank'}"
                     f" ({mem_alt:.2f} vs {mem_best:.2f} GiB)")
    return ", ".join(parts)


def differs(a: dict, b: dict) -> bool:
    """Whether two rows' runs computed in different dtypes (both known)."""
    return bool(a.get("numerics") and b.get("numerics")) and a["numerics"] != b["numerics"]


def numerics_diff(a: dict, b: dict) -> str:
    """What ``a`` computes differently from ``b``: "norm bfloat16, residual bfloat16"."""
    theirs = set(b["numerics"].split(", "))
    return ", ".join(p for p in a["numerics"].split(", ") if p not in theirs) or a["numerics"]


def title(r: dict) -> str:
    unit = "GPU" if r["device_type"] == "cuda" else "CPU worker"
    n = r["world_size"]
    nodes = f" over {r['nnodes']} nodes" if (r.get("nnodes") or 1) > 1 else ""
    return (f"{r['hardware']}, {workload_title(r)} batch {r['batch_per_device']}/device "
            f"{r['data']}, {r['precision']}, {n} {unit}{'s' if n > 1 else ''}{nodes}")


def baseline_drifts(rows: list[dict]) -> dict:
    """single@1's drift (summary ``drift_pct``: its repetitions, slowest to fastest, % of their median) for each
    hardware, workload and precision."""
    out: dict = {}
    for r in rows:  # at its defaults (the sweep's shared settings, channels_last say, are its defaults too)
        if (r["backend"] == BASELINE and r["world_size"] == 1 and r.get("drift_pct") is not None and plain(r)
                and r.get("cudnn_benchmark") in (True, None)):
            k = tuple(r[k] for k in BASELINE_KEY)  # two layouts of one workload (dp's NCHW baseline): the larger
            out[k] = max(out.get(k, r["drift_pct"]), r["drift_pct"])
    return out


def verdicts(rows: list[dict]) -> list[dict]:
    """One verdict per group: ``title``, ``established`` (a winner is named), ``headline``, ``evidence`` (the
    recommended backend's, or every tied backend's) and ``alternatives`` (one line each). A winner needs intervals that
    do not overlap, from several runs each, none disturbed, the same arithmetic, a lead of WINNER_MIN_LEAD at least, and
    a lead larger than the drift single@1's repetitions show (``drift``, the sweep's witness of slow change)."""
    keyed = [{**r, "_group": tuple(r[k] for k in GROUP) + (r.get("nnodes") or 1,)} for r in rows]
    drifts = baseline_drifts(rows)
    out = []
    for _, whole in sorted(groups(keyed, ("_group",)), key=lambda kv: (kv[1][0]["device_type"] != "cuda", str(kv[0]))):
        for suffix, g, recommended in modes(whole):
            v = group_verdict(g, drifts, recommended)
            if v is not None:
                v["title"] += suffix
                out.append(v)
    return out


LIKE = " — like with like (every backend computes what single computes)"
RECOMMENDED = " — as each library recommends"


def modes(g: list[dict]) -> list[tuple[str, list[dict], bool]]:
    """The verdicts of one group: one, or two where a backend ran its library's recommended mode beside its default
    (summary ``mode``): like with like (the defaults and the labelled variants that compute the same), and as each
    library recommends (each backend's recommended mode where it has one, its default otherwise)."""
    if not any(r.get("mode") == "recommended" for r in g):
        return [("", g, False)]
    with_rec = {r["backend"] for r in g if r.get("mode") == "recommended"}
    like = [r for r in g if r.get("mode") != "recommended"]
    rec = [r for r in g if r.get("mode") == "recommended" or
           (r["backend"] not in with_rec and r.get("mode", "default") == "default")]
    return [(LIKE, like, False), (RECOMMENDED, rec, True)]


def group_verdict(g: list[dict], drifts: dict, recommended: bool = False) -> dict | None:
    """The verdict of one group's rows (``recommended``: the libraries' recommended modes, whose arithmetic differs on
    purpose: said, not held against a winner); None where nothing ran."""
    ok = sorted([r for r in g if r["runs_ok"] and r["global_img_s"]], key=lambda r: -r["global_img_s"])
    not_ok = sort_rows([r for r in g if not r["runs_ok"]])
    if not ok:
        return None
    best, rest = ok[0], ok[1:]
    # another arithmetic, not another backend's speed; in the recommended mode on purpose, and said below
    unlike = [] if recommended else [r for r in rest if differs(r, best)]
    tied = [best] + [r for r in rest if overlap(r, best)]
    across_runs = all(r["interval"] != WITHIN_RUN for r in ok)  # within-run intervals miss the run-to-run spread
    disturbed = [r for r in ok if r.get("runs_disturbed")]  # another process used the machine while timed
    lead = gap(rest[0], best)[0] if rest else None  # how much slower the second is than the fastest
    drift = drifts.get(tuple(best[k] for k in BASELINE_KEY))
    small = lead is not None and lead < WINNER_MIN_LEAD
    drifted = lead is not None and drift is not None and 100 * lead < drift
    v = {"title": title(best), "hardware": best["hardware"],
         "established": len(tied) == 1 and bool(rest) and across_runs and not disturbed and not unlike
         and not small and not drifted,
         "best": label(best), "evidence": [], "alternatives": [], "short": None,
         "drift": None if drift is None else (f"{BASELINE}@1's repetitions drifted {drift:.1f}% (slowest run to "
                                              "fastest, of their median)")}
    fastest = f"{label(best)} ({best['global_img_s']:,.1f} {rate(best)}), {margin(best, rest[0])}" if rest else ""
    if not rest:  # nothing to compare: no line on the first screen
        v["headline"] = f"Only {label(best)} ran here: nothing to compare it with."
        v["evidence"] = [f"{label(best)}: {evidence(best)}"]
    elif disturbed:
        runs = sum(r["runs_disturbed"] for r in disturbed)
        v["short"] = (f"No winner: {runs} of {sum(r['runs_ok'] for r in ok)} runs disturbed; fastest by the medians "
                      f"{fastest}.")
        v["headline"] = (f"No winner established: {runs} run{'s' if runs > 1 else ''} of "
                         f"{', '.join(label(r) for r in disturbed)} {'were' if runs > 1 else 'was'} disturbed "
                         "(other processes used the machine while they were timed), so "
                         f"{'their' if runs > 1 else 'its'} figures are not to be believed; fastest by the "
                         f"medians: {label(best)}. Re-run on a quiet machine (`bench run --wait-quiet-s`).")
        v["evidence"] = [f"{label(r)}: {evidence(r)}" for r in tied]
    elif unlike:
        v["headline"] = (f"No like-for-like winner: the fastest, {label(best)}, computes {numerics_diff(best, unlike[0])} "
                         f"where {', '.join(label(r) for r in unlike)} "
                         f"{'compute' if len(unlike) > 1 else 'computes'} {numerics_diff(unlike[0], best)}: "
                         "different arithmetic at the same precision flag (docs/measuring.md, Numerics), so its "
                         "speed is not the backend's alone; compare backends that compute alike.")
        v["short"] = (f"No like-for-like winner: the fastest, {fastest}, computes "
                      f"{numerics_diff(best, unlike[0])}, unlike {', '.join(label(r) for r in unlike)}.")
        v["evidence"] = [f"{label(r)}: {evidence(r)}" for r in tied]
    elif len(tied) == 1 and not across_runs:
        v["headline"] = (f"Fastest here: {label(best)}, but no winner established: with one run per configuration "
                         "the 95% intervals are within-run only and miss the run-to-run spread "
                         "(repeat with `bench run --repeat 3`).")
        once = [label(r) for r in ok if r["interval"] == WITHIN_RUN]
        v["short"] = (f"No winner: {'one run each' if len(once) == len(ok) else 'one run of ' + ', '.join(once)}, "
                      f"whose within-run interval misses the run-to-run spread (`--repeat 3`); fastest {fastest}.")
        v["evidence"] = [f"{label(best)}: {evidence(best)}"]
    elif len(tied) == 1 and drifted:
        v["headline"] = (f"Fastest here: {label(best)}, but no winner established: {v['drift']}, more than the "
                         f"{100 * lead:.1f}% between it and {label(rest[0])}: the difference may be the machine's "
                         "drift over the sweep, not the backends'.")
        v["short"] = (f"No winner: {BASELINE}@1 drifted {drift:.1f}% over its repetitions, more than the "
                      f"{100 * lead:.1f}% lead; fastest {fastest}.")
        v["evidence"] = [f"{label(best)}: {evidence(best)}"]
    elif len(tied) == 1 and small:
        v["headline"] = (f"Fastest here: {label(best)}, {100 * lead:.1f}% ahead of {label(rest[0])} beyond the 95% "
                         f"intervals, but under the {100 * WINNER_MIN_LEAD:.0f}% a verdict needs to name a winner: "
                         "choose between them on memory or convenience.")
        v["short"] = (f"No winner: {label(best)} leads by {100 * lead:.1f}%, under the {100 * WINNER_MIN_LEAD:.0f}% "
                      f"a winner needs; fastest {fastest}.")
        v["evidence"] = [f"{label(best)}: {evidence(best)}"]
    elif len(tied) == 1:
        v["headline"] = f"Use {label(best)}: faster than every alternative beyond the 95% intervals."
        v["short"] = f"Use {fastest}."
        v["evidence"] = [f"{label(best)}: {evidence(best)}"]
    else:
        names = ", ".join(label(r) for r in tied)
        v["headline"] = (f"No winner established: the 95% intervals of {names} overlap, so their difference is "
                         "not established (choose among them on memory or convenience, or repeat with more runs).")
        v["short"] = f"No winner: {names} are within noise of each other; fastest by the medians {fastest}."
        v["evidence"] = [f"{label(r)}: {evidence(r)}" for r in tied]
    v["alternatives"] = [f"{label(r)}: {cost(r, best)}"
                         + (f"; computes {numerics_diff(r, best)} (not like with like)" if differs(r, best) else "")
                         for r in rest]
    v["alternatives"] += [f"{label(r)}: {r['status']} ({r['reason'] or 'no reason recorded'})" for r in not_ok]
    caveats = []
    if best["device_type"] == "cpu":
        caveats.append("CPU worker processes over gloo: this says which backend is fastest on this CPU, nothing "
                       "about which to use on GPUs.")
    if any(r["interval"] == WITHIN_RUN for r in ok):
        caveats.append("Some intervals are within-run only (one run each): they understate the uncertainty; "
                       "`bench run --repeat 3` measures the run-to-run spread.")
    if caveats:
        v["caveat"] = " ".join(caveats)
    v["harness"] = reference.verdict_lines(ok)  # bench run --reference: the harness against its plain twin
    if recommended:  # what the recommended modes compute differently from the like-with-like runs
        plain = next((r for r in ok if r.get("mode") != "recommended" and r.get("numerics")), None)
        v["computes"] = [f"{label(r)} computes {numerics_diff(r, plain)} (as its library recommends)"
                         for r in ok if r.get("mode") == "recommended" and plain and differs(r, plain)]
        if v["computes"]:
            v["caveat"] = " ".join(filter(None, [v.get("caveat"), "Not like with like: " + "; ".join(v["computes"])
                                                 + ". Whether both modes train equally well is what "
                                                   "`bench run --to-accuracy` shows."]))
    return v


CPU_LINE = ("CPU worker processes over gloo: this says which backend is fastest on this CPU, nothing about which to "
            "use on GPUs.")
NOT_MEASURED_CHARS = 100  # a failure's reason on the first screen; the whole of it is in REPORT.md


def first_screen(vs: list[dict], rows: list[dict], page: bool = False) -> list[tuple[str, list[str]]]:
    """What a user reads first, as blocks of (heading, lines), in this order; a block with nothing to say is left
    out. A new block is one more line here. ``page``: for REPORT.md and REPORT.html, whose references to their own
    sections are links (the console names the section in REPORT.md)."""
    hardware = list(dict.fromkeys(v["hardware"] for v in vs))
    blocks = [(f"On {hardware[0]}" if len(hardware) == 1 else "By hardware", headlines(vs, len(hardware) == 1)),
              ("", [CPU_LINE] if any(r["device_type"] == "cpu" and r["runs_ok"] for r in rows) else []),
              ("Not measured", not_measured(rows, page)),
              ("Warnings, one line per kind (each configuration's are under its workload's tables in REPORT.md)",
               caution.kinds(rows))]
    return [(heading, lines) for heading, lines in blocks if lines]


def headlines(vs: list[dict], one_hardware: bool) -> list[str]:
    """One line per group that compares backends (its title less the hardware, where the block's heading names the
    one hardware); where none does, one line saying so."""
    lines = [f"{v['title'].removeprefix(v['hardware'] + ', ') if one_hardware else v['title']}: {v['short']}"
             for v in vs if v["short"]]
    if vs and not lines:
        lines = ["Nothing to compare: one backend per hardware, workload, precision and world size "
                 f"({', '.join(dict.fromkeys(v['best'] for v in vs))})."]
    return lines


SKIPPED_SECTION = "Skipped and failed runs"  # markdown.py's heading (###) over the table of every run not measured
SKIPPED_ANCHOR = "skipped-and-failed-runs"  # its id in REPORT.html (html.py) and its anchor in REPORT.md (GitHub's)


def not_measured(rows: list[dict], page: bool = False) -> list[str]:
    """One line per configuration with a failed run (its first reason, cut), then one naming the skipped ones, which
    points to the section that says why: a link on the page itself, the file and section on the console."""
    lines = []
    for r in sort_rows(rows):
        failed = [rec for rec in r["_recs"] if rec["status"] == "failed"]
        if failed:
            why = failed[0].get("reason") or "no reason recorded"
            first = re.search(r"first error: ([^;]+)", why)  # the exception's own line (bench/launch/diagnose.py)
            why = first[1] if first else why
            why = why if len(why) <= NOT_MEASURED_CHARS else why[:NOT_MEASURED_CHARS - 1] + "…"
            runs = "" if len(failed) == len(r["_recs"]) else f" {len(failed)} of {len(r['_recs'])} runs"
            lines.append(f"{label(r)} ×{r['world_size']} ({workload_title(r)}){runs} failed: {why}")
    skipped = [f"{label(r)} ×{r['world_size']}" for r in sort_rows(rows) if r["status"] == "skipped"]
    if skipped:
        where = f"[{SKIPPED_SECTION}](#{SKIPPED_ANCHOR})" if page else f"REPORT.md, {SKIPPED_SECTION}"
        lines.append(f"skipped here: {', '.join(dict.fromkeys(skipped))} (why: {where})")
    return lines


def console_lines(vs: list[dict], rows: list[dict]) -> list[str]:
    """The first screen as the console's last lines."""
    lines = []
    for heading, body in first_screen(vs, rows):
        lines += [f"{heading}:"] + [f"  {x}" for x in body] if heading else body
    return lines


def markdown(vs: list[dict], rows: list[dict]) -> list[str]:
    """The first screen at the top of REPORT.md (and so of REPORT.html), then the verdict in detail."""
    if not vs:
        return []
    md = ["## Verdict", ""]
    for heading, body in first_screen(vs, rows, page=True):  # a block without a heading is a caveat: a quote
        md += [f"**{heading}:**", ""] + [f"- {x}" for x in body] + [""] if heading else [f"> {x}" for x in body] + [""]
    md += ["The evidence for each verdict and what every alternative costs: *Verdict in detail*, below.", "",
           "## Verdict in detail", "",
           "Per hardware, workload, precision and world size: the backend to train with and the evidence, then what "
           "each alternative costs relative to the fastest. A winner is named only where the 95% intervals do not "
           "overlap and come from several runs each (one run gives a within-run interval, which misses the "
           f"run-to-run spread), its lead is at least {100 * WINNER_MIN_LEAD:.0f}% and more than the drift "
           f"{BASELINE}@1's repetitions show; the ImageNet-1k epoch (image classifiers) is 1,281,167 images / global "
           "throughput (compute only, no input pipeline).", ""]
    for v in vs:
        md += [f"### {v['title']}", "", f"**{v['headline']}**", ""] + [f"- {e}" for e in v["evidence"]] + [""]
        if v["alternatives"]:
            md += ["Alternatives, relative to the fastest:", ""] + [f"- {a}" for a in v["alternatives"]] + [""]
        if v.get("harness"):
            md += [f"- {h}" for h in v["harness"]] + [""]
        if v.get("drift"):
            md += [f"- Drift: {v['drift']}; a lead smaller than that is not named a winner.", ""]
        if v.get("caveat"):
            md += [f"> {v['caveat']}", ""]
    return md

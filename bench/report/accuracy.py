"""The "Time to accuracy" section (``bench run --to-accuracy``, records in ``RESULTS/accuracy/``) and its verdicts.

One block per question: the hardware, the workload and its data, the target and the schedule's settings (everything
but the scaling rule, which varies inside a block, and the rate it scaled to). In a block:

- a table of time to accuracy per configuration (backend, world size, global batch, scaling rule), the median over
  its runs with their range, beside the **throughput-only prediction**: the epochs the block's reference needed (its
  smallest global batch, then its smallest world size) x samples per epoch / the configuration's own training
  throughput. A throughput table promises that; where a configuration needs more epochs than the reference, it arrives
  later than promised (*actual / predicted* > 1);
- accuracy against wall clock and against epoch, one line per backend and world size (every run drawn, one colour
  per configuration; the legend beside the axes, off the data), the target as a dashed line;
- epochs to accuracy against the global batch, one line per scaling rule (the median over the backends at each
  batch), where the block has more than one global batch: what the scaling rule does at larger world sizes.

The verdicts (``verdicts``, added to the report's Verdict section by markdown.py) compare backends at one world size,
global batch and scaling rule: a fastest backend to the target is named only when every configuration has several
runs, all reached the target, none was disturbed, and the fastest one's slowest run beat every other configuration's
fastest run (the runs' ranges do not overlap); otherwise the fastest by the medians, and why no winner.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.core import accuracy_records, results, workloads
from bench.report.common import ORDER, label, md_table, save_figure, slug, workload_title

BLOCK = ("device_type", "hardware", *workloads.FIELDS, "data", "precision")
CONFIG = ("backend", "world_size", "global_batch", "batch_per_device", "scaling", "options", "cudnn_benchmark")


def records(src: Path, warn) -> list[dict]:
    return [r for r in accuracy_records.records(src, warn) if r.get("status") in results.STATUSES]


def _fields(rec: dict) -> dict:
    return {**{k: rec.get(k) for k in ("device_type", *workloads.FIELDS, "data", "precision", "backend", "world_size",
                                       "global_batch", "batch_per_device", "cudnn_benchmark", "loader", "decode",
                                       "nnodes")},
            "hardware": results.hardware(rec), "options": rec.get("options") or {},
            "optimizer": workloads.of_record(rec).optimizer,
            # the rules this run stands for: one, or several that gave its batch the same rate ("linear = none")
            "rules": accuracy_records.rules_of(rec),
            "scaling": accuracy_records.rules_label(accuracy_records.rules_of(rec))}


def configurations(recs: list[dict]) -> list[dict]:
    """One row per configuration (its ok runs summarised), grouped into blocks (``block``: the key's values)."""
    out: dict[tuple, dict] = {}
    for rec in recs:
        f = _fields(rec)
        block = tuple(str(f[k]) for k in BLOCK) + tuple(str(v) for k, v in accuracy_records.settings_key(rec)
                                                        if k != "scaling")
        key = block + tuple(str(f[k]) for k in CONFIG)
        row = out.setdefault(key, {**f, "block": block, "_recs": []})
        row["_recs"].append(rec)
    rows = []
    for row in out.values():
        ok = [r for r in row["_recs"] if r["status"] == "ok"]
        reached = [r for r in ok if r.get("reached")]
        times = [r["time_to_accuracy_seconds"] for r in reached]
        epochs = sorted(accuracy_records.reached_epochs(r) for r in ok)
        first = ok[0] if ok else row["_recs"][0]
        row.update(
            ok=ok, runs=len(ok), reached_runs=len(reached), all_reached=bool(ok) and len(reached) == len(ok),
            epochs=statistics.median(epochs) if epochs else None,  # infinity where most runs did not reach it
            steps=statistics.median([r["steps_to_accuracy"] for r in reached]) if reached else None,
            time=statistics.median(times) if times else None, time_range=(min(times), max(times)) if times else None,
            eval_time=statistics.median([r["eval_seconds_to_accuracy"] for r in reached]) if reached else None,
            throughput=statistics.median([r["train_throughput"] for r in ok if r.get("train_throughput")] or [0]) or None,
            samples_per_epoch=first.get("samples_per_epoch"), peak_lr=(first.get("schedule") or {}).get("peak_lr"),
            final_lr=statistics.median([r["final_lr"] for r in ok]) if ok else None,
            best=max((r["best_accuracy"] for r in ok), default=None),
            target=first.get("target_accuracy") or (first.get("accuracy_settings") or {}).get("target"),
            disturbed=sum(bool(r.get("disturbed")) for r in ok), settings=first.get("accuracy_settings") or {},
            dataset=first.get("dataset") or {}, not_ok=[r for r in row["_recs"] if r["status"] != "ok"])
        rows.append(row)
    rows.sort(key=lambda r: (r["block"], str(r["scaling"]), r["world_size"], r["global_batch"], _order(r["backend"])))
    return rows


def predictions(block: list[dict]) -> None:
    """Each row's throughput-only prediction: the reference's epochs x samples per epoch / the row's throughput."""
    ref = reference(block)
    for r in block:
        r["reference"] = ref
        r["predicted"] = (ref["epochs"] * r["samples_per_epoch"] / r["throughput"]
                          if ref and r["throughput"] and r["samples_per_epoch"] else None)


def reference(block: list[dict]) -> dict | None:
    """The configuration whose epochs the prediction assumes: the smallest global batch, then world size, that reached
    the target (its epochs are what a throughput comparison takes for granted)."""
    done = [r for r in block if r["all_reached"]]
    return min(done, key=lambda r: (r["global_batch"], r["world_size"], "none" not in r["rules"],
                                    _order(r["backend"]))) if done else None


def _order(backend: str) -> tuple:
    """The report's order of backends (single first), the others by name."""
    return (ORDER.index(backend), "") if backend in ORDER else (len(ORDER), str(backend))


def name(r: dict) -> str:
    return f"{label(r)} x{r['world_size']}"


def seconds(x) -> str | None:
    if x is None:
        return None
    return f"{x:.1f} s" if x < 600 else f"{x / 60:.1f} min"


def epochs_text(r: dict) -> str:
    if r["epochs"] is None:
        return f"{r['not_ok'][-1]['status']} (notes)" if r["not_ok"] else "-"
    if r["epochs"] == float("inf"):
        return f"not reached (best {100 * r['best']:.1f}%)"
    return f"{r['epochs']:g}" + (f" ({r['reached_runs']} of {r['runs']} runs reached)" if not r["all_reached"] else "")


def time_text(r: dict) -> str | None:
    if r["time"] is None:
        return None
    lo, hi = r["time_range"]
    return seconds(r["time"]) + (f" ({lo:.1f}–{hi:.1f})" if r["reached_runs"] > 1 else "")


def title(r: dict) -> str:
    s = r["settings"]
    warm = f"warm-up {s.get('warmup_epochs'):g} epochs, " if s.get("warmup_epochs") else ""
    extra = "".join(f", {k.replace('_', ' ')} {s[k]:g}" for k in ("momentum", "weight_decay") if s.get(k) is not None)
    every = "every epoch" if s.get("eval_every") == 1 else f"every {s.get('eval_every')} epochs"
    return (f"{workload_title(r)}, {r['data']} data, {r['precision']}: to {100 * r['target']:g}% top-1 within "
            f"{s.get('max_epochs')} epochs, base lr {s.get('base_lr'):g} at batch {s.get('base_batch')}, {warm}"
            f"{s.get('decay')} decay, evaluated {every}{extra} · {r['hardware']} ({r['device_type']})")


EXPLAIN = (
    "Each run trained in epochs until its held-out top-1 reached the target or its epochs ran out, at the learning "
    "rate the scaling rule gives its global batch (*peak lr*: `--base-lr` x global batch / `--base-batch` for linear, "
    "the square root of that ratio for sqrt), with the warm-up and decay in each block's title (docs/workloads.md, "
    "Time to accuracy). *Time to accuracy* is wall clock from the first "
    "step (set-up excluded) to the end of the evaluation that reached the target, the evaluations included; *of which "
    "evaluation* is their share. Figures are medians over a configuration's runs, the range of its runs in brackets. "
    "*Throughput-only prediction*: what a throughput table promises, the epochs of the block's reference (its smallest "
    "global batch that reached the target) x samples per epoch / the configuration's own training throughput (samples "
    "per second of training, evaluation excluded); *actual / predicted* above 1 is a configuration whose faster steps "
    "did not bring the result sooner, because it needed more epochs.")


def section(src: Path, out: Path, warn) -> list[str]:
    rows = configurations(records(src, warn))
    if not rows:
        return []
    md = ["## Time to accuracy (bench run --to-accuracy)", "", EXPLAIN, ""]
    blocks: dict[tuple, list[dict]] = {}
    for r in rows:
        blocks.setdefault(r["block"], []).append(r)
    for i, block in enumerate(blocks.values()):
        predictions(block)
        first = next((r for r in block if r["ok"]), block[0])
        ref = first["reference"]
        md += [f"### {title(first)}", ""]
        ds = first["dataset"]
        if ds.get("kind") == "learnable":
            md += [f"The learnable task: {ds.get('classes')} classes, {ds.get('pattern')}; {ds.get('train_samples')} "
                   f"training samples, {ds.get('held_out_samples')} held out (a disjoint draw), where the best "
                   f"possible classifier scores {100 * ds.get('reachable_accuracy', 0):.1f}% top-1.", ""]
        if ref:
            md += [f"Reference for the prediction: {name(ref)} at global batch {ref['global_batch']} ({ref['scaling']} "
                   f"scaling), {ref['epochs']:g} epochs.", ""]
        table_rows = [[name(r), r["world_size"], r["global_batch"], r["scaling"],
                       f"{r['peak_lr']:.4g}" if r["peak_lr"] is not None else None,
                       f"{r['runs']}" + (f" (+{len(r['not_ok'])} not ok)" if r["not_ok"] else ""), epochs_text(r),
                       r["steps"] and f"{r['steps']:g}", time_text(r), seconds(r["eval_time"]),
                       f"{r['throughput']:,.0f} {workloads.sample_unit(r)}/s" if r["throughput"] else None,
                       seconds(r["predicted"]),
                       f"{r['time'] / r['predicted']:.2f}" if r["time"] and r["predicted"] else None,
                       f"{r['final_lr']:.3g}" if r["final_lr"] is not None else None]
                      for r in block]
        md += [md_table(["configuration", "N", "global batch", "scaling", "peak lr", "runs", "epochs to accuracy",
                         "steps", "time to accuracy", "of which evaluation", "training throughput",
                         "throughput-only prediction", "actual / predicted", "final lr"], table_rows,
                        {1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 13}), ""]
        bad = [f"- `{name(r)}` run {rec['run_id']}: {rec['status']} ({rec.get('reason') or 'no reason recorded'})"
               for r in block for rec in r["not_ok"]]
        bad += [f"- ⚠ `{name(r)}` run {rec['run_id']}: replicas hold DIFFERENT parameters after training"
                for r in block for rec in r["ok"] if rec.get("replicas_consistent") is False]
        md += (["Notes:", ""] + bad + [""]) if bad else []
        stem = out / "plots" / slug("accuracy", i, first["model"], first["data"], f"{first['target']}", hw=first["hardware"])
        if draw_curves(block, stem):
            md += [f"![time to accuracy](plots/{stem.name}-curves.png)", ""]
        if draw_epochs(block, stem):
            md += [f"![epochs to accuracy](plots/{stem.name}-epochs.png)", ""]
    return md


def draw_curves(block: list[dict], stem: Path) -> bool:
    """Accuracy against wall clock (left) and against epoch (right), a row of the two per scaling rule: every run of
    every configuration (a run that stands for several rules in each of their rows), one colour and marker per backend
    (report/style.py) and one line style per world size, the legend beside each row. Curves that coincide (single x1
    and ddp x1 train the same model) are dodged sideways by a few pixels, so neither hides the other."""
    drawn = [r for r in block if r["ok"]]
    if not drawn:
        return False
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.report.style import EDGE, dodge, look

    rules = sorted({rule for r in drawn for rule in r["rules"]})
    fig, grid = plt.subplots(len(rules), 3, figsize=(13, 0.6 + 3.6 * len(rules)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1, 0.42]})
    axes = [(left, right) for left, right, _ in grid]
    for left, right, key in grid:
        right.sharey(left)
        key.axis("off")  # the legend's place: beside the data, never on it
    extras: dict = {}
    styles = {n: s for n, s in zip(sorted({r["world_size"] for r in drawn}), ("-", "--", ":", "-."))}
    target = 100 * block[0]["target"]
    for (left, right), rule in zip(axes, rules):
        mine = [r for r in drawn if rule in r["rules"]]
        for ax, x_of in ((left, lambda c: c["wall_seconds"]), (right, lambda c: c["epoch"])):
            points = [((id(r), j, k), x_of(c), 100 * c["accuracy"]) for r in mine for j, rec in enumerate(r["ok"])
                      for k, c in enumerate(rec.get("curve") or [])]
            if points:
                xs = [x for _, x, _ in points]
                ax.set_xlim(min(xs) - 0.05 * (max(xs) - min(xs) or 1), max(xs) + 0.05 * (max(xs) - min(xs) or 1))
                ax.set_ylim(0, 105)
            moved = _dodge_curves(ax, points, dodge)
            for r in mine:
                colour, marker = look(r["backend"], extras)
                for j, rec in enumerate(r["ok"]):
                    curve = rec.get("curve") or []
                    style = {"color": colour, "ls": styles.get(r["world_size"], "-"), "marker": marker,
                             "markersize": 4, "markeredgecolor": EDGE, "markeredgewidth": 0.4,
                             "alpha": 0.9 if j == 0 else 0.4}
                    ax.plot([moved[(id(r), j, k)] for k in range(len(curve))], [100 * c["accuracy"] for c in curve],
                            label=name(r) if j == 0 and ax is left else None, **style)
        for ax in (left, right):
            ax.axhline(target, ls="--", color="gray", lw=1)
            ax.grid(alpha=0.3)
        left.set_ylabel(f"held-out top-1 (%), {rule} scaling")
        right.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        handles, labels = left.get_legend_handles_labels()
        grid[rules.index(rule)][2].legend(handles, labels, loc="center left", fontsize=8, frameon=False,
                                          ncol=2 if len(labels) > 14 else 1)
    axes[0][0].set_title(f"accuracy vs wall clock (dashed: the {target:g}% target)", fontsize=10)
    axes[0][1].set_title("accuracy vs epoch", fontsize=10)
    axes[-1][0].set_xlabel("wall clock from the first step (s), evaluation included; coinciding points side by side")
    axes[-1][1].set_xlabel("epoch")
    fig.tight_layout()
    save_figure(fig, f"{stem}-curves", tight=True)
    return True


def _dodge_curves(ax, points: list, dodge) -> dict:
    """Each curve point's x, moved sideways where points of several curves fall on one place (the same x and, within a
    marker, the same y): each place's points side by side, the others where they are."""
    groups: dict[tuple, list] = {}
    for key, x, y in points:
        groups.setdefault((x, round(y, 1)), []).append((key, x, y))
    out = {key: x for key, x, _ in points}
    shared = [p for g in groups.values() if len(g) > 1 for p in g]
    if shared:  # (dodge settles the layout first)
        for key, x in dodge(ax, [((k, y), x, y) for k, x, y in shared]).items():
            out[key[0]] = x
    return out


def draw_epochs(block: list[dict], stem: Path) -> bool:
    """Epochs to accuracy against the global batch, one line per scaling rule through the median over the backends at
    each batch; a configuration that did not reach the target is drawn at the budget with an open marker."""
    batches = {r["global_batch"] for r in block if r["ok"]}
    if len(batches) < 2:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = block[0]["settings"].get("max_epochs")
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for i, rule in enumerate(sorted({rule for r in block for rule in r["rules"]})):
        color = plt.cm.tab10(i % 10)
        mine = [r for r in block if rule in r["rules"] and r["epochs"] is not None]
        xs = sorted({r["global_batch"] for r in mine})
        med = [statistics.median(min(r["epochs"], budget) for r in mine if r["global_batch"] == x) for x in xs]
        ax.plot(xs, med, "-", color=color, label=f"{rule} scaling (median over backends)")
        ax.scatter([r["global_batch"] for r in mine if r["all_reached"]],
                   [r["epochs"] for r in mine if r["all_reached"]], color=color, s=18, zorder=3)
        missed = [r for r in mine if not r["all_reached"]]
        if missed:
            ax.scatter([r["global_batch"] for r in missed], [budget] * len(missed), facecolors="none",
                       edgecolors=color, s=60, zorder=3, label=f"{rule}: not reached in {budget} epochs")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    ax.set_xlabel("global batch (samples per step)")
    ax.set_ylabel("epochs to accuracy")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(f"epochs to {100 * block[0]['target']:g}% top-1 against the global batch, per scaling rule",
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, f"{stem}-epochs", tight=True)
    return True


# ---------------------------------------------------------------------------------------------------
# Verdicts

def verdicts(src: Path, warn) -> list[dict]:
    """One verdict per block, scaling rule (the rules one run stood for, as one: "linear = none"), world size and
    global batch, whatever ran in it: the shape of report/verdict.py's."""
    rows = configurations(records(src, warn))
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["block"] + (str(r["scaling"]), r["world_size"], r["global_batch"]), []).append(r)
    return [verdict(g) for g in groups.values()]  # every group, a failed one too: the verdict covers them all


def verdict(group: list[dict]) -> dict:
    first = group[0]
    unit = "GPU" if first["device_type"] == "cuda" else "CPU worker"
    n = first["world_size"]
    target = f"{100 * first['target']:g}% top-1"
    v = {"title": (f"{first['hardware']}, {workload_title(first)} {first['data']} data, {first['precision']}: time to "
                   f"{target}, {first['scaling']} scaling, global batch {first['global_batch']}, {n} {unit}"
                   f"{'s' if n > 1 else ''}"),
         "hardware": first["hardware"], "established": False, "best": None, "evidence": [], "alternatives": [],
         "warnings": [], "short": None}
    done = sorted((r for r in group if r["all_reached"]), key=lambda r: r["time"])
    others = [r for r in group if r not in done]
    if not done:
        v["headline"] = f"No backend reached {target} in every run: nothing to name."
        v["short"] = f"No backend reached {target} in every run."
        v["alternatives"] = [f"{name(r)}: {missed(r)}" for r in group]
        return v
    best, rest = done[0], done[1:]
    v["best"] = name(best)
    v["alternatives"] = [f"{name(r)}: {cost(r, best)}" for r in rest] + [f"{name(r)}: {missed(r)}" for r in others]
    few = [r for r in group if r["runs"] < 2]
    disturbed = [r for r in group if r["disturbed"]]
    overlapping = [r for r in rest if r["time_range"][0] <= best["time_range"][1]]
    if not rest and not others:
        busy = " (⚠ disturbed)" if best["disturbed"] else ""
        v["headline"] = f"Only {name(best)} ran here{busy}: nothing to compare it with."
        v["short"] = f"Only {name(best)} ran{busy}: {evidence(best)}."
    elif disturbed:
        v["headline"] = (f"No winner established: runs of {', '.join(name(r) for r in disturbed)} were disturbed (other "
                         f"processes used the machine while they trained); fastest to {target} by the medians: "
                         f"{name(best)}.")
        v["short"] = f"No winner: disturbed runs; fastest to {target} by the medians {name(best)}."
    elif few:
        v["headline"] = (f"Fastest here: {name(best)} to {target}, but no winner established: "
                         f"{', '.join(name(r) for r in few)} ran once, so the spread of the time to accuracy (the "
                         "convergence's and the machine's) is unknown (repeat with `bench run --repeat 3`).")
        v["short"] = f"No winner: one run of {', '.join(name(r) for r in few)}; fastest to {target} {name(best)}."
    elif overlapping:
        v["headline"] = (f"No winner established: the runs of {name(best)} and {', '.join(name(r) for r in overlapping)} "
                         f"overlap in their time to {target}.")
        v["short"] = f"No winner: {name(best)} and {', '.join(name(r) for r in overlapping)} overlap in time to {target}."
    else:
        v["established"] = True
        v["headline"] = (f"Use {name(best)} to reach {target} soonest: its slowest run beat every other backend's "
                         "fastest.")
        v["short"] = f"Use {name(best)} to reach {target} soonest."
    v["evidence"] = [f"{name(r)}: {evidence(r)}" for r in ([best] if v["established"] or not rest else done)]
    if first["device_type"] == "cpu":
        v["caveat"] = ("CPU worker processes over gloo: this says which backend reaches the target first on this CPU, "
                       "nothing about GPUs.")
    return v


def evidence(r: dict) -> str:
    lo, hi = r["time_range"]
    runs = f"{r['runs']} runs, {lo:.1f}–{hi:.1f} s" if r["runs"] > 1 else "one run"
    return (f"{seconds(r['time'])} to {100 * r['target']:g}% top-1 ({runs}), {r['epochs']:g} epochs, of which "
            f"evaluation {seconds(r['eval_time'])}")


def cost(r: dict, best: dict) -> str:
    slower = r["time"] / best["time"] - 1
    more = f", {r['epochs']:g} epochs against {best['epochs']:g}" if r["epochs"] != best["epochs"] else ""
    return f"{100 * slower:.0f}% longer to the target by the medians ({seconds(r['time'])}){more}"


def missed(r: dict) -> str:
    if not r["ok"]:
        rec = r["not_ok"][-1]
        return f"{rec['status']} ({rec.get('reason') or 'no reason recorded'})"
    return (f"not reached in {r['runs'] - r['reached_runs']} of {r['runs']} runs (best top-1 {100 * r['best']:.1f}% "
            f"within {r['settings'].get('max_epochs')} epochs)")


def verdict_markdown(vs: list[dict]) -> list[str]:
    """The Verdict section of a report of to-accuracy records alone (with timed runs, report/verdict.py renders these
    verdicts beside its own)."""
    if not vs:
        return []
    md = ["## Verdict", "",
          "Per hardware, workload, target, scaling rule, global batch and world size: the backend that reached the "
          "target soonest. A winner is named only where every configuration ran several times (`--repeat`), all its "
          "runs reached the target, none was disturbed, and the fastest one's slowest run beat every other's fastest.",
          ""]
    for v in vs:
        md += [f"### {v['title']}", "", f"**{v['headline']}**", ""] + [f"- {e}" for e in v["evidence"]] + [""]
        if v["alternatives"]:
            md += ["Alternatives, relative to the fastest:", ""] + [f"- {a}" for a in v["alternatives"]] + [""]
        if v.get("caveat"):
            md += [f"> {v['caveat']}", ""]
    return md


def report_alone(src: Path, out: Path, warn) -> int:
    """``bench report`` on results that hold to-accuracy records only (no timed run): REPORT.md and REPORT.html with
    the verdicts and this section, the verdict printed last."""
    import datetime as dt

    from bench.report import html, verdict
    from bench.report.common import write_atomic

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"bench: error: cannot create --out {str(out)!r}: {e.strerror or e}", file=sys.stderr)
        return 2
    recs = records(src, warn)
    vs = verdicts(src, lambda m: None)
    md = ["# Parallel backend comparison", "",
          f"{len(recs)} time-to-accuracy records from `{src}` and no timed run; generated "
          f"{dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}.", ""]
    md += verdict_markdown(vs) + section(src, out, warn)
    text = "\n".join(md)
    write_atomic(out / "REPORT.md", text)
    page = out / "REPORT.html"
    write_atomic(page, html.page(text, [{"_recs": recs}], src / accuracy_records.KIND, out))
    print(f"report: {(out / 'REPORT.md').resolve()}\nhtml:   {page.resolve()}")
    print("\n".join(["", "== Verdict"] + verdict.console_lines(vs, [])))
    return 0

"""The "Training equivalence" section: the latest ``bench verify`` summary found beside the records
(``RESULTS/verify/summary-*.json``), and the distributed evaluation of runs made with ``bench run --eval``."""
from __future__ import annotations

from pathlib import Path

from bench.report import common
from bench.report.common import fmt, md_table
from bench.core import workloads

EXPLAIN = ("Each backend trained {steps} steps of {model} at {image_size} px, batch {batch_size}/device, from one "
           "seed on one sequence of global batches, and was compared with a single-process reference computing "
           "what N replicas compute. *Parameter distance* is ||p - p_ref|| / ||p_ref - p_0||: the error as a "
           "share of the reference's whole update. *Rounding noise* is the same distance for a twin reference "
           "that differs only in summation order: how far rounding alone moves this (chaotic) training. A backend "
           "passes within {factor}x that noise, and at least the precision's floor.")


def latest_summary(src: Path, warn) -> dict | None:
    """The newest readable ``bench verify`` summary in ``src/verify/``."""
    return common.latest_summary(src, "verify", "verify", warn)


def section(src: Path, warn) -> list[str]:
    doc = latest_summary(src, warn)
    if doc is None:
        return []
    s = doc["settings"]
    sci = lambda x: None if x is None else f"{x:.2e}"  # noqa: E731
    rows = [[r["backend"], r["world_size"], r["precision"], r["reference"], sci(r["max_loss_deviation"]),
             sci(r["param_distance"]), sci(r["rounding_noise"]), r["eval_samples"],
             r["verdict"] + (f": {r['why']}" if r["why"] else "")] for r in doc["rows"]]
    notes = list(dict.fromkeys(f"- `{r['backend']}` ×{r['world_size']}: {r['note']}" for r in doc["rows"] if r["note"]))
    failed = sum(r["verdict"] == "FAIL" for r in doc["rows"])
    return ["## Training equivalence (bench verify)", "",
            f"From `{doc['_path']}` ({doc['created_at']}, {s['device_type']}): "
            + ("**every backend that ran passed.**" if not failed else f"**{failed} FAILED.**"), "",
            EXPLAIN.format(factor=doc["noise_factor"], **s), "",
            md_table(["backend", "N", "precision", "reference", "max loss deviation", "parameter distance",
                      "rounding noise", "eval samples", "verdict"], rows, {1, 4, 5, 6, 7}), ""] \
        + (["Notes:", ""] + notes + [""] if notes else [])


def eval_table(ok: list[dict], label) -> list[str]:
    """Distributed evaluation of the runs made with --eval (every sample counted once)."""
    rows = []
    for r in ok:
        for rec in (x for x in r["_recs"] if x["status"] == "ok" and x.get("eval_samples")):
            rows.append([label(r), r["world_size"], rec["run_id"], rec["eval_samples"],
                         None if rec["eval_loss"] is None else f"{rec['eval_loss']:.4f}",
                         "none: scored by its own loss" if rec["eval_accuracy"] is None
                         else f"{100 * rec['eval_accuracy']:.2f} %",
                         fmt(rec.get("eval_throughput"), f"{workloads.sample_unit(rec)}/s")])
    if not rows:
        return []
    return ["**Evaluation** (`--eval`: each rank its DistributedSampler shard, padding dropped, sums all-reduced)",
            "", md_table(["backend", "N", "run", "samples", "loss", "accuracy", "throughput"], rows, {1, 3, 4, 5, 6}),
            ""]

"""The "Largest model that trains" section (``bench run --find-max-model``, ``RESULTS/maxmodel/summary-*.json``): for
each backend and world size the largest model of the GPT ladder that trained at the per-device batch, plotted against
the world size, and the per-rank memory breakdown of the models that fitted (parameters, gradients, optimizer state
read from each rank's own tensors; on GPUs the rest of the peak: activations and buffers) as stacked bars."""
from __future__ import annotations

from pathlib import Path

from bench.report.common import GiB, label, latest_summary, md_table, save_figure, slug

PARTS = (("parameters", "#1f77b4"), ("gradients", "#ff7f0e"), ("optimizer_state", "#2ca02c"),
         ("activations", "#9467bd"))


def latest(src: Path, warn) -> dict | None:
    return latest_summary(src, "maxmodel", "max-model", warn)


def breakdown(probe: dict) -> dict | None:
    """Rank 0's state in GiB by part (the ranks of a data-parallel run hold the same amounts)."""
    state = (probe.get("state_bytes") or [None])[0]
    return {k: None if state.get(k) is None else state[k] / GiB for k, _ in PARTS} if state else None


def section(src: Path, out: Path, warn) -> list[str]:
    from bench.core.searches import max_model as describe

    doc = latest(src, warn)
    if doc is None:
        return []
    rows = []
    for row in doc["rows"]:
        fit = [p for p in row["probes"] if p["result"] == "fits"]
        parts = breakdown(fit[-1]) if fit else None
        gib = lambda k: "-" if parts is None or parts[k] is None else f"{parts[k]:.3f}"  # noqa: E731
        rows.append([label({"backend": row["backend"], "options": row.get("options") or {}}), row["world_size"],
                     row["precision"], describe(row), *[gib(k) for k, _ in PARTS], len(row["probes"])])
    budget = (f" with a heap budget of {doc['memory_limit_gib']:g} GiB per rank (the CPU stand-in for GPU memory)"
              if doc.get("memory_limit_gib") else "")
    first = doc["rows"][0] if doc["rows"] else {}
    md = ["## Largest model that trains (bench run --find-max-model)", "",
          f"From `{doc['_path']}` ({doc['created_at']}): for each backend and world size, the largest size of the "
          f"ladder ({', '.join(doc['ladder'])}) that trained at batch {first.get('batch_per_device')}/device, sequence "
          f"{first.get('seq_len')}, {first.get('optimizer')}, each probe a short isolated run{budget}. The memory "
          "columns are rank 0's, in GiB, for the largest model that fitted: parameters, gradients and optimizer state "
          "(with a backend's fp32 master copies) read from the rank's own tensors, so a sharded backend shows its "
          "shard; DeepSpeed keeps gradients in buffers of its own (-); *activations* is the rest of the GPU's peak "
          "(activations, temporary and communication buffers), not measured on CPUs.", "",
          md_table(["backend", "N", "precision", "largest model that trains", "parameters", "gradients",
                    "optimizer state", "activations", "probes"], rows, {1, 4, 5, 6, 7, 8}), ""]
    stem = out / "plots" / slug("maxmodel", doc["_path"], hw=str(first.get("device_type")))
    if draw(doc["rows"], stem):
        md += [f"![max model](plots/{stem.name}.png)", ""]
    return md


def draw(rows: list[dict], stem: Path) -> bool:
    """Left: the largest model's parameters against the world size, a line per backend. Right: the memory
    breakdown per backend at the largest world size, stacked, for the model each fitted (named under its bar)."""
    found = [r for r in rows if r.get("max_parameters")]
    if not found:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(label({"backend": r["backend"], "options": r.get("options") or {}}) for r in found):
        mine = sorted((r["world_size"], r["max_parameters"] / 1e6) for r in found
                      if label({"backend": r["backend"], "options": r.get("options") or {}}) == name)
        left.plot([n for n, _ in mine], [p for _, p in mine], "o-", label=name)
    left.set_xlabel("world size")
    left.set_ylabel("largest model that trains (M parameters)")
    left.set_xticks(sorted({r["world_size"] for r in found}))
    left.legend(fontsize=8)
    top = max(r["world_size"] for r in found)
    bars = []
    for r in (r for r in found if r["world_size"] == top):
        fit = [p for p in r["probes"] if p["result"] == "fits"]
        parts = breakdown(fit[-1]) if fit else None
        if parts:
            bars.append((f"{label({'backend': r['backend'], 'options': r.get('options') or {}})}\n{r['max_model']}",
                         parts))
    bottom = [0.0] * len(bars)
    for key, color in PARTS:
        values = [parts[key] or 0.0 for _, parts in bars]
        right.bar(range(len(bars)), values, bottom=bottom, color=color, label=key.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    right.set_ylabel(f"GiB on rank 0 (world size {top})")
    right.legend(fontsize=8)
    fig.suptitle("Largest model that trains, and what each rank holds for it", fontsize=10)
    fig.tight_layout()
    save_figure(fig, stem, tight=True)
    return True

"""What every part of the report shares: grouping keys, labels, slugs, number formats, Markdown tables."""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from bench.core import workloads
from bench.core.text import md_table  # noqa: F401 (the report's table helper, shared with bench doctor)

GiB = 2 ** 30
BASELINE = "single"
# the same workload (bench/core/workloads.py FIELDS), precision, batch, data and hardware
BASELINE_MATCH = (*workloads.FIELDS, "precision", "batch_per_device", "data", "loader", "decode", "device_type",
                  "hardware")
OWN_MATCH = BASELINE_MATCH + ("backend", "options")
KNOB = "cudnn_benchmark"  # matched when the baseline has it, else the default (on)
SECTION = ("device_type", "hardware")
WORKLOAD = workloads.TABLE_FIELDS
ORDER = ("single", "dp", "ddp", "ddp_spawn", "ddp_amp_syncbn", "horovod")  # table order; others follow
STAR = "★"
CSV_FIRST = ["device_type", "hardware", *workloads.TABLE_FIELDS, "precision", "backend", "options", "world_size"]
WITHIN_RUN = "within-run only"
CPU_CAVEAT = ("**CPU figures.** These numbers come from CPU worker processes over gloo on this host; "
              "they say nothing about GPU scaling.")


MARK = " ⚠"  # after a figure that a warning is about (caution.py lists the warnings under the tables)


def flagged(r: dict, *fields: str, kinds: tuple = ()) -> bool:
    """Whether a warning of the row (``_warnings``, report/caution.py) is about one of these figures."""
    return any(w["field"] in fields or w["kind"] in kinds for w in r.get("_warnings") or [])


def mark(text: str | None, r: dict, *fields: str, kinds: tuple = ()) -> str | None:
    """``text`` with the warning mark when a warning is about that figure."""
    return text + MARK if text is not None and flagged(r, *fields, kinds=kinds) else text


def withheld(r: dict, field: str) -> str | None:
    """Why a derived figure of the row is not shown as a result (report/caution.py ``withheld``), or None."""
    return (r.get("_withheld") or {}).get(field)


def shown(text: str | None, r: dict, field: str, kinds: tuple = ()) -> str | None:
    """A derived figure's cell: the reason in its place where it is withheld, else ``mark``'s text."""
    why = withheld(r, field)
    return f"{MARK.strip()} {why}" if why and text is not None else mark(text, r, field, kinds=kinds)


def rate(r: dict) -> str:
    """Throughput's unit for the row's workload: img/s, or seq/s for a sequence model."""
    return f"{workloads.sample_unit(r)}/s"


def workload_title(r: dict) -> str:
    """``resnet50 224px`` or ``gpt-125m seq 1024 (adamw)``: the optimizer where it is not SGD."""
    opt = r.get("optimizer")
    return " ".join(filter(None, [r["model"], workloads.shape(r), f"({opt})" if opt and opt != "sgd" else ""]))


def latest_summary(src: Path, kind: str, what: str, warn) -> dict | None:
    """The newest readable schema-1 summary of ``bench run --find-max-batch`` (kind ``maxbatch``) or
    ``--find-max-model`` (``maxmodel``) in ``src/kind/``, with its path as ``_path``; unreadable ones are skipped
    with a warning."""
    from bench.core.results import read_json

    for f, doc in read_json(reversed(sorted((src / kind).glob("summary-*.json"))), f"{what} summary", warn):
        if isinstance(doc, dict) and doc.get("kind") == kind and doc.get("schema") == 1:
            doc["_path"] = str(f)
            return doc
        warn(f"skipping {f}: not a schema-1 {what} summary")
    return None


def legend_outside(fig, axes) -> None:
    """One legend for the figure's axes, below them (under the axis labels), so that it never covers data or a title;
    the figure must use the constrained layout (``plt.subplots(..., layout="constrained")``), which makes room."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(text, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", fontsize=8,
                   ncol=min(4, len(entries)))


FIGURE_DPI = 120


def save_figure(fig, stem, tight: bool = False) -> None:
    """``stem``.png and ``stem``.svg (the HTML page inlines the SVG), then the figure is closed.

    The layout is settled once, at the files' resolution, and both files keep it: savefig lays a figure out again
    before each file (a draw of its own, under the constrained layout or ``tight``), so two files cost four or five
    draws, most of a report's time. Without ``tight``, the draw that settles the layout is the PNG's own (Agg renders
    while the layout engine places the axes, titles and legend, and the PNG is written from that raster as savefig
    writes it); the SVG is drawn once more, as laid out. ``tight``: the box around what is drawn, with savefig's
    padding; both files are drawn after the layout (savefig crops to the box as it draws)."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.image import imsave

    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    fig.set_dpi(FIGURE_DPI)
    if tight:
        fig.draw_without_rendering()  # the layout engine places the axes, titles and legend; nothing is rasterised
        box = fig.get_tightbbox().padded(plt.rcParams["savefig.pad_inches"])
        fig.set_layout_engine(None)  # keep those places: no engine, so savefig draws each file once, as laid out
        for ext in ("png", "svg"):
            fig.savefig(f"{stem}.{ext}", dpi=FIGURE_DPI, bbox_inches=box)
    else:
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        canvas.draw()  # the layout and the PNG's raster in one draw
        imsave(f"{stem}.png", canvas.buffer_rgba(), format="png", origin="upper", dpi=fig.dpi)  # as savefig writes it
        fig.set_layout_engine(None)
        fig.savefig(f"{stem}.svg", dpi=FIGURE_DPI)
    plt.close(fig)


def fmt(x, unit: str, digits: int = 1) -> str | None:
    return None if x is None else f"{x:,.{digits}f} {unit}"


def label(r: dict) -> str:
    """The backend, with its options where they are switched on: ``horovod (compression=fp16)``, and the cuDNN
    knob where it is off (``dp (cudnn.benchmark off)``)."""
    options = r["options"] if isinstance(r["options"], dict) else json.loads(r["options"] or "{}")
    extra = [f"{k}={v}" for k, v in options.items() if v not in (None, False, "none")]
    if r.get(KNOB) is False:
        extra.append("cudnn.benchmark off")
    if r.get("loader") and (r.get("loader"), r.get("decode")) != ("torchvision", "cpu"):
        extra.append(f"{r['loader']} loader, decode {r['decode']}")
    if (r.get("nnodes") or 1) > 1:
        extra.append(f"{r['nnodes']} nodes × {r['world_size'] // r['nnodes']}")
    return r["backend"] + (f" ({', '.join(extra)})" if extra else "")


def options_of(r: dict) -> dict:
    """A record's or a summary row's ``options`` as a dict (summary rows hold them as JSON)."""
    o = r.get("options")
    return o if isinstance(o, dict) else json.loads(o or "{}")


def workload_options(r: dict) -> str:
    """The settings of the workload ``r`` ran with that single has too (``backends.shared_settings``), as sorted JSON
    ("{}": none). A throughput divides by single@1's only where these agree: the GPU sweep runs ResNet-50
    channels_last, and dp NCHW beside it (it cannot honour the layout), so dp's efficiency needs a single@1 in NCHW,
    which the planner adds."""
    import backends

    return json.dumps(backends.shared_settings(options_of(r)), sort_keys=True)


def plain(r: dict) -> bool:
    """Whether ``r`` runs its backend at its defaults: no option but the workload's shared settings (so single@1 of the
    GPU sweep's channels_last ResNet-50 is plain, and ddp with --ddp-bucket-mb 5 is not)."""
    import backends

    on = {k: v for k, v in options_of(r).items() if v not in (None, False)}
    return on == backends.shared_settings(on)


def groups(rows: list[dict], keys: tuple) -> list[tuple[tuple, list[dict]]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return sorted(out.items(), key=lambda kv: [str(v) for v in kv[0]])


def sort_rows(rows: list[dict]) -> list[dict]:
    rank = lambda b: (ORDER.index(b), "") if b in ORDER else (len(ORDER), str(b))  # noqa: E731
    return sorted(rows, key=lambda r: (r.get("nnodes") or 1, r["world_size"], rank(r["backend"]), str(r["precision"]),
                                       r["options"], r.get(KNOB) is False))


def slug(*parts, hw: str) -> str:
    """A file-name stem; the hardware enters as a short hash, so two GPU models never share a file."""
    text = re.sub(r"[^a-z0-9]+", "-", "-".join(map(str, parts)).lower()).strip("-")
    return f"{text}-{hashlib.sha1(hw.encode()).hexdigest()[:6]}"


def write_atomic(final: Path, text: str) -> None:
    """Write text beside ``final``, then move it into place: a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=final.suffix, dir=final.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

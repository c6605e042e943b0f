"""The "Backend settings" section: per backend in the records, the ``backend_info`` settings that tilt a comparison
between backends (DESIGN.md: defaults are part of the measurement), side by side, so a reader sees what each
backend ran with before comparing its throughput or memory with another's."""
from __future__ import annotations

from bench.report.common import label, md_table, sort_rows

MiB = 2 ** 20


def bucket(info: dict) -> str | None:
    """The gradient bucket, in MiB of fp32 elements: DDP's ``bucket_cap_mb``, DeepSpeed's ``bucket_elements``."""
    if info.get("bucket_cap_mb") is not None:
        return f"{info['bucket_cap_mb']:g} MiB"
    if info.get("bucket_elements") is not None:
        return f"{info['bucket_elements'] * 4 / MiB:g} MiB"
    return None


SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def numerics(info: dict) -> str | None:
    """What the norms and the residual stream ran in (the run's ``numerics``: autocast keeps them fp32, FSDP2's and
    DeepSpeed's half parameters make them half)."""
    got = info.get("_numerics") or {}
    parts = [f"{k} {SHORT.get(got[k], got[k])}" for k in ("norm", "residual") if got.get(k)]
    return ", ".join(parts) or None


def yes_no(value) -> str | None:
    return None if value is None else "on" if value else "off"


# (column, how to read it from backend_info); None in a cell: the backend has no such setting
COLUMNS = [
    ("grad reduce dtype", lambda i: i.get("grad_reduce_dtype")),
    ("overlap comm", lambda i: yes_no(i.get("overlap_comm"))),
    ("bucket", bucket),
    ("grad norm", lambda i: i.get("grad_norm")),
    ("throughput timer", lambda i: i.get("throughput_timer")),
    ("params as bucket view", lambda i: yes_no(i.get("parameters_as_bucket_view"))),
    ("norms fp32 via", lambda i: i.get("norm_fp32_via")),
    ("compile", lambda i: i.get("compile")),
    ("FSDP2 groups, reshard", lambda i: f"{i['fsdp_groups']}, {i['reshard_after_forward']}"
     if i.get("fsdp_groups") is not None else None),
    ("norms, residual in", numerics),
    ("mixed precision", lambda i: i.get("mixed_precision")),  # fsdp2's and DeepSpeed's: autocast, or half parameters
    ("optimizer", lambda i: i.get("optimizer_impl")),  # fused, foreach or for-loop, read from the optimizer
]


def section(summary_rows: list[dict]) -> list[str]:
    """One row per backend (with its options) and precision among the ok records; where runs of one row
    disagree, every value they recorded, joined by " / "."""
    table: dict[tuple, list[set]] = {}
    for r in sort_rows([r for r in summary_rows if r["runs_ok"]]):
        key = (label(r), r["precision"])
        cells = table.setdefault(key, [set() for _ in COLUMNS])
        for rec in r["_recs"]:
            info = rec.get("backend_info") if rec.get("status") == "ok" else None
            if info:
                info = {**info, "_numerics": rec.get("numerics")}
                for cell, (_, read) in zip(cells, COLUMNS):
                    value = read(info)
                    if value is not None:
                        cell.add(str(value))
    if not table:
        return []
    rows = [[name, precision, *(" / ".join(sorted(c)) or "—" for c in cells)] for (name, precision), cells in table.items()]
    return ["## Backend settings", "",
            "Library defaults differ between backends and tilt a comparison, so the suite sets them on purpose and "
            "records them (`backend_info`). Gradients are reduced in fp32 unless a knob asks for compression. "
            "— : the backend has no such setting.", "",
            md_table(["backend", "precision", *(c for c, _ in COLUMNS)], rows), ""] + departures(summary_rows)


def departures(summary_rows: list[dict]) -> list[str]:
    """Where a backend departed from its library's default (the record's ``departures``), and why: the reason in its
    registry entry (backends/__init__.py ``departs``), or a knob asked for it (the run's options)."""
    import backends

    seen: dict[tuple, list] = {}
    for r in sort_rows([r for r in summary_rows if r["runs_ok"]]):
        for rec in r["_recs"]:
            for setting, d in ((rec.get("departures") or {}) if rec.get("status") == "ok" else {}).items():
                why = backends.departs(r["backend"]).get(setting) if r["backend"] in backends.REGISTRY else None
                seen.setdefault((label(r), setting), [str(d.get("library")), str(d.get("ours")),
                                                      why or "asked for on the command line (the run's options)"])
    if not seen:
        return []
    return ["The rule (docs/backends.md): every backend runs as its library ships it, except where a default would "
            "make the comparison measure something other than the backend. Where one departs, and why:", "",
            md_table(["backend", "setting", "library's default", "this run", "why"],
                     [[name, setting, *cells] for (name, setting), cells in seen.items()]), ""]

"""``bench tune``'s summary: its schema, where it is written and how it is read back (the command that searches is
bench/commands/tune.py; the report's "At their best" section and verdict line read the newest summary). No torch."""
from __future__ import annotations

from pathlib import Path

from bench.core.results import read_json

TUNE_SCHEMA = "tune-1"


def path(results_dir: Path, stamp: str) -> Path:
    return Path(results_dir) / "tune" / f"summary-{stamp}.json"


def latest(results_dir: Path, warn) -> dict | None:
    """The newest readable tune summary in RESULTS/tune, with its path as ``_path``."""
    for f, doc in read_json(sorted((Path(results_dir) / "tune").glob("summary-*.json"), reverse=True),
                            "tune summary", warn):
        if isinstance(doc, dict) and doc.get("schema") == TUNE_SCHEMA:
            doc["_path"] = str(f)
            return doc
        warn(f"skipping {f}: not a {TUNE_SCHEMA} summary")
    return None


def describe(settings: dict) -> str:
    """A trial's settings in words: "batch 16, channels_last, ddp_bucket_mb=100"; "the defaults" when none changed."""
    parts = []
    for k, v in settings.items():
        if k == "warmup":
            continue  # only what --compile needed to reach steady state
        if k == "batch_size":
            parts.append(f"batch {v}")
        elif v is True:
            parts.append(k)
        elif k == "cudnn_benchmark":
            parts.append(f"cudnn.benchmark {v}")
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts) or "the defaults"

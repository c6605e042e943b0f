"""What a search's summary row says, in words: ``bench run --find-max-batch`` (bench/plan/maxbatch.py) and
``--find-max-model`` (bench/plan/maxmodel.py) print it as each search ends, and the report's sections on memory
headroom and model size show it (bench/report/headroom.py, maxmodel.py)."""
from __future__ import annotations


def max_batch(row: dict) -> str:
    """A --find-max-batch row: the largest batch that fit, or why none is known."""
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    if row["error"]:
        return f"error: {row['error']}" + (f" (fits {row['max_batch']})" if row["max_batch"] else "")
    if row["max_batch"] is None:
        return "not even batch 1 fits"
    return f">= {row['max_batch']} (the cap; nothing ran out of memory)" if row["capped"] else str(row["max_batch"])


def max_model(row: dict) -> str:
    """A --find-max-model row: the largest GPT size that trained, or why none is known."""
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    size = f"{row['max_model']} ({row['max_parameters'] / 1e6:,.1f} M parameters)" if row["max_model"] else None
    if row["error"]:
        return f"error: {row['error']}" + (f" (fits {size})" if size else "")
    if row.get("host_limit"):
        return f"{size or 'nothing'}; the next size {row['host_limit']}"
    if size is None:
        return "not even the smallest size fits"
    return f"{size}, the ladder's largest: nothing ran out of memory" if row["capped"] else size

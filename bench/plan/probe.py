"""What the two memory searches share (``--find-max-batch``: maxbatch.py; ``--find-max-model``: maxmodel.py): for every
configuration, skip it with the reason or search with short probe runs, each its own process tree (the backend's
minimum warm-up and one timed step), whose records go to ``RESULTS/<kind>``; then one summary file beside them. A probe
"fits" when it finishes ok and "does not fit" when it runs out of memory; any other failure ends that search with the
reason."""
from __future__ import annotations

import dataclasses
from pathlib import Path

OOM = "out of memory"


def outcome(rec: dict) -> str:
    """A probe's result: fits, out of memory, or error."""
    return "fits" if rec["status"] == "ok" else OOM if str(rec.get("reason", "")).startswith(OOM) else "error"


def sweep(kind: str, configs, results_dir: Path, env_meta: dict, memory_limit_gib: float | None, say, *,
          empty, start, search, done, summary: dict) -> list[dict]:
    """Search every configuration. ``empty(cfg)``: a skipped configuration's row; ``start(cfg)``: the line that opens
    its search; ``search(cfg, probe)``: its row, where ``probe(label, **change)`` runs ``cfg`` with ``change`` and
    returns the record (``timeout``: its own limit); ``done(row)``: the line that closes it; ``summary``: the summary file's own fields."""
    import backends
    from bench import launch
    from bench.plan.sweep import loader_unavailable
    from bench.core import results
    from bench.core.config import MIN_WARMUP

    out = results_dir / kind
    rows = []
    for i, cfg in enumerate(configs, 1):
        backend = backends.create(cfg.backend)
        reason = loader_unavailable(cfg) or backend.unavailable(cfg)
        if reason:
            rows.append({**empty(cfg), "skipped": reason})
            say(f"[{i}/{len(configs)}] {cfg.backend} x{cfg.world_size}: skipped: {reason}")
            continue
        least = max(MIN_WARMUP, backend.min_warmup(cfg)[0])

        def probe(label, cfg=cfg, backend=backend, least=least, timeout=None, **change):
            short = dataclasses.replace(cfg, warmup=least, steps=1, windows=1, eval=False, **change)
            rec = launch.run_one(short, out, env_meta, backend, memory_limit_gib=memory_limit_gib, timeout=timeout)
            say(f"    {label}: {'fits' if rec['status'] == 'ok' else rec['reason'][:120]}")
            return rec

        say(f"[{i}/{len(configs)}] {cfg.backend} x{cfg.world_size} {cfg.precision}: {start(cfg)}")
        row = search(cfg, probe)
        say(f"    {done(row)}")
        rows.append(row)
    doc = {"schema": 1, "kind": kind, "created_at": results.utc_now(), **summary,
           "memory_limit_gib": memory_limit_gib, "env": env_meta, "rows": rows}
    results.write_json_atomic(doc, out / f"summary-{results.new_run_id(kind, len(rows))}.json")
    return rows

"""``bench run --find-max-batch``: the largest per-device batch each backend fits, by a bounded search of
isolated runs (each its own process tree, so one out-of-memory never poisons the next probe).

From the configured batch: double until a probe runs out of memory or the cap (``--max-batch``) is reached,
halve instead if the first probe does not fit, then bisect between the largest batch that fitted and the
smallest that did not until they are within 1/8 of each other. A probe is a short run (the backend's
minimum warm-up, one timed step); it "fits" when it finishes ok and "does not fit" when it fails with out of
memory; any other failure ends that configuration's search with the reason.

On GPUs the device's memory decides. On CPU nothing runs out below the cap unless ``--memory-limit-gib G``
gives every rank a heap budget (RLIMIT_DATA at its size after start-up + G GiB), the CPU stand-in for a
GPU's memory: sharded backends then fit larger batches, for the same reason they do on GPUs.
"""
from __future__ import annotations

from pathlib import Path

from bench.core import searches
from bench.plan import probe as _probe
from bench.plan.probe import OOM

RESOLUTION = 8  # bisect until hi - lo <= lo / RESOLUTION


def search(cfg, probe, cap: int) -> dict:
    """Find the largest batch that fits. ``probe(batch)`` returns a record; ``cap`` bounds the doubling."""
    tried = []

    def fits(batch: int) -> bool | None:
        rec = probe(batch)
        status = _probe.outcome(rec)
        tried.append({"batch": batch, "result": status, "run_id": rec["run_id"], "reason": rec.get("reason"),
                      "memory": rec.get("memory"), "host_peak_rss_bytes": rec.get("host_peak_rss_bytes")})
        return {"fits": True, OOM: False}.get(status)

    lo, hi, batch = 0, None, min(cfg.batch_size, cap)
    while True:
        ok = fits(batch)
        if ok is None:
            return _result(cfg, tried, None, capped=False, error=tried[-1]["reason"])
        if ok:
            lo = batch
            if batch >= cap:
                return _result(cfg, tried, lo, capped=True)
            if hi is not None:
                break
            batch = min(batch * 2, cap)
        else:
            hi = batch
            if lo or batch == 1:
                break
            batch //= 2
    while lo and hi - lo > max(1, lo // RESOLUTION):
        mid = (lo + hi) // 2
        ok = fits(mid)
        if ok is None:
            return _result(cfg, tried, lo, capped=False, error=tried[-1]["reason"])
        lo, hi = (mid, hi) if ok else (lo, mid)
    return _result(cfg, tried, lo or None, capped=False)


def _result(cfg, tried, max_batch, capped, error=None) -> dict:
    return {"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision, "model": cfg.model,
            "image_size": cfg.image_size, "device_type": cfg.device_type, "options": cfg.options,
            "max_batch": max_batch, "capped": capped, "error": error, "probes": tried}


def run(configs, results_dir: Path, env_meta: dict, cap: int, memory_limit_gib: float | None, say) -> list[dict]:
    """Search every configuration; probe records go to RESULTS/maxbatch, and one summary file beside them."""
    return _probe.sweep(
        "maxbatch", configs, results_dir, env_meta, memory_limit_gib, say,
        empty=lambda cfg: _result(cfg, [], None, capped=False),
        start=lambda cfg: f"searching from batch {cfg.batch_size} (cap {cap})",
        search=lambda cfg, probe: search(cfg, lambda batch: probe(f"batch {batch}", batch_size=batch), cap),
        done=lambda row: f"max batch per device: {searches.max_batch(row)}", summary={"cap": cap})

"""One timed run as ``bench run`` measures it: launched as its own process tree (bench/launch), the machine watched
around it, and its record given the machine's state and whether it was disturbed (bench/launch/machine.py, judged by
bench/core/trust.py). ``bench run`` and ``bench tune`` both measure through ``run_watched``, so a tune trial's record
is a sweep run's record: the same writer, the same ``machine``, ``disturbed`` and ``disturbed_reasons`` fields."""
from __future__ import annotations

from pathlib import Path


def run_watched(cfg, results_dir: Path, env_meta: dict, *, gpus: list[int] | None = None, waited: dict | None = None,
                **run_one) -> dict:
    """Run ``cfg`` (``launch.run_one``'s keywords in ``run_one``) with the machine watched; the record, attached."""
    import backends
    from bench import launch
    from bench.launch import machine

    if gpus is None:
        gpus = machine.run_gpus(cfg.device_type, cfg.world_size // max(1, cfg.nnodes))
    with machine.Watch(cfg.device_type, gpus) as watch:
        rec = launch.run_one(cfg, results_dir, env_meta, backends.create(cfg.backend), **run_one)
    return machine.attach(rec, watch, results_dir, waited)

"""``bench run --find-max-model``: for each backend and world size, the largest model of the GPT ladder that trains
at the configured per-device batch, found with isolated runs (each its own process tree, so one out-of-memory never
poisons the next probe): the question sharded backends exist to answer.

The ladder is walked upwards (``--ladder``; by default GPT-3's sizes on GPUs, gpt-micro to gpt-medium on CPUs); a
probe is a short run (the backend's minimum warm-up, one timed step) that "fits" when it finishes ok. The walk stops
at the first size that runs out of memory; any other failure stops it with the reason. Each probe that fits keeps
its per-rank memory breakdown (the record's ``state_bytes``: parameters, gradients and optimizer state read from the
rank's own tensors, and on GPUs the rest of the peak: activations and buffers).

On CPUs nothing runs out of memory unless ``--memory-limit-gib G`` gives every rank a heap budget (as for
``--find-max-batch``): the CPU stand-in for a GPU's memory.
"""
from __future__ import annotations

from pathlib import Path

from bench.core import searches
from bench.plan import probe as _probe
from bench.core import workloads
from bench.core.errors import UsageError

LADDERS = {"cuda": ["gpt-125m", "gpt-350m", "gpt-760m", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b"],
           "cpu": ["gpt-micro", "gpt-tiny", "gpt-small", "gpt-medium"]}


def ladder(text: str | None, device_type: str) -> list[str]:
    """The sizes to walk, smallest first (``--ladder a,b,c``, or the device's default)."""
    names = [n.strip() for n in text.split(",") if n.strip()] if text else LADDERS[device_type]
    bad = [n for n in names if n not in workloads.GPT_SIZES]
    if bad or not names:
        raise UsageError(f"--ladder {text!r}: {', '.join(bad) or 'empty'}; choose GPT sizes from "
                         f"{', '.join(workloads.GPT_SIZES)}")
    size = lambda n: workloads.gpt_parameters(n, 1)  # noqa: E731
    if [size(n) for n in names] != sorted(size(n) for n in names) or len(set(names)) < len(names):
        raise UsageError(f"--ladder {text}: give each size once, smallest first")
    return names


# Building the model: the ranks of this machine each build the whole fp32 model on the host (replicas, and ZeRO-3,
# which partitions after building), or only their shard (a backend that honours meta_init: FSDP2). A rung whose build
# would not fit the host's available memory is not launched (it would swap or be killed by the OOM killer, and say
# nothing about the GPUs); HOST_MARGIN covers the copy a build makes on its way to the device.
HOST_MARGIN = 1.25
S_PER_BILLION = 60.0  # a probe's time limit grows with the model: building and initialising it on the host


def host_need(cfg, model: str) -> tuple[int, str]:
    """Bytes of host memory this machine's ranks need to build ``model`` for ``cfg``'s backend, and what each builds."""
    import backends

    whole = 4 * workloads.gpt_parameters(model, cfg.seq_len)
    if getattr(backends.backend_class(cfg.backend), "meta_init", False):
        return int(HOST_MARGIN * cfg.nproc_per_node * whole / cfg.world_size), "shard"
    return int(HOST_MARGIN * cfg.nproc_per_node * whole), "model"


def host_shortfall(cfg, model: str) -> str | None:
    """Why ``model`` cannot even be built on this host (one line), or None."""
    import psutil

    (need, what), have = host_need(cfg, model), psutil.virtual_memory().available
    if need <= have:
        return None
    return (f"host memory: building {model} takes ~{need / 2 ** 30:,.1f} GiB here ({cfg.nproc_per_node} rank(s) x the "
            f"fp32 {what}), {have / 2 ** 30:,.1f} GiB available; not launched")


def probe_timeout(cfg, model: str) -> float:
    from bench.launch import default_timeout

    return default_timeout(cfg) + S_PER_BILLION * workloads.gpt_parameters(model, cfg.seq_len) / 1e9


def search(cfg, sizes: list[str], probe) -> dict:
    """Walk ``sizes`` upwards with ``probe(model) -> record`` until one does not fit (or cannot be built here)."""
    tried, best, limit = [], None, None
    for model in sizes:
        limit = host_shortfall(cfg, model)
        if limit:
            break
        rec = probe(model)
        status = _probe.outcome(rec)
        tried.append({"model": model, "parameters": workloads.gpt_parameters(model, cfg.seq_len), "result": status,
                      "run_id": rec["run_id"], "reason": rec.get("reason"), "state_bytes": rec.get("state_bytes"),
                      "memory": rec.get("memory"), "host_peak_rss_bytes": rec.get("host_peak_rss_bytes")})
        if status != "fits":
            break
        best = model
    last = tried[-1] if tried else {}
    return {"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision,
            "optimizer": cfg.optimizer, "seq_len": cfg.seq_len, "batch_per_device": cfg.batch_size,
            "device_type": cfg.device_type, "options": cfg.options, "max_model": best,
            "max_parameters": workloads.gpt_parameters(best, cfg.seq_len) if best else None,
            "capped": not limit and last["result"] == "fits",
            "error": last["reason"] if tried and last["result"] == "error" else None, "host_limit": limit,
            "probes": tried}


def run(configs, sizes: list[str], results_dir: Path, env_meta: dict, memory_limit_gib: float | None,
        say) -> list[dict]:
    """Search every configuration; probe records go to RESULTS/maxmodel, and one summary file beside them."""
    return _probe.sweep(
        "maxmodel", configs, results_dir, env_meta, memory_limit_gib, say, empty=search_row_skipped,
        start=lambda cfg: (f"{', '.join(sizes)} at batch {cfg.batch_size}/device, seq {cfg.seq_len}, "
                           f"{cfg.optimizer}"),
        search=lambda cfg, probe: search(cfg, sizes, lambda model: probe(
            model, model=model, flops_per_sample=None, meta_init=True, timeout=probe_timeout(cfg, model))),
        done=lambda row: f"largest model that trains: {searches.max_model(row)}", summary={"ladder": sizes})


def search_row_skipped(cfg) -> dict:
    return {"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision,
            "optimizer": cfg.optimizer, "seq_len": cfg.seq_len, "batch_per_device": cfg.batch_size,
            "device_type": cfg.device_type, "options": cfg.options, "max_model": None, "max_parameters": None,
            "capped": False, "error": None, "host_limit": None, "probes": []}

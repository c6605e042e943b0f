"""Rank 0's record of a run, from what every rank measured: the slowest rank's windows, throughput and its
within-run interval, memory per device and its imbalance, the replica check, evaluation, the compute-only
reference, energy and FLOPs. Figures are defined once, in bench/core/stats.py."""
from __future__ import annotations

import hashlib

import torch

from bench.core import cuda, mfu, results, stats, traces
from bench.core.config import RunConfig
from bench.rank import energy


def build_record(cfg: RunConfig, spec: dict, per_rank: list[dict], settle_steps: int,
                 measured_peak: dict | None = None) -> dict:
    record = results.skeleton(cfg.to_dict(), spec["run_id"], spec["env"])
    # The slowest rank sets the pace: a window lasts as long as its slowest rank.
    times = [max(ws) for ws in zip(*(r["window_seconds"] for r in per_rank))]
    cpu = [max(c) for c in zip(*(r.get("window_cpu_seconds") or [] for r in per_rank))]  # the busiest rank per window
    global_batch = cfg.global_batch
    thr, ci = stats.median_ci95(stats.window_throughputs(times, global_batch * cfg.steps))
    waits = [r["data_wait_seconds"] for r in per_rank]
    memory = sorted((m for r in per_rank for m in r["memory"]), key=lambda m: m["device_index"])
    checksums = {r["param_sha256"] for r in per_rank}
    skipped = [r.get("skipped_steps") for r in per_rank]
    warm = [max(s) for s in zip(*(r.get("warmup_step_seconds") or [] for r in per_rank))]  # slowest rank per step
    record.update(
        status="ok",
        window_seconds=times,
        window_cpu_seconds=cpu or None,
        throughput=thr,
        throughput_ci95=ci,
        per_device_throughput=thr / cfg.world_size,
        tokens_per_second=thr * cfg.seq_len if cfg.seq_len else None,
        state_bytes=state_fields(per_rank, memory),
        memory=memory,
        memory_imbalance=stats.imbalance([m["peak_reserved_bytes"] for m in memory]),
        replicas_consistent=(len(checksums) == 1) if len(per_rank) > 1 else None,
        data_wait_seconds=[max(w) for w in zip(*waits)] if waits[0] is not None else None,
        corrupt_images_skipped=sum(r["corrupt_images_skipped"] for r in per_rank) if waits[0] is not None else None,
        empty_classes=per_rank[0].get("empty_classes"),
        loader_info=per_rank[0].get("loader_info"),  # real data: shuffle, pinning, workers, DALI's decoder and copy  # class folders with no image, skipped (labels unchanged)
        host_peak_rss_bytes=[r["host_peak_rss_bytes"] for r in per_rank],
        warmup_host_peak_rss_bytes=[r.get("warmup_host_peak_rss_bytes") for r in per_rank],
        # ranks agree (GradScaler sees the all-reduced gradients); the max is the safe side if one did not
        skipped_steps=[max(s) for s in zip(*skipped)] if skipped[0] is not None else None,
        warmup_skipped_steps=max(r.get("warmup_skipped_steps") or 0 for r in per_rank)
        if skipped[0] is not None else None,
        settle_steps=settle_steps,
        warmup_step_seconds=warm,
        compile_seconds=compile_seconds(warm) if (cfg.options or {}).get("compile") and warm else None,
        compile_graphs=per_rank[0].get("compile_graphs"),  # graph breaks, graphs, any compiled inside a window
        sdpa=per_rank[0].get("sdpa"),  # a GPT's attention kernels (bench/rank/compiled.py)
        backend_info=per_rank[0].get("backend_info"),
        numerics=per_rank[0].get("numerics"),  # which dtype norms, attention, the residual stream ran in (numerics.py)
        **eval_fields(per_rank),
        **compute_only_fields(per_rank),
        **energy_fields(per_rank, times, global_batch * cfg.steps, global_batch * cfg.steps * len(times)),
        **flops_fields(cfg, memory, thr),
        **measured_peak_fields(cfg, thr, measured_peak),
        trace=trace_fields(per_rank),
        profiler_in_windows=any(r.get("profiler_in_windows") for r in per_rank),
        loader_workers_per_process=per_rank[0].get("loader_workers"),  # DataLoader workers of each training process
        threads_per_rank=spec["threads_per_rank"],
        cpu_binding=[r.get("cpu_binding") for r in per_rank],  # per rank: the CPUs it was bound to, or why not
        # fp16: each rank's loss scale after the windows; ranks whose scales differ summed gradients at different scales
        loss_scales=[r.get("loss_scale") for r in per_rank] if skipped[0] is not None else None,
        rank_python_prefixes=[r.get("python_prefix") for r in per_rank],  # each rank's sys.prefix (env.python_prefix:
        # the harness's); a launcher found on PATH once started ranks outside the harness's virtualenv
        finished_at=results.utc_now(),
    )
    return record


def compile_seconds(warmup_seconds: list[float]) -> float:
    """torch.compile's cost, estimated from warm-up: what each warm-up step took beyond the last (steady) one.
    Never inside a timed window: the minimum warm-up with --compile is 3 steps."""
    return sum(max(0.0, t - warmup_seconds[-1]) for t in warmup_seconds[:-1])


def compute_only_fields(per_rank: list[dict]) -> dict:
    """The compute-only reference's windows (the slowest rank per window) and what it could not skip."""
    first = per_rank[0]
    measured = first.get("compute_only_window_seconds") is not None
    return {
        "compute_only_window_seconds": [max(w) for w in zip(*(r["compute_only_window_seconds"] for r in per_rank))]
        if measured else None,
        "compute_only": {"measured": measured, "reason": first.get("no_compute_only"),
                         "keeps": first.get("compute_only_keeps") if measured else None},
    }


def energy_fields(per_rank: list[dict], times: list[float], samples_per_window: int, samples: int) -> dict:
    """Energy of every GPU of the run (each rank read its own). ``joules_per_image`` and ``mean_watts`` come from
    one read before the first window and one after the last on each rank; per-window joules and their medians
    are ``energy_window_diagnostic`` only: NVML's counter moves every 20-100 ms, as coarse as a short window."""
    span = [r.get("energy_span_joules") for r in per_rank]
    measured = all(j is not None for j in span)
    joules = [None if any(j is None for j in w) else sum(w)
              for w in zip(*(r.get("energy_joules") or [None] * len(times) for r in per_rank))]
    return {"energy_total_joules": sum(span) if measured else None,
            "energy_span_seconds": max(r["energy_span_seconds"] for r in per_rank) if measured else None,
            "energy_reason": per_rank[0].get("energy_reason"),
            **energy.span_summary(span, [r.get("energy_span_seconds") for r in per_rank], samples),
            "energy_window_diagnostic": {"joules": joules, **{
                f"median_{k}": v for k, v in energy.summarise(joules, times, samples_per_window).items()}}
            if measured else None}


def flops_fields(cfg: RunConfig, memory: list[dict], throughput: float) -> dict:
    """FLOPs, the peak that applies and MFU. An fp32 run's peak is TF32's only where TF32 is on for what its FLOPs
    run as: cuDNN's flag for a torchvision model (convolutions), the matmul flag for the others (bench/core/mfu.py)."""
    per_sample = cfg.flops_per_sample
    device = memory[0]["device_name"] if memory else None
    tf32 = cuda.tf32()
    applies = tf32["cudnn"] if cfg.workload.kind == "vision" else tf32["matmul"]
    peak, source = mfu.peak_tflops(device, cfg.precision, cfg.peak_tflops, tf32=applies)
    return {"flops_per_sample": per_sample, "peak_tflops_per_device": peak, "peak_tflops_source": source,
            "tf32": tf32 if cfg.device_type == "cuda" else None,
            "mfu": mfu.mfu(per_sample, throughput, peak, cfg.world_size)}


def measured_peak_fields(cfg: RunConfig, throughput: float, measured: dict | None) -> dict:
    """MFU against the matmul rate this device was measured to sustain (bench/rank/peak.py: ``measured``, the cache
    entry's figures, or None when none was asked for) and the precision mode that both peaks are for (``peak_mode``:
    bf16, fp32 with TF32 on or off, fp32 on a CPU)."""
    from bench.core.peak import mode

    return {"peak_mode": mode(cfg.precision, tf32_applies(cfg)), "peak_measured": measured,
            "mfu_measured": mfu.mfu(cfg.flops_per_sample, throughput, (measured or {}).get("tflops"), cfg.world_size)}


def tf32_applies(cfg: RunConfig) -> bool | None:
    """Whether an fp32 run's FLOPs run on TF32 tensor cores: cuDNN's flag for a torchvision model (convolutions), the
    matmul flag for the others (bench/core/mfu.py); None off CUDA or at another precision."""
    if cfg.device_type != "cuda" or cfg.precision != "fp32":
        return None
    return cuda.tf32()["cudnn" if cfg.workload.kind == "vision" else "matmul"]


def state_fields(per_rank: list[dict], memory: list[dict]) -> list[dict] | None:
    """Each rank's training state in bytes (``Backend.state_bytes``) and, on GPUs, ``activations``: the timed
    windows' peak allocated bytes on the rank's device minus that state (what a step needs beyond it: activations,
    temporary buffers, communication buckets)."""
    if not any(r.get("state_bytes") for r in per_rank):
        return None
    peaks = {m["rank"]: m.get("peak_allocated_bytes") for m in memory}
    out = []
    for r in per_rank:
        s = dict(r.get("state_bytes") or {})
        held = sum(v for v in s.values() if v)
        peak = peaks.get(r["rank"])
        s["activations"] = peak - held if peak is not None and len(memory) == len(per_rank) else None
        out.append(s)
    return out


def trace_fields(per_rank: list[dict]) -> dict | None:
    """--trace: every rank's trace file and size, and the phases per step read from them (bench/core/traces.py)."""
    got = [r.get("trace") for r in per_rank]
    if got[0] is None:
        return None
    return {"files": [t["file"] for t in got], "bytes": [t["bytes"] for t in got],
            "profiled_seconds": max(t["profiled_seconds"] for t in got),
            "export_seconds": max(t["export_seconds"] for t in got),
            "analysis_seconds": max(t.get("analysis_seconds") or 0.0 for t in got),
            "gpu": [t.get("gpu") for t in got] if any(t.get("gpu") for t in got) else None,
            "reasons": [t["reason"] for t in got if t["reason"]],
            **traces.summarise([t["phase_times"] for t in got])}


def eval_fields(per_rank: list[dict]) -> dict:
    """The record's evaluation fields: sums were all-reduced, so every rank holds the totals; the throughput is
    set by the slowest rank."""
    ev = [r.get("eval") for r in per_rank]
    if ev[0] is None:
        return {}
    slowest = max(e["eval_seconds"] for e in ev)
    return {"eval_samples": ev[0]["eval_samples"], "eval_loss": ev[0]["eval_loss"],
            "eval_accuracy": ev[0]["eval_accuracy"],
            "eval_throughput": ev[0]["eval_samples"] / slowest if slowest > 0 else None}


def param_checksum(named_parameters) -> str:
    """SHA-256 over the bytes of every (full) parameter: equal on two ranks iff their replicas are bit-identical."""
    h = hashlib.sha256()
    for name, p in named_parameters:
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

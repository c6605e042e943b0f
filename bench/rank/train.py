"""The one timed loop. Runs on every rank of every backend; rank 0 writes the run's single record.

The harness (bench/launch) writes SPEC.json: the run config, its run_id, the results directory and the environment
metadata; every rank starts as ``python -m bench.rank --spec SPEC.json`` (bench/rank/entry.py). Backends set up, step
and tear down; everything timed or written happens here, so every backend is measured by the same code.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch

import backends
from bench.core import cuda, results
from bench.core.config import RunConfig
from bench.core.markers import REFUSED_EXIT, REFUSED_MARKER
from bench.rank import compiled as compile_probe
from bench.rank import affinity, data, lifeline, peak, startup
from bench.rank.energy import EnergyMeter, window_energy
from bench.rank.evaluate import evaluate
from bench.rank.faults import Fault
from bench.rank.memory import host_peak_rss, limit_memory, memory_stats, reset_peaks
from bench.rank.numerics import probe as probe_numerics
from bench.rank.record import build_record, param_checksum, tf32_applies
from bench.rank.trace import capture, profiler_active, trace_path


def run(spec: dict) -> None:
    cfg = RunConfig.from_dict(spec["config"])
    limit_memory(spec.get("memory_limit_gib"))
    fault = Fault.parse(os.environ.get("BENCH_FAULT"))
    # Each rank gets its share of the cores, whatever the launcher; oversubscribed threads measure contention.
    torch.set_num_threads(spec["threads_per_rank"])
    if cfg.device_type == "cuda":
        # On (the default, what users run): warm-up picks the fastest conv algorithms, as Horovod's benchmark
        # does. Off: a labelled variant, because DataParallel's replica threads may redo the search (docs/measuring.md).
        cuda.set_cudnn(bool(cfg.cudnn_benchmark))
    backend = backends.create(cfg.backend)
    backend.setup(cfg)
    hosts = check_fingerprints(backend, cfg, spec)  # before any timed work: every rank runs the same thing
    binding = affinity.bind_rank(spec, cfg, backend.devices())  # near its GPU, its threads its share there
    departures = backend.departures(cfg)  # where it departs from its library's defaults (docs/backends.md, The rule)
    fault.install(backend)
    backend.batches = data.batches_for(cfg, backend)
    waited = getattr(backend.batches, "wait_seconds", None) is not None  # real data: time the input waits
    gc_policy = startup.done(timed=True)  # one collection; automatic collection off (bench/rank/startup.py)

    def sync():
        for d in backend.devices():
            if d.type == "cuda":
                cuda.synchronize(d)

    scale0, count0 = backend.loss_scale(), backend.skipped_steps()
    warmup_seconds = []  # each warm-up step on its own (synchronised, untimed): where compilation shows
    for i in range(cfg.warmup):
        lifeline.set_phase(f"warm-up step {i + 1} of {cfg.warmup}")
        t0 = time.perf_counter()
        backend.train(1)
        sync()
        warmup_seconds.append(time.perf_counter() - t0)
    sizing = size_windows(backend, cfg, warmup_seconds) if cfg.window_s else None
    # Warm-up peaks hold one-time work (cuDNN's search workspaces, DDP's bucket rebuild, lazy init). Keep them
    # as their own fields, release the allocator's cached blocks, reset the peaks, and run one untimed settle
    # step that re-reserves what a steady step needs, so the windows neither pay for re-reserving nor see
    # warm-up's peaks.
    warmup_memory, warmup_rss = memory_stats(backend), host_peak_rss()
    reset_peaks(backend)
    lifeline.set_phase("settle step")
    backend.train(SETTLE_STEPS)
    sync()
    scale_after_warmup, count_after_warmup = backend.loss_scale(), backend.skipped_steps()
    meter = EnergyMeter(backend.devices())
    compiling = bool((cfg.options or {}).get("compile"))
    graphs_before = compile_probe.dynamo_counters() if compiling else None  # compilation is warm-up's
    timed = windows(backend, cfg, sync, meter, waited)
    graphs = compile_probe.compile_fields(graphs_before, compile_probe.dynamo_counters() if compiling else None)

    lifeline.set_phase("after the windows")
    fault.after_training(backend)
    memory, host_rss = memory_stats(backend), host_peak_rss()  # before evaluation: the timed windows' peaks
    state = backend.state_bytes()  # what this rank holds after a step: parameters, gradients, optimizer state
    if cfg.eval:
        lifeline.set_phase("evaluation")
    evaluated = evaluate(backend, data.eval_dataset(cfg), backend.feed_batch,
                         data.loader_workers(cfg, backend.feed_batch // cfg.batch_size)) if cfg.eval else None
    for m, w in zip(memory, warmup_memory):
        m["warmup_peak_allocated_bytes"] = w["peak_allocated_bytes"]
        m["warmup_peak_reserved_bytes"] = w["peak_reserved_bytes"]
    checksum = param_checksum(backend.full_parameters())
    # The compute-only reference: the same processes and batches with the gradient synchronisation skipped,
    # after everything above (the replicas drift apart from here on, which nothing reads any more).
    compute_only, no_compute_only = None, compute_only_reason(backend, cfg)
    if no_compute_only is None:
        with backend.skip_gradient_sync():
            compute_only = windows(backend, cfg, sync, meter, waited, "compute-only window")
    # --trace: a few profiled steps after everything reported was measured (bench/rank/trace.py)
    trace = None
    if spec.get("trace_steps"):
        lifeline.set_phase("trace")
        trace = capture(backend, spec["trace_steps"], sync, trace_path(spec, backend.rank))
    lifeline.set_phase("numerics probe")
    numerics = probe_numerics(backend, compiled=compiling)  # one more step, watched
    attention = None
    if cfg.workload.kind == "language":  # which SDPA kernel ran: one more step, profiled (bench/rank/compiled.py)
        lifeline.set_phase("attention kernel probe")
        attention = compile_probe.sdpa_kernels(backend)
    measured_peak = None
    if backend.rank == 0:  # the first run of a sweep measures its device's matmul peak; the others read the cache
        lifeline.set_phase("matmul peak")
        measured_peak = peak.for_run(spec, cfg, backend.devices()[0], tf32_applies(cfg))
    mine = {
        "rank": backend.rank,
        "window_seconds": timed["seconds"],
        "window_cpu_seconds": timed["cpu"],
        "window_host_seconds": timed["host"] or None,
        "window_gpu_seconds": timed["gpu"] or None,
        "data_wait_seconds": timed["data_wait"] if waited else None,
        "corrupt_images_skipped": backend.batches.skipped if waited else None,
        "empty_classes": backend.batches.empty_classes if waited else None,
        "loader_info": backend.batches.info if waited else None,
        "memory": memory,
        "param_sha256": checksum,
        "eval": evaluated,
        "energy_joules": timed["energy"],  # per window: diagnostics only (bench/rank/energy.py)
        "energy_span_joules": timed["energy_span"][0],  # first read before window 1 to last read after the last
        "energy_span_seconds": timed["energy_span"][1],
        "energy_reason": meter.reason,
        "compute_only_window_seconds": compute_only and compute_only["seconds"],
        "no_compute_only": no_compute_only,
        "compute_only_keeps": backend.compute_only_keeps,
        "host_peak_rss_bytes": host_rss,
        "warmup_host_peak_rss_bytes": warmup_rss,
        "skipped_steps": timed["skipped"] if scale0 is not None else None,
        "loss_scale": backend.loss_scale(),  # after the windows: every rank's must be the same (test_loss_scale.py)
        "warmup_skipped_steps": skips(scale0, scale_after_warmup, count0, count_after_warmup)
        if scale0 is not None else None,
        "backend_info": backend.describe(),
        "loader_workers": getattr(backend, "loader_workers", None),
        "warmup_step_seconds": warmup_seconds,
        "trace": trace,
        "state_bytes": state,
        "profiler_in_windows": timed["profiler"] or bool(compute_only and compute_only["profiler"]),
        "cpu_binding": binding,
        "python_prefix": sys.prefix,  # the environment this rank imported from (the launcher's interpreter)
        "numerics": numerics,
        "compile_graphs": graphs,
        "sdpa": attention,
    }
    lifeline.set_phase("gathering the record")
    gathered = backend.all_gather(mine)
    if backend.rank == 0:
        record = build_record(cfg, spec, gathered, SETTLE_STEPS, measured_peak)
        record.update(hosts=hosts, launched_by=spec.get("launched_by"), windows_wall_span=timed["wall_span"],
                      gc_policy=gc_policy, window_sizing=sizing, departures=departures,
                      compute_only_wall_span=compute_only and compute_only["wall_span"], **host_bound(gathered))
        results.save(record, spec["results_dir"])
    backend.barrier()  # nobody tears the process group down while rank 0 still needs it
    backend.teardown()


SETTLE_STEPS = 1  # untimed steps between the peak reset and the first window
MAX_WINDOW_STEPS = 10_000  # a window sized by time never runs more steps than this (a do-nothing step of microseconds)


def size_windows(backend, cfg: RunConfig, warmup_seconds: list[float]) -> dict:
    """--window-s: the steps that fill ``cfg.window_s`` seconds at the step time warm-up measured, the same on every
    rank: each rank's median over the second half of its warm-up steps (the first pays lazy initialisation and cuDNN's
    search), the slowest rank's taken. Sets ``cfg.steps``; returns what the record says of it (``window_sizing``)."""
    mine = statistics.median(warmup_seconds[len(warmup_seconds) // 2:])
    step_s = max(backend.all_gather(mine))
    cfg.steps = max(1, min(MAX_WINDOW_STEPS, round(cfg.window_s / step_s) if step_s > 0 else MAX_WINDOW_STEPS))
    return {"window_s": cfg.window_s, "step_seconds": step_s, "steps": cfg.steps,
            "from": "the slowest rank's median warm-up step, over the second half of warm-up"}
cpu_clock = time.process_time  # CPU time of the process, all threads (bench/core/reference.py: the twin on CPUs)


# A run is host-bound when the host took at least this share of the GPU's time to enqueue a window's steps: the GPU
# then finished less than 10% after it was handed its last work, so it waited for the host (launch overhead, Python,
# host syncs inside the step) rather than the host for it.
HOST_BOUND_RATIO = 0.9


def windows(backend, cfg: RunConfig, sync, meter, waited: bool, phase: str = "window") -> dict:
    """``cfg.windows`` timed windows of ``cfg.steps`` steps: a collection of the young generations (the collector is
    off: bench/rank/startup.py), barrier, synchronize, host reads (loss scale, energy),
    t0, the steps, synchronize, t1, host reads again. Nothing but the steps is inside the timed region. On CUDA each
    window also times the host's enqueueing of its steps (t0 to the return of ``train``) and the GPU's time for them
    (a CUDA event recorded before t0 and one after the steps, read after the synchronize: ``cuda.timing_event``)."""
    out: dict[str, Any] = {"seconds": [], "cpu": [], "data_wait": [], "skipped": [], "energy": [], "profiler": False,
           "host": [], "gpu": []}
    gpu = any(d.type == "cuda" for d in backend.devices())
    for i in range(cfg.windows):
        lifeline.set_phase(f"{phase} {i + 1} of {cfg.windows}")  # several nodes: where a lost node was
        startup.between_windows()  # the collector's work, outside the window on every rank (bench/rank/startup.py)
        backend.barrier()  # start every window together; the barrier itself is not timed
        sync()
        scale, count, joules = backend.loss_scale(), backend.skipped_steps(), meter.read()
        out["profiler"] |= profiler_active()  # never: --trace profiles after every window (asserted in tests)
        if i == 0:  # energy over the whole span: NVML's counter is too coarse for one window (bench/rank/energy.py)
            first_joules, e0, wall0 = joules, time.perf_counter(), time.time()
        w0 = backend.batches.wait_seconds if waited else 0.0
        if gpu:  # on the current device's stream, before t0: the GPU reaches it when it has finished what came before
            start, end = cuda.timing_event(), cuda.timing_event()
            start.record()
        c0 = cpu_clock()  # this process's CPU time (every thread): the plain twin's comparison on CPUs
        t0 = time.perf_counter()
        backend.train(cfg.steps)
        if gpu:
            out["host"].append(time.perf_counter() - t0)  # the host's time to enqueue the steps
            end.record()
        sync()
        out["seconds"].append(time.perf_counter() - t0)
        if gpu:
            out["gpu"].append(start.elapsed_time(end) / 1000.0)  # ms: the GPU's time from the first step to the last
        out["cpu"].append(cpu_clock() - c0)
        out["data_wait"].append(backend.batches.wait_seconds - w0 if waited else 0.0)
        out["skipped"].append(skips(scale, backend.loss_scale(), count, backend.skipped_steps()))
        last_joules = meter.read()
        out["profiler"] |= profiler_active()
        out["energy"].append(window_energy(joules, last_joules))
    out["energy_span"] = (window_energy(first_joules, last_joules), time.perf_counter() - e0)
    out["wall_span"] = [wall0, time.time()]  # epoch seconds: the harness's machine watch reads this span
    return out


def host_bound(gathered: list[dict]) -> dict:
    """The record's host-bound fields from every rank's windows (CUDA; None on CPUs, where the host is the device):
    per window the host's time to enqueue the steps and the GPU's time for them, each the max over ranks;
    ``host_over_gpu`` the ratio of their medians, and ``host_bound`` when it reaches HOST_BOUND_RATIO."""
    hosts = [m.get("window_host_seconds") for m in gathered]
    gpus = [m.get("window_gpu_seconds") for m in gathered]
    if not all(hosts) or not all(gpus):
        return {"window_host_seconds": None, "window_gpu_seconds": None, "host_over_gpu": None, "host_bound": None}
    host, gpu = [max(w) for w in zip(*hosts)], [max(w) for w in zip(*gpus)]
    ratio = statistics.median(host) / statistics.median(gpu) if statistics.median(gpu) > 0 else None
    return {"window_host_seconds": host, "window_gpu_seconds": gpu, "host_over_gpu": ratio,
            "host_bound": None if ratio is None else ratio >= HOST_BOUND_RATIO}


CONFIG_NOT_COMPARED = ("timeout", "note")  # may differ between nodes without changing what is measured


def fingerprint(cfg: RunConfig, spec: dict) -> dict:
    """What must be the same on every rank: the hardware and software of its node and the benchmark config."""
    env = spec.get("env") or {}
    return {"host": socket.gethostname(),
            "gpu": [env.get("gpu_count"), env.get("gpu_names"), env.get("driver")],
            "software": [env.get(k) for k in ("torch", "cuda", "nccl", "cudnn")],
            "config": {k: v for k, v in cfg.to_dict().items() if k not in CONFIG_NOT_COMPARED}}


def first_difference(a: dict, b: dict, path: str = "") -> str | None:
    for key in a:
        if key == "host":
            continue
        x, y = a[key], b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            found = first_difference(x, y, f"{path}{key} ")
            if found:
                return found
        elif x != y:
            return f"{path}{key}: {y!r} vs {x!r} on rank 0"
    return None


def check_fingerprints(backend, cfg: RunConfig, spec: dict) -> list[str]:
    """All-gather every rank's fingerprint; refuse (one line, exit 4 on every rank) when one differs from rank
    0's, as PyTorch's own DDP benchmark does. Returns the host of each rank."""
    prints = backend.all_gather(fingerprint(cfg, spec))
    for rank, fp in enumerate(prints):
        diff = first_difference(prints[0], fp)
        if diff:
            print(f"{REFUSED_MARKER} rank {rank} on {fp['host']} differs from rank 0 on {prints[0]['host']} in "
                  f"{diff} (start every node with the same command and software)", file=sys.stderr, flush=True)
            backend.teardown()
            sys.exit(REFUSED_EXIT)
    return [fp["host"] for fp in prints]


def compute_only_reason(backend, cfg: RunConfig) -> str | None:
    """Why this run measures no compute-only reference, or None when it does."""
    if cfg.world_size == 1:
        return "world size 1: nothing to synchronise"
    if (cfg.options or {}).get("compile"):
        return "not with --compile (skipping the synchronisation would recompile inside the windows)"
    return backend.no_compute_only


def skips(scale_before: float | None, scale_after: float | None, count_before: int | None = None,
          count_after: int | None = None) -> int | None:
    """Optimizer steps skipped between two reads: the backend's own count where it keeps one
    (``Backend.skipped_steps``: DeepSpeed, whose scaler halves the scale only after 2 overflows in a row), else
    read off GradScaler's scale. Each GradScaler skip halves the scale (backoff 0.5); a growth doubles it, once
    per 2000 clean steps (growth_interval), so a growth inside the same window could hide one skip."""
    if scale_before is None or scale_after is None:
        return None
    if count_before is not None and count_after is not None:
        return count_after - count_before
    return max(0, round(math.log2(scale_before / scale_after)))

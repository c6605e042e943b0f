"""The one timed loop. Runs on every rank of every backend; rank 0 writes the run's single record.

    python -m bench.worker --spec SPEC.json              (under torchrun / horovodrun / directly)
    python -m bench.worker --spec SPEC.json --spawn N    (starts N ranks with torch.multiprocessing.spawn)

The harness (bench/launch.py) writes SPEC.json: the run config, its run_id, the results directory and the
environment metadata. Backends set up, step and tear down; everything timed or written happens here, so
every backend is measured by the same code.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import socket
import sys
import time

import torch

import backends
from bench import data, results, stats
from bench.config import RunConfig
from bench.energy import EnergyMeter, window_energy
from bench.evaluate import evaluate
from bench.faults import Fault

OOM_MARKER = "BENCH-OOM:"  # the harness looks for this line in a failed run's stderr
OOM_EXIT = 3
REFUSED_MARKER = "BENCH-REFUSED:"  # ranks that do not all run the same thing: one line saying where they differ
REFUSED_EXIT = 4


def run(spec: dict) -> None:
    cfg = RunConfig.from_dict(spec["config"])
    limit_memory(spec.get("memory_limit_gib"))
    fault = Fault.parse(os.environ.get("BENCH_FAULT"))
    # Each rank gets its share of the cores, whatever the launcher; oversubscribed threads measure contention.
    torch.set_num_threads(spec["threads_per_rank"])
    if cfg.device_type == "cuda":
        # On (the default, what users run): warm-up picks the fastest conv algorithms, as Horovod's benchmark
        # does. Off: a labelled variant, because DataParallel's replica threads may redo the search (README).
        torch.backends.cudnn.benchmark = bool(cfg.cudnn_benchmark)
    backend = backends.create(cfg.backend)
    backend.setup(cfg)
    hosts = check_fingerprints(backend, cfg, spec)  # before any timed work: every rank runs the same thing
    fault.install(backend)
    backend.batches = data.batches_for(cfg, backend)
    waited = getattr(backend.batches, "wait_seconds", None) is not None  # real data: time the input waits

    def sync():
        for d in backend.devices():
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    scale0, count0 = backend.loss_scale(), backend.skipped_steps()
    warmup_seconds = []  # each warm-up step on its own (synchronised, untimed): where compilation shows
    for _ in range(cfg.warmup):
        t0 = time.perf_counter()
        backend.train(1)
        sync()
        warmup_seconds.append(time.perf_counter() - t0)
    # Warm-up peaks hold one-time work (cuDNN's search workspaces, DDP's bucket rebuild, lazy init). Keep them
    # as their own fields, release the allocator's cached blocks, reset the peaks, and run one untimed settle
    # step that re-reserves what a steady step needs, so the windows neither pay for re-reserving nor see
    # warm-up's peaks.
    warmup_memory, warmup_rss = memory_stats(backend), host_peak_rss()
    reset_peaks(backend)
    backend.train(SETTLE_STEPS)
    sync()
    scale_after_warmup, count_after_warmup = backend.loss_scale(), backend.skipped_steps()
    meter = EnergyMeter(backend.devices())
    timed = windows(backend, cfg, sync, meter, waited)

    fault.after_training(backend)
    memory, host_rss = memory_stats(backend), host_peak_rss()  # before evaluation: the timed windows' peaks
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
            compute_only = windows(backend, cfg, sync, meter, waited)
    mine = {
        "rank": backend.rank,
        "window_seconds": timed["seconds"],
        "data_wait_seconds": timed["data_wait"] if waited else None,
        "corrupt_images_skipped": backend.batches.skipped if waited else None,
        "empty_classes": backend.batches.empty_classes if waited else None,
        "loader_info": backend.batches.info if waited else None,
        "memory": memory,
        "param_sha256": checksum,
        "eval": evaluated,
        "energy_joules": timed["energy"],  # per window: diagnostics only (bench/energy.py)
        "energy_span_joules": timed["energy_span"][0],  # first read before window 1 to last read after the last
        "energy_span_seconds": timed["energy_span"][1],
        "energy_reason": meter.reason,
        "compute_only_window_seconds": compute_only and compute_only["seconds"],
        "no_compute_only": no_compute_only,
        "compute_only_keeps": backend.compute_only_keeps,
        "host_peak_rss_bytes": host_rss,
        "warmup_host_peak_rss_bytes": warmup_rss,
        "skipped_steps": timed["skipped"] if scale0 is not None else None,
        "warmup_skipped_steps": skips(scale0, scale_after_warmup, count0, count_after_warmup)
        if scale0 is not None else None,
        "backend_info": backend.describe(),
        "loader_workers": getattr(backend, "loader_workers", None),
        "warmup_step_seconds": warmup_seconds,
    }
    gathered = backend.all_gather(mine)
    if backend.rank == 0:
        record = build_record(cfg, spec, gathered)
        record.update(hosts=hosts, launched_by=spec.get("launched_by"))
        results.save(record, spec["results_dir"])
    backend.barrier()  # nobody tears the process group down while rank 0 still needs it
    backend.teardown()


SETTLE_STEPS = 1  # untimed steps between the peak reset and the first window


def windows(backend, cfg: RunConfig, sync, meter, waited: bool) -> dict:
    """``cfg.windows`` timed windows of ``cfg.steps`` steps: barrier, synchronize, host reads (loss scale, energy),
    t0, the steps, synchronize, t1, host reads again. Nothing but the steps is inside the timed region."""
    out = {"seconds": [], "data_wait": [], "skipped": [], "energy": []}
    for i in range(cfg.windows):
        backend.barrier()  # start every window together; the barrier itself is not timed
        sync()
        scale, count, joules = backend.loss_scale(), backend.skipped_steps(), meter.read()
        if i == 0:  # energy over the whole span: NVML's counter is too coarse for one window (bench/energy.py)
            first_joules, e0 = joules, time.perf_counter()
        w0 = backend.batches.wait_seconds if waited else 0.0
        t0 = time.perf_counter()
        backend.train(cfg.steps)
        sync()
        out["seconds"].append(time.perf_counter() - t0)
        out["data_wait"].append(backend.batches.wait_seconds - w0 if waited else 0.0)
        out["skipped"].append(skips(scale, backend.loss_scale(), count, backend.skipped_steps()))
        last_joules = meter.read()
        out["energy"].append(window_energy(joules, last_joules))
    out["energy_span"] = (window_energy(first_joules, last_joules), time.perf_counter() - e0)
    return out


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


def build_record(cfg: RunConfig, spec: dict, per_rank: list[dict]) -> dict:
    record = results.skeleton(cfg.to_dict(), spec["run_id"], spec["env"])
    # The slowest rank sets the pace: a window lasts as long as its slowest rank.
    times = [max(ws) for ws in zip(*(r["window_seconds"] for r in per_rank))]
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
        throughput=thr,
        throughput_ci95=ci,
        per_device_throughput=thr / cfg.world_size,
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
        settle_steps=SETTLE_STEPS,
        warmup_step_seconds=warm,
        compile_seconds=compile_seconds(warm) if (cfg.options or {}).get("compile") and warm else None,
        backend_info=per_rank[0].get("backend_info"),
        **eval_fields(per_rank),
        **compute_only_fields(per_rank),
        **energy_fields(per_rank, times, global_batch * cfg.steps, global_batch * cfg.steps * len(times)),
        **flops_fields(cfg, memory, thr),
        loader_workers_per_process=per_rank[0].get("loader_workers"),  # DataLoader workers of each training process
        threads_per_rank=spec["threads_per_rank"],
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
    from bench import energy

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
    from bench import flops

    per_sample = cfg.flops_per_sample
    device = memory[0]["device_name"] if memory else None
    peak, source = flops.peak_tflops(device, cfg.precision, cfg.peak_tflops)
    return {"flops_per_sample": per_sample, "peak_tflops_per_device": peak, "peak_tflops_source": source,
            "mfu": flops.mfu(per_sample, throughput, peak, cfg.world_size)}


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


def memory_stats(backend) -> list[dict]:
    """Peak allocated/reserved since the last reset from the caching allocator for each CUDA device this rank
    drives, and NVML's used memory on that GPU (all processes, read now). Empty on CPU."""
    out = []
    for d in backend.devices():
        if d.type != "cuda":
            continue
        try:
            nvml_used = torch.cuda.device_memory_used(d)
        except Exception:  # no NVML bindings or driver support: leave it unmeasured rather than guess
            nvml_used = None
        out.append({
            "rank": backend.rank,
            "device_index": d.index,
            "device_name": torch.cuda.get_device_name(d),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(d),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(d),
            "nvml_used_bytes": nvml_used,
        })
    return out


def reset_peaks(backend) -> None:
    """Start the timed-window peaks afresh: the CUDA allocator's cached blocks go back to the driver (else
    peak reserved would keep warm-up's workspaces) and its peak counters restart; on the host, the kernel's
    peak-RSS mark (VmHWM) restarts at the current RSS."""
    for d in backend.devices():
        if d.type == "cuda":
            with torch.cuda.device(d):
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(d)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux >= 4.0: reset the peak resident set size to the current one
    except OSError:
        pass  # not Linux, or not allowed: the host peak then includes warm-up (host RSS is never gated)


def host_peak_rss() -> int:
    """Peak resident set size of this process in bytes since start or the last reset_peaks()."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def param_checksum(named_parameters) -> str:
    """SHA-256 over the bytes of every (full) parameter: equal on two ranks iff their replicas are bit-identical."""
    h = hashlib.sha256()
    for name, p in named_parameters:
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def limit_memory(gib: float | None) -> None:
    """--memory-limit-gib (CPU): this rank's heap may grow by ``gib`` beyond its size now (RLIMIT_DATA), the CPU
    stand-in for a GPU's memory; a larger allocation then fails as a GPU's would."""
    global _MEMORY_LIMIT
    if not gib:
        return
    _MEMORY_LIMIT = _data_bytes() + int(gib * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_DATA, (_MEMORY_LIMIT, _MEMORY_LIMIT))


_MEMORY_LIMIT: int | None = None  # bytes of RLIMIT_DATA, when --memory-limit-gib set one
# How the libraries under torch say that an allocation failed: torch's CPU allocator, oneDNN (which reports a
# scratchpad or workspace it could not allocate only as a primitive it could not create or execute), C++'s
# operator new, glibc. Under a heap budget any of them is the budget's doing.
ALLOCATION_FAILURES = ("can't allocate memory", "cannot allocate memory", "could not create a primitive",
                       "could not execute a primitive", "bad_alloc", "out of memory", "failed to allocate")
# ... and so is any other error raised while the heap is this close to the budget (the failing frames still hold
# what they had allocated when the handler looks).
NEAR_BUDGET = 0.9


def _data_bytes() -> int:
    """This process's data segment (what RLIMIT_DATA limits), from /proc/self/status."""
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


def _is_oom(e: BaseException) -> bool:
    """Out of memory: torch's own out-of-memory errors anywhere; under a heap budget, also an allocation failure
    whichever library reports it, or any failure once the heap has reached the budget."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e):
        return True
    if _MEMORY_LIMIT is None:
        return False
    text = str(e).lower()
    return any(s in text for s in ALLOCATION_FAILURES) or _data_bytes() >= NEAR_BUDGET * _MEMORY_LIMIT


def _spawned(index: int, spec: dict, nprocs: int) -> None:
    # torch.multiprocessing.spawn passes the index; give DDP the same environment torchrun would.
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["master_port"]))
    _guarded(spec)


def _guarded(spec: dict) -> None:
    try:
        if spec.get("task") == "verify":
            from bench import verify_worker

            verify_worker.run_rank(spec)
        elif spec.get("task") == "collectives":
            from bench import collectives

            collectives.run_rank(spec)
        else:
            run(spec)
    except Exception as e:  # noqa: BLE001 - only out-of-memory is handled here; anything else propagates
        if not _is_oom(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        print(f"{OOM_MARKER} {first}", file=sys.stderr, flush=True)
        os._exit(OOM_EXIT)  # exit at once: other ranks are waiting on a collective that will never come


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.worker")
    p.add_argument("--spec", required=True)
    p.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    args = p.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(spec, args.spawn), nprocs=args.spawn, join=True)
    else:
        _guarded(spec)


if __name__ == "__main__":
    main()

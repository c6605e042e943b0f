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
import os
import resource
import sys
import time

import torch

import backends
from bench import data, results, stats
from bench.config import RunConfig
from bench.faults import Fault

OOM_MARKER = "BENCH-OOM:"  # the harness looks for this line in a failed run's stderr
OOM_EXIT = 3


def run(spec: dict) -> None:
    cfg = RunConfig.from_dict(spec["config"])
    fault = Fault.parse(os.environ.get("BENCH_FAULT"))
    # Each rank gets its share of the cores, whatever the launcher; oversubscribed threads measure contention.
    torch.set_num_threads(spec["threads_per_rank"])
    if cfg.device_type == "cuda":
        torch.backends.cudnn.benchmark = True  # pick the fastest conv algorithms during warm-up, as Horovod's benchmark does
    backend = backends.create(cfg.backend)
    backend.setup(cfg)
    backend.batches = data.batches_for(cfg, backend)
    waited = getattr(backend.batches, "wait_seconds", None) is not None  # real data: time the input waits
    fault.install(backend)

    def sync():
        for d in backend.devices():
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    backend.train(cfg.warmup)
    sync()
    window_seconds, data_wait = [], []
    for _ in range(cfg.windows):
        backend.barrier()  # start every window together; the barrier itself is not timed
        sync()
        w0 = backend.batches.wait_seconds if waited else 0.0
        t0 = time.perf_counter()
        backend.train(cfg.steps)
        sync()
        window_seconds.append(time.perf_counter() - t0)
        data_wait.append(backend.batches.wait_seconds - w0 if waited else 0.0)

    fault.after_training(backend)
    mine = {
        "rank": backend.rank,
        "window_seconds": window_seconds,
        "data_wait_seconds": data_wait if waited else None,
        "corrupt_images_skipped": backend.batches.skipped if waited else None,
        "memory": memory_stats(backend),
        "param_sha256": param_checksum(backend.module),
        "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    gathered = backend.all_gather(mine)
    if backend.rank == 0:
        record = build_record(cfg, spec, gathered)
        results.save(record, spec["results_dir"])
    backend.barrier()  # nobody tears the process group down while rank 0 still needs it
    backend.teardown()


def build_record(cfg: RunConfig, spec: dict, per_rank: list[dict]) -> dict:
    record = results.skeleton(cfg.to_dict(), spec["run_id"], spec["env"])
    # The slowest rank sets the pace: a window lasts as long as its slowest rank.
    windows = [max(ws) for ws in zip(*(r["window_seconds"] for r in per_rank))]
    global_batch = cfg.global_batch
    thr, ci = stats.median_ci95(stats.window_throughputs(windows, global_batch * cfg.steps))
    waits = [r["data_wait_seconds"] for r in per_rank]
    memory = sorted((m for r in per_rank for m in r["memory"]), key=lambda m: m["device_index"])
    checksums = {r["param_sha256"] for r in per_rank}
    record.update(
        status="ok",
        window_seconds=windows,
        throughput=thr,
        throughput_ci95=ci,
        per_device_throughput=thr / cfg.world_size,
        memory=memory,
        memory_imbalance=stats.imbalance([m["peak_reserved_bytes"] for m in memory]),
        replicas_consistent=(len(checksums) == 1) if len(per_rank) > 1 else None,
        data_wait_seconds=[max(w) for w in zip(*waits)] if waits[0] is not None else None,
        corrupt_images_skipped=sum(r["corrupt_images_skipped"] for r in per_rank) if waits[0] is not None else None,
        host_peak_rss_bytes=[r["host_peak_rss_bytes"] for r in per_rank],
        threads_per_rank=spec["threads_per_rank"],
        cudnn_benchmark=torch.backends.cudnn.benchmark if cfg.device_type == "cuda" else None,
        finished_at=results.utc_now(),
    )
    return record


def memory_stats(backend) -> list[dict]:
    """Peak allocated/reserved from the caching allocator for each CUDA device this rank drives, and NVML's
    used memory on that GPU (all processes, read after the timed windows). Empty on CPU."""
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


def param_checksum(module: torch.nn.Module) -> str:
    """SHA-256 over the bytes of every parameter: equal on two ranks iff their replicas are bit-identical."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _spawned(index: int, spec: dict, nprocs: int) -> None:
    # torch.multiprocessing.spawn passes the index; give DDP the same environment torchrun would.
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["master_port"]))
    _guarded(spec)


def _guarded(spec: dict) -> None:
    try:
        run(spec)
    except torch.cuda.OutOfMemoryError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "CUDA out of memory"
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

"""The collectives task of a rank (``bench collectives``): every rank times the same operations on the same message
sizes, as nccl-tests does; rank 0 writes the record. The command's half, which plans the sizes and launches the
ranks, is bench/commands/collectives.py."""
from __future__ import annotations

import time
from pathlib import Path

from bench.core.comm import BUS_FACTOR, COLLECTIVES_SCHEMA
from bench.core.config import RunConfig
from bench.core.results import utc_now, write_json_atomic
from bench.rank import startup


def run_rank(spec: dict) -> None:
    import torch

    import backends

    cfg, c = RunConfig.from_dict(spec["config"]), spec["collectives"]
    torch.set_num_threads(spec["threads_per_rank"])
    backend = backends.create(cfg.backend)
    if cfg.backend == "horovod":
        import horovod.torch as hvd

        hvd.init()
        backend.hvd, backend.rank, backend.world_size = hvd, hvd.rank(), hvd.size()
        device = _device(cfg, hvd.local_rank())
    else:
        backend.init_process_group(cfg)
        device = backend.device
    n, rows = backend.world_size, []
    # Every rank must run the same collectives in the same order, so the sizes are agreed before the sweep: the
    # smallest free memory of any rank decides for all (each rank deciding alone hangs when GPUs differ).
    free = min(backend.all_gather(_free_bytes(device)))
    left_out = [(op, size) for op in c["ops"] for size in c["sizes"] if _needs(op, size, n) > free]
    startup.done()  # the collector back on before the first timed collective (bench/rank/startup.py)
    for op in c["ops"]:
        for size in c["sizes"]:
            if (op, size) in left_out:
                continue  # a message that does not fit the tightest rank's memory is measured by none
            seconds = _time(op, size, n, device, backend, c["warmup"], c["iters"])
            t = max(backend.all_gather(seconds))  # the slowest rank's time per operation
            algbw = size / t / 1e9
            rows.append({"op": op, "bytes": size, "seconds": t, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * BUS_FACTOR[op](n)})
    if backend.rank == 0:
        record = {"schema": COLLECTIVES_SCHEMA, "kind": "collectives", "run_id": spec["run_id"], "status": "ok",
                  "reason": None, "launcher": cfg.launcher, "backend": cfg.backend, "world_size": n,
                  "device_type": cfg.device_type, "process_group": _group_name(cfg, backend), "iters": c["iters"],
                  "warmup": c["warmup"], "timing": TIMING, "free_bytes_min": free,
                  "left_out": [{"op": op, "bytes": size} for op, size in left_out], "results": rows, "env": spec["env"],
                  "finished_at": utc_now()}
        write_json_atomic(record, Path(spec["results_dir"]) / f"{spec['run_id']}.json")
    backend.barrier()
    backend.teardown()


def _device(cfg, local_rank):
    import torch

    from bench.core import cuda

    if cfg.device_type == "cuda":
        cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _group_name(cfg, backend) -> str:
    if cfg.backend == "horovod":
        return "horovod-" + ("nccl" if cfg.device_type == "cuda" else "gloo")
    import torch.distributed as dist

    return dist.get_backend()


def _free_bytes(device) -> int:
    import psutil

    from bench.core import cuda

    if device.type == "cuda":
        return cuda.free_bytes(device) // 2
    return psutil.virtual_memory().available // 4  # every rank of this host shares it


def _needs(op: str, size: int, n: int) -> int:
    return size * (2 if op in ("all_reduce", "broadcast", "horovod_allreduce") else 1 + 1 / n) + size


TIMING = ("nccl-tests: warm-up, sync + barrier, iters back-to-back operations, one sync; time / iters (horovod_allreduce: "
          "iters allreduce_async_ handles enqueued back to back, all synchronized at the end)")


def _time(op, size, n, device, backend, warmup, iters) -> float:
    """Seconds per ``op`` on a message of ``size`` bytes (fp32 elements) on this rank, timed as nccl-tests does."""
    import torch
    import torch.distributed as dist

    from bench.core import cuda

    elems = max(n, size // 4) // n * n  # divisible by n, for reduce_scatter and all_gather
    pending: list = []  # Horovod's handles not yet waited for

    def sync():
        for handle in pending:
            backend.hvd.synchronize(handle)
        pending.clear()
        if device.type == "cuda":
            cuda.synchronize(device)

    if op == "horovod_allreduce":
        # allreduce_ is allreduce_async_ and a wait: one call at a time would time Horovod with a host round trip per
        # operation, where NCCL's are queued back to back. The handles are enqueued back to back and waited for by
        # sync(), as nccl-tests queues NCCL's (Horovod's background thread may fuse them, as it fuses a step's
        # gradients: that is how Horovod runs).
        x = torch.zeros(elems, device=device)  # zeros: back-to-back sums stay finite
        call = lambda: pending.append(backend.hvd.allreduce_async_(x, op=backend.hvd.Sum))  # noqa: E731
    elif op in ("all_reduce", "broadcast"):
        x = torch.zeros(elems, device=device)
        call = {"all_reduce": lambda: dist.all_reduce(x), "broadcast": lambda: dist.broadcast(x, src=0)}[op]
    elif op == "reduce_scatter":
        x, y = torch.ones(elems, device=device), torch.empty(elems // n, device=device)
        call = lambda: dist.reduce_scatter_tensor(y, x)  # noqa: E731
    else:
        x, y = torch.ones(elems // n, device=device), torch.empty(elems, device=device)
        call = lambda: dist.all_gather_into_tensor(y, x)  # noqa: E731
    return time_block(call, sync, backend.barrier, warmup, iters)


def time_block(call, sync, barrier, warmup: int, iters: int, clock=time.perf_counter) -> float:
    """nccl-tests' loop (src/common.cu, ``BenchTime``): ``warmup`` untimed calls, synchronize, barrier (every
    rank starts together), then ``iters`` calls back to back between two clock reads, the second after one
    synchronize; seconds per call. The operations queue on the device (NCCL's stream) without a host round
    trip between them, so a sample holds no per-operation launch, synchronize or barrier skew. No synchronize is
    needed after the barrier: ProcessGroupNCCL's barrier blocks the host until its collective completes (torch
    distributed_c10d.py, ``barrier``'s note)."""
    for _ in range(warmup):
        call()
    sync()
    barrier()
    t0 = clock()
    for _ in range(iters):
        call()
    sync()
    return (clock() - t0) / iters

"""A small GPU trace in the format torch.profiler (Kineto) exports on a CUDA machine, with known answers, for testing
the GPU path of bench/core/traces.py (Holistic Trace Analysis) on machines without a GPU. Per rank: three ``bench
step`` ranges 1.1 ms apart with the harness's phases, and per step, on the compute stream (7) a host-to-device copy
and the forward, backward and optimizer kernels, and on NCCL's stream (13) one all-reduce kernel that starts during
backward and ends after it; each kernel has its launch (cuda_runtime) and its operator (cpu_op), linked by the
correlation id as in a real trace. Rank r's all-reduce starts 50*r us later.

Per step, rank r (us): copy [0, 50], forward [50, 450], backward [450, 850], all-reduce [650 + 50r, 950],
optimizer [950, 1000]. So the all-reduce takes 300 - 50r, of which 200 - 50r overlaps backward and 100 runs alone.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

STEPS, PERIOD = 3, 1100
COMPUTE, NCCL = 7, 13
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def expected(rank: int) -> dict:
    """What traces.gpu_analysis must find on rank ``rank``, ms per step."""
    comm = (300 - 50 * rank) / 1e3
    span = (STEPS - 1) * PERIOD + 1000
    return {"comm_ms": comm, "exposed_comm_ms": 0.1, "overlap_pct": round(100 * (comm - 0.1) / comm, 2),
            "compute_ms": 0.85, "memory_ms": 0.05, "idle_ms": (STEPS - 1) * 100 / 1e3 / STEPS,
            "idle_pct": round(100 * (STEPS - 1) * 100 / span, 2), "busiest_stream": COMPUTE}


def trace(rank: int, world: int = 2) -> dict:
    pid = 4000 + rank
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
              {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]

    def x(cat, name, ts, dur, p=pid, t=pid, **args):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": ts, "dur": dur, "args": args})

    corr = 100
    for step in range(STEPS):
        t0 = 1_000_000 + step * PERIOD
        x("user_annotation", "bench step", t0, 1000)
        for phase, start, length in (("data", 0, 50), ("forward", 50, 400), ("backward", 450, 400),
                                     ("optimizer", 900, 100)):
            x("user_annotation", phase, t0 + start, length)
        kernels = [("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 50, COMPUTE),
                   ("kernel", "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_forward", 50, 400, COMPUTE),
                   ("kernel", "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize128x128x32_backward", 450, 400, COMPUTE),
                   ("kernel", ALLREDUCE, 650 + 50 * rank, 300 - 50 * rank, NCCL),
                   ("kernel", "void at::native::multi_tensor_apply_kernel<Adam>", 950, 50, COMPUTE)]
        for cat, name, start, length, stream in kernels:
            launch = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
            x("cpu_op", "aten::copy_" if cat == "gpu_memcpy" else "aten::op", t0 + start - 12, 6,
              **{"External id": corr, "Record function id": 0})
            x("cuda_runtime", launch, t0 + start - 9, 5, correlation=corr, **{"External id": corr})
            x(cat, name, t0 + start, length, p=0, t=stream, device=0, stream=stream, correlation=corr,
              **{"External id": corr})
            corr += 1
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                                      "totalGlobalMem": 85045395456, "computeMajor": 9}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": events, "traceName": f"rank{rank}", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def write(directory: Path, world: int = 2) -> list[Path]:
    """One gzip-compressed trace per rank, named as bench run --trace names them."""
    paths = []
    for rank in range(world):
        path = Path(directory) / f"gpu.rank{rank}.trace.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(trace(rank, world), f)
        paths.append(path)
    return paths

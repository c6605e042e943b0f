"""Out of memory however the library under torch says it: cuBLAS, the CUDA runtime
(torch.AcceleratorError), cuDNN and NCCL raise their own exceptions, not torch.OutOfMemoryError. A rank must still
stop with the out-of-memory line, and --find-max-batch must record "out of memory" and search on. The messages are
the libraries' own (bench/core/markers.py says where each is written); generic errors must stay errors."""
import json

import pytest
import torch
import torch.distributed as dist

from bench.core.config import RunConfig
from bench.core.markers import OOM_MARKER
from bench.launch.diagnose import failure_reason
from bench.rank import entry, faults, memory
from tests.conftest import TINY, bench_inproc

# (message, exception type) as each library raises it; the type is torch's mapping to Python.
OUT_OF_MEMORY = [
    # c10/cuda/CUDAException.cpp, torch 2.15: cudaErrorMemoryAllocation -> torch.AcceleratorError
    ("CUDA error: out of memory\nFor more detailed error information, run with CUDA_LAUNCH_BLOCKING=1.\n"
     "Device-side assertions were explicitly omitted for this error check; the error probably arose while "
     "initializing the DSA handlers.", torch.AcceleratorError),
    # the same through an older torch: a RuntimeError
    ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
     "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1", RuntimeError),
    ("CUDA driver error: out of memory", RuntimeError),  # C10_CUDA_DRIVER_CHECK
    # ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK at cuBLAS's first use (CublasHandlePool.cpp), and cuBLASLt's
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", RuntimeError),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, computeDesc.descriptor(), "
     "&alpha_val, mat1_ptr, Adesc.descriptor(), ...)`", RuntimeError),
    ("cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`", RuntimeError),
    # AT_CUDNN_CHECK: cuDNN 8's status, cuDNN 9's host and device ones (cudnn_graph.h)
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", RuntimeError),
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", RuntimeError),
    ("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", RuntimeError),
    # torch's cuDNN attention (aten/src/ATen/native/cudnn/MHA.cpp)
    ('cuDNN SDPA execution failed with error code ["CUDNN_BACKEND_API_FAILED"]: err 2 != CUDA_SUCCESS\n'
     "CUDA ran out of memory outside PyTorch's allocator. If this workload uses many dynamic shapes, cuDNN may need "
     "additional device memory to JIT-compile shape-specialized kernels.", RuntimeError),
    # C10D_NCCL_CHECK with NCCL's last error: CUDACHECK, CUCHECK, ncclCudaCalloc (src/include/checks.h, alloc.h)
    ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with "
     "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
     "Last error:\nCuda failure 'out of memory'", dist.DistBackendError),
    ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
     "NCCL_DEBUG=INFO for details), NCCL version 2.30.7\nncclUnhandledCudaError: Call to CUDA function failed.\n"
     "Last error:\nCuda failure 2 'out of memory'", dist.DistBackendError),
    ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system error (run with "
     "NCCL_DEBUG=INFO for details), NCCL version 2.30.7\nncclSystemError: System call (e.g. socket, malloc) or "
     "external library call failed or device error. \nLast error:\nFailed to CUDA calloc 6291456 bytes",
     dist.DistBackendError),
    # the caching allocator's message re-raised by a library as a plain RuntimeError
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB", RuntimeError),
]

NOT_OUT_OF_MEMORY = [
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: device-side assert triggered",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, "
    "lda, b, ldb, &beta, c, ldc)`",
    # cuBLAS's "not initialized" can follow an out-of-memory, but also a broken driver: not counted
    "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
    # a peer that died, as NCCL and torch say it: no allocation failed, though the text says "malloc"
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.30.7\nncclSystemError: System call (e.g. socket, malloc) or "
    "external library call failed or device error. \nLast error:\nsocketProgress: Connection closed by remote peer "
    "node2<45678>",
    "NCCL error: remote process exited or there was a network error, NCCL version 2.30.7\nncclRemoteError: A call "
    "failed possibly due to a network error or a remote process exiting prematurely.",
    "NCCL error in: x.cpp:1, unhandled cuda error, NCCL version 2.30.7\nncclUnhandledCudaError: Call to CUDA "
    "function failed.\nLast error:\nCuda failure 'an illegal memory access was encountered'",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600000 "
    "milliseconds before timing out.",
    "out of memory",  # a generic message, from no library: an error, as before
    "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)",
]


@pytest.mark.parametrize("message,cls", OUT_OF_MEMORY)
def test_each_library_s_out_of_memory_is_out_of_memory(monkeypatch, message, cls):
    monkeypatch.setattr(memory, "_MEMORY_LIMIT", None)  # no heap budget: only the message can say so
    assert memory.is_oom(cls(message)), message


@pytest.mark.parametrize("message", NOT_OUT_OF_MEMORY)
def test_other_errors_stay_errors(monkeypatch, message):
    monkeypatch.setattr(memory, "_MEMORY_LIMIT", None)
    for cls in (RuntimeError, torch.AcceleratorError, dist.DistBackendError):
        assert not memory.is_oom(cls(message)), message


def test_the_injected_kinds_are_the_libraries_own_exceptions():
    """BENCH_FAULT's oom-* raise what the library would: type and message (the real runs below use them)."""
    errors = {kind: faults.oom_error(kind) for kind in faults.OOM_ERRORS}
    assert type(errors["oom-cuda"]) is torch.AcceleratorError
    assert type(errors["oom-nccl"]) is dist.DistBackendError
    assert type(errors["oom-cublas"]) is RuntimeError and type(errors["oom-cudnn"]) is RuntimeError
    for kind, e in errors.items():
        assert not isinstance(e, torch.OutOfMemoryError) and memory.is_oom(e), kind
    # the marked line: the first line, and the one that says so where the first does not (NCCL's last error)
    assert entry.oom_line(errors["oom-cublas"]) == ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                                    "`cublasCreate(handle)`")
    assert entry.oom_line(errors["oom-nccl"]) == (
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.30.7 (Cuda failure 2 'out of memory')")


CFG = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="resnet50",
                image_size=224, batch_size=256, warmup=1, steps=1, windows=1)


def test_an_out_of_memory_that_no_rank_could_mark_is_still_found_in_the_output():
    """NCCL's watchdog thread takes the process down with its error (TORCH_NCCL_ASYNC_ERROR_HANDLING 1 or 3): no
    Python exception, no marked line; the harness still reads what failed."""
    output = ("[rank1]: terminate called after throwing an instance of 'c10::DistBackendError'\n"
              "[rank1]:   what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated "
              "with exception: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
              "2.30.7\n[rank1]: ncclUnhandledCudaError: Call to CUDA function failed.\n[rank1]: Last error:\n"
              "[rank1]: Cuda failure 2 'out of memory'\n"
              "E0101 torch/distributed/elastic/multiprocessing/api.py: failed (exitcode: -6) local_rank: 1\n")
    assert failure_reason(CFG, output, 1, False, 100.0, "run.log") == (
        "out of memory: batch 256 per device (512 global), resnet50 at 224px, fp32: Cuda failure 2 'out of memory'")
    # a peer that died is no out of memory, nor is a marked line missing for another reason
    died = output.replace("Cuda failure 2 'out of memory'", "socketProgress: Connection closed by remote peer n2")
    assert not failure_reason(CFG, died, 1, False, 100.0, "run.log").startswith("out of memory")


@pytest.mark.slow
def test_find_max_batch_records_each_library_s_out_of_memory_and_searches_on(tmp_path):
    """One --find-max-batch sweep, one backend per kind (each on its own launcher), every probe out of memory:
    from batch 1 nothing fits, which is a result ("not even batch 1 fits"), not an error that stops the search."""
    kinds = {"single": "oom-cublas", "ddp_spawn": "oom-cuda", "ddp": "oom-cudnn", "allreduce_manual": "oom-nccl"}
    fault = ",".join(f"{backend}/{kind}" for backend, kind in kinds.items())
    args = list(TINY)
    args[args.index("--batch-size") + 1] = "1"
    proc = bench_inproc("run", "--backends", ",".join(kinds), "--gpus", 1, *args, "--find-max-batch",
                        "--max-batch", 8, "--results", tmp_path, env={"BENCH_FAULT": fault})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [summary] = (tmp_path / "maxbatch").glob("summary-*.json")
    rows = {row["backend"]: row for row in json.loads(summary.read_text())["rows"]}
    assert set(rows) == set(kinds)
    first_line = {kind: faults.OOM_ERRORS[kind][1].splitlines()[0] for kind in faults.OOM_ERRORS}
    for backend, kind in kinds.items():
        row = rows[backend]
        assert (row["max_batch"], row["error"], row["capped"]) == (None, None, False), (backend, row)
        [probe] = row["probes"]
        assert (probe["batch"], probe["result"]) == (1, "out of memory"), (backend, probe)
        assert probe["reason"].startswith("out of memory: batch 1 per device (1 global), cnn-tiny at 32px, fp32: "
                                          + first_line[kind]), (backend, probe["reason"])
    assert "Cuda failure 2 'out of memory'" in rows["allreduce_manual"]["probes"][0]["reason"]
    assert proc.stdout.count("max batch per device: not even batch 1 fits") == 4
    log = "".join(p.read_text() for p in (tmp_path / "maxbatch" / "logs").glob("*.log"))
    assert all(f"{OOM_MARKER} {first_line[kind]}" in log for kind in kinds.values())

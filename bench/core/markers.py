"""What rank processes and launchers say to each other besides the spec file: the entry point a launcher starts,
the lines a rank prints when it stops on purpose, their exit codes, the tag every process of a run carries, how the
libraries under torch say "out of memory" (a rank and the harness both read it), and NCCL's error-handling mode."""

import re

RANK_ENTRY = "bench.rank"  # python -m bench.rank --spec SPEC.json [--spawn N]: what every launcher starts

OOM_MARKER = "BENCH-OOM:"  # the harness looks for this line in a failed run's output
OOM_EXIT = 3
REFUSED_MARKER = "BENCH-REFUSED:"  # ranks that do not all run the same thing: one line saying where they differ
REFUSED_EXIT = 4

RUN_TAG = "BENCH_RUN_ID"  # in the environment of every process of a run: how the harness finds them all

PEER_LOST_MARKER = "BENCH-PEER-LOST:"  # several nodes: a node stopped answering; JSON naming it follows the marker
PEER_LOST_EXIT = 5

# A rank could not write a result file for want of room (bench/core/errors.py DISK_FULL): JSON with the errno and the
# file follows the marker, and the harness stops as if its own write had failed (one line, no record written)
DISK_FULL_MARKER = "BENCH-DISK-FULL:"
DISK_FULL_EXIT = 6

# "PID:START" of the harness process that started this run (START: its creation time, as psutil reports it, so a
# reused pid is never mistaken for it). Every rank watches that process and exits when it is gone, so a harness
# killed with SIGKILL (an OOM killer, a CI runner's hard cancel) leaves no rank holding a GPU.
HARNESS_ENV = "BENCH_HARNESS"

# -- out of memory, as the libraries under torch say it ------------------------------------------------------------
# torch.OutOfMemoryError is only the caching allocator's own refusal. A device allocation that fails anywhere else
# arrives as another exception, and its message is the only sign. Each pattern below is copied from the source that
# writes it, so a generic error never reads as out of memory:
_OOM_PATTERNS = (
    # the caching allocator's own message, when a library re-raises it as a plain RuntimeError
    r"\b(?:CUDA|HIP) out of memory\. Tried to allocate",
    # cudaErrorMemoryAllocation through C10_CUDA_CHECK (c10/cuda/CUDAException.cpp): torch.AcceleratorError in recent
    # torch (2.15 here), a RuntimeError in older; CUDA_ERROR_OUT_OF_MEMORY through C10_CUDA_DRIVER_CHECK (driver_api.h)
    r"\b(?:CUDA|HIP) error: out of memory\b",
    r"\bCUDA driver error: out of memory\b",
    # TORCH_CUDABLAS_CHECK and its siblings (ATen/cuda/Exceptions.h): "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when
    # calling `cublasCreate(handle)`"
    r"\bCU(?:BLAS|SOLVER|SPARSE)_STATUS_ALLOC_FAILED\b",
    r"\bCUFFT_ALLOC_FAILED\b",
    # AT_CUDNN_CHECK's "cuDNN error: " + cudnnGetErrorString: cuDNN 8's name, and cuDNN 9's two (cudnn_graph.h)
    r"\bCUDNN_STATUS_(?:ALLOC_FAILED|INTERNAL_ERROR_(?:HOST|DEVICE)_ALLOCATION_FAILED)\b",
    # torch's cuDNN attention, when cuDNN's own allocation failed (aten/src/ATen/native/cudnn/MHA.cpp)
    r"CUDA ran out of memory outside PyTorch's allocator",
    # NCCL's last error, which torch appends to every NCCL error ("Last error:\n..."; torch/csrc/distributed/c10d/
    # NCCLUtils.cpp): CUDACHECK / CUCHECK (src/include/checks.h, cudawrap.h), ncclCudaMalloc/Calloc/HostCalloc and
    # ncclCalloc (src/include/alloc.h)
    r"\bCuda failure (?:\d+ )?'out of memory'",
    r"\bFailed to (?:CUDA )?(?:malloc|calloc|calloc async|host alloc) \d+ bytes",
)
OOM_MESSAGE = re.compile("|".join(_OOM_PATTERNS))


def oom_evidence(text: str) -> str | None:
    """The first line of ``text`` in which a library says that an allocation failed (the patterns above), or None."""
    m = OOM_MESSAGE.search(text)
    if m is None:
        return None
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start:end if end >= 0 else len(text)].strip()


# -- NCCL's watchdog and a dead peer -------------------------------------------------------------------------------
# On an asynchronous NCCL error (a peer that died, a timeout), ProcessGroupNCCL's watchdog thread acts as
# TORCH_NCCL_ASYNC_ERROR_HANDLING says (ErrorHandlingMode in torch 2.15's ProcessGroupNCCL.hpp, and in pytorch's
# main; 2.11's own source was not at hand): 0 nothing, 1 abort the communicators and take the process down, 2 abort
# the communicators only, 3 (the default) take the process down without aborting them. "Take down" is the error
# rethrown in the watchdog thread: std::terminate, SIGABRT, and no Python exception ever reaches the rank, so the
# rank cannot wait for the lifeline to name the node that died. (pytorch's main first sleeps 4 x
# TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC, 60 s by default, for the flight recorder; a release or a setting without that
# sleep aborts within seconds of NCCL noticing, before a 15 s silence names anyone.) Ranks run with 2 unless the
# user chose a value: the process lives, and the error is raised in the rank's own thread when it next waits on that
# collective (WorkNCCL::wait), where it waits for the verdict (bench/rank/lifeline.py). The record's env says which.
NCCL_ERROR_HANDLING_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")  # torch reads both, in order
NCCL_ERROR_HANDLING = "2"

"""Memory on a rank: the caching allocator's peaks (and NVML's view of the GPU) per device, the host's peak resident
set, their reset after warm-up, and the CPU heap budget (--memory-limit-gib) under which an allocation failure is
out of memory whichever library reports it."""
from __future__ import annotations

import resource

import torch

from bench.core import cuda, nvml
from bench.core.markers import oom_evidence


def memory_stats(backend) -> list[dict]:
    """Peak allocated/reserved since the last reset from the caching allocator for each CUDA device this rank
    drives, and NVML's used memory on that GPU (all processes, read now; ``nvml_used_reason`` says why not when it
    could not be read). Empty on CPU."""
    out = []
    for d in backend.devices():
        if d.type != "cuda":
            continue
        used, why = nvml_used_bytes(d)
        out.append({
            "rank": backend.rank,
            "device_index": d.index,
            "device_name": cuda.name(d),
            "peak_allocated_bytes": cuda.peak_allocated_bytes(d),
            "peak_reserved_bytes": cuda.peak_reserved_bytes(d),
            "nvml_used_bytes": used,
            "nvml_used_reason": why,
        })
    return out


def nvml_used_bytes(device) -> tuple[int | None, str | None]:
    """(bytes in use on the whole GPU of a CUDA device, None) from NVML, or (None, why it could not be read)."""
    try:
        index = cuda.nvml_index(device.index)
        with nvml.open() as n:
            return n.memory_used(index), None
    except nvml.Unavailable as e:
        return None, str(e)
    except RuntimeError as e:  # torch's own: the CUDA device's NVML index could not be read
        return None, f"NVML index of cuda:{device.index} unknown: {e}"


def reset_peaks(backend) -> None:
    """Start the timed-window peaks afresh: the CUDA allocator's cached blocks go back to the driver (else
    peak reserved would keep warm-up's workspaces) and its peak counters restart; on the host, the kernel's
    peak-RSS mark (VmHWM) restarts at the current RSS."""
    for d in backend.devices():
        if d.type == "cuda":
            cuda.reset_peaks(d)
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


def is_oom(e: BaseException) -> bool:
    """Out of memory: torch's own out-of-memory errors anywhere, and a device allocation that failed in a library
    under torch (cuBLAS, cuDNN, the CUDA runtime, NCCL: bench/core/markers.py says which messages, from their
    sources); under a heap budget, also an allocation failure whichever library reports it, or any failure once the
    heap has reached the budget."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e) \
            or oom_evidence(str(e)) is not None:
        return True
    if _MEMORY_LIMIT is None:
        return False
    text = str(e).lower()
    return any(s in text for s in ALLOCATION_FAILURES) or _data_bytes() >= NEAR_BUDGET * _MEMORY_LIMIT

"""torch.cuda's answers about the GPUs, and the only module that asks them: whether there are any and how many, a
device's name and NVML index, the caching allocator's peaks and free memory, the current device, synchronisation,
timing events, the TF32 and cuDNN switches, and the CUDA, NCCL and cuDNN versions. The kernels themselves (a
model's forward and backward, a collective) run where they are; everything that asks the device a question goes
through here.

Nothing here creates a CUDA context except the calls that need one on the device (``set_device``, the allocator's
figures, ``free_bytes``, ``synchronize``, ``timing_event``). The tests replace these functions with a fake GPU
machine (tests/fake_gpu.py), so the harness's GPU side (planning, the machine watch, launch commands, the doctor's
table, the memory, energy and peak readers) runs in ``make test`` on a machine with none. Call them through the
module (``cuda.name(d)``), never ``from bench.core.cuda import name``: the fake replaces the module's attributes.
"""
from __future__ import annotations

import torch


def available() -> bool:
    """Whether a CUDA device is usable (creates no context)."""
    return torch.cuda.is_available()


def count() -> int:
    """CUDA devices this process sees (CUDA_VISIBLE_DEVICES honoured; creates no context)."""
    return torch.cuda.device_count()


def name(device) -> str:
    return torch.cuda.get_device_name(device)


def nvml_index(device) -> int:
    """NVML's index of a CUDA device (CUDA_VISIBLE_DEVICES may reorder or hide GPUs, by index or UUID), without a
    CUDA context. Raises RuntimeError (torch's own) when the mapping cannot be read."""
    index = torch.device(device).index if isinstance(device, torch.device) else device
    helper = getattr(torch.cuda, "_get_nvml_device_index", None)  # private: in torch since 2.0
    if helper is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda._get_nvml_device_index")
    return helper(index or 0)


def set_device(device) -> None:
    """The current device of this process (an index or a torch.device)."""
    torch.cuda.set_device(device)


def synchronize(device) -> None:
    torch.cuda.synchronize(device)


def peak_allocated_bytes(device) -> int:
    return torch.cuda.max_memory_allocated(device)


def peak_reserved_bytes(device) -> int:
    return torch.cuda.max_memory_reserved(device)


def reset_peaks(device) -> None:
    """Return the allocator's cached blocks to the driver (else peak reserved keeps what came before) and restart
    its peak counters."""
    with torch.cuda.device(device):
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def free_bytes(device) -> int:
    """Free memory on the device now (cudaMemGetInfo), every process's use counted."""
    return torch.cuda.mem_get_info(device)[0]


def timing_event():
    """A CUDA event that records GPU time (``record()``, ``synchronize()``, ``elapsed_time(other)`` in ms)."""
    return torch.cuda.Event(enable_timing=True)


def tf32() -> dict:
    """Whether fp32 runs on TF32 tensor cores: cuDNN's flag (convolutions) and the matmul flag."""
    return {"cudnn": bool(torch.backends.cudnn.allow_tf32), "matmul": bool(torch.backends.cuda.matmul.allow_tf32)}


def set_matmul_tf32(on: bool) -> bool:
    """Set the matmul TF32 flag; returns what it was."""
    before = bool(torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(on)
    return before


def set_cudnn(benchmark: bool, deterministic: bool | None = None) -> None:
    """cuDNN's algorithm search (``benchmark``) and, when given, its deterministic mode."""
    torch.backends.cudnn.benchmark = bool(benchmark)
    if deterministic is not None:
        torch.backends.cudnn.deterministic = bool(deterministic)


def versions() -> dict:
    """{cuda, nccl, cudnn}: what this torch was built with (None where it has none); no context."""
    built = torch.version.cuda
    nccl = None
    if built and torch.distributed.is_nccl_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):  # torch built without its NCCL bindings
            nccl = None
    return {"cuda": built, "nccl": nccl, "cudnn": torch.backends.cudnn.version() if built else None}

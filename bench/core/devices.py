"""Device discovery: CUDA GPUs, or the CPU cores this process may use."""
from __future__ import annotations

import os

from bench.core.errors import UsageError


def usable_cpus() -> int:
    """The cores this process may run on: its affinity mask (a Slurm cpuset, a container's or taskset's CPU list),
    not the machine's count, so ranks x threads never oversubscribe the cores a job was given."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def detect_device(requested: str) -> tuple[str, int]:
    """(device type, devices present): CUDA GPUs, or CPU cores for CPU workers."""
    from bench.core import cuda

    if requested not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device {requested!r}: unknown device; choose from auto, cuda, cpu")
    has_cuda = cuda.available()  # does not create a CUDA context in this process
    if requested == "cuda" and not has_cuda:
        raise UsageError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                         "use --device cpu or auto")
    if requested == "cuda" or (requested == "auto" and has_cuda):
        return "cuda", cuda.count()
    return "cpu", usable_cpus()

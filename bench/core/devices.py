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


def numa_nodes() -> int:
    """The machine's NUMA nodes (Linux's /sys/devices/system/node); 1 where it says nothing."""
    import glob

    return len(glob.glob("/sys/devices/system/node/node[0-9]*")) or 1


def detect_device(requested: str) -> tuple[str, int]:
    """(device type, devices present): CUDA GPUs, or CPU cores for CPU workers. Where NVML sees GPUs that torch cannot
    use (a driver older than the CUDA torch was built for, a CPU build of torch, CUDA_VISIBLE_DEVICES hiding them),
    ``auto`` and ``cuda`` refuse in one line instead of measuring the CPU: ``make bench GPUS=8`` would otherwise write
    a gloo CPU report on an 8-GPU node. ``cpu`` measures the CPU on purpose."""
    from bench.core import cuda

    if requested not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device {requested!r}: unknown device; choose from auto, cuda, cpu")
    has_cuda = cuda.available()  # does not create a CUDA context in this process
    if requested != "cpu" and not has_cuda:
        why = unusable_gpus()
        if why:
            raise UsageError(f"--device {requested}: {why}; or pass --device cpu to measure the CPU on purpose")
    if requested == "cuda" and not has_cuda:
        raise UsageError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                         "use --device cpu or auto")
    if requested == "cuda" or (requested == "auto" and has_cuda):
        return "cuda", cuda.count()
    return "cpu", usable_cpus()


def several_devices() -> bool:
    """Whether ``auto`` finds two or more devices (make bench's question before its collectives sweep); False where it
    refuses (the GPUs are there but torch cannot use them: bench run said why)."""
    try:
        return detect_device("auto")[1] >= 2
    except UsageError:
        return False


def unusable_gpus() -> str | None:
    """Why torch cannot use the GPUs NVML sees here (the driver's version, the newest CUDA it runs, torch's CUDA and the
    way out), or None: NVML sees none (or cannot be asked)."""
    import torch

    from bench.core import cuda, nvml

    try:
        with nvml.open() as n:
            count = n.count()
            if not count:
                return None
            driver, runs = n.driver(), n.cuda_driver_version()
    except nvml.Unavailable:  # no NVML: a machine without NVIDIA GPUs
        return None
    gpus = f"NVML sees {count} GPU{'s' if count > 1 else ''} (driver {driver}, which runs CUDA up to {runs})"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return f"{gpus}, but CUDA_VISIBLE_DEVICES={hidden!r} hides them all from torch: unset it"
    built = cuda.versions()["cuda"]
    if not built:
        return (f"{gpus}, but torch {torch.__version__} is a CPU build: install a CUDA build (`make bench` installs the "
                "lock's) or keep one you have with `make bench TORCH=system`")
    if _version(runs) < _version(built):
        return (f"{gpus}, but torch {torch.__version__} was built for CUDA {built}, which this driver is too old for: "
                f"run `make bench TORCH=system` with a torch built for CUDA {runs} or older, or update the driver")
    return (f"{gpus}, but torch {torch.__version__} (CUDA {built}) cannot use them (torch.cuda.is_available() is "
            "False): check that this process can open the GPUs (nvidia-smi; a container's --gpus)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".") if x.isdigit())

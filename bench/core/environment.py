"""The machine and software a run ran on, probed once per sweep and recorded in every record's ``env``: torch, CUDA,
NCCL, cuDNN, the GPUs and driver (NVML), the interconnect topology, the CPU, the host, the git commit
(bench/core/results.py defines the record itself)."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from bench.core import cuda, nvml
from bench.core.devices import usable_cpus
from bench.core.results import REPO_ROOT, utc_now

# Nothing here creates a CUDA context (NVML and version queries only), so the harness process can call it without
# holding memory on GPU 0.


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def nvml_gpus() -> dict:
    """Names of the GPUs this process can use (CUDA_VISIBLE_DEVICES honoured, in CUDA order), their count
    and the driver, from NVML; or an ``error`` saying why NVML could not answer (a CPU machine: no driver)."""
    try:
        with nvml.open() as n:
            names = [n.name(i) for i in visible_nvml_indices(n.count())]
            return {"count": len(names), "names": names, "driver": n.driver()}
    except nvml.Unavailable as e:
        return {"error": str(e)}


def visible_nvml_indices(total: int) -> list[int]:
    """NVML indices of CUDA devices 0, 1, ... as this process sees them (CUDA_VISIBLE_DEVICES, by index or UUID),
    read without creating a CUDA context; all ``total`` GPUs in NVML's order where torch cannot map them."""
    try:
        return [cuda.nvml_index(i) for i in range(cuda.count())]
    except RuntimeError:  # torch's own: an unusual CUDA_VISIBLE_DEVICES, or no private mapping in this torch
        return list(range(total))


def git_commit() -> str | None:
    commit = _run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"])
    if commit and _run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"]):
        commit += "-dirty"
    return commit


def collect_env(backend_env: dict | None = None) -> dict:
    """The machine and software of a run, once per record; ``backend_env``: what the sweep's backends add
    (backends.environment: Horovod's build)."""
    import torch

    built = cuda.versions()
    gpus = nvml_gpus()
    topo = _run(["nvidia-smi", "topo", "-m"]) if gpus.get("count") else None
    env = {
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        # where torch came from: "locked" (make's default, requirements.lock), "system" (TORCH=system: the
        # interpreter's own), or "unmanaged" (an environment make did not build)
        "torch_source": _torch_source(),
        "deepspeed": _version("deepspeed"),
        "dali": _version("nvidia-dali-cuda130") or _version("nvidia-dali-cuda120"),
        "cuda": built["cuda"],
        "nccl": built["nccl"],
        "cudnn": built["cudnn"],
        "cuda_available": cuda.available(),
        "gpu_count": gpus.get("count", 0),
        "gpu_names": gpus.get("names", []),
        "driver": gpus.get("driver"),
        "nvml": gpus.get("error", "ok"),
        "topology": topo,
        "cpu_count": usable_cpus(),  # the cores this run may use (its affinity mask), which set its threads
        "cpu_count_machine": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_prefix": sys.prefix,  # the harness's environment; every rank's own is in rank_python_prefixes
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "horovod": None,
        "started_at": utc_now(),
    }
    env.update(backend_env or {})
    return env


def _torch_source() -> str:
    mode = Path(sys.prefix) / ".torch-mode"  # written by scripts/install.sh
    try:
        return mode.read_text().strip() or "unmanaged"
    except OSError:
        return "unmanaged"


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None

"""The input pipelines a real-data run can train from, chosen with ``--loader`` and ``--decode``.

- ``torchvision``: DataLoader workers and DistributedSampler. ``--decode cpu`` decodes and augments with PIL in
  the workers; ``--decode gpu`` only reads file bytes in the workers and decodes each batch on the GPU with
  nvJPEG (``torchvision.io.decode_jpeg(..., device="cuda")``), then crops, flips and normalises there.
- ``dali``: NVIDIA DALI, one pipeline per rank: ``fn.readers.file`` (this rank's shard), ``fn.decoders.image``
  (``mixed``: nvJPEG on the GPU with ``--decode gpu``; ``cpu`` otherwise), ``fn.random_resized_crop`` and
  ``fn.crop_mirror_normalize``.

Every loader yields ``(images, targets, skipped)`` per batch through ``epoch(n)``; ``bench.rank.data.TimedBatches``
times every wait the same way for all of them.
"""
from __future__ import annotations

import importlib.util
import re

from bench.core.errors import UsageError

LOADERS = ("torchvision", "dali")
DECODES = ("cpu", "gpu")
DALI_DEFAULT = "nvidia-dali-cuda130"  # what pyproject.toml installs on Linux x86_64 and aarch64


def check(loader: str, decode: str, device_type: str) -> None:
    """Bad input, before anything runs: one line naming the value and the choices."""
    if loader not in LOADERS:
        raise UsageError(f"--loader {loader!r}: unknown loader; choose from {', '.join(LOADERS)}")
    if decode not in DECODES:
        raise UsageError(f"--decode {decode!r}: unknown decode; choose from {', '.join(DECODES)}")
    if decode == "gpu" and device_type != "cuda":
        raise UsageError(f"--decode gpu decodes on a CUDA device (nvJPEG); this run is on {device_type}: "
                          f"use --decode cpu")


def dali_builds() -> list[str]:
    """The DALI distributions installed (``nvidia-dali-cuda120``, ``nvidia-dali-cuda130``, ...), sorted. Each build
    is one wheel per CUDA major version, all installing the same ``nvidia.dali`` package."""
    import importlib.metadata

    names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in importlib.metadata.distributions()}
    return sorted(n for n in names if re.fullmatch(r"nvidia-dali-cuda\d+", n))


def dali_build_for_torch() -> str | None:
    """The DALI wheel matching torch's CUDA major version (``torch.version.cuda`` 12.8 -> nvidia-dali-cuda120), or
    None for a CPU-only torch (DALI's CPU pipeline then runs with any build)."""
    import torch

    cuda = torch.version.cuda
    return f"nvidia-dali-cuda{int(cuda.split('.')[0])}0" if cuda else None


def unavailable(loader: str) -> str | None:
    """Why ``loader`` cannot run here (and the fix), or None. A DALI built for another CUDA major version than
    torch's loads, then fails at run time (its libraries link that CUDA's runtime), so it is skipped here with the
    pip command that fixes it."""
    if loader != "dali":
        return None
    want = dali_build_for_torch()
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no nvidia namespace package at all
        found = False
    if not found:
        pkg = want or DALI_DEFAULT
        return (f"NVIDIA DALI is not installed (pip install {pkg}"
                + (" (make install does, on Linux x86_64 and aarch64))" if pkg == DALI_DEFAULT else ")"))
    have = dali_builds()
    if want is None or not have or have == [want]:  # not from a known wheel (a source build, conda): trust it
        return None
    import torch

    if want in have:
        return (f"several NVIDIA DALI builds are installed ({', '.join(have)}) over one nvidia/dali folder; torch is "
                f"built for CUDA {torch.version.cuda}: pip uninstall -y {' '.join(have)} && pip install {want}")
    return (f"the installed NVIDIA DALI ({', '.join(have)}) is not built for torch's CUDA {torch.version.cuda}: "
            f"pip uninstall -y {' '.join(have)} && pip install {want}")


def build(loader: str, decode: str, data_dir: str, image_size: int, batch: int, workers: int, rank: int,
          world_size: int, distributed: bool, device, seed: int = 0):
    """This rank's source of ``(images, targets, skipped)`` batches; ``distributed``: read shard ``rank`` of
    ``world_size`` (otherwise the whole set)."""
    if loader == "dali":
        from bench.rank.loaders.dali import DaliSource

        return DaliSource(data_dir, image_size, batch, workers, rank if distributed else 0,
                          world_size if distributed else 1, device, decode, seed)
    from bench.rank.loaders.tv import TorchvisionSource

    return TorchvisionSource(data_dir, image_size, batch, workers, rank, world_size, distributed, device, decode,
                             seed)

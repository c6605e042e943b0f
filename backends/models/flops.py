"""Training FLOPs per sample and parameters of a workload (``--model``), counted once per (model, input shape) by
``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward pass on the meta device (shapes only: no
memory, no compute). A multiply-add counts as two FLOPs, so ResNet-50 at 224 px is about 8.2 GFLOP forward (4.1 GMAC)
and about 3x that for training (the backward pass computes gradients of both inputs and weights). The planner and the
report count here (MFU itself: bench/core/mfu.py).

A count is kept in a cache, one small JSON file per key (``BENCH_FLOPS_CACHE``, else
``$XDG_CACHE_HOME/torch-parallel-bench/flops``, else ``~/.cache/...``): the counter is a ``TorchDispatchMode``, and
torch imports ``torch._dynamo`` at its first dispatch, 1.2 of the 2.9 s of CPU a ``python -m bench run`` spent before
it launched anything. The key is everything the count depends on: the model, its input shape, torch's and
torchvision's versions, and the source of this package (``backends/models/``) and of ``bench/core/workloads.py``
(the GPT sizes, the small CNNs' widths), so an edited model is counted again.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from bench.core import results, workloads

FLOPS_SCHEMA = "flops-1"
_PACKAGE = Path(__file__).resolve().parent
# what a model is made of besides this package: the GPT sizes and the small CNNs' widths, the kinds (bench/core)
_WORKLOADS = Path(workloads.__file__).resolve()


def cache_dir() -> Path:
    return results.user_cache_dir("flops", "BENCH_FLOPS_CACHE")


def cache_key(model: str, image_size: int | None, seq_len: int | None) -> dict:
    """What a count depends on. The versions are the installed distributions' (no import of either package)."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    code = hashlib.sha256()
    for f in [*sorted(_PACKAGE.glob("*.py")), _WORKLOADS]:
        code.update(f.name.encode() + b"\0" + f.read_bytes())
    return {"model": model, "image_size": image_size, "seq_len": seq_len, "torch": version("torch"),
            "torchvision": version("torchvision"), "code": code.hexdigest()[:16]}


def _entry_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / f"{key['model']}-{key['image_size']}px-seq{key['seq_len']}-{digest}.json"


@lru_cache(maxsize=None)
def flops_per_sample(model: str, image_size: int | None, seq_len: int | None = None) -> float:
    """Training FLOPs (forward + backward) per sample (an image, or a sequence of ``seq_len`` tokens for gpt-<size>:
    the counter includes attention's), counted on the meta device, or read from the cache where this key was counted
    before. A user's model (``pkg.mod:factory``) is not counted: it would be built in this process, on the CPU."""
    if workloads.of(model).kind == "custom":
        raise ValueError("a user's model is not counted (it would be built in the harness)")
    key = cache_key(model, image_size, seq_len)
    path = _entry_path(key)
    try:
        entry = json.loads(path.read_text())
        if entry.get("schema") == FLOPS_SCHEMA and entry.get("key") == key:
            return float(entry["flops_per_sample"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # absent, unreadable or another key's: counted below
    flops = count(model, image_size, seq_len)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"schema": FLOPS_SCHEMA, "key": key, "flops_per_sample": flops}
        results.write_json_atomic(entry, path, overwrite=True)  # whole or not at all, the last writer's
    except OSError:
        pass  # a read-only cache: counted again next time
    return flops


def count(model: str, image_size: int | None, seq_len: int | None = None) -> float:
    """The count itself, on the meta device (no cache)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from backends import models

    kind = workloads.of(model).kind
    workload = models.workload(model, image_size, seq_len, False)
    gen = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        if kind == "vision" and model not in workloads.SMALL_CNNS:
            extra = {"aux_logits": False, "init_weights": False} if model in ("googlenet", "inception_v3") else {}
            import torchvision

            net = torchvision.models.get_model(model, weights=None, num_classes=1000, **extra)
        else:
            net = workload.build()
    x, y = workload.batch(2, gen)  # 2: BatchNorm refuses a batch of one in training
    with FlopCounterMode(display=False) as counter:
        workload.loss(net(x.to("meta")), y.to("meta")).backward()
    return counter.get_total_flops() / 2


@lru_cache(maxsize=None)
def parameter_count(model: str, seq_len: int | None = None) -> int:
    """Parameters of the model (1000 classes for the torchvision ones), counted on the meta device; a GPT's depend on
    ``seq_len`` (its position embedding: give the run's). A user's model (``pkg.mod:factory``) is not counted: it
    would be built in this process (its size is in its runs' records, ``state_bytes``)."""
    import torch

    kind = workloads.of(model).kind
    if kind == "custom":
        raise ValueError(f"{model}: a user's model is not counted (it would be built in the harness)")
    if kind == "language":
        return workloads.gpt_parameters(model, seq_len or workloads.DEFAULT_SEQ_LEN["cpu"])
    if model in workloads.SMALL_CNNS:
        from backends.models import SmallCNN

        return sum(p.numel() for p in SmallCNN(*workloads.SMALL_CNNS[model]).parameters())
    import torchvision

    extra = {"aux_logits": False, "init_weights": False} if model in ("googlenet", "inception_v3") else {}
    with torch.device("meta"):
        net = torchvision.models.get_model(model, weights=None, num_classes=1000, **extra)
    return sum(p.numel() for p in net.parameters())

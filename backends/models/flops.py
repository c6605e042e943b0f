"""Training FLOPs per sample and parameters of a workload (``--model``), counted once per (model, input shape) by
``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward pass on the meta device (shapes only: no
memory, no compute). A multiply-add counts as two FLOPs, so ResNet-50 at 224 px is about 8.2 GFLOP forward (4.1 GMAC)
and about 3x that for training (the backward pass computes gradients of both inputs and weights). The planner and the
report count here (MFU itself: bench/core/mfu.py).
"""
from __future__ import annotations

from functools import lru_cache

@lru_cache(maxsize=None)
def flops_per_sample(model: str, image_size: int | None, seq_len: int | None = None) -> float:
    """Training FLOPs (forward + backward) per sample (an image, or a sequence of ``seq_len`` tokens for gpt-<size>:
    the counter includes attention's), counted on the meta device. A user's model (``pkg.mod:factory``) is not
    counted: it would be built in this process, on the CPU."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from backends import models
    from bench.core import workloads

    kind = workloads.of(model).kind
    if kind == "custom":
        raise ValueError("a user's model is not counted (it would be built in the harness)")
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

    from bench.core import workloads

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

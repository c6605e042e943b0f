"""Which dtype the operations that decide a model's numerics ran in, read from one real training step of the backend
(bench run records it as ``numerics``). The same precision flag means different arithmetic under different backends:
under autocast (ddp, ddp_zero, allreduce_manual, horovod, single) LayerNorm, softmax and the residual stream stay fp32
while the matmuls run in half; under FSDP2's MixedPrecisionPolicy and DeepSpeed's fp16/bf16 sections the parameters
themselves are half, so norms and the residual stream are too: smaller activations and faster steps for reasons that
have nothing to do with sharding. The report and the verdict compare only runs whose numerics agree.

Measured, not declared: a TorchDispatchMode sees every aten operation of the step's forward (after autocast has cast
its inputs) and notes the dtype it computes in: its first floating-point input's, or float32 where a softmax is
asked to compute and return float32 from a half input (``half_to_float``: CUDA's ``log_softmax(x, dtype=float32)`` of
fp16 ``x``, the same arithmetic as an upcast before it); a forward hook on each block notes the dtype of
what the block returns (the residual stream). Not under ``--compile``: compiled kernels bypass the dispatcher.

Dispatch modes are per thread: where a backend runs part of the forward in threads of its own (DataParallel's replicas
at two or more GPUs: ``Backend.replica_contexts``), a watch of its own is entered in each of them, all noting into
the same table.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# category -> the aten operations (overload packets) that show it
OPS = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "convolution", "cudnn_convolution", "mkldnn_convolution", "linear"),
    "norm": ("native_layer_norm", "layer_norm", "native_batch_norm", "_native_batch_norm_legit",
             "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "batch_norm", "native_group_norm"),
    "attention": ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "scaled_dot_product_attention", "_softmax", "softmax"),
    "loss": ("_log_softmax", "log_softmax", "nll_loss_forward", "mse_loss"),
}
CATEGORY = {op: cat for cat, ops in OPS.items() for op in ops}
NORM_PARAMS = "norm_params"  # the norms' weights: FSDP2 keeps BatchNorm's fp32 under a half policy
HALF_TO_FLOAT = ("_softmax", "_log_softmax")  # (input, dim, half_to_float): True computes and returns float32


class _Probe(TorchDispatchMode):
    """Notes into ``seen`` (shared by the watches of one probe, one per thread; a set's add is atomic under the GIL)."""

    def __init__(self, seen: dict[str, set] | None = None):
        super().__init__()
        self.seen = {} if seen is None else seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        cat = CATEGORY.get(func.overloadpacket.__name__)
        if cat is not None:
            floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if floats:
                upcast = func.overloadpacket.__name__ in HALF_TO_FLOAT and len(args) > 2 and args[2] is True
                self.seen.setdefault(cat, set()).add(_name(torch.float32 if upcast else floats[0].dtype))
            if cat == "norm" and len(floats) > 1:  # (input, weight, ...)
                self.seen.setdefault(NORM_PARAMS, set()).add(_name(floats[1].dtype))
        return func(*args, **(kwargs or {}))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def probe(backend, compiled: bool = False) -> dict:
    """One training step of ``backend`` (its autocast or mixed-precision policy applied), its forward watched: per
    category the dtype seen ("mixed" when several, None when the model has no such operation), and ``residual``: what
    the blocks return. ``signature``: the same string for two runs that compute alike."""
    if compiled:
        return {"reason": "not probed under --compile (compiled kernels bypass the dispatcher)", "signature": None}
    from backends import models

    seen: dict[str, set] = {}
    watch, residual = _Probe(seen), set()
    replicas = backend.replica_contexts
    in_replica = lambda: _Probe(seen)  # noqa: E731 - a watch of its own in each replica's thread
    if replicas is not None:
        replicas.append(in_replica)
    hooks = [b.register_forward_hook(lambda m, i, out: residual.add(_name(out.dtype))
                                     if isinstance(out, torch.Tensor) else None)
             for b in models.find_blocks(backend.module) or []]
    before = backend.phase_marker

    def marker(name):
        return watch if name == "forward" else (before(name) if before else contextlib.nullcontext())

    backend.phase_marker = marker
    try:
        backend.train(1)
    finally:
        backend.phase_marker = before
        if replicas is not None:
            replicas.remove(in_replica)
        for h in hooks:
            h.remove()
    got = {cat: _one(seen.get(cat)) for cat in (*OPS, NORM_PARAMS)}
    got["residual"] = _one(residual)
    got["signature"] = ", ".join(f"{k} {v}" for k, v in got.items() if v is not None)
    return got


def _one(dtypes: set | None) -> str | None:
    if not dtypes:
        return None
    return next(iter(dtypes)) if len(dtypes) == 1 else "mixed (" + ", ".join(sorted(dtypes)) + ")"

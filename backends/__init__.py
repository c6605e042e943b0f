"""The backend registry: a name maps to ``module:Class``, a launcher and parameters.

Modules are imported only when a backend is asked for, so a missing optional dependency (horovod) costs
nothing until that backend is used, and then becomes a clean "skipped" with the reason.
One class may be registered under several names with different launchers (DDP under torchrun and
under mp.spawn), as Lightning Fabric does with its strategies.
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the registry imports no backend module until one is asked for
    from backends.base import Backend

# Where a backend departs from its library's default, and why (docs/backends.md, "The rule": every backend runs as
# its library ships it, except where a default would make the comparison measure something other than the backend).
# A setting is named as the backend's ``library_settings`` names it; tests/backends/test_fairness.py fails on a
# departure not named here, and on a reason here for a setting that no longer departs.
_DS_BUCKETS = ("sized like DDP's buckets, 25 MiB of fp32 elements (--ds-bucket-mb): DeepSpeed's 5e8 elements allocate "
               "a 1.9 GiB bucket on every rank whatever the model, and its memory figure would be mostly that buffer")
DS_DEPARTS = {
    "zero_optimization.reduce_bucket_size": _DS_BUCKETS,
    "zero_optimization.allgather_bucket_size": _DS_BUCKETS,
    "communication_data_type": "fp32 on the wire, as every other backend reduces unless a knob asks for compression; "
                               "DeepSpeed's default is the model's dtype",
    "gradient_clipping": "no other backend clips; with DeepSpeed's 1.0 it trained another model (bench verify found it)",
    "timers.throughput.enabled": "its throughput timer synchronizes the device at the start and stop of every step",
    "timers.throughput.synchronized": "its throughput timer synchronizes the device at the start and stop of every step",
    "torch_autocast.lower_precision_safe_modules": "by default DeepSpeed reduces Linear and Conv gradients in the "
                                                   "autocast dtype: half the bytes of every other backend's fp32",
    "steps_per_print": "no progress lines from inside the timed loop (DeepSpeed 0.19's default prints none either; "
                       "set, so no release's default can start printing)",
    "zero_allow_untested_optimizer": "every backend trains with the suite's optimizer (torch's, fused), which is not "
                                     "in DeepSpeed's list of tested ones",
}
DS_OVERLAP = {  # stages 1-2, where DeepSpeed's defaults differ from stage 3's
    "zero_optimization.overlap_comm": "reduction overlapped with backward, as DDP overlaps (DeepSpeed's default is off "
                                      "at stages 1-2, on at 3)",
    "zero_optimization.compute_grad_norm": "the global norm exists for clipping, which is off",
}
DS12_DEPARTS = {**DS_DEPARTS, **DS_OVERLAP}
FSDP2_DEPARTS = {"reshard_after_forward": "torchtitan's apply_fsdp: every block but the last reshards after forward "
                                          "(backward needs the last first, and FSDP2 would all-gather it again at "
                                          "once); at world size 1 none does (a one-rank shard is the whole parameter)"}
DDP_ZERO_DEPARTS = {"zero.parameters_as_bucket_view": "the default broadcasts each updated parameter on its own (161 "
                                                      "broadcasts a step for ResNet-50); the bucket view sends one "
                                                      "flat buffer per rank, as DDP's buckets do"}

REGISTRY: dict[str, dict] = {
    "single": {"cls": "backends.single:Single", "launcher": "inproc"},
    "dp": {"cls": "backends.dp:DataParallel", "launcher": "inproc"},
    "ddp": {"cls": "backends.ddp:DDP", "launcher": "torchrun"},
    "ddp_spawn": {"cls": "backends.ddp:DDP", "launcher": "spawn"},
    "ddp_amp_syncbn": {"cls": "backends.ddp_amp_syncbn:DDPAmpSyncBN", "launcher": "torchrun"},
    "horovod": {"cls": "backends.horovod:Horovod", "launcher": "horovodrun"},
    "fsdp2": {"cls": "backends.fsdp2:FSDP2", "launcher": "torchrun", "departs": FSDP2_DEPARTS},
    "ds_zero1": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 1,
                 "departs": DS12_DEPARTS},
    "ds_zero2": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 2,
                 "departs": DS12_DEPARTS},
    "ds_zero3": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 3,
                 "departs": DS_DEPARTS},
    "ddp_zero": {"cls": "backends.ddp_zero:DDPZero", "launcher": "torchrun", "departs": DDP_ZERO_DEPARTS},
    "allreduce_manual": {"cls": "backends.allreduce_manual:AllReduceManual", "launcher": "torchrun"},
}


# The scaling baseline: one device, one process, no wrapper (efficiencies divide by it at world size 1).
BASELINE = "single"


def names() -> list[str]:
    return list(REGISTRY)


def backend_class(name: str) -> type[Backend]:
    module, _, cls = REGISTRY[name]["cls"].partition(":")
    return getattr(importlib.import_module(module), cls)


def knobs() -> list:
    """Every knob of every registered backend (bench/core/knobs.py), once each: the backends' own in registry order,
    then the common ones."""
    from backends.base import COMMON_KNOBS

    seen, out = {k.key for k in COMMON_KNOBS}, []
    for name in REGISTRY:
        for knob in backend_class(name).knobs:
            if knob.key not in seen:
                seen.add(knob.key)
                out.append(knob)
    return out + list(COMMON_KNOBS)


def environment(names) -> dict:
    """What the backends ``names`` add to a sweep's record ``env`` (Backend.environment), each class once."""
    out = {}
    for cls in dict.fromkeys(backend_class(n) for n in names):
        out.update(cls.environment())
    return out


@functools.cache
def shared_keys() -> frozenset:
    """The options that are settings of the workload rather than of one backend: the knobs the baseline declares too
    (channels_last, --compile, activation checkpointing, the optimizer's implementation)."""
    return frozenset(k.key for k in backend_class(BASELINE).knobs)


def shared_settings(options: dict | None) -> dict:
    """Those of ``options`` that are switched on: what a run's single@1 baseline must run with too (the planner plans
    it, the report matches it)."""
    return {k: v for k, v in (options or {}).items() if k in shared_keys() and v not in (None, False)}


def departs(name: str) -> dict[str, str]:
    """Where backend ``name`` departs from its library's defaults: {setting: why} (its registry entry)."""
    return dict(REGISTRY[name].get("departs") or {})


def create(name: str):
    if name not in REGISTRY:
        raise KeyError(f"unknown backend {name!r}; choose from {', '.join(REGISTRY)}")
    entry = {k: v for k, v in REGISTRY[name].items() if k not in ("cls", "departs")}
    return backend_class(name)(name, **entry)

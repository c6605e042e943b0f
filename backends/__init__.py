"""The backend registry: a name maps to ``module:Class``, a launcher and parameters.

Modules are imported only when a backend is asked for, so a missing optional dependency (horovod) costs
nothing until that backend is used, and then becomes a clean "skipped" with the reason.
One class may be registered under several names with different launchers (DDP under torchrun and
under mp.spawn), as Lightning Fabric does with its strategies.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the registry imports no backend module until one is asked for
    from backends.base import Backend

REGISTRY: dict[str, dict] = {
    "single": {"cls": "backends.single:Single", "launcher": "inproc"},
    "dp": {"cls": "backends.dp:DataParallel", "launcher": "inproc"},
    "ddp": {"cls": "backends.ddp:DDP", "launcher": "torchrun"},
    "ddp_spawn": {"cls": "backends.ddp:DDP", "launcher": "spawn"},
    "ddp_amp_syncbn": {"cls": "backends.ddp_amp_syncbn:DDPAmpSyncBN", "launcher": "torchrun"},
    "horovod": {"cls": "backends.horovod:Horovod", "launcher": "horovodrun"},
    "fsdp2": {"cls": "backends.fsdp2:FSDP2", "launcher": "torchrun"},
    "ds_zero1": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 1},
    "ds_zero2": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 2},
    "ds_zero3": {"cls": "backends.deepspeed_zero:DeepSpeedZero", "launcher": "torchrun", "stage": 3},
    "ddp_zero": {"cls": "backends.ddp_zero:DDPZero", "launcher": "torchrun"},
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


def create(name: str):
    if name not in REGISTRY:
        raise KeyError(f"unknown backend {name!r}; choose from {', '.join(REGISTRY)}")
    entry = dict(REGISTRY[name])
    del entry["cls"]
    return backend_class(name)(name, **entry)

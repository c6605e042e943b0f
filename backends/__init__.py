"""The backend registry: a name maps to ``module:Class``, a launcher and parameters.

Modules are imported only when a backend is asked for, so a missing optional dependency (horovod) costs
nothing until that backend is used, and then becomes a clean "skipped" with the reason.
One class may be registered under several names with different launchers (DDP under torchrun and
under mp.spawn), as Lightning Fabric does with its strategies.
"""
from __future__ import annotations

import importlib

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


def names() -> list[str]:
    return list(REGISTRY)


def create(name: str):
    if name not in REGISTRY:
        raise KeyError(f"unknown backend {name!r}; choose from {', '.join(REGISTRY)}")
    entry = dict(REGISTRY[name])
    module, _, cls = entry.pop("cls").partition(":")
    return getattr(importlib.import_module(module), cls)(name, **entry)

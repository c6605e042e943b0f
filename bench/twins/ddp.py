"""DDP's plain loop at world size 1 (``bench run --reference`` beside ddp, ddp_spawn and ddp_zero): the model wrapped in
DistributedDataParallel with its defaults (25 MiB buckets), over a one-rank process group, as a DDP script that does
not use the suite would; ddp_zero's twin also steps through ZeroRedundancyOptimizer with bucket views. The step and
the windows are loop.py's. No harness code: torch only."""
import inspect

import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel


def init(device):
    """A one-rank process group, NCCL on a GPU and gloo on the CPU, over an in-process store (no port)."""
    if device.type == "cuda":
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def settings_of(optimizer) -> dict:
    """The optimizer's settings its constructor takes (its ``defaults`` hold a few it does not), no implementation."""
    accepted = inspect.signature(type(optimizer)).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in ("fused", "foreach")}


def wrap(c, model, optimizer, device):
    """The model, its optimizer, whether the step runs under autocast, and no step of its own (loop.py's)."""
    init(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if c["loop"].get("zero"):  # ddp_zero: each rank steps its share and broadcasts it, one bucket view per rank
        impl = {k: True for k in ("fused", "foreach") if optimizer.defaults.get(k)}
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=type(optimizer),
                                            parameters_as_bucket_view=True, **settings_of(optimizer), **impl)
    return ddp, optimizer, True, None

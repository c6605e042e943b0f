"""FSDP2's plain loop at world size 1 (``bench run --reference`` beside fsdp2), as torchtitan's ``apply_fsdp`` writes
it: ``fully_shard`` each block, then the root, over a one-rank mesh; at bf16/fp16 autocast over fp32 parameters (the
default) or a ``MixedPrecisionPolicy`` with half parameters, BatchNorm's kept fp32 (``params``); nothing resharded
after forward at world size 1 unless asked; the optimizer over the DTensor shards, fused AdamW or foreach SGD (torch has
no DTensor rule for fused SGD). The step and the windows are loop.py's. No harness code: torch and torchvision only."""
import dataclasses

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torchvision.models.resnet import BasicBlock, Bottleneck

from bench.twins import ddp


def blocks(model):
    """The units sharded one by one: a transformer's layers, a ResNet's residual blocks, else the root's children
    that hold parameters."""
    if isinstance(getattr(model, "blocks", None), torch.nn.ModuleList):
        return list(model.blocks)
    found = [m for m in model.modules() if isinstance(m, (BasicBlock, Bottleneck))]
    return found or [m for m in model.children() if any(True for _ in m.parameters())]


def wrap(c, model, optimizer, device):
    """The sharded model, an optimizer over its shards, whether the step runs under autocast, no step of its own."""
    ddp.init(device)
    mesh = init_device_mesh(device.type, (1,))
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(c["precision"])
    params = half if c["loop"]["mp"] == "params" else None  # None: the parameters stay fp32, autocast casts
    policy = MixedPrecisionPolicy(param_dtype=params, reduce_dtype=torch.float32 if params else None)
    if c["channels_last"]:
        model = model.to(memory_format=torch.contiguous_format)  # fully_shard refuses channels-last parameters
    units, norms = blocks(model), [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if params and "param_dtype_override_fn" in {f.name for f in dataclasses.fields(MixedPrecisionPolicy)}:
        ids = {id(p) for m in norms for p in m.parameters()}  # BatchNorm's parameters stay fp32 under a half policy
        policy = dataclasses.replace(policy, param_dtype_override_fn=lambda p: torch.float32 if id(p) in ids else None)
    elif params and norms:  # torch <= 2.14: each block's norms an fp32 group of their own, in block order, then the rest
        at = {id(m): i for i, u in enumerate(units) for m in u.modules()}
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
        for i in sorted({at.get(id(n), len(units)) for n in norms}):
            fully_shard([n for n in norms if at.get(id(n), len(units)) == i], mesh=mesh, mp_policy=fp32,
                        reshard_after_forward=False)
    for i, block in enumerate(units):
        keep = c["loop"]["reshard"] == "never" or (c["loop"]["reshard"] != "every block" and i == len(units) - 1)
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, mp_policy=dataclasses.replace(policy, output_dtype=torch.float32 if params else None))
    impl = c.get("optimizer_impl") or ("foreach" if isinstance(optimizer, torch.optim.SGD) else "fused")
    optimizer = type(optimizer)(model.parameters(), **ddp.settings_of(optimizer), **{impl: True})
    return model, optimizer, params is None, None

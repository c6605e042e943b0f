"""fsdp2: PyTorch's fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``) under torchrun.

Parameters, gradients and optimizer state are sharded over the ranks; each block all-gathers its parameters
for forward and backward and reduce-scatters its gradients. ``fully_shard`` is applied per block (for ResNets
each BasicBlock/Bottleneck; for other models each direct child that holds parameters), then to the root, as
the PyTorch FSDP2 tutorial and torchtitan do.

Precision goes through ``MixedPrecisionPolicy``, not autocast: bf16/fp16 parameters for the all-gather and
compute, fp32 gradient reduction. BatchNorm in a low-precision parameter dtype is a known pitfall (its
statistics and affine parameters lose precision), so BatchNorm's parameters stay in fp32: through the policy's
``param_dtype_override_fn`` where torch has it, else (torch 2.14 and older) through an fp32 ``fully_shard`` group
of its own per BatchNorm layer, which costs one more all-gather per layer (recorded as ``norm_fp32_via``).
BatchNorm then takes half inputs with fp32 weights, as it does under autocast. fp16 adds a GradScaler (CUDA only).
"""
import contextlib
import dataclasses

import torch

from backends.base import COMMON_KNOBS, build_model
from backends.ddp import DDP


class FSDP2(DDP):
    knobs = COMMON_KNOBS  # DDP's process-group plumbing, none of its knobs

    def setup(self, cfg):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.init_process_group(cfg)
        model = build_model(cfg).to(self.device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
        mesh = init_device_mesh(cfg.device_type, (self.world_size,))
        self.norm_fp32_via = None
        if dtype and norms:
            if "param_dtype_override_fn" in {f.name for f in dataclasses.fields(MixedPrecisionPolicy)}:
                ids = {id(p) for m in norms for p in m.parameters()}
                policy = dataclasses.replace(policy, param_dtype_override_fn=lambda p: torch.float32 if id(p) in ids else None)
                self.norm_fp32_via = "param_dtype_override_fn"
            else:  # torch <= 2.14: each BatchNorm its own fp32 group; its input stays in the compute dtype
                fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
                for norm in norms:
                    fully_shard(norm, mesh=mesh, mp_policy=fp32)
                self.norm_fp32_via = "fully_shard per BatchNorm"
        for block in blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        # the root also returns fp32 logits, so the loss is computed in fp32 as under autocast
        fully_shard(model, mesh=mesh, mp_policy=dataclasses.replace(policy, output_dtype=torch.float32 if dtype else None))
        self.init_training(cfg, model, cfg.batch_size)
        self.autocast_dtype = None  # the policy casts; autocast on top would cast again
        self.param_dtype = dtype

    compute_only_keeps = "the per-block parameter all-gathers of forward and backward (only the gradient reduce-scatter is skipped)"

    def skip_gradient_sync(self):
        model = self.module

        @contextlib.contextmanager
        def local():
            model.set_requires_gradient_sync(False)  # FSDP2's no_sync: no reduce-scatter of the gradients
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return local()

    def describe(self):
        info = super().describe()
        info.update(autocast_dtype=None, param_dtype=str(self.param_dtype or torch.float32).removeprefix("torch."),
                    norm_fp32_via=self.norm_fp32_via,
                    sharded_parameters=sum(1 for p in self.module.parameters() if hasattr(p, "full_tensor")))
        return info

    def full_parameters(self):
        """The whole model's parameters: every rank all-gathers each DTensor (a collective, in order)."""
        for name, p in self.module.named_parameters():
            yield name, p.full_tensor() if hasattr(p, "full_tensor") else p


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The units to shard one by one: residual blocks where the model has them, else the root's children."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    found = [m for m in model.modules() if isinstance(m, (BasicBlock, Bottleneck))]
    return found or [m for m in model.children() if any(True for _ in m.parameters())]

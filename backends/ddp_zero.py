"""ddp_zero: DDP with torch.distributed.optim.ZeroRedundancyOptimizer (PyTorch's own ZeRO-1).

Gradients are all-reduced by DDP as usual; each rank keeps the SGD state (momentum) of its share of the
parameters only, updates that share, and broadcasts it to the others after the step. It trades a broadcast
per step for 1/N of the optimizer state's memory.

``parameters_as_bucket_view=True``: the default (False) broadcasts parameter by parameter (161 broadcasts a
step for ResNet-50; zero_redundancy_optimizer.py ``_broadcast_params_from_rank``), where the bucket view sends
one flat buffer per rank and device, as DDP's buckets do. Recorded in ``backend_info``.
"""
import functools

from backends.base import make_optimizer
from backends.ddp import DDP


ZERO_KWARGS = {"parameters_as_bucket_view": True, "overlap_with_ddp": False}


class DDPZero(DDP):
    compute_only_keeps = "ZeroRedundancyOptimizer's broadcast of each rank's updated parameters after the step"

    def setup(self, cfg):
        # imported here: torch.distributed.optim imports FSDP and DTensor (a second of CPU), which every process that
        # reads the registry's knobs (each bench command, each rank) would pay otherwise
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().setup(cfg)
        self.optimizer = make_optimizer(cfg, self.module.parameters(), cls=functools.partial(
            ZeroRedundancyOptimizer, **ZERO_KWARGS))

    def library_settings(self, cfg):
        return {**super().library_settings(cfg), **{f"zero.{k}": v for k, v in ZERO_KWARGS.items()}}

    def library_defaults(self):
        import inspect

        from torch.distributed.optim import ZeroRedundancyOptimizer

        signature = inspect.signature(ZeroRedundancyOptimizer.__init__).parameters
        return {**super().library_defaults(), **{f"zero.{k}": signature[k].default for k in ZERO_KWARGS}}

    def twin_settings(self, cfg):
        return {"zero": True}  # bench/twins/ddp.py with ZeroRedundancyOptimizer's bucket views

    def describe(self):
        info = super().describe()
        info.update(parameters_as_bucket_view=self.optimizer.parameters_as_bucket_view)
        return info

"""ddp_zero: DDP with torch.distributed.optim.ZeroRedundancyOptimizer (PyTorch's own ZeRO-1).

Gradients are all-reduced by DDP as usual; each rank keeps the SGD state (momentum) of its share of the
parameters only, updates that share, and broadcasts it to the others after the step. It trades a broadcast
per step for 1/N of the optimizer state's memory.
"""
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from backends.base import SGD
from backends.ddp import DDP


class DDPZero(DDP):
    compute_only_keeps = "ZeroRedundancyOptimizer's broadcast of each rank's updated parameters after the step"

    def setup(self, cfg):
        super().setup(cfg)
        self.optimizer = ZeroRedundancyOptimizer(self.module.parameters(), optimizer_class=torch.optim.SGD, **SGD)

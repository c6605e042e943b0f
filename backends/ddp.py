"""ddp: DistributedDataParallel, one process per device, NCCL on CUDA and gloo on CPU.

The same class runs under two launchers (the registry names them ``ddp`` and ``ddp_spawn``): torchrun and
torch.multiprocessing.spawn. Both hand the rank over in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so setup reads it from there and never parses ``--local_rank``.
"""
import os

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.base import Backend, build_model, device_for


class DDP(Backend):
    def setup(self, cfg):
        self.init_process_group(cfg)
        model = self.prepare_model(cfg, build_model(cfg).to(self.device))
        ids = [self.local_rank] if cfg.device_type == "cuda" else None
        self.init_training(cfg, DistributedDataParallel(model, device_ids=ids), cfg.batch_size)

    def prepare_model(self, cfg, model):
        """Hook for subclasses (SyncBatchNorm conversion) before the DDP wrapper."""
        return model

    def init_process_group(self, cfg):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = device_for(cfg, self.local_rank)
        if cfg.device_type == "cuda":  # bind the NCCL communicator to this rank's GPU up front
            dist.init_process_group("nccl", device_id=self.device)
        else:
            dist.init_process_group("gloo")

    def all_gather(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def barrier(self):
        dist.barrier()

    def teardown(self):
        if dist.is_initialized():
            dist.destroy_process_group()

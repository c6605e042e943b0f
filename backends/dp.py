"""dp: torch.nn.DataParallel. One process feeds B x N samples to GPU 0, which scatters them to N replicas,
gathers the outputs back and reduces the gradients onto GPU 0 (hence its memory imbalance)."""
import torch

from backends.base import Backend, build_model, device_for


class DataParallel(Backend):
    def unavailable(self, cfg):
        if cfg.device_type == "cpu" and cfg.world_size > 1:
            return ("nn.DataParallel cannot parallelise on CPU (it replicates over CUDA devices only); "
                    "run dp on GPUs, or ddp/ddp_spawn for several CPU workers")
        return super().unavailable(cfg)

    def note(self, cfg):
        if cfg.device_type == "cpu":
            return "nn.DataParallel on CPU calls the module directly: no replicas, no scatter/gather"
        return None

    def setup(self, cfg):
        self.device = device_for(cfg, 0)
        self.device_ids = list(range(cfg.world_size)) if cfg.device_type == "cuda" else None
        model = build_model(cfg).to(self.device)
        if self.device_ids:  # on CPU, DataParallel would grab any visible GPU: run the module as it is
            model = torch.nn.DataParallel(model, device_ids=self.device_ids)
        # The global batch comes from this one process and is split across the replicas.
        self.init_training(cfg, model, cfg.batch_size * cfg.world_size)  # scattered from GPU 0

    def devices(self):
        if self.device_ids is None:
            return [self.device]
        return [torch.device("cuda", i) for i in self.device_ids]

"""ddp_amp_syncbn: what NVIDIA apex's amp.initialize + convert_syncbn_model + apex DDP did, with today's
PyTorch: torch.nn.SyncBatchNorm, torch.autocast and torch.amp.GradScaler (fp16), under torchrun.

Defaults to fp16 (apex's O1). ``--precision fp32`` keeps SyncBatchNorm without AMP and ``bf16`` uses bf16
autocast without a scaler, so AMP's effect can be separated from SyncBatchNorm's.
"""
import torch

from backends.ddp import DDP

SYNCBN_CPU = ("SyncBatchNorm layers only work with GPU modules (torch.nn.SyncBatchNorm refuses CPU modules); "
              "run this backend on CUDA")


class DDPAmpSyncBN(DDP):
    twin_loop = None  # no plain loop of its own: compared with the plain loop as a whole
    default_precision = "fp16"
    batchnorm = "global"  # SyncBatchNorm normalises over the global batch
    compute_only_keeps = "SyncBatchNorm's all-reduce of the batch statistics in forward"

    def unavailable(self, cfg):
        if cfg.device_type == "cpu":
            return SYNCBN_CPU
        return super().unavailable(cfg)

    def prepare_model(self, cfg, model):
        # BatchNorm statistics are reduced over the global batch instead of each rank's share.
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

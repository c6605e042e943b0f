"""ddp: DistributedDataParallel, one process per device, NCCL on CUDA and gloo on CPU.

The same class runs under two launchers (the registry names them ``ddp`` and ``ddp_spawn``): torchrun and
torch.multiprocessing.spawn. Both hand the rank over in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), so setup reads it from there and never parses ``--local_rank``.

DDP's knobs, each recorded in ``options`` (and so part of the configuration key):
``ddp_bucket_mb`` (bucket_cap_mb, default 25), ``ddp_static_graph``, ``ddp_grad_as_bucket_view``,
``ddp_find_unused`` (find_unused_parameters, which the source articles pass: it walks the autograd graph
every step) and ``ddp_comm_hook`` (fp16 / bf16 compression of the all-reduce, or PowerSGD at
``POWERSGD_RANK``, switched on after ``POWERSGD_START`` steps of plain all-reduce).
"""
import os

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.base import COMMON_KNOBS, Backend, build_model, device_for
from bench.core.knobs import Knob

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
POWERSGD_RANK, POWERSGD_START = 2, 2
DDP_KNOBS = (
    Knob("ddp_bucket_mb", "DDP bucket_cap_mb (default 25)", float, low=0),
    Knob("ddp_static_graph", "DDP static_graph=True"),
    Knob("ddp_grad_as_bucket_view", "DDP gradient_as_bucket_view=True"),
    Knob("ddp_find_unused", "DDP find_unused_parameters=True (what the source articles pass; costs a graph walk per "
                            "step)"),
    Knob("ddp_comm_hook", "DDP communication hook: fp16/bf16 compression, or PowerSGD (rank 2, after 2 plain steps)",
         str, choices=COMM_HOOKS),
)
# --ranks-per-gpu N: N ranks share each GPU over gloo, whose all-reduce and broadcast take CUDA tensors (NCCL refuses
# two ranks on one device). The DDP family only (ddp, ddp_spawn, ddp_amp_syncbn, ddp_zero, allreduce_manual): FSDP2,
# DeepSpeed and Horovod keep NCCL. A check of multi-rank logic on a one-GPU machine, not a measurement.
SHARED_GPU = "ranks_per_gpu"
RANKS_PER_GPU = Knob(SHARED_GPU, "CUDA: start N ranks on each GPU, over gloo instead of NCCL (which refuses two ranks "
                                 "on one device); the DDP family only. Checks multi-rank logic on fewer GPUs: not a "
                                 "measurement", int, low=0, off=(None, 1), extra={"metavar": "N"})


class _NoKnobs:
    options: dict = {}


_NO_KNOBS = _NoKnobs()  # a configuration with no knob given: the defaults' keys


class DDP(Backend):
    knobs = (*DDP_KNOBS, RANKS_PER_GPU, *COMMON_KNOBS)
    twin_loop = "ddp"  # bench/twins/ddp.py: DistributedDataParallel at its defaults over a one-rank group

    def unavailable(self, cfg):
        if (cfg.options or {}).get("ddp_comm_hook") == "powersgd" and cfg.device_type == "cpu":
            return ("the PowerSGD hook needs NCCL: over gloo its all-reduces of P and Q mismatch between ranks "
                    "(PyTorch tests it on NCCL only, pytorch/pytorch#58467); run it on CUDA")
        return super().unavailable(cfg)

    def min_warmup(self, cfg):
        least, why = super().min_warmup(cfg)
        if (cfg.options or {}).get("ddp_comm_hook") == "powersgd":
            return max(least, POWERSGD_START + 2), (f"PowerSGD runs plain all-reduce for its first {POWERSGD_START} "
                                                    "steps and compresses from then on")
        return least, why

    def setup(self, cfg):
        self.init_process_group(cfg)
        model = self.prepare_model(cfg, build_model(cfg).to(self.device))
        o = cfg.options or {}
        ddp = DistributedDataParallel(model, device_ids=[self.device.index] if cfg.device_type == "cuda" else None,
                                      **self.ddp_kwargs(cfg))
        register_comm_hook(ddp, o.get("ddp_comm_hook"))
        self.ddp, self.comm_hook = ddp, o.get("ddp_comm_hook") or "none"
        self.init_training(cfg, ddp, cfg.batch_size)

    no_compute_only = None

    def tune_space(self):
        return {"ddp_bucket_mb": (5.0, 100.0), "ddp_grad_as_bucket_view": (True,), "ddp_static_graph": (True,)}

    def ddp_kwargs(self, cfg) -> dict:
        """What DistributedDataParallel is built with: its defaults, but where a knob asks (docs/backends.md, "The
        rule": DDP runs as PyTorch ships it)."""
        o = cfg.options or {}
        return {"bucket_cap_mb": o.get("ddp_bucket_mb"), "static_graph": bool(o.get("ddp_static_graph")),
                "gradient_as_bucket_view": bool(o.get("ddp_grad_as_bucket_view")),
                "find_unused_parameters": bool(o.get("ddp_find_unused"))}

    def library_settings(self, cfg):
        return self.ddp_kwargs(cfg)

    def library_defaults(self):
        import inspect

        signature = inspect.signature(DistributedDataParallel.__init__).parameters
        return {k: signature[k].default for k in self.ddp_kwargs(_NO_KNOBS)}

    def skip_gradient_sync(self):
        return self.ddp.no_sync()  # gradients stay local: no all-reduce in backward

    def describe(self):
        info = super().describe()
        ddp = getattr(self, "ddp", None)
        if ddp is not None:  # what DDP was really built with, read back from it
            info.update(bucket_cap_mb=ddp.bucket_bytes_cap / 2 ** 20, static_graph=ddp.static_graph,
                        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
                        find_unused_parameters=ddp.find_unused_parameters, comm_hook=self.comm_hook)
        return info

    def prepare_model(self, cfg, model):
        """Hook for subclasses (SyncBatchNorm conversion) before the DDP wrapper."""
        return model

    def init_process_group(self, cfg):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        per_gpu = (cfg.options or {}).get(SHARED_GPU) or 1
        self.device = device_for(cfg, self.local_rank // per_gpu)
        if dist.is_initialized():  # one group already (bench overhead sets one up for every backend it times)
            return
        if cfg.device_type == "cuda" and per_gpu == 1:  # bind the NCCL communicator to this rank's GPU up front
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


def register_comm_hook(ddp: DistributedDataParallel, hook: str | None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if hook in (None, "none"):
        return
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                            start_powerSGD_iter=POWERSGD_START)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"unknown DDP comm hook {hook!r}; choose from {', '.join(COMM_HOOKS)}")


"""dp: torch.nn.DataParallel. One process feeds B x N samples to GPU 0, which scatters them to N replicas,
gathers the outputs back and reduces the gradients onto GPU 0 (hence its memory imbalance).

Threads: at two or more GPUs ``parallel_apply`` runs each replica's forward in a new thread, and what is per thread
does not follow it there. Autocast is re-entered with ``torch.amp.autocast(device_type, enabled=...)`` and no dtype,
so under bf16 the replicas would run fp16 (CUDA autocast's default) with no GradScaler; a TorchDispatchMode (the
numerics probe's watch) is not entered at all. ``ReplicaForward`` runs inside each replica: it applies the record's
dtype and enters ``replica_contexts`` (what the harness asks every replica thread to enter) in whatever thread calls
it. On one GPU and on the CPU DataParallel calls the module in the caller's thread.

Knobs: dp refuses --compile and --channels-last (``REFUSED``), so such a run is "skipped" with the reason instead of being
recorded as something it did not run.
"""
import contextlib

import torch

from backends.base import OPTIMIZER_IMPL, Backend, build_model, device_for


class ReplicaForward(torch.nn.Module):
    """Runs ``module`` in the calling thread (a DataParallel replica's) under autocast with an explicit dtype (None:
    autocast off) and inside a context made by each callable in ``contexts``. DataParallel's ``replicate`` copies
    this module's attributes shallowly every step, so every replica holds the same ``contexts`` list."""

    def __init__(self, module: torch.nn.Module, device_type: str, dtype: torch.dtype | None):
        super().__init__()
        self.module, self.device_type, self.dtype = module, device_type, dtype
        self.contexts: list = []

    def forward(self, *args, **kwargs):
        with contextlib.ExitStack() as stack:
            for make in self.contexts:
                stack.enter_context(make())
            with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None):
                return self.module(*args, **kwargs)


# Why dp cannot honour each common knob (one line each, in the skipped run's reason).
REFUSED = {
    # Backend.init_training compiles the bare model, and setup() then wraps the uncompiled one in DataParallel:
    # the run would be recorded as compiled and run eager. Compiling the DataParallel wrapper instead is not
    # possible either: it replicates the module and starts a thread per replica inside every forward.
    "compile": ("dp cannot honour --compile: torch.compile cannot trace nn.DataParallel's per-step replicate "
                "and replica threads, and compiling the inner model would be bypassed (it would run eager)"),
    # replicate() copies parameters with broadcast_coalesced (torch/nn/parallel/comm.py, _broadcast_coalesced in
    # torch/csrc/cuda/comm.cpp), which flattens them and hands replicas 1..N-1 contiguous (NCHW) views: their
    # convolutions would convert every weight on every step, a cost no other backend's channels-last run pays.
    "channels_last": ("dp cannot honour --channels-last: nn.DataParallel's replicate() gives replicas 1..N-1 "
                      "contiguous weights (broadcast_coalesced), so their convolutions would convert every weight "
                      "on every step"),
}


REFUSED_CPU = ("nn.DataParallel cannot parallelise on CPU (it replicates over CUDA devices only); run dp on GPUs, or "
               "ddp/ddp_spawn for several CPU workers")

# cudnn.benchmark off, planned beside the default on several GPUs (Backend.planned_runs)
CUDNN_OFF_NOTE = ("labelled variant with cudnn.benchmark off: cuDNN's benchmark cache is per thread and "
                  "DataParallel runs its replicas in new threads every step")


class DataParallel(Backend):
    knobs = (OPTIMIZER_IMPL,)  # of the common knobs only --optimizer-impl: REFUSED says why not the others

    def world_size_limit(self, device_type):
        if device_type == "cpu":  # one process, no replicas on a CPU: world size 1 only
            return 1, REFUSED_CPU
        return None, ""

    def planned_runs(self, device_type, world_size, cudnn_benchmark):
        runs = super().planned_runs(device_type, world_size, cudnn_benchmark)
        if device_type == "cuda" and world_size >= 2 and cudnn_benchmark is None:
            runs.append((False, CUDNN_OFF_NOTE))
        return runs

    def unavailable(self, cfg):
        if cfg.device_type == "cpu" and cfg.world_size > 1:
            return REFUSED_CPU
        refused = [REFUSED[k] for k in REFUSED if (cfg.options or {}).get(k) not in (None, False)]
        if refused:
            return "; ".join(refused)
        return super().unavailable(cfg)

    def note(self, cfg):
        if cfg.device_type == "cpu":
            return "nn.DataParallel on CPU calls the module directly: no replicas, no scatter/gather"
        return None

    def setup(self, cfg):
        self.device = device_for(cfg, 0)
        self.device_ids = list(range(cfg.world_size)) if cfg.device_type == "cuda" else None
        model = build_model(cfg).to(self.device)
        self.init_training(cfg, model, cfg.batch_size * cfg.world_size)  # scattered from GPU 0
        model = ReplicaForward(model, cfg.device_type, self.autocast_dtype)
        self.replica_contexts = model.contexts
        if self.device_ids:  # on CPU, DataParallel would grab any visible GPU: run the module as it is
            model = torch.nn.DataParallel(model, device_ids=self.device_ids)
        # The global batch comes from this one process and is split across the replicas; the optimizer built
        # above holds the same parameter objects the wrappers call.
        self.model = model

    def devices(self):
        if self.device_ids is None:
            return [self.device]
        return [torch.device("cuda", i) for i in self.device_ids]

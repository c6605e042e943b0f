"""What every backend shares: the contract, the model, the synthetic batch and one training step.

A backend only sets up, steps and tears down. It never times, prints or writes: the harness
(bench/rank/train.py) does that identically for all of them.
"""
from __future__ import annotations

import contextlib

import torch

from backends import models
from bench.core import cuda
from bench.core.config import MIN_WARMUP
from bench.core.knobs import Knob, flag_of

# fp16 needs a GradScaler (its gradients underflow); bf16 has fp32's range and needs none.
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# The optimizers every backend trains with (--optimizer; DeepSpeed and ZeroRedundancyOptimizer wrap the same):
# SGD with momentum, as the source articles train ResNets; AdamW with nanoGPT's GPT-2 settings. The implementation is
# set, not left to torch's per-device default (foreach on CUDA tensors, the per-parameter loop on the CPU): fused, as
# torchtitan runs its optimizers, wherever torch has a fused kernel for the parameters (AdamW and SGD on plain
# tensors, on GPUs and CPUs; AdamW on FSDP2's DTensors, whose aten._fused_adamw_ has a sharding rule), else foreach
# (SGD on DTensors: aten._fused_sgd_ has none). ``--optimizer-impl foreach|fused`` chooses; recorded as
# backend_info.optimizer_impl, read back from the optimizer that steps.
SGD = {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4}
ADAMW = {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
OPTIMIZERS = {"sgd": (torch.optim.SGD, SGD), "adamw": (torch.optim.AdamW, ADAMW)}
# Knobs every backend honours unless it says otherwise (``knobs``); the others are the backends' own, declared in
# their files (bench/core/knobs.py: the planner builds bench run's flags and checks from them).
CHANNELS_LAST = Knob("channels_last", "NHWC model and inputs (torch.channels_last); fsdp2, ds_zero* and ddp_zero keep "
                                      "NCHW parameters (recorded in backend_info.channels_last); on by default for "
                                      "convolutional models in bench run's GPU sweep, --no-channels-last for NCHW",
                     negatable=True)
ACTIVATION_CHECKPOINTING = Knob("activation_checkpointing",
                                "recompute each block's activations in backward instead of keeping them (less memory, "
                                "about one more forward of compute); every backend but dp")
COMPILE = Knob("compile", "torch.compile the (wrapped) model; compiles in warm-up, its time recorded as compile_seconds")
OPTIMIZER_IMPLS = ("foreach", "fused")
OPTIMIZER_IMPL = Knob("optimizer_impl", "the optimizer's implementation: fused or foreach (default: fused wherever "
                                        "torch has a fused kernel for the parameters, else foreach; recorded in "
                                        "backend_info.optimizer_impl)", str, choices=OPTIMIZER_IMPLS)
COMMON_KNOBS = (CHANNELS_LAST, ACTIVATION_CHECKPOINTING, COMPILE, OPTIMIZER_IMPL)
# The phases of a step a trace shows (bench run --trace; bench.core.traces.PHASES: data wait, forward with the loss,
# backward, a backend's own explicit collectives, optimizer step). Outside a trace a phase is a shared do-nothing
# context: no profiler runs.
_NO_PHASE = contextlib.nullcontext()
# The knobs that compress the gradient reduction (DDP's comm hook, Horovod's compression) and their dtypes.
COMPRESSION_KNOBS = ("ddp_comm_hook", "compression")
HALF_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


class Backend:
    """Base class: a single process on one device. Subclasses override ``setup`` and, for several
    processes, ``all_gather``/``all_reduce_sum``/``barrier``/``teardown``."""

    default_precision = "fp32"
    # Whose samples a BatchNorm layer normalises over: "local" (each replica's own share, as dp, ddp and
    # horovod with plain BatchNorm do) or "global" (SyncBatchNorm: the whole global batch). bench verify
    # picks its reference by this.
    batchnorm = "local"
    knobs: tuple[Knob, ...] = COMMON_KNOBS  # the cfg.options this backend honours; any other makes its run "skipped"
    input_dtype = None  # the dtype the model is fed (None: the batch's own); DeepSpeed's fp16/bf16 cast the model
    meta_init = False  # whether cfg.meta_init builds only this rank's shard (FSDP2); otherwise the whole model

    def __init__(self, name: str, launcher: str, **params):
        self.name, self.launcher, self.params = name, launcher, params
        self.rank, self.world_size, self.local_rank = 0, 1, 0

    # -- run in the harness process, before launching: cheap, imports nothing heavy --------------
    def unavailable(self, cfg) -> str | None:
        """Why this backend cannot run ``cfg`` on this machine (a reason and a fix), or None. (A real-data run's
        loader is asked first, by the planner: bench/plan/sweep.py, loader_unavailable.)"""
        if cfg.precision == "fp16" and cfg.device_type == "cpu":
            return "fp16 training needs CUDA (fp16 kernels and GradScaler); use --precision bf16 on CPU"
        if getattr(cfg, "nnodes", 1) > 1 and self.launcher in ("inproc", "spawn"):
            return (f"{self.name} is single-node by design ({'one process' if self.launcher == 'inproc' else 'mp.spawn'}"
                    " starts its ranks on this machine only); run it in a single-node sweep")
        own = {k.key for k in self.knobs}
        foreign = sorted(k for k, v in (cfg.options or {}).items() if k not in own and v not in (None, False))
        if foreign:
            import backends

            return (f"{self.name} cannot honour {', '.join(flag_of(k, backends.knobs()) for k in foreign)} "
                    f"(it honours: {', '.join(sorted(k.flag for k in self.knobs)) or 'none'})")
        return None

    max_world_size: int | None = None  # the largest world size it runs at (single: 1); None: any
    max_world_size_why = ""  # why, for the planner's note (default: "it runs at world size N only")

    def world_size_limit(self, device_type: str) -> tuple[int | None, str]:
        """The largest world size this backend runs at on ``device_type`` (None: any), and why; the planner plans no
        larger and says so."""
        return self.max_world_size, self.max_world_size_why

    def planned_runs(self, device_type: str, world_size: int, cudnn_benchmark: bool | None) -> list[tuple]:
        """The runs a sweep plans of this backend at ``world_size``: (cudnn_benchmark, note) each; ``cudnn_benchmark``
        is the user's (None: not given). One by default; DataParallel adds a labelled variant."""
        return [(cudnn_benchmark, None)]

    def variants(self, precision: str) -> list[tuple[dict, str, bool]]:
        """Labelled variants a sweep plans beside this backend's default run (bench run --variants; the GPU sweep's
        communication-heavy workload): (its options, what it is, whether it is the library's recommended mode). The
        default computes what ``single`` computes (like with like); a recommended mode runs as the library's authors
        set it up, and the verdict ranks it apart (docs/backends.md, "The rule")."""
        return []

    def tune_space(self) -> dict[str, tuple]:
        """The backend's own knobs that change its speed, and the values ``bench tune`` tries beside the default (the
        common ones, batch, channels_last, cuDNN's search and --compile, are tune's): each backend declares its own, so
        a new one brings its search space with it."""
        return {}

    def library_settings(self, cfg) -> dict:
        """What this backend hands its library for ``cfg`` where the library has a default of its own: {setting: value},
        pure (read before anything launches, and by tests/backends/test_fairness.py). docs/backends.md, "The rule":
        every setting that differs from ``library_defaults`` is named in the backend's registry entry (``departs``)
        with its reason, and each run records what differed (``departures``)."""
        return {}

    def library_defaults(self) -> dict:
        """The library's own defaults for the settings ``library_settings`` names, read from the library (its
        signatures, its configuration classes) wherever it says them, so that a release changing one is noticed."""
        return {}

    def departures(self, cfg) -> dict:
        """{setting: {"library": its default, "ours": what this run hands it}} where they differ."""
        ours, theirs = self.library_settings(cfg), self.library_defaults()
        return {k: {"library": theirs[k], "ours": v} for k, v in ours.items() if k in theirs and theirs[k] != v}

    def node_plan(self, nodes, world_size: int) -> str | None:
        """Several nodes: None when this node starts its share of the run (torchrun: every node does), else why not
        (a note); a UsageError when the nodes given cannot hold the run."""
        return None

    @classmethod
    def environment(cls) -> dict:
        """What this backend adds to the record's ``env`` (its build: Horovod's), read once per sweep."""
        return {}

    # bench run --reference: this backend's own plain loop at world size 1 (bench/twins/<twin_loop>.py), or None where
    # it has none short enough to write plainly (it is then compared with the plain loop, single's, as a whole);
    # ``twin_knobs``: its own knobs that loop reproduces (any other of its knobs given: no twin of its own)
    twin_loop: str | None = None
    twin_knobs: tuple[str, ...] = ()

    def twin(self, cfg) -> dict | None:
        """The settings of this backend's own plain loop for ``cfg`` (``name``: the file in bench/twins/, and what it
        must reproduce), or None: none of its own here (no loop written, a knob of its own the loop does not
        reproduce, or --compile, which the backends' loops do not compile as the backend does)."""
        options = cfg.options or {}
        common = {k.key for k in COMMON_KNOBS}
        foreign = [k for k in options if k not in common and k not in self.twin_knobs and options[k] not in
                   (None, False, "none", "default")]
        if self.twin_loop is None or foreign or (options.get("compile") and self.twin_loop != "plain"):
            return None
        return {"name": self.twin_loop, **self.twin_settings(cfg)}

    def twin_settings(self, cfg) -> dict:
        """What this backend's loop must reproduce of ``cfg`` beyond the workload's settings (FSDP2's precision mode
        and reshard policy, DeepSpeed's config)."""
        return {}

    def no_verify_reference(self, precision: str) -> str | None:
        """Why ``bench verify`` has no reference for this backend at ``precision`` (None: it has one)."""
        return None

    def note(self, cfg) -> str | None:
        """Something a reader of the record must know about how this run was done, or None."""
        return None

    def min_warmup(self, cfg) -> tuple[int, str]:
        """The fewest untimed steps that reach steady state for ``cfg``, and why."""
        if (cfg.options or {}).get("compile"):
            return MIN_WARMUP + 1, "torch.compile compiles at step 1 and may recompile at step 2"
        return MIN_WARMUP, ("step 1 pays lazy initialisation and cuDNN's algorithm search, and DDP rebuilds its "
                            "gradient buckets at step 2")

    # -- run in every worker process ---------------------------------------------------------------
    def setup(self, cfg) -> None:
        self.device = device_for(cfg, 0)
        self.init_training(cfg, build_model(cfg).to(self.device), cfg.batch_size)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def devices(self) -> list[torch.device]:
        return [self.device]

    def all_gather(self, obj) -> list:
        return [obj]

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over the ranks (a device tensor of this rank's values)."""
        return tensor

    def full_parameters(self):
        """``(name, tensor)`` for every parameter of the whole model, as this rank can read it. Sharded backends
        (FSDP2, ZeRO-3) override this to gather the full tensors; the replica checksum and verify read
        parameters only through here."""
        return self.module.named_parameters()

    def barrier(self) -> None:
        pass

    # Set by the harness while it traces (bench/rank/trace.py): a name -> context manager that marks a phase range.
    phase_marker = None
    # Where part of the forward runs in threads other than the caller's (DataParallel's replicas, at two or more GPUs):
    # a list of callables, each making a context that every such thread enters around its part (the harness appends
    # the per-thread watches it needs there: the numerics probe's dispatch mode). None: the whole forward runs in the
    # caller's thread.
    replica_contexts: list | None = None

    def phase(self, name: str):
        """Marks one phase of a step (``bench.core.traces.PHASES``) for the trace; a do-nothing context when no trace
        runs."""
        return _NO_PHASE if self.phase_marker is None else self.phase_marker(name)

    def teardown(self) -> None:
        pass

    # -- the compute-only reference (bench/rank/train.py: exposed communication) --------------------------
    def skip_gradient_sync(self):
        """A context manager inside which steps skip this backend's gradient synchronisation, for the
        compute-only reference windows; None when the backend has no way to skip it (``no_compute_only``
        says why). Single-process backends have nothing to skip."""
        return None

    no_compute_only = "one process: no gradient synchronisation to skip"
    compute_only_keeps = None  # what a compute-only window still communicates, when something does

    def loss_scale(self) -> float | None:
        """The current fp16 loss scale, or None without one. Reads a device value (a host sync): the harness
        calls it only outside the timed region."""
        return float(self.scaler.get_scale()) if getattr(self, "scaler", None) is not None else None

    def skipped_steps(self) -> int | None:
        """How many optimizer steps this backend has skipped so far (cumulative), when it counts them itself;
        None, and the harness infers skips from the loss scale (``loss_scale``). A backend whose scaler does not
        halve the scale on every overflow (DeepSpeed's hysteresis) must count here."""
        return None

    def grad_reduce_dtype(self) -> str | None:
        """The dtype gradients cross the wire in. The rule for every backend: fp32 (the parameters' dtype under
        autocast, FSDP2's reduce_dtype, DeepSpeed's communication_data_type) unless a knob asks for compression
        (``--ddp-comm-hook fp16/bf16``, ``--hvd-compression fp16``)."""
        options = getattr(self, "options", None) or {}
        for knob in COMPRESSION_KNOBS:
            if options.get(knob) in HALF_NAMES:
                return HALF_NAMES[options[knob]]
        if options.get("ddp_comm_hook") == "powersgd":
            return "float32 (PowerSGD low-rank factors)"
        return str(next(self.module.parameters()).dtype).removeprefix("torch.")

    # settings that tilt a comparison between backends, shown side by side in the report
    # (bench/report/settings.py)
    compile_mode = "whole model"  # what --compile compiles (FSDP2: each block, as torchtitan does)

    def describe(self) -> dict:
        """What actually ran, for the record (tests and readers check it): the process group's backend, the
        autocast dtype, whether a GradScaler runs, how many SyncBatchNorm layers the model has, the dtype gradients
        are reduced in, and what --compile compiled (None without it)."""
        import torch.distributed as dist

        return {
            "process_group": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
            "autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else None,
            "grad_scaler": self.scaler is not None,
            "sync_batchnorm_layers": sum(isinstance(m, torch.nn.SyncBatchNorm) for m in self.module.modules()),
            "grad_reduce_dtype": self.grad_reduce_dtype(),
            "compile": self.compile_mode if (getattr(self, "options", None) or {}).get("compile") else None,
            "activation_checkpointing_blocks": getattr(self.module, "_bench_checkpointed", 0),
            "channels_last": self.channels_last_info() if (getattr(self, "options", None) or {}).get("channels_last")
            else None,
            "optimizer_impl": optimizer_impl(self.optimizer),
        }

    def channels_last_info(self) -> dict:
        """What --channels-last changed, read from the tensors: the inputs are fed channels-last (bench/rank/data.py);
        ``parameters`` is the memory format of the 4-D parameters this rank holds after the windows (``contiguous``
        where a backend keeps them NCHW: FSDP2 and DeepSpeed flatten or shard them), None where it holds none."""
        formats = set()
        for w in (local(p) for p in unique(self.module.parameters())):
            nhwc, nchw = w.dim() == 4 and w.is_contiguous(memory_format=torch.channels_last), w.is_contiguous()
            if w.dim() == 4 and nhwc != nchw:  # a 1x1 kernel (or one channel) is both: it says nothing
                formats.add("channels_last" if nhwc else "contiguous")
        return {"inputs": True, "parameters": formats.pop() if len(formats) == 1 else ("mixed" if formats else None)}

    def state_bytes(self) -> dict:
        """The training state this rank holds, in bytes, read from its own tensors (after a step): ``parameters``
        (a sharded backend's local shard: FSDP2's DTensor shards, ZeRO-3's partitions), ``gradients`` (None where the
        backend keeps them in buffers of its own: DeepSpeed) and ``optimizer_state`` (the optimizer's state, and a
        backend's own fp32 master copies, of this rank's share). What the memory-size question is about: sharded
        backends hold less of it per rank."""
        params = [local(p) for p in unique(self.module.parameters())]
        grads = [local(p.grad) for p in unique(self.module.parameters()) if p.grad is not None]
        return {"parameters": nbytes(params), "gradients": nbytes(grads),
                "optimizer_state": nbytes(local(t) for t in optimizer_tensors(self.optimizer))}

    # -- the to-accuracy mode's schedule and optimizer settings (bench/rank/accuracy.py) ------------------------------
    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step, written into every param group of ``self.optimizer``. These are the
        groups that step in every backend: DeepSpeed's ZeRO optimizers promote the param groups of the torch optimizer
        inside them (``param_groups`` is a property returning the inner optimizer's, "to adjust the learning rate"),
        ZeroRedundancyOptimizer copies its groups' settings into its inner optimizer at every step, and Horovod's
        DistributedOptimizer is the optimizer. ``stepped_settings`` reads them back from the optimizer that steps."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_optimizer_settings(self, momentum: float | None = None, weight_decay: float | None = None) -> None:
        """Override the optimizer's momentum (SGD's; AdamW's first beta) and weight decay, in the same param groups as
        ``set_lr``; None keeps backends/base.py's SGD or ADAMW settings."""
        for group in self.optimizer.param_groups:
            if momentum is not None:
                if "betas" in group:
                    group["betas"] = (momentum, group["betas"][1])
                else:
                    group["momentum"] = momentum
            if weight_decay is not None:
                group["weight_decay"] = weight_decay

    def stepped_settings(self) -> dict:
        """The learning rate, momentum (or betas) and weight decay of the torch optimizer that actually steps (inside
        DeepSpeed's or ZeroRedundancyOptimizer's wrapper), read from its first param group."""
        inner = inner_optimizer(self.optimizer)
        group = inner.param_groups[0]
        return {"optimizer": type(inner).__name__, "lr": group["lr"], "momentum": group.get("momentum"),
                "betas": list(group["betas"]) if "betas" in group else None, "weight_decay": group["weight_decay"]}

    # -- shared building blocks ----------------------------------------------------------------------
    def init_training(self, cfg, model: torch.nn.Module, feed_batch: int, data_device=None) -> None:
        """Optimizer and precision for ``model``; ``feed_batch`` samples per step arrive on ``data_device``
        (the model's device by default) from ``self.batches``, which the harness sets after setup.

        ``self.model`` is what is called (possibly a wrapper); ``self.module`` is the bare model whose
        parameters the harness checksums.
        """
        self.module = unwrap(model)
        self.options = dict(cfg.options or {})
        # Compiled after wrapping (DDP first, as the PyTorch docs prescribe); compilation happens in warm-up.
        # A backend that compiles its own parts (compile_mode other than "whole model") did so in its setup.
        whole = self.options.get("compile") and self.compile_mode == "whole model"
        self.model = torch.compile(model) if whole else model
        self.optimizer = make_optimizer(cfg, model.parameters())
        self.autocast_dtype = AUTOCAST_DTYPES.get(cfg.precision)
        self.device_type = cfg.device_type
        self.scaler = torch.amp.GradScaler(cfg.device_type) if cfg.precision == "fp16" else None
        self.feed_batch, self.data_device = feed_batch, data_device or self.device
        self.workload = models.for_config(cfg)
        self.batches = None

    def forward_loss(self) -> torch.Tensor:
        with self.phase("data"):
            inputs, targets = next(self.batches)
        with self.phase("forward"), torch.autocast(self.device_type, dtype=self.autocast_dtype,
                                                   enabled=self.autocast_dtype is not None):
            out = self.model(inputs)
            return self.workload.loss(out, targets)

    def step(self) -> torch.Tensor:
        """One forward/backward/optimizer step; returns this rank's loss (a detached device tensor, never read
        inside the timed loop)."""
        loss = self.forward_loss()
        self.optimizer.zero_grad()  # set_to_none by default (torch >= 2.0)
        self.backward(loss)
        self.optimizer_step()
        return loss.detach()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward, through GradScaler's scaling when one runs (fp16)."""
        with self.phase("backward"):
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def optimizer_step(self) -> None:
        """The optimizer step, through GradScaler (which skips it on an overflow) when one runs."""
        with self.phase("optimizer"):
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()


def unique(tensors) -> list:
    out, seen = [], set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank holds: a DTensor's local shard (FSDP2), a ZeRO-3 parameter's partition."""
    if hasattr(t, "ds_tensor"):
        return t.ds_tensor
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor in the state of the torch optimizer inside ``optimizer`` (ZeroRedundancyOptimizer's ``optim``,
    DeepSpeed's ``optimizer``; Horovod's is the optimizer itself)."""
    inner = inner_optimizer(optimizer)
    return unique(v for state in inner.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def inner_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer that steps, inside ZeroRedundancyOptimizer (``optim``) or DeepSpeed's ZeRO optimizer
    (``optimizer``); Horovod's DistributedOptimizer is one itself."""
    inner = optimizer
    for attr in ("optim", "optimizer"):
        while isinstance(getattr(inner, attr, None), torch.optim.Optimizer):
            inner = getattr(inner, attr)
    return inner


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model inside any wrappers (DataParallel, DDP, the autocast wrapper): the one whose parameters
    the harness checksums, with the same parameter names in every backend."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def build_model(cfg) -> torch.nn.Module:
    """The run's model (backends/models: a torchvision classifier, gpt-<size> or the user's) with random weights,
    identical on every rank (seeded)."""
    torch.manual_seed(cfg.seed)
    model = models.for_config(cfg).build()
    if (cfg.options or {}).get("activation_checkpointing"):
        checkpoint_blocks(model)
    return model


def checkpoint_blocks(model: torch.nn.Module) -> int:
    """--activation-checkpointing: each block (backends/models ``find_blocks``) keeps only its input for backward
    and recomputes its activations there. torch's composable ``checkpoint`` (non-reentrant, through hooks) leaves the
    parameter names as they are, and is applied before DDP, FSDP2 (as its documentation orders), DeepSpeed or
    Horovod see the model. Returns the number of blocks."""
    from torch.distributed._composable import checkpoint

    blocks = models.find_blocks(model)
    if not blocks:
        raise ValueError(f"--activation-checkpointing: {type(model).__name__} has no blocks to checkpoint (a "
                         "transformer's layers, a ResNet's residual blocks, or your factory's `blocks`)")
    for block in blocks:
        checkpoint(block)
    model._bench_checkpointed = len(blocks)  # for describe()
    return len(blocks)


def contiguous_parameters(model: torch.nn.Module, cfg) -> torch.nn.Module:
    """Under --channels-last, the parameters back in the default (NCHW) layout, for the backends that cannot hold
    channels-last parameters: FSDP2's fully_shard refuses them ("FSDP does not support non-contiguous parameters
    yet"), DeepSpeed views each one as bytes to broadcast it and flattens or partitions them all. The inputs, and so
    the activations, stay channels-last: cuDNN and oneDNN take the NHWC path when either operand of a convolution is
    channels-last. ``describe()`` records the parameters' layout as it was after the windows."""
    if (cfg.options or {}).get("channels_last"):
        model = model.to(memory_format=torch.contiguous_format)
    return model


def make_optimizer(cfg, params, cls=None):
    """The run's optimizer (``cfg.optimizer``: sgd or adamw, at the settings above) over ``params``, in the
    implementation ``implementation`` picks; ``cls`` only for ZeroRedundancyOptimizer, which takes the class and its
    arguments apart."""
    params = list(params)
    optimizer, settings = OPTIMIZERS[cfg.optimizer or "sgd"]
    impl = implementation(cfg.optimizer or "sgd", params, (cfg.options or {}).get("optimizer_impl"))
    settings = {**settings, impl: True}
    return (cls or optimizer)(params, **({"optimizer_class": optimizer} if cls else {}), **settings)


def implementation(optimizer: str, params: list, asked: str | None = None) -> str:
    """The optimizer implementation a run uses: ``asked`` (--optimizer-impl) when given, else fused wherever torch has
    a fused kernel for ``params`` (the module comment above), else foreach."""
    if asked:
        return asked
    dtensors = any(hasattr(p, "placements") for p in params if isinstance(p, torch.Tensor))
    return "foreach" if optimizer == "sgd" and dtensors else "fused"


def optimizer_impl(optimizer) -> str:
    """What the torch optimizer that steps runs: fused, foreach or for-loop, read from its first param group, whose
    settings its step reads (Horovod's DistributedOptimizer is built from the param groups, its defaults the class's)."""
    inner = inner_optimizer(optimizer)
    group = inner.param_groups[0] if inner.param_groups else inner.defaults
    return "fused" if group.get("fused") else "foreach" if group.get("foreach") else "for-loop"


def device_for(cfg, local_index: int) -> torch.device:
    if cfg.device_type == "cuda":
        cuda.set_device(local_index)
        return torch.device("cuda", local_index)
    return torch.device("cpu")

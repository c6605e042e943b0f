"""ds_zero1, ds_zero2, ds_zero3: DeepSpeed ZeRO stages 1-3 through ``deepspeed.initialize``, under torchrun
(DeepSpeed reads the torchrun environment; the process group is ours, NCCL or gloo).

Stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters (gathered per
layer for forward and backward). The config is built from the run: micro-batch = the per-device batch,
gradient accumulation 1, ``train_batch_size`` = micro-batch x world size (DeepSpeed asserts the product), the
suite's optimizer (``zero_allow_untested_optimizer``; fused where torch has it, as every backend: backends/base.py),
no gradient clipping (DeepSpeed's default clips the norm to 1.0, which no other backend does). On CPU,
``DS_ACCELERATOR=cpu`` and ``PYTORCH_NVML_BASED_CUDA_CHECK=0`` (``cpu_environment``): ``import deepspeed`` sets the
latter to 1 (so that ``torch.cuda.is_available()`` asks NVML instead of initialising CUDA before a fork), and on a
machine with no NVML every such call, several per training step, then tries to load libnvidia-ml again: a few hundred
µs a step on the CPU, charged to whatever trains in the process, that no GPU run pays (CUDA is initialised there and
torch caches the device count). Also on CPU, not DeepSpeed's shared-memory collective (``no_shm_collective``): it is
compiled at its first use in an environment (40 s) and serves inference only.

Precision, ``--ds-mp`` (recorded as ``backend_info.mixed_precision``):

- ``autocast`` (the default): what ``single`` computes. DeepSpeed's ``torch_autocast`` section: fp32 parameters and
  optimizer, ``torch.autocast`` at the run's precision around the engine's forward (engine.py
  ``autocast_if_enabled``), fp16 through a GradScaler of DeepSpeed's own. Its ``lower_precision_safe_modules`` is
  given empty: by default DeepSpeed marks every Linear and Conv parameter to be reduced in the autocast dtype
  (torch_autocast.py ``comm_dtype``), where every other backend reduces fp32 gradients. The loss is computed under the
  same autocast, as single computes it: on CUDA autocast runs cross-entropy's log_softmax in the half dtype on the
  half logits (measured on an H100, torch 2.11), where a loss on ``.float()`` logits outside it (this backend until
  the H100 showed the difference) runs in fp32, on a float32 copy of the logits (1.6 GB for gpt-350m's 8 x 1024 x
  50,304).
- ``params``: DeepSpeed's fp16 / bf16 sections, which cast the whole model, BatchNorm included, to the half type and
  keep fp32 master weights in the optimizer: DeepSpeed's own mixed precision, a different numerics signature
  (norms and residual in the half dtype).

Buckets: DeepSpeed's reduce and all-gather buckets default to 5e8 elements, and ZeRO allocates its gradient
bucket at that size on every rank (2 GB at fp32; two with ``overlap_comm`` at stages 1-2) whatever the model: a
per-GPU memory figure would then be mostly an empty buffer, and ZeRO would look heavier than DDP. Both are
sized like DDP's buckets instead, 25 MiB of fp32 elements, or ``--ds-bucket-mb``; recorded as
``bucket_elements``.

Other defaults set on purpose, each read back into ``backend_info``: gradients reduced in fp32
(``communication_data_type``, as every backend without a compression knob), ``overlap_comm`` on at every stage
(as DDP overlaps), no global gradient norm at stages 1-2 (``compute_grad_norm``; nothing uses it with clipping
off), and the throughput timer off (it synchronizes the device twice a step). Skipped fp16 steps are DeepSpeed's
own count (``engine.skipped_steps``), not read off the loss scale.
"""
from __future__ import annotations

import logging
import os

import torch

from backends import models
from backends.base import (ACTIVATION_CHECKPOINTING, AUTOCAST_DTYPES, CHANNELS_LAST, HALF_NAMES, OPTIMIZER_IMPL,
                           build_model, contiguous_parameters, make_optimizer)
from backends.ddp import DDP
from bench.core.knobs import Knob

INSTALL = "pip install deepspeed (make install does)"
DEFAULT_BUCKET_MB = 25  # DDP's bucket_cap_mb default


def problem() -> str | None:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a missing or broken install is a skip reason, never a crash
        return f"deepspeed does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {INSTALL}"
    return None


DS_BUCKET_MB = Knob("ds_bucket_mb", "DeepSpeed reduce and all-gather buckets, MiB of fp32 elements (default 25, DDP's; "
                                    "DeepSpeed's own 5e8 elements would allocate 1907 MiB per bucket on every rank)",
                    float, low=0)


DS_PREFETCH_MB = Knob("ds_prefetch_mb", "ZeRO-3: parameters fetched ahead of use, MiB of fp32 elements "
                                        "(stage3_prefetch_bucket_size; DeepSpeed's default 5e7 elements, 191 MiB)",
                       float, low=0)


MIXED_PRECISION = {"autocast": "torch_autocast (fp32 parameters, fp32 gradient reduction)",
                   "params": "fp16/bf16 sections (half parameters, fp32 master weights, fp32 gradient reduction)"}
DS_MP = Knob("ds_mp", "DeepSpeed at bf16/fp16: autocast (default: its torch_autocast section, fp32 parameters, as "
                      "single computes) or params (its fp16/bf16 sections: half parameters, fp32 master weights, norms "
                      "and residual in the half dtype)", str, choices=tuple(MIXED_PRECISION),
             off=(None, False, "none", "autocast"))


def cpu_environment() -> None:
    """DeepSpeed on a CPU: its CPU accelerator, and torch's own CUDA check instead of the NVML one ``import deepspeed``
    asks for (module docstring). Before deepspeed is imported; a value the user set stays."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "0")


SHM_COLLECTIVE = "deepspeed_shm_comm"


def no_shm_collective() -> None:
    """DeepSpeed on a CPU, before ``deepspeed.initialize``: without its shared-memory collective. Its communication
    backend (deepspeed/comm/torch.py, ``build_shm_op``) compiles that op with torch's JIT extension loader the first time
    an environment runs DeepSpeed on a CPU (40 s of g++ on 2 cores, and a compiler and ninja needed at run time), and
    uses it only in ``inference_all_reduce`` (tensor-parallel inference, module_inject), which training never calls:
    every collective of a ZeRO step goes through torch.distributed with or without it. ``build_shm_op`` builds it only
    where DeepSpeed's table of compatible ops says so (``deepspeed.ops.__compatible_ops__``, computed once a process and
    kept), so it is marked incompatible there."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_COLLECTIVE] = False


class DeepSpeedZero(DDP):
    # DeepSpeed compiles through its own engine.compile(), not offered here
    knobs = (DS_BUCKET_MB, DS_MP, DS_PREFETCH_MB, CHANNELS_LAST, ACTIVATION_CHECKPOINTING, OPTIMIZER_IMPL)

    no_compute_only = ("DeepSpeed's no_sync forbids engine.step() inside it and is incompatible with ZeRO-2/3's "
                       "gradient partitioning")
    twin_loop, twin_knobs = "ds_zero", ("ds_bucket_mb", "ds_mp")  # bench/twins/ds_zero.py: the engine's own loop

    def twin_settings(self, cfg):
        return {"config": self.config(cfg, 1)[2]}  # the twin trains at world size 1

    def no_verify_reference(self, precision: str) -> str | None:
        """bench verify runs the default, autocast, which its single reference reproduces; --ds-mp params is never
        verified (no reference here trains half-precision weights with fp32 master copies)."""
        return None

    def skip_gradient_sync(self):
        return None

    def tune_space(self):
        return {"ds_bucket_mb": (5.0, 100.0), **({"ds_prefetch_mb": (25.0, 400.0)} if self.stage == 3 else {})}

    def variants(self, precision):
        if precision not in ("bf16", "fp16"):
            return []
        return [({"ds_mp": "params"}, f"as DeepSpeed's documentation runs it: its {precision} section (half parameters, "
                                      "fp32 master weights)", True)]

    def __init__(self, name, launcher, stage: int):
        super().__init__(name, launcher)
        self.stage = stage

    def unavailable(self, cfg):
        if cfg.device_type == "cpu":
            cpu_environment()  # before deepspeed is imported
        if (cfg.options or {}).get("ds_prefetch_mb") is not None and self.stage != 3:
            return f"{self.name} cannot honour --ds-prefetch-mb: only ZeRO-3 fetches parameters ahead of use"
        return problem() or super().unavailable(cfg) or self.scaler_disagrees(cfg)

    def scaler_disagrees(self, cfg) -> str | None:
        """Why this stage's fp16 loss scaling would differ between ranks for ``cfg``, or None. Under the torch_autocast
        section at fp16, stages 1-2 step a GradScaler of DeepSpeed's own on this rank's fp32 partition alone
        (stage_1_and_2.py ``_optimizer_step``; the all-reduced overflow check runs only for the fp16 section): an
        overflow in one rank's partition makes that rank skip and halve its scale while the others step on, and the
        next gradients are summed at different scales. Stage 3 checks every rank's partition (all-reduced) before its
        GradScaler runs, so its ranks agree (tests/test_loss_scale.py)."""
        autocast = ((cfg.options or {}).get("ds_mp") or "autocast") == "autocast"
        if cfg.precision != "fp16" or not autocast or self.stage == 3 or cfg.world_size < 2:
            return None
        from importlib.metadata import version

        return (f"{self.name} at fp16 under --ds-mp autocast runs at world size 1 only: DeepSpeed {version('deepspeed')}"
                "'s torch_autocast GradScaler looks for an overflow in this rank's gradient partition alone, so one "
                "rank skips a step and halves its loss scale while another steps on; use --ds-mp params (DeepSpeed's "
                "fp16 section: one overflow check over every rank) or --precision bf16")

    def setup(self, cfg):
        if cfg.device_type == "cpu":
            cpu_environment()
        import deepspeed

        if cfg.device_type == "cpu":
            no_shm_collective()
        deepspeed.utils.logger.setLevel(logging.WARNING)  # the harness prints; DeepSpeed's INFO lines go nowhere
        self.init_process_group(cfg)
        model = contiguous_parameters(build_model(cfg).to(self.device), cfg)  # DeepSpeed views them as bytes
        self.bucket_elements, self.mixed_precision, config = self.config(cfg, self.world_size)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(cfg, model.parameters()),
                                                       config=config, dist_init_required=False)
        self.engine = self.model = engine
        self.module, self.optimizer = engine.module, optimizer
        self.buffers_cast = self._half_norm_buffers()
        self.autocast_dtype, self.scaler = None, None  # DeepSpeed casts the model and scales the loss itself
        # the loss under the engine's autocast (module docstring), as single computes it; the half-parameter sections
        # compute it on float32 logits
        self.loss_autocast = AUTOCAST_DTYPES[cfg.precision] if config["torch_autocast"]["enabled"] else None
        self.device_type, self.feed_batch, self.data_device = cfg.device_type, cfg.batch_size, self.device
        self.options = dict(cfg.options or {})
        sections = config[cfg.precision]["enabled"] if cfg.precision in AUTOCAST_DTYPES else False
        self.input_dtype = AUTOCAST_DTYPES[cfg.precision] if sections else torch.float32
        self.workload = models.for_config(cfg)

    def config(self, cfg, world_size: int) -> tuple[int, str, dict]:
        """The DeepSpeed config of ``cfg`` at ``world_size`` (with its bucket size in elements and the mixed precision
        mode): what setup hands deepspeed.initialize, and what this backend's plain twin reads (bench/twins/ds_zero.py,
        as a DeepSpeed script reads its ds_config.json)."""
        bucket_elements = int(((cfg.options or {}).get("ds_bucket_mb") or DEFAULT_BUCKET_MB) * 2 ** 20 // 4)
        mixed_precision = (cfg.options or {}).get("ds_mp") or "autocast"
        half = cfg.precision in AUTOCAST_DTYPES
        sections = mixed_precision == "params" and half  # DeepSpeed's fp16/bf16 sections: half parameters
        return bucket_elements, mixed_precision, {
            "train_batch_size": cfg.batch_size * world_size,
            "train_micro_batch_size_per_gpu": cfg.batch_size,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": self.stage, "reduce_bucket_size": bucket_elements,
                                  "allgather_bucket_size": bucket_elements,
                                  # off by default at stages 1-2 (zero/config.py overlap_comm_valid); DDP overlaps
                                  "overlap_comm": True,
                                  # the global norm exists for clipping, which is off; stages 1-2 can skip it
                                  # (stage_1_and_2.py step()); stage 3 has no switch (config.py refuses it)
                                  **({"compute_grad_norm": False} if self.stage in (1, 2) else {}),
                                  **({"stage3_prefetch_bucket_size": int((cfg.options or {})["ds_prefetch_mb"] * 2 ** 20
                                                                         // 4)}
                                     if (cfg.options or {}).get("ds_prefetch_mb") is not None else {})},
            # fp32 on the wire, as DDP under autocast and FSDP2 (reduce_dtype) do; DeepSpeed's default is the
            # model dtype (engine.py communication_data_type), half the bytes of every other backend
            "communication_data_type": "fp32",
            # the throughput timer is on and synchronizes the device at its start and stop of every step
            # (utils/timer.py ThroughputTimer; utils/config.py DeepSpeedThroughputTimerConfig defaults)
            "timers": {"throughput": {"enabled": False, "synchronized": False}},
            "zero_allow_untested_optimizer": True,
            # DeepSpeed 0.19 clips the gradient norm to 1.0 unless told otherwise (GRADIENT_CLIPPING_DEFAULT):
            # no other backend clips, and with it DeepSpeed trained a different model (bench verify found it)
            "gradient_clipping": 0.0,
            "fp16": {"enabled": sections and cfg.precision == "fp16", "initial_scale_power": 16},
            "bf16": {"enabled": sections and cfg.precision == "bf16"},
            # autocast over fp32 parameters, as single; no parameter marked for a half-precision reduction
            "torch_autocast": {"enabled": half and not sections, "dtype": HALF_NAMES.get(cfg.precision, "float32"),
                               "lower_precision_safe_modules": []},
            "steps_per_print": 2 ** 31 - 1,
            "wall_clock_breakdown": False,
        }

    def library_settings(self, cfg):
        """The parts of the DeepSpeed config (``config``) that DeepSpeed has defaults for, as dotted names."""
        c = self.config(cfg, max(2, cfg.world_size))[2]
        z = c["zero_optimization"]
        out = {"zero_optimization.reduce_bucket_size": z["reduce_bucket_size"],
               "zero_optimization.allgather_bucket_size": z["allgather_bucket_size"],
               "zero_optimization.overlap_comm": z["overlap_comm"],
               "communication_data_type": c["communication_data_type"], "gradient_clipping": c["gradient_clipping"],
               "timers.throughput.enabled": c["timers"]["throughput"]["enabled"],
               "timers.throughput.synchronized": c["timers"]["throughput"]["synchronized"],
               "torch_autocast.lower_precision_safe_modules": c["torch_autocast"]["lower_precision_safe_modules"],
               "steps_per_print": c["steps_per_print"], "wall_clock_breakdown": c["wall_clock_breakdown"],
               "zero_allow_untested_optimizer": c["zero_allow_untested_optimizer"]}
        if "compute_grad_norm" in z:
            out["zero_optimization.compute_grad_norm"] = z["compute_grad_norm"]
        return out

    def library_defaults(self):
        from deepspeed.runtime import constants
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        from deepspeed.utils.config import DeepSpeedThroughputTimerConfig

        zero, timer = DeepSpeedZeroConfig(stage=self.stage), DeepSpeedThroughputTimerConfig()
        return {"zero_optimization.reduce_bucket_size": zero.reduce_bucket_size,
                "zero_optimization.allgather_bucket_size": zero.allgather_bucket_size,
                "zero_optimization.overlap_comm": zero.overlap_comm,
                "zero_optimization.compute_grad_norm": zero.compute_grad_norm,
                "communication_data_type": constants.COMMUNICATION_DATA_TYPE_DEFAULT,
                "gradient_clipping": constants.GRADIENT_CLIPPING_DEFAULT,
                "timers.throughput.enabled": timer.enabled, "timers.throughput.synchronized": timer.synchronized,
                "torch_autocast.lower_precision_safe_modules": None,  # DeepSpeed's list of Linear and Conv modules
                "steps_per_print": constants.STEPS_PER_PRINT_DEFAULT,
                "wall_clock_breakdown": constants.WALL_CLOCK_BREAKDOWN_DEFAULT,
                "zero_allow_untested_optimizer": constants.ZERO_ALLOW_UNTESTED_OPTIMIZER_DEFAULT}

    def _half_norm_buffers(self) -> int:
        """DeepSpeed >= 0.19 casts the parameters only and keeps buffers fp32, so BatchNorm met half weights with fp32
        running statistics, which its kernels refuse ("expected scalar type BFloat16 but found Float"): every fp16
        and bf16 run failed. Give the running statistics their layer's dtype, as the whole-module cast of earlier
        DeepSpeed releases did. Returns the number of buffers cast (0 where DeepSpeed already cast them)."""
        cast = 0
        for m in self.module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.weight is not None:
                for name in ("running_mean", "running_var"):
                    buf = getattr(m, name)
                    if buf is not None and buf.dtype != m.weight.dtype:
                        setattr(m, name, buf.to(m.weight.dtype))
                        cast += 1
        return cast

    def state_bytes(self):
        """ZeRO's own accounting: the optimizer state and the fp32 master partitions it keeps beside the model's
        parameters (stages 1-2: ``single_partition_of_fp32_groups``; stage 3: ``fp32_partitioned_groups_flat``);
        its gradients live in its own buffers (not counted)."""
        from backends.base import local, nbytes, optimizer_tensors, unique

        masters = list(getattr(self.optimizer, "single_partition_of_fp32_groups", None)
                       or getattr(self.optimizer, "fp32_partitioned_groups_flat", None) or [])
        params = [local(p) for p in unique(self.module.parameters())]
        return {"parameters": nbytes(params), "gradients": None,
                "optimizer_state": nbytes(unique(optimizer_tensors(self.optimizer) + masters))}

    def forward_loss(self):
        with self.phase("data"):
            inputs, targets = next(self.batches)
        with self.phase("forward"), torch.autocast(self.device_type, dtype=self.loss_autocast,
                                                   enabled=self.loss_autocast is not None):
            if inputs.is_floating_point():  # images; token ids stay integers
                inputs = inputs.to(self.input_dtype)
            out = self.engine(inputs)
            return self.workload.loss(out if self.loss_autocast is not None else out.float(), targets)

    def step(self):
        loss = self.forward_loss()
        with self.phase("backward"):
            self.engine.backward(loss)
        with self.phase("optimizer"):
            self.engine.step()  # optimizer step and zero_grad
        return loss.detach()

    def autocast_scaler(self):
        """The GradScaler DeepSpeed's ZeRO optimizer runs under torch_autocast at fp16, else None."""
        return getattr(self.optimizer, "torch_autocast_gradscaler", None)

    def loss_scale(self):
        if self.autocast_scaler() is not None:
            return float(self.autocast_scaler().get_scale())
        return float(self.optimizer.cur_scale) if getattr(self.engine, "fp16_enabled", lambda: False)() else None

    def skipped_steps(self):
        """DeepSpeed's own count of overflowed (skipped) steps (engine.py step(): ``skipped_steps += 1`` on
        overflow). Its fp16 loss scaler halves the scale only after ``hysteresis`` (2) overflows in a row, so the
        scale ratio that counts GradScaler's skips misses some here. Under torch_autocast at stages 1-2 a GradScaler
        skips and halves its scale on every overflow, which the harness reads off the scale: None. At stage 3 the
        engine's all-reduced check skips the step before the GradScaler sees it, and the GradScaler's scale is never
        lowered (DeepSpeed 0.19's stage3.py ``step``): the engine's count is the only one."""
        if self.autocast_scaler() is not None and self.stage < 3:
            return None
        return int(self.engine.skipped_steps)

    def grad_reduce_dtype(self):
        return str(self.engine.communication_data_type).removeprefix("torch.")

    def describe(self):
        info = super().describe()
        timer = self.engine.tput_timer.config
        param_dtype = str(next(self.module.parameters()).dtype).removeprefix("torch.")
        info.update(zero_stage=self.stage, param_dtype=param_dtype,
                    grad_scaler=self.loss_scale() is not None, norm_buffers_cast=self.buffers_cast,
                    autocast_dtype=str(self.engine.torch_autocast_dtype()).removeprefix("torch.")
                    if self.engine.torch_autocast_enabled() else None,
                    mixed_precision=MIXED_PRECISION[self.mixed_precision] if param_dtype != "float32"
                    or self.engine.torch_autocast_enabled() else None,
                    # what DeepSpeed took from the config, read back from the engine and its ZeRO optimizer
                    bucket_elements=int(self.optimizer.reduce_bucket_size),
                    # stage 3's optimizer keeps no attribute: it got the engine's setting (engine.py)
                    overlap_comm=bool(getattr(self.optimizer, "overlap_comm", self.engine.zero_overlap_comm())),
                    grad_norm="computed" if getattr(self.optimizer, "compute_grad_norm", True) else "skipped",
                    throughput_timer=("synchronized" if timer.synchronized else "on") if timer.enabled else "off",
                    wall_clock_breakdown=bool(self.engine.wall_clock_breakdown()))
        return info

    def full_parameters(self):
        """Whole parameters: under ZeRO-3 each rank holds a partition, gathered here (a collective, in order)."""
        if self.stage < 3:
            yield from self.module.named_parameters()
            return
        import deepspeed

        for name, p in self.module.named_parameters():
            with deepspeed.zero.GatheredParameters([p]):
                yield name, p.detach().clone()

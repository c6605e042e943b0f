"""fsdp2: PyTorch's fully sharded data parallelism (``torch.distributed.fsdp.fully_shard``) under torchrun.

Parameters, gradients and optimizer state are sharded over the ranks; each block all-gathers its parameters
for forward and backward and reduce-scatters its gradients. ``fully_shard`` is applied per block (for ResNets
each BasicBlock/Bottleneck; for other models each direct child that holds parameters), then to the root, as
the PyTorch FSDP2 tutorial and torchtitan do.

Precision, ``--fsdp-mp`` (recorded as ``backend_info.mixed_precision``):

- ``autocast`` (the default): what ``single`` computes. fp32 parameters (no ``MixedPrecisionPolicy``: its
  ``param_dtype`` None keeps the sharded parameters' dtype), ``torch.autocast`` at the run's precision around the
  forward, so matmuls run in bf16/fp16 while norms, softmax and the residual stream stay fp32, and gradients, fp32
  like the parameters, are reduced in fp32. The record's ``numerics`` signature is single's (tests/test_numerics.py).
- ``params``: ``MixedPrecisionPolicy`` with bf16/fp16 parameters for the all-gather and compute (torchtitan's
  default), fp32 gradient reduction, fp32 logits from the root. Its all-gather moves half the bytes at N >= 2, and
  norms and the residual stream run in the half dtype: a different numerics signature, compared only with backends
  that compute the same way. BatchNorm in a low-precision parameter dtype is a known pitfall (its statistics and
  affine parameters lose precision), so BatchNorm's parameters stay in fp32: through the policy's
  ``param_dtype_override_fn`` where torch has it, else (torch 2.14 and older) through one fp32 ``fully_shard`` group
  per block holding that block's BatchNorm layers (one more all-gather per block, not per layer; the norms outside
  any block form one more group), recorded as ``norm_fp32_via``.

fp16 adds a GradScaler (CUDA only) in both. The optimizer runs on the DTensor shards: fused AdamW (torch has a
sharding rule for ``aten._fused_adamw_``), foreach SGD (``aten._fused_sgd_`` has none, so ``--optimizer-impl fused``
with SGD is refused before launch).

``--compile`` compiles each block before it is sharded, as torchtitan does (``module.compile()``), not the
whole wrapped model, where FSDP's hooks break the graph at every block; recorded as ``compile: "per block"``.

Resharding after forward (torchtitan's ``apply_fsdp``): at world size 1 never, since a one-rank "shard" is the whole
parameter and resharding only buys a second copy-in per group in backward; on several ranks every block reshards
except the last, which backward needs first (FSDP2 would all-gather it again at once), and the root keeps FSDP2's
default (no reshard); ``--fsdp-reshard never|always`` overrides it (for ``bench tune``, which tries both). Prefetching is FSDP2's implicit one (backward all-gathers the next block while this one
computes). Each FSDP2 group costs host time per step whatever its size (its hooks, copy-in and copy-out: about 0.2 ms
a group on a 2-core CPU, ``bench overhead``), which is why the norm groups below are no more than needed. Recorded in
``backend_info``: the groups, the reshard policy, the prefetch, the optimizer's implementation.

The compute-only windows run under ``set_requires_gradient_sync(False)``: FSDP2 then accumulates the unsharded
gradients and leaves the sharded ``.grad`` None (``_fsdp_param_group.py`` post_backward), so the optimizer step
had nothing to update and GradScaler refused it ("No inf checks were recorded for this optimizer"). There, each
sharded parameter gets a local zero gradient before the step (no communication), so the step does the same
arithmetic as a real one; the compute-only weights are never read. The unsharded gradients FSDP2 kept are dropped
after each such step: kept, they would hold the whole model's gradients through the compute-only windows (a
``--find-max-model`` probe could run out of memory there after its real steps fitted) and accumulate step over step,
which a real step does not.
"""
import contextlib
import dataclasses

import torch

from backends import models
from backends.base import COMMON_KNOBS, build_model, contiguous_parameters
from backends.ddp import DDP
from bench.core.knobs import Knob

# --fsdp-reshard: what reshards its parameters after forward. default: reshard_policy (never at world size 1, else every
# block but the last); never: every block keeps its unsharded parameters from forward to backward (more memory, no
# all-gather in backward); always: every block reshards, the last included (least memory).
RESHARD = {"never": "never", "always": "every block", "default": None}
# --fsdp-mp: how bf16/fp16 is run (module docstring): autocast over fp32 parameters (default), or half parameters
MIXED_PRECISION = {"autocast": "autocast (fp32 parameters, fp32 gradient reduction)",
                   "params": "MixedPrecisionPolicy (half parameters, fp32 gradient reduction)"}
FSDP_MP = Knob("fsdp_mp", "fsdp2 at bf16/fp16: autocast (default: fp32 parameters under autocast, as single computes) "
                          "or params (MixedPrecisionPolicy: half parameters, half the all-gather bytes, norms and "
                          "residual in the half dtype)", str, choices=tuple(MIXED_PRECISION),
               off=(None, False, "none", "autocast"))
FSDP_GROUP = Knob("fsdp_blocks_per_group", "fsdp2: blocks sharded together as one FSDP2 group (default 1: each block "
                                           "its own, as torchtitan does); fewer groups mean fewer all-gathers and less "
                                           "host work a step, more memory held at once", int, low=0)
FSDP_RESHARD = Knob("fsdp_reshard", "fsdp2: which blocks reshard their parameters after forward: never, always, or "
                                    "default (never at world size 1, else every block but the last, as torchtitan)",
                    str, choices=tuple(RESHARD), off=(None, False, "none", "default"))


def has_param_dtype_override() -> bool:
    """Whether this torch's MixedPrecisionPolicy can keep chosen parameters fp32 (newer than 2.14)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return "param_dtype_override_fn" in {f.name for f in dataclasses.fields(MixedPrecisionPolicy)}


class FSDP2(DDP):
    knobs = (FSDP_MP, FSDP_RESHARD, FSDP_GROUP, *COMMON_KNOBS)  # DDP's process-group plumbing, none of its knobs

    def tune_space(self):
        return {"fsdp_reshard": ("never", "always"), "fsdp_blocks_per_group": (2, 4)}

    def unavailable(self, cfg):
        if (cfg.options or {}).get("optimizer_impl") == "fused" and cfg.optimizer == "sgd":
            return ("fsdp2 cannot run fused SGD: torch has no DTensor sharding rule for aten._fused_sgd_ (it has one "
                    "for _fused_adamw_); use --optimizer-impl foreach, or --optimizer adamw")
        return super().unavailable(cfg)
    compile_mode = "per block"
    meta_init = True

    def variants(self, precision):
        if precision not in ("bf16", "fp16"):
            return []  # fp32: no half parameters to choose
        return [({"fsdp_mp": "params"}, f"as torchtitan runs it: {precision} parameters for the all-gather and compute, "
                                        "fp32 gradient reduction", True)]  # --find-max-model's probes build on the meta device (setup)
    twin_loop, twin_knobs = "fsdp2", ("fsdp_mp", "fsdp_reshard")  # bench/twins/fsdp2.py: torchtitan's apply_fsdp

    def library_settings(self, cfg):
        o = cfg.options or {}
        return {"reshard_after_forward": RESHARD.get(o.get("fsdp_reshard")) or reshard_policy(cfg.world_size)}

    def library_defaults(self):
        import inspect

        from torch.distributed.fsdp import fully_shard

        default = inspect.signature(fully_shard).parameters["reshard_after_forward"].default
        # None and True: every group reshards after forward (the root is kept: it is needed first in backward)
        return {"reshard_after_forward": "every block" if default in (None, True) else str(default)}

    def twin_settings(self, cfg):
        o = cfg.options or {}
        return {"mp": o.get("fsdp_mp") or "autocast", "reshard": RESHARD.get(o.get("fsdp_reshard")) or reshard_policy(1)}

    def setup(self, cfg):
        from torch.distributed.device_mesh import init_device_mesh

        self.init_process_group(cfg)
        if cfg.meta_init:  # --find-max-model: never the whole model in this rank's host or device memory
            with torch.device("meta"):
                model = build_model(cfg)
        else:
            model = build_model(cfg).to(self.device)
        model = contiguous_parameters(model, cfg)  # fully_shard refuses channels-last parameters
        mesh = init_device_mesh(cfg.device_type, (self.world_size,))
        self.mixed_precision = (cfg.options or {}).get("fsdp_mp") or "autocast"
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        dtype = half if self.mixed_precision == "params" else None  # the parameters' dtype in compute
        self.reshard = RESHARD.get((cfg.options or {}).get("fsdp_reshard")) or reshard_policy(self.world_size)
        self.per_group = (cfg.options or {}).get("fsdp_blocks_per_group") or 1
        self.norm_fp32_via, self.groups = shard(model, mesh, dtype, compile=bool((cfg.options or {}).get("compile")),
                                                reshard=self.reshard, per_group=self.per_group)
        self.init = "meta device, each rank's shard materialised" if cfg.meta_init else "seeded, whole model per rank"
        if cfg.meta_init:
            model.to_empty(device=self.device)
            materialise(model)
        self.init_training(cfg, model, cfg.batch_size)  # compile_mode "per block": the root is not compiled again
        if dtype is not None:
            self.autocast_dtype = None  # the policy casts; autocast on top would cast again
        self.param_dtype = dtype
        self.compute_only = False
        self.zero_grads = None

    compute_only_keeps = "the per-block parameter all-gathers of forward and backward (only the gradient reduce-scatter is skipped)"

    def skip_gradient_sync(self):
        model = self.module

        @contextlib.contextmanager
        def local():
            model.set_requires_gradient_sync(False)  # FSDP2's no_sync: no reduce-scatter of the gradients
            self.compute_only = True
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
                self.compute_only = False

        return local()

    def step(self):
        if not self.compute_only:
            return super().step()
        loss = self.forward_loss()
        self.optimizer.zero_grad()
        self.backward(loss)
        if self.zero_grads is None:  # made once: the shard-shaped local zeros (DTensor zeros_like: no collective)
            self.zero_grads = [torch.zeros_like(p) for p in self.module.parameters()]
        for p, zero in zip(self.module.parameters(), self.zero_grads):
            if p.grad is None:
                p.grad = zero
        self.optimizer_step()
        drop_unsharded_grads(self.module)
        return loss.detach()

    def describe(self):
        info = super().describe()
        info.update(param_dtype=str(self.param_dtype or torch.float32).removeprefix("torch."),
                    mixed_precision=MIXED_PRECISION[self.mixed_precision] if self.autocast_dtype or self.param_dtype
                    else None, norm_fp32_via=self.norm_fp32_via,
                    sharded_parameters=sum(1 for p in self.module.parameters() if hasattr(p, "full_tensor")),
                    fsdp_groups=self.groups, blocks_per_group=self.per_group, reshard_after_forward=self.reshard,
                    init=self.init,
                    prefetch="implicit (backward: the next block's all-gather beside this block's compute)")
        return info

    def full_parameters(self):
        """The whole model's parameters: every rank all-gathers each DTensor (a collective, in order)."""
        for name, p in self.module.named_parameters():
            yield name, p.full_tensor() if hasattr(p, "full_tensor") else p


def materialise(model: torch.nn.Module) -> None:
    """Fill the shards ``to_empty`` left uninitialised as the workloads initialise (GPT-2's N(0, 0.02) for matrices,
    ones for norm weights, zeros for biases), each rank its own shard with its own random values: for memory probes,
    whose values only need to be finite (a NaN would make GradScaler skip every step and AdamW never allocate its
    state)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.dim() >= 2:
                local.normal_(0.0, 0.02)
            elif name.endswith("weight"):
                local.fill_(1.0)
            else:
                local.zero_()
        for name, buf in model.named_buffers():  # BatchNorm's running statistics
            if buf.is_floating_point():
                buf.fill_(1.0) if name.endswith("running_var") else buf.zero_()


def reshard_policy(world_size: int) -> str:
    """What reshards after forward by default (module docstring): "never" at world size 1, else "blocks but the last"
    (``--fsdp-reshard never|always`` chooses "never" or "every block")."""
    return "never" if world_size == 1 else "blocks but the last"


def drop_unsharded_grads(model: torch.nn.Module) -> int:
    """Free the unsharded gradients FSDP2 keeps while gradient sync is off (a compute-only step); returns their bytes.
    torch 2.15 keeps them on each FSDPParam's unsharded parameter, older releases also in ``unsharded_accumulated_grad``
    (a plain attribute there, a read-only view of the former here)."""
    freed = 0
    for fsdp_param in fsdp_params(model):
        unsharded = getattr(fsdp_param, "_unsharded_param", None)
        if unsharded is not None and unsharded.grad is not None:
            freed += unsharded.grad.numel() * unsharded.grad.element_size()
            unsharded.grad = None
        if fsdp_param.__dict__.get("unsharded_accumulated_grad") is not None:
            grad = fsdp_param.__dict__["unsharded_accumulated_grad"]
            freed += grad.numel() * grad.element_size()
            fsdp_param.unsharded_accumulated_grad = None
    return freed


def fsdp_params(model: torch.nn.Module) -> list:
    """Every FSDPParam of every FSDP2 group in ``model`` (torch's internals: ``_fsdp_param_groups`` in 2.15, one
    ``_fsdp_param_group`` per state before)."""
    out = []
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        if state is None:
            continue
        groups = getattr(state, "_fsdp_param_groups", None)
        groups = groups if groups is not None else [getattr(state, "_fsdp_param_group", None)]
        out += [p for g in groups if g is not None for p in g.fsdp_params]
    return out


def shard(model: torch.nn.Module, mesh, dtype: torch.dtype | None, compile: bool = False,
          reshard: str = "blocks but the last", per_group: int = 1) -> tuple[str | None, int]:
    """``fully_shard`` every block (compiled first with ``compile``), then the root, keeping BatchNorm's parameters
    fp32 under a half ``dtype``; ``reshard``: ``reshard_policy``'s answer, or "every block". Returns how the norms were kept fp32 (None:
    no half dtype or no norm) and the number of FSDP2 groups."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    units = blocks(model)
    via, groups = None, 0
    if dtype and norms:
        if has_param_dtype_override():
            ids = {id(p) for m in norms for p in m.parameters()}
            policy = dataclasses.replace(policy, param_dtype_override_fn=lambda p: torch.float32 if id(p) in ids else None)
            via = "param_dtype_override_fn"
        else:  # torch <= 2.14: one fp32 group per block for its norms; their input stays in the compute dtype. Tiny:
            # kept unsharded from forward to backward, which saves each its second copy-in
            fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
            for group in norm_groups(norms, units):
                fully_shard(group, mesh=mesh, mp_policy=fp32, reshard_after_forward=False)
                groups += 1
            via = "fully_shard per block's BatchNorms"
    chunks = [units[i:i + per_group] for i in range(0, len(units), per_group)]  # --fsdp-blocks-per-group
    for i, chunk in enumerate(chunks):
        for block in chunk:
            if compile:
                block.compile()  # before fully_shard, as torchtitan's apply_compile does
        keep = reshard == "never" or (reshard != "every block" and i == len(chunks) - 1)  # backward needs the last first
        fully_shard(chunk if len(chunk) > 1 else chunk[0], mesh=mesh, mp_policy=policy, reshard_after_forward=not keep)
        groups += 1
    # the root also returns fp32 logits, so the loss is computed in fp32 as under autocast
    fully_shard(model, mesh=mesh, mp_policy=dataclasses.replace(policy, output_dtype=torch.float32 if dtype else None))
    return via, groups + 1


def norm_groups(norms: list[torch.nn.Module], units: list[torch.nn.Module]) -> list[list[torch.nn.Module]]:
    """The norms grouped by the block that holds them (in block order), then the norms outside every block."""
    owner = {id(m): i for i, unit in enumerate(units) for m in unit.modules()}
    groups: dict[int, list] = {}
    for norm in norms:
        groups.setdefault(owner.get(id(norm), len(units)), []).append(norm)
    return [groups[k] for k in sorted(groups)]


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The units to shard one by one: the model's blocks (a transformer's layers, as FSDP2's documentation and
    torchtitan wrap them; a ResNet's residual blocks; a user model's own: backends/models), else the root's
    children."""
    found = models.find_blocks(model)
    return found or [m for m in model.children() if any(True for _ in m.parameters())]

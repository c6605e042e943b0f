"""horovod: Horovod's DistributedOptimizer, launched by ``horovodrun -np N -H localhost:N --gloo``.

Follows Horovod's own examples: hvd.init, one device per local rank, DistributedOptimizer with
named_parameters, parameters broadcast from rank 0. Not the optimizer state: for an optimizer with no state
yet, ``hvd.broadcast_optimizer_state`` first runs ``optimizer.step()`` on zero gradients to create it, which
with weight decay shrinks every parameter and seeds the momentum, so the model trained differs from every
other backend's (bench verify found it). A fresh optimizer has nothing to broadcast. ``--hvd-compression fp16``
halves the allreduce traffic (the published ImageNet example hard-codes it; it is not like-for-like with
fp32 DDP, so the record's ``options`` says which ran). AMP uses the documented pattern:
optimizer.synchronize(), then scaler.step inside optimizer.skip_synchronize().

Horovod is built by the project (make horovod); everything that can be wrong with that build becomes a
"skipped" reason here, never an ImportError in the middle of a sweep.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from backends.base import (ACTIVATION_CHECKPOINTING, CHANNELS_LAST, OPTIMIZER_IMPL, Backend, build_model,
                           contiguous_parameters, device_for)
from bench.core.errors import UsageError
from bench.core.knobs import Knob

REBUILD = "make horovod"


def problem() -> str | None:
    """Why Horovod cannot be used from this environment, or None."""
    try:
        import horovod.torch as hvd
    except ModuleNotFoundError:
        return f"horovod is not installed ({REBUILD})"
    except ImportError as e:
        text = str(e)
        if "undefined symbol" in text or "torch" in text.lower() and "version" in text.lower():
            return f"horovod was built against another torch and must be rebuilt ({REBUILD}): {text.splitlines()[0]}"
        return f"horovod's PyTorch extension did not build or does not load ({REBUILD}): {text.splitlines()[0]}"
    if not hasattr(hvd, "init"):
        return f"horovod is installed without its PyTorch extension (horovod.torch has no init; {REBUILD})"
    if not hvd.gloo_built():
        return f"this Horovod build has no Gloo controller, which horovodrun --gloo needs ({REBUILD})"
    try:
        import horovod.runner.launch  # noqa: F401 - what horovodrun runs; the harness starts it with this Python
    except ImportError as e:
        return f"horovod's launcher (horovod.runner.launch) does not import ({REBUILD}): {str(e).splitlines()[0]}"
    return None


# What ``horovodrun --check-build`` lists, in its order: (section, [(name, the horovod.torch function that says it)])
CHECK_BUILD = (("controllers", (("MPI", "mpi_built"), ("Gloo", "gloo_built"))),
               ("tensor_operations", (("NCCL", "nccl_built"), ("DDL", "ddl_built"), ("CCL", "ccl_built"),
                                      ("MPI", "mpi_built"), ("Gloo", "gloo_built"))))
OTHER_FRAMEWORKS = ("tensorflow", "mxnet")  # horovodrun --check-build looks for their extensions too


def build_info() -> dict | None:
    """Horovod's version and what ``horovodrun --check-build`` says it was built with, for the record's env.

    horovodrun answers by loading each framework's extension in a forked process per question (about ten, each
    importing torch: 7 s and 8 s of CPU on a 2-core machine, at every sweep that plans horovod). With only PyTorch
    installed its answers are those of the horovod.torch extension ``problem()`` has already loaded, so they are read
    from it here; tests/backends/test_horovod.py checks that both give the same. Where TensorFlow or MXNet is
    installed, horovodrun itself is asked (the frameworks it lists, and the controllers of the first extension
    that loads, may then come from another extension)."""
    if problem():
        return None
    import importlib.util

    import horovod

    if any(importlib.util.find_spec(name) for name in OTHER_FRAMEWORKS):
        return check_build()
    import horovod.torch as hvd

    info = {"version": horovod.__version__, "frameworks": "PyTorch"}
    for section, features in CHECK_BUILD:
        info[section] = ", ".join(name for name, query in features if getattr(hvd, query)())
    return info


def check_build() -> dict:
    """``horovodrun --check-build``'s answer, through this interpreter (as the harness starts horovodrun)."""
    import horovod

    try:
        out = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--check-build"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"version": horovod.__version__, "check_build": f"failed: {e}"}
    # Sections ("Available Controllers:") list features as "    [X] Gloo" (built) or "    [ ] MPI" (not).
    info, section = {"version": horovod.__version__}, None
    for line in out.splitlines():
        if line.strip().endswith(":") and line.startswith("Available "):
            section = line.strip()[len("Available "):-1].lower().replace(" ", "_")
            info[section] = []
        elif section and line.strip().startswith("[X]"):
            info[section].append(line.strip()[3:].strip())
    return {k: ", ".join(v) if isinstance(v, list) else v for k, v in info.items()}


# --hvd-compression is recorded in every horovod run (none or fp16) and in no other backend's (``own``)
HVD_KNOBS = (
    Knob("compression", "horovod gradient compression (default none: like-for-like with fp32 DDP)", str,
         choices=("none", "fp16"), default="none", own=True, flag_name="hvd_compression"),
    Knob("hvd_fusion_mb", "Horovod tensor fusion threshold, MiB (HOROVOD_FUSION_THRESHOLD)", float, low=-1),
    Knob("hvd_cycle_ms", "Horovod cycle time, ms (HOROVOD_CYCLE_TIME)", float, low=0),
)


def check_hosts(hosts: str | None, world_size: int) -> str | None:
    """Why horovodrun -H cannot start ``world_size`` ranks from ``hosts``, or None."""
    if not hosts:
        return "Horovod across nodes needs --hosts host1:slots,host2:slots (horovodrun -H)"
    try:
        slots = sum(int(h.rsplit(":", 1)[1]) for h in hosts.split(","))
    except (IndexError, ValueError):
        return f"--hosts {hosts!r}: expected host1:slots,host2:slots"
    if slots != world_size:
        return f"--hosts {hosts!r} has {slots} slots for a world size of {world_size}"
    return None


class Horovod(Backend):
    local_only = False  # inside skip_gradient_sync()

    # compile is not offered: DistributedOptimizer hooks each parameter's gradient accumulator
    knobs = (*HVD_KNOBS, CHANNELS_LAST, ACTIVATION_CHECKPOINTING, OPTIMIZER_IMPL)

    @classmethod
    def environment(cls):
        return {"horovod": build_info()}

    def node_plan(self, nodes, world_size):
        """horovodrun starts every rank from node 0 (-H reaches the other hosts): the other nodes plan nothing."""
        if nodes.node_rank != 0:
            return "horovod runs start on node 0 only (horovodrun -H reaches the other hosts)"
        why = check_hosts(nodes.hosts, world_size)
        if why:
            raise UsageError(why)
        return None

    def unavailable(self, cfg):
        reason = problem()
        if reason:
            return reason
        import horovod.torch as hvd

        if cfg.device_type == "cuda" and not hvd.nccl_built():
            return (f"this Horovod build has no NCCL tensor operations, so its allreduce would not run on the GPUs; "
                    f"rebuild on the GPU machine ({REBUILD}, which sets HOROVOD_GPU_OPERATIONS=NCCL)")
        if cfg.options.get("compression") not in (None, "none", "fp16"):
            return f"unknown horovod compression {cfg.options.get('compression')!r}; choose from none, fp16"
        return super().unavailable(cfg)

    def setup(self, cfg):
        import horovod.torch as hvd

        self.hvd = hvd
        o = cfg.options or {}
        if o.get("hvd_fusion_mb") is not None:  # read by hvd.init(): set before it
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(o["hvd_fusion_mb"] * 2 ** 20))
        if o.get("hvd_cycle_ms") is not None:
            os.environ["HOROVOD_CYCLE_TIME"] = str(o["hvd_cycle_ms"])
        hvd.init()
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        self.device = device_for(cfg, self.local_rank)
        # hvd.broadcast_parameters refuses non-contiguous tensors: under --channels-last the parameters stay NCHW and
        # the inputs go channels-last, as for FSDP2 and DeepSpeed (backend_info.channels_last)
        model = contiguous_parameters(build_model(cfg).to(self.device), cfg)
        self.init_training(cfg, model, cfg.batch_size)
        compression = hvd.Compression.fp16 if cfg.options.get("compression") == "fp16" else hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(self.optimizer, named_parameters=model.named_parameters(),
                                                  compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # no broadcast_optimizer_state: see the module docstring

    def step(self):
        if self.local_only:
            # The hooks left empty handles (no allreduce was started); Horovod 0.28's zero_grad refuses to run
            # while any handle is pending, so they are dropped here. Only in the compute-only reference.
            self.optimizer._handles.clear()
        if self.scaler is None:
            return super().step()  # optimizer.step() waits for the allreduces started during backward
        loss = self.forward_loss()
        self.optimizer.zero_grad()  # set_to_none by default (torch >= 2.0)
        self.backward(loss)  # through the scaler
        if not self.local_only:
            with self.phase("all-reduce"):
                self.optimizer.synchronize()  # finish the allreduces of the scaled gradients...
        with self.phase("optimizer"):
            with self.optimizer.skip_synchronize():  # ...so that scaler.step's optimizer.step() does not redo them
                self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss.detach()

    no_compute_only = None

    def skip_gradient_sync(self):
        """No allreduce from the gradient hooks (backward_passes_per_step beyond any window) and no synchronize in
        step. Used only after the timed windows: the replicas drift apart from here on."""
        opt = self.optimizer

        @contextlib.contextmanager
        def local():
            opt.set_backward_passes_per_step(2 ** 30)
            self.local_only = True
            with opt.skip_synchronize():
                yield
            self.local_only = False
            # the last local backward's empty handles: Horovod 0.28's zero_grad refuses to run over pending handles, so
            # a step after this context (bench run --trace's) would fail as step() does in it without this clear
            opt._handles.clear()
            opt.set_backward_passes_per_step(1)

        return local()

    def tune_space(self):
        return {"hvd_fusion_mb": (8.0, 256.0), "hvd_cycle_ms": (0.5, 5.0)}

    def library_settings(self, cfg):
        """What hvd.DistributedOptimizer is built with (its defaults, but the compression a knob asks for)."""
        return {"compression": "fp16" if (cfg.options or {}).get("compression") == "fp16" else "none",
                "backward_passes_per_step": 1, "op": "Average"}

    def library_defaults(self):
        import inspect

        import horovod.torch as hvd

        signature = inspect.signature(hvd.DistributedOptimizer).parameters
        compression = {hvd.Compression.none: "none", hvd.Compression.fp16: "fp16"}
        op = {hvd.Average: "Average", hvd.Sum: "Sum", hvd.Adasum: "Adasum"}
        return {"compression": compression.get(signature["compression"].default, "other"),
                "backward_passes_per_step": signature["backward_passes_per_step"].default,
                "op": op.get(signature["op"].default, "other")}

    def describe(self):
        info = super().describe()
        info.update(fusion_threshold_bytes=os.environ.get("HOROVOD_FUSION_THRESHOLD"),
                    cycle_time_ms=os.environ.get("HOROVOD_CYCLE_TIME"))
        return info

    def all_gather(self, obj):
        return self.hvd.allgather_object(obj)

    def all_reduce_sum(self, tensor):
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def barrier(self):
        self.hvd.barrier()

    def teardown(self):
        self.hvd.shutdown()

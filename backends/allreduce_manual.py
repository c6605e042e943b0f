"""allreduce_manual: data parallelism written by hand, as the d2l chapter does.

No DDP wrapper: after ``backward()`` the gradients are all-reduced and divided by the world size, then the optimizer
steps, with no overlap with the backward pass. By default every parameter's gradient on its own (the seeds' naive
version: one collective per tensor, 161 a step for ResNet-50); ``--allreduce-bucket-mb B`` flattens them into buckets of
B MiB first (DDP's 25 by default when given without a size: the labelled variant ``bench run --variants`` plans), one
collective per bucket, still after the whole backward. The three together split what DDP buys: naive against
bucketed is the launch overhead of many small collectives, bucketed against ``ddp`` what overlapping them with the
backward buys (the report's "What DDP's buckets and overlap buy"). The model starts identical on every rank (one seed)
and is broadcast from rank 0 anyway, as a hand-written version must.
"""
import contextlib

import torch
import torch.distributed as dist

from backends.base import COMMON_KNOBS, build_model
from backends.ddp import DDP, RANKS_PER_GPU
from bench.core.knobs import Knob

DDP_BUCKET_MB = 25.0  # DDP's bucket_cap_mb default
ALLREDUCE_BUCKET_MB = Knob("allreduce_bucket_mb", "allreduce_manual: flatten the gradients into buckets of this many MiB "
                                                  "and all-reduce each bucket after backward (default: one all-reduce per "
                                                  "gradient tensor; DDP's buckets are 25 MiB)", float, low=0)


class AllReduceManual(DDP):
    twin_loop = None  # no plain loop of its own: compared with the plain loop as a whole
    knobs = (ALLREDUCE_BUCKET_MB, RANKS_PER_GPU, *COMMON_KNOBS)
    sync = True

    def variants(self, precision: str) -> list[tuple[dict, str, bool]]:
        return [({"allreduce_bucket_mb": DDP_BUCKET_MB}, "bucketed: gradients flattened into DDP-sized buckets after "
                                                          "backward, one all-reduce each, no overlap", False)]

    def library_settings(self, cfg):
        return {}  # written by hand: no library whose defaults it could depart from

    def tune_space(self):
        return {"allreduce_bucket_mb": (DDP_BUCKET_MB,)}

    def skip_gradient_sync(self):
        backend = self

        class Local(contextlib.AbstractContextManager):
            def __enter__(self):
                backend.sync = False

            def __exit__(self, *exc):
                backend.sync = True

        return Local()

    def setup(self, cfg):
        self.init_process_group(cfg)
        model = build_model(cfg).to(self.device)
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
        self.init_training(cfg, model, cfg.batch_size)
        mb = (cfg.options or {}).get("allreduce_bucket_mb")
        self.bucket_bytes = int(mb * 2 ** 20) if mb else None
        self.collectives = None  # per step, counted at the first

    def step(self):
        loss = self.forward_loss()
        self.optimizer.zero_grad()
        self.backward(loss)
        with self.phase("all-reduce"):
            if self.sync:
                grads = [p.grad for p in self.module.parameters() if p.grad is not None]
                groups = buckets(grads, self.bucket_bytes) if self.bucket_bytes else [[g] for g in grads]
                for group in groups:  # after the whole backward pass: nothing overlaps
                    if len(group) == 1:
                        dist.all_reduce(group[0], op=dist.ReduceOp.SUM)
                        group[0].div_(self.world_size)
                        continue
                    flat = torch._utils._flatten_dense_tensors(group)
                    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                    flat.div_(self.world_size)
                    for g, reduced in zip(group, torch._utils._unflatten_dense_tensors(flat, group)):
                        g.copy_(reduced)
                self.collectives = self.collectives or len(groups)
        self.optimizer_step()
        return loss.detach()

    def describe(self):
        info = super().describe()
        info.update(allreduce="bucketed" if self.bucket_bytes else "one per gradient tensor",
                    bucket_bytes=self.bucket_bytes, collectives_per_step=self.collectives)
        return info


def buckets(grads: list, cap_bytes: int) -> list[list]:
    """The gradients in buckets of at most ``cap_bytes`` (a tensor larger than that alone), in reverse order of the
    parameters, as DDP orders its buckets (the last layers' gradients are ready first), by dtype."""
    out, current, size = [], [], 0
    for g in reversed(grads):
        nbytes = g.numel() * g.element_size()
        if current and (size + nbytes > cap_bytes or g.dtype != current[0].dtype):
            out.append(current)
            current, size = [], 0
        current.append(g)
        size += nbytes
    if current:
        out.append(current)
    return out

"""allreduce_manual: data parallelism written by hand, as the d2l chapter does.

No DDP wrapper: after ``backward()`` every parameter's gradient is all-reduced on its own and divided by the
world size, then the optimizer steps. No buckets and no overlap with the backward pass: the difference from
``ddp`` is what DDP's bucketing and overlap buy. The model starts identical on every rank (one seed) and is
broadcast from rank 0 anyway, as a hand-written version must.
"""
import contextlib

import torch.distributed as dist

from backends.base import COMMON_KNOBS, build_model
from backends.ddp import DDP, RANKS_PER_GPU


class AllReduceManual(DDP):
    twin_loop = None  # no plain loop of its own: compared with the plain loop as a whole
    knobs = (RANKS_PER_GPU, *COMMON_KNOBS)
    sync = True

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

    def step(self):
        loss = self.forward_loss()
        self.optimizer.zero_grad()
        self.backward(loss)
        with self.phase("all-reduce"):
            for p in self.module.parameters():  # one all-reduce per tensor, after the whole backward pass
                if p.grad is not None and self.sync:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad.div_(self.world_size)
        self.optimizer_step()
        return loss.detach()

"""bench verify's code on every rank (``python -m bench.rank`` with a spec whose task is ``verify``) and its
single-process reference. The command, the comparison and the tolerances are in ``bench/commands/verify.py``."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from backends import models
from backends.base import Backend, build_model, device_for
from bench.core import cuda
from bench.rank import startup


class Reference(Backend):
    """``single`` on the global batch of N shares. ``batchnorm="local"``: N micro-batches of one share each
    (BatchNorm over the share, as on each replica), gradients accumulated with weight 1/N, one optimizer
    step. ``"global"``: one pass over the global batch. ``twin``: the shares in reverse order (the same
    training, summed in another order)."""

    def __init__(self, shares: int, batchnorm: str, twin: bool):
        super().__init__("single", "inproc")
        # twin: the shares in reverse order (summation order alone differs); not Backend.twin, the backend's own loop
        self.shares, self.local, self.reversed_shares = shares, batchnorm == "local", twin

    def setup(self, cfg):
        self.device = device_for(cfg, 0)
        self.init_training(cfg, build_model(cfg).to(self.device), cfg.batch_size)

    def step(self):
        inputs, targets = next(self.batches)
        parts = list(zip(inputs.chunk(self.shares), targets.chunk(self.shares)))
        if self.reversed_shares:
            parts.reverse()
        if not self.local:
            parts = [(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))]
        self.optimizer.zero_grad()
        total = 0.0
        for x, y in parts:
            with torch.autocast(self.device_type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                loss = self.workload.loss(self.model(x), y)
            scaled = loss / len(parts)  # the 1/N a data-parallel backend's average applies
            (scaled if self.scaler is None else self.scaler.scale(scaled)).backward()
            total = total + scaled.detach()
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return total


def run_rank(spec: dict) -> None:
    import numpy as np

    import backends
    from bench.core import results
    from bench.core.config import RunConfig
    from bench.rank import data
    from bench.rank.evaluate import evaluate
    from bench.rank.faults import Fault
    from bench.rank.record import eval_fields, param_checksum

    cfg, v = RunConfig.from_dict(spec["config"]), spec["verify"]
    torch.set_num_threads(spec["threads_per_rank"])
    if cfg.device_type == "cuda":  # the same algorithms on every run: differences come from the backend
        cuda.set_cudnn(benchmark=False, deterministic=True)
    ref = v.get("reference")
    backend = Reference(v["data_world"], ref["batchnorm"], ref["twin"]) if ref else backends.create(cfg.backend)
    backend.setup(cfg)
    if not ref:  # injected faults are for the backend under test; the reference stays what it is
        Fault.parse(os.environ.get("BENCH_FAULT")).install(backend)
    initial = _flat(backend.full_parameters()) if ref else None
    share = None if backend.launcher == "inproc" else data.shard_rank(backend)
    backend.batches = data.verify_batches(v["global_batch"], v["data_world"], v["steps"], cfg.image_size, cfg.seed,
                                          backend.data_device, share, models.for_config(cfg))
    startup.done()  # the collector back on before the first step (bench/rank/startup.py)
    losses = [float(backend.step().float()) for _ in range(v["steps"])]
    evaluated = evaluate(backend, data.eval_dataset(cfg), backend.feed_batch)
    final = _flat(backend.full_parameters())  # every rank takes part where gathering is collective
    gathered = backend.all_gather({"losses": losses, "param_sha256": param_checksum(final.items()),
                                   "eval": evaluated, "python_prefix": sys.prefix})
    if backend.rank == 0:
        path = Path(v["params_out"])
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **{k: t.numpy() for k, t in final.items()})
        if initial is not None:
            np.savez(path.with_name(path.stem + "-initial.npz"), **{k: t.numpy() for k, t in initial.items()})
        record = results.skeleton(cfg.to_dict(), spec["run_id"], spec["env"])
        per_step = [sum(s) / len(s) for s in zip(*(g["losses"] for g in gathered))]  # equal shares: the mean
        consistent = len({g["param_sha256"] for g in gathered}) == 1 if len(gathered) > 1 else None
        record.update(status="ok", task="verify", losses=per_step, replicas_consistent=consistent, verify=v,
                      backend_info=backend.describe(), threads_per_rank=spec["threads_per_rank"],
                      rank_python_prefixes=[g["python_prefix"] for g in gathered],  # as a run's record (record.py)
                      finished_at=results.utc_now(), **eval_fields(gathered))
        results.save(record, spec["results_dir"])
    backend.barrier()
    backend.teardown()


def _flat(named) -> dict:
    return {name: p.detach().to(torch.float32).cpu().clone() for name, p in named}

"""Distributed evaluation, the way the source articles do it, for every backend.

Each rank evaluates its DistributedSampler shard of the evaluation set (no shuffle) under ``torch.no_grad()``
and ``model.eval()``; the sums of loss, correct predictions and samples are all-reduced; then a barrier.
DataParallel and ``single`` evaluate the whole set in one process.

DistributedSampler pads the set to a multiple of the world size by repeating its first samples, which would
count them twice. Every rank still runs the padded shard, so all ranks run the same number of forwards (FSDP2
and ZeRO-3 all-gather parameters in each forward, and a rank with one batch fewer would leave the others
waiting forever), but the padded positions are masked out of the sums (``exact_shard`` lists the kept ones):
every sample is counted exactly once and ``eval_samples`` is the set's size, never the padded size.

Warm-up: before the clock starts, every rank runs one untimed forward on its first batch in eval mode under
``no_grad``. Under ``--compile`` that is where torch.compile recompiles for eval mode (its guards include the
module's ``training`` flag and the grad mode), which would otherwise sit inside ``eval_seconds``; it also takes
the loader's start-up out of the timed region. Every rank does it, so all still run the same number of
forwards; the warm-up's outputs are not counted.
"""
from __future__ import annotations

import itertools
import time

import torch

from backends import models
from bench.core import cuda


def exact_shard(size: int, world_size: int, rank: int) -> list[int]:
    """Rank ``rank``'s indices from DistributedSampler(shuffle=False), without the padding it adds: the padded
    list is range(size) followed by repeats, rank r takes positions r, r + N, ...; positions >= size are the
    repeats."""
    return [i for i, keep in _padded_shard(size, world_size, rank) if keep]


def _padded_shard(size: int, world_size: int, rank: int) -> list[tuple[int, bool]]:
    """DistributedSampler(shuffle=False)'s indices for ``rank``, each with whether it is a real position."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank, shuffle=False)
    return [(i, j * world_size + rank < size) for j, i in enumerate(sampler)]


def _inputs(x: torch.Tensor, device, dtype) -> torch.Tensor:
    """The batch on the device, in the dtype DeepSpeed's half model takes when it is images (token ids stay ids)."""
    return x.to(device, dtype=dtype if x.is_floating_point() else None)


def evaluate(backend, dataset, batch_size: int, workers: int = 0) -> dict:
    """Evaluate ``backend.model`` on this rank's exact shard of ``dataset`` and all-reduce the sums.

    Returns ``eval_samples`` (over all ranks), ``eval_loss`` (mean per-sample loss: cross-entropy, or a user model's
    own), ``eval_accuracy`` (top-1, 0..1; None for a workload that scores no accuracy: a user model with its own loss)
    and ``eval_seconds`` (this rank's wall time, max over ranks taken by the caller's gather)."""
    from torch.utils.data import DataLoader, Subset

    distributed = backend.launcher != "inproc"
    shard = (_padded_shard(len(dataset), backend.world_size, backend.rank) if distributed
             else [(i, True) for i in range(len(dataset))])
    loader = DataLoader(Subset(dataset, [i for i, _ in shard]), batch_size=batch_size, shuffle=False, num_workers=workers)
    keep_all = torch.tensor([k for _, k in shard], dtype=torch.bool, device=backend.data_device)
    device = backend.data_device
    input_dtype = backend.input_dtype  # DeepSpeed's fp16/bf16 cast the model, not autocast
    model = backend.model
    workload = getattr(backend, "workload", None) or models.Workload()  # its per-sample loss and accuracy
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, samples
    scored = True  # whether the workload gives an accuracy (the same on every rank: one workload)

    def forward(images):
        with torch.autocast(backend.device_type, dtype=backend.autocast_dtype,
                            enabled=backend.autocast_dtype is not None):
            return model(images)

    batches = iter(loader)
    first = next(batches, None)
    with torch.no_grad():
        if first is not None:  # warm-up, untimed and not counted (module docstring)
            forward(_inputs(first[0], device, input_dtype))
    for d in backend.devices():
        if d.type == "cuda":
            cuda.synchronize(d)
    backend.barrier()
    t0 = time.perf_counter()
    with torch.no_grad():
        seen = 0
        for item in itertools.chain([] if first is None else [first], batches):
            images, targets = _inputs(item[0], device, input_dtype), item[1].to(device)
            keep = keep_all[seen:seen + len(targets)]
            seen += len(targets)
            losses, correct = workload.per_sample(forward(images), targets)
            sums[0] += losses[keep].sum().double()
            if correct is None:
                scored = False
            else:
                sums[1] += correct[keep].sum().double()
            sums[2] += keep.sum()
    for module in model.modules():  # FSDP2 leaves the groups that do not reshard after forward (the root, the last
        reshard = getattr(module, "reshard", None)  # block, every block at world size 1) unsharded after a forward
        if callable(reshard) and hasattr(module, "_get_fsdp_state"):  # with no backward
            reshard()
    for d in backend.devices():
        if d.type == "cuda":
            cuda.synchronize(d)
    seconds = time.perf_counter() - t0
    sums = backend.all_reduce_sum(sums)
    backend.barrier()  # as the source articles do: nobody moves on before every rank has evaluated
    model.train(was_training)
    loss, correct, samples = sums.tolist()
    return {"eval_samples": int(samples), "eval_loss": loss / samples if samples else None,
            "eval_accuracy": correct / samples if samples and scored else None, "eval_seconds": seconds}

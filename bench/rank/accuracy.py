"""``bench run --to-accuracy`` on every rank (``python -m bench.rank`` with a spec whose task is ``accuracy``): train in
epochs under the learning-rate schedule (bench/core/schedule.py) until the held-out top-1 reaches the target or the
planned epochs run out, evaluating every ``eval_every`` epochs (and after the last) through the distributed evaluation
(bench/rank/evaluate.py: DistributedSampler shards, padding masked, sums all-reduced, so every rank sees the same
accuracy and all stop at the same epoch).

A loop of its own, not the timed one (bench/rank/train.py measures steady-state windows; this measures what a user
waits for): the clock starts after set-up and the data are ready, with every rank at a barrier, and runs through
every step, the first ones included, and every evaluation, each evaluation also timed on its own. Backends only set
up and step, as in every task; the schedule's rate goes into the optimizer's param groups before each step
(``Backend.set_lr``) and is read back at the end from the optimizer that steps (``Backend.stepped_settings``). Rank 0
writes the record: the curve (epoch, step, wall clock, evaluation time, top-1, loss, training loss, rate), the time,
epochs and steps to accuracy, or "not reached" with the best accuracy.
"""
from __future__ import annotations

import time

import torch

from bench.core import cuda
from bench.core.schedule import Schedule
from bench.rank import lifeline, startup


def run_rank(spec: dict) -> None:
    import backends
    from bench.core import results
    from bench.core.config import RunConfig
    from bench.rank.evaluate import evaluate
    from bench.rank.record import param_checksum

    cfg, a = RunConfig.from_dict(spec["config"]), spec["accuracy"]
    torch.set_num_threads(spec["threads_per_rank"])
    if cfg.device_type == "cuda":
        cuda.set_cudnn(bool(cfg.cudnn_benchmark))
    t_setup = time.perf_counter()
    backend = backends.create(cfg.backend)
    backend.setup(cfg)
    backend.set_optimizer_settings(a.get("momentum"), a.get("weight_decay"))
    train, held_out, dataset, workers = _data(cfg, backend, a)
    steps = train.steps
    if steps < 1:
        raise ValueError(f"{dataset['train_samples']} training samples make no step of {cfg.global_batch} (global batch)")
    schedule = Schedule.for_epochs(a["base_lr"], a["base_batch"], cfg.global_batch, a["scaling"], a["warmup_epochs"],
                                   a["max_epochs"], steps, a["decay"])
    startup.done()  # the collector back on before the first epoch (bench/rank/startup.py)
    setup_seconds = time.perf_counter() - t_setup

    def sync():
        for d in backend.devices():
            if d.type == "cuda":
                cuda.synchronize(d)

    sync()
    backend.barrier()
    t0, wall0 = time.perf_counter(), time.time()
    curve, eval_total, step, since_eval, reached = [], 0.0, 0, 0, None
    losses = torch.zeros((), dtype=torch.float64, device=backend.data_device)
    for epoch in range(1, a["max_epochs"] + 1):
        lifeline.set_phase(f"epoch {epoch} of at most {a['max_epochs']}")
        backend.batches = train.epoch(epoch - 1)
        for _ in range(steps):
            backend.set_lr(schedule.lr(step))
            losses += backend.step().double()
            step += 1
        since_eval += steps
        if epoch % a["eval_every"] and epoch < a["max_epochs"]:
            continue
        lifeline.set_phase(f"evaluation after epoch {epoch}")
        sync()
        t_eval = time.perf_counter()
        rank0_buffers(backend)
        ev = evaluate(backend, held_out, backend.feed_batch, workers)
        eval_total += time.perf_counter() - t_eval
        wall = time.perf_counter() - t0
        if ev["eval_accuracy"] is None:
            raise ValueError(f"--to-accuracy needs a model scored by top-1 accuracy; {cfg.model} is scored by its own "
                             "loss")
        train_loss = float(backend.all_reduce_sum(losses)) / (backend.world_size * since_eval)
        losses.zero_()
        since_eval = 0
        curve.append({"epoch": epoch, "step": step, "wall_seconds": wall, "eval_seconds": eval_total,
                      "train_seconds": wall - eval_total, "accuracy": ev["eval_accuracy"], "loss": ev["eval_loss"],
                      "train_loss": train_loss, "lr": schedule.lr(step - 1)})
        if ev["eval_accuracy"] >= a["target"]:
            reached = curve[-1]
            break

    lifeline.set_phase("after training")
    mine = {"param_sha256": param_checksum(backend.full_parameters()), "stepped": backend.stepped_settings()}
    gathered = backend.all_gather(mine)
    if backend.rank == 0:
        record = results.skeleton(cfg.to_dict(), spec["run_id"], spec["env"])
        last = curve[-1]
        best = max(curve, key=lambda c: c["accuracy"])
        stepped = [g["stepped"] for g in gathered]
        record.update(
            status="ok", task="accuracy", warmup_steps=None, steps_per_window=None, windows=None, seed=cfg.seed,
            target_accuracy=a["target"], reached=reached is not None,
            outcome="reached" if reached else (f"not reached in {last['epoch']} epochs: best {100 * best['accuracy']:.1f}%"
                                               f" at epoch {best['epoch']}"),
            epochs_to_accuracy=reached and reached["epoch"], steps_to_accuracy=reached and reached["step"],
            time_to_accuracy_seconds=reached and reached["wall_seconds"],
            eval_seconds_to_accuracy=reached and reached["eval_seconds"],
            train_seconds_to_accuracy=reached and reached["train_seconds"],
            best_accuracy=best["accuracy"], best_epoch=best["epoch"], epochs_run=last["epoch"], steps_run=step,
            wall_seconds=last["wall_seconds"], eval_seconds=eval_total, setup_seconds=setup_seconds,
            steps_per_epoch=steps, samples_per_epoch=steps * cfg.global_batch,
            train_throughput=step * cfg.global_batch / last["train_seconds"] if last["train_seconds"] > 0 else None,
            curve=curve, final_lr=schedule.lr(step - 1),
            schedule={**schedule.describe(), "warmup_epochs": a["warmup_epochs"], "max_epochs": a["max_epochs"],
                      "eval_every": a["eval_every"]},
            accuracy_settings=a,
            # what the optimizer that steps held after the last step, on rank 0, and whether every rank's rate was the
            # schedule's (DeepSpeed and ZeroRedundancyOptimizer wrap it: Backend.set_lr)
            optimizer_settings={**stepped[0], "lr_is_the_schedules": all(
                abs(s["lr"] - schedule.lr(step - 1)) <= 1e-12 * max(1.0, schedule.peak) for s in stepped)},
            eval_model="rank 0's: its buffers (BatchNorm's running statistics) copied to every rank before each "
                       "evaluation",
            dataset=dataset, eval_samples=dataset["held_out_samples"], eval_accuracy=last["accuracy"],
            eval_loss=last["loss"], eval=True,
            replicas_consistent=len({g["param_sha256"] for g in gathered}) == 1 if len(gathered) > 1 else None,
            backend_info=backend.describe(), threads_per_rank=spec["threads_per_rank"],
            launched_by=spec.get("launched_by"), finished_at=results.utc_now(),
            windows_wall_span=[wall0, wall0 + last["wall_seconds"]])  # the harness's machine watch reads this span
        results.save(record, spec["results_dir"])
    backend.barrier()
    backend.teardown()


def rank0_buffers(backend) -> int:
    """Every rank evaluates rank 0's model: its buffers (BatchNorm's running statistics) copied to every rank before
    each evaluation, as DDP copies them before every forward (broadcast_buffers) and timm's ``distribute_bn`` does
    before evaluating. Training never reads them (BatchNorm normalises a training batch by its own statistics), but
    each rank updates its own from its own shard, so without this the ranks of a backend that does not copy them
    (allreduce_manual, Horovod, FSDP2, DeepSpeed) would each score its shard with a different model, and the same
    training would evaluate differently under different backends. A broadcast through the one collective every
    backend has: the sum of rank 0's values and zeros. Returns the number of buffers copied."""
    if backend.world_size == 1:
        return 0
    buffers = list(backend.module.buffers())
    for b in buffers:  # in float64, whatever the buffer's dtype (a step count, a half-precision statistic): exact
        mine = b.detach().double() if backend.rank == 0 else torch.zeros_like(b, dtype=torch.float64)
        b.copy_(backend.all_reduce_sum(mine))
    return len(buffers)


class LoaderEpochs:
    """A real-data loader's epochs (``source.epoch(e)``: bench/rank/loaders) on the device, ``steps`` batches each: the
    DataLoader's length, the same on every rank (DistributedSampler pads the shards to one length, drop_last)."""

    def __init__(self, source, device, channels_last: bool):
        self.source, self.device, self.steps = source, device, len(source.loader)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.skipped = 0

    def epoch(self, e: int):
        non_blocking = self.device.type == "cuda"
        for images, targets, skipped in self.source.epoch(e):
            self.skipped += skipped
            yield (images.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format),
                   targets.to(self.device, non_blocking=non_blocking))


def _data(cfg, backend, a: dict):
    """(training epochs, held-out set, what the record says of them, evaluation loader workers). ``--data learnable``:
    the task of bench/rank/learnable.py, its training set and a disjoint held-out draw of ``cfg.eval_samples``;
    ``--data imagenet``: DIR/train through the torchvision loader and DIR/val (bench/rank/data.py ValFolder)."""
    from backends import models
    from bench.rank import data, learnable

    share = None if backend.launcher == "inproc" else data.shard_rank(backend)
    channels_last = bool((cfg.options or {}).get("channels_last"))
    if cfg.data == "learnable":
        workload = models.for_config(cfg)
        assert isinstance(workload, models.VisionWorkload), "--to-accuracy refuses other models (bench/plan/accuracy.py)"
        task = learnable.Task(cfg.image_size, min(learnable.CLASSES, workload.classes))
        x, y = task.train_set(a["train_samples"])
        xe, ye = task.held_out(cfg.eval_samples)
        train = learnable.Epochs(x, y, cfg.batch_size, cfg.world_size, share, cfg.seed, backend.data_device,
                                 channels_last)
        described = task.describe(len(x), len(xe), task.reachable(xe, ye))
        return train, torch.utils.data.TensorDataset(xe, ye), described, 0
    from bench.rank import loaders

    feeds = cfg.world_size if backend.launcher == "inproc" else 1  # dp feeds every GPU from one process
    backend.loader_workers = data.loader_workers(cfg, feeds)
    source = loaders.build("torchvision", cfg.decode or "cpu", cfg.data_dir, cfg.image_size, backend.feed_batch,
                           backend.loader_workers, share or 0, backend.world_size,
                           distributed=backend.launcher != "inproc", device=backend.data_device, seed=cfg.seed)
    held_out = data.ValFolder(cfg.data_dir, cfg.image_size)
    described = {"kind": "imagenet", "data_dir": cfg.data_dir, "train_samples": len(source.loader.dataset),
                 "held_out_samples": len(held_out), "reachable_accuracy": None,
                 "loader": "torchvision", "decode": cfg.decode or "cpu", "workers": backend.loader_workers}
    return LoaderEpochs(source, backend.data_device, channels_last), held_out, described, backend.loader_workers

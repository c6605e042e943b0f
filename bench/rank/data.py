"""Input data for the timed loop: a fixed synthetic batch, or an ImageNet folder through a real pipeline.

Backends take batches from ``backend.batches`` (an endless iterator of ``(inputs, targets)`` already on the
device); the harness builds it here and, for real data, times every ``next()`` so a window's
``data_wait_seconds`` says how long the ranks waited for input rather than computed.

ImageNet layout: ``DIR/train/<wnid>/*.JPEG``; ``DIR/val`` (class folders, or flat with a labels file: see
bench/rank/folders.py) is read by ``--eval``. The loader (``--loader torchvision|dali``, ``--decode cpu|gpu``) is one
of bench/rank/loaders; every one is timed here the same way and yields the same ``(images, targets, skipped)``.
Corrupt or unreadable images are skipped and counted (``corrupt_images_skipped``) with a warning line naming the
file in the run's log, and batches stay full; empty class folders are skipped with one warning (``empty_classes``).
Grayscale, CMYK and palette images are converted to RGB.
"""
from __future__ import annotations

import itertools
import time
from pathlib import Path

import torch

from backends import models
from bench.core.devices import usable_cpus
from bench.core.errors import UsageError
from bench.rank.loaders.tv import SkippingImageFolder  # the torchvision loader's dataset, re-exported

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DATA_KINDS = ("synthetic", "imagenet")


class DataError(UsageError):
    """A data directory the run cannot use; the message is one line."""


def default_workers(devices: int) -> int:
    """Loader processes per device: each device's share of the cores, leaving one core per training process."""
    return max(0, min(8, usable_cpus() // max(1, devices) - 1))


def loader_workers(cfg, feeds_devices: int) -> int:
    """DataLoader processes for one training process that feeds ``feeds_devices`` devices. ``--workers`` is per
    device for every backend, so nn.DataParallel's one process (feeding all N GPUs) gets N times as many as
    one DDP rank, capped by the cores; otherwise DataParallel would be input-bound by construction."""
    return min(cfg.workers * feeds_devices, usable_cpus()) if cfg.workers else 0


def check_imagenet(data_dir: str | None, global_batch: int) -> int:
    """Validate the layout before any run starts; returns the number of training images."""
    from bench.rank import folders

    if not data_dir:
        raise DataError("--data imagenet needs --data-dir DIR (DIR/train/<class>/*.JPEG)")
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"--data-dir {data_dir}: no such directory")
    train = root / "train"
    if not train.is_dir():
        raise DataError(f"--data-dir {data_dir}: no train/ folder (expected {train}/<class>/*.JPEG)")
    classes = folders.class_dirs(train)
    if not classes:
        raise DataError(f"{train} has no class folders (expected {train}/<class>/*.JPEG)")
    _, samples, _ = folders.scan(train)
    n = len(samples)
    if n == 0:
        raise DataError(f"{train} has {len(classes)} class folders but no images ({', '.join(folders.IMG_EXTENSIONS)})")
    if n < global_batch:
        raise DataError(f"{train} has {n} images, fewer than one global batch of {global_batch}; "
                        f"lower --batch-size or use fewer GPUs")
    check_decodes(samples)
    return n


DECODE_TRIES = 3  # files tried per class before its images are called unreadable


def check_decodes(samples: list[tuple[str, int]]) -> None:
    """Up to DECODE_TRIES images of every class decode, before anything is launched (64 text files named .JPEG once
    started torchrun and failed 11 s later, inside the ranks); a class whose first files all fail is refused in one line
    naming the file and why. A corrupt image among good ones is the loaders' business: they skip and count it."""
    from PIL import Image

    first: dict[int, list[str]] = {}
    for path, label in samples:
        if len(first.setdefault(label, [])) < DECODE_TRIES:
            first[label].append(path)
    for paths in first.values():
        why = None
        for path in paths:
            try:
                with Image.open(path) as im:
                    im.convert("RGB").load()
                break
            except Exception as e:  # noqa: BLE001 - any failure to decode is the answer
                why = why or f"{path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        else:
            raise DataError(f"no readable image among the first {len(paths)} of {Path(paths[0]).parent} ({why}); "
                            "is this an image folder?")


def empty_classes(data_dir: str) -> list[str]:
    from bench.rank import folders

    return folders.scan(Path(data_dir) / "train")[2]


def imagenet_loader(data_dir: str, image_size: int, batch: int, workers: int, rank: int, world_size: int,
                    distributed: bool, pin_memory: bool, seed: int = 0):
    """The standard ImageNet training pipeline (torchvision, CPU decode) as a DataLoader."""
    from bench.rank.loaders import tv

    dataset = SkippingImageFolder(str(Path(data_dir) / "train"), tv.cpu_transform(image_size))
    return tv.data_loader(dataset, batch, workers, rank, world_size, distributed, pin_memory, seed)


class _DataLoaderSource:
    def __init__(self, loader):
        self.loader = loader
        # what the record says this loader ran with (DALI's source says its own: bench/rank/loaders/dali.py)
        self.info = {"shuffle": f"{type(loader.sampler).__name__}, reshuffled every epoch (set_epoch)"
                     if hasattr(loader.sampler, "set_epoch") else type(loader.sampler).__name__,
                     "pin_memory": bool(loader.pin_memory), "workers": loader.num_workers}

    def epoch(self, n: int):
        if hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(n)  # a different order every epoch, the same on every rank
        for images, targets, skipped in self.loader:
            yield images, targets, int(skipped.sum())


class TimedBatches:
    """Endless ``(inputs, targets)`` on ``device`` over epochs of any loader (``source.epoch(n)``, or a
    DataLoader), timing each wait the same way for all of them."""

    def __init__(self, source, device, channels_last: bool = False):
        self.source = source if hasattr(source, "epoch") else _DataLoaderSource(source)
        self.info = getattr(self.source, "info", None)  # the loader's settings, for the record (loader_info)
        self.device = device
        self.empty_classes = len(getattr(self.source, "empty_classes", None) or [])
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.wait_seconds, self.skipped, self.epoch = 0.0, 0, 0
        self._it = self._batches()

    def _batches(self):
        non_blocking = self.device.type == "cuda"
        while True:
            for images, targets, skipped in self.source.epoch(self.epoch):
                self.skipped += skipped
                images = images.to(self.device, non_blocking=non_blocking, memory_format=self.memory_format)
                yield images, targets.to(self.device, non_blocking=non_blocking)
            self.epoch += 1

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        batch = next(self._it)
        self.wait_seconds += time.perf_counter() - t0
        return batch


def synthetic(batch: int, image_size: int | None, device: torch.device, rank: int, channels_last: bool = False,
              workload=None):
    """A fixed random batch already on the device, returned forever (as Horovod's synthetic benchmark does).
    Different on every rank, as real data would be; the same on every run. ``workload``: the run's
    (backends/models); by default a torchvision model's images."""
    gen = torch.Generator().manual_seed(1000 + rank)
    inputs, targets = (workload or models.VisionWorkload("", image_size)).batch(batch, gen)
    inputs = inputs.to(device)
    if channels_last and inputs.dim() == 4:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    return itertools.repeat((inputs, targets.to(device)))


def shard_rank(backend) -> int:
    """Whose share of the data this rank reads: its own (BENCH_FAULT wrong-shard sets another)."""
    return getattr(backend, "shard_rank", backend.rank)


def batches_for(cfg, backend):
    """The iterator a backend trains from, fed ``backend.feed_batch`` samples per step on ``backend.data_device``."""
    channels_last = bool((cfg.options or {}).get("channels_last"))
    if cfg.data == "synthetic":
        return synthetic(backend.feed_batch, cfg.image_size, backend.data_device, shard_rank(backend), channels_last,
                         models.for_config(cfg))
    from bench.rank import loaders

    feeds = cfg.world_size if backend.launcher == "inproc" else 1  # dp feeds every GPU from one process
    backend.loader_workers = loader_workers(cfg, feeds)
    source = loaders.build(cfg.loader or "torchvision", cfg.decode or "cpu", cfg.data_dir, cfg.image_size,
                           backend.feed_batch, backend.loader_workers, shard_rank(backend), backend.world_size,
                           distributed=backend.launcher != "inproc", device=backend.data_device, seed=cfg.seed)
    return TimedBatches(source, backend.data_device, channels_last)


# ---------------------------------------------------------------------------------------------------
# Evaluation sets and bench verify's batches

class SyntheticEval(torch.utils.data.Dataset):
    """A fixed, seeded evaluation set: sample i is the same input and target on every rank and every run."""

    def __init__(self, size: int, image_size: int | None, seed: int = 0, workload=None):
        self.size, self.seed = size, seed
        self.workload = workload or models.VisionWorkload("", image_size)

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        gen = torch.Generator().manual_seed(2000 + 1_000_003 * self.seed + i)
        inputs, targets = self.workload.batch(1, gen)
        return inputs[0], targets[0]


def eval_dataset(cfg):
    """The evaluation set of a run: ``cfg.eval_samples`` synthetic samples, or the ImageNet ``val/`` folder."""
    if cfg.data == "synthetic":
        return SyntheticEval(cfg.eval_samples, cfg.image_size, cfg.seed, models.for_config(cfg))
    return ValFolder(cfg.data_dir, cfg.image_size)


class ValFolder(torch.utils.data.Dataset):
    """DIR/val as class folders or flat with a labels file (bench/rank/folders.py), labels in train/'s order."""

    def __init__(self, data_dir: str, image_size: int):
        from torchvision import transforms

        from bench.rank import folders

        self.samples, self.layout = folders.val_samples(data_dir)
        self.transform = transforms.Compose([
            transforms.Resize(int(image_size * 256 / 224)),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from bench.rank.loaders.tv import pil_rgb

        path, target = self.samples[i]
        return self.transform(pil_rgb(path)), target


def check_eval(data_dir: str) -> None:
    """``--eval`` on ImageNet data needs DIR/val as class folders or flat with a labels file; say so before
    anything runs."""
    from bench.rank import folders

    val = Path(data_dir) / "val"
    if not val.is_dir():
        raise DataError(f"--eval with --data imagenet needs {val} (class folders, or flat with "
                        f"{' or '.join(folders.LABEL_FILES)})")
    try:
        samples, _ = folders.val_samples(data_dir)
    except FileNotFoundError as e:
        raise DataError(f"--eval: {e}") from None
    if not samples:
        raise DataError(f"--eval: no labelled images in {val}")


def verify_batches(global_batch: int, data_world: int, steps: int, image_size: int | None, seed: int,
                   device: torch.device, rank: int | None, workload=None):
    """bench verify's deterministic data: ``steps`` global batches drawn by DistributedSampler over one seeded
    set. Rank ``rank`` gets exactly the share a DistributedSampler gives it; ``rank=None`` (single and
    DataParallel) gets the whole global batch, ordered as the ranks' shares one after the other, so that
    DataParallel's scatter hands replica r what rank r of DDP would read."""
    from torch.utils.data import DistributedSampler

    share, n = global_batch // data_world, global_batch * steps
    gen = torch.Generator().manual_seed(3000 + seed)
    images, labels = (workload or models.VisionWorkload("", image_size)).batch(n, gen)
    shares = {r: list(DistributedSampler(range(n), num_replicas=data_world, rank=r, shuffle=True, seed=seed))
              for r in (range(data_world) if rank is None else [rank])}
    for k in range(steps):
        idx = [i for r in sorted(shares) for i in shares[r][k * share:(k + 1) * share]]
        yield images[idx].to(device), labels[idx].to(device)

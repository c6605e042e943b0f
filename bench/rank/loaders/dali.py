"""The DALI loader: one pipeline per rank, read -> decode -> random-resized-crop -> flip + normalise.

``fn.readers.file`` reads this rank's shard (``shard_id``/``num_shards``: contiguous, disjoint slices of one file
list that together cover it; each epoch the reader moves on to the next shard). Shuffling (``reader_kwargs``):
the file list is the sorted one shuffled once with the run's seed, the same on every rank, so every shard holds
every class from the first batch on; ``random_shuffle`` then draws each batch at random from a buffer of
``initial_fill`` files, a different order every epoch. DALI's own shuffles alone do not do this: its
``random_shuffle`` buffer is local (fn.readers.file's docstring: "The buffer shuffles the data only locally"), a
window of ~1,000 files of one class in a class-sorted list, and ``shuffle_after_epoch`` leaves the first epoch
in file order; a short run would train on a few classes per rank.

``fn.decoders.image`` runs as ``mixed`` (nvJPEG on the GPU) with ``--decode gpu`` and on the CPU otherwise. With
``--decode cpu`` and a CUDA device, decoding, cropping and normalising stay on the CPU and the pipeline's last
step copies the batch to the rank's GPU (``.gpu()``): DALI stages it in its own pinned memory and copies
asynchronously, where handing the iterator's CPU output (pageable ``torch.empty`` in
nvidia/dali/plugin/pytorch/__init__.py, ``DALIGenericIterator``) to ``.to(device, non_blocking=True)`` would be
a synchronous copy from pageable memory (torchvision's loader pins its batches). A CPU-only run has
``device_id=None`` and never touches CUDA. Grayscale, CMYK and palette images come out RGB (``output_type=RGB``).

Corrupt files: DALI's decoder stops the whole pipeline at the first file it cannot parse (it logs
``[ERROR] [jpeg_parser] ...`` to the run's log and raises). So the file list is pre-filtered: every file's header
is parsed once with PIL at start-up (on the full ImageNet a minute or so per rank), and a file that fails is left
out with a warning line naming it and counted in ``corrupt_images_skipped`` (each rank counts the bad files of its
own share). A file whose header parses but whose data is broken still reaches the decoder and fails the run.
The last batch of an epoch is filled from the next (DALI's ``LastBatchPolicy.FILL``), so batches stay full.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from bench.core.errors import UsageError
from bench.rank import folders
from bench.rank.loaders.tv import IMAGENET_MEAN, IMAGENET_STD, RATIO, SCALE, UNREADABLE


def readable_header(path: str) -> bool:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.size[0] > 0 and img.size[1] > 0
    except UNREADABLE:
        return False


def prefilter(samples: list[tuple[str, int]], rank: int, world_size: int) -> tuple[list[tuple[str, int]], int]:
    """(the samples whose header parses, how many of this rank's share did not)."""
    good, mine = [], 0
    for i, (path, label) in enumerate(samples):
        if readable_header(path):
            good.append((path, label))
        elif i % world_size == rank:
            mine += 1
            print(f"warning: skipping unreadable image {path}: DALI cannot decode it (header check)",
                  file=sys.stderr, flush=True)
    return good, mine


INITIAL_FILL = 1024  # DALI's default shuffle buffer (files), set on purpose and recorded


def shuffled(files: list[str], seed: int) -> list[int]:
    """The order the reader is given: the sorted list shuffled once with ``seed`` (the same on every rank, so the
    shards stay disjoint and cover the set)."""
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    return order


def reader_kwargs(files: list[str], rank: int, world_size: int, seed: int) -> dict:
    """``fn.readers.file``'s arguments for this rank. The labels are the samples' indices in ``files`` (the class
    comes from a lookup), so tests see which files a rank read."""
    order = shuffled(files, seed)
    return dict(files=[files[i] for i in order], labels=order, shard_id=rank, num_shards=world_size,
                random_shuffle=True, initial_fill=INITIAL_FILL, seed=seed + 1000 * rank, pad_last_batch=True,
                name="Reader")


def pipeline_devices(decode: str, device) -> dict:
    """Where each stage runs: ``device_id`` (None: the pipeline never touches CUDA), the decoder's device, and
    whether the pipeline copies its CPU output to the GPU itself (``--decode cpu`` on a CUDA device)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    return {"device_id": (device.index or 0) if cuda else None, "decoder": "mixed" if decode == "gpu" else "cpu",
            "to_gpu": cuda and decode == "cpu"}


class DaliSource:
    """``epoch(n)``: this rank's batches as ``(images, targets, skipped)``, images on ``device``."""

    def __init__(self, data_dir, image_size, batch, threads, rank, world_size, device, decode="cpu", seed=0):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        device = torch.device(device)
        _, samples, self.empty_classes = folders.scan(Path(data_dir) / "train")
        samples, self.skipped_once = prefilter(samples, rank, world_size)
        if len(samples) < batch * world_size:
            raise UsageError(f"{data_dir}/train has {len(samples)} readable images, fewer than one global batch")
        gpu = decode == "gpu"
        if gpu and device.type != "cuda":
            raise UsageError("--decode gpu decodes on a CUDA device (DALI mixed); use --decode cpu")
        self.targets = torch.tensor([c for _, c in samples])
        self.last_indices: list[int] = []
        where = pipeline_devices(decode, device)
        kwargs = reader_kwargs([p for p, _ in samples], rank, world_size, seed)
        self.info = {"shuffle": "file list shuffled once (seeded), then random_shuffle",
                     "initial_fill": kwargs["initial_fill"], "decoder": where["decoder"],
                     "copy_to_gpu": "dali" if where["to_gpu"] else None}

        @pipeline_def(batch_size=batch, num_threads=max(1, threads), device_id=where["device_id"],
                      seed=seed + 1000 * rank)
        def pipeline():
            jpegs, label = fn.readers.file(**kwargs)
            images = fn.decoders.image(jpegs, device=where["decoder"], output_type=types.RGB)
            images = fn.random_resized_crop(images, size=(image_size, image_size), random_area=list(SCALE),
                                            random_aspect_ratio=list(RATIO))
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD],
                                              mirror=fn.random.coin_flip(probability=0.5))
            return (images.gpu() if where["to_gpu"] else images), label

        pipe = pipeline()
        pipe.build()
        self.iterator = DALIGenericIterator([pipe], ["images", "labels"], reader_name="Reader",
                                            last_batch_policy=LastBatchPolicy.FILL, auto_reset=False)

    def epoch(self, n: int):
        if n:
            self.iterator.reset()
        for out in self.iterator:
            skipped, self.skipped_once = self.skipped_once, 0  # the pre-filtered files, counted once
            index = out[0]["labels"].view(-1).long()
            self.last_indices = index.tolist()
            yield out[0]["images"], self.targets[index], skipped

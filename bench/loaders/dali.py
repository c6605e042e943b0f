"""The DALI loader: one pipeline per rank, read -> decode -> random-resized-crop -> flip + normalise.

``fn.readers.file`` reads this rank's shard (``shard_id``/``num_shards``: contiguous, disjoint slices of one
sorted file list that together cover it; each epoch the reader moves on to the next shard, and
``random_shuffle`` shuffles within the shard). ``fn.decoders.image`` runs as ``mixed`` (nvJPEG on the GPU) with
``--decode gpu`` and on the CPU otherwise; a CPU-only pipeline has ``device_id=None`` and never touches CUDA.
Grayscale, CMYK and palette images come out RGB (``output_type=RGB``).

Corrupt files: DALI's decoder stops the whole pipeline at the first file it cannot parse (it logs
``[ERROR] [jpeg_parser] ...`` to the run's log and raises). So the file list is pre-filtered: every file's header
is parsed once with PIL at start-up (on the full ImageNet a minute or so per rank), and a file that fails is left
out with a warning line naming it and counted in ``corrupt_images_skipped`` (each rank counts the bad files of its
own share). A file whose header parses but whose data is broken still reaches the decoder and fails the run.
The last batch of an epoch is filled from the next (DALI's ``LastBatchPolicy.FILL``), so batches stay full.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from bench import folders
from bench.config import ConfigError
from bench.loaders.tv import IMAGENET_MEAN, IMAGENET_STD, RATIO, SCALE, UNREADABLE


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


class DaliSource:
    """``epoch(n)``: this rank's batches as ``(images, targets, skipped)``, images on ``device``."""

    def __init__(self, data_dir, image_size, batch, threads, rank, world_size, device, decode="cpu", seed=0):
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        device = torch.device(device)
        _, samples, self.empty_classes = folders.scan(Path(data_dir) / "train")
        samples, self.skipped_once = prefilter(samples, rank, world_size)
        if len(samples) < batch * world_size:
            raise ConfigError(f"{data_dir}/train has {len(samples)} readable images, fewer than one global batch")
        gpu = decode == "gpu"
        if gpu and device.type != "cuda":
            raise ConfigError("--decode gpu decodes on a CUDA device (DALI mixed); use --decode cpu")
        # The reader's label is the sample's index (its class comes from a lookup): tests see which files a rank read
        files, indices = [p for p, _ in samples], list(range(len(samples)))
        self.targets = torch.tensor([c for _, c in samples])
        self.last_indices: list[int] = []

        @pipeline_def(batch_size=batch, num_threads=max(1, threads), device_id=(device.index or 0) if gpu else None,
                      seed=seed + 1000 * rank)
        def pipeline():
            jpegs, label = fn.readers.file(files=files, labels=indices, shard_id=rank, num_shards=world_size,
                                           shuffle_after_epoch=True, seed=seed, pad_last_batch=True,
                                           name="Reader")
            images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
            images = fn.random_resized_crop(images, size=(image_size, image_size), random_area=list(SCALE),
                                            random_aspect_ratio=list(RATIO))
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD],
                                              mirror=fn.random.coin_flip(probability=0.5))
            return images, label

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

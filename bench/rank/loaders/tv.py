"""The torchvision loader: DataLoader workers over a class-folder tree, DistributedSampler shards.

Unreadable images are replaced by the next readable one of the epoch (so every batch stays full), a warning line
naming the file goes to the run's log, and each batch says how many it skipped. Grayscale, CMYK and palette
images are converted to RGB; very large images are read (PIL's decompression-bomb limit is for untrusted input).
"""
from __future__ import annotations

import itertools
import sys

import numpy as np
import torch
from PIL import Image

from bench.core.errors import UsageError
from bench.rank import folders

Image.MAX_IMAGE_PIXELS = None  # the user's own dataset: a 100-megapixel photo is an image, not an attack
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults, on every loader
UNREADABLE = (OSError, ValueError, SyntaxError, RuntimeError)  # PIL's errors for truncated or non-image files


def pil_rgb(path: str) -> Image.Image:
    with Image.open(path) as img:
        return img.convert("RGB")


class PilTransform:
    """Decode with PIL and augment on the CPU (in the DataLoader workers)."""

    def __init__(self, transform):
        self.transform = transform

    def __call__(self, path):
        return self.transform(pil_rgb(path))


class ReadForGpu:
    """Read for the GPU decoder: a baseline/progressive RGB or grayscale JPEG as its encoded bytes (1-D uint8),
    anything nvJPEG does not take (PNG, CMYK, palette) decoded here to a CHW uint8 RGB tensor (3-D)."""

    def __call__(self, path):
        with Image.open(path) as img:  # parses the header: a non-image fails here, in the worker
            if img.format == "JPEG" and img.mode in ("RGB", "L"):
                with open(path, "rb") as f:
                    return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
            rgb = img.convert("RGB")
        return torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)


class SkippingImageFolder(torch.utils.data.Dataset):
    """A class-folder tree (``bench.rank.folders.scan``: symlinks followed, empty classes skipped) whose unreadable
    images are replaced by the next readable one, and counted."""

    def __init__(self, root, transform=None, load=None):
        self.root = str(root)
        self.classes, self.samples, self.empty_classes = folders.scan(root)
        if not self.samples:
            raise UsageError(f"no images in {root}")
        self.load = load or PilTransform(transform)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        skipped = 0
        for i in itertools.islice(itertools.count(index), len(self.samples)):
            path, target = self.samples[i % len(self.samples)]
            try:
                return self.load(path), target, skipped
            except UNREADABLE as e:
                skipped += 1
                print(f"warning: skipping unreadable image {path}: {e}", file=sys.stderr, flush=True)
        raise UsageError(f"no readable image in {self.root}")


def collate_encoded(batch):
    """Keep the variable-size tensors as a list (the GPU decodes them); stack targets and skip counts."""
    items, targets, skipped = zip(*batch)
    return list(items), torch.tensor(targets), torch.tensor(skipped)


def cpu_transform(image_size: int):
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(image_size, scale=SCALE, ratio=RATIO),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def decode_jpeg(data, device):
    """nvJPEG through ``torchvision.io.decode_jpeg`` (a list decodes as one batch on CUDA), RGB out.

    torchvision 0.29 deprecates all its image decoders in favour of TorchCodec (torchvision/io/image.py,
    ``_DEPRECATION_MSG``). Its other decoder, ``decode_image``, is no successor here: it is deprecated too and has no
    ``device`` argument (CPU only). TorchCodec is not a dependency of this suite, so decode_jpeg stays, and its
    deprecation warning (raised on every call, torchvision/io/image.py ``_warn_deprecated``) is silenced here only."""
    import warnings

    import torchvision.io
    from torchvision.io import ImageReadMode

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                                category=DeprecationWarning)
        return torchvision.io.decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def decode_and_augment(items: list, image_size: int, device) -> tuple[torch.Tensor, int]:
    """One batch on ``device``: nvJPEG decodes the encoded JPEGs in one call (``decode_jpeg`` on a list), then
    random-resized-crop, flip and normalise per image there. A JPEG the decoder refuses (truncated data past a
    good header) is replaced by another image of the batch and counted, so the batch stays full."""
    from torchvision.transforms import RandomResizedCrop

    encoded = [i for i, t in enumerate(items) if t.dim() == 1]
    images: list = [None if t.dim() == 1 else t.to(device, non_blocking=True) for t in items]
    if encoded:
        try:
            decoded = decode_jpeg([items[i] for i in encoded], device)
        except RuntimeError:  # one bad file fails the batched call: decode one by one to find it
            decoded = []
            for i in encoded:
                try:
                    decoded.append(decode_jpeg(items[i], device))
                except RuntimeError as e:
                    print(f"warning: skipping image the GPU decoder refused: {e}", file=sys.stderr, flush=True)
                    decoded.append(None)
        for i, img in zip(encoded, decoded):
            images[i] = img
    good = [img for img in images if img is not None]
    if not good:
        raise UsageError("no decodable image in a whole batch")
    bad = sum(img is None for img in images)
    images = [img if img is not None else good[k % len(good)] for k, img in enumerate(images)]
    out = torch.empty(len(images), 3, image_size, image_size, device=device)
    for k, img in enumerate(images):
        top, left, h, w = RandomResizedCrop.get_params(img, SCALE, RATIO)
        crop = img[:, top:top + h, left:left + w].unsqueeze(0).float()
        crop = torch.nn.functional.interpolate(crop, size=(image_size, image_size), mode="bilinear",
                                               align_corners=False, antialias=True)[0]
        out[k] = crop.flip(-1) if torch.rand(()) < 0.5 else crop
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
    return (out - mean) / std, bad


def data_loader(dataset, batch: int, workers: int, rank: int, world_size: int, distributed: bool,
                pin_memory: bool, seed: int = 0, collate_fn=None):
    """DistributedSampler when every rank feeds its own batch: disjoint shards, padded to equal length,
    reshuffled by seed + epoch."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    if distributed:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    else:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers, pin_memory=pin_memory,
                      drop_last=True,  # every rank runs the same number of full steps
                      persistent_workers=workers > 0, collate_fn=collate_fn)


class TorchvisionSource:
    """``epoch(n)``: this rank's batches of epoch ``n`` as ``(images, targets, skipped)``."""

    def __init__(self, data_dir, image_size, batch, workers, rank, world_size, distributed, device, decode="cpu",
                 seed=0):
        from pathlib import Path

        self.device, self.decode, self.image_size = torch.device(device), decode, image_size
        root = Path(data_dir) / "train"
        if decode == "gpu":
            dataset = SkippingImageFolder(root, load=ReadForGpu())
            collate = collate_encoded
        else:
            dataset = SkippingImageFolder(root, cpu_transform(image_size))
            collate = None
        self.empty_classes = dataset.empty_classes
        self.loader = data_loader(dataset, batch, workers, rank, world_size, distributed,
                                  pin_memory=self.device.type == "cuda" and decode == "cpu", seed=seed,
                                  collate_fn=collate)

    def epoch(self, n: int):
        if hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(n)  # a different order every epoch, the same on every rank
        for images, targets, skipped in self.loader:
            if self.decode == "gpu":
                images, refused = decode_and_augment(images, self.image_size, self.device)
                skipped = skipped.sum() + refused
            yield images, targets, int(torch.as_tensor(skipped).sum())

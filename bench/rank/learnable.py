"""``--data learnable``: the to-accuracy mode's synthetic task, one a model can learn (synthetic data is one fixed random
batch with random labels: nothing to learn, and its accuracy is chance).

Class-conditional patterns plus noise. Each of CLASSES classes has a prototype: a random colour field drawn on a
GRID x GRID grid and upsampled bilinearly to the image size (smooth blobs a convolution picks up), scaled to SIGNAL
standard deviations per pixel; a sample is its class's prototype plus Gaussian noise of standard deviation 1.
Everything is drawn from seeds: the prototypes from the task's seed (fixed, TASK_SEED, whatever the run), the training
set and the held-out set from two different generators of it, so they are two independent draws that share no sample.

The reachable accuracy is known: with equal class priors and the same isotropic noise around every prototype, the
best classifier there is (the Bayes classifier) picks the nearest prototype; its top-1 on the held-out set
(``reachable``) is what no model can beat on average, ~100% at these settings. cnn-tiny at 16 px reaches 90% in about
3 epochs of the 2048-sample training set (SGD, lr 0.05 at batch 32), a few seconds on one CPU core.

Training reads the set in epochs as ``DistributedSampler`` (shuffled by the run's seed and the epoch, ``drop_last``)
shares it out: each rank its own share of every global batch; one process feeding every device (single, dp) the
global batch as the ranks' shares one after the other, as ``bench verify`` feeds them, so DataParallel's scatter hands
replica r what rank r of DDP reads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CLASSES = 10
SIGNAL = 0.25  # the prototypes' standard deviation per pixel; the noise's is 1
GRID = 4  # the prototypes' resolution before upsampling
TASK_SEED = 0  # the task is the same for every run; the run's seed sets the model's initialisation and the data order
TRAIN_SAMPLES = 2048


class Task:
    def __init__(self, image_size: int, classes: int = CLASSES, seed: int = TASK_SEED):
        self.image_size, self.classes, self.seed = image_size, classes, seed
        gen = torch.Generator().manual_seed(10_000 + seed)
        coarse = torch.randn(classes, 3, GRID, GRID, generator=gen)
        fields = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)
        self.prototypes = SIGNAL * fields / fields.flatten(1).std(1).view(-1, 1, 1, 1)

    def draw(self, n: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples, every class equally often (to within one), from generator ``stream`` of the task's seed."""
        gen = torch.Generator().manual_seed(20_000 + 2 * self.seed + stream)
        labels = torch.randperm(n, generator=gen) % self.classes
        return self.prototypes[labels] + torch.randn(n, 3, self.image_size, self.image_size, generator=gen), labels

    def train_set(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draw(n, 0)

    def held_out(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draw(n, 1)  # another generator: an independent draw, disjoint from the training set

    def reachable(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """The Bayes classifier's top-1 on ``(x, y)``: the nearest prototype (squared distance, one class at a time)."""
        dist = torch.stack([((x - p) ** 2).flatten(1).sum(1) for p in self.prototypes], 1)
        return float((dist.argmin(1) == y).float().mean())

    def describe(self, train: int, held_out: int, reachable: float) -> dict:
        return {"kind": "learnable", "classes": self.classes, "image_size": self.image_size, "task_seed": self.seed,
                "signal": SIGNAL, "noise": 1.0, "grid": GRID, "train_samples": train, "held_out_samples": held_out,
                "reachable_accuracy": reachable,
                "pattern": f"a {GRID}x{GRID} random colour field per class, upsampled bilinearly, x{SIGNAL:g}, "
                           "plus N(0, 1) noise per pixel"}


class Epochs:
    """Epochs of a set held in memory: ``epoch(e)`` yields this rank's ``steps`` batches of epoch ``e`` on ``device``
    (module docstring: DistributedSampler's shares; ``rank=None``: every rank's share of each global batch, in rank
    order, for one process that feeds every device)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, world: int, rank: int | None, seed: int, device,
                 channels_last: bool = False):
        self.x, self.y, self.batch, self.world, self.rank, self.seed = x, y, batch, world, rank, seed
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.steps = (len(x) // world) // batch

    def epoch(self, e: int):
        from torch.utils.data import DistributedSampler

        shares = []
        for r in range(self.world) if self.rank is None else [self.rank]:
            sampler = DistributedSampler(range(len(self.x)), num_replicas=self.world, rank=r, shuffle=True,
                                         seed=self.seed, drop_last=True)
            sampler.set_epoch(e)
            shares.append(list(sampler))
        for k in range(self.steps):
            idx = [i for share in shares for i in share[k * self.batch:(k + 1) * self.batch]]
            yield (self.x[idx].to(self.device).contiguous(memory_format=self.memory_format),
                   self.y[idx].to(self.device))

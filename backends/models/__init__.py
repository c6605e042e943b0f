"""Workloads: what a backend trains and on what batches (``--model``; names in bench/core/workloads.py). One object
per run, from the run's configuration: ``for_config(cfg)``.

Every workload gives the same five things, so the timed loop, verification, evaluation and the FLOP count need no
case for any of them: ``build()`` the model (seeded by the caller), ``batch(n, generator)`` n samples as
``(inputs, targets)`` on the CPU, ``loss(outputs, targets)`` the training loss (mean), ``per_sample(outputs,
targets)`` each sample's loss and accuracy for evaluation, and ``blocks(model)`` the repeated units FSDP2 shards one
by one and activation checkpointing wraps (None: the backend's own choice).

**Your own model** (``--model package.module:factory``): the factory is imported inside each rank and called with no
arguments. It returns an object or a dict with

- ``model``: a ``torch.nn.Module`` (on the CPU; the backend moves it);
- ``batch(n, generator)``: n samples as ``(inputs, targets)``, CPU tensors, drawn from ``generator`` (a seeded
  ``torch.Generator``), so every rank and run gets its own fixed batch;
- optionally ``loss(outputs, targets)`` (default: cross-entropy over the last dimension) and ``blocks`` (the modules
  to shard and checkpoint one by one; default: the backend's choice);
- optionally ``per_sample(outputs, targets)``: how evaluation (``--eval``, ``bench verify``) scores each sample, a
  tensor of per-sample losses, or ``(losses, accuracies)`` where an accuracy makes sense. Without it, a model with its
  own ``loss`` is scored by that loss on each sample alone, with no accuracy (its targets need not be classes); a model
  with the default loss is a classifier, scored by cross-entropy and top-1.

An import error or a factory that breaks the contract fails the run like any other error, with the traceback in
the run's log. See ``tests/user_model.py`` for a complete example.
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import torch
import torch.nn.functional as F

from bench.core import workloads


def for_config(cfg) -> "Workload":
    return workload(cfg.model, cfg.image_size, getattr(cfg, "seq_len", None),
                     bool((cfg.options or {}).get("channels_last")))


@functools.lru_cache(maxsize=8)  # one per run in a rank; a user's factory is imported and checked once
def workload(model: str, image_size: int | None, seq_len: int | None, channels_last: bool) -> "Workload":
    kind = workloads.of(model).kind
    if kind == "language":
        return GPTWorkload(model, seq_len)
    if kind == "custom":
        return UserWorkload(model)
    return VisionWorkload(model, image_size, channels_last)


class Workload:
    def build(self) -> torch.nn.Module:
        raise NotImplementedError

    def batch(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))

    def per_sample(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each sample's loss and its share of correct predictions (top-1), both float, one per sample; the accuracy
        None where the workload has none."""
        out = outputs.float()
        if out.dim() == 2:  # (batch, classes)
            return F.cross_entropy(out, targets, reduction="none"), (out.argmax(1) == targets).float()
        losses = F.cross_entropy(out.transpose(1, -1), targets, reduction="none")  # (batch, ..., classes)
        dims = tuple(range(1, losses.dim()))
        return losses.mean(dims), (out.argmax(-1) == targets).float().mean(dims)

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module] | None:
        return find_blocks(model)


def find_blocks(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """A model's repeated units: the ones a user's factory named (``blocks``), a transformer's layers
    (``model.blocks``, a ModuleList: gpt-<size>), or torchvision's residual blocks; None when it has none."""
    named = getattr(model, "_bench_blocks", None)
    if named:
        return list(named)
    if isinstance(getattr(model, "blocks", None), torch.nn.ModuleList):
        return list(model.blocks)
    # torchvision's ResNet blocks exist only where their module was imported: a cnn-tiny rank never imports it
    resnet = sys.modules.get("torchvision.models.resnet")
    if resnet is None:
        return None
    return [m for m in model.modules() if isinstance(m, (resnet.BasicBlock, resnet.Bottleneck))] or None


class VisionWorkload(Workload):
    """A torchvision classifier with random weights, 1000 classes, fed random images (the source articles'); or one
    of the suite's small CNNs (``cnn-tiny``: bench/core/workloads.py SMALL_CNNS), with its own classes."""

    def __init__(self, name: str, image_size: int, channels_last: bool = False):
        self.name, self.image_size, self.channels_last = name, image_size, channels_last
        self.classes = workloads.SMALL_CNNS[name][1] if name in workloads.SMALL_CNNS else 1000

    def build(self):
        if self.name in workloads.SMALL_CNNS:
            model = SmallCNN(*workloads.SMALL_CNNS[self.name])
        else:
            import torchvision  # here only: importing it imports torch._dynamo (1.5 s of CPU), which cnn-tiny needs not

            # Auxiliary classifiers would get no gradient from the main loss, which DDP rejects; benchmarks train
            # the main head only.
            extra = {"aux_logits": False} if self.name in ("googlenet", "inception_v3") else {}
            model = torchvision.models.get_model(self.name, weights=None, num_classes=1000, **extra)
        if self.channels_last:  # NHWC; the harness feeds channels-last batches too
            model = model.to(memory_format=torch.channels_last)
        return model

    def batch(self, n, generator):
        inputs = torch.randn(n, 3, self.image_size, self.image_size, generator=generator)
        return inputs, torch.randint(0, self.classes, (n,), generator=generator)

    def loss(self, outputs, targets):
        return F.cross_entropy(outputs, targets)


class SmallCNN(torch.nn.Module):
    """3x3 convolution, BatchNorm and ReLU per block, the first at stride 1 and the others at stride 2; global average
    pooling and a linear classifier. ``blocks`` is what FSDP2 shards one by one and activation checkpointing wraps."""

    def __init__(self, channels: tuple[int, ...], classes: int):
        super().__init__()
        widths = (3, *channels)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(c_in, c_out, 3, 1 if i == 0 else 2, 1, bias=False),
                                torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(inplace=True))
            for i, (c_in, c_out) in enumerate(zip(widths, widths[1:])))
        self.head = torch.nn.Linear(widths[-1], classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class GPTWorkload(Workload):
    """``gpt-<size>`` on uniformly random token sequences: inputs are ``seq_len`` tokens, targets the same sequence
    shifted by one (next-token prediction)."""

    def __init__(self, name: str, seq_len: int):
        self.name, self.seq_len = name, seq_len
        self.layers, self.width, self.heads, self.vocab = workloads.GPT_SIZES[name]

    def build(self):
        from backends.models.gpt import GPT

        return GPT(self.layers, self.width, self.heads, self.vocab, self.seq_len)

    def batch(self, n, generator):
        tokens = torch.randint(0, self.vocab, (n, self.seq_len + 1), generator=generator)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class UserWorkload(Workload):
    """``package.module:factory`` (the contract is in this module's docstring)."""

    def __init__(self, spec: str):
        module, _, name = spec.partition(":")
        self.spec = spec
        self.factory: Any = getattr(importlib.import_module(module), name, None)  # callable: checked next
        if not callable(self.factory):
            raise TypeError(f"--model {spec}: {module} has no callable {name!r}")
        with torch.random.fork_rng(devices=[]):  # the contract's check leaves the caller's random state alone
            made = self._made()
        get = made.get if isinstance(made, dict) else lambda key, default=None: getattr(made, key, default)
        self._batch: Any = get("batch")  # the factory's functions, checked by _made() (loss and per_sample optional)
        self._loss: Any = get("loss")
        self._per_sample: Any = get("per_sample")

    def _made(self):
        made = self.factory()
        get = made.get if isinstance(made, dict) else lambda key, default=None: getattr(made, key, default)
        if not isinstance(get("model"), torch.nn.Module) or not callable(get("batch")):
            raise TypeError(f"--model {self.spec}: the factory must return a torch.nn.Module as `model` and a "
                            f"`batch(n, generator)` function (got {type(made).__name__})")
        return made

    def build(self):
        """A new model from the factory (seeded by the caller, as every workload's)."""
        made = self._made()
        model = made["model"] if isinstance(made, dict) else made.model
        blocks = made.get("blocks") if isinstance(made, dict) else getattr(made, "blocks", None)
        model._bench_blocks = list(blocks) if blocks is not None else None
        return model

    def batch(self, n, generator):
        return self._batch(n, generator)

    def loss(self, outputs, targets):
        return self._loss(outputs, targets) if self._loss else super().loss(outputs, targets)

    def per_sample(self, outputs, targets):
        """The factory's ``per_sample``; else, with its own ``loss``, that loss on each sample alone and no accuracy;
        else a classifier's (cross-entropy and top-1)."""
        if self._per_sample:
            got = self._per_sample(outputs, targets)
            losses, correct = got if isinstance(got, tuple) else (got, None)
            return losses.float(), None if correct is None else correct.float()
        if self._loss:
            return torch.stack([self._loss(outputs[i:i + 1], targets[i:i + 1]).float()
                                for i in range(len(outputs))]), None
        return super().per_sample(outputs, targets)

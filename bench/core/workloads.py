"""What a run trains (``--model``), by name: the vocabulary every layer shares, with no torch.

- **vision**: a torchvision classification model (``resnet50``, ...) on ``--image-size`` px images, 1000 classes;
  samples are images (img/s). The source articles' workloads, and the default. Also ``cnn-tiny`` (SMALL_CNNS), a small
  convolutional network of this suite's own with 10 classes, for CPUs and tests.
- **language**: ``gpt-<size>``, the decoder-only transformer of backends/models/gpt.py on synthetic token sequences of
  ``--seq-len`` tokens, next-token cross-entropy; samples are sequences, and tokens/s = sequences/s x seq-len.
  The sizes below: GPT-3's shapes (Brown et al. 2020, table 2.1: layers, model width, heads) with GPT-2's vocabulary
  padded to a multiple of 64 (50304, as nanoGPT does), and small ones for CPUs and tests.
- **custom**: ``package.module:factory``, your own model (backends/models/__init__.py has the contract).
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import UsageError

# name: (layers, width, heads, vocabulary)
GPT_SIZES = {
    "gpt-micro": (2, 64, 2, 512),
    "gpt-tiny": (4, 256, 4, 8192),
    "gpt-small": (6, 384, 6, 8192),
    "gpt-medium": (8, 512, 8, 8192),
    "gpt-125m": (12, 768, 12, 50304),
    "gpt-350m": (24, 1024, 16, 50304),
    "gpt-760m": (24, 1536, 16, 50304),
    "gpt-1.3b": (24, 2048, 32, 50304),
    "gpt-2.7b": (32, 2560, 32, 50304),
    "gpt-6.7b": (32, 4096, 32, 50304),
}
# name: (channels of each conv block, classes): small convolutional networks built here (backends/models), not by
# torchvision, for CPUs and tests: cnn-tiny learns the to-accuracy mode's learnable task (bench/rank/learnable.py) to 90%
# top-1 in a few epochs of a few seconds each on one CPU core
SMALL_CNNS = {"cnn-tiny": ((16, 32, 64), 10)}
SMALL_CNN_MIN_SIZE = 8  # px: two stride-2 stages leave a 2x2 map
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_SEQ_LEN = {"cuda": 1024, "cpu": 64}


# What makes two runs the same workload: the model, its input's shape and the optimizer (every key list of the suite
# that groups runs is built from these: results.CONFIG_KEYS, the report's baseline match, the input-bound match).
FIELDS = ("model", "image_size", "seq_len", "optimizer")
# ... and what a report's table holds fixed: the same workload, per-device batch and data
TABLE_FIELDS = (*FIELDS, "batch_per_device", "data")


@dataclass(frozen=True)
class Workload:
    """A run's workload, classified once: ``kind`` (vision, language or custom), its sample ``unit`` (img, seq,
    sample), the input's ``shape`` for titles and the ``default_optimizer``. Built by ``of`` (a model name and its
    flags) or ``of_record`` (a record or a report's row)."""
    model: str
    kind: str
    image_size: int | None = None
    seq_len: int | None = None
    optimizer: str | None = None

    @property
    def unit(self) -> str:
        """What one sample is: an image (img), a sequence (seq), or a user model's sample."""
        if self.seq_len:
            return "seq"
        return "img" if self.image_size or self.kind != "custom" else "sample"

    @property
    def shape(self) -> str:
        """The input's shape, for titles: ``224px`` for an image model, ``seq 1024`` for a sequence model, nothing
        for a user's model (its batches are its own)."""
        if self.seq_len:
            return f"seq {self.seq_len}"
        return f"{self.image_size}px" if self.image_size else ""

    @property
    def default_optimizer(self) -> str:
        """SGD for the torchvision models (as the source articles train them), AdamW for the rest: the Adam state is
        what ZeRO and FSDP shard."""
        return "sgd" if self.kind == "vision" else "adamw"


def of(model: str, image_size: int | None = None, seq_len: int | None = None, optimizer: str | None = None) -> Workload:
    """The workload ``--model`` names, with its flags; one line (exit 2) for an unknown GPT size."""
    return Workload(model, _kind(model, strict=True), image_size, seq_len, optimizer)


def of_record(rec: dict) -> Workload:
    """The workload of a record, a configuration dict or a report's row (sizes NaN where rows mix workloads; records
    from before --optimizer trained with the workload's default)."""
    model = str(rec.get("model"))
    w = Workload(model, _kind(model, strict=False), size(rec, "image_size"), size(rec, "seq_len"))
    return Workload(w.model, w.kind, w.image_size, w.seq_len, rec.get("optimizer") or w.default_optimizer)


def _kind(model: str, strict: bool) -> str:
    if model in GPT_SIZES:
        return "language"
    if ":" in model:
        return "custom"
    if model.startswith("gpt-"):
        if strict:
            raise UsageError(f"--model {model!r}: unknown GPT size; choose from {', '.join(GPT_SIZES)}")
        return "language"
    return "vision"


def gpt_parameters(model: str, seq_len: int) -> int:
    """Parameters of ``gpt-<size>`` (the output layer shares the token embedding): embeddings, and per layer the
    attention's and MLP's weights and biases and two LayerNorms; then the final LayerNorm."""
    layers, width, _, vocab = GPT_SIZES[model]
    per_layer = 12 * width * width + 13 * width
    return vocab * width + seq_len * width + layers * per_layer + 2 * width


def size(rec: dict, key: str) -> int | None:
    """``rec[key]`` as an int, None where absent (a report's table holds NaN, and 224.0, where rows mix workloads)."""
    value = rec.get(key)
    return None if value is None or value != value else int(value)


def shape(rec: dict) -> str:
    """``of_record(rec).shape``: the input's shape for titles."""
    return of_record(rec).shape


def sample_unit(rec: dict) -> str:
    """``of_record(rec).unit``: what one sample is."""
    return of_record(rec).unit

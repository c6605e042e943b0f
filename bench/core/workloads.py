"""What a run trains (``--model``), by name: the vocabulary every layer shares, with no torch.

- **vision**: a torchvision classification model (``resnet50``, ...) on ``--image-size`` px images, 1000 classes;
  samples are images (img/s). The source articles' workloads, and the default.
- **language**: ``gpt-<size>``, the decoder-only transformer of backends/models/gpt.py on synthetic token sequences of
  ``--seq-len`` tokens, next-token cross-entropy; samples are sequences, and tokens/s = sequences/s x seq-len.
  The sizes below: GPT-3's shapes (Brown et al. 2020, table 2.1: layers, model width, heads) with GPT-2's vocabulary
  padded to a multiple of 64 (50304, as nanoGPT does), and small ones for CPUs and tests.
- **custom**: ``package.module:factory``, your own model (backends/models/__init__.py has the contract).
"""
from __future__ import annotations

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
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_SEQ_LEN = {"cuda": 1024, "cpu": 64}


def kind(model: str) -> str:
    if model in GPT_SIZES:
        return "language"
    if ":" in model:
        return "custom"
    if model.startswith("gpt-"):
        raise UsageError(f"unknown GPT size {model!r}; choose from {', '.join(GPT_SIZES)}")
    return "vision"


def default_optimizer(model: str) -> str:
    """SGD for the torchvision models (as the source articles train them), AdamW for the rest: the Adam state is
    what ZeRO and FSDP shard."""
    return "sgd" if kind(model) == "vision" else "adamw"


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
    """The input's shape, for titles: ``224px`` for an image model, ``seq 1024`` for a sequence model, nothing for
    a user's model (its batches are its own)."""
    if size(rec, "seq_len"):
        return f"seq {size(rec, 'seq_len')}"
    return f"{size(rec, 'image_size')}px" if size(rec, "image_size") else ""


def sample_unit(rec: dict) -> str:
    """What one sample is: an image (img), a sequence (seq), or a user model's sample."""
    if size(rec, "seq_len"):
        return "seq"
    return "img" if size(rec, "image_size") or ":" not in str(rec.get("model")) else "sample"

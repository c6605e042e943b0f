#!/usr/bin/env python3
"""Fail a GPU CI job that would otherwise pass by skipping: torch must see CUDA, on the expected GPU count.

With a driver older than the CUDA that PyPI's torch was built for, torch.cuda.is_available() is False,
every `gpu`-marked test skips and the gate benchmarks nothing on a GPU, and the job would still be green.

Usage: python scripts/expect_gpus.py [COUNT]   COUNT: the exact number of GPUs torch must see; empty or
absent: at least one (the GPU workflow passes BENCH_EXPECT_GPUS from the runner's .env file).
Exit 0 with one line naming what it saw, or 1 with one line saying what is wrong.
"""
from __future__ import annotations

import sys


def check(expected: str | None) -> str:
    """The line to print when the GPUs are as expected; raises SystemExit(message) otherwise."""
    import torch

    expected = (expected or "").strip()
    if expected and (not expected.isdigit() or int(expected) < 1):
        raise SystemExit(f"expect_gpus: expected GPU count {expected!r}: give a positive integer, or nothing "
                         "for 'at least 1'")
    if not torch.cuda.is_available():
        raise SystemExit(f"expect_gpus: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device: "
                         + ("this torch is a CPU build" if not torch.version.cuda else
                            f"the NVIDIA driver may be older than CUDA {torch.version.cuda} needs (nvidia-smi's "
                            "'CUDA Version' must be at least that), or CUDA_VISIBLE_DEVICES hides the GPUs"))
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    if expected and count != int(expected):
        raise SystemExit(f"expect_gpus: torch sees {count} GPU(s) ({', '.join(names)}), expected {expected} "
                         "(BENCH_EXPECT_GPUS in the runner's .env)")
    return f"expect_gpus: torch {torch.__version__} (CUDA {torch.version.cuda}) sees {count} GPU(s): {', '.join(names)}"


if __name__ == "__main__":
    print(check(sys.argv[1] if len(sys.argv) > 1 else None))

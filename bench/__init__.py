"""A harness that measures PyTorch multi-GPU training backends with one timed loop."""

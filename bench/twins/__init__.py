"""The plain twins (``bench run --reference``): one short file per workload kind, each the plainest PyTorch loop that
trains what the harness trains, run as a script of its own (never imported by the harness). They import torch,
torchvision and backends/models' model definitions only: nothing of bench (tests/test_reference.py checks)."""

"""The plain twins (``bench run --reference``): one short file per workload kind, each the plainest PyTorch loop that
trains what the harness trains, run as a script of its own (never imported by the harness). They import torch,
torchvision, backends/models' model definitions and loop.py (the training step and window schedule both share, in
plain torch) only: nothing else of bench (tests/test_reference.py checks)."""

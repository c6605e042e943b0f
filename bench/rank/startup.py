"""A rank's set-up without Python's cyclic garbage collector, and the collector back on before its first measured step.

Importing torch, torchvision and a backend's library makes about half a million objects that live as long as the
process. With the collector on (Python's default) each full collection it starts on the way walks all of them again:
six while a rank imports torch and torchvision, a fifth of a rank's start-up CPU time (0.5 of 2.6 s on this project's
2-core CPU VM), paid by every rank of every run and by every test that starts one.

``begin`` turns the collector off when a rank process starts (``python -m bench.rank``; a rank that
torch.multiprocessing.spawn started, once it runs). ``done``, called by each task before the first step it times or
repeats, runs one full collection (the cyclic garbage set-up left, tensors included, is freed before anything is
measured) and turns the collector back on: every timed loop runs with the collector as a user's script has it, in the
state a full collection leaves. The parent of spawned ranks only waits for them and keeps it off."""
from __future__ import annotations

import gc


def begin() -> None:
    gc.disable()


def done() -> None:
    """Idempotent: a task that calls it twice, or a process that never called ``begin``, pays nothing more."""
    if not gc.isenabled():
        gc.collect()
        gc.enable()

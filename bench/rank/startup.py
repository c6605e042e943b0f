"""A rank's set-up without Python's cyclic garbage collector; before its first measured step one full collection, and
then the collector back on, or, in the timed loop, kept off with a collection between windows.

Importing torch, torchvision and a backend's library makes about half a million objects that live as long as the
process. With the collector on (Python's default) each full collection it starts on the way walks all of them again:
six while a rank imports torch and torchvision, a fifth of a rank's start-up CPU time (0.5 of 2.6 s on this project's
2-core CPU VM), paid by every rank of every run and by every test that starts one.

``begin`` turns the collector off when a rank process starts (``python -m bench.rank``; a rank that
torch.multiprocessing.spawn started, once it runs). ``done``, called by each task before the first step it times or
repeats, runs one full collection (the cyclic garbage set-up left, tensors included, is freed before anything is
measured). Then:

- the timed loop (``done(timed=True)``, bench/rank/train.py) keeps automatic collection off and collects generations 0
  and 1 before each timed window (``between_windows``), outside the timed region: torchtitan's policy (automatic
  collection off, ``gc.collect(1)`` on a schedule), the same for every backend and for the plain twins
  (bench/twins/loop.py). A window lasts as long as its slowest rank, so a collection that starts in one rank's window
  and not in another's is a straggler whose cost grows with N; with it, none starts inside a window. Recorded as the
  record's ``gc_policy``.
- every other task (verify, to-accuracy, collectives, the peak, the overhead rounds) turns the collector back on, as a
  user's script has it.

The parent of spawned ranks only waits for them and keeps it off."""
from __future__ import annotations

import gc

TIMED_POLICY = ("automatic collection off in every rank from set-up on; one full collection before warm-up and "
                "gc.collect(1) before each timed window, outside it (torchtitan's policy)")


def begin() -> None:
    gc.disable()


def done(timed: bool = False) -> str | None:
    """One full collection; then the collector back on, or with ``timed`` kept off (the timed loop's policy, returned
    for the record). Without ``timed`` it is idempotent: a second call, or a process that never called ``begin``, pays
    nothing more."""
    if timed:
        gc.collect()
        gc.disable()
        return TIMED_POLICY
    if not gc.isenabled():
        gc.collect()
        gc.enable()
    return None


def between_windows() -> None:
    """The timed loop's collection before each window: the young generations, where a step's cyclic garbage is."""
    gc.collect(1)

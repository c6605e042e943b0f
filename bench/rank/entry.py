"""What a rank process runs first, whatever its task:

    python -m bench.rank --spec SPEC.json              (under torchrun / horovodrun / directly)
    python -m bench.rank --spec SPEC.json --spawn N    (starts N ranks with torch.multiprocessing.spawn)

The spec's ``task`` picks the rank code through TASKS (train, the default: the timed loop; verify; collectives;
overhead; accuracy: bench run --to-accuracy's epochs).
Out of memory, whichever task hit it, ends the rank at once with one marked line the launcher reads
(bench/core/markers.py)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import NoReturn

from bench.core.errors import DISK_FULL
from bench.core.markers import DISK_FULL_EXIT, DISK_FULL_MARKER, OOM_EXIT, OOM_MARKER, oom_evidence
from bench.rank import lifeline, startup
from bench.rank.memory import is_oom

# task -> "module:function(spec)"; imported only when a rank runs it
TASKS = {"train": "bench.rank.train:run", "verify": "bench.rank.verify:run_rank",
         "collectives": "bench.rank.collectives:run_rank", "overhead": "bench.rank.overhead:run_rank",
         "accuracy": "bench.rank.accuracy:run_rank",
         "peak": "bench.rank.peak:run_rank"}


def _spawned(index: int, spec: dict, nprocs: int) -> None:
    # torch.multiprocessing.spawn passes the index; give DDP the same environment torchrun would.
    startup.begin()  # torch is already imported here (unpickling this function did it); the backend's set-up is not
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(nprocs),
                      LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["master_port"]))
    guarded(spec)
    exit_done()


def exit_done() -> NoReturn:
    """End a rank process whose task finished (its results written, its process group destroyed) without the
    interpreter's finalisation. There, torch can still abort the process: a Gloo worker thread destroys a tensor
    that needs the GIL the dying interpreter no longer gives ("terminate called without an active exception",
    SIGABRT; pytorch/pytorch#179291). Here that took down 1 fsdp2 run in 8 after its record was written, failed the
    2-rank tests that spawn ranks, and across nodes would hold the rank in the SIGABRT handler for a verdict."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def guarded(spec: dict) -> None:
    """Run this rank's task; out of memory becomes the marked line and OOM_EXIT. The rank dies with its harness, and
    across nodes a lost node is named, whether a failed collective raises or NCCL's watchdog aborts the rank
    (bench/rank/lifeline.py). How NCCL handles an asynchronous error goes into the record's env."""
    lifeline.watch_harness()
    spec["env"] = {**(spec.get("env") or {}), "nccl_async_error_handling": lifeline.nccl_error_handling()}
    if lifeline.start(spec) is not None:
        lifeline.hold_aborts()
    module, _, func = TASKS[spec.get("task") or "train"].partition(":")
    try:
        getattr(importlib.import_module(module), func)(spec)
        lifeline.finish()
    except Exception as e:  # noqa: BLE001 - only out-of-memory and a full disk are handled here; the rest propagates
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            what = {"errno": e.errno, "strerror": e.strerror, "filename": e.filename}
            print(f"{DISK_FULL_MARKER} {json.dumps(what)}", file=sys.stderr, flush=True)
            os._exit(DISK_FULL_EXIT)
        if not is_oom(e):
            lifeline.verdict_on(e)  # several nodes: a lost node ends this rank naming it, else the error stands
            raise
        print(f"{OOM_MARKER} {oom_line(e)}", file=sys.stderr, flush=True)
        os._exit(OOM_EXIT)  # exit at once: other ranks are waiting on a collective that will never come


def oom_line(e: BaseException) -> str:
    """The error's first line, and the line that says an allocation failed where that is another (an NCCL error's
    first line names only the call; its last error says "Cuda failure 'out of memory'")."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else "out of memory"
    evidence = oom_evidence(text)
    return first if evidence is None or evidence in first else f"{first} ({evidence})"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rank")
    p.add_argument("--spec", required=True)
    p.add_argument("--spawn", type=int, default=0, help="start this many ranks with torch.multiprocessing.spawn")
    args = p.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    if args.spawn:
        import torch.multiprocessing as mp

        lifeline.watch_harness()  # the parent of the spawned ranks, too
        mp.spawn(_spawned, args=(spec, args.spawn), nprocs=args.spawn, join=True)
    else:
        guarded(spec)
        exit_done()

"""What ties a rank to the rest of its run, so that a death anywhere ends the run within seconds and says where:

- **The harness.** Every rank watches the harness process that started its run (HARNESS_ENV, a pidfd: no polling)
  and kills itself when that process is gone. A harness killed with SIGKILL (an OOM killer, a CI runner's hard
  cancel) can run no clean-up, and torchrun and horovodrun start ranks in sessions of their own, so without this the
  ranks would go on holding their GPUs. (The harness also gives the launcher a parent-death signal:
  bench/launch/tree.py.)
- **The other nodes.** With several nodes, local rank 0 of each node beats through the run's c10d store (the
  rendezvous store torchrun's agents share with the ranks, or MASTER_ADDR:MASTER_PORT under another engine) once a
  second, with its phase (setup, warm-up, window k of n, evaluation), and watches every other node's beat. A node
  whose beat has not moved for SILENT_S seconds is lost: the watcher prints one PEER_LOST_MARKER line naming it (its
  node, host, ranks and last phase) and ends its rank, whatever --timeout says and whether or not the collective it
  waits in would ever notice (a powered-off or partitioned node sends no TCP reset: gloo and NCCL would wait for
  their own timeouts, minutes). A rank whose collective fails (a reset connection) first waits up to SILENT_S +
  GRACE_S (5 s) for that verdict, so the record names the node that died instead of the rank that noticed.
- **NCCL's watchdog.** By default it takes a rank down with SIGABRT when a peer dies (bench/core/markers.py): no
  exception, so no wait for the verdict, and torchrun then stops the node's other ranks, the watching one too. Ranks
  therefore run with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 unless the user set it (the error reaches the rank as an
  exception, which waits as above), and a rank of several nodes that is aborted anyway (the user's 1 or 3, or any
  library's abort()) waits in its SIGABRT handler for the same verdict before it dies as it would have.

Nothing here runs in a one-node run but the harness watch (one idle thread per process).
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from bench.core.markers import (HARNESS_ENV, NCCL_ERROR_HANDLING, NCCL_ERROR_HANDLING_ENV, PEER_LOST_EXIT,
                                PEER_LOST_MARKER)

BEAT_S = 1.0  # one beat (a store add) per second per node
SILENT_S = 15.0  # a node whose beat has not moved for this long is lost (GIL pauses, a busy store: seconds at most)
STORE_TIMEOUT_S = 5.0  # one store call that takes longer counts as a store that does not answer
GRACE_S = 5.0  # after a failed collective, the watch gets SILENT_S and this long again to name a lost node
CONNECT_S = 600.0  # the store may come up after this rank (an external engine's rank 0 hosts it)
DONE = 1 << 40  # added to a node's beat when its ranks finished: a node that stops after this is not lost

_phase = "setup"
_wake = threading.Event()
_beat: "Heartbeat | None" = None


def set_phase(text: str) -> None:
    """Where this rank is now; the next beat (sent at once) carries it. Called outside every timed region."""
    global _phase
    _phase = text
    _wake.set()


# -- the harness ---------------------------------------------------------------------------------------------------

def watch_harness(environ=os.environ) -> None:
    """Kill this process when the harness named in HARNESS_ENV exits (or is already gone). No-op without it."""
    value = environ.get(HARNESS_ENV)
    if not value:
        return  # started by hand or by another engine: nothing to watch
    pid_text, _, started = value.partition(":")
    pid = int(pid_text)
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        _orphaned(pid)
        return
    if _start_time(pid) != started:  # the harness died before we looked, and its pid was reused
        _orphaned(pid)
        return

    def wait():
        select.select([fd], [], [])  # readable when the process exits
        _orphaned(pid)

    threading.Thread(target=wait, name="bench-harness-watch", daemon=True).start()


def _start_time(pid: int) -> str | None:
    import psutil

    try:
        return repr(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _orphaned(pid: int) -> None:
    print(f"bench: the harness (pid {pid}) is gone; rank process {os.getpid()} exits with it", file=sys.stderr,
          flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the other nodes -----------------------------------------------------------------------------------------------

class Heartbeat:
    """One node's beat and its watch of the others, through a client of the run's c10d store of its own."""

    def __init__(self, node: int, nnodes: int, addr: str, port: int, ranks: list[int], publish: bool,
                 silent: float = SILENT_S, prefix: str = "bench-heartbeat", grace: float = GRACE_S):
        self.node, self.nnodes, self.addr, self.port = node, nnodes, addr, port
        self.ranks, self.publish, self.silent, self.prefix, self.grace = ranks, publish, silent, prefix, grace
        self.host = socket.gethostname()
        self.others = [n for n in range(nnodes) if n != node]
        self.thread: threading.Thread | None = None
        self.store: Any = None  # a torch.distributed.TCPStore once the thread connects

    def _key(self, node: int, what: str) -> str:
        return f"{self.prefix}/{node}/{what}"

    def start(self) -> "Heartbeat":
        self.thread = threading.Thread(target=self._run, name="bench-heartbeat", daemon=True)
        self.thread.start()
        return self

    def _connect(self):
        import torch.distributed as dist

        store = dist.TCPStore(self.addr, self.port, is_master=False, timeout=timedelta(seconds=CONNECT_S),
                              wait_for_workers=False)
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
        return store

    def _run(self) -> None:
        try:
            self.store = self._connect()
        except Exception:  # noqa: BLE001 - no store reachable: the launcher's own timeouts apply
            return
        seen = {n: (0, time.monotonic()) for n in self.others}  # node -> (its last beat, when it last moved)
        answered, sent_phase = time.monotonic(), None
        while True:
            now = time.monotonic()
            try:
                if self.publish:
                    if _phase != sent_phase:
                        sent_phase = _phase
                        self.store.set(self._key(self.node, "info"), json.dumps(
                            {"host": self.host, "ranks": self.ranks, "phase": sent_phase}))
                    self.store.add(self._key(self.node, "beat"), 1)
                for n in self.others:
                    beat = self.store.add(self._key(n, "beat"), 0)
                    if beat != seen[n][0]:
                        seen[n] = (beat, now)
                answered = now
            except Exception as e:  # noqa: BLE001 - a store that does not answer is judged below
                if now - answered >= self.silent:
                    self._lost({"store": f"{self.addr}:{self.port}", "silent_seconds": round(now - answered, 1),
                                "error": str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__})
            for n, (beat, moved) in seen.items():
                # 0: the node has not started beating yet (the rendezvous and process-group timeouts cover that)
                if 0 < beat < DONE and now - moved >= self.silent:
                    self._lost({"node": n, **self._info(n), "silent_seconds": round(now - moved, 1)})
            _wake.wait(BEAT_S)
            _wake.clear()

    def _info(self, node: int) -> dict:
        try:
            return json.loads(self.store.get(self._key(node, "info")))
        except Exception:  # noqa: BLE001 - the beat counted; its description may not have reached the store
            return {}

    def _lost(self, what: dict) -> None:
        what.update(detected_by_node=self.node, detected_by_host=self.host, detected_at=time.time())
        print(f"{PEER_LOST_MARKER} {json.dumps(what, sort_keys=True)}", file=sys.stderr, flush=True)
        os._exit(PEER_LOST_EXIT)

    def finish(self) -> None:
        """This node's ranks are done: the others must not take its silence for a death."""
        if self.publish and self.store is not None:
            try:
                self.store.add(self._key(self.node, "beat"), DONE)
            except Exception:  # noqa: BLE001 - the others then see a silent node after their own end
                pass


def start(spec: dict, environ=os.environ) -> Heartbeat | None:
    """The node's heartbeat when the run spans several nodes and a c10d store is known; else None.
    Local rank 0 beats and watches; the other ranks watch only once a collective of theirs has failed (verdict)."""
    global _beat
    cfg = spec.get("config") or {}
    nnodes = int(cfg.get("nnodes") or 1)
    addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if nnodes < 2 or not addr or not (port or "").isdigit():
        return None
    world, local = int(environ.get("WORLD_SIZE", cfg.get("world_size", 1))), int(environ.get("LOCAL_WORLD_SIZE", 1))
    rank, local_rank = int(environ.get("RANK", 0)), int(environ.get("LOCAL_RANK", 0))
    node = spec.get("node_rank")
    if node is None:
        node = rank // max(1, local)
    first = rank - local_rank
    _beat = Heartbeat(int(node), nnodes, addr, int(port), list(range(first, min(world, first + local))),
                      publish=local_rank == 0)
    if local_rank == 0:
        _beat.start()
    return _beat


_COMM_ERROR = re.compile(r"connection (reset|closed|refused)|broken pipe|nccl|gloo|socket|timed? ?out|peer",
                         re.IGNORECASE)


def verdict_on(error: BaseException) -> None:
    """After a failed collective in a run of several nodes, give the watch up to SILENT_S + GRACE_S to name a lost node
    (it then ends this process); return when it names none, and the caller raises the error as it is."""
    if _beat is not None and _COMM_ERROR.search(f"{type(error).__name__} {error}"):
        _await_verdict()


_watching = threading.Lock()


def _await_verdict() -> None:
    beat = _beat
    with _watching:  # two callers at once (two aborting threads) start one watch
        if beat.thread is None:  # not local rank 0: watch now, from scratch
            beat.start()
    beat.thread.join(timeout=beat.silent + beat.grace)


# -- NCCL's watchdog -----------------------------------------------------------------------------------------------

def nccl_error_handling(environ=os.environ) -> str:
    """How this rank's NCCL process groups handle an asynchronous error (bench/core/markers.py): the user's value
    where either of torch's names is set, else NCCL_ERROR_HANDLING, set here before any process group exists."""
    for name in NCCL_ERROR_HANDLING_ENV:
        if environ.get(name):
            return environ[name]
    environ[NCCL_ERROR_HANDLING_ENV[0]] = NCCL_ERROR_HANDLING
    return NCCL_ERROR_HANDLING


_abort_handler = None  # the C function SIGABRT calls (kept referenced: ctypes frees an unreferenced callback)


def hold_aborts() -> None:
    """Several nodes: SIGABRT (NCCL's watchdog tearing the process down when a peer died, or any library's abort())
    first gives the watch the wait a failed collective gets, then ends the process as it would have. Python's own
    handlers cannot do this: they run in the main thread, later, and abort() does not return to let them. This one is
    C (ctypes), runs in the aborting thread and takes the GIL, which a rank blocked in a collective or a synchronize
    does not hold. glibc's abort() takes no lock before it raises the signal, so the handler may wait."""
    global _abort_handler
    import ctypes

    libc = ctypes.CDLL(None)
    libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_void_p)

    def on_abort(signum: int) -> None:
        wait = _beat.silent + _beat.grace
        print(f"bench: rank process {os.getpid()} got SIGABRT; waiting up to {wait:g} s for a verdict "
              f"on the other nodes first", file=sys.stderr, flush=True)
        _await_verdict()  # a lost node ends the process here, named (PEER_LOST_EXIT)
        libc.signal(signal.SIGABRT, int(signal.SIG_DFL))  # none: die of SIGABRT after all
        os.kill(os.getpid(), signal.SIGABRT)

    _abort_handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(on_abort)
    libc.signal(signal.SIGABRT, ctypes.cast(_abort_handler, ctypes.c_void_p))


def finish() -> None:
    if _beat is not None:
        _beat.finish()

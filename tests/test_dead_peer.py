"""A dead peer under NCCL. NCCL's watchdog, by default, takes a rank down with SIGABRT when a peer
dies: no Python exception, so no wait for the lifeline's verdict, and the record would name a rank killed by
SIGABRT instead of the node that died. Ranks therefore run with TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (the error
reaches them as an exception), and a rank that is aborted anyway waits in its SIGABRT handler for the verdict.
What can be tested without NCCL is tested over gloo: the setting and the handler here, and a two-node run whose
surviving rank is aborted from a thread of its own (BENCH_FAULT watchdog-abort) as NCCL's watchdog would in
tests/test_cluster_faults.py, beside the lost-node cases (each waits 15 s for a silent heartbeat: they run at
once)."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bench.core.markers import PEER_LOST_EXIT, PEER_LOST_MARKER
from bench.rank import entry
from tests.conftest import REPO


def _probe_task(spec):
    """A rank's task that only looks at what it was started with."""
    spec["seen"] = {"handling": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "env": dict(spec["env"])}


@pytest.mark.parametrize("user, expected", [
    ({}, "2"),  # ours: the error reaches the rank
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, "3"),  # the user's choice stands, and is recorded
    ({"NCCL_ASYNC_ERROR_HANDLING": "1"}, "1"),  # torch's older name, too
])
def test_ranks_create_their_process_groups_with_nccl_s_error_handling_set(monkeypatch, user, expected):
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "BENCH_HARNESS"):
        monkeypatch.setenv(name, "x")  # recorded by monkeypatch, so that whatever the rank code sets is undone
        monkeypatch.delenv(name)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(entry.TASKS, "probe", "tests.test_dead_peer:_probe_task")
    spec = {"task": "probe", "config": {"nnodes": 1}, "env": {"torch": "2.15.0"}}
    entry.guarded(spec)
    # set before the task runs (ProcessGroupNCCL reads it when it is created), and in what becomes the record's env
    assert spec["seen"]["handling"] == (None if "NCCL_ASYNC_ERROR_HANDLING" in user else expected)
    assert spec["seen"]["env"] == {"torch": "2.15.0", "nccl_async_error_handling": expected}


# A rank of a two-node run, reduced to its lifeline: a watch that names node 1 after 0.3 s (or that keeps watching
# and names nothing), and an abort() from a thread that is not Python's, as NCCL's watchdog thread calls it. The
# watch is silent after 0.5 s and gets 1 s of grace (a rank's: 15 s and 5 s), so the wait is 1.5 s.
_ABORTED_RANK = textwrap.dedent("""
    import ctypes, sys, time
    from bench.rank import lifeline

    class Watch(lifeline.Heartbeat):
        def _run(self):
            time.sleep(0.3)
            if sys.argv[1] == "names":
                self._lost({"node": 1, "host": "n1", "ranks": [1], "phase": "window 2 of 9", "silent_seconds": 15.0})
            time.sleep(60)

    lifeline._beat = Watch(0, 2, "127.0.0.1", 1, [0], publish=False, silent=0.5, grace=1.0)
    lifeline._beat.start()
    lifeline.hold_aborts()
    libc = ctypes.CDLL(None)
    libc.pthread_create(ctypes.byref(ctypes.c_ulong()), None, ctypes.cast(libc.abort, ctypes.c_void_p), None)
    time.sleep(60)  # the main thread, blocked as in a CUDA synchronize
""")


@pytest.mark.parametrize("watch", ["names", "names none"])
def test_an_aborted_rank_waits_for_the_verdict_then_dies_as_it_would_have(watch):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _ABORTED_RANK, watch], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    waited = time.monotonic() - t0
    assert "got SIGABRT; waiting up to 1.5 s for a verdict on the other nodes first" in proc.stderr, proc.stderr
    if watch == "names":
        assert proc.returncode == PEER_LOST_EXIT, proc.stderr
        assert re.search(rf'^{PEER_LOST_MARKER} .*"node": 1, .*"phase": "window 2 of 9"', proc.stderr, re.M)
    else:  # the watch ends without a verdict: the abort goes on, after the wait (0.5 + 1 s), not before
        assert proc.returncode == -signal.SIGABRT and PEER_LOST_MARKER not in proc.stderr, proc.stderr
        assert 1.5 <= waited < 60, waited

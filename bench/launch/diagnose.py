"""Why a run left no record, in one line, from its exit status and what its ranks printed: refused, a rendezvous
that never completed, a timeout, out of memory, or which rank died first and how."""
from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from bench.core import workloads
from bench.core.config import Nodes, RunConfig
from bench.core.markers import DISK_FULL_MARKER, OOM_MARKER, PEER_LOST_MARKER, REFUSED_MARKER, oom_evidence

# What a launcher puts before a rank's line: horovodrun "[0]<stderr>:", torch's "[rank0]: ".
_RANK_TAG = re.compile(r"^(?:\[\d+\]<std(?:out|err)>:|\[rank\d+\]:\s?)")


def _marked(output: str, marker: str) -> str | None:
    """The rest of the first line that starts with ``marker`` once a launcher's rank tag is removed, or None."""
    for line in output.splitlines():
        line = _RANK_TAG.sub("", line, count=1)
        if line.startswith(marker):
            return line[len(marker):].strip()
    return None


def failure_reason(cfg: RunConfig, output: str, rc: int, timed_out: bool, timeout: float, log_path,
                   nodes: Nodes | None = None, heap_budget: bool = False) -> str:
    """One line saying why a run left no record, from its exit status and everything its ranks printed.
    ``heap_budget``: the ranks ran under --memory-limit-gib (RLIMIT_DATA), where malloc returns NULL at the budget and
    a library that does not check it dies of SIGSEGV: that is read as out of memory, and says so."""
    refused = _marked(output, REFUSED_MARKER)
    if refused is not None:
        return "refused: " + refused
    if nodes is not None and nodes.nnodes > 1 and "RendezvousTimeoutError" in output:
        return (f"rendezvous timeout: not all {nodes.nnodes} nodes joined the rendezvous at {nodes.endpoint} within "
                f"{nodes.join_timeout:g} s (a node never started, or cannot reach the endpoint); log {log_path}")
    lost = lost_peer(output)
    if lost is not None:
        return f"{lost_text(lost)}; log {log_path}"
    if timed_out:
        return f"timeout after {timeout:.0f} s (log: {log_path})"
    oom = _marked(output, OOM_MARKER)
    if oom is None:  # no rank said so: an allocation failed where no Python exception reached a rank (NCCL's
        # watchdog thread takes the process down with its error; gloo or a library threw std::bad_alloc in C++)
        said = oom_evidence(output)
        oom = _RANK_TAG.sub("", said, count=1) if said else "std::bad_alloc" if "std::bad_alloc" in output else None
    if oom is None and heap_budget and rc == -signal.SIGSEGV:
        oom = ("probably: killed by SIGSEGV with the --memory-limit-gib heap budget in force (an allocation refused "
               "at the budget that a library did not check)")
    if oom:
        return (f"out of memory: batch {cfg.batch_size} per device ({cfg.global_batch} global), "
                f"{cfg.model} at {workloads.shape(cfg.to_dict())}, {cfg.precision}: {oom}")
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    who = _failed_rank(output)
    first = _first_error(output)
    # the harness writes this failed record itself (bench/launch/run.py): what the ranks never wrote is their own
    return (f"{who + '; ' if who else ''}{cfg.launcher} {how} before rank 0 wrote the run's results; "
            f"{'first error: ' + first + '; ' if first else ''}last lines: {_summary(output[-20000:], lines=3)}; "
            f"log {log_path}")


def disk_full(output: str) -> OSError | None:
    """The write a rank could not make for want of room (bench/rank/entry.py), as the OSError it raised, or None."""
    text = _marked(output, DISK_FULL_MARKER)
    if text is None:
        return None
    try:
        what = json.loads(text)
        return OSError(int(what["errno"]), what.get("strerror") or "no room", what.get("filename"))
    except (ValueError, KeyError, TypeError):
        return None


def lost_peer(output: str) -> dict | None:
    """What the first rank that found a lost node said about it (bench/rank/lifeline.py), or None. A refused run lost
    no peer: every node ends on purpose, and the store that goes away with node 0's agent is no lost node."""
    if _marked(output, REFUSED_MARKER) is not None:
        return None
    text = _marked(output, PEER_LOST_MARKER)
    if text is None:
        if "RendezvousConnectionError" in output:  # torchrun's agent here lost the store before a rank could judge
            m = re.search(r"--rdzv-endpoint=(\S+)", output)
            return {"store": m.group(1) if m else "?", "error": "torchrun's agent on this node lost its connection "
                                                                "to the rendezvous store (RendezvousConnectionError)"}
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"error": text}


def lost_text(lost: dict) -> str:
    by = f"noticed by node {lost.get('detected_by_node')} ({lost.get('detected_by_host')})"
    silent = f"{lost.get('silent_seconds')} s"
    if "store" in lost:
        if "silent_seconds" not in lost:
            return (f"lost the rendezvous store at {lost['store']}: the node hosting the rendezvous endpoint died or "
                    f"is cut off; {lost.get('error')}")
        return (f"lost the c10d store at {lost['store']} (the node hosting the rendezvous endpoint died or is cut "
                f"off): no answer for {silent}, {by}; last error: {lost.get('error')}")
    ranks = lost.get("ranks") or []
    span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "ranks unknown"
    return (f"lost node {lost.get('node')} (host {lost.get('host', '?')}, {span}) during "
            f"{lost.get('phase', 'an unknown phase')}: no heartbeat for {silent}, {by}")


def read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


_RANK_FAILURES = [  # how each launcher says which rank died and how
    (re.compile(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", re.S), "rank {0} exited with code {1}"),
    (re.compile(r"process (\d+) terminated with (exit code|signal) (\S+)"), "rank {0} terminated with {1} {2}"),
    (re.compile(r"Process (\d+) exit with status code (-?\d+)"), "rank {0} exited with code {1}"),
]


def _failed_rank(tail: str) -> str | None:
    if "Root Cause" in tail:  # torchrun lists every rank it stopped; the root cause is the one that failed
        tail = tail[tail.index("Root Cause"):]
    for pattern, text in _RANK_FAILURES:
        m = pattern.search(tail)
        if m:
            return text.format(*m.groups())
    return None


_ERROR_LINE = re.compile(r"(Error|Exception|BENCH_FAULT|error:|Killed|Segmentation fault|Aborted)")
# A Python exception's own line, as the traceback ends with it: ``ValueError: the message`` (``pkg.mod.Error: ...``)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\w*: \S")
# What a traceback quotes: a source line (``raise UsageError(...)``) or where it was, never the reason itself
_SOURCE_LINE = re.compile(r"^(?:raise |File \"|\^+$|~+$|return |[\w.]+\(.*\)$)")


# What the other ranks and the launcher say after one rank failed: the collapse, never its cause (gloo's and NCCL's
# lost connections, a collective aborted, torch.multiprocessing's report that a child exited)
_COLLAPSE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|ProcessExitedException|"
                       r"ProcessRaisedException|ChildFailedError|DistBackendError|communicator was aborted")


def _first_error(output: str) -> str | None:
    """The run's first error, as its cause says it: a fault BENCH_FAULT injected on purpose; else the first
    ``SomeError: message`` line that is not the collapse which followed (the rank that failed says why; the others
    report connections reset, collectives aborted); else the first exception line; else the first error-looking line
    that is not a source line a traceback quoted."""
    lines = [_RANK_TAG.sub("", ln, count=1).strip() for ln in output.splitlines() if not ln.startswith("$ ")]
    for line in lines:
        if line.startswith("BENCH_FAULT: injected"):
            return line[:400]
    for line in lines:
        if _EXCEPTION_LINE.match(line) and not _COLLAPSE.search(line):
            return line[:400]
    for line in lines:
        if _EXCEPTION_LINE.match(line):
            return line[:400]
    for line in lines:
        if _ERROR_LINE.search(line) and not _SOURCE_LINE.match(line):
            return line[:400]
    return None


def _summary(tail: str, lines: int = 6, limit: int = 1200) -> str:
    """The last few informative lines of the ranks' output, on one line (without torchrun's own traceback)."""
    cut = tail.find("ChildFailedError")
    if cut >= 0:
        start = tail.rfind("Traceback (most recent call last)", 0, cut)
        tail = tail[:start if start >= 0 else cut]
    keep = [ln.strip() for ln in tail.splitlines() if ln.strip() and not re.match(r"^[-=*^~ ]+$", ln.strip())]
    return " | ".join(keep[-lines:])[-limit:]

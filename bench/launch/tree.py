"""One run's process tree: started in a session of its own, waited for with a timeout, and taken down whole (on
timeout, Ctrl-C or SIGTERM of the harness): the launcher's process group, its descendants, and every process that
carries the run's tag (bench/core/markers.py, RUN_TAG), which finds ranks a launcher started in sessions of their
own after the launcher is gone."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from bench.core.markers import RUN_TAG


def run_group(cmd: list[str], env: dict, log_path: Path, timeout: float) -> tuple[int, bool]:
    """Run ``cmd`` in a new session; on timeout or interrupt kill it and every process of the run."""
    with open(log_path, "ab", buffering=0) as log:  # unbuffered: a full disk fails the write, not a later close
        try:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
        except OSError as e:  # a full disk: name the file (bench/cli.py says so in one line)
            raise OSError(e.errno, e.strerror, str(log_path)) from e
        # An interrupt that arrived inside Popen (after the fork, before Popen returned) would leave a started run
        # that nobody kills: hold SIGINT/SIGTERM until `proc` exists; the child unblocks them before exec.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
        harness = os.getpid()
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=lambda: _in_child(harness))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held interrupt is raised here, or below
        try:
            rc = proc.wait(timeout=timeout)
            kill_tree(proc, env.get(RUN_TAG), grace=0)  # anything the launcher left behind goes too
            return rc, False
        except subprocess.TimeoutExpired:
            kill_tree(proc, env.get(RUN_TAG))
            return proc.returncode, True
        except BaseException:  # Ctrl-C / SIGTERM of the harness: take the run down with us
            kill_tree(proc, env.get(RUN_TAG))
            raise


_INTERRUPTS = {signal.SIGINT, signal.SIGTERM}


_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child between fork and exec only calls it


def _in_child(harness: int) -> None:
    """In the launcher's process, before exec: interrupts unblocked, and SIGKILL when the harness dies (a harness
    killed with SIGKILL runs no clean-up; the ranks watch the harness themselves, bench/rank/lifeline.py)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != harness:  # the harness died before the line above: nobody would send the signal
        os._exit(1)


def _members(proc: subprocess.Popen, tag: str | None) -> list[psutil.Process]:
    """Every live process of the run: the launcher, its descendants, and whatever carries the run's tag in its
    environment (ranks that a launcher started in sessions of their own and that outlived it, reparented to init)."""
    found = {}
    try:
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            found[p.pid] = p
    except psutil.NoSuchProcess:
        pass
    if tag:
        me = os.getpid()
        for p in psutil.process_iter():
            if p.pid in found or p.pid == me:
                continue
            try:
                if p.environ().get(RUN_TAG) == tag:
                    found[p.pid] = p
            except (psutil.Error, OSError):
                pass
    return [p for p in found.values() if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(proc: subprocess.Popen, tag: str | None = None, grace: float = 5.0) -> None:
    """SIGTERM, then after ``grace`` seconds SIGKILL, the launcher's process group and every process of the run
    (launchers such as torchrun and horovodrun start their ranks in sessions of their own, which a process-group
    kill alone would miss); looks again for new members while it waits, then reaps the launcher."""
    deadline = time.monotonic() + grace
    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace > 0 else (signal.SIGKILL,)):
        _killpg(proc.pid, sig)
        signalled: set[int] = set()
        while True:
            family = _members(proc, tag)
            for p in family:
                if p.pid not in signalled:  # once each: a second SIGTERM would cut torchrun's own clean-up short
                    signalled.add(p.pid)
                    try:
                        p.send_signal(sig)
                    except psutil.Error:
                        pass
            if not family or time.monotonic() >= deadline + (10 if sig == signal.SIGKILL else 0):
                break  # all gone; or, after SIGKILL, unkillable (a rank stuck in the driver): never hang the sweep
            psutil.wait_procs(family, timeout=0.5)
        if not _members(proc, tag):
            break
    proc.wait()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

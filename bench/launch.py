"""Launchers: start one run as its own fresh OS process tree, wait with a timeout, and make sure exactly one
record exists for it afterwards (the worker's, or a failed/skipped one written here).

A launcher only builds a command line; the backend decides nothing about how it is started. DDP under
torchrun and DDP under torch.multiprocessing.spawn are one backend with two launchers.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench import results
from bench.config import ConfigError, Nodes, RunConfig, usable_cpus
from bench.worker import OOM_MARKER, REFUSED_MARKER

LAUNCHERS = ("inproc", "torchrun", "spawn", "horovodrun")
PORT_RETRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tool(name: str) -> str | None:
    """A console script from the same environment as this Python (the venv's torchrun, horovodrun)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def command(launcher: str, world_size: int, spec_path: str, nodes: Nodes | None = None, rdzv_id: str = "") -> list[str]:
    """The command line that starts one run. ``nodes``: several machines, each running this same command; torchrun
    joins them through its c10d rendezvous at the endpoint the user gave, horovodrun reaches the hosts it is given.
    """
    py = sys.executable
    worker = ["-m", "bench.worker", "--spec", spec_path]
    if launcher == "inproc":
        return [py, *worker]
    if launcher == "spawn":
        return [py, *worker, "--spawn", str(world_size)]
    if launcher == "torchrun":
        torchrun = _tool("torchrun")
        head = [torchrun] if torchrun else [py, "-m", "torch.distributed.run"]
        if nodes is None or nodes.nnodes == 1:
            return [*head, "--standalone", f"--nproc-per-node={world_size}", *worker]
        return [*head, f"--nnodes={nodes.nnodes}", f"--nproc-per-node={world_size // nodes.nnodes}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.endpoint}", f"--rdzv-id={rdzv_id or nodes.rdzv_id}",
                f"--rdzv-conf=join_timeout={nodes.join_timeout:g}", "--max-restarts=0",
                *([f"--local-addr={nodes.local_addr}"] if nodes.local_addr else []), *worker]
    if launcher == "horovodrun":
        hosts = nodes.hosts if nodes is not None and nodes.nnodes > 1 else f"localhost:{world_size}"
        return [_tool("horovodrun") or "horovodrun", "-np", str(world_size), "-H", hosts, "--gloo", py, *worker]
    raise ValueError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")


def launched_by(cfg: RunConfig, nodes: Nodes | None) -> str:
    if cfg.launcher == "torchrun":
        return "torchrun c10d rendezvous" if nodes is not None and nodes.nnodes > 1 else "torchrun --standalone"
    return {"inproc": "in process", "spawn": "torch.multiprocessing.spawn", "horovodrun": "horovodrun"}[cfg.launcher]


COMPILE_ALLOWANCE_S = 600.0  # torch.compile in warm-up: every rank compiles at once on the node's CPUs, cold cache


def default_timeout(cfg: RunConfig, nodes: Nodes | None = None) -> float:
    """Generous: start-up (imports, rendezvous, cuDNN autotune) plus a budget per step; several nodes add the
    time the rendezvous may wait for them, so a node that never joins fails as a rendezvous timeout.
    It grows with what makes a healthy run slower to reach its first step: --compile adds a fixed allowance
    (Inductor's compile of every rank's model, in warm-up), and the world size adds 2 s per rank beyond the
    first (processes importing torch and creating CUDA contexts at once) plus 20 s per doubling (the
    rendezvous and NCCL communicator set-up, whose rounds grow with log2 of the ranks)."""
    rendezvous = nodes.join_timeout if nodes is not None and nodes.nnodes > 1 else 0.0
    compile_s = COMPILE_ALLOWANCE_S if (cfg.options or {}).get("compile") else 0.0
    ranks = max(1, cfg.world_size)
    world_s = 2.0 * (ranks - 1) + 20.0 * math.ceil(math.log2(ranks))
    return 180.0 + rendezvous + compile_s + world_s + 5.0 * (cfg.warmup + cfg.steps * cfg.windows)


def threads_per_rank(cfg: RunConfig) -> int:
    procs = 1 if cfg.launcher == "inproc" else cfg.nproc_per_node  # the ranks that share this machine's cores
    return max(1, usable_cpus() // procs)


def run_one(cfg: RunConfig, results_dir: Path, env_meta: dict, backend, extra_env: dict | None = None,
            run_id: str | None = None, extra_spec: dict | None = None, timeout: float | None = None,
            threads: int | None = None, memory_limit_gib: float | None = None, nodes: Nodes | None = None,
            rdzv_id: str = "") -> dict:
    """Run one configuration to completion and return its record (also saved under ``results_dir``).
    ``extra_spec`` reaches the worker in its spec (``{"task": "verify", ...}`` runs bench verify's rank code).

    Several nodes (``nodes``): every node runs this; global rank 0, on whichever node the rendezvous put it,
    writes the record. Skipped and failed records are written by node 0's harness only, so a shared results
    directory gets exactly one record per run."""
    run_id = run_id or results.new_run_id(cfg.backend, cfg.world_size)
    writer = nodes is None or nodes.node_rank == 0
    record = results.skeleton(cfg.to_dict(), run_id, {**env_meta, "started_at": results.utc_now()})
    reason = backend.unavailable(cfg)
    if reason:
        record.update(status="skipped", reason=reason)
        if writer:
            results.save(record, results_dir)
        return record

    logs = results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path, spec_path = logs / f"{run_id}.log", logs / f"{run_id}.spec.json"
    threads = threads or threads_per_rank(cfg)
    child_env = {**os.environ, **(extra_env or {}), RUN_TAG: run_id,
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(results.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    # The same share of the cores per rank whatever the launcher (torchrun alone would force 1 thread per
    # rank, mp.spawn and horovodrun would give each rank every core), so launchers are compared fairly.
    child_env["OMP_NUM_THREADS"] = str(threads)
    timeout = cfg.timeout or timeout or default_timeout(cfg, nodes)

    first_port = os.environ.get("BENCH_MASTER_PORT")  # a fixed first choice (firewalls; tests of the retry)
    if first_port and not first_port.isdigit():
        raise ConfigError(f"BENCH_MASTER_PORT must be a port number, got {first_port!r}")
    for attempt in range(1, PORT_RETRIES + 1):
        port = int(first_port) if first_port and attempt == 1 else free_port()
        spec = {"config": cfg.to_dict(), "run_id": run_id, "results_dir": str(results_dir), "env": record["env"],
                "master_port": port, "threads_per_rank": threads, "memory_limit_gib": memory_limit_gib,
                "launched_by": launched_by(cfg, nodes), **(extra_spec or {})}
        spec_path.write_text(json.dumps(spec))
        start = log_path.stat().st_size if log_path.exists() else 0
        cmd = command(cfg.launcher, cfg.world_size, str(spec_path), nodes, rdzv_id)
        rc, timed_out = _run_group(cmd, child_env, log_path, timeout)
        saved = results_dir / f"{run_id}.json"
        if saved.exists():
            return json.loads(saved.read_text())
        if nodes is not None and nodes.nnodes > 1 and rc == 0 and not timed_out:
            # this node's ranks finished; global rank 0 was on another node and wrote the record there
            record.update(status="ok", record_elsewhere=True,
                          reason=f"record written by global rank 0 on another node (run {run_id})")
            return record
        output = _read_from(log_path, start)  # this attempt's output only
        if not timed_out and rc != 0 and "address already in use" in output.lower() and attempt < PORT_RETRIES:
            with open(log_path, "a") as log:
                log.write(f"bench: port {port} was in use; retrying with another (attempt {attempt + 1})\n")
            continue  # someone took the port between our probe and the rendezvous: try a new one
        break

    record.update(status="failed", reason=failure_reason(cfg, output, rc, timed_out, timeout, log_path, nodes))
    if writer:
        results.save(record, results_dir)
    return record


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
                   nodes: Nodes | None = None) -> str:
    """One line saying why a run left no record, from its exit status and everything its ranks printed."""
    refused = _marked(output, REFUSED_MARKER)
    if refused is not None:
        return "refused: " + refused
    if nodes is not None and nodes.nnodes > 1 and "RendezvousTimeoutError" in output:
        return (f"rendezvous timeout: not all {nodes.nnodes} nodes joined the rendezvous at {nodes.endpoint} within "
                f"{nodes.join_timeout:g} s (a node never started, or cannot reach the endpoint); log {log_path}")
    if timed_out:
        return f"timeout after {timeout:.0f} s (log: {log_path})"
    oom = _marked(output, OOM_MARKER)
    if oom is None and "std::bad_alloc" in output:  # an allocation failed in C++ (gloo, a library), not in torch
        oom = "std::bad_alloc"
    if oom:
        return (f"out of memory: batch {cfg.batch_size} per device ({cfg.global_batch} global), "
                f"{cfg.model} at {cfg.image_size} px, {cfg.precision}: {oom}")
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    who = _failed_rank(output)
    first = _first_error(output)
    return (f"{who + '; ' if who else ''}{cfg.launcher} {how}, no record written; "
            f"{'first error: ' + first + '; ' if first else ''}last lines: {_summary(output[-20000:], lines=3)}; "
            f"log {log_path}")


RUN_TAG = "BENCH_RUN_ID"  # in the environment of every process of a run: how the harness finds them all


def _run_group(cmd: list[str], env: dict, log_path: Path, timeout: float) -> tuple[int, bool]:
    """Run ``cmd`` in a new session; on timeout or interrupt kill it and every process of the run."""
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # An interrupt that arrived inside Popen (after the fork, before Popen returned) would leave a started run
        # that nobody kills: hold SIGINT/SIGTERM until `proc` exists; the child unblocks them before exec.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _INTERRUPTS)
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=_unblock_interrupts)
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


def _unblock_interrupts() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS)


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


def _read_from(path: Path, offset: int) -> str:
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


def _first_error(output: str) -> str | None:
    """The first error-looking line of the run: the rank that failed first usually says why; the others only
    report the collapse that followed (connection reset, timeouts)."""
    for line in output.splitlines():
        if _ERROR_LINE.search(line) and not line.startswith("$ "):
            return re.sub(r"^\[rank\d+\]:\s*", "", line.strip())[:400]
    return None


def _summary(tail: str, lines: int = 6, limit: int = 1200) -> str:
    """The last few informative lines of the ranks' output, on one line (without torchrun's own traceback)."""
    cut = tail.find("ChildFailedError")
    if cut >= 0:
        start = tail.rfind("Traceback (most recent call last)", 0, cut)
        tail = tail[:start if start >= 0 else cut]
    keep = [ln.strip() for ln in tail.splitlines() if ln.strip() and not re.match(r"^[-=*^~ ]+$", ln.strip())]
    return " | ".join(keep[-lines:])[-limit:]

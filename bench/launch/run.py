"""Launchers: start one run as its own fresh OS process tree, wait with a timeout, and make sure exactly one
record exists for it afterwards (rank 0's, or a failed/skipped one written here).

A launcher only builds a command line; the backend decides nothing about how it is started. DDP under
torchrun and DDP under torch.multiprocessing.spawn are one backend with two launchers.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
from pathlib import Path

import psutil

from bench.core import results
from bench.core.config import Nodes, RunConfig
from bench.core.devices import usable_cpus
from bench.core.errors import UsageError
from bench.core.markers import HARNESS_ENV, RANK_ENTRY, RUN_TAG
from bench.launch.diagnose import disk_full, failure_reason, lost_peer, read_from
from bench.launch.tree import run_group

LAUNCHERS = ("inproc", "torchrun", "spawn", "horovodrun")
PORT_RETRIES = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every launcher starts through this interpreter, never a console script found on PATH: a venv made with
# --system-site-packages (make ... TORCH=system) has no torchrun of its own, and the PATH's torchrun belongs to the
# base interpreter, whose ranks do not see the venv's packages (DeepSpeed was "not installed" on the first GPU
# machine). ``python -m torch.distributed.run`` is what the torchrun script runs; ``horovod.runner.launch`` is
# horovodrun's.
LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "horovodrun": "horovod.runner.launch"}


def command(launcher: str, world_size: int, spec_path: str, nodes: Nodes | None = None, rdzv_id: str = "") -> list[str]:
    """The command line that starts one run. ``nodes``: several machines, each running this same command; torchrun
    joins them through its c10d rendezvous at the endpoint the user gave, horovodrun reaches the hosts it is given.
    """
    py = sys.executable
    worker = ["-m", RANK_ENTRY, "--spec", spec_path]
    if launcher == "inproc":
        return [py, *worker]
    if launcher == "spawn":
        return [py, *worker, "--spawn", str(world_size)]
    if launcher == "torchrun":
        head = [py, "-m", LAUNCHER_MODULES["torchrun"]]
        if nodes is None or nodes.nnodes == 1:
            return [*head, "--standalone", f"--nproc-per-node={world_size}", *worker]
        return [*head, f"--nnodes={nodes.nnodes}", f"--nproc-per-node={world_size // nodes.nnodes}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={nodes.endpoint}", f"--rdzv-id={rdzv_id or nodes.rdzv_id}",
                f"--rdzv-conf=join_timeout={nodes.join_timeout:g}", "--max-restarts=0",
                *([f"--local-addr={nodes.local_addr}"] if nodes.local_addr else []), *worker]
    if launcher == "horovodrun":
        hosts = nodes.hosts if nodes is not None and nodes.nnodes > 1 else f"localhost:{world_size}"
        return [py, "-m", LAUNCHER_MODULES["horovodrun"], "-np", str(world_size), "-H", hosts, "--gloo", py, *worker]
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
    if cfg.window_s:  # windows sized by time: 4x their seconds (timed and compute-only windows, with room to spare)
        return 180.0 + rendezvous + compile_s + world_s + 5.0 * cfg.warmup + 4.0 * cfg.window_s * cfg.windows
    return 180.0 + rendezvous + compile_s + world_s + 5.0 * (cfg.warmup + cfg.steps * cfg.windows)


def harness_id() -> str:
    """HARNESS_ENV's value: this process's pid and creation time (bench/rank/lifeline.py watches it)."""
    return f"{os.getpid()}:{psutil.Process().create_time()!r}"


def threads_per_rank(cfg: RunConfig) -> int:
    if cfg.threads:  # the planner's, for every run of a CPU sweep alike
        return cfg.threads
    procs = 1 if cfg.launcher == "inproc" else cfg.nproc_per_node  # the ranks that share this machine's cores
    return max(1, usable_cpus() // procs)


def run_one(cfg: RunConfig, results_dir: Path, env_meta: dict, backend, extra_env: dict | None = None,
            run_id: str | None = None, extra_spec: dict | None = None, timeout: float | None = None,
            threads: int | None = None, memory_limit_gib: float | None = None, nodes: Nodes | None = None,
            rdzv_id: str = "", unavailable: str | None = None) -> dict:
    """Run one configuration to completion and return its record (also saved under ``results_dir``).
    ``extra_spec`` reaches the ranks in their spec (``{"task": "verify", ...}`` runs bench verify's rank code).
    ``unavailable``: why the caller already knows this run cannot run here (a real-data run's loader, which the
    planner asks the loader registry); otherwise the backend is asked.

    Several nodes (``nodes``): every node runs this; global rank 0, on whichever node the rendezvous put it,
    writes the record. Skipped and failed records are written by node 0's harness only, so a shared results
    directory gets exactly one record per run."""
    run_id = run_id or results.new_run_id(cfg.backend, cfg.world_size)
    writer = nodes is None or nodes.node_rank == 0
    record = results.skeleton(cfg.to_dict(), run_id, {**env_meta, "started_at": results.utc_now()})
    reason = unavailable or backend.unavailable(cfg)
    if reason:
        record.update(status="skipped", reason=reason)
        if writer:
            results.save(record, results_dir)
        return record

    logs = results_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path, spec_path = logs / f"{run_id}.log", logs / f"{run_id}.spec.json"
    threads = threads or threads_per_rank(cfg)
    child_env = {**os.environ, **(extra_env or {}), RUN_TAG: run_id, HARNESS_ENV: harness_id(),
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(results.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    # The same share of the cores per rank whatever the launcher (torchrun alone would force 1 thread per
    # rank, mp.spawn and horovodrun would give each rank every core), so launchers are compared fairly.
    child_env["OMP_NUM_THREADS"] = str(threads)
    timeout = cfg.timeout or timeout or default_timeout(cfg, nodes)

    first_port = os.environ.get("BENCH_MASTER_PORT")  # a fixed first choice (firewalls; tests of the retry)
    if first_port and not first_port.isdigit():
        raise UsageError(f"BENCH_MASTER_PORT must be a port number, got {first_port!r}")
    for attempt in range(1, PORT_RETRIES + 1):
        port = int(first_port) if first_port and attempt == 1 else free_port()
        spec = {"config": cfg.to_dict(), "run_id": run_id, "results_dir": str(results_dir), "env": record["env"],
                "node_rank": nodes.node_rank if nodes is not None else 0,
                "master_port": port, "threads_per_rank": threads, "memory_limit_gib": memory_limit_gib,
                "launched_by": launched_by(cfg, nodes), **(extra_spec or {})}
        results.write_json_atomic(spec, spec_path, overwrite=True)
        start = log_path.stat().st_size if log_path.exists() else 0
        cmd = command(cfg.launcher, cfg.world_size, str(spec_path), nodes, rdzv_id)
        rc, timed_out = run_group(cmd, child_env, log_path, timeout)
        saved = results_dir / f"{run_id}.json"
        if saved.exists():
            return json.loads(saved.read_text())
        if nodes is not None and nodes.nnodes > 1 and rc == 0 and not timed_out:
            # this node's ranks finished; global rank 0 was on another node and wrote the record there
            record.update(status="ok", record_elsewhere=True,
                          reason=f"record written by global rank 0 on another node (run {run_id})")
            return record
        output = read_from(log_path, start)  # this attempt's output only
        if not timed_out and rc != 0 and "address already in use" in output.lower() and attempt < PORT_RETRIES:
            with open(log_path, "a") as log:
                log.write(f"bench: port {port} was in use; retrying with another (attempt {attempt + 1})\n")
            continue  # someone took the port between our probe and the rendezvous: try a new one
        break

    full = disk_full(output)
    if full is not None:  # a rank found the disk full writing a result: stop as the harness's own write would
        raise full
    record.update(status="failed", reason=failure_reason(cfg, output, rc, timed_out, timeout, log_path, nodes,
                                                         heap_budget=bool(memory_limit_gib)))
    lost = lost_peer(output)
    if lost is not None:
        record["lost_node"] = lost  # several nodes: which node stopped answering, when and in which phase
        # node 0 writes no record when it is the one lost (it hosts the rendezvous endpoint, as a rule)
        writer = writer or lost.get("node") == 0 or "store" in lost
    if writer:
        results.save(record, results_dir)
    return record



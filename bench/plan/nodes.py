"""Beyond one machine, on the engines people already use. The suite never starts processes on other machines
itself: every node runs the same ``bench run --nnodes N --node-rank R --rdzv-endpoint HOST:PORT`` and torchrun's
c10d rendezvous joins them; horovodrun reaches the hosts it is given (``--hosts``); Slurm's srun starts the
command on every node (scripts/slurm/bench.sbatch); any other engine that sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT runs ``bench run --external`` in every process it starts (Kubeflow's PyTorchJob,
Ray). Every rank checks that all ranks run the same thing before any timed work (bench/rank/train.py). This
module holds the flags and the checks; ``bench run --external`` itself is in bench/commands/run.py and the Slurm node
list in bench/commands/nodelist.py.
"""
from __future__ import annotations

import os
import re

from bench.core.config import Nodes
from bench.core.errors import UsageError
from bench.core.flags import add_renamed

EXTERNAL_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def add_arguments(r) -> None:
    g = r.add_argument_group("several nodes (docs/several-nodes.md); every node runs the same command")
    g.add_argument("--nnodes", type=int, default=1, help="machines in each run (default 1)")
    g.add_argument("--node-rank", type=int, help="this machine's index, 0 .. nnodes-1 (node 0 writes failed and "
                                                 "skipped records and starts Horovod runs)")
    g.add_argument("--rdzv-endpoint", help="HOST:PORT of torchrun's c10d rendezvous, on one of the nodes")
    g.add_argument("--rdzv-id", default="bench", help="rendezvous id, the same on every node (default bench; each "
                                                      "run of the sweep appends its index)")
    add_renamed(g, "--rdzv-timeout-s", "--rdzv-timeout", dest="rdzv_timeout", type=float, default=300,
                metavar="SECONDS", help="seconds the rendezvous waits for every node before the run fails (default 300)")
    g.add_argument("--local-addr", help="this node's address as the others reach it (torchrun --local-addr)")
    g.add_argument("--hosts", help="horovodrun -H: host1:slots,host2:slots (Horovod runs start on node 0 only)")
    g.add_argument("--external", action="store_true",
                   help="run this process as one rank of a run started by another engine, which has set RANK, "
                        "WORLD_SIZE, MASTER_ADDR, MASTER_PORT and a local rank (LOCAL_RANK, or srun's "
                        "SLURM_LOCALID, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK; Kubeflow, Ray, Slurm srun, mpirun)")


def parse_nodes(args) -> Nodes | None:
    """The validated multi-node settings, or None for one node. Raises UsageError on bad values."""
    if args.nnodes is None or args.nnodes == 1:
        for flag in ("node_rank", "rdzv_endpoint", "hosts"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} is for several nodes; give --nnodes N (N > 1) too")
        return None
    if args.nnodes < 1:
        raise UsageError(f"--nnodes must be a positive integer, got {args.nnodes}")
    if args.node_rank is None or not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node-rank must be 0 .. {args.nnodes - 1} with --nnodes {args.nnodes}, got {args.node_rank}")
    if not args.rdzv_endpoint or not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", args.rdzv_endpoint):
        raise UsageError(f"--rdzv-endpoint {args.rdzv_endpoint!r}: expected HOST:PORT of the rendezvous, the same on "
                         "every node (e.g. node01:29500)")
    if args.rdzv_timeout <= 0:
        raise UsageError(f"--rdzv-timeout-s must be a positive number of seconds, got {args.rdzv_timeout:g}")
    return Nodes(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                 join_timeout=args.rdzv_timeout, hosts=args.hosts, local_addr=args.local_addr)


def external_world(args) -> tuple[int, int]:
    """(world size, nodes) from the environment an external engine set; UsageError naming what is missing.
    Also exports LOCAL_RANK and LOCAL_WORLD_SIZE, taken from the engine's own variables (local_rank_env), so
    every backend's ``cuda:LOCAL_RANK`` is this process's own GPU."""
    missing = [k for k in EXTERNAL_ENV if not os.environ.get(k)]
    if missing:
        raise UsageError(f"--external needs {', '.join(EXTERNAL_ENV)} (and LOCAL_RANK) from the engine that started "
                         f"this process; missing: {', '.join(missing)}")
    try:
        world = int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise UsageError(f"WORLD_SIZE {os.environ['WORLD_SIZE']!r} must be an integer") from None
    local_rank, local = local_rank_env(os.environ, _node_gpus(args))
    if world < 1 or local < 1 or world % local:
        raise UsageError(f"WORLD_SIZE {world} must be a positive multiple of LOCAL_WORLD_SIZE {local}")
    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(local_rank), str(local)
    return world, world // local


# Where each engine puts a process's rank and process count on its own node, in the order they are read.
# torchrun / Kubeflow / Ray set LOCAL_RANK; srun sets SLURM_LOCALID (and SLURM_NTASKS_PER_NODE only when
# --ntasks-per-node was given, SLURM_TASKS_PER_NODE always); Open MPI's mpirun OMPI_COMM_WORLD_LOCAL_*;
# MVAPICH2 MV2_COMM_WORLD_LOCAL_*; MPICH's and Intel MPI's Hydra MPI_LOCALRANKID / MPI_LOCALNRANKS.
LOCAL_ENV = (("LOCAL_RANK", ("LOCAL_WORLD_SIZE",)),
             ("SLURM_LOCALID", ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")),
             ("OMPI_COMM_WORLD_LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
             ("MV2_COMM_WORLD_LOCAL_RANK", ("MV2_COMM_WORLD_LOCAL_SIZE",)),
             ("MPI_LOCALRANKID", ("MPI_LOCALNRANKS",)))


def local_rank_env(env, gpus: int) -> tuple[int, int]:
    """(local rank, processes on this node) from the first engine variable set in ``env``. With none set, a
    node of one GPU (or a CPU run, ``gpus`` 0) is rank 0 of 1; a node of several GPUs is refused: every rank
    would otherwise train on cuda:0."""
    for rank_var, size_vars in LOCAL_ENV:
        if not env.get(rank_var):
            continue
        size_var = next((v for v in size_vars if env.get(v)), None)
        try:
            rank = int(env[rank_var])
            size = _tasks_on_this_node(env, size_var) if size_var else max(1, rank + 1)
        except ValueError:
            raise UsageError(f"{rank_var}={env[rank_var]!r} / {size_var}={env.get(size_var)!r}: expected integers "
                             "(the engine's local rank and processes per node)") from None
        if not 0 <= rank < size:
            raise UsageError(f"{rank_var}={rank} is not a local rank of {size} process(es) per node ({size_var})")
        if gpus and rank >= gpus:
            raise UsageError(f"{rank_var}={rank} but this node has {gpus} GPU(s): start at most one process per GPU")
        return rank, size
    if gpus > 1:
        raise UsageError(f"--external on a node with {gpus} GPUs needs this process's local rank from its engine, "
                         f"and none of {', '.join(v for v, _ in LOCAL_ENV)} is set (every rank would use cuda:0)")
    return 0, 1


def _tasks_on_this_node(env, var: str) -> int:
    """SLURM_TASKS_PER_NODE is Slurm's compressed per-node list, '2(x3),1': this node's entry (SLURM_NODEID)."""
    text = env[var]
    if var != "SLURM_TASKS_PER_NODE":
        return int(text)
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(text)
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID") or 0)
    return counts[node] if node < len(counts) else counts[-1]


def _node_gpus(args) -> int:
    """GPUs this process could pick from; 0 for a CPU run (its local rank picks no device)."""
    if getattr(args, "device", None) == "cpu":
        return 0
    from bench.core import cuda

    return cuda.count() if cuda.available() else 0

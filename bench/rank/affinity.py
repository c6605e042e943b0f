"""A rank bound to the CPUs near its GPU. On a machine with several NUMA nodes, a rank whose threads run on the other
socket reaches its GPU, and the memory it pins for it, across the socket link, and the scheduler may move it there at
any time: one more source of uncorrelated host pauses, and a window lasts as long as its slowest rank. Each rank of a
CUDA run is bound (every thread it has, and so every thread it starts after) to the CPUs NVML names near its GPUs
(``nvmlDeviceGetCpuAffinity``: its NUMA node's), within the CPUs it may use (a Slurm cpuset, taskset), whatever the
launcher; ``bench run --no-bind`` leaves the scheduler free. The record's ``cpu_binding`` says, per rank, the CPUs it
ran on or why it was not bound. torchrun's own ``--numa-binding`` would bind torchrun's ranks only (with numactl), not
those of mp.spawn, horovodrun or DataParallel's one process."""
from __future__ import annotations

import os

from bench.core import cuda, nvml
from bench.core.devices import numa_nodes

NO_BIND = "--no-bind"


def bind(devices, enabled: bool = True) -> dict:
    """Bind this process to the CPUs near the CUDA devices in ``devices`` (a rank's, after set-up), where the machine
    has more than one NUMA node; ``{"cpus": "0-15,32-47" or None, "reason": why not or None}``."""
    gpus = [d for d in devices if d.type == "cuda"]
    if not gpus:
        return {"cpus": None, "reason": "no GPU"}
    if not enabled:
        return {"cpus": None, "reason": NO_BIND}
    nodes = numa_nodes()
    if nodes < 2:
        return {"cpus": None, "reason": "one NUMA node: every CPU is as near as any other"}
    try:
        with nvml.open() as n:
            near = set().union(*(n.cpu_affinity(cuda.nvml_index(d.index)) for d in gpus))
    except nvml.Unavailable as e:
        return {"cpus": None, "reason": str(e)}
    except RuntimeError as e:  # torch's own: a CUDA device's NVML index could not be read
        return {"cpus": None, "reason": f"NVML index unknown: {e}"}
    allowed = os.sched_getaffinity(0)
    cpus = near & allowed
    if not cpus:
        return {"cpus": None, "reason": f"the CPUs near GPU {', '.join(str(d.index) for d in gpus)} ({cpu_list(near)}) "
                                        f"are outside this process's ({cpu_list(allowed)})"}
    for tid in os.listdir("/proc/self/task"):  # every thread set-up started (NCCL's, the allocator's), not only this one
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return {"cpus": cpu_list(cpus), "reason": None}


def bind_rank(spec: dict, cfg, devices) -> dict:
    """A rank's binding (``bind``; ``spec["bind_cpus"]`` False: ``--no-bind``), then its intra-op threads cut to its
    share of the CPUs it is bound to (``bound_threads``); ``spec["threads_per_rank"]`` then says what ran."""
    import torch

    binding = bind(devices, spec.get("bind_cpus", True))
    threads = bound_threads(spec["threads_per_rank"], binding["cpus"], devices,
                            1 if cfg.launcher == "inproc" else cfg.nproc_per_node,
                            (cfg.options or {}).get("ranks_per_gpu") or 1)
    if threads != spec["threads_per_rank"]:
        torch.set_num_threads(threads)
        spec["threads_per_rank"] = threads
    return binding


def bound_threads(threads: int, cpus: str | None, devices, local_ranks: int, per_gpu: int = 1) -> int:
    """The intra-op threads of a rank that ``bind`` bound to ``cpus``: at most its share of them, shared with the other
    ranks of this host whose GPUs are near the same CPUs. The launcher's share (the cores over the ranks) assumed the
    ranks spread over every CPU; bound, single@1 would run a thread per core of both sockets on one socket's cores,
    and two ranks whose GPUs sit on one socket twice as many threads as it has. ``local_ranks``: this host's ranks,
    which use CUDA devices 0, 1, ... (``per_gpu`` ranks each: --ranks-per-gpu); DataParallel's one process drives every
    GPU and shares its CPUs with no other rank. Unchanged where the rank was not bound or NVML cannot say."""
    if cpus is None:
        return threads
    mine = len(_parse(cpus))
    gpus = [d for d in devices if d.type == "cuda"]
    sharing = 1
    if len(gpus) == 1:
        try:
            with nvml.open() as n:
                near = [n.cpu_affinity(cuda.nvml_index(i)) for i in range(max(1, local_ranks // max(1, per_gpu)))]
                me = n.cpu_affinity(cuda.nvml_index(gpus[0].index))
        except (nvml.Unavailable, RuntimeError):
            return threads
        sharing = max(1, per_gpu) * max(1, sum(1 for cpus_of in near if cpus_of == me))
    return max(1, min(threads, mine // sharing))


def _parse(cpus: str) -> set[int]:
    """``"0-3,8"`` as ``{0, 1, 2, 3, 8}``: ``cpu_list``'s inverse."""
    out: set[int] = set()
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def cpu_list(cpus) -> str:
    """``{0, 1, 2, 3, 8}`` as ``"0-3,8"`` (taskset's and Slurm's notation)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)

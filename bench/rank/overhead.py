"""The host-overhead task of a rank (``bench overhead``): every backend at world size 1 in this one process, on the CPU
with one thread, trains the probe model (backends/models/overhead.py: negligible compute), in interleaved rounds, and
the time per step is the backend's fixed host cost. One process for all backends: the same interpreter, allocator and
neighbours for each, and rounds interleaved so drift hits all alike; the process group (gloo, one rank) is shared.
The command's half, which launches this and prints the table, is bench/commands/overhead.py.

One process must not mean one backend's cost charged to the others: DeepSpeed's ZeRO-3 replaces
``torch.nn.functional.linear`` for the whole process when it sets up (its ``zero3_linear_wrap``) and leaves it so, and
every Linear layer of every backend timed after it then ran through DeepSpeed's wrapper (single's step cost 1.5x its
own). So each backend's replacements of torch's functions (``PATCHED``: ``torch``, ``torch.nn.functional``,
``torch.Tensor``) are noted at its set-up, undone, and put back only while that backend is timed (``patches`` in its
row); and DeepSpeed on a CPU keeps torch's own CUDA check (backends/deepspeed_zero.py ``cpu_environment``)."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.core.config import RunConfig
from bench.core.overhead import OVERHEAD_SCHEMA
from bench.core.results import utc_now, write_json_atomic
from bench.rank import startup


def patch_points() -> dict:
    """Every public attribute of the modules in ``PATCHED`` (what a backend may replace process-wide), by identity."""
    import torch

    return {(module, name): getattr(module, name) for module in (torch, torch.nn.functional, torch.Tensor)
            for name in dir(module) if not name.startswith("__")}


def replaced(before: dict, after: dict) -> dict:
    """The patch points whose value changed between two ``patch_points()`` (new ones are left alone)."""
    return {k: v for k, v in after.items() if k in before and before[k] is not v}


def apply(patches: dict) -> None:
    for (module, name), value in patches.items():
        setattr(module, name, value)


def patch_name(key) -> str:
    module, name = key
    return f"{getattr(module, '__module__', '') + '.' if isinstance(module, type) else ''}" \
           f"{getattr(module, '__name__', str(module))}.{name}"


def run_rank(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    import backends
    from bench.rank import data

    o = spec["overhead"]
    torch.set_num_threads(1)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(spec["master_port"]))
    dist.init_process_group("gloo")  # one group for every backend (each skips its own when one exists)
    base = RunConfig.from_dict(spec["config"])
    ready, rows, own = [], {}, {}
    import torch._dynamo  # noqa: F401 - its import wraps torch.manual_seed, for every backend alike: before the snapshot
    pristine = patch_points()
    for name in o["backends"]:
        backend = backends.create(name)
        cfg = RunConfig.from_dict({**base.to_dict(), "backend": name, "launcher": backend.launcher,
                                   "precision": "fp32", "options": {}}).validate()
        reason = backend.unavailable(cfg)
        if reason:
            rows[name] = {"backend": name, "status": "skipped", "reason": reason}
            continue
        backend.setup(cfg)
        backend.batches = data.batches_for(cfg, backend)
        backend.train(o["warmup"])
        own[name] = replaced(pristine, patch_points())  # this backend's process-wide replacements, undone for now
        apply({k: pristine[k] for k in own[name]})
        ready.append(backend)
        rows[name] = {"backend": name, "status": "ok", "reason": None, "cpu_s": [], "wall_s": [],
                      "patches": sorted(patch_name(k) for k in own[name])}
    startup.done()  # the collector back on before the timed rounds (bench/rank/startup.py)
    for r in range(o["rounds"]):
        order = ready[r % len(ready):] + ready[:r % len(ready)] if ready else []  # who goes first rotates
        for backend in order:
            apply(own[backend.name])
            c0, w0 = time.process_time(), time.perf_counter()
            backend.train(o["steps"])
            rows[backend.name]["cpu_s"].append((time.process_time() - c0) / o["steps"])
            rows[backend.name]["wall_s"].append((time.perf_counter() - w0) / o["steps"])
            apply({k: pristine[k] for k in own[backend.name]})
    single = rows.get(backends.BASELINE, {}).get("cpu_s")
    for backend in ready:
        row = rows[backend.name]
        row["cpu_us_per_step"] = 1e6 * statistics.median(row["cpu_s"])
        row["wall_us_per_step"] = 1e6 * statistics.median(row["wall_s"])
        row["vs_single"] = statistics.median(row["cpu_s"]) / statistics.median(single) if single else None
        apply(own[backend.name])
        row["backend_info"] = backend.describe()
        apply({k: pristine[k] for k in own[backend.name]})
    record = {"schema": OVERHEAD_SCHEMA, "kind": "overhead", "run_id": spec["run_id"], "status": "ok", "reason": None,
              "model": base.model, "batch_per_device": base.batch_size, "threads": 1, "steps": o["steps"],
              "rounds": o["rounds"], "warmup": o["warmup"], "device_type": "cpu",
              "timing": "CPU time of this process per step (time.process_time), median over the rounds; wall time "
                        "beside it", "rows": [rows[n] for n in o["backends"]], "env": spec["env"],
              "finished_at": utc_now()}
    write_json_atomic(record, Path(spec["results_dir"]) / f"{spec['run_id']}.json")
    for backend in ready:
        backend.teardown()  # the first of the DDP family takes the shared group down; Horovod shuts its own
    if dist.is_initialized():
        dist.destroy_process_group()

"""The host-overhead task of a rank (``bench overhead``): every backend at world size 1 in this one process, on the CPU
with one thread, trains the probe model (backends/models/overhead.py: negligible compute), in interleaved rounds, and
the time per step is the backend's fixed host cost. One process for all backends: the same interpreter, allocator and
neighbours for each, and rounds interleaved so drift hits all alike; the process group (gloo, one rank) is shared.
The command's half, which launches this and prints the table, is bench/commands/overhead.py."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.core.config import RunConfig
from bench.core.overhead import OVERHEAD_SCHEMA
from bench.core.results import utc_now, write_json_atomic


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
    ready, rows = [], {}
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
        ready.append(backend)
        rows[name] = {"backend": name, "status": "ok", "reason": None, "cpu_s": [], "wall_s": []}
    for r in range(o["rounds"]):
        order = ready[r % len(ready):] + ready[:r % len(ready)] if ready else []  # who goes first rotates
        for backend in order:
            c0, w0 = time.process_time(), time.perf_counter()
            backend.train(o["steps"])
            rows[backend.name]["cpu_s"].append((time.process_time() - c0) / o["steps"])
            rows[backend.name]["wall_s"].append((time.perf_counter() - w0) / o["steps"])
    single = rows.get(backends.BASELINE, {}).get("cpu_s")
    for backend in ready:
        row = rows[backend.name]
        row["cpu_us_per_step"] = 1e6 * statistics.median(row["cpu_s"])
        row["wall_us_per_step"] = 1e6 * statistics.median(row["wall_s"])
        row["vs_single"] = statistics.median(row["cpu_s"]) / statistics.median(single) if single else None
        row["backend_info"] = backend.describe()
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

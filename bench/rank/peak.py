"""The achievable matmul rate of this device (bench/core/peak.py has the cache and why): a small sweep of large
matrix multiplications per precision mode, each shape warmed up, then timed in batches of iterations between device
synchronizations, the best batch kept; the peak is the largest rate over the shapes (the manner of ml-engineering's
maximum-achievable-matmul-FLOPS finder, in seconds rather than its exhaustive sweep).

Two callers: rank 0 of a run (``for_run``: after the run's measurements, when the cache has no entry for its device,
software and precision mode, so the first run of a sweep measures and every later one reuses), and ``bench peak``'s
task (``run_rank``)."""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch

from bench.core import cuda
from bench.core import peak as vocab
from bench.core.results import utc_now, write_json_atomic
from bench.rank import startup

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# square shapes (m = n = k), smallest first: large enough to reach the device's rate, few enough to take seconds
SHAPES = {"cuda": (2048, 4096, 6144, 8192, 12288), "cpu": (128, 256, 512, 1024, 2048)}
WARMUP = {"cuda": 5, "cpu": 1}
BATCH_SECONDS = {"cuda": 0.1, "cpu": 0.05}  # the least time one timed batch of iterations lasts
REPEATS = 3  # timed batches per shape; the best is kept
SHAPE_LIMIT_S = 0.5  # a shape whose one multiplication takes longer than this is the last one tried
HOW = ("largest rate over square matmuls of {shapes}: per shape {warmup} warm-up iterations, then {repeats} timed "
       "batches of at least {batch} s between synchronizations, the best kept")


@contextlib.contextmanager
def tf32_mode(device_type: str, precision: str, tf32: bool | None):
    """fp32 matmuls on a GPU in the TF32 mode asked for, the flag restored afterwards."""
    if device_type != "cuda" or precision != "fp32" or tf32 is None:
        yield
        return
    before = cuda.set_matmul_tf32(bool(tf32))
    try:
        yield
    finally:
        cuda.set_matmul_tf32(before)


def measure(device: torch.device, precision: str, tf32: bool | None = None, shapes=None, clock=time.perf_counter) -> dict:
    """{tflops, best_shape, shapes: [{shape, tflops}]}: the best batch of every shape, and the largest of them."""
    kind = device.type
    sync = (lambda: cuda.synchronize(device)) if kind == "cuda" else (lambda: None)
    dtype, found = DTYPES[precision], []
    gen = torch.Generator(device="cpu").manual_seed(0)
    with tf32_mode(kind, precision, tf32):
        for n in shapes or SHAPES[kind]:
            a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
            b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
            out = torch.empty(n, n, device=device, dtype=dtype)
            t0 = clock()
            for _ in range(WARMUP[kind]):
                torch.mm(a, b, out=out)
            sync()
            one = max((clock() - t0) / WARMUP[kind], 1e-9)
            iters = max(1, math.ceil(BATCH_SECONDS[kind] / one))
            best = 0.0
            for _ in range(REPEATS):
                sync()
                t0 = clock()
                for _ in range(iters):
                    torch.mm(a, b, out=out)
                sync()
                best = max(best, 2 * n ** 3 * iters / (clock() - t0) / 1e12)
            found.append({"shape": [n, n, n], "tflops": best})
            del a, b, out
            if one > SHAPE_LIMIT_S:
                break
    top = max(found, key=lambda s: s["tflops"])
    return {"tflops": top["tflops"], "best_shape": top["shape"], "shapes": found,
            "how": HOW.format(shapes=", ".join(str(s["shape"][0]) for s in found), warmup=WARMUP[kind],
                              repeats=REPEATS, batch=BATCH_SECONDS[kind])}


def device_name(device: torch.device, env: dict) -> str:
    if device.type == "cuda":
        return cuda.name(device)
    return f"CPU: {env.get('cpu_model') or 'unknown'}"


def entry(k: dict, device: torch.device, directory: Path, since: str | None) -> dict:
    """The cache entry of key ``k``: read, or measured now and written (atomically) when absent or stale."""
    found = vocab.read(k, directory)
    if not vocab.stale(found, since):
        return found
    path = vocab.entry_path(k, directory)
    path.parent.mkdir(parents=True, exist_ok=True)  # an unusable cache fails here, before the measurement
    probe = vocab.load_probe(k["device_type"])
    got = measure(device, k["precision"], k["tf32"])
    # a rate measured beside other load is low, and cached: keep the load it ran under (bench/core/peak.py, busy)
    load = probe()
    new = {"schema": vocab.PEAK_SCHEMA, "key": k, "measured_at": utc_now(), "load": load,
           "load_average": load["load_average_before"][0], "cpus": load["cpus"], **got}
    write_json_atomic(new, path, overwrite=True)
    return {**new, "cache": str(path), "measured_now": True}


def for_run(spec: dict, cfg, device: torch.device, tf32: bool | None) -> dict | None:
    """Rank 0 of a run: the measured peak of its device, precision mode and threads (measured here when the cache has
    none); None when the harness asked for none (searches, bench overhead, --external). A failure says why and
    fails nothing: the datasheet's MFU stands."""
    asked = spec.get("peak")
    if not asked:
        return None
    k = vocab.key(cfg.device_type, device_name(device, spec.get("env") or {}), torch.__version__, torch.version.cuda,
                  cfg.precision, tf32, spec.get("threads_per_rank"))
    try:
        return vocab.record_fields(entry(k, device, Path(asked["cache"]), asked.get("refresh_since")))
    except (OSError, RuntimeError) as e:  # an unwritable cache, or torch refusing the measurement: the figure, not the run
        return vocab.record_fields(None, f"not measured: {type(e).__name__}: {e}")


def run_rank(spec: dict) -> None:
    """``bench peak``'s rank: every precision mode asked for, read or measured, then one record in RESULTS/peak."""
    from bench.core.config import RunConfig

    cfg = RunConfig.from_dict(spec["config"])
    p = spec["peak_task"]
    torch.set_num_threads(spec["threads_per_rank"])
    device = torch.device("cuda", 0) if cfg.device_type == "cuda" else torch.device("cpu")
    name = device_name(device, spec.get("env") or {})
    entries = []
    startup.done()  # the collector back on before the first measurement (bench/rank/startup.py)
    for precision, tf32 in p["modes"]:
        k = vocab.key(cfg.device_type, name, torch.__version__, torch.version.cuda, precision, tf32,
                      spec["threads_per_rank"])
        entries.append(entry(k, device, Path(p["cache"]), p.get("refresh_since")))
    record = {"schema": vocab.PEAK_SCHEMA, "kind": "peak", "run_id": spec["run_id"], "status": "ok", "reason": None,
              "device_type": cfg.device_type, "threads": spec["threads_per_rank"], "entries": entries,
              "env": spec["env"], "finished_at": utc_now()}
    write_json_atomic(record, Path(spec["results_dir"]) / f"{spec['run_id']}.json")

"""A configuration's plain twin (``bench run --reference``) as a process tree of its own, like any run: its settings
file, ``python bench/twins/<kind>.py SETTINGS OUT``, a timeout and the kill that leaves nothing behind, the log; then
its window times (OUT) become a twin record in ``RESULTS/reference`` (bench/core/reference.py has the vocabulary). The
twin file knows nothing of the harness, and this module nothing of the twin but its command line and its output."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench.core import reference, results, stats, workloads
from bench.core.config import RunConfig
from bench.core.markers import RUN_TAG
from bench.launch.diagnose import _first_error, _summary, read_from
from bench.launch.run import default_timeout, threads_per_rank
from bench.launch.tree import run_group


def loop_of(cfg: RunConfig) -> dict:
    """The loop the twin of ``cfg`` runs: its backend's own (``Backend.twin``), else the plain one."""
    import backends

    return backends.create(cfg.backend).twin(cfg) or reference.PLAIN


def skeleton(cfg: RunConfig, run_id: str, env: dict) -> dict:
    """A twin record with the configuration's fields (those ``reference.key`` reads), the loop it runs, and no
    measurement."""
    c = cfg.to_dict()
    o = cfg.options or {}
    loop = loop_of(cfg)
    return {"schema": reference.TWIN_SCHEMA, "kind": "twin", "run_id": run_id, "status": None, "reason": None,
            "twin": reference.TWINS.get(cfg.workload.kind), "loop": loop, "loop_file": reference.loop_file(loop),
            "model": cfg.model, "image_size": cfg.image_size,
            "seq_len": cfg.seq_len, "optimizer": workloads.of_record(c).optimizer, "precision": cfg.precision,
            "batch_per_device": cfg.batch_size, "global_batch": cfg.batch_size, "world_size": 1,
            "warmup_steps": cfg.warmup, "settle_steps": reference.SETTLE_STEPS, "steps_per_window": cfg.steps,
            "windows": cfg.windows, "data": cfg.data, "device_type": cfg.device_type,
            "options": {**{k: True for k in ("channels_last", "compile") if o.get(k)},
                        **({"optimizer_impl": o["optimizer_impl"]} if o.get("optimizer_impl") else {})},
            "cudnn_benchmark": cfg.cudnn_benchmark, "repeat_index": cfg.repeat_index, "repeats": cfg.repeats,
            "window_seconds": [], "window_cpu_seconds": [], "throughput": None, "throughput_ci95": None, "env": env,
            "hardware": results.hardware({"device_type": cfg.device_type, "env": env})}  # a GPU's: its own, once run


def run_twin(cfg: RunConfig, results_dir: Path, env_meta: dict, timeout: float | None = None) -> dict:
    """Run the plain twin of ``cfg`` (a world-size-1 configuration) and return its record, saved in
    ``results_dir/reference``."""
    out_dir = Path(results_dir) / "reference"
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_id = results.new_run_id("twin", 1)
    rec = skeleton(cfg, run_id, {**env_meta, "started_at": results.utc_now()})
    why = reference.unavailable(cfg.to_dict())
    if why:
        rec.update(status="skipped", reason=why)
        results.write_json_atomic(rec, out_dir / f"{run_id}.json")
        return rec
    threads = threads_per_rank(cfg)  # the same share of the cores as the runs it is compared with
    settings, out, log = logs / f"{run_id}.settings.json", logs / f"{run_id}.out.json", logs / f"{run_id}.log"
    results.write_json_atomic(reference.settings(cfg.to_dict(), threads, rec["loop"]), settings, overwrite=True)
    env = {**os.environ, RUN_TAG: run_id, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(results.REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, str(reference.script(cfg.workload.kind)), str(settings), str(out)]
    timeout = cfg.timeout or timeout or 2 * default_timeout(cfg)  # --compile: compiled, then eager windows
    rc, timed_out = run_group(cmd, env, log, timeout)
    got = None
    if rc == 0 and not timed_out:
        try:
            got = json.loads(out.read_text())
        except (OSError, ValueError):
            got = None
    if got is None:
        output = read_from(log, 0)
        first = _first_error(output)
        reason = (f"timeout after {timeout:.0f} s" if timed_out else
                  f"exit code {rc}; {'first error: ' + first + '; ' if first else ''}last lines: "
                  f"{_summary(output[-20000:], lines=3)}")
        rec.update(status="failed", reason=f"{reason}; log {log}")
    else:
        rec.update(status="ok", threads_per_rank=threads, finished_at=results.utc_now(), **measured(cfg, got))
    results.write_json_atomic(rec, out_dir / f"{run_id}.json")
    return rec


def measured(cfg: RunConfig, got: dict) -> dict:
    """The twin record's measurement fields from the twin's output."""
    steps = got.get("steps", cfg.steps)  # --window-s: the count the twin's own warm-up gave
    samples = cfg.batch_size * steps
    thr, ci = stats.median_ci95(stats.window_throughputs(got["window_seconds"], samples))
    out = {"steps_per_window": steps, "window_seconds": got["window_seconds"],
           "window_cpu_seconds": got["window_cpu_seconds"],
           "warmup_step_seconds": got["warmup_step_seconds"], "windows_wall_span": got["windows_wall_span"],
           "throughput": thr, "throughput_ci95": ci, "torch": got.get("torch"),
           **({"hardware": got["device_name"]} if cfg.device_type == "cuda" else {})}
    if got.get("eager_window_seconds"):
        eager, eager_ci = stats.median_ci95(stats.window_throughputs(got["eager_window_seconds"], samples))
        out.update(eager_window_seconds=got["eager_window_seconds"],
                   eager_window_cpu_seconds=got["eager_window_cpu_seconds"], eager_throughput=eager,
                   eager_throughput_ci95=eager_ci)
    return out


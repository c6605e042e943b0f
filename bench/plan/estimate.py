"""What a sweep will cost, before its first launch: ``bench run`` prints it, ``bench run --plan`` prints the plan and
exits. The same kind of model the GPU check's plan uses (bench/plan/gpu_check.py: seconds per process tree), with the
timed work added: each run is a process tree to start, warm-up steps, its timed windows, the compute-only windows where
it measures them, and a few untimed steps after (the numerics and attention probes).

- **Start** (interpreter, torch, the backend's library; on GPUs the CUDA context and NCCL's set-up): on a GPU one tree
  alone took about 13 s from start to record on an H100 (docs/gpu-machine.md), most of it start-up; every rank more adds
  a second (ranks import at once on a node of many cores). On this project's 2-core CPU VM a rank costs about 3 s of
  CPU and torchrun's agent 2 s more (docs/tests.md).
- **A step** from the workload's FLOPs (backends/models/flops.py) at an MFU measured on the machines lent here (bf16:
  ResNet-50 11.6%, gpt-350m 30-34% on an H100 and an H200; the README's figures), against the GPU's datasheet peak
  (bench/core/mfu.py); on a CPU at the GFLOP/s per thread this project's VM gave.
- **Windows**: ``--window-s`` seconds each, or ``--steps`` steps of the estimated step time.

An estimate, not a promise: a model that is host-bound, a slower disk or a busy machine takes longer. It is printed so
that nobody starts a sweep without knowing its size."""
from __future__ import annotations

GPU_START_S = 12.0  # one process tree's start on a GPU node (above)
GPU_START_PER_RANK_S = 1.0
CPU_START_S = 4.0  # the harness's half and the first rank on the 2-core VM
CPU_START_PER_RANK_S = 2.0
TORCHRUN_AGENT_S = {"cuda": 1.0, "cpu": 2.0}
FIRST_STEP_S = {"cuda": 4.0, "cpu": 0.5}  # lazy initialisation, cuDNN's algorithm search, DDP's first bucket rebuild
AFTER_S = {"cuda": 3.0, "cpu": 1.0}  # the record's gathering, teardown, the probes' steps beyond the step time
MFU = {"vision": 0.12, "language": 0.30, "custom": 0.20}  # measured at bf16 (above); fp32 runs at its own peak
GPU_PEAK_UNKNOWN_TFLOPS = 100.0  # a GPU not in bench/core/mfu.py's table
CPU_GFLOPS_PER_THREAD = 30.0  # this project's 2-core VM: resnet18 at 64 px, batch 8, one thread a rank, 0.2-0.3 s a step
PROBE_STEPS = 2  # the numerics probe's step and, for a GPT, the attention kernel's


def step_seconds(cfg, device_name: str | None) -> float:
    """The estimated time of one training step of ``cfg`` on one device."""
    from bench.core import mfu

    flops = (cfg.flops_per_sample or 0.0) * cfg.batch_size
    if cfg.device_type == "cuda":
        peak, _ = mfu.peak_tflops(device_name, cfg.precision)
        rate = (peak or GPU_PEAK_UNKNOWN_TFLOPS) * 1e12 * MFU.get(cfg.workload.kind, MFU["custom"])
    else:
        rate = CPU_GFLOPS_PER_THREAD * 1e9 * max(1, cfg.threads or 1)
    return flops / rate if flops else 0.05


def start_seconds(cfg, ranks: int | None = None) -> float:
    ranks = ranks or (1 if cfg.launcher == "inproc" else cfg.world_size)
    if cfg.device_type == "cuda":
        s = GPU_START_S + GPU_START_PER_RANK_S * (ranks - 1)
    else:
        s = CPU_START_S + CPU_START_PER_RANK_S * (ranks - 1)
    return s + (TORCHRUN_AGENT_S[cfg.device_type] if cfg.launcher == "torchrun" else 0.0)


def run_seconds(cfg, device_name: str | None, twin: bool = False) -> float:
    """One run (``twin``: its plain twin, one process) from its start to its record."""
    import backends

    step = step_seconds(cfg, device_name)
    window = cfg.window_s if cfg.window_s else cfg.steps * step
    windows = cfg.windows * window
    compute_only = 0.0
    if not twin and cfg.world_size > 1 and not (cfg.options or {}).get("compile") and \
            backends.create(cfg.backend).no_compute_only is None:
        compute_only = windows  # the same windows with the synchronisation skipped (bench/rank/train.py)
    start = start_seconds(cfg, 1) if twin else start_seconds(cfg)
    return (start + FIRST_STEP_S[cfg.device_type] + (cfg.warmup + 1) * step + windows + compute_only
            + PROBE_STEPS * step + AFTER_S[cfg.device_type])


def plan_seconds(items: list[tuple[str, object]], device_name: str | None) -> list[float]:
    """Each planned item's seconds: ``(kind, cfg)`` as bench/plan/reference.plan lists them (a run or a twin)."""
    from bench.plan.reference import TWIN

    return [run_seconds(cfg, device_name, twin=(kind == TWIN)) for kind, cfg in items]


def device_name(device_type: str) -> str | None:
    """The name of GPU 0 (the peak the estimate reads), through the device seam; None on a CPU."""
    if device_type != "cuda":
        return None
    from bench.core import cuda

    return cuda.name(0)


def duration(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{seconds:.0f} s" if seconds < 90 else f"{m} min" if m < 90 else f"{m // 60} h {m % 60:02d} min"

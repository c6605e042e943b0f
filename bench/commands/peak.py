"""``python -m bench peak``: the matmul rate this device sustains in each precision mode, measured once and cached per
machine, device and software with the load it was measured under (bench/core/peak.py), so every record gives MFU
against it as well as against the datasheet. The measurement runs in a rank process of its own (bench/rank/peak.py); a
sweep's first run measures what it needs itself, so this command is for measuring ahead, re-measuring
(``--refresh-peak``) and reading the cache; an entry measured under load is shown with a warning."""
from __future__ import annotations

import sys
from pathlib import Path

from bench.core import peak
from bench.core.errors import EXIT_FAILED, EXIT_OK, UsageError, warn
from bench.core.flags import add_renamed


def register(sub) -> None:
    p = sub.add_parser("peak", help="the matmul rate this device sustains per precision mode (measured once, cached; "
                                    "every record's MFU against it)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu (default auto: cuda when present)")
    p.add_argument("--precision", help="comma-separated fp32, bf16, fp16 (default: fp32 with TF32 off and on, bf16 and "
                                       "fp16 on a GPU; fp32 and bf16 on a CPU)")
    p.add_argument("--threads", type=int, help="CPU: threads of the measuring process (default: a CPU sweep's threads "
                                               "per rank)")
    add_renamed(p, "--refresh-peak", "--refresh", dest="refresh", action="store_true",
                help="measure again, replacing the cached entries (as bench run --refresh-peak)")
    p.add_argument("--results", default="results/raw", help="the measurement's record goes to RESULTS/peak")
    p.set_defaults(func=cmd_peak)


def modes(device_type: str, precisions: str | None) -> list[list]:
    """[precision, TF32 on?] for every mode to measure: on GPUs fp32 twice (TF32 off, on), on the CPU no TF32."""
    wanted = [x.strip() for x in (precisions or "").split(",") if x.strip()] or (
        ["fp32", "bf16", "fp16"] if device_type == "cuda" else ["fp32", "bf16"])
    bad = [p for p in wanted if p not in peak.PRECISIONS]
    if bad:
        raise UsageError(f"--precision {precisions!r}: unknown precision {', '.join(bad)}; choose from "
                         f"{', '.join(peak.PRECISIONS)}")
    if device_type == "cpu" and "fp16" in wanted:
        raise UsageError("--precision fp16: the suite trains fp16 on CUDA only (GradScaler); measure fp32 or bf16 on CPU")
    out = []
    for p in dict.fromkeys(wanted):
        out += [[p, False], [p, True]] if p == "fp32" and device_type == "cuda" else [[p, None]]
    return out


def cmd_peak(args) -> int:
    import backends
    from bench import launch
    from bench.plan.sweep import check_writable, world_sizes
    from bench.core import environment, results
    from bench.core.config import RunConfig
    from bench.core.devices import detect_device, usable_cpus

    device_type, present = detect_device(args.device)
    todo = modes(device_type, args.precision)
    if args.threads is not None and (args.threads < 1 or device_type != "cpu"):
        raise UsageError(f"--threads {args.threads}: a positive number of threads, for the CPU only")
    threads = args.threads or (max(1, usable_cpus() // max(world_sizes(None, None, "cpu", present)))
                               if device_type == "cpu" else 1)
    out = Path(args.results) / "peak"
    check_writable(out)
    cfg = RunConfig(backend=backends.BASELINE, launcher="inproc", world_size=1, device_type=device_type,
                    model="resnet18", image_size=32, batch_size=1, warmup=2, steps=1, windows=1).validate()
    spec = {"task": "peak", "peak_task": {"modes": todo, "cache": str(peak.cache_dir()),
                                          "refresh_since": results.utc_now() if args.refresh else None}}
    print(f"peak: {', '.join(peak.mode(p, t) for p, t in todo)} on {device_type}"
          f"{f' with {threads} thread(s)' if device_type == 'cpu' else ''}; cache {peak.cache_dir()}",
          file=sys.stderr, flush=True)
    rec = launch.run_one(cfg, out, environment.collect_env(), backends.create(cfg.backend), extra_spec=spec,
                         threads=threads, timeout=600)
    if rec["status"] != "ok":
        print(f"peak: {rec['status']}: {rec['reason']}", file=sys.stderr)
        return EXIT_FAILED
    print(peak.table(rec["entries"]))
    for e in rec["entries"]:  # a peak measured (now or before) under load: used, with a warning
        note = peak.warning(peak.record_fields(e))
        if note:
            warn(note)
    return EXIT_OK

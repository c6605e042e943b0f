"""``python -m bench baseline save | name``: the stored baselines the regression gate compares against.

A baseline is one JSON file, ``results/baselines/NAME.json``: ``{"schema", "name", "created_at", "source",
"hardware", "environment", "configurations", "load", "records"}`` with the ok records of a results directory
(``environment``: the driver, CUDA, torch, NCCL and cuDNN they ran with). Every later CI run is
judged against it, so an existing baseline is replaced only with ``--force``.

A reference comes from clean runs only. ``save`` refuses, in one line naming the runs and why, a directory holding a
failed run (crashed, hung, out of memory, replicas that differ: exit 1) or a disturbed one (another process used the
CPUs or a GPU, or a GPU was throttled, while it was timed: exit 3, inconclusive, as the gate says of such runs; every
comparison against it would be inconclusive). ``--accept-disturbed`` saves the ok runs anyway, and says so in the file.
The baseline records the machine's load during its runs (``load``: the load averages around them, the largest share of
the CPUs other processes used during their timed windows, how many were disturbed), so a later reader knows what the
reference was measured beside.
"""
from __future__ import annotations

import re
from pathlib import Path

from bench.core.devices import usable_cpus
from bench.core.errors import DISK_FULL, EXIT_FAILED, EXIT_INCONCLUSIVE, Refused, UsageError, warn
from bench.core import environment

BASELINE_DIR = "results/baselines"
BASELINE_SCHEMA = 1


def register(sub) -> None:
    b = sub.add_parser("baseline", help="manage stored baselines for the regression gate (save, name)")
    bsub = b.add_subparsers(dest="baseline_command", metavar="{save,name}", required=True)
    s = bsub.add_parser(
        "save", help="write the ok records of a results directory to results/baselines/NAME.json",
        description="Write the ok records from DIR as one baseline file, atomically. An existing baseline is "
                    "only replaced with --force: every later CI run is judged against it. Failed or disturbed runs "
                    "are refused unless --accept-disturbed is given; the baseline records the machine's load.")
    s.add_argument("--from", dest="source", required=True, metavar="DIR", help="results directory (or file) to take records from")
    s.add_argument("--name", help="baseline name (default: the hardware and largest world size of the records, "
                                  "e.g. NVIDIA-H100-80GB-HBM3-x8)")
    s.add_argument("--out-dir", default=BASELINE_DIR, help=f"where baselines live (default {BASELINE_DIR})")
    s.add_argument("--latest", action="store_true", help="keep only the latest ok run of each configuration")
    s.add_argument("--force", action="store_true", help="replace an existing baseline of that name")
    s.add_argument("--accept-disturbed", action="store_true",
                   help="save the ok runs even where runs failed or were disturbed (by default refused: a failed run "
                        "exits 1, a disturbed one 3); the baseline records that it was accepted")
    s.set_defaults(func=cmd_baseline_save)
    n = bsub.add_parser("name", help="print the default baseline name: the hardware and the largest world size of "
                                     "--from's records, or of the sweep bench run would do here (GPU model x count)")
    n.add_argument("--from", dest="source", metavar="DIR", help="derive the name from these records' hardware")
    n.add_argument("--gpus", help="the world sizes the sweep will run, as bench run --gpus (default: --max-gpus)")
    n.add_argument("--max-gpus", help="the sweep's largest world size, as bench run --max-gpus (default all)")
    n.add_argument("--dir", default=BASELINE_DIR,
                   help=f"where baselines live (default {BASELINE_DIR}): a baseline stored under the name of "
                        "earlier versions (the GPU model only) is printed when no file has the new name")
    n.set_defaults(func=cmd_baseline_name)



def slug(text: str) -> str:
    """A file-name-safe baseline name: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "unknown"


def name_for(hardware: str, world_size: int, cpus: int | None = None) -> str:
    """What changes the numbers: the device model, the largest world size of the sweep (GPUS=all runs 1..8 on
    an 8-GPU runner, 1..2 on a 2-GPU one; the same model's 1-GPU numbers also differ with its neighbours),
    and on the CPU the core count (threads per rank = cores / ranks):
    'NVIDIA H100 80GB HBM3', 8 -> 'NVIDIA-H100-80GB-HBM3-x8'; 'CPU: Xeon', 2, cpus=4 -> 'CPU-Xeon-4cores-x2'.
    Baselines saved before the count was part of the name carry the model only (legacy_name)."""
    cores = f"-{cpus}cores" if hardware.startswith("CPU") and cpus else ""
    return f"{slug(hardware)}{cores}-x{world_size}"


def default_name(recs: list[dict]) -> str:
    from bench.core import results

    hws = sorted({results.hardware(r) for r in recs})
    if len(hws) != 1:
        raise UsageError(f"the records come from {len(hws)} kinds of hardware ({'; '.join(hws)}); give --name")
    cpus = sorted({(r.get("env") or {}).get("cpu_count") for r in recs} - {None})
    if hws[0].startswith("CPU") and len(cpus) > 1:
        raise UsageError(f"the records come from CPUs with {', '.join(map(str, cpus))} cores; give --name")
    return name_for(hws[0], max(int(r.get("world_size") or 1) for r in recs), cpus[0] if cpus else None)


def legacy_name(hardware: str) -> str:
    """The name baselines had before the world size was part of it: the device model only."""
    return slug(hardware)


def machine_hardware() -> tuple[str, str, int]:
    """(hardware, device type, devices present): the model of CUDA device 0, or the CPU model without CUDA.

    The GPU name comes from torch, as in the records' ``memory[].device_name`` that ``results.hardware``
    reads, so the name matches what ``bench run --device auto`` will record here.
    """
    from bench.core import cuda

    if cuda.available():
        return cuda.name(0), "cuda", cuda.count()
    return f"CPU: {environment._cpu_model() or 'unknown'}", "cpu", usable_cpus()


def machine_name(gpus: str | None = None, max_gpus: str | None = None) -> str:
    """The default baseline name for this machine and the sweep ``bench run --gpus/--max-gpus`` would run here
    (the same rule: bench/plan/sweep.py, world_sizes), so it matches what ``bench baseline save`` names that
    sweep's records."""
    from bench.plan.sweep import world_sizes

    hardware, device_type, present = machine_hardware()
    top = max(world_sizes(gpus, max_gpus, device_type, present))
    return name_for(hardware, top, usable_cpus() if device_type == "cpu" else None)


def _check_name(name: str) -> str:
    name = name[:-5] if name.endswith(".json") else name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only (it becomes a file name)")
    return name


def _started(rec: dict) -> str:
    return str(rec.get("finished_at") or (rec.get("env") or {}).get("started_at") or rec.get("run_id") or "")


def failed_runs(recs: list[dict]) -> list[dict]:
    """Runs that cannot stand for the code's speed: crashed, hung, out of memory, or replicas that ended different."""
    return [r for r in recs if r.get("status") == "failed" or r.get("replicas_consistent") is False]


def _runs(recs: list[dict], limit: int = 3) -> str:
    from bench.core.trust import subject

    names = list(dict.fromkeys(subject(r) for r in recs))
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_clean(src: str, recs: list[dict], ok: list[dict]) -> None:
    """Refuse a reference from a failed run (exit 1) or from disturbed ones (exit 3), in one line each."""
    failed = failed_runs(recs)
    if failed:
        why = failed[0].get("reason") or ("its replicas ended with different parameters"
                                          if failed[0].get("replicas_consistent") is False else "no reason recorded")
        raise Refused(f"--from {src!r}: {len(failed)} failed run{'s' if len(failed) != 1 else ''} ({_runs(failed)}: "
                      f"{why.splitlines()[0] if why else why}); a baseline holds only clean runs: fix and re-run, or "
                      "pass --accept-disturbed to save the ok runs anyway", EXIT_FAILED)
    disturbed = [r for r in ok if r.get("disturbed")]
    if disturbed:
        why = (disturbed[0].get("disturbed_reasons") or ["no reason recorded"])[0]
        raise Refused(f"--from {src!r}: {len(disturbed)} of {len(ok)} ok run{'s' if len(ok) != 1 else ''} disturbed "
                      f"({_runs(disturbed)}: {why}); every comparison against it would be inconclusive: record it on "
                      "a quiet machine (bench run --wait-quiet-s), or pass --accept-disturbed", EXIT_INCONCLUSIVE)


def load_of(ok: list[dict]) -> dict:
    """The machine's load during the baseline's runs, from what the harness recorded around each (``machine``)."""
    machines = [r["machine"] for r in ok if isinstance(r.get("machine"), dict)]
    loads = [x for m in machines for x in (m.get("load_before") or [None])[:1] + (m.get("load_after") or [None])[:1]
             if x is not None]
    shares = [(m.get("windows") or {}).get("others_cpu_share") for m in machines]
    shares = [s for s in shares if s is not None]
    return {"runs": len(ok), "watched_runs": len(machines), "disturbed_runs": sum(bool(r.get("disturbed")) for r in ok),
            "cpus": max((m.get("cpus") or 0 for m in machines), default=None) or None,
            "load_average_1m": [round(min(loads), 2), round(max(loads), 2)] if loads else None,
            "others_cpu_share_max": round(max(shares), 4) if shares else None}


def load_text(load: dict) -> str:
    if not load.get("watched_runs"):
        return "load not recorded (runs the harness did not watch)"
    parts = []
    if load.get("load_average_1m"):
        lo, hi = load["load_average_1m"]
        parts.append(f"load average {lo:.1f}-{hi:.1f} on {load['cpus']} CPUs")
    if load.get("others_cpu_share_max") is not None:
        parts.append(f"other processes at most {100 * load['others_cpu_share_max']:.0f}% of the CPUs while timed")
    parts.append(f"{load['disturbed_runs']} of {load['runs']} runs disturbed")
    return ", ".join(parts)


def cmd_baseline_save(args) -> int:
    from bench.core import results

    src = Path(args.source)
    if not src.exists():
        raise UsageError(f"--from {args.source!r} does not exist")
    recs = results.load(src, warn=warn)
    ok = [r for r in recs if r.get("status") == "ok" and r.get("window_seconds")]
    if not ok:
        raise UsageError(f"--from {args.source!r}: no ok records to save ({len(recs)} record(s) read, "
                         f"{len(recs) - len(ok)} not ok); a baseline must hold at least one successful run")
    if not args.accept_disturbed:
        check_clean(args.source, recs, ok)
    ok = [r for r in ok if r.get("replicas_consistent") is not False]
    if not ok:
        raise UsageError(f"--from {args.source!r}: no clean ok records to save (every ok run's replicas differ)")
    if args.latest:
        latest = {}
        for r in sorted(ok, key=_started):
            latest[results.config_key(r)] = r
        ok = list(latest.values())
    name = _check_name(args.name) if args.name else default_name(ok)
    out_dir = Path(args.out_dir)
    final = out_dir / f"{name}.json"
    if final.exists() and not args.force:
        raise UsageError(f"baseline {str(final)!r} exists; every later CI run is judged against it, so replacing it "
                         f"must be deliberate: pass --force (and review the diff before committing)")
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in sorted(ok, key=_started)]
    doc = {
        "schema": BASELINE_SCHEMA,
        "name": name,
        "created_at": results.utc_now(),
        "source": str(src),
        "hardware": sorted({results.hardware(r) for r in ok}),
        "environment": environment_of(ok),
        "configurations": len({results.config_key(r) for r in ok}),
        "load": {**load_of(ok), "accepted_disturbed": bool(args.accept_disturbed)},
        "records": clean,
    }
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        results.write_json_atomic(doc, final, overwrite=args.force)
    except FileExistsError:
        raise UsageError(f"baseline {str(final)!r} exists; pass --force to replace it")
    except OSError as e:
        if e.errno in DISK_FULL:
            raise  # bench/cli.py: one line, exit 1, like every full disk
        raise UsageError(f"--out-dir: cannot write baseline {str(final)!r}: {e.strerror or e}")
    skipped = len(recs) - len(ok)
    print(f"baseline {name}: {len(clean)} record(s), {doc['configurations']} configuration(s) on "
          f"{'; '.join(doc['hardware'])} ({environment_text(doc['environment'])}); {load_text(doc['load'])} -> {final}"
          + (f" ({skipped} record(s) left out)" if skipped else ""))
    if args.accept_disturbed and (doc["load"]["disturbed_runs"] or failed_runs(recs)):
        warn(f"baseline {name} was saved with --accept-disturbed: {doc['load']['disturbed_runs']} disturbed run(s) in "
             f"it, {len(failed_runs(recs))} failed left out; comparisons against its disturbed configurations will be "
             "inconclusive (exit 3)")
    return 0


ENVIRONMENT = ("driver", "cuda", "torch", "nccl", "cudnn")


def environment_of(recs: list[dict]) -> dict:
    """What the baseline's numbers were measured with besides the hardware, each field's values over its records
    (one each, normally): the driver, CUDA, torch, NCCL and cuDNN a later comparison is judged against."""
    return {k: sorted({str((r.get("env") or {}).get(k)) for r in recs if (r.get("env") or {}).get(k) is not None})
            for k in ENVIRONMENT}


def environment_text(env: dict) -> str:
    return ", ".join(f"{k} {' / '.join(v)}" for k, v in env.items() if v) or "no driver or torch recorded"


def cmd_baseline_name(args) -> int:
    import sys

    from bench.core import results

    if args.source:
        if not Path(args.source).exists():
            raise UsageError(f"--from {args.source!r} does not exist")
        ok = [r for r in results.load(args.source, warn=warn) if r.get("status") == "ok"]
        if not ok:
            raise UsageError(f"--from {args.source!r}: no ok records to name a baseline after")
        print(default_name(ok))
        return 0
    name = machine_name(args.gpus, args.max_gpus)
    old = legacy_name(machine_hardware()[0])
    folder = Path(args.dir)
    if not (folder / f"{name}.json").exists() and (folder / f"{old}.json").exists():
        # Still readable: an earlier version named baselines after the GPU model only. Say how to move on.
        print(f"bench baseline name: using {folder / old}.json, named before the world size was part of the "
              f"name; if it was recorded with this sweep, rename it to {name}.json", file=sys.stderr)
        name = old
    print(name)
    return 0

"""``python -m bench doctor`` (``make gpu-check``): prove a GPU machine in one command.

On whatever CUDA GPUs are present: the ``gpu``-marked tests (``pytest -m gpu``, a subprocess), then a short sweep
of every backend at fp32, bf16 and fp16 with ResNet-50 at world size N (every GPU here; ``single`` at 1), planned and
launched by ``bench run``'s own code (``bench.commands._plan.plan``, ``bench.launch.run_one``: every run its own
process tree, its record under ``--results``). Then ONE table: what ran, what was skipped and why, throughput, peak memory per GPU, MFU and
energy per image. Exit 1 when a gpu test or a run failed (or ran out of time), 0 otherwise; 2 with one line when
no CUDA device is visible.

Time budget (``--budget-s``, default 1200 s = 20 minutes): the tests get ``--tests-share`` of it (default 45%),
the sweep the rest; each run's timeout is the smaller of its per-run cap (``--run-timeout``) and what is left, and
runs that no longer fit are listed as "not run (time budget)", which counts as a failure.
"""
from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PRECISIONS = ("fp32", "bf16", "fp16")
MODEL = "resnet50"
# Short runs: enough warm-up for every backend's one-time work (DDP's bucket rebuild, cuDNN autotuning,
# GradScaler's first overflows, DeepSpeed's loss-scale settling); two windows only show it runs and what it costs.
SHORT = {"warmup": 6, "steps": 5, "windows": 2}
MIN_RUN_S = 45  # a run given less than this would only measure start-up: left out instead
GiB = 1024 ** 3


def register(sub) -> None:
    d = sub.add_parser("doctor", help="check a GPU machine: the gpu tests and a short sweep of every backend at "
                                      "fp32/bf16/fp16 (ResNet-50), one table; exit 1 on any failure")
    d.add_argument("--backends", default="all", help="comma-separated, or all (default)")
    d.add_argument("--gpus", type=int, help="world size of the sweep (default: every GPU here)")
    d.add_argument("--budget-s", type=float, default=1200.0, help="the whole check's time budget (default 1200)")
    d.add_argument("--tests-share", type=float, default=0.45, help="share of the budget for pytest -m gpu")
    d.add_argument("--run-timeout", type=float, default=150.0, help="seconds per run at most (default 150)")
    d.add_argument("--skip-tests", action="store_true", help="only the sweep")
    d.add_argument("--results", default="results/doctor", help="records, logs and the table (default results/doctor)")
    d.set_defaults(func=cmd_doctor)


def require_cuda() -> int:
    """The number of GPUs, or a UsageError (one line, exit 2) naming why none is visible."""
    import torch

    from bench.core.errors import UsageError

    if not torch.cuda.is_available():
        raise UsageError(f"no CUDA device visible: torch.cuda.is_available() is False (torch {torch.__version__}, "
                         f"built for CUDA {torch.version.cuda or 'none: a CPU-only build'}); bench doctor checks a "
                         "GPU machine (a driver older than torch's CUDA also hides the GPUs)")
    return torch.cuda.device_count()


def run_argv(precision: str, gpus: int, backends: str, results: Path) -> list[str]:
    """The ``bench run`` command line of one precision's sweep."""
    return ["run", "--backends", backends, "--device", "cuda", "--gpus", str(gpus), "--model", MODEL,
            "--precision", precision, "--cudnn-benchmark", "on", "--warmup", str(SHORT["warmup"]),
            "--steps", str(SHORT["steps"]), "--windows", str(SHORT["windows"]), "--results", str(results)]


def plan(gpus: int, backends: str, results: Path) -> list:
    """Every backend x fp32, bf16, fp16 at world size ``gpus``, precision by precision, through bench run's own
    argument parser and planner (so the configurations are exactly what ``bench run`` would run)."""
    from bench.commands._plan import parse_backends, parse_run
    from bench.commands._plan import plan as plan_run

    names = parse_backends(backends)
    configs = []
    for precision in PRECISIONS:
        if gpus > 1 and "single" in names:  # single runs on one device only (the scaling baseline)
            configs += plan_run(parse_run(run_argv(precision, 1, "single", results)[1:]))[0]
            rest = [n for n in names if n != "single"]
        else:
            rest = names
        if rest:
            configs += plan_run(parse_run(run_argv(precision, gpus, ",".join(rest), results)[1:]))[0]
    return configs


def run_tests(timeout: float, results: Path) -> dict:
    """``pytest -m gpu`` in a subprocess; {passed, failed, skipped, failures: [names], skips: {reason: count},
    timed_out, seconds}."""
    junit = results / "gpu-tests.xml"
    results.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests"]
    log = results / "gpu-tests.log"
    with open(log, "w") as out:
        try:
            proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=max(1.0, timeout))
            timed_out, code = False, proc.returncode
        except subprocess.TimeoutExpired:
            timed_out, code = True, None
    summary = parse_junit(junit) if junit.exists() and not timed_out else {"passed": 0, "failed": 0, "skipped": 0,
                                                                          "failures": [], "skips": {}}
    if code not in (0, 5, None) and not summary["failed"]:  # an error pytest reports outside any test
        summary["failed"] += 1
        summary["failures"].append(f"pytest exited {code} (see {log})")
    return {**summary, "timed_out": timed_out, "seconds": time.monotonic() - t0, "log": str(log)}


def parse_junit(path: Path) -> dict:
    out = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": {}}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            out["failed"] += 1
            out["failures"].append(name)
        elif skip is not None:
            out["skipped"] += 1
            reason = (skip.get("message") or "").removeprefix("Skipped: ")
            out["skips"][reason] = out["skips"].get(reason, 0) + 1
        else:
            out["passed"] += 1
    return out


def tests_row(t: dict | None) -> list:
    if t is None:
        return ["pytest -m gpu", "", "", "not run (--skip-tests)", None, None, None, None, ""]
    if t["timed_out"]:
        status, why = "failed", f"timed out after {t['seconds']:.0f} s (log: {t['log']})"
    else:
        status = "failed" if t["failed"] else "ok"
        why = "; ".join([f"failed: {', '.join(t['failures'])}"] * bool(t["failures"])
                        + [f"skipped {n}: {r}" for r, n in sorted(t["skips"].items())])
    counts = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
    return ["pytest -m gpu", "", "", f"{status}: {counts}", None, None, None, None, why]


def run_row(rec: dict) -> list:
    """One sweep run: its status and reason, or its figures."""
    name = rec["backend"] + (" (cudnn.benchmark off)" if rec.get("cudnn_benchmark") is False else "")
    head = [name, rec["world_size"], rec["precision"]]
    if rec["status"] != "ok":
        return head + [rec["status"], None, None, None, None, rec.get("reason") or ""]
    mem = sorted(rec.get("memory") or [], key=lambda m: m["device_index"])
    per_gpu = " · ".join(f"{m['device_index']}: {m['peak_reserved_bytes'] / GiB:.2f}" for m in mem) + " GiB" if mem else None
    mfu = rec.get("mfu")
    jpi = rec.get("joules_per_image")
    why = "; ".join(filter(None, [rec.get("note"), rec.get("energy_reason")]))
    if rec.get("replicas_consistent") is False:
        why = "; ".join(filter(None, ["replicas hold DIFFERENT parameters", why]))
    return head + ["ok" if rec.get("replicas_consistent") is not False else "failed",
                   f"{rec['throughput']:,.1f}", per_gpu, None if mfu is None else f"{100 * mfu:.1f} %",
                   None if jpi is None else f"{jpi:.3f}", why]


HEADER = ["backend", "GPUs", "precision", "status", "img/s", "peak reserved per GPU", "MFU", "J/image", "why / note"]


def table(tests: dict | None, rows: list[dict]) -> str:
    """The doctor's one table: the gpu tests' row, then every planned run (a record, or a stub with status "not
    run" and its reason)."""
    from bench.core.text import md_table

    return md_table(HEADER, [tests_row(tests)] + [run_row(r) for r in rows], {1, 4, 5, 6, 7})


def failed(tests: dict | None, rows: list[dict]) -> bool:
    bad_tests = tests is not None and (tests["timed_out"] or tests["failed"] > 0)
    bad_runs = any(r["status"] in ("failed", "not run") or r.get("replicas_consistent") is False for r in rows)
    return bad_tests or bad_runs


def cmd_doctor(args) -> int:
    import backends
    from bench import launch
    from bench.commands._plan import check_writable
    from bench.core import results
    from bench.core.errors import UsageError

    start = time.monotonic()
    present = require_cuda()
    gpus = present if args.gpus is None else args.gpus
    if not 1 <= gpus <= present:
        raise UsageError(f"--gpus {gpus}: this machine has {present} CUDA device(s); choose 1 to {present}")
    if not (args.budget_s > 0 and 0 <= args.tests_share < 1 and args.run_timeout > 0):
        raise UsageError(f"--budget-s and --run-timeout must be positive and --tests-share in [0, 1), got "
                         f"{args.budget_s}, {args.run_timeout}, {args.tests_share}")
    out = Path(args.results)
    check_writable(out)
    configs = plan(gpus, args.backends, out / "raw")  # bad input fails here, before anything runs
    deadline = start + args.budget_s
    tests = None
    if not args.skip_tests:
        print(f"doctor: pytest -m gpu ({args.tests_share * args.budget_s:.0f} s at most) ...", file=sys.stderr, flush=True)
        tests = run_tests(args.tests_share * args.budget_s, out)
    env_meta = results.collect_env()
    rows = []
    for i, cfg in enumerate(configs, 1):
        left = deadline - time.monotonic()
        if left < MIN_RUN_S:
            rows.append({"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision,
                         "status": "not run", "reason": f"time budget: {args.budget_s:.0f} s spent"})
            continue
        print(f"doctor: [{i}/{len(configs)}] {cfg.backend} x{cfg.world_size} {cfg.precision}", file=sys.stderr,
              flush=True)
        rows.append(launch.run_one(cfg, out / "raw", env_meta, backends.create(cfg.backend),
                                   timeout=min(args.run_timeout, left)))
    text = table(tests, rows)
    print(f"bench doctor: {gpus} GPU(s) ({env_meta.get('gpu_names', ['?'])[0] if env_meta.get('gpu_names') else '?'}), "
          f"{MODEL}, {SHORT['warmup']} warm-up + {SHORT['windows']} x {SHORT['steps']} steps, "
          f"{time.monotonic() - start:.0f} s")
    print(text)
    (out / "doctor.md").write_text(text + "\n")
    return 1 if failed(tests, rows) else 0

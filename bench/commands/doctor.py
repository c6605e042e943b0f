"""``python -m bench doctor`` (``make gpu-check``): prove a GPU machine in one command.

On whatever CUDA GPUs are present: the ``gpu``-marked tests (``pytest -m gpu``, a subprocess in the repository root,
several at once: they assert what ran, not how fast), then a short sweep of every backend with ResNet-50 at world size
N (every GPU here; ``single`` at 1), planned and launched by ``bench run``'s own code (``bench.commands._plan.plan``,
``bench.launch.run_one``: every run its own process tree, alone on the machine, its record under ``--results``). Then
ONE table: what ran, what was skipped and why, throughput, peak memory per GPU, MFU and energy per image.

Two tiers, each a time budget (``--budget-s``) that the tests get ``--tests-share`` of and the sweep the rest:

- **quick** (the default; ``make gpu-check``): 450 s, so that with ``make venv`` it fits 8 minutes on one GPU; the
  sweep runs every backend at bf16 (the tests cover fp32 and fp16). What the budget leaves out is listed as
  "not run (budget)" and does not fail the check.
- **full** (``--full``; ``make gpu-check FULL=1``): 1200 s, the sweep at fp32, bf16 and fp16; what the budget leaves
  out fails the check.

Every test has its own time limit (``--test-timeout``, pytest-timeout), the log names each test with its outcome and
time as it finishes (``BENCH_TEST_PROGRESS``, tests/conftest.py), and so does this command's standard error. Exit 1
when a gpu test or a run failed (or hung), 0 otherwise; 2 with one line when no CUDA device is visible.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.core.results import REPO_ROOT
from bench.core import environment

TIERS = {"quick": {"precisions": ("bf16",), "budget_s": 450.0, "tests_share": 0.6},
         "full": {"precisions": ("fp32", "bf16", "fp16"), "budget_s": 1200.0, "tests_share": 0.45}}
MODEL = "resnet50"
# Short runs: enough warm-up for every backend's one-time work (DDP's bucket rebuild, cuDNN autotuning,
# GradScaler's first overflows, DeepSpeed's loss-scale settling); two windows only show it runs and what it costs.
SHORT = {"warmup": 6, "steps": 5, "windows": 2}
MIN_RUN_S = 45  # a run given less than this would only measure start-up: left out instead
GiB = 1024 ** 3
PROGRESS_MARK = "[test done]"  # tests/conftest.py prints one such line per finished test (BENCH_TEST_PROGRESS=1)
BUDGET = "not run (budget)"


def register(sub) -> None:
    d = sub.add_parser("doctor", help="check a GPU machine: the gpu tests and a short sweep of every backend "
                                      "(ResNet-50), one table; exit 1 on any failure")
    d.add_argument("--full", action="store_true",
                   help="the full check: the sweep at fp32, bf16 and fp16, 1200 s, and what the budget leaves out "
                        "fails (default: the quick tier, bf16, 450 s)")
    d.add_argument("--backends", default="all", help="comma-separated, or all (default)")
    d.add_argument("--gpus", type=int, help="world size of the sweep (default: every GPU here)")
    d.add_argument("--budget-s", type=float, help="the whole check's time budget (default 450; --full 1200)")
    d.add_argument("--tests-share", type=float, help="share of the budget for pytest -m gpu (default 0.6; --full 0.45)")
    d.add_argument("--test-timeout", type=float, default=240.0, help="seconds per gpu test at most (default 240)")
    d.add_argument("--test-jobs", type=int,
                   help="gpu tests at once (default: one per 4 cores, at most 4); each test's runs are tiny")
    d.add_argument("--run-timeout", type=float, default=150.0, help="seconds per sweep run at most (default 150)")
    d.add_argument("--skip-tests", action="store_true", help="only the sweep")
    d.add_argument("--results", default="results/doctor", help="records, logs and the table (default results/doctor)")
    d.set_defaults(func=cmd_doctor)


def require_cuda() -> int:
    """The number of GPUs, or a UsageError (one line, exit 2) naming why none is visible."""
    import torch

    from bench.core import cuda
    from bench.core.errors import UsageError

    if not cuda.available():
        raise UsageError(f"no CUDA device visible: torch.cuda.is_available() is False (torch {torch.__version__}, "
                         f"built for CUDA {torch.version.cuda or 'none: a CPU-only build'}); bench doctor checks a "
                         "GPU machine (a driver older than torch's CUDA also hides the GPUs)")
    return cuda.count()


def run_argv(precision: str, gpus: int, backends: str, results: Path) -> list[str]:
    """The ``bench run`` command line of one precision's sweep."""
    return ["run", "--backends", backends, "--device", "cuda", "--gpus", str(gpus), "--model", MODEL,
            "--precision", precision, "--cudnn-benchmark", "on", "--warmup", str(SHORT["warmup"]),
            "--steps", str(SHORT["steps"]), "--windows", str(SHORT["windows"]), "--results", str(results)]


def plan(gpus: int, backends: str, results: Path, precisions: tuple[str, ...] = TIERS["full"]["precisions"]) -> list:
    """Every backend x ``precisions`` at world size ``gpus``, precision by precision, through bench run's own
    argument parser and planner (so the configurations are exactly what ``bench run`` would run)."""
    from bench.commands._plan import parse_backends, parse_run
    from bench.commands._plan import plan as plan_run

    names = parse_backends(backends)
    configs = []
    for precision in precisions:
        if gpus > 1 and "single" in names:  # single runs on one device only (the scaling baseline)
            configs += plan_run(parse_run(run_argv(precision, 1, "single", results)[1:]))[0]
            rest = [n for n in names if n != "single"]
        else:
            rest = names
        if rest:
            configs += plan_run(parse_run(run_argv(precision, gpus, ",".join(rest), results)[1:]))[0]
    return configs


def test_jobs(requested: int | None) -> int:
    """gpu tests at once: one per 4 cores, between 1 and 4 (each test's runs start processes: CPU, not GPU, time)."""
    from bench.core.devices import usable_cpus

    return requested if requested else max(1, min(4, usable_cpus() // 4))


def tests_command(junit: Path, test_timeout: float, jobs: int) -> list[str]:
    """``pytest -m gpu`` as the doctor runs it, from the repository root (where ``tests`` is)."""
    return [sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={junit}",
            f"--timeout={test_timeout:g}", *(["-n", str(jobs), "--dist", "loadscope"] if jobs > 1 else []), "tests"]


def run_tests(timeout: float, results: Path, test_timeout: float = 240.0, jobs: int = 1) -> dict:
    """``pytest -m gpu`` in a subprocess in the repository root, its output streamed to ``gpu-tests.log`` and each
    finished test echoed to standard error; stopped (its whole process group) at ``timeout``. {passed, failed,
    skipped, failures: [names], skips: {reason: count}, timed_out, finished: [(test, outcome, seconds)], seconds}."""
    results = results.resolve()  # pytest runs in the repository root, wherever the user stands
    junit = results / "gpu-tests.xml"
    results.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    t0 = time.monotonic()
    log = results / "gpu-tests.log"
    env = {**os.environ, "BENCH_TEST_PROGRESS": "1", "BENCH_GPU_TEST_SLOTS": str(jobs)}
    finished = []
    with open(log, "w") as out:
        proc = subprocess.Popen(tests_command(junit, test_timeout, jobs), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        timed_out = _stream(proc, out, finished, t0 + max(1.0, timeout))
    code = None if timed_out else proc.returncode
    if junit.exists() and not timed_out:
        summary = parse_junit(junit)
    else:  # stopped by the budget: what finished, from the progress lines
        summary = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": {}}
        for name, outcome, _, why in finished:
            key = "passed" if outcome == "passed" else "skipped" if outcome == "skipped" else "failed"
            summary[key] += 1
            if key == "failed":
                summary["failures"].append(name)
            elif key == "skipped":
                summary["skips"][why] = summary["skips"].get(why, 0) + 1
    if code not in (0, 5, None) and not summary["failed"]:  # an error pytest reports outside any test
        summary["failed"] += 1
        summary["failures"].append(f"pytest exited {code} (see {log})")
    return {**summary, "timed_out": timed_out, "finished": finished, "seconds": time.monotonic() - t0,
            "log": str(log)}


def _stream(proc: subprocess.Popen, log, finished: list, deadline: float) -> bool:
    """Copy ``proc``'s output to ``log`` as it comes, echo and collect each progress line; kill its process group at
    ``deadline``. Returns whether it was killed."""
    import threading

    def pump():
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if PROGRESS_MARK in line:
                progress = parse_progress(line)
                if progress:
                    finished.append(progress)
                print(f"doctor: {line[line.index(PROGRESS_MARK) + len(PROGRESS_MARK):].strip()}", file=sys.stderr,
                      flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        killed = False
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        killed = True
    reader.join(timeout=10)
    return killed


PROGRESS = re.compile(r"(\S+) (passed|failed|error|skipped) ([0-9.]+) s(?: \((.*)\))?$")


def parse_progress(line: str) -> tuple[str, str, float, str] | None:
    """(test, outcome, seconds, skip reason) from one progress line of tests/conftest.py, or None."""
    m = PROGRESS.search(line[line.index(PROGRESS_MARK) + len(PROGRESS_MARK):].strip())
    return (m.group(1), m.group(2), float(m.group(3)), m.group(4) or "") if m else None


def parse_junit(path: Path) -> dict:
    out: dict = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": {}}
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


def tests_row(t: dict | None, full: bool = True) -> list:
    if t is None:
        return ["pytest -m gpu", "", "", "not run (--skip-tests)", None, None, None, None, ""]
    counts = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
    why = "; ".join([f"failed: {', '.join(t['failures'])}"] * bool(t["failures"])
                    + [f"skipped {n}: {r}" for r, n in sorted(t["skips"].items())])
    if t["timed_out"]:
        status = "failed" if full or t["failed"] else BUDGET
        why = "; ".join(filter(None, [f"stopped by the time budget after {t['seconds']:.0f} s with "
                                      f"{len(t['finished'])} test(s) finished (log: {t['log']})", why]))
    else:
        status = "failed" if t["failed"] else "ok"
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


def table(tests: dict | None, rows: list[dict], full: bool = True) -> str:
    """The doctor's one table: the gpu tests' row, then every planned run (a record, or a stub with status "not
    run (budget)" and its reason)."""
    from bench.core.text import md_table

    return md_table(HEADER, [tests_row(tests, full)] + [run_row(r) for r in rows], {1, 4, 5, 6, 7})


def failed(tests: dict | None, rows: list[dict], full: bool = True) -> bool:
    """Whether the check failed: a failed test or run, diverged replicas; and, under --full, anything the budget left
    out (the quick tier lists it as "not run (budget)" and passes)."""
    bad_tests = tests is not None and (tests["failed"] > 0 or (full and tests["timed_out"]))
    bad_runs = any(r["status"] == "failed" or (full and r["status"] == BUDGET) or r.get("replicas_consistent") is False
                   for r in rows)
    return bad_tests or bad_runs


def cmd_doctor(args) -> int:
    import backends
    from bench import launch
    from bench.commands._plan import check_writable
    from bench.core.errors import UsageError

    start = time.monotonic()
    tier = TIERS["full" if args.full else "quick"]
    budget = tier["budget_s"] if args.budget_s is None else args.budget_s
    share = tier["tests_share"] if args.tests_share is None else args.tests_share
    present = require_cuda()
    gpus = present if args.gpus is None else args.gpus
    if not 1 <= gpus <= present:
        raise UsageError(f"--gpus {gpus}: this machine has {present} CUDA device(s); choose 1 to {present}")
    if not (budget > 0 and 0 <= share < 1 and args.run_timeout > 0 and args.test_timeout > 0):
        raise UsageError(f"--budget-s, --run-timeout and --test-timeout must be positive and --tests-share in [0, 1), "
                         f"got {budget:g}, {args.run_timeout:g}, {args.test_timeout:g}, {share:g}")
    if args.test_jobs is not None and args.test_jobs < 1:
        raise UsageError(f"--test-jobs must be a positive integer, got {args.test_jobs}")
    out = Path(args.results)
    check_writable(out)
    configs = plan(gpus, args.backends, out / "raw", tier["precisions"])  # bad input fails here, before anything runs
    deadline = start + budget
    tests = None
    if not args.skip_tests:
        jobs = test_jobs(args.test_jobs)
        print(f"doctor: pytest -m gpu, {jobs} at once, {share * budget:.0f} s at most, {args.test_timeout:.0f} s per "
              f"test (log: {out / 'gpu-tests.log'}) ...", file=sys.stderr, flush=True)
        tests = run_tests(share * budget, out, args.test_timeout, jobs)
    env_meta = environment.collect_env()
    rows = []
    for i, cfg in enumerate(configs, 1):
        left = deadline - time.monotonic()
        if left < MIN_RUN_S:
            rows.append({"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision,
                         "status": BUDGET, "reason": f"the {budget:.0f} s budget was spent"})
            continue
        print(f"doctor: [{i}/{len(configs)}] {cfg.backend} x{cfg.world_size} {cfg.precision}", file=sys.stderr,
              flush=True)
        rows.append(launch.run_one(cfg, out / "raw", env_meta, backends.create(cfg.backend),
                                   timeout=min(args.run_timeout, left)))
    text = table(tests, rows, args.full)
    print(f"bench doctor ({'full' if args.full else 'quick'}): {gpus} GPU(s) "
          f"({env_meta.get('gpu_names', ['?'])[0] if env_meta.get('gpu_names') else '?'}), {MODEL} "
          f"{'/'.join(tier['precisions'])}, {SHORT['warmup']} warm-up + {SHORT['windows']} x {SHORT['steps']} steps, "
          f"{time.monotonic() - start:.0f} s")
    print(text)
    (out / "doctor.md").write_text(text + "\n")
    return 1 if failed(tests, rows, args.full) else 0

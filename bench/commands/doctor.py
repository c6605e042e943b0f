"""``python -m bench doctor`` (``make gpu-check``): prove a GPU machine in one command.

1. **The launch plan** (bench/plan/gpu_check.py): every backend at bf16 and fp16, fp32 through ``bench verify``,
   2 ranks, and the single-purpose runs, several launches at once on their share of the cores. Its launch count and
   estimated time are printed first.
2. **The gpu tests** (``pytest -m gpu``, from the repository root, ``BENCH_GPU_PLAN_DIR`` set to the plan's folder):
   they assert on the plan's records and start nothing of their own. Every test's outcome, time, first error line and
   last output lines are written as it ends (``BENCH_TEST_LOG``, tests/conftest.py); at the budget pytest is stopped
   with SIGINT first (it still writes its summary and JUnit XML), and the tests still running and those never started
   are named.
3. **The measured sweep** (ResNet-50 at bf16, sequential, alone on the machine): under ``--full`` the default
   sweep's backends and Horovod (``--backends`` given: those), every run required; in the quick tier every backend, as
   many as the budget has left.

Under ``--full``, where Horovod is not built yet, it is compiled beside the plan's first launches (scripts/
build_horovod.sh, half the cores, niced; WHEELS=DIR offline), Horovod's launches wait for the build and the measured
sweep starts once it ended; a failed build fails Horovod's row with the build's error line. The plan, the tests and
the sweep are estimated, and the total printed first: ``--full`` fits 600 s on one GPU.

Then one table a person can act on: a row per backend with its bf16, fp16, fp32 (verify) and 2-rank outcomes and its
memory and NVML checks (the plan's runs shared the GPU: a functional check, not a measurement), identical failures
grouped under it with their first error line, the command that runs one row alone, the measured table, and the
verdict in the last line. Exit 1 when anything failed, 0 otherwise, 2 with one line when no CUDA device is visible.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.plan import gpu_check as gpu_plan
from bench.core import environment
from bench.core.results import REPO_ROOT

TIERS = {"quick": {"precisions": ("bf16",), "budget_s": 420.0, "build": False},
         "full": {"precisions": ("bf16",), "budget_s": 600.0, "build": True}}
# --full's measured sweep: the backends bench run's GPU sweep compares (bench/plan/sweep.py GPU_SWEEP), and Horovod,
# the one the full tier builds
FULL_SWEEP = ("single", "ddp", "fsdp2", "ds_zero2", "ds_zero3", "horovod")
# one measured run alone, process start to record: 14-28 s on the H100 at fbb921d (docs/gpu-machine.md)
MEASURED_RUN_S = 25.0
MODEL = "resnet50"
# The measured sweep's short runs: enough warm-up for every backend's one-time work (DDP's bucket rebuild, cuDNN
# autotuning, GradScaler's first overflows, DeepSpeed's loss-scale settling); two windows show what each costs.
SHORT = {"warmup": 6, "steps": 5, "windows": 2}
MIN_RUN_S = 45  # a measured run given less than this would only measure start-up: left out instead
# what the gpu tests need once the plan ran (they read records): collection, a few in-process checks; 26 s with 4
# workers on the H100 at b7f3632 (docs/gpu-machine.md), where 90 s kept for them left 3 launches out of the plan
TESTS_S = 50.0
GiB = 1024 ** 3
BUDGET = gpu_plan.NOT_RUN
# measured: 189 s for the CPU build on 2 cores (docs/gpu-machine.md); a build with CUDA's NCCL operations compiles more
HOROVOD_BUILD = ("make horovod, about 3 min on 2 cores for the CPU build, more with CUDA; make gpu-check FULL=1 builds "
                 "it beside the plan")
SIGINT_GRACE_S = 30.0  # pytest's time to write its summary and JUnit XML after SIGINT


def register(sub) -> None:
    from bench.core.flags import add_renamed

    d = sub.add_parser("doctor", help="check a GPU machine: every backend through one launch plan, the gpu tests on "
                                      "its records, one table; exit 1 on any failure")
    d.add_argument("--full", action="store_true",
                   help="the full check: Horovod built beside the plan where it is not, the measured sweep of the "
                        "default backends and Horovod, 600 s, and what the budget "
                        "leaves out fails (default: the quick tier, 420 s)")
    d.add_argument("--backends", default="all", help="comma-separated, or all (default): one backend's row alone")
    d.add_argument("--gpus", type=int, help="GPUs to use (default: every GPU here; the plan uses 1 or 2)")
    d.add_argument("--budget-s", type=float, help="the whole check's time budget (default 420; --full 600)")
    d.add_argument("--jobs", type=int, help="plan launches at once (default: one per 4 cores, at most 8)")
    add_renamed(d, "--test-timeout-s", "--test-timeout", dest="test_timeout", type=float, default=240.0,
                metavar="SECONDS", help="seconds per gpu test at most (default 240)")
    d.add_argument("--test-jobs", type=int, help="gpu tests at once (default: as --jobs)")
    add_renamed(d, "--run-timeout-s", "--run-timeout", dest="run_timeout", type=float, default=150.0,
                metavar="SECONDS", help="seconds per measured run at most (default 150)")
    d.add_argument("--skip-tests", action="store_true", help="no gpu tests: the plan (and the measured sweep) only")
    d.add_argument("--skip-sweep", action="store_true", help="no measured sweep: the plan and the gpu tests only")
    d.add_argument("--results", default="results/doctor", help="records, logs and the tables (default results/doctor)")
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


# ---------------------------------------------------------------------------------------------------------------
# The measured sweep (sequential, alone on the machine)

def run_argv(precision: str, gpus: int, backends: str, results: Path) -> list[str]:
    """The ``bench run`` command line of one precision's measured sweep."""
    return ["run", "--backends", backends, "--device", "cuda", "--gpus", str(gpus), "--model", MODEL,
            "--precision", precision, "--cudnn-benchmark", "on", "--warmup", str(SHORT["warmup"]),
            "--steps", str(SHORT["steps"]), "--windows", str(SHORT["windows"]), "--results", str(results)]


def plan(gpus: int, backends: str, results: Path, precisions: tuple[str, ...] = TIERS["full"]["precisions"]) -> list:
    """The measured sweep: every backend x ``precisions`` at world size ``gpus``, precision by precision, through bench
    run's own argument parser and planner (so the configurations are exactly what ``bench run`` would run)."""
    from bench.plan.sweep import parse_backends, parse_run
    from bench.plan.sweep import plan as plan_run

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


# ---------------------------------------------------------------------------------------------------------------
# The gpu tests

def tests_command(junit: Path, test_timeout: float, jobs: int, paths: tuple[str, ...] = ("tests",),
                  marker: str = "gpu") -> list[str]:
    """``pytest -m gpu`` as the doctor runs it, from the repository root (where ``tests`` is)."""
    return [sys.executable, "-m", "pytest", "-q", "-rs", "-m", marker, "-p", "no:cacheprovider", f"--junitxml={junit}",
            f"--timeout={test_timeout:g}", *(["-n", str(jobs), "--dist", "loadscope"] if jobs > 1 else []), *paths]


def run_tests(timeout: float, results: Path, test_timeout: float = 240.0, jobs: int = 1, plan_dir: Path | None = None,
              paths: tuple[str, ...] = ("tests",), marker: str = "gpu", cwd: Path = REPO_ROOT) -> dict:
    """``pytest -m gpu`` in a subprocess in the repository root, its output in ``gpu-tests.log``, each finished test
    echoed to standard error and every event in ``gpu-tests.jsonl``; at ``timeout`` stopped with SIGINT (then its
    process group with SIGTERM and SIGKILL). Returns ``summarise``'s counts, failures, skips, the tests still running
    and never started at a stop, and ``timed_out``, ``seconds``, ``log``."""
    results = Path(results).resolve()  # pytest runs in the repository root, wherever the user stands
    results.mkdir(parents=True, exist_ok=True)
    junit, log, events = results / "gpu-tests.xml", results / "gpu-tests.log", results / "gpu-tests.jsonl"
    for f in (junit, events):
        f.unlink(missing_ok=True)
    t0 = time.monotonic()
    env = {**os.environ, "BENCH_TEST_LOG": str(events), "BENCH_GPU_TEST_SLOTS": str(jobs)}
    if plan_dir is not None:
        env["BENCH_GPU_PLAN_DIR"] = str(Path(plan_dir).resolve())
    with open(log, "w") as out:
        proc = subprocess.Popen(tests_command(junit, test_timeout, jobs, paths, marker), cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        timed_out = _stream(proc, out, t0 + max(1.0, timeout))
    summary = summarise(read_events(events), timed_out)
    if proc.returncode not in (0, 1, 5, None) and not timed_out and not summary["failed"]:
        summary["failed"] += 1  # an error pytest reports outside any test (a collection error, a crash)
        summary["failures"].append({"test": "pytest", "error": f"pytest exited {proc.returncode} (see {log})",
                                    "where": "", "output": log.read_text().splitlines()[-10:]})
    return {**summary, "timed_out": timed_out, "seconds": time.monotonic() - t0, "log": str(log),
            "junit": str(junit) if junit.exists() else None}


def _stream(proc: subprocess.Popen, log, deadline: float) -> bool:
    """Copy ``proc``'s output to ``log`` as it comes and echo each progress line; at ``deadline`` stop it (SIGINT to
    pytest first, so it writes its summary and JUnit XML; then its whole process group). Returns whether it was
    stopped."""
    import threading

    mark = "[test done]"

    def pump():
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if mark in line:
                print(f"doctor: {line[line.index(mark) + len(mark):].strip()}", file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        stopped = False
    except subprocess.TimeoutExpired:
        stopped = True
        for sig, wait, group in ((signal.SIGINT, SIGINT_GRACE_S, False), (signal.SIGTERM, 10, True),
                                 (signal.SIGKILL, 10, True)):
            try:
                os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(timeout=10)
    return stopped


def read_events(path: Path) -> list[dict]:
    """tests/conftest.py's JSON lines (BENCH_TEST_LOG); a line cut by a kill is left out."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def summarise(events: list[dict], stopped: bool = False) -> dict:
    """{passed, failed, skipped, failures: [{test, error, where, output}], skips: {reason: count}, running,
    never_started} from the events of one pytest session."""
    collected = next((e["tests"] for e in events if e.get("event") == "collected"), [])
    started = [e["test"] for e in events if e.get("event") == "start"]
    done = {e["test"]: e for e in events if e.get("event") == "done"}
    out: dict = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": {}}
    for test, e in done.items():
        if e["outcome"] in ("failed", "error"):
            out["failed"] += 1
            out["failures"].append({"test": test, "error": e.get("error") or e["outcome"], "where": e.get("where", ""),
                                    "output": e.get("output") or []})
        elif e["outcome"] == "skipped":
            out["skipped"] += 1
            out["skips"][e.get("error") or ""] = out["skips"].get(e.get("error") or "", 0) + 1
        else:
            out["passed"] += 1
    out["running"] = [t for t in dict.fromkeys(started) if t not in done] if stopped else []
    out["never_started"] = [t for t in collected if t not in set(started)] if stopped else []
    out["collected"] = len(collected)
    return out


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


# ---------------------------------------------------------------------------------------------------------------
# Grouping failures

_NOISE = [(re.compile(r"0x[0-9a-f]+"), "0x…"), (re.compile(r"\d{8}T\d{6}Z-[\w-]+"), "RUN"),
          (re.compile(r"/[\w./-]+\.log"), "LOG"), (re.compile(r"\bpid:? \d+"), "pid N"), (re.compile(r"\d{4,}"), "N")]


def first_line(text: str | None) -> str:
    """The line a person reads first: a run's 'first error: ...' where it has one, else its first line."""
    text = (text or "").strip()
    m = re.search(r"first error: (.*?)(?:; last lines:|$)", text)
    line = (m.group(1) if m else text).splitlines()[0] if text else ""
    return line.strip()


def group_key(line: str) -> str:
    for pattern, repl in _NOISE:
        line = pattern.sub(repl, line)
    return line


def group(failures: list[tuple[str, str, str]]) -> list[tuple[str, list[str]]]:
    """[(error line, [who, ...])] from (who, first line, where it was raised): identical first lines (numbers,
    addresses and run ids aside) together, the largest group first; the place is named where every member shares it."""
    groups: dict[str, tuple[str, list[str], set[str]]] = {}
    for who, line, where in failures:
        key = group_key(line)
        groups.setdefault(key, (line, [], set()))
        groups[key][1].append(who)
        groups[key][2].add(where)
    out = []
    for line, who, places in groups.values():
        place = next(iter(places)) if len(places) == 1 else ""
        out.append((f"{line} ({place})" if place else line, who))
    return sorted(out, key=lambda g: -len(g[1]))


# ---------------------------------------------------------------------------------------------------------------
# The table: one row per backend

def _record(recs: list[dict], backend: str) -> dict | None:
    runs = [r for r in recs if r.get("backend") == backend and "status" in r and r.get("kind") is None]
    return runs[0] if runs else None


def skipped(backend: str, reason: str | None) -> str:
    """A skipped cell: Horovod missing is "not built" (the quick tier builds none), anything else says why."""
    return "not built" if backend == "horovod" and "not installed" in (reason or "") else f"skipped: {reason}"


def cell(launch: dict | None, rec: dict | None, backend: str) -> tuple[str, str | None]:
    """(what the cell says, the failure's first line or None) for one backend in one launch."""
    if launch is None:
        return "—", None
    if launch["status"] == BUDGET:
        return BUDGET, None
    if launch["status"] == gpu_plan.SKIPPED:  # every run would be skipped here: the plan did not start it
        return skipped(backend, launch["reason"]), None
    if rec is None:  # a launch whose build failed was never started: its reason says why
        why = "no record" if launch["status"] == "ok" else f"launch {launch['status']} (exit {launch['rc']})"
        return "failed", launch.get("reason") or first_line(_log_error(launch)) or why
    if rec["status"] == "skipped":
        return skipped(rec.get("backend", ""), rec["reason"]), None
    if rec["status"] != "ok":
        return "failed", first_line(rec.get("reason")) or rec["status"]
    if rec.get("replicas_consistent") is False:
        return "failed", "replicas hold different parameters after training"
    return "ok", None


def verify_cell(launch: dict | None, rows: list[dict], backend: str) -> tuple[str, str | None]:
    if launch is None:
        return "—", None
    if launch["status"] == BUDGET:
        return BUDGET, None
    if launch["status"] == gpu_plan.SKIPPED:  # every backend of the group would be skipped: not started
        return skipped(backend, launch["reason"]), None
    row = next((r for r in rows if r.get("backend") == backend), None)
    if row is None:
        return "failed", (launch.get("reason") or first_line(_log_error(launch))
                          or f"launch {launch['status']} (exit {launch['rc']})")
    if row["verdict"] == "pass":
        return "pass", None
    if row["verdict"] == "skipped":
        return f"skipped: {row.get('why') or ''}".rstrip(": "), None
    return "failed", first_line(row.get("why")) or "FAIL"


def memory_check(rec: dict | None) -> tuple[str, str | None]:
    """The allocator's peaks read, and the memory probe's 256 MiB seen in warm-up's peak and not in the windows'."""
    from bench.rank.faults import BLOAT_BYTES

    if rec is None or rec.get("status") != "ok":
        return "—", None
    mem = rec.get("memory") or []
    if not mem:
        return "failed", "no memory figures in the record"
    m = mem[0]
    if not m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0:
        return "failed", f"peak reserved {m['peak_reserved_bytes']} < allocated {m['peak_allocated_bytes']}"
    if m.get("warmup_peak_allocated_bytes", 0) - m["peak_allocated_bytes"] <= 0.9 * BLOAT_BYTES:
        return "failed", "the memory probe's block is missing from the warm-up peak, or the timed peak kept it"
    return "ok", None


def nvml_check(rec: dict | None) -> tuple[str, str | None]:
    """NVML answered: the machine watch found the GPU, and the GPU's used memory was read."""
    if rec is None or rec.get("status") != "ok":
        return "—", None
    machine, mem = rec.get("machine") or {}, (rec.get("memory") or [{}])[0]
    if machine.get("nvml") != "ok":
        return "failed", f"machine watch: {machine.get('nvml')}"
    if not machine.get("gpus"):
        return "failed", "the machine watch found no GPU"
    if mem.get("nvml_used_bytes") is None:
        return "failed", f"NVML used memory: {mem.get('nvml_used_reason')}"
    return "ok", None


def _log_error(launch: dict) -> str:
    """The first error a launch's log shows (a harness that stopped before any record)."""
    try:
        lines = Path(launch["log"]).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if re.match(r"\s*(bench: error:|[A-Za-z_.]*(Error|Exception)\b:?)", ln)]
    return errors[0].strip() if errors else (lines[-1].strip() if lines else "")


def backend_rows(manifest: dict, folder: Path, names: list[str]) -> tuple[list[list], list[tuple[str, str]]]:
    """One row per backend: bf16, fp16, fp32 (verify), 2 ranks, memory, NVML, the command that runs it alone; and the
    failures as (who, first line)."""
    launches = manifest.get("launches", {})
    verify_rows = []
    for name, launch in launches.items():
        if launch["column"] == "fp32 (verify)":
            for r in gpu_plan.records(folder, name):
                if r.get("kind") == "verify":
                    verify_rows += r["rows"]
    rows, failures = [], []
    for b in names:
        by_col = {col: next((launches[n] for n in launches if launches[n]["column"] == col and b in
                             launches[n]["backends"]), None) for col in gpu_plan.COLUMNS}
        bf16 = _record(gpu_plan.records(folder, f"{b}-bf16"), b) if by_col["bf16"] else None
        cells = []
        for col in gpu_plan.COLUMNS:
            launch = by_col[col]
            if col == "fp32 (verify)":
                got = verify_cell(launch, verify_rows, b)
            else:
                rec = bf16 if col == "bf16" else (_record(gpu_plan.records(folder, _name(launch)), b) if launch else None)
                got = cell(launch, rec, b)
            cells.append(got)
        cells += [memory_check(bf16), nvml_check(bf16)]
        for (text, why), col in zip(cells, [*gpu_plan.COLUMNS, "memory", "NVML"]):
            if why:
                failures.append((f"{b} {col}", why))
        rows.append([b, *[text for text, _ in cells], f"python -m bench doctor --backends {b}"])
    return rows, failures


def _name(launch: dict) -> str:
    return Path(launch["results"]).name


def other_launches(manifest: dict, folder: Path) -> tuple[list[list], list[tuple[str, str]]]:
    """The single-purpose launches (no backend row of their own): what each checks and how it went."""
    rows, failures = [], []
    for name, launch in manifest.get("launches", {}).items():
        if launch["column"]:
            continue
        recs = [r for r in gpu_plan.records(folder, name) if r.get("status")]
        bad = [r for r in recs if r["status"] == "failed"]
        if launch["status"] in (BUDGET,):
            status, why = BUDGET, None
        elif launch["status"] == gpu_plan.SKIPPED:
            status, why = f"skipped: {launch['reason']}", None
        elif bad:
            status, why = "failed", first_line(bad[0].get("reason"))
        elif launch["status"] != "ok" and not recs:
            status, why = "failed", (launch.get("reason") or first_line(_log_error(launch))
                                     or f"launch {launch['status']}")
        elif recs and all(r["status"] == "skipped" for r in recs):
            status, why = f"skipped: {recs[0]['reason']}", None
        else:
            status, why = ("ok" if launch["status"] == "ok" else launch["status"]), None
        if why:
            failures.append((name, why))
        rows.append([name, launch["what"], status, launch["command"]])
    return rows, failures


def measured_row(rec: dict) -> list:
    """One measured run (sequential, alone on the machine): its status and reason, or its figures."""
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


BACKEND_HEADER = ["backend", "bf16", "fp16", "fp32 (verify)", "2 ranks", "memory", "NVML", "this row alone"]
MEASURED_HEADER = ["backend", "GPUs", "precision", "status", "img/s", "peak reserved per GPU", "MFU", "J/image",
                   "why / note"]


def tests_line(t: dict | None) -> str:
    if t is None:
        return "gpu tests: not run (--skip-tests)"
    counts = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped"
    line = f"gpu tests: {counts} in {t['seconds']:.0f} s (log: {t['log']})"
    if t["timed_out"]:
        line += (f"; stopped by the time budget with {len(t['running'])} running "
                 f"({', '.join(t['running']) or 'none'}) and {len(t['never_started'])} never started"
                 + (f" ({', '.join(t['never_started'][:10])}{', ...' if len(t['never_started']) > 10 else ''})"
                    if t["never_started"] else ""))
    return line


def build_line(b: dict) -> str:
    """One build beside the plan, in a line: how it ended, in how long, where its log is."""
    how = {"built": "built", "failed": f"FAILED: {b['reason']}", "running": "still running"}[b["status"]]
    took = f" in {b['seconds']:.0f} s" if b.get("seconds") is not None else ""
    return f"{b['what'] or 'build'}: {how}{took} (log: {b['log']})"


def report(manifest: dict | None, folder: Path, names: list[str], tests: dict | None, measured: list[dict],
           full: bool, horovod_built: bool, baseline_cmd: str | None = None,
           builds: list[dict] = ()) -> tuple[str, bool]:
    """The doctor's text (tables, grouped failures, verdict last) and whether the check failed. ``builds``: the
    summaries of the builds run beside the plan (gpu_check.Build)."""
    from bench.core.text import md_table

    out, failures = [], []
    rows: list[list] = []
    others: list[list] = []
    if manifest is not None:
        rows, failures = backend_rows(manifest, folder, names)
        others, more = other_launches(manifest, folder)
        failures += more
        out += [f"Backends ({gpu_plan.CONCURRENT}):", "", md_table(BACKEND_HEADER, rows, set()), ""]
        if others:
            out += ["Single-purpose launches:", "", md_table(["launch", "checks", "status", "alone"], others, set()), ""]
    test_failures = [(f["test"], f["error"], f.get("where") or "") for f in (tests or {}).get("failures", [])]
    groups = group([(who, line, "") for who, line in failures]) + group(test_failures)
    if groups:
        out.append("Failures (identical first lines grouped):")
        for i, (line, who) in enumerate(groups, 1):
            out.append(f"{i}. {len(who)} {'tests' if '::' in who[0] else 'checks'}: {line}")
            out.append(f"   {', '.join(who[:12])}{', ...' if len(who) > 12 else ''}")
        out.append("")
    if measured:
        out += ["Measured (sequential, alone on the machine):", "",
                md_table(MEASURED_HEADER, [measured_row(r) for r in measured], {1, 4, 5, 6, 7}), ""]
    out.append(tests_line(tests))
    out += [build_line(b) for b in builds]
    if not horovod_built and not builds:
        out.append(f"horovod: not built ({HOROVOD_BUILD})")
    # the verdict
    failed_backends = sorted({who.split(" ")[0] for who, _ in failures if who.split(" ")[0] in names})
    not_built = ["horovod"] if any(r[0] == "horovod" and "not built" in r[1:5] for r in rows) else []
    skipped = [r[0] for r in rows if r[0] not in failed_backends and r[0] not in not_built
               and all(str(c).startswith("skipped") or c in ("—", BUDGET) for c in r[1:5])
               and any(str(c).startswith("skipped") for c in r[1:5])]
    budget = [r[0] for r in rows if any(c == BUDGET for c in r[1:5])]
    ran = [r[0] for r in rows if r[0] not in failed_backends + not_built + skipped
           and any(c in ("ok", "pass") for c in r[1:5])]
    bad_runs = [r for r in measured if r["status"] == "failed" or r.get("replicas_consistent") is False]
    bad_tests = tests is not None and (tests["failed"] > 0 or (full and tests["timed_out"]))
    other_failures = [who for who, _ in failures if who.split(" ")[0] not in names]
    bad_builds = [b for b in builds if b["status"] != "built"]
    failed = bool(failed_backends or bad_runs or bad_tests or other_failures or bad_builds
                  or (full and (budget or any(r["status"] == BUDGET for r in measured))))
    parts = [f"{len(ran)} backend{'s' * (len(ran) != 1)} ran", f"{len(failed_backends)} failed"
             + (f" ({', '.join(failed_backends)})" if failed_backends else "")]
    if not_built:
        parts.append(f"{len(not_built)} not built ({', '.join(not_built)})")
    if skipped:
        parts.append(f"{len(skipped)} skipped ({', '.join(skipped)})")
    if budget:
        parts.append(f"{len(budget)} not run in the budget ({', '.join(budget)})")
    if other_failures:
        parts.append(f"{len(other_failures)} single-purpose launch{'es' * (len(other_failures) != 1)} failed")
    others_skipped = [r[0] for r in others if str(r[2]).startswith("skipped")]
    if others_skipped:
        parts.append(f"{len(others_skipped)} single-purpose launch{'es' * (len(others_skipped) != 1)} skipped "
                     f"({', '.join(others_skipped)})")
    if bad_builds:
        parts.append(f"{len(bad_builds)} build{'s' * (len(bad_builds) != 1)} failed")
    if bad_runs:
        parts.append(f"{len(bad_runs)} measured run{'s' * (len(bad_runs) != 1)} failed")
    if tests is not None and tests["failed"]:
        parts.append(f"{tests['failed']} gpu test{'s' * (tests['failed'] != 1)} failed")
    if baseline_cmd and not failed:
        out.append(f"regression baseline for this GPU: {baseline_cmd}")
    out.append(f"GPU machine {'NOT OK' if failed else 'OK'}: {', '.join(parts)}")
    return "\n".join(out), failed


# ---------------------------------------------------------------------------------------------------------------
# The command

def baseline_name(gpus: int) -> str:
    """The name `make baseline GPUS=N` gives this machine's baseline, asked as make asks it (commands do not import
    each other)."""
    return subprocess.run([sys.executable, "-m", "bench", "baseline", "name", "--max-gpus", str(gpus)], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout.strip()


def sweep_backends(names: list[str], given: str, full: bool) -> list[str]:
    """The measured sweep's backends: under --full the default sweep's and Horovod (FULL_SWEEP), unless --backends
    named some; in the quick tier every backend of the check."""
    return [n for n in names if n in FULL_SWEEP] if full and given == "all" else names


def estimate_line(tier: str, gpus: int, gpu_name: str, launches: list, jobs: int, budget: float,
                  build_jobs: int | None, measured: int, tests: bool) -> str:
    """What the check will do and what it will cost, printed before it starts."""
    build_s = gpu_plan.BUILD_SECONDS if build_jobs else None
    plan_s = gpu_plan.estimate_seconds(launches, jobs, build_s)
    head = (f"doctor: {tier} tier on {gpus} GPU(s) ({gpu_name}): {len(launches)} launches "
            f"({sum(x.trees for x in launches)} process trees), {jobs} at once")
    if tier == "quick":
        return (f"{head}, about {plan_s:.0f} s; then the gpu tests on their records; budget {budget:.0f} s")
    held = [x for x in launches if x.after]
    build = (f", Horovod built beside them ({build_jobs} compile jobs, about {build_s:.0f} s) and its {len(held)} "
             "launches held until it ends" if build_jobs else "")
    total = plan_s + (TESTS_S if tests else 0.0) + measured * MEASURED_RUN_S
    return (f"{head}{build}, about {plan_s:.0f} s; then the gpu tests on their records"
            + (f" (about {TESTS_S:.0f} s)" if tests else " (skipped)")
            + f" and the measured sweep ({measured} run{'s' * (measured != 1)}, about "
            f"{measured * MEASURED_RUN_S:.0f} s): about {total:.0f} s in all; budget {budget:.0f} s"
            + ("" if total <= budget else " (over it: what the budget leaves out fails)"))


def cmd_doctor(args) -> int:
    import importlib

    import backends
    from bench import launch
    from bench.plan.sweep import check_writable, parse_backends
    from bench.core import nvml
    from bench.core.errors import UsageError

    start = time.monotonic()
    tier = TIERS["full" if args.full else "quick"]
    budget = tier["budget_s"] if args.budget_s is None else args.budget_s
    present = require_cuda()
    gpus = present if args.gpus is None else args.gpus
    if not 1 <= gpus <= present:
        raise UsageError(f"--gpus {gpus}: this machine has {present} CUDA device(s); choose 1 to {present}")
    if not (budget > 0 and args.run_timeout > 0 and args.test_timeout > 0):
        raise UsageError(f"--budget-s, --run-timeout-s and --test-timeout-s must be positive, got {budget:g}, "
                         f"{args.run_timeout:g}, {args.test_timeout:g}")
    for flag, value in (("--jobs", args.jobs), ("--test-jobs", args.test_jobs)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    names = parse_backends(args.backends)
    out = Path(args.results)
    check_writable(out)
    swept = [] if args.skip_sweep else sweep_backends(names, args.backends, args.full)
    measured_plan = plan(gpus, ",".join(swept), out / "raw", tier["precisions"]) if swept else []  # bad input: here
    from bench.core.devices import usable_cpus

    cpus = usable_cpus()
    jobs = args.jobs or gpu_plan.default_jobs(cpus)
    launches = gpu_plan.launches(min(gpus, 2), names)
    env_meta = environment.collect_env()
    gpu_name = (env_meta.get("gpu_names") or ["?"])[0]
    from backends import horovod

    horovod_built = gpu_plan.BUILT_BESIDE not in names or horovod.problem() is None
    builds = []
    if tier["build"] and not horovod_built:
        builds.append(gpu_plan.horovod_build(Path(sys.prefix), int(os.environ.get("BUILD_JOBS") or
                                                                   gpu_plan.build_jobs(cpus)),
                                             out / "horovod-build.log"))
    else:  # nothing to wait for: Horovod's launches start, or are skipped, as any other
        launches = [dataclasses.replace(x, after="") for x in launches]
    print(estimate_line("full" if args.full else "quick", gpus, gpu_name, launches, jobs, budget,
                        builds[0].env["BUILD_JOBS"] if builds else None, len(measured_plan), not args.skip_tests),
          file=sys.stderr, flush=True)
    if not horovod_built and not builds:
        print(f"doctor: horovod: not built ({HOROVOD_BUILD})", file=sys.stderr, flush=True)
    for b in builds:
        b.start()
        print(f"doctor: building {b.what} beside the plan: {b.summary()['command']} (log: {b.log})", file=sys.stderr,
              flush=True)
    try:
        with nvml.open() as n:
            gpu_bytes = n.memory_total(environment.visible_nvml_indices(n.count())[0])
    except nvml.Unavailable as e:
        gpu_bytes = None
        print(f"doctor: the plan is not gated by GPU memory ({e})", file=sys.stderr, flush=True)
    deadline = start + budget
    reserve = (0.0 if args.skip_tests else TESTS_S) + (len(measured_plan) * MEASURED_RUN_S if args.full else 0.0)
    try:
        manifest = gpu_plan.run(launches, out / "plan", jobs, deadline - reserve, gpu_bytes,
                                say=lambda m: print(f"doctor: {m}", file=sys.stderr, flush=True), builds=builds)
        tests = None
        if not args.skip_tests:
            left = max(TESTS_S, deadline - time.monotonic() - (reserve - TESTS_S))
            print(f"doctor: pytest -m gpu on the plan's records, {left:.0f} s at most (log: {out / 'gpu-tests.log'}) "
                  "...", file=sys.stderr, flush=True)
            tests = run_tests(left, out, args.test_timeout, args.test_jobs or jobs, plan_dir=out / "plan")
        for b in builds:  # the measured sweep runs alone: the build ends first (or is stopped at the budget)
            if b.state() is None:
                print(f"doctor: waiting for {b.name} before the measured sweep (log: {b.log})", file=sys.stderr,
                      flush=True)
            horovod_built = b.wait(deadline) == ""
            importlib.invalidate_caches()  # what it installed, for this process's planner and launcher
    finally:
        for b in builds:
            b.stop()
    measured = []
    for i, cfg in enumerate(measured_plan, 1):
        left = deadline - time.monotonic()
        if left < MIN_RUN_S:
            measured.append({"backend": cfg.backend, "world_size": cfg.world_size, "precision": cfg.precision,
                             "status": BUDGET, "reason": f"the {budget:.0f} s budget was spent"})
            continue
        print(f"doctor: measured [{i}/{len(measured_plan)}] {cfg.backend} x{cfg.world_size} {cfg.precision}",
              file=sys.stderr, flush=True)
        measured.append(launch.run_one(cfg, out / "raw", env_meta, backends.create(cfg.backend),
                                       timeout=min(args.run_timeout, left)))
    if not args.full:  # the quick tier's measured runs are what time allowed: those left out are not listed
        measured = [r for r in measured if r["status"] != BUDGET]
    baseline_cmd = None
    if args.full:
        name = baseline_name(gpus)
        baseline_cmd = f"make baseline GPUS={gpus}" + (f"  (writes results/baselines/{name}.json)" if name else "")
    text, failed = report(manifest, out / "plan", names, tests, measured, args.full, horovod_built, baseline_cmd,
                          [b.summary() for b in builds])
    print(f"bench doctor ({'full' if args.full else 'quick'}): {gpus} GPU(s) ({gpu_name}), "
          f"{time.monotonic() - start:.0f} s")
    print(text)
    (out / "doctor.md").write_text(text + "\n")
    return 1 if failed else 0

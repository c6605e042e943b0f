import contextlib
import fcntl
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Every rank a test starts shares 2 cores with another test's ranks (`make test` runs 2 pytest-xdist workers).
# OpenMP's default wait policy spins a waiting thread before it sleeps, so oversubscribed ranks burn the cores the
# others need: the heap-budget search took 108 s of CPU spinning, 64 s passive, beside one busy loop. Tests check
# correctness, not speed; a benchmark run keeps the user's policy. Set before torch (and its libgomp) loads; ranks
# inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The first run of a sweep measures the matmul peak once per machine and caches it (bench/core/peak.py): tests never
# read or write the user's cache, but one of their own per session, shared by its xdist workers (they inherit it).
# The session that made a folder removes it at its end (pytest_unconfigure).
_OWNED: list[str] = []
if "BENCH_PEAK_CACHE" not in os.environ:
    os.environ["BENCH_PEAK_CACHE"] = tempfile.mkdtemp(prefix="bench-test-peak-")
    _OWNED.append(os.environ["BENCH_PEAK_CACHE"])
# The same for the FLOP counts (backends/models/flops.py): the session's first `bench run` of a model counts it, the
# others read the count.
if "BENCH_FLOPS_CACHE" not in os.environ:
    os.environ["BENCH_FLOPS_CACHE"] = tempfile.mkdtemp(prefix="bench-test-flops-")
    _OWNED.append(os.environ["BENCH_FLOPS_CACHE"])
# The runs several test modules read (shared_run below), one folder per session, inherited by the xdist workers.
if "BENCH_TEST_SHARED_DIR" not in os.environ:
    os.environ["BENCH_TEST_SHARED_DIR"] = tempfile.mkdtemp(prefix="bench-test-shared-")
    _OWNED.append(os.environ["BENCH_TEST_SHARED_DIR"])

# The suite starts hundreds of Python processes (ranks, launchers, `python -m bench`), each importing the project's
# modules. With PYTHONDONTWRITEBYTECODE set (common in containers, and on these CI machines) none of them caches its
# bytecode, so every process compiles bench/ and backends/ from source again, and every xdist worker rewrites every
# test module's asserts again: 0.3 s of CPU a process, ~5% of `make test`. The tests let the caches be written
# (__pycache__ is ignored by git); what users run keeps their setting.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import torch  # noqa: E402

from tests import cpu_time  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# The smallest run that still exercises everything: cnn-tiny (convolutions with BatchNorm, 24 k parameters; no
# torchvision) at 32 px, 2 windows of 1 step (and as many compute-only windows). A rank's start-up is most of a run:
# a 2-rank DDP rank took 2.3 s of CPU on cnn-tiny against 3.4 s on resnet18 (torchvision's import, 11.7 M parameters
# to build, broadcast and all-reduce). The backend contract (tests/backends/test_contract.py) keeps resnet18: every
# backend on a torchvision model with residual connections.
TINY_STEPS, TINY_WINDOWS = 1, 2
TINY_MODEL = "cnn-tiny"
TINY = ["--device", "cpu", "--model", TINY_MODEL, "--image-size", "32", "--batch-size", "2",
        "--warmup", "2", "--steps", str(TINY_STEPS), "--windows", str(TINY_WINDOWS)]


def bench(*args, env=None, timeout=600, check=False):
    """Run the CLI exactly as a user does: ``python -m bench ...`` in a fresh process."""
    full_env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "bench", *map(str, args)], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def bench_inproc(*args, env=None, check=False):
    """``python -m bench ...`` through the same entry point (``bench.cli.main``) in this process, with stdout and stderr
    captured: the runs still start their own process trees, but the harness needs no interpreter and torch start-up
    of its own (seconds per call on 2 cores). One real subprocess test per command (``bench``) keeps the user's path
    honest. ``env`` is set, and BENCH_FAULT unset, for the call only."""
    from bench import cli

    saved_env, saved_term = dict(os.environ), signal.getsignal(signal.SIGTERM)
    os.environ.pop("BENCH_FAULT", None)
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main(list(map(str, args)))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        signal.signal(signal.SIGTERM, saved_term)  # bench run turns SIGTERM into KeyboardInterrupt
    proc = subprocess.CompletedProcess(["bench", *map(str, args)], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"bench {' '.join(map(str, args))} exited {code}\n{proc.stdout}\n{proc.stderr}")
    return proc


def shared(name: str, build) -> dict:
    """``build(folder)``'s answer (a dict, kept as JSON), built once a session under ``name``: for a launch that tests
    in several modules read, which a module fixture cannot share (--dist loadscope may put the modules on different
    workers). The first test that asks builds it while holding the folder's lock; every other asker, in any xdist
    worker, waits and reads the same answer (the GPU plan's pattern, shared_gpu_plan below). The folder is the
    session's (BENCH_TEST_SHARED_DIR), so what ``build`` leaves in it stays for the other askers."""
    folder = Path(os.environ["BENCH_TEST_SHARED_DIR"]) / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "answer.json"
        if not done.exists():
            done.write_text(json.dumps(build(folder)))
        return json.loads(done.read_text())


def shared_run(name: str, *args) -> tuple[Path, subprocess.CompletedProcess]:
    """One ``bench_inproc(*args, "--results", folder)`` for the whole session, under ``name`` (``shared``): (its
    results folder, its output). Every asker must pass the same arguments: a second set is refused, not run."""
    asked = json.dumps(list(map(str, args)))

    def build(folder):
        proc = bench_inproc(*args, "--results", folder / "raw")
        return {"asked": asked, "raw": str(folder / "raw"), "returncode": proc.returncode, "stdout": proc.stdout,
                "stderr": proc.stderr}

    out = shared(name, build)
    assert out["asked"] == asked, f"shared run {name!r} was run with other arguments: {out['asked']} against {asked}"
    return Path(out["raw"]), subprocess.CompletedProcess(["bench", *map(str, args)], out["returncode"], out["stdout"],
                                                         out["stderr"])


def records(directory) -> list[dict]:
    """The records in ``directory`` (not a writer's ``.tmp-*`` file: pathlib's glob matches hidden names)."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json")) if not p.name.startswith(".")]


# How many `gpu` tests may use the GPUs at once, machine-wide: under pytest-xdist (`make test`) a `gpu` test runs while
# holding one of BENCH_GPU_TEST_SLOTS lock files (default 1: one GPU is never shared by two tests, which also keeps
# two test sessions on one machine apart). The gpu tests assert what ran, never how fast, and each run is tiny, so
# `bench doctor` (make gpu-check) runs several at once: most of a run is processes starting. A module's tests stay on
# one worker (--dist loadscope), so its module fixtures (one run feeding many assertions) run once.
GPU_SLOTS = max(1, int(os.environ.get("BENCH_GPU_TEST_SLOTS", "1")))
GPU_LOCK = Path(tempfile.gettempdir()) / f"torch-parallel-bench-gpu-{os.getuid()}.lock"


def _gpu_slot():
    """An open, exclusively locked slot file (waits until one is free)."""
    import time

    while True:
        for i in range(GPU_SLOTS):
            lock = open(GPU_LOCK if i == 0 else GPU_LOCK.with_name(f"{GPU_LOCK.stem}-{i}.lock"), "a")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if GPU_SLOTS > 1 else 0))
                return lock
            except BlockingIOError:
                lock.close()
        time.sleep(0.2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with contextlib.ExitStack() as stack:
        if _CPU_DIR:
            stack.enter_context(cpu_time.measure(item.nodeid, Path(_CPU_DIR)))
        if item.get_closest_marker("gpu") and torch.cuda.is_available():
            stack.enter_context(_gpu_slot())
        return (yield)


# BENCH_TEST_LOG=FILE (bench doctor sets it): what happens to every test, one JSON object a line, appended and flushed
# as it happens, so a check stopped by its time limit loses nothing: {"event": "collected", "tests": [...]} once,
# {"event": "start", "test": id} as each starts, and {"event": "done", "test": id, "outcome": passed | failed | error |
# skipped, "seconds": setup + call + teardown, "error": the first line of its error or skip reason, "where":
# file:line of the failure, "output": the last lines of its traceback and captured output} as each ends. A one-line
# progress note goes to the terminal too. Only the controller writes (under pytest-xdist it receives every worker's
# reports); a worker is told by its config, not by PYTEST_XDIST_WORKER, which a pytest started inside a worker inherits.
TEST_LOG = os.environ.get("BENCH_TEST_LOG")
OUTPUT_LINES = 15
_DONE: dict[str, dict] = {}
_CONFIG = None


# Each test's CPU time (tests/cpu_time.py), one folder per session: the controller makes it and its xdist workers
# write into it; a pytest that a test starts (the doctor's, the install test's) counts as that test's CPU and writes
# nothing. make test (BENCH_TEST_CALIBRATE=1) also times a fresh `import torch` before its tests, and prints both at
# the end.
_CPU_DIR: str | None = None
_CALIBRATION: dict | None = None


def pytest_configure(config):
    global _CONFIG, _CPU_DIR, _CALIBRATION
    _CONFIG = config
    if hasattr(config, "workerinput"):
        _CPU_DIR = os.environ.get("BENCH_TEST_CPU_DIR")
    elif "BENCH_TEST_CPU_DIR" in os.environ:
        del os.environ["BENCH_TEST_CPU_DIR"]
    else:
        _CPU_DIR = os.environ["BENCH_TEST_CPU_DIR"] = tempfile.mkdtemp(prefix="bench-test-cpu-")
        _OWNED.append(_CPU_DIR)
        if os.environ.get("BENCH_TEST_CALIBRATE") == "1":  # make test sets it
            _CALIBRATION = cpu_time.calibrate()


def pytest_terminal_summary(terminalreporter):
    if _CPU_DIR and not hasattr(_CONFIG, "workerinput"):
        lines = cpu_time.summary(Path(_CPU_DIR), _CALIBRATION)
        if lines:
            terminalreporter.section("CPU time")
            for line in lines:
                terminalreporter.write_line(line)


def pytest_unconfigure(config):
    import shutil

    for folder in _OWNED:
        shutil.rmtree(folder, ignore_errors=True)


def _controller() -> bool:
    return bool(TEST_LOG) and not hasattr(_CONFIG, "workerinput")


def _log(event: dict) -> None:
    with open(TEST_LOG, "a") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()


def pytest_collection_finish(session):
    if _controller():
        _log({"event": "collected", "tests": [item.nodeid for item in session.items]})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    global _COLLECTED
    if _controller() and not _COLLECTED:  # every worker collects the same tests: said once
        _COLLECTED = True
        _log({"event": "collected", "tests": list(ids)})


_COLLECTED = False


def pytest_runtest_logstart(nodeid, location):
    if _controller():
        _log({"event": "start", "test": nodeid})


def _first_error(report) -> tuple[str, str]:
    """(the first line of a failure's error, or a skip's reason; file:line where it was raised)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, "Skipped: why")
        return str(longrepr[2]).removeprefix("Skipped: "), f"{longrepr[0]}:{longrepr[1]}"
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        lines = [ln for ln in str(crash.message).splitlines() if ln.strip()]
        root = str(getattr(_CONFIG, "rootpath", REPO))
        path = str(crash.path).removeprefix(f"{root}{os.sep}")
        return (lines[0] if lines else ""), f"{path}:{crash.lineno}"
    text = [ln for ln in str(longrepr or "").splitlines() if ln.strip()]
    return (text[-1] if text else ""), ""


def pytest_runtest_logreport(report):
    if not _controller():
        return
    seen = _DONE.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed", "error": "", "where": "",
                                            "output": []})
    seen["seconds"] += report.duration
    if report.failed or (report.skipped and seen["outcome"] == "passed"):
        seen["outcome"] = ("failed" if report.when == "call" else "error") if report.failed else "skipped"
        seen["error"], seen["where"] = _first_error(report)
        tail = str(report.longrepr or "").splitlines() if report.failed else []
        for _, content in report.sections:
            tail += content.splitlines()
        seen["output"] = tail[-OUTPUT_LINES:]
    if report.when == "teardown":
        done = _DONE.pop(report.nodeid)
        _log({"event": "done", "test": report.nodeid, **done, "seconds": round(done["seconds"], 2)})
        line = (f"{PROGRESS_MARK} {report.nodeid} {done['outcome']} {done['seconds']:.1f} s"
                + (f" ({done['error']})" if done["error"] else ""))
        terminal = _CONFIG.pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(line, flush=True)
        else:
            print(line, flush=True)


PROGRESS_MARK = "[test done]"  # the terminal's line per finished test (bench doctor echoes them)


# Optional dependencies a machine may lack (a GPU machine with no package registry had no DALI, DeepSpeed or HTA):
# a test that needs one skips with the reason and the fix, and fails none. `.ci/run` sets BENCH_REQUIRE_OPTIONAL=1:
# there `make` installed every locked package, so a missing one is a broken install, not a skip.
REQUIRE_OPTIONAL = os.environ.get("BENCH_REQUIRE_OPTIONAL") == "1"


def optional_problem(what: str) -> str | None:
    """Why the optional dependency ``what`` (dali, deepspeed, hta, nvml, horovod) cannot be used here, or None.
    Cheap where it can be (a test module calls it at collection): DeepSpeed is found, not imported."""
    import importlib.util

    if what == "dali":
        from bench.rank import loaders

        return loaders.unavailable("dali")
    if what == "deepspeed":
        return None if importlib.util.find_spec("deepspeed") else "deepspeed is not installed (make install does)"
    if what == "hta":
        return None if importlib.util.find_spec("hta") else ("Holistic Trace Analysis is not installed "
                                                            "(holistictraceanalysis; make install does)")
    if what == "nvml":
        from bench.core import environment

        return environment.nvml_gpus().get("error")
    if what == "horovod":
        from backends import horovod

        return horovod.problem()
    raise ValueError(f"unknown optional dependency {what!r}")


def skip_without(*what: str) -> None:
    """Skip the calling test, with the reason, when one of the optional dependencies ``what`` is missing (a failure
    instead under BENCH_REQUIRE_OPTIONAL=1, and for Horovod under BENCH_REQUIRE_HOROVOD=1, which the CPU gate sets)."""
    for name in what:
        problem = optional_problem(name)
        if problem is not None:
            if REQUIRE_OPTIONAL:
                pytest.fail(f"BENCH_REQUIRE_OPTIONAL=1 and {name} cannot be used: {problem}")
            if name == "horovod" and os.environ.get("BENCH_REQUIRE_HOROVOD") == "1":
                pytest.fail(f"BENCH_REQUIRE_HOROVOD=1 and horovod cannot be used: {problem}")
            pytest.skip(problem)


def skip_missing(backend: str, loader: str | None, reason: str) -> None:
    """A run (or a launch) skipped here: a failure where the missing dependency is required (``skip_without``), else a
    skip with its reason."""
    if backend == "horovod":
        skip_without("horovod")
    elif backend.startswith("ds_"):
        skip_without("deepspeed")
    elif loader == "dali":
        skip_without("dali")
    pytest.skip(reason)


# The GPU check's launch plan (bench/plan/gpu_check.py): the `gpu` tests start no runs of their own, they read the
# plan's records. Under `bench doctor` the plan already ran and BENCH_GPU_PLAN_DIR names its folder; under a plain
# `pytest -m gpu` the first test that asks runs it there, once for every xdist worker (they inherit this variable from
# the controller, which sets it before they start, and take turns on the folder's lock).
os.environ.setdefault("BENCH_GPU_PLAN_DIR", str(Path(tempfile.gettempdir()) / f"bench-gpu-plan-{os.getpid()}"))


class GpuPlan:
    """The plan's manifest and records, as the gpu tests read them."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder, self.manifest = Path(folder), manifest

    def launch(self, name: str) -> dict:
        """A launch's manifest entry; skips the test when the plan has no such launch (two GPUs needed, another
        doctor --backends), the budget left it out, or every run of it would be skipped here (the plan did not start
        it: a backend or loader missing, with its reason)."""
        from bench.plan import gpu_check as _gpu_plan

        got = self.manifest["launches"].get(name)
        if got is None:
            pytest.skip(f"launch {name} is not in this plan")
        if got["status"] == _gpu_plan.NOT_RUN:
            pytest.skip(f"launch {name}: {_gpu_plan.NOT_RUN}")
        if got["status"] == _gpu_plan.SKIPPED:
            argv = got["argv"]
            loader = argv[argv.index("--loader") + 1] if "--loader" in argv else None
            skip_missing(got["backends"][0] if got["backends"] else "", loader, got["reason"])
        return got

    def records(self, name: str) -> list[dict]:
        """Every record of a launch; fails with the launch's last log lines when it wrote none."""
        from bench.plan import gpu_check as _gpu_plan

        launch = self.launch(name)
        recs = _gpu_plan.records(self.folder, name)
        if not recs:
            tail = "\n".join(Path(launch["log"]).read_text(errors="replace").splitlines()[-20:])
            pytest.fail(f"launch {name} {launch['status']} (exit {launch['rc']}) and wrote no record: {tail}")
        return recs

    def record(self, name: str, backend: str | None = None) -> dict:
        """The one run record of a launch (of ``backend``), ok; a backend this machine cannot run skips with its
        reason (a failure where BENCH_REQUIRE_OPTIONAL=1 or, for Horovod, BENCH_REQUIRE_HOROVOD=1)."""
        runs = [r for r in self.records(name) if r.get("kind") is None and (backend is None or r["backend"] == backend)]
        assert len(runs) == 1, [(r["backend"], r["precision"]) for r in runs]
        rec = runs[0]
        if rec["status"] == "skipped":
            skip_missing(rec["backend"], rec.get("loader"), rec["reason"])
        assert rec["status"] == "ok", rec["reason"]
        return rec

    def log(self, name: str) -> str:
        return Path(self.launch(name)["log"]).read_text(errors="replace")


def shared_gpu_plan(folder: Path | str | None = None, runner=None) -> GpuPlan:
    """The plan's results in ``folder`` (default BENCH_GPU_PLAN_DIR): read when a complete manifest is there, else run
    by ``runner(folder)`` (default: the whole plan for this machine) while holding the folder's lock, so that the
    first caller of the session runs it and every other caller, in any xdist worker, waits and reads."""
    from bench.plan import gpu_check as _gpu_plan

    folder = Path(folder or os.environ["BENCH_GPU_PLAN_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = _gpu_plan.load(folder)
        if manifest is None or not manifest.get("complete"):
            manifest = (runner or run_gpu_plan)(folder)
    return GpuPlan(folder, manifest)


def run_gpu_plan(folder: Path) -> dict:
    """The whole plan for this machine's GPUs (one, or two and more), as bench doctor runs it."""
    import time

    from bench.plan import gpu_check as _gpu_plan
    from bench.core import cuda
    from bench.core.devices import usable_cpus

    plan = _gpu_plan.launches(min(cuda.count(), 2))
    print(f"gpu tests: running the GPU check's launch plan ({len(plan)} launches) into {folder}", flush=True)
    return _gpu_plan.run(plan, folder, _gpu_plan.default_jobs(usable_cpus()), time.monotonic() + 3600)


@pytest.fixture(scope="session")
def gpu_plan() -> GpuPlan:
    from bench.core import cuda

    if not cuda.available():
        pytest.skip("needs a CUDA device")
    return shared_gpu_plan()


# A gpu test of 2 ranks on a machine with one GPU: the DDP family shares it over gloo (--ranks-per-gpu 2); the others
# need one GPU per rank, and say why they skip.
NEEDS_TWO_GPUS = ("needs 2 CUDA devices: NCCL refuses two ranks on one device, and {} has no gloo path for CUDA tensors "
                  "here (only the DDP family shares one GPU between ranks: --ranks-per-gpu)")


def two_gpus(what: str):
    """Skip a test of ``what`` at 2 ranks where fewer than 2 GPUs exist, with the reason."""
    return pytest.mark.skipif(torch.cuda.device_count() < 2, reason=NEEDS_TWO_GPUS.format(what))


@pytest.fixture
def results_dir(tmp_path):
    return tmp_path / "raw"


def cli_error(capsys, *args, env=None, monkeypatch=None):
    """A bad-input check in this process (no torch start-up per case): ``bench.cli.main`` with ``args``; returns
    (exit code, stderr). The message path is the same one a user's ``python -m bench`` takes (one subprocess test
    per command keeps that honest)."""
    from bench import cli

    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v) if v else monkeypatch.delenv(k, raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(list(map(str, args)))
    return e.value.code, capsys.readouterr().err


# `make test-fast` (BENCH_TEST_FAST=1, -m "not slow and not gpu"): the tests that start no process group, launch no
# run and train nothing. Rather than trust every marker, the fast run refuses those three things, so a test that
# does one of them without `@pytest.mark.slow` fails there with the reason instead of quietly making it slow.
FAST_ONLY = os.environ.get("BENCH_TEST_FAST") == "1"


class SlowInFastRun(RuntimeError):
    pass


def _refuse(what):
    def refused(*args, **kwargs):
        raise SlowInFastRun(f"make test-fast: this test {what}; mark it @pytest.mark.slow")
    return refused


if FAST_ONLY:
    import torch.distributed

    import backends.base

    _popen_init = subprocess.Popen.__init__

    def _guarded_popen(self, args, *rest, **kwargs):
        argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
        joined = " ".join(argv)
        if "-m bench" in joined or "torchrun" in joined or "horovodrun" in joined or "torch.distributed.run" in joined:
            _refuse(f"launches {joined[:120]!r}")()
        return _popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = _guarded_popen
    torch.distributed.init_process_group = _refuse("starts a process group")
    backends.base.Backend.step = _refuse("trains (Backend.step)")

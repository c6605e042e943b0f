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
if "BENCH_PEAK_CACHE" not in os.environ:
    os.environ["BENCH_PEAK_CACHE"] = tempfile.mkdtemp(prefix="bench-test-peak-")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# The smallest run that still exercises everything: resnet18 (has BatchNorm) at 32 px, 2 windows of 1 step (and as
# many compute-only windows). A rank's start-up (importing torch and torchvision: ~6 s of CPU) is most of a run.
TINY_STEPS, TINY_WINDOWS = 1, 2
TINY = ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--batch-size", "2",
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
    if not (item.get_closest_marker("gpu") and torch.cuda.is_available()):
        return (yield)
    with _gpu_slot():
        return (yield)


# BENCH_TEST_PROGRESS=1 (bench doctor sets it): one line per test as it finishes, with its outcome and its time
# (setup, call and teardown: a module fixture's runs count for the test that started them), flushed at once, so the
# log of a check killed by its time limit still says what passed, what failed and what took the time.
_PROGRESS: dict[str, list] = {}


def pytest_configure(config):
    global _CONFIG
    _CONFIG = config


_CONFIG = None


def pytest_runtest_logreport(report):
    # the controller prints (under pytest-xdist it receives every worker's reports); workers print nothing. A worker
    # is told by its config, not by PYTEST_XDIST_WORKER, which a pytest started from inside a worker inherits.
    if os.environ.get("BENCH_TEST_PROGRESS") != "1" or hasattr(_CONFIG, "workerinput"):
        return
    seen = _PROGRESS.setdefault(report.nodeid, [0.0, "passed", ""])
    seen[0] += report.duration
    if report.failed:
        seen[1] = "failed" if report.when == "call" else "error"
    elif report.skipped and seen[1] == "passed":
        seen[1] = "skipped"
        seen[2] = str(report.longrepr[2]).removeprefix("Skipped: ") if isinstance(report.longrepr, tuple) else ""
    if report.when == "teardown":
        _, outcome, why = _PROGRESS.pop(report.nodeid)
        line = f"{PROGRESS_MARK} {report.nodeid} {outcome} {seen[0]:.1f} s" + (f" ({why})" if why else "")
        terminal = _CONFIG.pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
        if terminal is not None:
            terminal.ensure_newline()
            terminal.write_line(line, flush=True)
        else:
            print(line, flush=True)


PROGRESS_MARK = "[test done]"  # bench/commands/doctor.py reads these lines


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

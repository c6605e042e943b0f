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


# One GPU is never shared by two tests: under pytest-xdist (`make test`) a `gpu` test runs while holding this lock,
# which also keeps two test sessions on one machine apart. A module's tests stay on one worker (--dist loadscope),
# so its module fixtures (one run feeding many assertions) run once.
GPU_LOCK = Path(tempfile.gettempdir()) / f"torch-parallel-bench-gpu-{os.getuid()}.lock"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not (item.get_closest_marker("gpu") and torch.cuda.is_available()):
        return (yield)
    with open(GPU_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return (yield)


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

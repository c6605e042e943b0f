"""A suite that survives its backends: faults injected through BENCH_FAULT into real processes."""
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from bench.plan.sweep import parse_run, plan
from tests.backends.test_contract import CONTRACT_MODEL, assert_ok_record
from tests.conftest import REPO, TINY, bench_inproc, records


def _leftovers(results_dir):
    """Processes still running anything of this results directory (a rank, a launcher)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(results_dir) in part for part in p.info["cmdline"] or []):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
def test_rank_crash_fails_only_its_run(results_dir):
    """The crashed run first, then another: the sweep goes on. (A crash under mp.spawn is named in
    test_a_port_retry_does_not_hide_the_real_failure.) --max-gpus 2 on CPU: ddp at 2 ranks, single at 1."""
    proc = bench_inproc("run", "--backends", "ddp,single", "--max-gpus", 2, *TINY, "--results", results_dir,
                        env={"BENCH_FAULT": "ddp/crash@rank1:step3"})
    assert proc.returncode == 1  # something failed, and the sweep still finished
    recs = {r["backend"]: r for r in records(results_dir)}
    crashed = recs["ddp"]
    assert crashed["status"] == "failed" and crashed["throughput"] is None
    assert crashed["reason"].startswith("rank 1 exited with code 13; torchrun exit code 1 before rank 0 wrote the run's "
                                        "results")
    assert "injected crash on rank 1 at step 3" in crashed["reason"]
    assert recs["single"]["status"] == "ok"
    # every rank runs NCCL's process groups with error handling that lets an error reach it (tests/test_dead_peer.py)
    assert recs["single"]["env"]["nccl_async_error_handling"] == "2"
    assert [ln.split(" on ")[0] for ln in proc.stdout.splitlines() if ln.startswith("[")] == ["[1/2] ddp x2",
                                                                                            "[2/2] single x1"]
    assert not _leftovers(results_dir)


@pytest.mark.slow
def test_hang_is_killed_at_the_timeout_and_leaves_nothing_behind(results_dir):
    t0 = time.monotonic()
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--timeout-s", 15, "--results", results_dir,
                        env={"BENCH_FAULT": "hang@rank1"})
    assert proc.returncode == 1
    assert time.monotonic() - t0 < 120
    [rec] = records(results_dir)
    assert rec["status"] == "failed" and rec["reason"].startswith("timeout after 15 s")
    assert not _leftovers(results_dir)


@pytest.mark.slow
def test_out_of_memory_is_recorded_as_such(results_dir):
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", "1,2", *TINY, "--results", results_dir,
                        env={"BENCH_FAULT": "ddp/oom@rank1:step2"})
    assert proc.returncode == 1
    recs = {(r["backend"], r["world_size"]): r for r in records(results_dir)}
    assert recs[("ddp", 1)]["status"] == "ok"  # no rank 1 there
    oom = recs[("ddp", 2)]
    assert oom["status"] == "failed"
    assert oom["reason"].startswith("out of memory: batch 2 per device (4 global), cnn-tiny at 32px, fp32: "
                                    "CUDA out of memory. Tried to allocate 20.00 GiB")
    assert not _leftovers(results_dir)


def _wait_for(condition, what, seconds=240):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.1)


def _log_says(results_dir, run, text):
    """True once this sweep's log of ``run`` (e.g. ``-ddp-w1-``) holds ``text``: waiting on this run's own files, not
    on any bench.rank process of the machine (another test or another suite may be running beside this one)."""
    return any(text in p.read_text(errors="replace") for p in (results_dir / "logs").glob(f"*{run}*.log")) \
        if (results_dir / "logs").exists() else False


def _sweep(results_dir, backends, fault, sigint_ignored=False):
    """``bench run`` as a user starts it; ``sigint_ignored``: as a shell script's background job starts it (SIGINT
    ignored, which Python keeps: a `kill -INT` would be lost unless bench run installs its own handler)."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
    env["BENCH_FAULT"] = fault
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen([sys.executable, "-m", "bench", "run", "--backends", backends, "--gpus", "1",
                             *TINY, "--results", str(results_dir)], cwd=REPO, env=env, preexec_fn=ignore,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_finished_records_and_kills_the_current_run(results_dir, sig):
    sweep = _sweep(results_dir, "single,ddp", "ddp/hang@rank0", sigint_ignored=sig == signal.SIGINT)
    _wait_for(lambda: _log_says(results_dir, "-ddp-w1-", "injected hang on rank 0"), "ddp's hang")
    sweep.send_signal(sig)
    t0 = time.monotonic()
    out, err = sweep.communicate(timeout=300)  # a guard against a hang, sized for a busy machine: ~6 s calm
    assert sweep.returncode == 130 and time.monotonic() - t0 < 240, err
    assert "interrupted: 1 of 2 runs finished" in err
    [rec] = records(results_dir)
    assert rec["backend"] == "single" and rec["status"] == "ok"
    assert not _leftovers(results_dir)


@pytest.mark.slow
def test_interrupt_while_the_launcher_starts_its_ranks_leaves_nothing(results_dir):
    """Ctrl-C at the worst moment: torchrun is starting and its ranks (in sessions of their own) may not exist yet.
    Every process of the run still goes, found by the run's tag, and the sweep ends within seconds."""
    sweep = _sweep(results_dir, "ddp", "ddp/hang@rank0")
    _wait_for(lambda: any((results_dir / "logs").glob("*-ddp-w1-*.spec.json")) if (results_dir / "logs").exists()
              else False, "the ddp run's launch")
    time.sleep(0.5)  # torchrun is importing torch, or starting the rank
    sweep.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    out, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 130 and time.monotonic() - t0 < 240, err
    assert "interrupted: 0 of 1 runs finished" in err and not records(results_dir)
    time.sleep(1)  # a rank that was starting when it was killed is gone a moment later
    assert not _leftovers(results_dir)


WHOLE = [*TINY, "--model", CONTRACT_MODEL]


@pytest.mark.slow
def test_a_port_in_use_is_retried(results_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = bench_inproc("run", "--backends", "ddp_spawn", "--gpus", 2, *WHOLE, "--results", results_dir,
                            env={"BENCH_MASTER_PORT": str(port)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    log = (results_dir / "logs" / f"{rec['run_id']}.log").read_text()
    assert f"port {port} was in use; retrying" in log
    # the retried run is a whole one: DDP under torch.multiprocessing.spawn, identical replicas, every field the
    # contract asserts of its own runs (on its model)
    [cfg], _ = plan(parse_run(["--backends", "ddp_spawn", "--gpus", "2", *WHOLE]))
    assert_ok_record(rec, cfg)
    assert rec["launcher"] == "spawn" and rec["replicas_consistent"] is True


@pytest.mark.slow
def test_a_port_retry_does_not_hide_the_real_failure(results_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = bench_inproc("run", "--backends", "ddp_spawn", "--gpus", 2, *TINY, "--results", results_dir,
                            env={"BENCH_MASTER_PORT": str(busy.getsockname()[1]), "BENCH_FAULT": "crash@rank1:step2"})
    assert proc.returncode == 1
    [rec] = records(results_dir)
    assert rec["reason"].startswith("rank 1 terminated with exit code 13; spawn exit code 1")
    assert "injected crash on rank 1 at step 2" in rec["reason"]
    assert "address already in use" not in rec["reason"].lower()


def test_out_of_memory_is_found_under_a_long_tail_of_collateral_errors():
    from bench.core.config import RunConfig
    from bench.core.markers import OOM_MARKER
    from bench.launch.diagnose import failure_reason

    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=8, device_type="cuda", model="resnet50",
                    image_size=224, batch_size=256, warmup=1, steps=1, windows=1)
    output = (f"{OOM_MARKER} CUDA out of memory. Tried to allocate 2.00 GiB\n"
              + "[rank3]: NCCL watchdog: collective timed out\n" * 2000)
    reason = failure_reason(cfg, output, 1, False, 100.0, "run.log")
    assert reason == ("out of memory: batch 256 per device (2048 global), resnet50 at 224px, fp32: "
                      "CUDA out of memory. Tried to allocate 2.00 GiB")
    # horovodrun tags every line with its rank: a Horovod OOM was reported as a plain crash (exit code 3), so
    # --find-max-batch stopped at its first probe instead of searching down
    tagged = (f"[1]<stderr>:Traceback (most recent call last):\n"
              f"[0]<stderr>:{OOM_MARKER} DefaultCPUAllocator: can't allocate\n")
    assert failure_reason(cfg, tagged, 1, False, 100.0, "run.log").endswith("fp32: DefaultCPUAllocator: can't allocate")


def test_an_allocation_failure_under_a_heap_budget_is_out_of_memory(monkeypatch):
    """--memory-limit-gib: whichever library reports the failed allocation (oneDNN says only that it could not create
    or execute a primitive), it is the budget's doing; without a budget such an error stays a failure."""
    from bench.rank import memory

    unrelated = RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")
    monkeypatch.setattr(memory, "_MEMORY_LIMIT", None)
    assert not memory.is_oom(RuntimeError("could not create a primitive"))
    assert memory.is_oom(torch_oom()) and memory.is_oom(MemoryError())
    monkeypatch.setattr(memory, "_MEMORY_LIMIT", 2 * 2 ** 30)
    monkeypatch.setattr(memory, "_data_bytes", lambda: 2 ** 30)  # half the budget in use
    for message in ("could not create a primitive", "could not execute a primitive", "std::bad_alloc",
                    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes",
                    "[enforce fail at alloc_cpu.cpp:117] err == 0. Cannot allocate memory"):
        assert memory.is_oom(RuntimeError(message)), message
    assert not memory.is_oom(unrelated)
    monkeypatch.setattr(memory, "_data_bytes", lambda: int(1.95 * 2 ** 30))  # the heap is at the budget
    assert memory.is_oom(unrelated)


def torch_oom():
    import torch

    return torch.OutOfMemoryError("CUDA out of memory")


def test_ranks_that_outlive_their_launcher_in_a_session_of_their_own_are_killed(tmp_path):
    """torchrun and horovodrun start ranks in sessions of their own: a process-group kill misses them, and once the
    launcher has exited they are reparented to init. The run's tag in their environment still finds them."""
    from bench.core.markers import RUN_TAG
    from bench.launch import tree

    tag = f"test-orphan-{os.getpid()}-{time.monotonic_ns()}"
    launcher = ("import subprocess, sys\n"
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n")
    rc, timed_out = tree.run_group([sys.executable, "-c", launcher], {**os.environ, RUN_TAG: tag},
                                   tmp_path / "run.log", timeout=60)
    assert (rc, timed_out) == (0, False)
    deadline = time.monotonic() + 10
    left = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(RUN_TAG) == tag]
    while left and time.monotonic() < deadline:
        left = [p for p in left if tree._alive(p)]
        time.sleep(0.2)
    assert not left, f"left running: {left}"

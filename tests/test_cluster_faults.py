"""Faults at cluster scale (docs/measuring.md: When runs fail): a node that dies or freezes mid-window is named within
30 s, a harness killed with SIGKILL takes every process of its run with it on every launcher, a full disk leaves no
partial result file and says so in one line, and two sweeps writing into one results directory lose nothing."""
import errno
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from backends import horovod as hvd_backend
from bench.core import results
from tests.conftest import REPO, TINY, bench_inproc, records
from tests.test_faults import _leftovers
from tests.test_multinode import free_port

# A run long enough to be killed in its windows: 2 steps a window, step 6 is window 2 (2 warm-up steps, 1 settle).
ENDLESS = [*TINY[:TINY.index("--steps")], "--steps", "2", "--windows", "1000"]


def _bench_popen(*args, env=None, results_dir=None):
    full = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
    full.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "bench", "run", *map(str, args)], cwd=REPO, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _node(rank, port, results_dir, fault=None):
    return _bench_popen("--nnodes", 2, "--node-rank", rank, "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--rdzv-timeout-s", 120, "--gpus", 1, "--backends", "ddp", "--timeout-s", 400, *ENDLESS,
                        "--results", results_dir, env={"BENCH_FAULT": fault} if fault else None)


def _listening(port, proc, limit=120):
    """Wait until the first node's torchrun agent hosts the rendezvous store, so the second one joins it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}: {proc.communicate()[0] if proc.poll() is not None else ''}")


def _fault_time(results_dir) -> float:
    [log] = (Path(results_dir) / "logs").glob("*.log")
    return float(re.search(r"BENCH_FAULT: injected node-\w+ on rank \d+ at step 6 \(at ([\d.]+)\)", log.read_text())[1])


def _kill_all(results_dir):
    for p in _leftovers(results_dir):
        try:
            p.kill()  # also a stopped (frozen) process
        except psutil.Error:
            pass


# Every case here that waits for a silent heartbeat (15 s: bench/rank/lifeline.py SILENT_S) runs at once, in one
# module fixture, and their tests read what each left: the three lost-node cases and the NCCL watchdog's (its
# survivor aborted as NCCL's watchdog would; tests/test_dead_peer.py has the rest of that), which took 34 s of one
# worker's wall time waiting on its own. name: (the victim's node rank, its fault, the survivor's fault)
LOST_NODE_CASES = {
    "dies": (1, "node-dies@rank*:step6", None),
    "freezes": (1, "node-freezes@rank*:step6", None),
    "store-host-dies": (0, "node-dies@rank*:step6", None),
    "watchdog-abort": (1, "node-dies@rank*:step6", "watchdog-abort@rank*"),
}


def _named(p: psutil.Process) -> tuple:
    """(pid, name) of a process left running, or (pid, "exited") when it ended while being looked at."""
    try:
        return p.pid, p.name()
    except psutil.Error:
        return p.pid, "exited"


@pytest.fixture(scope="module")
def lost_nodes(tmp_path_factory):
    """Each case's two nodes started (node 0 first: its agent hosts the store), then each survivor waited for in turn:
    {name: {"dir", "port" (the store's), "survivor" (its node rank), "returncode", "output", "ended" (time.time() when
    it ended), "left" (what of its run was still running then)}}. Everything of every case is killed before the tests
    read it."""
    tmp = tmp_path_factory.mktemp("lost")
    cases = {}  # name -> (the store's port, the survivor's node rank, {node rank: its bench run})
    try:
        for name, (victim, fault, survivor_fault) in LOST_NODE_CASES.items():
            port, d = free_port(), tmp / name
            faults = {victim: fault, 1 - victim: survivor_fault}
            cases[name] = (port, 1 - victim, {0: _node(0, port, d / "node0", faults[0])})  # killed below if need be
            _listening(port, cases[name][2][0])  # node 0's agent hosts the store
            cases[name][2][1] = _node(1, port, d / "node1", faults[1])
        ended = {}
        for name, (port, survivor, nodes) in cases.items():
            out, _ = nodes[survivor].communicate(timeout=300)
            ended[name] = {"dir": tmp / name, "port": port, "survivor": survivor,
                           "returncode": nodes[survivor].returncode, "output": out, "ended": time.time(),
                           "left": [_named(p) for p in _leftovers(tmp / name / f"node{survivor}")]}
        return ended
    finally:
        for name, (_, _, nodes) in cases.items():
            _kill_all(tmp / name)
            for p in nodes.values():
                p.kill()
                p.communicate()


@pytest.mark.slow
def test_a_lost_node_is_named_within_30_s_with_its_phase_and_nothing_is_left(lost_nodes):
    """The issue's scenario, three ways at once: node 1 is killed (SIGKILL: its connections are reset), node 1
    freezes (SIGSTOP: nothing is reset, only the heartbeat notices), and node 0, which hosts the rendezvous store
    (it started first), is killed: node 1 then writes the record, which node 0 always writes otherwise. Each time the
    survivor's record names what was lost within 30 s of the fault, and the survivor leaves nothing running.
    --timeout 400: the run's own timeout is not what ends it."""
    for name in ("dies", "freezes", "store-host-dies"):
        case = lost_nodes[name]
        d, survivor = case["dir"], case["survivor"]
        assert case["returncode"] == 1, case["output"]
        [rec] = records(d / f"node{survivor}")
        assert rec["status"] == "failed", rec
        fault_at = _fault_time(d / f"node{1 - survivor}")
        assert case["ended"] - fault_at < 60, (name, case["ended"] - fault_at)  # 30 s to notice, then the teardown
        lost = rec["lost_node"]
        if name == "store-host-dies":
            assert re.match(rf"lost the (rendezvous|c10d) store at 127\.0\.0\.1:{case['port']}\b",
                            rec["reason"]), rec["reason"]
            assert "store" in lost
        else:
            assert re.search(r"^lost node 1 \(host \S+, rank \d\) during window 2 of 1000: no heartbeat for 1\d\.\d s, "
                             r"noticed by node 0", rec["reason"]), rec["reason"]
            assert (lost["node"], lost["phase"], lost["detected_by_node"]) == (1, "window 2 of 1000", 0)
            assert lost["host"] == socket.gethostname() and len(lost["ranks"]) == 1
            assert lost["detected_at"] - fault_at < 30, (name, lost["detected_at"] - fault_at)
        assert not case["left"], (name, case["left"])


@pytest.mark.slow
def test_a_rank_that_nccl_s_watchdog_would_abort_still_names_the_lost_node(lost_nodes):
    """Two nodes of one rank (the lost-node cases' set-up, beside them): node 1 dies at step 6; node 0's rank, whose
    collective then fails, is taken down with SIGABRT from a thread of its own within milliseconds, long before
    its heartbeat watch could call node 1 silent (15 s). Its record still names node 1, with the phase it died in.
    (tests/test_dead_peer.py: why, and the abort handler on its own.)"""
    case = lost_nodes["watchdog-abort"]
    d = case["dir"]
    assert case["returncode"] == 1, case["output"]
    [rec] = records(d / "node0")
    assert rec["status"] == "failed" and re.match(
        r"lost node 1 \(host \S+, rank 1\) during window 2 of 1000: no heartbeat for 1\d\.\d s, noticed by node 0",
        rec["reason"]), rec["reason"]
    assert (rec["lost_node"]["node"], rec["lost_node"]["phase"]) == (1, "window 2 of 1000")
    assert rec["lost_node"]["detected_at"] - _fault_time(d / "node1") < 30
    log = next((d / "node0" / "logs").glob("*.log")).read_text()  # the abort did happen, and waited
    assert "injected watchdog-abort on rank 0: a step failed, SIGABRT from a thread" in log, log[-3000:]
    assert "got SIGABRT; waiting up to 20 s for a verdict on the other nodes first" in log


def _watching(p: psutil.Process) -> bool:
    """``p`` watches its harness: it holds the pidfd that bench/rank/lifeline.py watch_harness opens."""
    try:
        fds = os.listdir(f"/proc/{p.pid}/fd")
        return any(os.readlink(f"/proc/{p.pid}/fd/{fd}") == "anon_inode:[pidfd]" for fd in fds)
    except OSError:
        return False


def _members(harness_pid: int) -> list[psutil.Process]:
    """Every process started for a run by this harness: they carry its pid in BENCH_HARNESS."""
    found = []
    for p in psutil.process_iter():
        try:
            if (p.environ().get("BENCH_HARNESS") or "").startswith(f"{harness_pid}:"):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_a_harness_killed_with_sigkill_takes_every_process_of_its_run_with_it(tmp_path):
    """bench run killed with SIGKILL mid-run (an OOM killer, a CI runner's hard cancel), on every launcher at once:
    torchrun (its agent and 2 ranks), torch.multiprocessing.spawn (a parent and 2 ranks), in process (1 rank) and
    horovodrun (when built). Nothing of the run is left a few seconds later.

    Mid-run: each rank's harness watch holds its pidfd. A rank killed before that (still importing torch: a spawned
    rank imports it unpickling torch.multiprocessing.spawn's _wrap, before any of the suite's code) exits when its
    watch starts and finds the harness gone; that took over 20 s once, 4 runs importing at once on a slow hour."""
    # launcher: (backend, ranks, processes of the run, of them watching the harness: the ranks, and spawn's parent)
    cases = {"torchrun": ("ddp", 2, 3, 2), "spawn": ("ddp_spawn", 2, 3, 3), "inproc": ("single", 1, 1, 1)}
    if hvd_backend.problem() is None:
        cases["horovodrun"] = ("horovod", 2, 3, 2)
    elif os.environ.get("BENCH_REQUIRE_HOROVOD") == "1":
        pytest.fail(f"BENCH_REQUIRE_HOROVOD=1 but {hvd_backend.problem()}")
    procs = {name: _bench_popen("--backends", b, "--gpus", n, *ENDLESS, "--results", tmp_path / name)
             for name, (b, n, *_) in cases.items()}
    try:
        pending, deadline = dict(procs), time.monotonic() + 240
        while pending and time.monotonic() < deadline:
            for name, proc in list(pending.items()):
                assert proc.poll() is None, proc.communicate()[0]
                members = _members(proc.pid)
                if len(members) >= cases[name][2] and sum(map(_watching, members)) >= cases[name][3]:
                    time.sleep(2)
                    proc.kill()
                    proc.wait()
                    killed = time.monotonic()
                    while _members(proc.pid) and time.monotonic() - killed < 20:
                        time.sleep(0.2)
                    left = [(p.pid, p.name()) for p in _members(proc.pid)]
                    assert not left, f"{name}: still running {time.monotonic() - killed:.0f} s after SIGKILL: {left}"
                    del pending[name]
            time.sleep(0.5)
        assert not pending, f"never started: {list(pending)}"
    finally:
        for name, proc in procs.items():
            proc.kill()
            proc.communicate()
            for p in _members(proc.pid):
                p.kill()


# -- a full disk ---------------------------------------------------------------------------------------------------

def test_a_failed_write_leaves_no_file_and_names_the_one_it_was_for(tmp_path, monkeypatch):
    """The write fails half-way (the disk filled up): no record, no temporary file, and the error names the record."""
    class HalfFile:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_fdopen = os.fdopen
    monkeypatch.setattr(results.os, "fdopen", lambda fd, *a, **k: HalfFile(real_fdopen(fd, *a, **k)))
    rec = results.skeleton({"backend": "single", "launcher": "inproc", "world_size": 1, "device_type": "cpu",
                            "model": "resnet18", "image_size": 32, "precision": "fp32", "batch_size": 2, "warmup": 2,
                            "steps": 1, "windows": 2}, "r1", {})
    rec["status"] = "ok"
    with pytest.raises(OSError) as e:
        results.save(rec, tmp_path)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "r1.json")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (a real full disk: ENOSPC from the kernel). Needs root, as CI's machine has."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); the in-process ENOSPC test still runs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, free_kib: int):
    for f in disk.iterdir():
        f.unlink() if f.is_file() else subprocess.run(["rm", "-rf", str(f)], check=True)
    stat = os.statvfs(disk)
    fill = stat.f_bavail * stat.f_frsize - free_kib * 1024
    (disk / "filler").write_bytes(b"\0" * fill)


@pytest.mark.slow
def test_a_full_disk_stops_with_one_line_and_leaves_no_partial_file(tiny_disk, tmp_path):
    """A run on a disk with 0 and then 12 KiB free (tmpfs pages are 4 KiB): the log fails, then the record.
    Whichever fails: one line naming that file, exit 1, no temporary or half-written JSON, nothing left
    running. Then a baseline written to the full disk: the same."""
    for free, fails in ((0, "logs/"), (12, "")):  # 12 KiB: the log and the spec fit, the record does not
        _fill(tiny_disk, free)
        raw = tiny_disk / "raw"
        proc = bench_inproc("run", "--backends", "single", *TINY, "--results", raw)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"bench: error: cannot write {raw}/{fails}"), last
        assert re.fullmatch(rf"bench: error: cannot write {re.escape(str(raw))}/\S+: No space left on device \(ENOSPC\); "
                            r"no partial file was left; .*--resume.*", last), (free, proc.stderr)
        for f in raw.rglob("*"):
            assert not f.name.startswith(".tmp-"), f
            if f.suffix == ".json":
                json.loads(f.read_text())  # whole, or not there at all
        assert not _leftovers(raw)
    source = tmp_path / "records"
    rec = results.skeleton({"backend": "single", "launcher": "inproc", "world_size": 1, "device_type": "cpu",
                            "model": "resnet18", "image_size": 32, "precision": "fp32", "batch_size": 2, "warmup": 2,
                            "steps": 1, "windows": 2}, "r1", {"device_names": ["cpu"]})
    rec.update(status="ok", throughput=10.0, window_seconds=[0.2, 0.2])
    results.save(rec, source)
    _fill(tiny_disk, 0)
    proc = subprocess.run([sys.executable, "-m", "bench", "baseline", "save", "--from", source, "--name", "cpu-x1",
                           "--out-dir", tiny_disk / "baselines"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"bench: error: cannot write {tiny_disk / 'baselines' / 'cpu-x1.json'}: No space left on device (ENOSPC)")
    assert [f.name for f in (tiny_disk / "baselines").iterdir()] == []


@pytest.mark.slow
def test_two_sweeps_writing_into_one_results_directory_keep_every_record_apart(tmp_path):
    """Two terminals (or CI jobs) run bench run into the same directory at the same time: every run keeps its own
    record and log, none is lost or mixed with another, and the report reads them all."""
    raw = tmp_path / "raw"
    # the two sweeps differ in their batch (2 and 3 per device), so a record says which sweep wrote it
    sweeps = [_bench_popen("--backends", "single", "--repeat", 2, *TINY, "--windows", 1, "--batch-size", batch,
                           "--results", raw) for batch in (2, 3)]
    for proc in sweeps:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    recs = records(raw)
    assert sorted((r["batch_per_device"], r["repeat_index"]) for r in recs) == [(2, 1), (2, 2), (3, 1), (3, 2)]
    for r in recs:
        assert r["status"] == "ok" and (raw / f"{r['run_id']}.json").exists()
        log = (raw / "logs" / f"{r['run_id']}.log").read_text()
        assert log.count("$ ") == 1 and r["run_id"] in log  # one run's log, its own
    assert len({r["run_id"] for r in recs}) == 4
    assert not [f for f in raw.rglob(".tmp-*")]

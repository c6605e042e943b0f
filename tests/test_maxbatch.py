"""bench run --find-max-batch: the bounded search for the largest per-device batch that fits
(bench/plan/maxbatch.py) against fake probes, its bad input, and one real search on CPU under a heap budget.
Out-of-memory errors of every kind are in tests/test_oom_kinds.py."""
import json

import pytest

from bench.plan import maxbatch
from tests.conftest import TINY, bench_inproc, cli_error

pytestmark = pytest.mark.mutation


@pytest.mark.parametrize("args,message", [
    (["--find-max-batch", "--max-batch", "0"], "bench: error: --max-batch must be a positive integer, got 0"),
    (["--find-max-batch", "--memory-limit-gib", "-1"], "bench: error: --memory-limit-gib -1: a positive number of "
                                                       "GiB, for CPU runs only"),
])
def test_search_bad_input(results_dir, args, message, capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, *args, "--results", results_dir)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(message), err


class _Cfg:
    backend, world_size, precision, model, image_size, device_type, options = "ddp", 2, "fp32", "m", 8, "cpu", {}

    def __init__(self, batch):
        self.batch_size = batch


def _probe(limit, seen, error_at=None):
    def probe(batch):
        seen.append(batch)
        if batch == error_at:
            return {"status": "failed", "reason": "rank 1 exited with code 13", "run_id": str(batch)}
        ok = batch <= limit
        return {"status": "ok" if ok else "failed", "run_id": str(batch),
                "reason": None if ok else f"out of memory: batch {batch} per device"}
    return probe


@pytest.mark.parametrize("start,limit,cap,expected", [
    (8, 100, 4096, 96),     # double 8..128, then bisect to within 1/8: 96 fits, 112 does not
    (8, 1000, 64, 64),      # capped: nothing ran out of memory below the cap
    (64, 20, 4096, 20),     # the first probe does not fit: halve to 16, then bisect up
    (4, 0, 4096, None),     # not even batch 1 fits
])
def test_max_batch_search(start, limit, cap, expected):
    seen = []
    row = maxbatch.search(_Cfg(start), _probe(limit, seen), cap)
    assert row["max_batch"] == expected and row["error"] is None
    assert row["capped"] == (expected == cap)
    assert len(seen) == len(set(seen)) <= 12  # bounded, and no batch probed twice
    if expected and not row["capped"]:
        too_big = min(b for b in seen if b > limit)
        assert too_big - expected <= max(1, expected // maxbatch.RESOLUTION)


def test_max_batch_search_stops_on_a_failure_that_is_not_memory():
    row = maxbatch.search(_Cfg(8), _probe(1000, [], error_at=32), 4096)
    assert row["max_batch"] is None and row["error"] == "rank 1 exited with code 13"


@pytest.mark.slow
def test_find_max_batch_on_cpu_with_a_heap_budget(tmp_path):
    proc = bench_inproc("run", "--backends", "single", "--gpus", 1, "--device", "cpu", "--model", "resnet18",
                        "--image-size", 64, "--batch-size", 32, "--find-max-batch", "--memory-limit-gib", 0.5,
                        "--max-batch", 512, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [summary] = (tmp_path / "maxbatch").glob("summary-*.json")
    [row] = json.loads(summary.read_text())["rows"]
    results = {p["batch"]: p["result"] for p in row["probes"]}
    assert "out of memory" in results.values() and not row["capped"]
    assert results[row["max_batch"]] == "fits" and 1 <= row["max_batch"] < 512
    assert all(r == "out of memory" for b, r in results.items() if b > row["max_batch"])
    assert "max batch per device:" in proc.stdout


def test_a_segfault_under_the_heap_budget_reads_as_out_of_memory_and_only_there(tmp_path):
    """Under --memory-limit-gib malloc returns NULL at the budget, and a library that does not check it dies of
    SIGSEGV (seen at batch 128 beside a busy test worker): the search reads it as out of memory, saying 'probably'.
    Without the budget a segfault is a crash like any other."""
    import signal

    from bench.plan import probe as _probe
    from bench.core.config import RunConfig
    from bench.launch import diagnose

    cfg = RunConfig(backend="single", launcher="inproc", world_size=1, device_type="cpu", model="resnet18",
                    image_size=64, batch_size=128, warmup=2, steps=1, windows=1).validate()
    output = "$ python -m bench.rank --spec s.json\n"
    budget = diagnose.failure_reason(cfg, output, -signal.SIGSEGV, False, 60, tmp_path / "x.log", heap_budget=True)
    assert budget.startswith("out of memory: batch 128 per device") and "probably: killed by SIGSEGV" in budget
    assert _probe.outcome({"status": "failed", "reason": budget}) == "out of memory"
    plain = diagnose.failure_reason(cfg, output, -signal.SIGSEGV, False, 60, tmp_path / "x.log")
    assert plain.startswith("inproc killed by SIGSEGV") and _probe.outcome({"status": "failed", "reason": plain}) == "error"

"""bench verify and the distributed evaluation: a backend of every launcher against a single-process reference (the
list derived from the registry), injected faults caught by name, every evaluation sample counted exactly once."""
import json
from pathlib import Path

import pytest

import backends
from bench.rank.evaluate import exact_shard
from tests.conftest import bench_inproc, cli_error

# Small and quick: what matters is that the arithmetic is compared, not how long it trains.
QUICK = ["--device", "cpu", "--model", "cnn-tiny", "--image-size", "32", "--batch-size", "2", "--steps", "6",
         "--eval-samples", "37"]  # 37: not divisible by 2, so DistributedSampler pads


def _summary(results):
    [path] = sorted((results / "verify").glob("summary-*.json"))
    return {(r["backend"], r["world_size"]): r for r in json.loads(path.read_text())["rows"]}


def one_backend_per_launcher() -> list[str]:
    """What bench verify compares with its reference here, from the registry: the first backend of every launcher that
    starts ranks (torchrun, mp.spawn, horovodrun when Horovod is built) whose 2-rank verify has a reference here, as
    verify's own planner says. Verify's path through each launcher is what this file checks; every backend's own
    2-rank training is the contract's (tests/backends/test_contract.py)."""
    from bench.cli import build_parser
    from bench.commands import verify

    _, entries = verify.plan(build_parser().parse_args(["verify", "--backends", "all", "--gpus", "2", *QUICK]))
    first = {}
    for e in entries:
        launcher = backends.REGISTRY[e.backend]["launcher"]
        if e.world_size == 2 and e.skipped is None and launcher != "inproc":
            first.setdefault(launcher, e.backend)
    return list(first.values())


@pytest.mark.slow
def test_distributed_backends_match_the_reference_bit_for_bit():
    """``python -m bench verify`` of one backend per launcher, as a user runs it: the run that tests/test_install.py's
    TORCH=system environment makes (the same torch as this interpreter's; a verify launched there starts every launcher,
    so one run feeds both tests, and a broken install fails both, saying so)."""
    from tests.test_install import torch_system_verify

    chosen = one_backend_per_launcher()
    assert {"torchrun", "spawn"} <= {backends.REGISTRY[name]["launcher"] for name in chosen}, chosen
    got = torch_system_verify()
    code, stdout, stderr = got["verify"]
    results = Path(got["results"])
    assert code == 0, stdout + stderr
    rows = _summary(results)
    assert set(rows) == {(name, 2) for name in chosen}
    for row in rows.values():
        assert row["verdict"] == "pass", row
        # 2 replicas: a + b = b + a, so the twin is bit-identical and so is every correct backend
        assert row["rounding_noise"] == 0.0 and row["param_distance"] == 0.0 and row["max_abs_param_diff"] == 0.0
        assert row["max_loss_deviation"] < 1e-5  # the loss as reported (a mean of the ranks' floats), not trained
        assert row["eval_samples"] == 37  # every sample once, never the padded 38
        assert row["reference"] == "single @ batch 4 as 2 micro-batches of 2 (BatchNorm per replica's share)"
    assert "training equivalence" in stdout and "not the same training as single at the global batch" in stdout
    assert not list((results / "verify" / "params").glob("*.npz"))  # parameters are deleted after comparing


@pytest.mark.slow
def test_injected_faults_fail_verify_naming_the_backend_and_the_deviation(tmp_path):
    by_launcher = {backends.REGISTRY[name]["launcher"]: name for name in one_backend_per_launcher()}
    a, b = by_launcher["torchrun"], by_launcher["spawn"]  # ddp and ddp_spawn
    proc = bench_inproc("verify", "--backends", f"{a},{b}", "--gpus", 2, *QUICK, "--results", tmp_path,
                        env={"BENCH_FAULT": f"{a}/grad-scale@rank1,{b}/wrong-shard@rank1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("verify: FAIL")]
    assert len(lines) == 2, proc.stderr
    # doubled gradients on rank 1: identical replicas, wrong update; the loss moves from step 2 on
    assert lines[0].startswith(f"verify: FAIL {a} x2 fp32: loss deviates from the reference by ")
    assert " at step 2 (allowed 1e-05); final parameters are " in lines[0]
    # rank 1 reads rank 0's share: the very first loss is already another batch's
    assert lines[1].startswith(f"verify: FAIL {b} x2 fp32: loss deviates from the reference by ")
    assert " at step 1 (allowed 1e-05)" in lines[1]
    rows = _summary(tmp_path)
    assert rows[(a, 2)]["param_distance"] > 0.1 and rows[(b, 2)]["param_distance"] > 0.1


def test_verify_bad_input_is_one_line(tmp_path, capsys):
    for args, message in ((["--backends", "nope"], "bench: error: --backends 'nope': unknown backend nope; choose from "),
                          (["--steps", "0"], "bench: error: --steps must be a positive integer, got 0")):
        code, err = cli_error(capsys, "verify", *args, "--device", "cpu", "--results", tmp_path)
        assert code == 2 and err.startswith(message), err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("size", [1, 5, 37, 64, 250])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_exact_shards_count_every_sample_once(size, world):
    shards = [exact_shard(size, world, r) for r in range(world)]
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(size))  # no padding repeats, nothing lost
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


# --eval's exact counts are asserted on real runs of every backend (37 samples at its world size) by the contract,
# tests/backends/test_contract.py.

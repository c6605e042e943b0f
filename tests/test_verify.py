"""bench verify and the distributed evaluation: every backend against a single-process reference, injected
faults caught by name, every evaluation sample counted exactly once."""
import json

import pytest

from bench.rank.evaluate import exact_shard
from tests.conftest import bench, bench_inproc, cli_error

# Small and quick: what matters is that the arithmetic is compared, not how long it trains.
QUICK = ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--steps", "6",
         "--eval-samples", "37"]  # 37: not divisible by 2, so DistributedSampler pads


def _summary(results):
    [path] = sorted((results / "verify").glob("summary-*.json"))
    return {(r["backend"], r["world_size"]): r for r in json.loads(path.read_text())["rows"]}


@pytest.mark.slow
@pytest.mark.horovod
def test_distributed_backends_match_the_reference_bit_for_bit(tmp_path):
    from tests.test_amp_horovod import _horovod_or_skip

    _horovod_or_skip()
    proc = bench("verify", "--backends", "ddp,ddp_spawn,horovod", "--gpus", 2, *QUICK, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _summary(tmp_path)
    assert set(rows) == {("ddp", 2), ("ddp_spawn", 2), ("horovod", 2)}
    for row in rows.values():
        assert row["verdict"] == "pass", row
        # 2 replicas: a + b = b + a, so the twin is bit-identical and so is every correct backend
        assert row["rounding_noise"] == 0.0 and row["param_distance"] == 0.0 and row["max_abs_param_diff"] == 0.0
        assert row["max_loss_deviation"] < 1e-5  # the loss as reported (a mean of the ranks' floats), not trained
        assert row["eval_samples"] == 37  # every sample once, never the padded 38
        assert row["reference"] == "single @ batch 4 as 2 micro-batches of 2 (BatchNorm per replica's share)"
    assert "training equivalence" in proc.stdout and "not the same training as single at the global batch" in proc.stdout
    assert not list((tmp_path / "verify" / "params").glob("*.npz"))  # parameters are deleted after comparing


@pytest.mark.slow
def test_injected_faults_fail_verify_naming_the_backend_and_the_deviation(tmp_path):
    proc = bench_inproc("verify", "--backends", "ddp,ddp_spawn", "--gpus", 2, *QUICK, "--results", tmp_path,
                        env={"BENCH_FAULT": "ddp/grad-scale@rank1,ddp_spawn/wrong-shard@rank1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("verify: FAIL")]
    assert len(lines) == 2, proc.stderr
    # doubled gradients on rank 1: identical replicas, wrong update; the loss moves from step 2 on
    assert lines[0].startswith("verify: FAIL ddp x2 fp32: loss deviates from the reference by ")
    assert " at step 2 (allowed 1e-05); final parameters are " in lines[0]
    # rank 1 reads rank 0's share: the very first loss is already another batch's
    assert lines[1].startswith("verify: FAIL ddp_spawn x2 fp32: loss deviates from the reference by ")
    assert " at step 1 (allowed 1e-05)" in lines[1]
    rows = _summary(tmp_path)
    assert rows[("ddp", 2)]["param_distance"] > 0.1 and rows[("ddp_spawn", 2)]["param_distance"] > 0.1


def test_verify_bad_input_is_one_line(tmp_path, capsys):
    for args, message in ((["--backends", "nope"], "bench: error: unknown backend nope; choose from "),
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


# --eval's exact counts are asserted on real runs in tests/test_backends.py (every sharded backend at 2 ranks, 37
# samples) and tests/test_harness.py (in process).


@pytest.mark.slow
def test_deepspeed_half_precision_trains_evaluates_and_verify_says_why_it_has_no_reference(results_dir, capsys):
    """DeepSpeed 0.19 casts parameters to bf16 but keeps BatchNorm's running statistics fp32, which BatchNorm
    refuses: every fp16/bf16 run failed until the backend gave the statistics their layer's dtype; evaluation
    feeds the model its input dtype."""
    from bench.cli import build_parser
    from bench.commands import verify
    from tests.conftest import TINY, records

    proc = bench_inproc("run", "--backends", "ds_zero3", "--gpus", 2, *TINY, "--precision", "bf16", "--eval",
                        "--eval-samples", 9, "--ds-bucket-mb", 1, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True and rec["eval_samples"] == 9
    assert rec["backend_info"]["param_dtype"] == "bfloat16" and rec["backend_info"]["norm_buffers_cast"] == 40
    assert rec["options"] == {"ds_bucket_mb": 1.0} and rec["backend_info"]["bucket_elements"] == 2 ** 18
    args = build_parser().parse_args(["verify", "--backends", "ds_zero1,ds_zero3", "--gpus", "2", "--device", "cpu",
                                      "--precision", "bf16"])
    _, entries = verify.plan(args)
    assert [(e.backend, e.reference) for e in entries] == [("ds_zero1", None), ("ds_zero3", None)]
    assert entries[0].skipped == ("DeepSpeed's bf16 trains half-precision weights with fp32 master copies (its own "
                                  "mixed precision, not autocast), which no reference here reproduces; verify "
                                  "DeepSpeed at fp32")

"""The harness and the four PyTorch backends, run for real on CPU (gloo), launched as users launch them."""
import json
import statistics

import pytest

from bench.commands._plan import world_sizes
from bench.core import results
from bench.rank.record import build_record
from tests.conftest import TINY, TINY_STEPS, TINY_WINDOWS, bench, bench_inproc, cli_error, records


def _only_record(directory):
    recs = records(directory)
    assert len(recs) == 1, recs
    return recs[0]


def _assert_ok_record(rec, backend, launcher, world_size):
    assert rec["status"] == "ok", rec["reason"]
    assert rec["schema"] == results.SCHEMA
    assert (rec["backend"], rec["launcher"], rec["world_size"], rec["device_type"]) == (backend, launcher, world_size, "cpu")
    assert set(results.REQUIRED_KEYS) <= set(rec)
    assert len(rec["window_seconds"]) == TINY_WINDOWS and all(t > 0 for t in rec["window_seconds"])
    assert rec["batch_per_device"] == 2 and rec["global_batch"] == 2 * world_size
    assert (rec["warmup_steps"], rec["steps_per_window"], rec["model"], rec["image_size"]) == (
        2, TINY_STEPS, "resnet18", 32)
    assert rec["settle_steps"] == 1 and rec["cudnn_benchmark"] is None  # CPU: no cuDNN to switch
    assert (rec["repeat_index"], rec["repeats"]) == (1, 1)
    # host peaks are the timed windows' (after a reset), the warm-up's are kept beside them
    assert len(rec["warmup_host_peak_rss_bytes"]) == world_size
    assert all(0 < b for b in rec["host_peak_rss_bytes"] + rec["warmup_host_peak_rss_bytes"])
    assert rec["skipped_steps"] is None and rec["warmup_skipped_steps"] is None  # no GradScaler in fp32
    # FLOPs are counted for every record; MFU and energy are GPU figures, empty on CPU with the reason
    from backends.models.flops import flops_per_sample

    assert rec["flops_per_sample"] == pytest.approx(flops_per_sample("resnet18", 32))
    assert rec["mfu"] is None and rec["peak_tflops_source"] == "no GPU: MFU is for GPUs"
    assert rec["joules_per_image"] is None and rec["energy_reason"] == "no GPU"
    # the compute-only reference: measured in the same processes wherever there is a synchronisation to skip
    co = rec["compute_only"]
    if world_size > 1:
        assert co == {"measured": True, "reason": None, "keeps": None}
        assert len(rec["compute_only_window_seconds"]) == TINY_WINDOWS
        assert all(t > 0 for t in rec["compute_only_window_seconds"])
    else:
        assert co["measured"] is False and rec["compute_only_window_seconds"] is None
    info = rec["backend_info"]
    assert info["process_group"] == ("gloo" if launcher in ("torchrun", "spawn") else None)
    assert (info["autocast_dtype"], info["grad_scaler"], info["sync_batchnorm_layers"]) == (None, False, 0)
    assert rec["precision"] == "fp32" and rec["data"] == "synthetic"
    # throughput is global samples per second, the median over windows, inside its own interval
    per_window = [rec["global_batch"] * TINY_STEPS / t for t in rec["window_seconds"]]
    assert rec["throughput"] == pytest.approx(statistics.median(per_window))
    lo, hi = rec["throughput_ci95"]
    assert lo <= rec["throughput"] <= hi
    assert rec["per_device_throughput"] == pytest.approx(rec["throughput"] / world_size)
    assert rec["memory"] == [] and rec["memory_imbalance"] is None  # CPU: no device memory to measure
    assert len(rec["host_peak_rss_bytes"]) == world_size
    env = rec["env"]
    for key in ("torch", "cuda", "nccl", "cudnn", "gpu_names", "gpu_count", "driver", "cpu_count", "hostname",
                "python", "git_commit", "started_at"):
        assert key in env
    assert env["cpu_count"] >= 1 and env["torch"]


@pytest.mark.slow
def test_ddp_two_gloo_ranks_identical_replicas(results_dir):
    """As a user runs it (python -m bench). ddp_spawn's run is checked the same way in tests/test_faults.py
    (test_a_port_in_use_is_retried), which needs that run anyway."""
    proc = bench("run", "--backends", "ddp", "--gpus", 2, *TINY, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = _only_record(results_dir)
    _assert_ok_record(rec, "ddp", "torchrun", 2)
    assert rec["replicas_consistent"] is True
    assert rec["threads_per_rank"] >= 1


@pytest.mark.slow
def test_replica_check_fails_when_replicas_differ(results_dir):
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--results", results_dir,
                        env={"BENCH_FAULT": "diverge@rank1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the sweep fails, the record stays
    rec = _only_record(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is False
    assert "replicas DIFFER" in proc.stdout


@pytest.mark.slow
def test_single_and_dp_on_cpu_then_repeats_interleaved_and_resumed(results_dir):
    """single and dp in process (with --eval: the in-process evaluation), then --repeat 2 --resume on the same
    directory: the repetitions already there are not run again, the rest run interleaved."""
    run = ("run", "--backends", "single,dp", "--gpus", "1,2", *TINY, "--eval", "--eval-samples", 37,
           "--results", results_dir)
    proc = bench_inproc(*run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "single runs on 1 device only" in proc.stderr
    recs = {(r["backend"], r["world_size"]): r for r in records(results_dir)}
    assert set(recs) == {("single", 1), ("dp", 1), ("dp", 2)}
    _assert_ok_record(recs[("single", 1)], "single", "inproc", 1)
    _assert_ok_record(recs[("dp", 1)], "dp", "inproc", 1)
    assert recs[("single", 1)]["replicas_consistent"] is None  # one process: nothing to compare
    assert recs[("dp", 1)]["note"].startswith("nn.DataParallel on CPU calls the module directly")
    for rec in (recs[("single", 1)], recs[("dp", 1)]):  # every evaluation sample once
        assert rec["eval"] is True and rec["eval_samples"] == 37
        assert rec["eval_loss"] > 0 and 0 <= rec["eval_accuracy"] <= 1 and rec["eval_throughput"] > 0
    skipped = recs[("dp", 2)]
    assert skipped["status"] == "skipped" and skipped["throughput"] is None
    assert skipped["reason"].startswith("nn.DataParallel cannot parallelise on CPU")
    for line in ("single", "dp", "global img/s", "per-device img/s", "skipped"):
        assert line in proc.stdout

    again = bench_inproc(*run, "--repeat", 2, "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    # single and dp x1 have their first repetition; dp x2 was skipped (not ok), so it is planned again
    assert "resume: 2 of 6 runs already have an ok record" in again.stderr
    lines = [ln for ln in again.stdout.splitlines() if ln.startswith("[")]
    assert [ln.split(" on ")[0] for ln in lines] == ["[1/4] dp x2", "[2/4] single x1", "[3/4] dp x1", "[4/4] dp x2"]
    assert lines[0].endswith("(repeat 1/2) ...") and all(ln.endswith("(repeat 2/2) ...") for ln in lines[1:])
    ok = sorted((r["backend"], r["repeat_index"], r["repeats"]) for r in records(results_dir) if r["status"] == "ok")
    assert ok == [("dp", 1, 1), ("dp", 2, 2), ("single", 1, 1), ("single", 2, 2)]


@pytest.mark.slow
def test_list_names_every_backend_and_launcher():
    proc = bench("list", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    for name, launcher in [("single", "inproc"), ("dp", "inproc"), ("ddp", "torchrun"), ("ddp_spawn", "spawn")]:
        assert any(name in line and launcher in line for line in proc.stdout.splitlines()), (name, proc.stdout)
    assert "nn.DataParallel cannot parallelise on CPU" in proc.stdout
    assert any(ln.startswith("│ dp ") and "1 device only" in ln for ln in proc.stdout.splitlines())


def test_record_roundtrip_never_overwrites(tmp_path):
    cfg = {"backend": "ddp", "launcher": "torchrun", "world_size": 2, "device_type": "cpu", "model": "resnet18",
           "image_size": 32, "precision": "fp32", "batch_size": 4, "warmup": 1, "steps": 2, "windows": 3}
    rec = results.skeleton(cfg, "run-1", {"torch": "x"})
    rec.update(status="ok", window_seconds=[0.5, 0.4, 0.6], throughput=20.0, throughput_ci95=[16.0, 20.0])
    path = results.save(rec, tmp_path)
    assert path.name == "run-1.json" and json.loads(path.read_text()) == rec
    [loaded] = results.load(tmp_path)
    assert {k: v for k, v in loaded.items() if k != "_path"} == rec
    with pytest.raises(FileExistsError):
        results.save(rec, tmp_path)
    assert json.loads(path.read_text()) == rec
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.json"]  # no temporary file left behind


def test_load_skips_bad_files_with_one_warning_each(tmp_path):
    (tmp_path / "half.json").write_text('{"schema": 1, "status": "o')
    (tmp_path / "old.json").write_text('{"schema": 0}')
    warnings = []
    assert results.load(tmp_path, warn=warnings.append) == []
    assert len(warnings) == 2
    assert "half.json: not a readable JSON record" in warnings[0]
    assert "old.json: schema 0, this version reads schema 2" in warnings[1]


def test_window_is_the_slowest_rank_and_throughput_the_median():
    cfg_dict = {"backend": "ddp", "launcher": "torchrun", "world_size": 2, "device_type": "cpu", "model": "m",
                "image_size": 8, "batch_size": 4, "warmup": 0, "steps": 5, "windows": 3, "precision": "fp32"}
    from bench.core.config import RunConfig

    cfg = RunConfig.from_dict(cfg_dict)
    per_rank = [
        {"window_seconds": [1.0, 2.0, 1.0], "memory": [], "param_sha256": "a", "host_peak_rss_bytes": 1,
         "data_wait_seconds": None, "corrupt_images_skipped": None},
        {"window_seconds": [1.5, 1.0, 1.0], "memory": [], "param_sha256": "a", "host_peak_rss_bytes": 2,
         "data_wait_seconds": None, "corrupt_images_skipped": None},
    ]
    rec = build_record(cfg, {"run_id": "r", "env": {}, "threads_per_rank": 1}, per_rank, settle_steps=1)
    assert rec["window_seconds"] == [1.5, 2.0, 1.0]
    assert rec["throughput"] == pytest.approx(40 / 1.5)  # 8 samples x 5 steps over the median window
    assert rec["replicas_consistent"] is True
    per_rank[1]["param_sha256"] = "b"
    spec = {"run_id": "r", "env": {}, "threads_per_rank": 1}
    assert build_record(cfg, spec, per_rank, settle_steps=1)["replicas_consistent"] is False


def test_world_sizes_sweep_powers_of_two_and_the_top():
    assert world_sizes(None, "4", "cuda", 8) == [1, 2, 4]
    assert world_sizes(None, "6", "cuda", 8) == [1, 2, 4, 6]
    assert world_sizes(None, "all", "cuda", 8) == [1, 2, 4, 8]
    assert world_sizes("2,1", None, "cpu", 2) == [1, 2]


@pytest.mark.parametrize("args,message", [
    (["--backends", "nope"], "bench: error: unknown backend nope; choose from single, dp, ddp, ddp_spawn"),
    (["--model", "notamodel"], "bench: error: unknown model 'notamodel'; choose a torchvision classification model ("),
    (["--gpus", "64"], "bench: error: --gpus 64: this machine has "),
    (["--batch-size", "0"], "bench: error: batch-size must be a positive integer, got 0"),
    (["--steps", "-1"], "bench: error: steps must be a positive integer, got -1"),
    (["--windows", "0"], "bench: error: windows must be a positive integer, got 0"),
    (["--precision", "fp8"], "bench: error: unknown precision 'fp8'; choose from fp32, fp16, bf16"),
    (["--gpus", "one"], "bench: error: --gpus 'one': expected comma-separated positive integers such as 1,2,4"),
    (["--timeout", "-1"], "bench: error: timeout must be a positive number of seconds, got -1.0"),
    (["--backends", "single", "--gpus", "2"], "bench: error: nothing to run: single runs on 1 device only"),
    (["--batch-size", "big"], "bench: error: argument --batch-size: invalid int value: 'big' (see python -m bench run --help)"),
    (["--hvd-compression", "zip"], "bench: error: argument --hvd-compression: invalid choice: 'zip'"),
    (["--warmup", "1"], "bench: error: warmup 1 is too short to reach steady state; use at least 2 (step 1 pays "
                        "lazy initialisation and cuDNN's algorithm search, and DDP rebuilds its gradient buckets at "
                        "step 2)"),
    (["--repeat", "0"], "bench: error: --repeat must be a positive integer, got 0"),
    (["--cudnn-benchmark", "maybe"], "bench: error: argument --cudnn-benchmark: invalid choice: 'maybe' "
                                     "(choose from 'on', 'off')"),
])
def test_bad_input_is_one_clear_line(results_dir, args, message, capsys):
    # TINY comes first so that the bad value given afterwards wins
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, *args, "--results", results_dir)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), err
    assert not results_dir.exists() or records(results_dir) == []


def test_unwritable_results_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = bench_inproc("run", "--backends", "single", "--gpus", 1, *TINY, "--results", blocker / "raw")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"bench: error: results directory '{blocker / 'raw'}' is not writable")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("model", ["googlenet", "inception_v3"])
def test_models_with_auxiliary_heads_train_every_parameter(model):
    """DDP refuses parameters that get no gradient; the aux heads would be such parameters."""
    import torch

    from backends.base import build_model
    from bench.core.config import RunConfig

    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=1, device_type="cpu", model=model,
                    image_size=80, batch_size=2, warmup=0, steps=1, windows=1)
    net = build_model(cfg).train()
    out = net(torch.randn(2, 3, 80, 80))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 1000)
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_dp_on_cpu_runs_the_bare_module():
    """On CPU nn.DataParallel would grab any visible GPU; the record's note says the module runs as it is."""
    import torch

    import backends
    from bench.core.config import RunConfig

    cfg = RunConfig(backend="dp", launcher="inproc", world_size=1, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=0, steps=1, windows=1)
    dp = backends.create("dp")
    dp.setup(cfg)
    assert not isinstance(dp.model, torch.nn.DataParallel) and dp.devices() == [torch.device("cpu")]


def test_threads_per_rank_come_from_the_cores_this_job_may_use(monkeypatch):
    """A Slurm cpuset, a container's CPU list or taskset: os.cpu_count() is the machine's, the affinity mask is the
    job's; ranks x threads must fit the job's cores, or OpenMP's spinning threads oversubscribe them."""
    import os

    from bench import launch
    from bench.core import devices
    from bench.core.config import RunConfig

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6, 7})
    assert devices.usable_cpus() == 4
    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=2, windows=3)
    assert launch.threads_per_rank(cfg) == 2


def test_one_flag_name_per_idea_no_prefix_guessing_and_old_spellings_kept(capsys):
    """--gpus is the world sizes in every subcommand; a prefix is never taken for a longer flag (predict --gpus 4,8 was
    read as --gpus-per-node and failed with "invalid int value: '4,8'"); the old spellings still parse."""
    from bench.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["predict", "--gpus", "4,8"]).gpus == "4,8"
    assert parser.parse_args(["predict", "--world-sizes", "4,8"]).gpus == "4,8"
    assert parser.parse_args(["predict", "--gpus-per-node", "8", "--inter-node-gbps", "400"]).gpus_per_node == 8
    assert parser.parse_args(["loader", "--data-dir", "x", "--gpus", "2"]).ranks == 2
    assert parser.parse_args(["loader", "--data-dir", "x", "--ranks", "2"]).ranks == 2
    code, err = cli_error(capsys, "run", "--back", "ddp", "--device", "cpu")
    assert code == 2 and err == "bench: error: unrecognized arguments: --back ddp (see python -m bench --help)\n"

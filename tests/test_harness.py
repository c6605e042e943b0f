"""The harness around the runs, for real on CPU: a replica that differs fails the sweep, repeats run interleaved and
--resume runs only what has no ok record, bench list, bench run's bad input in one line, the world sizes, the threads
per rank, the flag names. Every backend's own run, and every field of its record, is checked by the contract
(tests/backends/test_contract.py)."""
import pytest

import backends
from bench.plan.sweep import world_sizes
from tests.conftest import TINY, bench, bench_inproc, cli_error, records


def _only_record(directory):
    recs = records(directory)
    assert len(recs) == 1, recs
    return recs[0]


@pytest.mark.slow
def test_replica_check_fails_when_replicas_differ(results_dir):
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--results", results_dir,
                        env={"BENCH_FAULT": "diverge@rank1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the sweep fails, the record stays
    rec = _only_record(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is False
    assert "replicas DIFFER" in proc.stdout


@pytest.mark.slow
def test_repeats_run_interleaved_and_resume_runs_only_what_has_no_ok_record(results_dir):
    """single and ddp_amp_syncbn at 1 worker (SyncBatchNorm is skipped on CPU, before anything is launched), then
    --repeat 2 --resume on the same directory: the repetition already there is not run again, a skipped run is planned
    again, and the rest run interleaved (every configuration once before any repeats)."""
    run = ("run", "--backends", "single,ddp_amp_syncbn", "--gpus", "1", *TINY, "--results", results_dir)
    proc = bench_inproc(*run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["backend"]: r for r in records(results_dir)}
    assert (recs["single"]["status"], recs["ddp_amp_syncbn"]["status"]) == ("ok", "skipped")
    assert recs["ddp_amp_syncbn"]["throughput"] is None
    for line in ("single", "global img/s", "per-device img/s", "skipped"):
        assert line in proc.stdout

    again = bench_inproc(*run, "--repeat", 2, "--resume")
    assert again.returncode == 0, again.stdout + again.stderr
    # single has its first repetition; ddp_amp_syncbn was skipped (not ok), so it is planned again
    assert "resume: 1 of 4 runs already have an ok record" in again.stderr
    lines = [ln for ln in again.stdout.splitlines() if ln.startswith("[")]
    # the second repetition turned: it neither starts nor ends as the first (single, ddp_amp_syncbn) did
    assert [ln.split(" on ")[0] for ln in lines] == ["[1/3] ddp_amp_syncbn x1", "[2/3] ddp_amp_syncbn x1",
                                                     "[3/3] single x1"]
    # (each line after the first ends with the sweep's ETA: "... (0:00:12 elapsed, ETA 0:00:24)")
    assert lines[0].endswith("(repeat 1/2) ...") and all("(repeat 2/2) ... (" in ln for ln in lines[1:])
    ok = sorted((r["backend"], r["repeat_index"], r["repeats"]) for r in records(results_dir) if r["status"] == "ok")
    assert ok == [("single", 1, 1), ("single", 2, 2)]


@pytest.mark.slow
def test_list_names_every_backend_and_launcher():
    proc = bench("list", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    for name, entry in backends.REGISTRY.items():  # every registered backend, on a line with its launcher
        assert any(f"│ {name} " in line and entry["launcher"] in line for line in proc.stdout.splitlines()), (
            name, proc.stdout)
    assert "nn.DataParallel cannot parallelise on CPU" in proc.stdout
    assert any(ln.startswith("│ dp ") and "1 device only" in ln for ln in proc.stdout.splitlines())


def test_world_sizes_sweep_powers_of_two_and_the_top():
    assert world_sizes(None, "4", "cuda", 8) == [1, 2, 4]
    assert world_sizes(None, "6", "cuda", 8) == [1, 2, 4, 6]
    assert world_sizes(None, "all", "cuda", 8) == [1, 2, 4, 8]
    assert world_sizes("2,1", None, "cpu", 2) == [1, 2]


@pytest.mark.parametrize("args,message", [
    (["--backends", "nope"], "bench: error: --backends 'nope': unknown backend nope; choose from single, dp, ddp, "
                             "ddp_spawn"),
    (["--model", "notamodel"], "bench: error: --model 'notamodel': unknown model; choose a torchvision classification "
                               "model ("),
    (["--gpus", "64"], "bench: error: --gpus 64: this machine has "),
    (["--batch-size", "0"], "bench: error: --batch-size must be a positive integer, got 0"),
    (["--steps", "-1"], "bench: error: --steps must be a positive integer, got -1"),
    (["--windows", "0"], "bench: error: --windows must be a positive integer, got 0"),
    (["--precision", "fp8"], "bench: error: --precision 'fp8': unknown precision; choose from fp32, fp16, bf16"),
    (["--gpus", "one"], "bench: error: --gpus 'one': expected comma-separated positive integers such as 1,2,4"),
    (["--timeout-s", "-1"], "bench: error: --timeout-s must be a positive number of seconds, got -1.0"),
    (["--backends", "single", "--gpus", "2"], "bench: error: nothing to run: single not planned at world size 2: the "
                                             "scaling baseline runs on 1 device only"),
    (["--batch-size", "big"], "bench: error: argument --batch-size: invalid int value: 'big' (see python -m bench run --help)"),
    (["--hvd-compression", "zip"], "bench: error: argument --hvd-compression: invalid choice: 'zip'"),
    (["--warmup", "1"], "bench: error: --warmup 1 is too short to reach steady state; use at least 2 (step 1 pays "
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
    assert proc.stderr.strip().startswith(f"bench: error: --results '{blocker / 'raw'}' is not writable")
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

"""bench doctor (make gpu-check): its plan, its one table (from hand-built records), its refusal without CUDA and
its exit status, and its real pytest subprocess (every gpu test skips here). The real check runs on a GPU machine only;
everything it decides is checked here."""
from pathlib import Path

import pytest
import torch

import backends
from bench.commands import doctor
from tests.conftest import cli_error

GiB = 2 ** 30


def fake_cuda(monkeypatch, n):
    from bench.commands import _plan  # the planner bench run and bench doctor share

    monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cuda", n))


@pytest.mark.parametrize("gpus", [1, 2])
def test_plan_is_every_backend_at_every_precision_with_resnet50(monkeypatch, tmp_path, gpus):
    fake_cuda(monkeypatch, gpus)
    configs = doctor.plan(gpus, "all", tmp_path)
    got = {(c.backend, c.precision) for c in configs}
    assert got == {(b, p) for b in backends.names() for p in ("fp32", "bf16", "fp16")}
    assert len(configs) == len(got)  # once each (cudnn.benchmark on: no dp cudnn-off variant)
    assert {c.model for c in configs} == {"resnet50"} and {c.cudnn_benchmark for c in configs} == {True}
    assert {(c.warmup, c.steps, c.windows) for c in configs} == {(6, 5, 2)}
    assert {c.world_size for c in configs if c.backend != "single"} == {gpus}
    assert [c.world_size for c in configs if c.backend == "single"] == [1, 1, 1]
    assert [c.precision for c in configs][:: len(configs) // 3] == ["fp32", "bf16", "fp16"]  # precision by precision


def test_without_cuda_it_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    code, err = cli_error(capsys, "doctor")
    assert code == 2
    assert err == (f"bench: error: no CUDA device visible: torch.cuda.is_available() is False (torch {torch.__version__}, "
                   "built for CUDA 13.0); bench doctor checks a GPU machine (a driver older than torch's CUDA also "
                   "hides the GPUs)\n")


def rec(backend, precision, status="ok", n=2, **extra):
    r = {"backend": backend, "world_size": n, "precision": precision, "status": status, "reason": None, "note": None,
         "cudnn_benchmark": True}
    if status == "ok":
        r.update(throughput=2345.67, mfu=0.4321, joules_per_image=0.1234, energy_reason=None, replicas_consistent=True,
                 memory=[{"device_index": i, "peak_reserved_bytes": (10 + i) * GiB} for i in (1, 0)])
    r.update(extra)
    return r


TESTS = {"passed": 20, "failed": 1, "skipped": 2, "failures": ["test_gpu::test_fsdp2_fp16_on_two_gpus"],
         "skips": {"needs 2 CUDA devices": 2}, "timed_out": False, "seconds": 300.0, "log": "x.log"}


def test_the_table_shows_every_column_and_skips_with_their_reasons():
    rows = [rec("ddp", "bf16"),
            rec("horovod", "fp32", "skipped", reason="Horovod is not installed (make horovod)"),
            rec("fsdp2", "fp16", "failed", reason="RuntimeError: No inf checks were recorded for this optimizer."),
            rec("dp", "fp32", energy_reason=None, note="one process drives 2 GPUs", mfu=None, joules_per_image=None),
            {"backend": "ds_zero3", "world_size": 2, "precision": "fp16", "status": "not run (budget)",
             "reason": "the 1200 s budget was spent"}]
    lines = doctor.table(TESTS, rows).splitlines()
    assert lines[0] == "| backend | GPUs | precision | status | img/s | peak reserved per GPU | MFU | J/image | why / note |"
    assert lines[1] == "|---|---:|---|---|---:|---:|---:|---:|---|"
    assert lines[2] == ("| pytest -m gpu |  |  | failed: 20 passed, 1 failed, 2 skipped |  |  |  |  | failed: "
                        "test_gpu::test_fsdp2_fp16_on_two_gpus; skipped 2: needs 2 CUDA devices |")
    assert lines[3] == "| ddp | 2 | bf16 | ok | 2,345.7 | 0: 10.00 · 1: 11.00 GiB | 43.2 % | 0.123 |  |"
    assert lines[4] == "| horovod | 2 | fp32 | skipped |  |  |  |  | Horovod is not installed (make horovod) |"
    assert lines[5] == ("| fsdp2 | 2 | fp16 | failed |  |  |  |  | RuntimeError: No inf checks were recorded for this "
                        "optimizer. |")
    assert lines[6] == "| dp | 2 | fp32 | ok | 2,345.7 | 0: 10.00 · 1: 11.00 GiB |  |  | one process drives 2 GPUs |"
    assert lines[7] == "| ds_zero3 | 2 | fp16 | not run (budget) |  |  |  |  | the 1200 s budget was spent |"
    assert len(lines) == 8


def test_exit_status_fails_on_a_failed_test_a_failed_run_or_diverged_replicas_and_under_full_on_the_budget():
    ok_tests = {**TESTS, "failed": 0, "failures": []}
    for full in (True, False):
        assert doctor.failed(ok_tests, [rec("ddp", "fp32"), rec("horovod", "fp32", "skipped")], full) is False
        assert doctor.failed(None, [rec("ddp", "fp32")], full) is False
        assert doctor.failed(TESTS, [rec("ddp", "fp32")], full) is True
        assert doctor.failed(ok_tests, [rec("fsdp2", "fp16", "failed")], full) is True
        assert doctor.failed(ok_tests, [rec("ddp", "fp32", replicas_consistent=False)], full) is True
        # what the budget left out: a failure of the full check only (the quick tier lists it)
        assert doctor.failed({**ok_tests, "timed_out": True}, [], full) is full
        assert doctor.failed(ok_tests, [{"status": "not run (budget)"}], full) is full
    assert doctor.failed({**TESTS, "timed_out": True}, [], False) is True  # a test that failed before the budget ran out


def test_the_tests_row_of_a_check_the_budget_stopped():
    stopped = {**TESTS, "failed": 0, "failures": [], "skips": {}, "timed_out": True, "seconds": 270.4, "finished": [
        ("tests/test_gpu_one.py::test_a", "passed", 12.0, "")] * 3, "passed": 3, "skipped": 0}
    assert doctor.tests_row(stopped, full=False)[3] == "not run (budget): 3 passed, 0 failed, 0 skipped"
    assert doctor.tests_row(stopped, full=True)[3] == "failed: 3 passed, 0 failed, 0 skipped"
    assert doctor.tests_row(stopped)[8] == "stopped by the time budget after 270 s with 3 test(s) finished (log: x.log)"


def test_progress_lines_are_read_back():
    assert doctor.parse_progress("..[test done] tests/test_gpu.py::test_x[fp16] passed 12.3 s") == (
        "tests/test_gpu.py::test_x[fp16]", "passed", 12.3, "")
    assert doctor.parse_progress("[test done] tests/t.py::test_y skipped 0.0 s (needs 2 CUDA devices: NCCL (x))") == (
        "tests/t.py::test_y", "skipped", 0.0, "needs 2 CUDA devices: NCCL (x)")
    assert doctor.parse_progress("[test done] garbage") is None


@pytest.mark.slow
def test_the_gpu_tests_really_run_from_the_repository_root(tmp_path, monkeypatch):
    """The real subprocess, not a fake: doctor.py moved into bench/commands/ and ran `pytest ... tests` from bench/,
    where pytest found no `tests` and exited 4 ("failed: pytest exited 4" on every GPU machine). Here, with no GPU,
    every gpu test is collected and skips with its reason; each one's progress line comes back. Started from another
    directory with a relative results path, as a user may."""
    monkeypatch.chdir(tmp_path)
    t = doctor.run_tests(600, Path("rel") / "doctor", jobs=1)
    assert t["timed_out"] is False and t["failed"] == 0 and t["failures"] == [], Path(t["log"]).read_text()[-3000:]
    assert t["passed"] == 0 and t["skipped"] >= 30 and sum(t["skips"].values()) == t["skipped"]
    assert len(t["finished"]) == t["skipped"] and {o for _, o, _, _ in t["finished"]} == {"skipped"}
    assert all(name.startswith("tests/") and "::" in name for name, _, _, _ in t["finished"])  # from the root
    assert (tmp_path / "rel" / "doctor" / "gpu-tests.xml").is_file()
    # a budget that cannot hold the session: the process group is stopped, and nothing counts as failed
    t = doctor.run_tests(0.5, tmp_path / "short", jobs=1)
    assert t["timed_out"] is True and t["failed"] == 0 and t["seconds"] < 30
    assert doctor.tests_row(t, full=False)[3].startswith("not run (budget)")


def test_junit_summary(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_gpu" name="test_a"/>'
                   '<testcase classname="tests.test_gpu" name="test_b"><failure message="x"/></testcase>'
                   '<testcase classname="tests.test_gpu" name="test_c"><skipped message="needs 2 CUDA devices"/>'
                   '</testcase><testcase classname="tests.test_loaders" name="test_d"><error message="y"/></testcase>'
                   '</testsuite></testsuites>')
    assert doctor.parse_junit(xml) == {"passed": 1, "failed": 2, "skipped": 1,
                                       "failures": ["test_gpu::test_b", "test_loaders::test_d"],
                                       "skips": {"needs 2 CUDA devices": 1}}


def test_runs_that_no_longer_fit_the_budget_are_listed_not_launched(monkeypatch, tmp_path, capsys):
    """The sweep loop itself, with a fake clock and launcher: the budget decides what runs."""
    from bench import cli, launch
    from bench.core import environment

    fake_cuda(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(environment, "collect_env", lambda *a, **kw: {"gpu_names": ["NVIDIA H100 80GB HBM3"]})
    clock = iter(range(0, 100000, 100))  # every reading 100 s later: start, then one reading per planned run
    monkeypatch.setattr(doctor.time, "monotonic", lambda: next(clock))
    launched = []

    def run_one(cfg, results_dir, env_meta, backend, timeout=None, **kw):
        launched.append((cfg.backend, cfg.precision, timeout))
        return rec(cfg.backend, cfg.precision, n=1)

    monkeypatch.setattr(launch, "run_one", run_one)
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--full", "--skip-tests", "--budget-s", "450", "--run-timeout", "150",
                  "--results", str(tmp_path)])
    assert e.value.code == 1  # runs left out of the full check: it did not finish
    # the clock reads 0 at the start, then 100 s more before each planned run: 350, 250, 150 s left get the
    # per-run cap, 50 s left gets 50 s, and from -50 s on (under doctor.MIN_RUN_S) nothing is launched
    assert launched == [(b, "fp32", t) for b, t in zip(backends.names()[:4], (150, 150, 150, 50))]
    out = capsys.readouterr().out
    assert out.count("| not run (budget) |") == 3 * len(backends.names()) - 4
    assert (tmp_path / "doctor.md").read_text().strip() == out[out.index("| backend"):].strip()
    # the quick tier: every backend once, at bf16, in 450 s; what the budget leaves out is listed, not a failure
    launched.clear()
    clock = iter(range(0, 100000, 100))
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--skip-tests", "--results", str(tmp_path / "quick")])
    assert e.value.code == 0
    assert launched == [(b, "bf16", t) for b, t in zip(backends.names()[:4], (150, 150, 150, 50))]
    out = capsys.readouterr().out
    assert out.count("| not run (budget) |") == len(backends.names()) - 4 and "bench doctor (quick)" in out


# --ranks-per-gpu: the 2-rank gpu tests on a one-GPU machine (tests/test_gpu.py two_ranks)

def test_ranks_per_gpu_plans_two_ranks_on_one_gpu_for_the_ddp_family_only(monkeypatch):
    from bench.commands import _plan

    fake_cuda(monkeypatch, 1)
    args = _plan.parse_run(["--backends", "all", "--gpus", "2", "--ranks-per-gpu", "2", "--device", "cuda"])
    configs, _ = _plan.plan(args)
    runs = {c.backend: c for c in configs}
    assert {c.world_size for c in configs if c.backend != "single"} == {2} and "single" not in runs
    shared = {n for n, c in runs.items() if backends.create(n).unavailable(c) is None}
    # the backends that declare the knob (the DDP family), and no other
    assert shared == {n for n in runs if "ranks_per_gpu" in {k.key for k in backends.backend_class(n).knobs}}
    assert {"ddp", "ddp_spawn", "ddp_amp_syncbn", "ddp_zero", "allreduce_manual"} <= shared
    assert runs["ddp"].options == {"ranks_per_gpu": 2}  # part of the configuration key: never mixed with real runs
    assert backends.create("fsdp2").unavailable(runs["fsdp2"]).startswith("fsdp2 cannot honour --ranks-per-gpu")
    # one rank per GPU is the default, and recorded as nothing
    configs, _ = _plan.plan(_plan.parse_run(["--backends", "ddp", "--gpus", "1", "--ranks-per-gpu", "1"]))
    assert configs[0].options == {}


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "3", "--ranks-per-gpu", "2", "--device", "cuda"],
     "--gpus 3: this machine has 2 rank slots (1 CUDA device(s) x --ranks-per-gpu 2)"),
    (["--gpus", "2", "--device", "cuda"], "--gpus 2: this machine has 1 CUDA device(s)"),
    (["--gpus", "2", "--ranks-per-gpu", "0", "--device", "cuda"], "--ranks-per-gpu must be a positive integer, got 0"),
])
def test_ranks_per_gpu_bad_input_is_one_line(monkeypatch, capsys, argv, message):
    fake_cuda(monkeypatch, 1)
    code, err = cli_error(capsys, "run", "--backends", "ddp", *argv)
    assert (code, err) == (2, f"bench: error: {message}\n")


def test_ranks_per_gpu_is_refused_on_the_cpu(capsys):
    code, err = cli_error(capsys, "run", "--backends", "ddp", "--device", "cpu", "--gpus", "2", "--ranks-per-gpu", "2")
    assert (code, err) == (2, "bench: error: --ranks-per-gpu 2 shares CUDA devices between ranks; this run is on the "
                              "CPU, where --gpus already counts worker processes\n")


def test_ranks_sharing_a_gpu_take_gloo_and_the_shared_device(monkeypatch):
    """What a rank of the DDP family does under --ranks-per-gpu 2 on one GPU, with torch's CUDA and process-group
    calls recorded instead of made (no GPU here): gloo, not NCCL, and device cuda:0 for both local ranks."""
    import torch.distributed as dist

    from backends import ddp
    from bench.core.config import RunConfig

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw.get("device_id"))))
    for local, shared in ((0, 2), (1, 2), (1, 1)):
        monkeypatch.setenv("RANK", str(local))
        monkeypatch.setenv("LOCAL_RANK", str(local))
        monkeypatch.setenv("WORLD_SIZE", "2")
        cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="resnet18",
                        image_size=32, batch_size=2, warmup=2, steps=1, windows=1,
                        options={"ranks_per_gpu": shared} if shared > 1 else {})
        b = ddp.DDP("ddp", "torchrun")
        b.init_process_group(cfg)
        assert b.device == torch.device("cuda", local // shared)
    assert calls == [("set_device", 0), ("gloo", None), ("set_device", 0), ("gloo", None),
                     ("set_device", 1), ("nccl", torch.device("cuda", 1))]


def test_a_test_that_needs_a_missing_dependency_skips_with_the_reason_or_fails_where_it_is_required(monkeypatch):
    """A GPU machine without DALI, DeepSpeed, HTA or NVML skips the tests that need them (the first H200 had none of
    the first three); .ci/run, where make installed every locked package, makes that a failure."""
    import importlib.util

    from tests import conftest

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    assert conftest.optional_problem("deepspeed") == "deepspeed is not installed (make install does)"
    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", False)
    with pytest.raises(pytest.skip.Exception, match=r"^deepspeed is not installed \(make install does\)$"):
        conftest.skip_without("hta", "deepspeed")
    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", True)
    with pytest.raises(pytest.fail.Exception, match="BENCH_REQUIRE_OPTIONAL=1 and deepspeed cannot be used"):
        conftest.skip_without("deepspeed")
    conftest.skip_without("hta")  # installed here: nothing happens
    # Horovod: a skip, but a failure where the CPU gate requires it (BENCH_REQUIRE_HOROVOD=1)
    from backends import horovod

    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", False)
    monkeypatch.setattr(horovod, "problem", lambda: "horovod is not installed (make horovod)")
    monkeypatch.delenv("BENCH_REQUIRE_HOROVOD", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^horovod is not installed \(make horovod\)$"):
        conftest.skip_without("horovod")
    monkeypatch.setenv("BENCH_REQUIRE_HOROVOD", "1")
    with pytest.raises(BaseException) as raised:  # a skip here must fail this test, not skip it
        conftest.skip_without("horovod")
    assert raised.type is pytest.fail.Exception, raised
    assert str(raised.value).startswith("BENCH_REQUIRE_HOROVOD=1 and horovod cannot be used: horovod is not installed")


def test_a_gpt_on_a_gpu_defaults_to_8_sequences_per_device_and_a_resnet_to_64(monkeypatch):
    """GPT models inherited the GPU's 64 per device: ~13 GB of logits alone for gpt-125m at 1024 tokens, so activations,
    not the sharded state, decided every comparison."""
    from bench.commands import _plan

    fake_cuda(monkeypatch, 1)
    for model, batch, seq in (("gpt-125m", 8, 1024), ("resnet50", 64, None), ("tests.user_model:factory", 64, None)):
        [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--gpus", "1", "--model", model]))
        assert (cfg.batch_size, cfg.seq_len) == (batch, seq), model
    [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--gpus", "1", "--model", "gpt-125m",
                                           "--batch-size", "32"]))
    assert cfg.batch_size == 32  # given: as given
    [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--device", "cpu", "--gpus", "1", "--model",
                                           "gpt-micro"]))
    assert cfg.batch_size == 8

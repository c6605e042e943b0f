"""bench doctor (make gpu-check): its plan, its one table (from hand-built records), its refusal without CUDA and
its exit status. The real check runs on a GPU machine only; everything it decides is checked here in-process."""
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
            {"backend": "ds_zero3", "world_size": 2, "precision": "fp16", "status": "not run",
             "reason": "time budget: 1200 s spent"}]
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
    assert lines[7] == "| ds_zero3 | 2 | fp16 | not run |  |  |  |  | time budget: 1200 s spent |"
    assert len(lines) == 8


def test_exit_status_fails_on_a_failed_test_a_failed_run_a_timeout_or_diverged_replicas():
    ok_tests = {**TESTS, "failed": 0, "failures": []}
    assert doctor.failed(ok_tests, [rec("ddp", "fp32"), rec("horovod", "fp32", "skipped")]) is False
    assert doctor.failed(None, [rec("ddp", "fp32")]) is False
    assert doctor.failed(TESTS, [rec("ddp", "fp32")]) is True
    assert doctor.failed({**ok_tests, "timed_out": True}, []) is True
    assert doctor.failed(ok_tests, [rec("fsdp2", "fp16", "failed")]) is True
    assert doctor.failed(ok_tests, [{"status": "not run"}]) is True
    assert doctor.failed(ok_tests, [rec("ddp", "fp32", replicas_consistent=False)]) is True


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
    from bench.core import results

    fake_cuda(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(results, "collect_env", lambda **kw: {"gpu_names": ["NVIDIA H100 80GB HBM3"]})
    clock = iter(range(0, 100000, 100))  # every reading 100 s later: start, then one reading per planned run
    monkeypatch.setattr(doctor.time, "monotonic", lambda: next(clock))
    launched = []

    def run_one(cfg, results_dir, env_meta, backend, timeout=None, **kw):
        launched.append((cfg.backend, cfg.precision, timeout))
        return rec(cfg.backend, cfg.precision, n=1)

    monkeypatch.setattr(launch, "run_one", run_one)
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--skip-tests", "--budget-s", "450", "--run-timeout", "150", "--results", str(tmp_path)])
    assert e.value.code == 1  # runs left out: the check did not finish
    # the clock reads 0 at the start, then 100 s more before each planned run: 350, 250, 150 s left get the
    # per-run cap, 50 s left gets 50 s, and from -50 s on (under doctor.MIN_RUN_S) nothing is launched
    assert launched == [(b, "fp32", t) for b, t in zip(backends.names()[:4], (150, 150, 150, 50))]
    out = capsys.readouterr().out
    assert out.count("| not run |") == 3 * len(backends.names()) - 4
    assert (tmp_path / "doctor.md").read_text().strip() == out[out.index("| backend"):].strip()

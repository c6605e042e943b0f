"""horovod's own tests: a missing build is a clean skip reason, its compression is recorded in every horovod run (and
only there), and one 2-rank horovodrun over gloo whose every knob is read back from Horovod's own settings in the
ranks. Its plain 2-rank run is in test_contract.py."""
import sys

import pytest

from backends import horovod as hvd_backend
from tests.conftest import TINY, TINY_WINDOWS, bench_inproc, records, skip_without


def test_missing_horovod_is_a_clean_skip_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod", None)
    assert hvd_backend.problem() == "horovod is not installed (make horovod)"


def test_horovod_compression_defaults_to_none_and_is_always_recorded():
    """Like-for-like with fp32 DDP unless asked; the record's options say which (the run below asks for fp16)."""
    from bench.plan.sweep import parse_run, plan

    [cfg], _ = plan(parse_run(["--backends", "horovod", "--gpus", "2", "--device", "cpu"]))
    assert cfg.options == {"compression": "none"}


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_two_gloo_ranks_fp16_compression_bf16_fusion_and_cycle_time_reach_horovod(results_dir):
    """One 2-rank horovodrun over gloo: identical replicas, the timed and compute-only windows, Horovod's build
    recorded, and every horovod knob read back from Horovod's own settings in the ranks."""
    skip_without("horovod")
    proc = bench_inproc("run", "--backends", "horovod", "--gpus", 2, *TINY, "--precision", "bf16",
                        "--hvd-compression", "fp16", "--hvd-fusion-mb", 1, "--hvd-cycle-ms", 2.5, "--trace", 1,
                        "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    # --trace under horovodrun: one trace per rank, its phases marked, no profiler in a timed window
    assert rec["profiler_in_windows"] is False and rec["trace"]["files"] == [
        str(results_dir / "logs" / f"{rec['run_id']}.rank{r}.trace.json.gz") for r in (0, 1)]
    assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == [{"data", "forward", "backward", "optimizer",
                                                                     "other"}] * 2
    assert rec["status"] == "ok", rec["reason"]
    assert (rec["backend"], rec["launcher"], rec["world_size"]) == ("horovod", "horovodrun", 2)
    assert rec["replicas_consistent"] is True
    assert len(rec["window_seconds"]) == TINY_WINDOWS and rec["throughput"] > 0
    assert rec["compute_only"]["measured"] is True and len(rec["compute_only_window_seconds"]) == TINY_WINDOWS
    info = rec["env"]["horovod"]
    assert info["version"] == "0.28.1" and info["frameworks"] == "PyTorch"
    assert "Gloo" in info["controllers"].split(", ") and "Gloo" in info["tensor_operations"].split(", ")
    assert rec["options"] == {"compression": "fp16", "hvd_fusion_mb": 1.0, "hvd_cycle_ms": 2.5}
    assert rec["precision"] == "bf16"
    info = rec["backend_info"]  # read back from Horovod's own settings in the ranks
    assert (info["fusion_threshold_bytes"], info["cycle_time_ms"]) == (str(2 ** 20), "2.5")


@pytest.mark.slow
@pytest.mark.horovod
def test_the_build_read_in_process_is_what_horovodrun_check_build_says():
    """build_info() reads the loaded extension instead of asking horovodrun (7 s a sweep); horovodrun's own answer
    through this interpreter, parsed, must be the same, field for field."""
    skip_without("horovod")
    info = hvd_backend.build_info()
    assert info == hvd_backend.check_build()
    assert set(info) == {"version", "frameworks", "controllers", "tensor_operations"}


@pytest.mark.horovod
def test_with_another_framework_installed_horovodrun_itself_is_asked(monkeypatch):
    """TensorFlow or MXNet beside it: horovodrun lists their extensions too, so its answer is taken as it gives it."""
    skip_without("horovod")
    import importlib.util
    import subprocess

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "tensorflow" else real_find_spec(name, *a))
    asked = []
    out = ("Horovod v0.28.1:\n\nAvailable Frameworks:\n    [X] TensorFlow\n    [X] PyTorch\n    [ ] MXNet\n\n"
           "Available Controllers:\n    [X] MPI\n    [X] Gloo\n\nAvailable Tensor Operations:\n    [X] NCCL\n"
           "    [ ] DDL\n    [ ] CCL\n    [X] MPI\n    [X] Gloo    \n")
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: asked.append(argv) or subprocess.CompletedProcess(
        argv, 0, out, ""))
    assert hvd_backend.build_info() == {"version": "0.28.1", "frameworks": "TensorFlow, PyTorch",
                                        "controllers": "MPI, Gloo", "tensor_operations": "NCCL, MPI, Gloo"}
    assert asked == [[sys.executable, "-m", "horovod.runner.launch", "--check-build"]]

"""CUDA paths on one GPU: NCCL, fp16 GradScaler, SyncBatchNorm, NVML memory, peaks after warm-up, the cuDNN knob,
the DDP communication hooks and Horovod. Marked ``gpu``; each skips without what it needs, with the reason.

The gpu tests live by subject: this module (the classic backends on one GPU), tests/test_gpu_new_backends.py (FSDP2,
DeepSpeed ZeRO, ZeroRedundancyOptimizer and the hand-written all-reduce in mixed precision), tests/test_gpu_two_ranks.py
(2 ranks: on one GPU the DDP family shares it over gloo; the rest needs 2 GPUs) and tests/test_gpu_verify.py (every
backend trains the same model). ``bench doctor`` (make gpu-check) runs them several at once: each run is tiny
(resnet18 at 64 px, 3 steps x 3 windows), and the tests assert what ran, not how fast.
"""
import pytest
import torch

from bench.rank.faults import BLOAT_BYTES
from tests.conftest import bench, records, skip_without

GPU_RUN = ["--device", "cuda", "--model", "resnet18", "--image-size", "64", "--batch-size", "16",
           "--warmup", "3", "--steps", "3", "--windows", "3"]
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = [pytest.mark.gpu, one_gpu]
NCCL_BACKENDS = ("ddp", "ddp_spawn", "ddp_amp_syncbn")


@pytest.fixture(scope="module")
def one_gpu_sweep(tmp_path_factory):
    """Every torch backend at world size 1 on CUDA in one sweep (ddp_amp_syncbn at its fp16 default, so the
    plan adds an fp16 single), with 256 MiB held through the last warm-up step on every run."""
    raw = tmp_path_factory.mktemp("gpu1") / "raw"
    proc = bench("run", "--backends", "single,dp,ddp,ddp_spawn,ddp_amp_syncbn", "--gpus", 1, *GPU_RUN,
                 "--results", raw, env={"BENCH_FAULT": "bloat@rank0:step3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {(r["backend"], r["precision"]): r for r in records(raw)}


def test_every_backend_runs_on_one_gpu(one_gpu_sweep):
    assert set(one_gpu_sweep) == {("single", "fp32"), ("single", "fp16"), ("dp", "fp32"), ("ddp", "fp32"),
                                  ("ddp_spawn", "fp32"), ("ddp_amp_syncbn", "fp16")}
    for (backend, _), rec in one_gpu_sweep.items():
        assert rec["status"] == "ok", (backend, rec["reason"])
        assert rec["device_type"] == "cuda" and rec["cudnn_benchmark"] is True
        assert rec["backend_info"]["process_group"] == ("nccl" if backend in NCCL_BACKENDS else None)


def test_memory_is_read_from_the_allocator_after_warmup(one_gpu_sweep):
    for (backend, _), rec in one_gpu_sweep.items():
        [mem] = rec["memory"]
        assert mem["device_index"] == 0 and mem["device_name"] == torch.cuda.get_device_name(0)
        assert mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"] > 0
        # the 256 MiB block held through the last warm-up step is in the warm-up peak and not in the timed one
        # (allocated: exactly on top of a steady step; reserved: less the allocator's rounding of segments)
        assert mem["warmup_peak_allocated_bytes"] - mem["peak_allocated_bytes"] > 0.9 * BLOAT_BYTES, backend
        assert mem["warmup_peak_reserved_bytes"] - mem["peak_reserved_bytes"] > 0.5 * BLOAT_BYTES, backend


def test_memory_is_read_from_nvml(one_gpu_sweep):
    skip_without("nvml")
    for (backend, _), rec in one_gpu_sweep.items():
        [mem] = rec["memory"]
        # NVML really read: the whole GPU's used memory holds at least this process's reservation
        assert mem["nvml_used_bytes"] is not None and mem["nvml_used_bytes"] >= mem["peak_reserved_bytes"], backend


def test_flops_and_mfu_on_one_gpu(one_gpu_sweep):
    from backends.models import flops
    from bench.core import mfu

    for (backend, precision), rec in one_gpu_sweep.items():
        assert rec["flops_per_sample"] == flops.flops_per_sample("resnet18", 64)
        peak, _ = mfu.peak_tflops(torch.cuda.get_device_name(0), precision)
        if peak:  # a GPU in the table: MFU is the achieved share of its dense peak
            assert rec["mfu"] == pytest.approx(rec["flops_per_sample"] * rec["throughput"] / (peak * 1e12))
            assert 0 < rec["mfu"] < 1


def test_energy_is_read_from_nvml_on_one_gpu(one_gpu_sweep):
    skip_without("nvml")
    for (backend, _), rec in one_gpu_sweep.items():
        # NVML's energy counter read before the first window and after the last (Volta and newer)
        assert rec["energy_reason"] is None, (backend, rec["energy_reason"])
        assert rec["energy_total_joules"] >= 0, backend  # a tiny run may fall within one tick of the counter


def test_fp16_gradscaler_and_syncbatchnorm_on_one_gpu(one_gpu_sweep):
    rec = one_gpu_sweep[("ddp_amp_syncbn", "fp16")]
    info = rec["backend_info"]
    assert info["sync_batchnorm_layers"] == 20  # resnet18's BatchNorm2d layers, converted
    assert info["grad_scaler"] is True and info["autocast_dtype"] == "float16"
    assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
    assert isinstance(rec["warmup_skipped_steps"], int)
    single16 = one_gpu_sweep[("single", "fp16")]["backend_info"]
    assert single16["grad_scaler"] is True and single16["sync_batchnorm_layers"] == 0


def test_cudnn_benchmark_off_is_applied_and_recorded(results_dir):
    proc = bench("run", "--backends", "single", "--gpus", 1, *GPU_RUN, "--cudnn-benchmark", "off",
                 "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["cudnn_benchmark"] is False
    assert rec["throughput"] > 0 and len(rec["window_seconds"]) == 3 and rec["memory"][0]["peak_allocated_bytes"] > 0


def test_horovod_on_one_gpu(results_dir):
    skip_without("horovod")
    proc = bench("run", "--backends", "horovod", "--gpus", 1, *GPU_RUN, "--precision", "fp16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["backend_info"]["grad_scaler"] is True and len(rec["skipped_steps"]) == 3
    assert rec["precision"] == "fp16" and rec["throughput"] > 0 and rec["memory"][0]["device_index"] == 0


def test_powersgd_and_compression_hooks_run_on_nccl(results_dir):
    for hook in ("powersgd", "fp16"):
        proc = bench("run", "--backends", "ddp", "--gpus", 1, *GPU_RUN, "--warmup", 4, "--ddp-comm-hook", hook,
                     "--results", results_dir / hook)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [rec] = records(results_dir / hook)
        assert rec["status"] == "ok" and rec["backend_info"]["comm_hook"] == hook
        assert rec["backend_info"]["process_group"] == "nccl" and rec["throughput"] > 0
        assert len(rec["window_seconds"]) == 3 and all(t > 0 for t in rec["window_seconds"])

"""CUDA paths: NCCL, fp16 GradScaler, SyncBatchNorm, NVML memory, peaks after warm-up, the cuDNN knob, and
DataParallel's precision and memory on two GPUs. Marked ``gpu``; each skips without the GPUs it needs.

The GPU machines lent to this project have one GPU, so every backend is checked at world size 1 there; the
2-GPU tests (every backend, ``bench collectives``, DataParallel's energy over its GPUs, SyncBatchNorm) run on
multi-GPU runners (``make test ARGS="-m gpu"``, or ``python -m bench doctor``). Each run is tiny (resnet18 at
64 px, 3 steps x 3 windows) so the whole ``-m gpu`` set fits bench doctor's budget.
"""
import pytest
import torch

from backends import horovod as hvd_backend
from bench.rank.faults import BLOAT_BYTES
from tests.conftest import bench, records

GPU_RUN = ["--device", "cuda", "--model", "resnet18", "--image-size", "64", "--batch-size", "16",
           "--warmup", "3", "--steps", "3", "--windows", "3"]
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
pytestmark = pytest.mark.gpu
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


@one_gpu
def test_every_backend_runs_on_one_gpu(one_gpu_sweep):
    assert set(one_gpu_sweep) == {("single", "fp32"), ("single", "fp16"), ("dp", "fp32"), ("ddp", "fp32"),
                                  ("ddp_spawn", "fp32"), ("ddp_amp_syncbn", "fp16")}
    for (backend, _), rec in one_gpu_sweep.items():
        assert rec["status"] == "ok", (backend, rec["reason"])
        assert rec["device_type"] == "cuda" and rec["cudnn_benchmark"] is True
        assert rec["backend_info"]["process_group"] == ("nccl" if backend in NCCL_BACKENDS else None)


@one_gpu
def test_memory_is_read_from_the_allocator_and_nvml_after_warmup(one_gpu_sweep):
    for (backend, _), rec in one_gpu_sweep.items():
        [mem] = rec["memory"]
        assert mem["device_index"] == 0 and mem["device_name"] == torch.cuda.get_device_name(0)
        assert mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"] > 0
        # NVML really read: the whole GPU's used memory holds at least this process's reservation
        assert mem["nvml_used_bytes"] is not None and mem["nvml_used_bytes"] >= mem["peak_reserved_bytes"]
        # the 256 MiB block held through the last warm-up step is in the warm-up peak and not in the timed one
        # (allocated: exactly on top of a steady step; reserved: less the allocator's rounding of segments)
        assert mem["warmup_peak_allocated_bytes"] - mem["peak_allocated_bytes"] > 0.9 * BLOAT_BYTES, backend
        assert mem["warmup_peak_reserved_bytes"] - mem["peak_reserved_bytes"] > 0.5 * BLOAT_BYTES, backend


@one_gpu
def test_energy_flops_and_mfu_on_one_gpu(one_gpu_sweep):
    from bench.rank import flops

    for (backend, precision), rec in one_gpu_sweep.items():
        # NVML's energy counter read around each window (Volta and newer)
        assert rec["energy_reason"] is None, rec["energy_reason"]
        assert rec["flops_per_sample"] == flops.flops_per_sample("resnet18", 64)
        peak, _ = flops.peak_tflops(torch.cuda.get_device_name(0), precision)
        if peak:  # a GPU in the table: MFU is the achieved share of its dense peak
            assert rec["mfu"] == pytest.approx(rec["flops_per_sample"] * rec["throughput"] / (peak * 1e12))
            assert 0 < rec["mfu"] < 1


@one_gpu
def test_fp16_gradscaler_and_syncbatchnorm_on_one_gpu(one_gpu_sweep):
    rec = one_gpu_sweep[("ddp_amp_syncbn", "fp16")]
    info = rec["backend_info"]
    assert info["sync_batchnorm_layers"] == 20  # resnet18's BatchNorm2d layers, converted
    assert info["grad_scaler"] is True and info["autocast_dtype"] == "float16"
    assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
    assert isinstance(rec["warmup_skipped_steps"], int)
    single16 = one_gpu_sweep[("single", "fp16")]["backend_info"]
    assert single16["grad_scaler"] is True and single16["sync_batchnorm_layers"] == 0


@one_gpu
def test_cudnn_benchmark_off_is_applied_and_recorded(results_dir):
    proc = bench("run", "--backends", "single", "--gpus", 1, *GPU_RUN, "--cudnn-benchmark", "off",
                 "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["cudnn_benchmark"] is False
    assert rec["throughput"] > 0 and len(rec["window_seconds"]) == 3 and rec["memory"][0]["peak_allocated_bytes"] > 0


@one_gpu
def test_horovod_on_one_gpu(results_dir):
    reason = hvd_backend.problem()
    if reason:
        pytest.skip(reason)
    proc = bench("run", "--backends", "horovod", "--gpus", 1, *GPU_RUN, "--precision", "fp16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["backend_info"]["grad_scaler"] is True and len(rec["skipped_steps"]) == 3
    assert rec["precision"] == "fp16" and rec["throughput"] > 0 and rec["memory"][0]["device_index"] == 0


# ---------------------------------------------------------------------------------------------------
# Two GPUs

@two_gpus
@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dataparallel_replicas_run_the_recorded_dtype(precision, dtype):
    """parallel_apply re-enters autocast without a dtype in each replica thread; the wrapper must win."""
    import backends
    from bench.core.config import RunConfig

    cfg = RunConfig(backend="dp", launcher="inproc", world_size=2, device_type="cuda", model="resnet18",
                    image_size=64, batch_size=4, warmup=2, steps=1, windows=1, precision=precision).validate()
    dp = backends.create("dp")
    dp.setup(cfg)
    seen = []
    dp.module.fc.register_forward_hook(lambda m, i, o: seen.append((o.device.index, o.dtype)))
    with torch.autocast("cuda", dtype=dtype):
        out = dp.model(torch.randn(8, 3, 64, 64, device="cuda:0"))
    assert out.dtype == dtype
    assert sorted(seen) == [(0, dtype), (1, dtype)]  # each replica, in its own thread


@two_gpus
def test_dataparallel_on_two_gpus_shows_gpu0_load_and_runs_both_cudnn_settings(results_dir):
    proc = bench("run", "--backends", "dp", "--gpus", 2, *GPU_RUN, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["cudnn_benchmark"]: r for r in records(results_dir)}
    assert set(recs) == {True, False}  # the plan adds the labelled cudnn.benchmark-off variant at N >= 2
    for rec in recs.values():
        assert rec["status"] == "ok" and rec["global_batch"] == 32
        mem = rec["memory"]
        assert [m["device_index"] for m in mem] == [0, 1] and {m["rank"] for m in mem} == {0}
        assert all(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0 for m in mem)
        assert all(m["nvml_used_bytes"] >= m["peak_reserved_bytes"] for m in mem)
        # outputs are gathered and gradients reduced on GPU 0
        assert mem[0]["peak_allocated_bytes"] > mem[1]["peak_allocated_bytes"]
        assert rec["memory_imbalance"] > 1.0


@two_gpus
@pytest.mark.parametrize("backend", NCCL_BACKENDS)
def test_nccl_backends_on_two_gpus_keep_identical_replicas(results_dir, backend):
    proc = bench("run", "--backends", backend, "--gpus", 2, *GPU_RUN, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0), (1, 1)]
    assert rec["cudnn_benchmark"] is True and rec["env"]["nccl"]
    assert rec["backend_info"]["process_group"] == "nccl"


@two_gpus
def test_horovod_nccl_on_two_gpus(results_dir):
    reason = hvd_backend.problem()
    if reason:
        pytest.skip(reason)
    proc = bench("run", "--backends", "horovod", "--gpus", 2, *GPU_RUN, "--precision", "fp16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["replicas_consistent"] is True and "NCCL" in rec["env"]["horovod"]["tensor_operations"]


# ---------------------------------------------------------------------------------------------------
# The backends people choose between today, on one GPU

NEW = ("fsdp2", "ds_zero1", "ds_zero2", "ds_zero3", "ddp_zero", "allreduce_manual")


@one_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_new_backends_in_mixed_precision_on_one_gpu(results_dir, precision):
    proc = bench("run", "--backends", ",".join(NEW), "--gpus", 1, *GPU_RUN, "--precision", precision,
                 "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["backend"]: r for r in records(results_dir)}
    assert set(recs) == set(NEW)
    half = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    for name, rec in recs.items():
        assert rec["status"] == "ok", (name, rec["reason"])
        assert rec["backend_info"]["process_group"] == "nccl"
        assert rec["backend_info"]["grad_scaler"] is (precision == "fp16"), name
        assert (rec["skipped_steps"] is not None) is (precision == "fp16"), name
        assert rec["global_batch"] == 16 and rec["throughput"] > 0 and rec["precision"] == precision, name
        assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0)], name
    assert recs["fsdp2"]["backend_info"]["param_dtype"] == half  # MixedPrecisionPolicy, BatchNorm kept in fp32
    for stage in (1, 2, 3):
        assert recs[f"ds_zero{stage}"]["backend_info"]["param_dtype"] == half  # DeepSpeed's own fp16/bf16 section


@one_gpu
def test_powersgd_and_compression_hooks_run_on_nccl(results_dir):
    for hook in ("powersgd", "fp16"):
        proc = bench("run", "--backends", "ddp", "--gpus", 1, *GPU_RUN, "--warmup", 4, "--ddp-comm-hook", hook,
                     "--results", results_dir / hook)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [rec] = records(results_dir / hook)
        assert rec["status"] == "ok" and rec["backend_info"]["comm_hook"] == hook
        assert rec["backend_info"]["process_group"] == "nccl" and rec["throughput"] > 0
        assert len(rec["window_seconds"]) == 3 and all(t > 0 for t in rec["window_seconds"])


@one_gpu
def test_every_backend_passes_verify_on_one_gpu(tmp_path):
    proc = bench("verify", "--gpus", 1, "--device", "cuda", "--steps", 8, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout


# ---------------------------------------------------------------------------------------------------
# Every backend at 2 GPUs (issue 24): identical replicas, each rank on its own GPU, the recorded settings

def two_gpu_record(results_dir, backend, *extra):
    proc = bench("run", "--backends", backend, "--gpus", 2, *GPU_RUN, *extra, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["replicas_consistent"] is True and rec["global_batch"] == 32 and rec["world_size"] == 2
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0), (1, 1)]
    assert all(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0 for m in rec["memory"])
    assert rec["backend_info"]["process_group"] == "nccl" and len(rec["window_seconds"]) == 3
    return rec


@two_gpus
def test_fsdp2_fp16_on_two_gpus_runs_its_compute_only_windows(results_dir):
    """Item 1: GradScaler.step after windows run under set_requires_gradient_sync(False) at 2 ranks."""
    rec = two_gpu_record(results_dir, "fsdp2", "--precision", "fp16")
    info = rec["backend_info"]
    assert info["grad_scaler"] is True and info["param_dtype"] == "float16"
    assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) for n in rec["skipped_steps"])


@two_gpus
@pytest.mark.parametrize("backend", ["ds_zero1", "ds_zero2", "ds_zero3", "ddp_zero", "allreduce_manual"])
def test_sharded_and_manual_backends_on_two_gpus_keep_identical_replicas(results_dir, backend):
    rec = two_gpu_record(results_dir, backend)
    assert rec["precision"] == "fp32" and rec["backend_info"]["grad_scaler"] is False
    if backend.startswith("ds_zero"):
        assert rec["backend_info"]["zero_stage"] == int(backend[-1])


@two_gpus
def test_syncbatchnorm_at_two_ranks(results_dir):
    rec = two_gpu_record(results_dir, "ddp_amp_syncbn")
    info = rec["backend_info"]
    assert info["sync_batchnorm_layers"] == 20 and info["grad_scaler"] is True and info["autocast_dtype"] == "float16"


@two_gpus
def test_dataparallel_energy_is_summed_over_its_gpus(results_dir):
    import backends
    from bench.core.config import RunConfig
    from bench.rank.energy import EnergyMeter

    cfg = RunConfig(backend="dp", launcher="inproc", world_size=2, device_type="cuda", model="resnet18",
                    image_size=64, batch_size=4, warmup=2, steps=1, windows=1).validate()
    dp = backends.create("dp")
    dp.setup(cfg)
    meter = EnergyMeter(dp.devices())
    assert [d.index for d in dp.devices()] == [0, 1] and meter.reason is None
    assert len(meter.read()) == 2  # one counter per GPU the one process drives
    # a span of over a second: NVML's counter moves every 20-100 ms, so a few tiny steps could read 0 J
    proc = bench("run", "--backends", "dp", "--gpus", 2, "--device", "cuda", "--model", "resnet18", "--image-size", 224,
                 "--batch-size", 64, "--warmup", 3, "--steps", 20, "--windows", 3, "--cudnn-benchmark", "on",
                 "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["energy_reason"] is None
    span = rec["energy_span_seconds"]
    assert span > 1.0, "too short a span for the counter: lengthen the run"
    # both GPUs' counters over the whole span (test_measurement_gpu_fixes.py checks the span arithmetic): two GPUs,
    # one of them idle at worst, draw more than one GPU's idle floor
    assert rec["mean_watts"] == pytest.approx(rec["energy_total_joules"] / span, rel=0.01)
    assert 40 < rec["mean_watts"] < 4000
    assert rec["joules_per_image"] == pytest.approx(rec["energy_total_joules"] / (2 * 64 * 20 * 3))
    assert len(rec["energy_window_diagnostic"]["joules"]) == 3


@two_gpus
def test_collectives_on_two_gpus_over_nccl(tmp_path):
    proc = bench("collectives", "--gpus", 2, "--device", "cuda", "--max-bytes", "1M", "--iters", 3, "--warmup", 1,
                 "--no-horovod", "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    recs = [json.loads(p.read_text()) for p in (tmp_path / "collectives").glob("*.json")]
    assert recs and all(r["status"] == "ok" and r["world_size"] == 2 and r["device_type"] == "cuda" for r in recs)
    nccl = [r for r in recs if r["process_group"] == "nccl"]
    assert nccl, [r["process_group"] for r in recs]
    factor = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}  # n = 2
    for r in nccl[0]["results"]:
        assert r["seconds"] > 0 and r["algbw_gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor[r["op"]])
    assert {r["op"] for r in nccl[0]["results"]} == set(factor) and max(r["bytes"] for r in nccl[0]["results"]) == 2 ** 20

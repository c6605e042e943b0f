"""2 ranks on CUDA, read from the GPU check's launch plan (bench/plan/gpu_check.py) where a run is needed. On a
machine with one GPU the backends that can share it (the DDP family: ddp, ddp_spawn, ddp_amp_syncbn, ddp_zero,
allreduce_manual, each declaring --ranks-per-gpu) run 2 ranks on it over gloo, whose all-reduce, broadcast and
all-gather take CUDA tensors; NCCL refuses two ranks on one device, so FSDP2, DeepSpeed, Horovod, DataParallel and
NCCL's own collectives need 2 GPUs and skip with that reason (FSDP2 and DeepSpeed in fp16 at 2 GPUs:
tests/backends/test_fsdp2.py and test_deepspeed.py). Marked ``gpu``."""
import pytest
import torch

import backends
from bench.plan.gpu_check import shares_a_gpu
from tests.conftest import skip_without, two_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SHARED = torch.cuda.device_count() < 2  # one GPU: the two ranks share it, over gloo
DDP_FAMILY = [n for n in backends.names() if shares_a_gpu(n)]


@pytest.mark.parametrize("backend", DDP_FAMILY)
def test_ddp_family_at_two_ranks_keeps_identical_replicas(gpu_plan, backend):
    rec = gpu_plan.record(f"{backend}-2ranks", backend)
    assert rec["replicas_consistent"] is True and rec["global_batch"] == 32 and rec["world_size"] == 2
    devices = [(0, 0), (1, 0)] if SHARED else [(0, 0), (1, 1)]
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == devices
    assert all(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0 for m in rec["memory"])
    assert rec["cudnn_benchmark"] is True and len(rec["window_seconds"]) == 3
    assert rec["backend_info"]["process_group"] == ("gloo" if SHARED else "nccl")
    assert rec["options"] == ({"ranks_per_gpu": 2} if SHARED else {})
    if backend == "ddp_amp_syncbn":  # SyncBatchNorm's statistics over both ranks (gloo: all_gather of CUDA tensors)
        info = rec["backend_info"]
        assert (info["sync_batchnorm_layers"], info["grad_scaler"], info["autocast_dtype"]) == (20, True, "float16")


def two_gpu_record(gpu_plan, launch, backend):
    rec = gpu_plan.record(launch, backend)
    assert rec["replicas_consistent"] is True and rec["global_batch"] == 32 and rec["world_size"] == 2
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0), (1, 1)]
    assert all(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0 for m in rec["memory"])
    assert rec["backend_info"]["process_group"] == "nccl" and len(rec["window_seconds"]) == 3
    return rec


@two_gpus("DeepSpeed")
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_on_two_gpus_keeps_identical_replicas(gpu_plan, stage):
    skip_without("deepspeed")
    rec = two_gpu_record(gpu_plan, "deepspeed-2gpus-fp32", f"ds_zero{stage}")
    assert rec["precision"] == "fp32" and rec["backend_info"]["grad_scaler"] is False
    assert rec["backend_info"]["zero_stage"] == stage


@two_gpus("Horovod's NCCL build")
def test_horovod_nccl_on_two_gpus(gpu_plan):
    skip_without("horovod")
    rec = gpu_plan.record("horovod-2gpus", "horovod")
    assert rec["replicas_consistent"] is True and "NCCL" in rec["env"]["horovod"]["tensor_operations"]


# nn.DataParallel replicates over distinct devices: one GPU cannot stand in for two
DP_TWO_GPUS = "needs 2 CUDA devices: nn.DataParallel replicates the model over distinct GPUs"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=DP_TWO_GPUS)
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=DP_TWO_GPUS)
def test_dataparallel_on_two_gpus_shows_gpu0_load_and_runs_both_cudnn_settings(gpu_plan):
    skip_without("nvml")
    recs = {r["cudnn_benchmark"]: r for r in gpu_plan.records("dp-2gpus")}
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=DP_TWO_GPUS)
def test_dataparallel_energy_is_summed_over_its_gpus(gpu_plan):
    skip_without("nvml")
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
    # a span of over a second (the plan's dp-energy launch): NVML's counter moves every 20-100 ms
    rec = gpu_plan.record("dp-energy", "dp")
    assert rec["energy_reason"] is None
    span = rec["energy_span_seconds"]
    assert span > 1.0, "too short a span for the counter: lengthen the run"
    # both GPUs' counters over the whole span (test_measurement_gpu_fixes.py checks the span arithmetic): two GPUs,
    # one of them idle at worst, draw more than one GPU's idle floor
    assert rec["mean_watts"] == pytest.approx(rec["energy_total_joules"] / span, rel=0.01)
    assert 40 < rec["mean_watts"] < 4000
    assert rec["joules_per_image"] == pytest.approx(rec["energy_total_joules"] / (2 * 64 * 20 * 3))
    assert len(rec["energy_window_diagnostic"]["joules"]) == 3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices: it measures NCCL, which refuses "
                                                          "two ranks on one device")
def test_collectives_on_two_gpus_over_nccl(gpu_plan):
    recs = gpu_plan.records("collectives-2gpus")
    assert recs and all(r["status"] == "ok" and r["world_size"] == 2 and r["device_type"] == "cuda" for r in recs)
    nccl = [r for r in recs if r["process_group"] == "nccl"]
    assert nccl, [r["process_group"] for r in recs]
    factor = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}  # n = 2
    for r in nccl[0]["results"]:
        assert r["seconds"] > 0 and r["algbw_gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor[r["op"]])
    assert {r["op"] for r in nccl[0]["results"]} == set(factor) and max(r["bytes"] for r in nccl[0]["results"]) == 2 ** 20

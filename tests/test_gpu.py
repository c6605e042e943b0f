"""Every backend on one GPU, read from the GPU check's launch plan (bench/plan/gpu_check.py; the ``gpu_plan``
fixture of tests/conftest.py): at bf16 and fp16 with the memory probe, fp32 through ``bench verify``, and the
single-purpose runs (cuDNN's benchmark off, DDP's communication hooks). These tests start nothing: the plan ran every
launch once, several at once on the GPU, and they assert what ran, never how fast. Marked ``gpu``; each skips without
what it needs, with the reason.

The gpu tests live by subject: this module (one GPU), tests/test_gpu_two_ranks.py (2 ranks: on one GPU the DDP family
shares it over gloo; the rest needs 2 GPUs), and a gpu case in the subject's own file (the trace, a GPT's memory, the
GPU decoders, FSDP2 and DeepSpeed at 2 GPUs, ddp_amp_syncbn at bf16, the energy span).
"""
import pytest

import backends
from bench.plan import gpu_check as _gpu_plan
from bench.rank.faults import BLOAT_BYTES

pytestmark = [pytest.mark.gpu]
HALF = {"fp16": "float16", "bf16": "bfloat16"}
# what the plan's tiny runs are (its GPU_RUN): resnet18 at 64 px, batch 16, 3 windows of 3 steps
GPU_RUN = list(_gpu_plan.GPU_RUN)
PRECISIONS = [(name, p) for name in backends.names() for p in ("bf16", "fp16")]


def process_group(name: str) -> str | None:
    """NCCL for the backends torch.distributed starts (torchrun, mp.spawn); none in process or under horovodrun."""
    return "nccl" if backends.REGISTRY[name]["launcher"] in ("torchrun", "spawn") else None


def gpu_name() -> str:
    from bench.core import cuda

    return cuda.name(0)


@pytest.mark.parametrize("name,precision", PRECISIONS)
def test_every_backend_trains_on_one_gpu_at_bf16_and_fp16(gpu_plan, name, precision):
    rec = gpu_plan.record(f"{name}-{precision}", name)
    info = rec["backend_info"]
    assert rec["device_type"] == "cuda" and rec["cudnn_benchmark"] is True and rec["precision"] == precision
    assert info["process_group"] == process_group(name)
    assert info["grad_scaler"] is (precision == "fp16")  # GradScaler, or DeepSpeed's own loss scaler
    assert (rec["skipped_steps"] is not None) is (precision == "fp16")
    if precision == "fp16":
        assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
    assert rec["global_batch"] == 16 and rec["throughput"] > 0 and len(rec["window_seconds"]) == 3
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0)]
    assert info["autocast_dtype"] == HALF[precision] and info["optimizer_impl"] == (
        "foreach" if name == "fsdp2" else "fused")  # SGD on DTensors has no fused kernel
    if name == "fsdp2" or name.startswith("ds_"):  # like with like: fp32 parameters under autocast, as single
        assert info["param_dtype"] == "float32"
        single = gpu_plan.record(f"single-{precision}", "single")
        assert rec["numerics"]["signature"] == single["numerics"]["signature"]


@pytest.mark.parametrize("name", [n for n in backends.names() if n == "fsdp2" or n.startswith("ds_")])
def test_the_half_parameter_modes_run_with_their_own_loss_scaling(gpu_plan, name):
    """--fsdp-mp params / --ds-mp params: FSDP2's MixedPrecisionPolicy (BatchNorm kept in fp32), DeepSpeed's own fp16
    section and loss scaler."""
    rec = gpu_plan.record(f"{name}-params-fp16", name)
    info = rec["backend_info"]
    assert info["param_dtype"] == "float16" and info["grad_scaler"] is True
    assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])


@pytest.mark.parametrize("name", backends.names())
def test_memory_is_read_from_the_allocator_after_warmup(gpu_plan, name):
    rec = gpu_plan.record(f"{name}-bf16", name)
    [mem] = rec["memory"]
    assert mem["device_index"] == 0 and mem["device_name"] == gpu_name()
    assert mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"] > 0
    # the 256 MiB block held through the last warm-up step is in the warm-up peak and not in the timed one
    # (allocated: exactly on top of a steady step; reserved: less the allocator's rounding of segments)
    assert mem["warmup_peak_allocated_bytes"] - mem["peak_allocated_bytes"] > 0.9 * BLOAT_BYTES
    assert mem["warmup_peak_reserved_bytes"] - mem["peak_reserved_bytes"] > 0.5 * BLOAT_BYTES


@pytest.mark.parametrize("name", backends.names())
def test_nvml_answered_the_machine_watch_and_the_memory_reader(gpu_plan, name):
    from tests.conftest import skip_without

    skip_without("nvml")
    rec = gpu_plan.record(f"{name}-bf16", name)
    [mem] = rec["memory"]
    # NVML really read: the whole GPU's used memory holds at least this process's reservation
    assert mem["nvml_used_reason"] is None and mem["nvml_used_bytes"] >= mem["peak_reserved_bytes"]
    machine = rec["machine"]  # the harness's watch of the run's GPU (bench/launch/machine.py)
    assert machine["nvml"] == "ok" and [g["index"] for g in machine["gpus"]] == [0]
    assert machine["gpus"][0]["start"]["sm_mhz"] > 0 and machine["sampler_error"] is None


@pytest.mark.parametrize("name", backends.names())
def test_flops_mfu_and_energy_on_one_gpu(gpu_plan, name):
    from backends.models import flops
    from bench.core import mfu
    from tests.conftest import skip_without

    for precision in ("bf16", "fp16"):
        rec = gpu_plan.record(f"{name}-{precision}", name)
        assert rec["flops_per_sample"] == flops.flops_per_sample("resnet18", 64)
        peak, _ = mfu.peak_tflops(gpu_name(), precision)
        if peak:  # a GPU in the table: MFU is the achieved share of its dense peak
            assert rec["mfu"] == pytest.approx(rec["flops_per_sample"] * rec["throughput"] / (peak * 1e12))
            assert 0 < rec["mfu"] < 1
        skip_without("nvml")
        # NVML's energy counter read before the first window and after the last (Volta and newer)
        assert rec["energy_reason"] is None, rec["energy_reason"]
        assert rec["energy_total_joules"] >= 0  # a tiny run may fall within one tick of the counter


def test_fp16_gradscaler_and_syncbatchnorm_on_one_gpu(gpu_plan):
    rec = gpu_plan.record("ddp_amp_syncbn-fp16", "ddp_amp_syncbn")
    info = rec["backend_info"]
    assert info["sync_batchnorm_layers"] == 20  # resnet18's BatchNorm2d layers, converted
    assert info["grad_scaler"] is True and info["autocast_dtype"] == "float16"
    assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
    assert isinstance(rec["warmup_skipped_steps"], int)
    single16 = gpu_plan.record("single-fp16", "single")["backend_info"]
    assert single16["grad_scaler"] is True and single16["sync_batchnorm_layers"] == 0


def test_cudnn_benchmark_off_is_applied_and_recorded(gpu_plan):
    rec = gpu_plan.record("cudnn-off", "single")
    assert rec["cudnn_benchmark"] is False and rec["precision"] == "fp32"
    assert rec["throughput"] > 0 and len(rec["window_seconds"]) == 3 and rec["memory"][0]["peak_allocated_bytes"] > 0


def test_horovod_on_one_gpu(gpu_plan):
    rec = gpu_plan.record("horovod-fp16", "horovod")
    assert rec["backend_info"]["grad_scaler"] is True and len(rec["skipped_steps"]) == 3
    assert rec["precision"] == "fp16" and rec["throughput"] > 0 and rec["memory"][0]["device_index"] == 0


@pytest.mark.parametrize("hook", ["powersgd", "fp16"])
def test_powersgd_and_compression_hooks_run_on_nccl(gpu_plan, hook):
    rec = gpu_plan.record(f"ddp-hook-{hook}", "ddp")
    assert rec["backend_info"]["comm_hook"] == hook
    assert rec["backend_info"]["process_group"] == "nccl" and rec["throughput"] > 0
    assert len(rec["window_seconds"]) == 3 and all(t > 0 for t in rec["window_seconds"])


@pytest.mark.parametrize("group", range(1, _gpu_plan.VERIFY_GROUPS + 1))
def test_every_backend_passes_verify_on_one_gpu(gpu_plan, group):
    """fp32: every backend trains the model single trains (bench verify: K steps from one seed, compared with a
    single-process reference); a backend that cannot run here (DeepSpeed not installed) is listed as skipped."""
    name = f"verify-{group}"
    launch = gpu_plan.launch(name)
    [summary] = [r for r in gpu_plan.records(name) if r.get("kind") == "verify"]
    rows = {r["backend"]: r for r in summary["rows"]}
    assert set(rows) == set(launch["backends"])
    assert launch["rc"] == 0 and "FAIL" not in gpu_plan.log(name), gpu_plan.log(name)[-3000:]
    assert all(r["verdict"] in ("pass", "skipped") for r in rows.values()), rows
    assert summary["settings"]["device_type"] == "cuda" and summary["settings"]["steps"] == 8

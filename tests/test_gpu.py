"""CUDA paths (NCCL, several GPUs, NVML memory). Skipped without enough GPUs; run them on GPU runners."""
import pytest
import torch

from backends import horovod as hvd_backend
from tests.conftest import bench, records

GPU_RUN = ["--device", "cuda", "--model", "resnet18", "--image-size", "64", "--batch-size", "16",
           "--warmup", "3", "--steps", "3", "--windows", "3"]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
pytestmark = pytest.mark.gpu


@two_gpus
def test_dataparallel_on_two_gpus_shows_gpu0_load(results_dir):
    proc = bench("run", "--backends", "dp", "--gpus", 2, *GPU_RUN, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["global_batch"] == 32
    mem = rec["memory"]
    assert [m["device_index"] for m in mem] == [0, 1] and {m["rank"] for m in mem} == {0}
    assert all(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"] > 0 for m in mem)
    assert all(m["nvml_used_bytes"] is None or m["nvml_used_bytes"] >= m["peak_reserved_bytes"] for m in mem)
    # outputs are gathered and gradients reduced on GPU 0
    assert mem[0]["peak_allocated_bytes"] > mem[1]["peak_allocated_bytes"]
    assert rec["memory_imbalance"] > 1.0


@two_gpus
@pytest.mark.parametrize("backend", ["ddp", "ddp_spawn", "ddp_amp_syncbn"])
def test_nccl_backends_on_two_gpus_keep_identical_replicas(results_dir, backend):
    proc = bench("run", "--backends", backend, "--gpus", 2, *GPU_RUN, "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0), (1, 1)]
    assert rec["cudnn_benchmark"] is True and rec["env"]["nccl"]


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

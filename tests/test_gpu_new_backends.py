"""FSDP2, DeepSpeed ZeRO-1/2/3, ZeroRedundancyOptimizer and the hand-written all-reduce on one GPU, in fp16 (GradScaler
or DeepSpeed's own loss scaler) and bf16: each backend's own test, so one missing dependency (DeepSpeed) skips its
three with the reason and the others still count."""
import pytest
import torch

from tests.conftest import bench, records, skip_without
from tests.test_gpu import GPU_RUN

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
NEW = ("fsdp2", "ds_zero1", "ds_zero2", "ds_zero3", "ddp_zero", "allreduce_manual")
HALF = {"fp16": "float16", "bf16": "bfloat16"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One sweep per precision of every new backend that can run here (DeepSpeed only where it is installed)."""
    from tests.conftest import optional_problem

    names = [n for n in NEW if not (n.startswith("ds_") and optional_problem("deepspeed"))]
    out = {}
    for precision in HALF:
        raw = tmp_path_factory.mktemp(precision) / "raw"
        proc = bench("run", "--backends", ",".join(names), "--gpus", 1, *GPU_RUN, "--precision", precision,
                     "--results", raw)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out.update({(r["backend"], precision): r for r in records(raw)})
    return out


@pytest.mark.parametrize("precision", list(HALF))
@pytest.mark.parametrize("name", NEW)
def test_new_backend_in_mixed_precision_on_one_gpu(mixed, name, precision):
    if name.startswith("ds_"):
        skip_without("deepspeed")
    rec = mixed[(name, precision)]
    assert rec["status"] == "ok", rec["reason"]
    info = rec["backend_info"]
    assert info["process_group"] == "nccl" and info["grad_scaler"] is (precision == "fp16")
    assert (rec["skipped_steps"] is not None) is (precision == "fp16")
    assert rec["global_batch"] == 16 and rec["throughput"] > 0 and rec["precision"] == precision
    assert [(m["rank"], m["device_index"]) for m in rec["memory"]] == [(0, 0)]
    if name == "fsdp2" or name.startswith("ds_"):
        # FSDP2's MixedPrecisionPolicy (BatchNorm kept in fp32), DeepSpeed's own fp16/bf16 section
        assert info["param_dtype"] == HALF[precision]

"""ddp_amp_syncbn's own tests: on CPU its run is skipped with the reason (SyncBatchNorm refuses CPU modules), its
default precision recorded all the same; on a GPU, bf16 autocast with SyncBatchNorm and no GradScaler. The contract
(test_contract.py) checks its skip at 2 ranks."""
import pytest

from backends.ddp_amp_syncbn import SYNCBN_CPU
from tests.conftest import TINY, cli_error, records


def test_syncbn_backend_is_skipped_on_cpu_with_the_reason(results_dir, capsys):
    from bench.plan.sweep import parse_run, plan, skip_reason

    [cfg], _ = plan(parse_run(["--backends", "ddp_amp_syncbn", "--gpus", "1", *TINY]))
    assert skip_reason(cfg) == SYNCBN_CPU
    assert cfg.precision == "fp16"  # apex O1's default, planned (and recorded) even where it is skipped
    # alone in the plan, nothing would run: refused before launch with the reason (exit 2), no record
    code, err = cli_error(capsys, "run", "--backends", "ddp_amp_syncbn", "--gpus", 1, *TINY, "--results", results_dir)
    assert (code, err) == (2, f"bench: error: nothing to run: all 1 planned run would be skipped here (ddp_amp_syncbn: "
                              f"{SYNCBN_CPU})\n")
    assert records(results_dir) == []


@pytest.mark.gpu
def test_amp_syncbn_bf16_on_one_gpu(gpu_plan):
    """bf16 autocast with SyncBatchNorm and no GradScaler (the GPU check's ddp_amp_syncbn-bf16 launch; fp16 is covered
    by tests/test_gpu.py)."""
    rec = gpu_plan.record("ddp_amp_syncbn-bf16", "ddp_amp_syncbn")
    assert rec["precision"] == "bf16" and rec["device_type"] == "cuda"
    info = rec["backend_info"]
    assert (info["process_group"], info["autocast_dtype"], info["grad_scaler"]) == ("nccl", "bfloat16", False)
    assert info["sync_batchnorm_layers"] == 20 and rec["skipped_steps"] is None
    [mem] = rec["memory"]
    assert mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"] > 0

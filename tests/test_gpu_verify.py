"""Every backend trains the same model on one GPU (bench verify: K steps from one seed, compared with a
single-process reference); a backend that cannot run here (DeepSpeed not installed) is listed as skipped, not failed."""
import pytest
import torch

from tests.conftest import bench


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_backend_passes_verify_on_one_gpu(tmp_path):
    proc = bench("verify", "--gpus", 1, "--device", "cuda", "--steps", 8, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout

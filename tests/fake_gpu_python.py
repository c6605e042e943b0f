"""``python tests/fake_gpu_python.py -m bench ARGS``: ``bench`` on a fake machine of one H200 (tests/fake_gpu.py),
in this process, for a test that runs a script's ``$PY -m bench ...`` up to the first CUDA kernel. The processes bench
starts (ranks, launches, twins) are real and see no GPU: each stops at its first CUDA call."""
import runpy
import sys

import pytest

from tests.fake_gpu import FakeGpu, FakeGpuMachine

if sys.argv[1:3] != ["-m", "bench"]:
    sys.exit(f"usage: {sys.argv[0]} -m bench ARGS (got {sys.argv[1:3]})")
FakeGpuMachine([FakeGpu(name="NVIDIA H200", memory_bytes=141 * 1024 ** 3)]).install(pytest.MonkeyPatch())
sys.argv = ["bench", *sys.argv[3:]]
runpy.run_module("bench", run_name="__main__", alter_sys=True)

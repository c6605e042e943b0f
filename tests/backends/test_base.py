"""What every backend inherits from backends/base.py: fp16 on CPU is skipped with the reason, never faked; the one
rule for the dtype gradients are reduced in; the warm-up --compile needs. The contract every backend keeps is in
test_contract.py."""
import pytest
import torch

import backends
from tests.conftest import TINY, cli_error, records


def test_fp16_on_cpu_is_skipped_not_faked(results_dir, capsys):
    """Skipped with the reason (the planned run's ``unavailable``); a plan of nothing else is refused before launch
    with that reason (exit 2, issue 47: a sweep that measured nothing once exited 0), and no record is written."""
    from bench.commands._plan import parse_run, plan, skip_reason

    [cfg], _ = plan(parse_run(["--backends", "single", "--gpus", "1", *TINY, "--precision", "fp16"]))
    assert skip_reason(cfg) == "fp16 training needs CUDA (fp16 kernels and GradScaler); use --precision bf16 on CPU"
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, "--precision", "fp16", "--results",
                          results_dir)
    assert (code, err) == (2, "bench: error: nothing to run: all 1 planned run would be skipped here (single: fp16 "
                              "training needs CUDA (fp16 kernels and GradScaler); use --precision bf16 on CPU)\n")
    assert records(results_dir) == []


@pytest.mark.mutation
@pytest.mark.parametrize("options,expected", [
    ({}, "float32"), ({"ddp_comm_hook": "none"}, "float32"), ({"ddp_comm_hook": "fp16"}, "float16"),
    ({"ddp_comm_hook": "bf16"}, "bfloat16"), ({"compression": "fp16"}, "float16"), ({"compression": "none"}, "float32"),
    ({"ddp_comm_hook": "powersgd"}, "float32 (PowerSGD low-rank factors)")])
def test_grad_reduce_dtype_is_fp32_unless_a_knob_compresses(options, expected):
    b = backends.create("ddp")
    b.module, b.options = torch.nn.Linear(2, 2), options  # fp32 parameters, as under autocast
    assert b.grad_reduce_dtype() == expected


@pytest.mark.mutation
def test_single_reduces_no_gradient():
    assert backends.create("single").grad_reduce_dtype() is None


@pytest.mark.mutation
def test_compile_needs_a_longer_warmup(results_dir, capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, "--compile", "--results", results_dir)
    assert code == 2 and err == ("bench: error: --warmup 2 is too short for single: use at least 3 (torch.compile "
                                 "compiles at step 1 and may recompile at step 2)\n"), err

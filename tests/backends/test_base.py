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
    from bench.plan.sweep import parse_run, plan, skip_reason

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


# -- the optimizer as the field runs it (issue 46): fused where torch has a kernel for the parameters, else foreach ----

@pytest.mark.mutation
def test_the_optimizer_is_fused_where_torch_has_a_kernel_else_foreach_and_the_user_may_choose():
    from backends.base import implementation, make_optimizer, optimizer_impl
    from tests.fakes import cfg_for

    plain = [torch.nn.Parameter(torch.zeros(2))]
    sharded = torch.nn.Parameter(torch.zeros(2))
    sharded.placements = ()  # what marks a DTensor (FSDP2's shards) to implementation()
    for optimizer in ("sgd", "adamw"):
        opt = make_optimizer(cfg_for(optimizer=optimizer), plain)
        assert (opt.defaults["fused"], opt.defaults["foreach"]) == (True, None), optimizer
        assert optimizer_impl(opt) == "fused"
        chosen = make_optimizer(cfg_for(optimizer=optimizer, options={"optimizer_impl": "foreach"}), plain)
        assert (chosen.defaults["fused"], chosen.defaults["foreach"]) == (None, True) and optimizer_impl(chosen) == \
            "foreach"
    assert implementation("adamw", [sharded]) == "fused"  # aten._fused_adamw_ has a DTensor sharding rule
    assert implementation("sgd", [sharded]) == "foreach"  # aten._fused_sgd_ has none
    assert implementation("sgd", [sharded], "fused") == "fused"  # asked for: fsdp2.unavailable refuses it first
    loop = torch.optim.SGD(plain, lr=0.1, foreach=False)
    assert optimizer_impl(loop) == "for-loop"
    wrapper = type("Zero", (), {"optim": loop})()  # read through ZeroRedundancyOptimizer's or DeepSpeed's wrapper
    assert optimizer_impl(wrapper) == "for-loop"
    # Horovod's DistributedOptimizer: the class rebuilt from the param groups, its defaults the class's own
    fused = make_optimizer(cfg_for(optimizer="sgd"), plain)
    rebuilt = type(fused)(fused.param_groups)
    assert rebuilt.defaults.get("fused") is None and optimizer_impl(rebuilt) == "fused"


@pytest.mark.mutation
def test_fsdp2_refuses_fused_sgd_and_a_bad_implementation_is_one_line(capsys):
    from tests.fakes import cfg_for

    fsdp2 = backends.create("fsdp2")
    assert fsdp2.unavailable(cfg_for("fsdp2", optimizer="sgd", options={"optimizer_impl": "fused"})) == (
        "fsdp2 cannot run fused SGD: torch has no DTensor sharding rule for aten._fused_sgd_ (it has one for "
        "_fused_adamw_); use --optimizer-impl foreach, or --optimizer adamw")
    assert fsdp2.unavailable(cfg_for("fsdp2", optimizer="adamw", options={"optimizer_impl": "fused"})) is None
    assert backends.create("ddp").unavailable(cfg_for("ddp", optimizer="sgd", options={"optimizer_impl": "fused"})) \
        is None
    code, err = cli_error(capsys, "run", "--backends", "single", *TINY, "--optimizer-impl", "fast")
    assert (code, err) == (2, "bench: error: argument --optimizer-impl: invalid choice: 'fast' (choose from "
                              "'foreach', 'fused') (see python -m bench run --help)\n")

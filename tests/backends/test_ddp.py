"""ddp's own tests (ddp_spawn is the same class under mp.spawn): what DistributedDataParallel is built with for each
knob and hook (in process, DDP faked), and 2-rank runs of its knobs, bf16 autocast and hooks, and --compile, each read
back from the DistributedDataParallel object in the ranks. Its plain 2-rank runs are in test_contract.py."""
import pytest
import torch

import backends
from backends import ddp
from tests.conftest import TINY, bench_inproc, records, shared_run
from tests.fakes import built, cfg_for, fake_init, tiny_model


class FakeDDP(torch.nn.Module):
    """DistributedDataParallel's constructor and comm-hook registration, recorded."""

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module, self.kwargs, self.hooks = module, kwargs, []

    def register_comm_hook(self, state, hook):
        self.hooks.append((state, hook))


@pytest.mark.parametrize("options,expected,hook", [
    ({}, dict(bucket_cap_mb=None, static_graph=False, gradient_as_bucket_view=False, find_unused_parameters=False),
     "none"),
    ({"ddp_bucket_mb": 7, "ddp_static_graph": True, "ddp_grad_as_bucket_view": True, "ddp_find_unused": True,
      "ddp_comm_hook": "bf16"},
     dict(bucket_cap_mb=7, static_graph=True, gradient_as_bucket_view=True, find_unused_parameters=True), "bf16"),
])
@pytest.mark.mutation
def test_ddp_is_built_with_the_knobs_and_the_hook(monkeypatch, options, expected, hook):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = tiny_model()
    monkeypatch.setattr(ddp, "DistributedDataParallel", FakeDDP)
    monkeypatch.setattr(ddp, "build_model", built(model, "ddp"))
    b = backends.create("ddp")
    monkeypatch.setattr(b, "init_process_group", fake_init(b, "ddp", local_rank=1))
    prepared = []
    monkeypatch.setattr(b, "prepare_model", lambda cfg, m: prepared.append((cfg.backend, m)) or m)
    b.setup(cfg_for(options=options))
    assert isinstance(b.model, FakeDDP) and b.ddp is b.model and b.module is model and b.model.module is model
    assert b.model.kwargs == {"device_ids": None, **expected}  # CPU: no device ids
    assert b.comm_hook == hook and b.feed_batch == 3
    assert b.model.hooks == ([(None, default_hooks.bf16_compress_hook)] if hook == "bf16" else [])
    assert prepared == [("ddp", model)] and model.moved_to == torch.device("cpu")
    cuda = cfg_for(options=options)
    cuda.device_type = "cuda"  # the rest is faked: only what DDP is handed is checked
    monkeypatch.setattr(model, "to", lambda *a, **k: model)  # no GPU here: nothing moves
    monkeypatch.setattr(b, "init_process_group", fake_init(b, "ddp", local_rank=1, device=torch.device("cuda", 1)))
    b.setup(cuda)
    assert b.model.kwargs["device_ids"] == [1]  # this rank's own GPU


@pytest.mark.mutation
def test_ddp_comm_hooks_are_the_ones_named():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    def hooks(name):
        fake = FakeDDP(torch.nn.Linear(1, 1))
        ddp.register_comm_hook(fake, name)
        return fake.hooks

    assert hooks(None) == [] and hooks("none") == []
    assert hooks("fp16") == [(None, default_hooks.fp16_compress_hook)]
    assert hooks("bf16") == [(None, default_hooks.bf16_compress_hook)]
    [(state, hook)] = hooks("powersgd")
    assert hook is powerSGD_hook.powerSGD_hook and state.process_group is None
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (ddp.POWERSGD_RANK, ddp.POWERSGD_START) == (2, 2)
    with pytest.raises(ValueError, match="unknown DDP comm hook 'fp8'; choose from none, fp16, bf16, powersgd"):
        hooks("fp8")


# DDP with every knob that changes how DistributedDataParallel is built, and --trace (a flag of bench run, not a knob):
# one launch feeds the knob test here and tests/test_trace.py's traced run.
KNOBS = ["--ddp-bucket-mb", 1, "--ddp-static-graph", "--ddp-grad-as-bucket-view", "--ddp-comm-hook", "fp16",
         "--channels-last"]


def knobs_traced():
    """(results folder, output) of ``bench run --backends ddp,fsdp2 --gpus 2`` TINY with KNOBS and --trace 2, run once
    a session (tests/conftest.py, shared_run)."""
    return shared_run("ddp-knobs-traced", "run", "--backends", "ddp,fsdp2", "--gpus", 2, *TINY, *KNOBS, "--trace", 2)


@pytest.mark.slow
def test_ddp_knobs_are_applied_and_recorded_and_others_skip_with_the_reason():
    results_dir, proc = knobs_traced()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["backend"]: r for r in records(results_dir)}
    ddp = recs["ddp"]
    assert ddp["status"] == "ok" and ddp["replicas_consistent"] is True
    assert ddp["options"] == {"ddp_bucket_mb": 1.0, "ddp_static_graph": True, "ddp_grad_as_bucket_view": True,
                              "ddp_comm_hook": "fp16", "channels_last": True}
    info = ddp["backend_info"]  # read back from the DistributedDataParallel object
    assert (info["bucket_cap_mb"], info["static_graph"], info["gradient_as_bucket_view"], info["comm_hook"]) == (
        1.0, True, True, "fp16")
    assert recs["fsdp2"]["status"] == "skipped"
    assert recs["fsdp2"]["reason"] == ("fsdp2 cannot honour --ddp-bucket-mb, --ddp-comm-hook, "
                                       "--ddp-grad-as-bucket-view, --ddp-static-graph (it honours: "
                                       "--activation-checkpointing, --channels-last, --compile, "
                                       "--fsdp-blocks-per-group, --fsdp-mp, --fsdp-reshard, "
                                       "--optimizer-impl)")


@pytest.mark.slow
def test_bf16_autocast_find_unused_and_the_bf16_hook(results_dir):
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--precision", "bf16", "--ddp-find-unused",
                        "--ddp-comm-hook", "bf16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["precision"] == "bf16"  # CPU autocast: bf16 trains on CPU, fp16 is skipped
    assert rec["replicas_consistent"] is True and rec["throughput"] > 0
    assert rec["backend_info"]["autocast_dtype"] == "bfloat16" and rec["backend_info"]["grad_scaler"] is False
    assert rec["backend_info"]["find_unused_parameters"] is True and rec["backend_info"]["comm_hook"] == "bf16"
    # PowerSGD needs NCCL: on CPU it is a skip with the reason, before anything is launched; a plan of nothing else
    # is refused with that reason (exit 2) and writes no record
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--warmup", 4, "--ddp-comm-hook", "powersgd",
                        "--results", results_dir / "psgd")
    assert proc.returncode == 2 and proc.stderr.startswith("bench: error: nothing to run: all 1 planned run would be "
                                                           "skipped here (ddp: the PowerSGD hook needs NCCL"), proc.stderr
    assert records(results_dir / "psgd") == []
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--ddp-comm-hook", "powersgd",
                        "--results", results_dir / "x")
    assert proc.returncode == 2 and proc.stderr.startswith("bench: error: --warmup 2 is too short for ddp: use at "
                                                           "least 4 (PowerSGD runs plain all-reduce")


@pytest.mark.slow
def test_compile_happens_in_warmup_and_its_time_is_its_own_field(results_dir):
    """The compilation's accounting (the warm-up steps it slowed, no window), on the suite's small CNN: with inductor's
    cache empty, as on a fresh CI machine, DDP's compiled resnet18 took 60 s of CPU over 2 ranks and cnn-tiny 30 s."""
    small = [a if a != "resnet18" else "cnn-tiny" for a in TINY]
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *small, "--warmup", 3, "--compile", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True and rec["options"] == {"compile": True}
    steps = rec["warmup_step_seconds"]
    assert len(steps) == 3 and rec["compile_seconds"] > 0
    assert rec["compile_seconds"] == pytest.approx(sum(t - steps[-1] for t in steps[:-1] if t > steps[-1]))
    assert max(rec["window_seconds"]) < rec["compile_seconds"]  # the compilation is in no window

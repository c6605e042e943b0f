"""The backends people choose between today, and the knobs that decide DDP's speed: run for real with 2 gloo
ranks under torchrun, asserting what each backend was actually built with, not only that it ran."""
import json
from pathlib import Path

import pytest

from bench.commands import _maxbatch as maxbatch
from tests.conftest import TINY, TINY_WINDOWS, bench_inproc, cli_error, records

NEW = ("fsdp2", "ds_zero1", "ds_zero2", "ds_zero3", "ddp_zero", "allreduce_manual")


@pytest.fixture(scope="module")
def new_backends(tmp_path_factory):
    raw = tmp_path_factory.mktemp("new") / "raw"
    # --eval: FSDP2 all-gathers parameters in every forward, so 37 samples over 2 ranks (10 batches on one rank, 9 on
    # the other) hang until --timeout unless the padded batch runs masked; every new backend evaluates the same way
    # --trace 1: every new backend marks its phases for the profiler (tests/test_trace.py has the rest of --trace)
    # --channels-last: FSDP2 and DeepSpeed crashed at set-up on channels-last parameters (FSDP2 refuses them,
    # DeepSpeed views each one as bytes to broadcast it); they now keep NCHW parameters and channels-last inputs
    proc = bench_inproc("run", "--backends", ",".join(NEW), "--gpus", 2, *TINY, "--eval", "--eval-samples", 37,
                        "--trace", 1, "--channels-last", "--timeout", 240, "--results", raw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["backend"]: r for r in records(raw)}


@pytest.mark.slow
def test_new_backends_train_with_identical_full_replicas(new_backends):
    assert set(new_backends) == set(NEW)
    for name, rec in new_backends.items():
        assert rec["status"] == "ok", (name, rec["reason"])
        assert (rec["launcher"], rec["world_size"], rec["global_batch"]) == ("torchrun", 2, 4)
        assert rec["replicas_consistent"] is True, name  # checksums over full (gathered) parameters
        assert rec["backend_info"]["process_group"] == "gloo" and len(rec["window_seconds"]) == TINY_WINDOWS
        # distributed evaluation: every sample once (never the padded 38), sums all-reduced
        assert rec["eval"] is True and rec["eval_samples"] == 37, name
        assert rec["eval_loss"] > 0 and 0 <= rec["eval_accuracy"] <= 1 and rec["eval_throughput"] > 0
    # what --channels-last did, read from the tensors: NCHW parameters where the backend cannot hold NHWC ones (ZeRO-3
    # holds flat partitions: no 4-D parameter to read; ZeroRedundancyOptimizer's parameters_as_bucket_view makes each
    # parameter a view of its flat bucket), channels-last ones elsewhere; channels-last inputs everywhere
    layout = {name: rec["backend_info"]["channels_last"] for name, rec in new_backends.items()}
    assert layout == {"fsdp2": {"inputs": True, "parameters": "contiguous"},
                      "ds_zero1": {"inputs": True, "parameters": "contiguous"},
                      "ds_zero2": {"inputs": True, "parameters": "contiguous"},
                      "ds_zero3": {"inputs": True, "parameters": None},
                      "ddp_zero": {"inputs": True, "parameters": "contiguous"},
                      "allreduce_manual": {"inputs": True, "parameters": "channels_last"}}
    assert all(rec["options"]["channels_last"] is True for rec in new_backends.values())
    assert new_backends["fsdp2"]["backend_info"]["sharded_parameters"] == 62  # every resnet18 parameter a DTensor
    assert new_backends["fsdp2"]["backend_info"]["param_dtype"] == "float32"
    for stage in (1, 2, 3):
        assert new_backends[f"ds_zero{stage}"]["backend_info"]["zero_stage"] == stage
        # DDP's 25 MiB, not DeepSpeed's 5e8 elements (a 2 GB bucket allocated on every rank)
        assert new_backends[f"ds_zero{stage}"]["backend_info"]["bucket_elements"] == 25 * 2 ** 20 // 4
        assert new_backends[f"ds_zero{stage}"]["compute_only"] == {
            "measured": False, "keeps": None, "reason": "DeepSpeed's no_sync forbids engine.step() inside it and is "
                                                        "incompatible with ZeRO-2/3's gradient partitioning"}
    for name in ("fsdp2", "ddp_zero", "allreduce_manual"):
        assert new_backends[name]["compute_only"]["measured"] is True, name
        assert len(new_backends[name]["compute_only_window_seconds"]) == TINY_WINDOWS
    assert new_backends["fsdp2"]["compute_only"]["keeps"].startswith("the per-block parameter all-gathers")
    for name, rec in new_backends.items():  # --trace: a trace file per rank, and the phases each backend marks
        assert rec["profiler_in_windows"] is False and rec["trace"]["steps"] == 1, name
        assert [Path(f).is_file() for f in rec["trace"]["files"]] == [True, True], name
        own = {"all-reduce"} if name == "allreduce_manual" else set()
        assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == \
            [{"data", "forward", "backward", "optimizer", "other"} | own] * 2, name
    assert new_backends["ddp_zero"]["compute_only"]["keeps"].startswith("ZeroRedundancyOptimizer's broadcast")
    # what each rank holds, read from its own tensors: ZeRO-3 and FSDP2 shard the parameters over the 2 ranks, the
    # others keep a full replica (allreduce_manual: as DDP does); resnet18's 11.7 M fp32 parameters
    full = new_backends["allreduce_manual"]["state_bytes"]
    assert [s["parameters"] for s in full] == [4 * 11_689_512] * 2 and full[0]["gradients"] == 4 * 11_689_512
    for name in ("fsdp2", "ds_zero3"):
        held = [s["parameters"] for s in new_backends[name]["state_bytes"]]
        assert sum(held) == pytest.approx(4 * 11_689_512, rel=1e-3) and max(held) < 0.51 * 4 * 11_689_512, (name, held)
    for name in ("ds_zero1", "ds_zero2", "ddp_zero"):
        assert [s["parameters"] for s in new_backends[name]["state_bytes"]] == [4 * 11_689_512] * 2, name
    # SGD's momentum: ddp_zero keeps its share of it, the replicas all of it
    assert max(s["optimizer_state"] for s in new_backends["ddp_zero"]["state_bytes"]) < 0.6 * full[0]["optimizer_state"]


@pytest.mark.slow
def test_ddp_knobs_are_applied_and_recorded_and_others_skip_with_the_reason(results_dir):
    proc = bench_inproc("run", "--backends", "ddp,fsdp2", "--gpus", 2, *TINY, "--ddp-bucket-mb", 1, "--ddp-static-graph",
                        "--ddp-grad-as-bucket-view", "--ddp-comm-hook", "fp16", "--channels-last", "--results", results_dir)
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
                                       "--activation-checkpointing, --channels-last, --compile)")


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
    # PowerSGD needs NCCL: on CPU it is a skip with the reason, before anything is launched
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--warmup", 4, "--ddp-comm-hook", "powersgd",
                        "--results", results_dir / "psgd")
    [rec] = records(results_dir / "psgd")
    assert rec["status"] == "skipped" and rec["reason"].startswith("the PowerSGD hook needs NCCL")
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--ddp-comm-hook", "powersgd",
                        "--results", results_dir / "x")
    assert proc.returncode == 2 and proc.stderr.startswith("bench: error: warmup 2 is too short for ddp: use at "
                                                           "least 4 (PowerSGD runs plain all-reduce")


@pytest.mark.slow
def test_compile_happens_in_warmup_and_its_time_is_its_own_field(results_dir):
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, "--warmup", 3, "--compile", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True and rec["options"] == {"compile": True}
    steps = rec["warmup_step_seconds"]
    assert len(steps) == 3 and rec["compile_seconds"] > 0
    assert rec["compile_seconds"] == pytest.approx(sum(t - steps[-1] for t in steps[:-1] if t > steps[-1]))
    assert max(rec["window_seconds"]) < rec["compile_seconds"]  # the compilation is in no window


@pytest.mark.parametrize("args,message", [
    (["--compile"], "bench: error: warmup 2 is too short for single: use at least 3 (torch.compile compiles at "
                    "step 1 and may recompile at step 2)"),
    (["--ddp-bucket-mb", "0"], "bench: error: --ddp-bucket-mb must be a positive number, got 0"),
    (["--ds-bucket-mb", "-2"], "bench: error: --ds-bucket-mb must be a positive number, got -2"),
    (["--ddp-comm-hook", "zip"], "bench: error: argument --ddp-comm-hook: invalid choice: 'zip'"),
    (["--find-max-batch", "--max-batch", "0"], "bench: error: --max-batch must be a positive integer, got 0"),
    (["--find-max-batch", "--memory-limit-gib", "-1"], "bench: error: --memory-limit-gib -1: a positive number of "
                                                       "GiB, for CPU runs only"),
])
def test_knob_bad_input(results_dir, args, message, capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, *args, "--results", results_dir)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(message), err


# ---------------------------------------------------------------------------------------------------
# Memory headroom: the largest per-device batch that fits

class _Cfg:
    backend, world_size, precision, model, image_size, device_type, options = "ddp", 2, "fp32", "m", 8, "cpu", {}

    def __init__(self, batch):
        self.batch_size = batch


def _probe(limit, seen, error_at=None):
    def probe(batch):
        seen.append(batch)
        if batch == error_at:
            return {"status": "failed", "reason": "rank 1 exited with code 13", "run_id": str(batch)}
        ok = batch <= limit
        return {"status": "ok" if ok else "failed", "run_id": str(batch),
                "reason": None if ok else f"out of memory: batch {batch} per device"}
    return probe


@pytest.mark.parametrize("start,limit,cap,expected", [
    (8, 100, 4096, 96),     # double 8..128, then bisect to within 1/8: 96 fits, 112 does not
    (8, 1000, 64, 64),      # capped: nothing ran out of memory below the cap
    (64, 20, 4096, 20),     # the first probe does not fit: halve to 16, then bisect up
    (4, 0, 4096, None),     # not even batch 1 fits
])
def test_max_batch_search(start, limit, cap, expected):
    seen = []
    row = maxbatch.search(_Cfg(start), _probe(limit, seen), cap)
    assert row["max_batch"] == expected and row["error"] is None
    assert row["capped"] == (expected == cap)
    assert len(seen) == len(set(seen)) <= 12  # bounded, and no batch probed twice
    if expected and not row["capped"]:
        too_big = min(b for b in seen if b > limit)
        assert too_big - expected <= max(1, expected // maxbatch.RESOLUTION)


def test_max_batch_search_stops_on_a_failure_that_is_not_memory():
    row = maxbatch.search(_Cfg(8), _probe(1000, [], error_at=32), 4096)
    assert row["max_batch"] is None and row["error"] == "rank 1 exited with code 13"


@pytest.mark.slow
def test_find_max_batch_on_cpu_with_a_heap_budget(tmp_path):
    proc = bench_inproc("run", "--backends", "single", "--gpus", 1, "--device", "cpu", "--model", "resnet18",
                        "--image-size", 64, "--batch-size", 32, "--find-max-batch", "--memory-limit-gib", 0.5,
                        "--max-batch", 512, "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [summary] = (tmp_path / "maxbatch").glob("summary-*.json")
    [row] = json.loads(summary.read_text())["rows"]
    results = {p["batch"]: p["result"] for p in row["probes"]}
    assert "out of memory" in results.values() and not row["capped"]
    assert results[row["max_batch"]] == "fits" and 1 <= row["max_batch"] < 512
    assert all(r == "out of memory" for b, r in results.items() if b > row["max_batch"])
    assert "max batch per device:" in proc.stdout


def test_dataparallel_replicas_run_the_recorded_dtype_where_autocast_defaults_to_another():
    """parallel_apply re-enters autocast with no dtype in each replica's thread, so the wrapper must set the record's
    dtype itself. CPU autocast defaults to bf16, which a bf16 run cannot tell from no dtype at all: fp16 can. (On CPU
    dp is skipped at N > 1 and fp16 altogether; setup runs both, and setup is what this checks: B x N fed.)"""
    import threading

    import torch

    import backends
    from backends.dp import AutocastForward
    from bench.core.config import RunConfig

    dp = backends.create("dp")
    dp.setup(RunConfig(backend="dp", launcher="inproc", world_size=2, device_type="cpu", model="resnet18", image_size=8,
                       batch_size=3, warmup=2, steps=1, windows=1, precision="fp16").validate())
    assert dp.feed_batch == 6 and dp.device_ids is None and dp.devices() == [torch.device("cpu")]
    assert type(dp.model) is AutocastForward and dp.model.module is dp.module  # no DataParallel wrapper on CPU
    out = {}
    thread = threading.Thread(target=lambda: out.update(y=dp.model(torch.randn(2, 3, 8, 8))))  # a replica's thread
    thread.start()
    thread.join()
    with torch.autocast("cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # the default the wrapper must override
    assert out["y"].dtype == torch.float16 and dp.describe()["autocast_dtype"] == "float16"


def test_dataparallel_on_gpus_wraps_the_autocast_wrapper_over_every_device(monkeypatch):
    """The CUDA half of setup, with the GPUs faked: DataParallel over devices 0..N-1, around the autocast wrapper."""
    import torch

    import backends
    from backends import dp as dp_module
    from backends.dp import AutocastForward
    from bench.core.config import RunConfig

    class FakeDataParallel(torch.nn.Module):
        def __init__(self, module, device_ids=None):
            super().__init__()
            self.module, self.device_ids = module, device_ids

    class Model(torch.nn.Linear):
        def to(self, *args, **kwargs):
            self.moved_to = args[0]
            return super().to(*args, **kwargs)

    model, asked = Model(2, 2), []
    monkeypatch.setattr(torch.nn, "DataParallel", FakeDataParallel)
    monkeypatch.setattr(dp_module, "device_for", lambda cfg, index: asked.append(index) or torch.device("cpu"))
    monkeypatch.setattr(dp_module, "build_model", lambda cfg: model)
    dp = backends.create("dp")
    dp.setup(RunConfig(backend="dp", launcher="inproc", world_size=3, device_type="cuda", model="resnet18", image_size=8,
                       batch_size=2, warmup=2, steps=1, windows=1, precision="bf16").validate())
    assert asked == [0] and model.moved_to == torch.device("cpu") and dp.feed_batch == 6  # everything from GPU 0
    assert type(dp.model) is FakeDataParallel and dp.model.device_ids == [0, 1, 2] == dp.device_ids
    assert type(dp.model.module) is AutocastForward and dp.model.module.module is model is dp.module
    assert (dp.model.module.device_type, dp.model.module.dtype) == ("cuda", torch.bfloat16)
    assert dp.devices() == [torch.device("cuda", i) for i in range(3)]


def test_the_autocast_wrapper_passes_every_argument_on():
    import torch

    from backends.dp import AutocastForward

    class Scaled(torch.nn.Module):
        def forward(self, x, scale=1.0):
            return torch.nn.functional.linear(x, torch.eye(2)) * scale

    out = AutocastForward(Scaled(), "cpu", torch.bfloat16)(torch.ones(1, 2), scale=3.0)
    assert out.dtype == torch.bfloat16 and out.tolist() == [[3.0, 3.0]]


"""Issue 24, sharded backends and DeepSpeed: the compute-only windows of FSDP2 under a GradScaler, DeepSpeed's skipped
steps, the library defaults that tilt a comparison (DeepSpeed's timer, communication dtype, overlap and gradient
norm; ZeroRedundancyOptimizer's bucket view; FSDP2's norm groups and --compile), each recorded in backend_info and
shown in the report's "Backend settings" table.

The distributed checks run in one module fixture: 2 ranks over gloo (torch.multiprocessing.spawn), each backend set
up, stepped and torn down in turn, every rank writing what it saw; the tests assert on those files."""
import json
import os
import socket
import types
from pathlib import Path

import pytest
import torch

import backends
from backends import fsdp2 as fsdp2_module
from bench.core.config import RunConfig
from bench.rank import record, train
from tests.conftest import bench, records, skip_without, two_gpus



def tiny_cfg(backend: str, precision: str = "fp32", **options) -> RunConfig:
    return RunConfig(backend=backend, launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                     image_size=32, batch_size=2, warmup=2, steps=2, windows=1, precision=precision, options=options)


def synthetic(rank: int):
    g = torch.Generator().manual_seed(rank)
    while True:
        yield torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 1000, (2,), generator=g)


def fsdp_groups(model: torch.nn.Module) -> list[list[str]]:
    """The FSDP parameter groups of ``model`` (one per fully_shard call), each as the names of its modules."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(m): n for n, m in model.named_modules()}
    states = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            states.setdefault(id(state), []).append(names[id(m)])
    return list(states.values())


def _fsdp2_compute_only_with_a_scaler(rank: int) -> dict:
    """fp32 FSDP2 with a CPU GradScaler (the fp16 mechanism, which needs CUDA for its kernels): one real step, then
    one step inside the compute-only context."""
    b = backends.create("fsdp2")
    b.setup(tiny_cfg("fsdp2"))
    try:
        b.scaler = torch.amp.GradScaler("cpu")
        b.batches = synthetic(rank)
        b.train(1)
        with b.skip_gradient_sync():
            try:
                b.train(1)
            except Exception as e:  # noqa: BLE001 - the message is what the test asserts
                return {"error": f"{type(e).__name__}: {e}"}
        params = list(b.module.parameters())
        return {"error": None, "params": len(params),
                "sharded_grads": sum(type(p.grad).__name__ == "DTensor" and p.grad.to_local().shape == p.to_local().shape
                                     for p in params if p.grad is not None),
                "momentum_buffers": sum("momentum_buffer" in b.optimizer.state[p] for p in params),
                "scale": float(b.scaler.get_scale()),
                "reduce_grads_restored": all(g.reduce_grads for m in b.module.modules()
                                             if hasattr(m, "_get_fsdp_state")
                                             for g in m._get_fsdp_state()._fsdp_param_groups)}
    finally:
        b.teardown()


def _fsdp2_norm_groups_and_compile(rank: int) -> dict:
    """resnet18 sharded under the torch <= 2.14 path (no param_dtype_override_fn) at bf16, and FSDP2 set up with
    --compile (nothing is compiled until a forward, which this does not run)."""
    from torch.distributed.device_mesh import init_device_mesh

    b = backends.create("fsdp2")
    b.setup(tiny_cfg("fsdp2", compile=True))
    try:
        out = {"compiled_blocks": [n for n, m in b.module.named_modules() if getattr(m, "_compiled_call_impl", None)],
               "root_compiled": type(b.model).__name__ == "OptimizedModule",
               "compile": b.describe()["compile"]}
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=1000)
        fsdp2_module.has_param_dtype_override = lambda: False  # this process only
        via = fsdp2_module.shard(model, init_device_mesh("cpu", (2,)), torch.bfloat16)
        out.update(via=via, groups=fsdp_groups(model))
        return out
    finally:
        b.teardown()


def _ddp_zero(rank: int) -> dict:
    b = backends.create("ddp_zero")
    b.setup(tiny_cfg("ddp_zero"))
    try:
        b.batches = synthetic(rank)
        b.train(2)
        info = b.describe()
        return {"bucket_view": info["parameters_as_bucket_view"], "grad_reduce_dtype": info["grad_reduce_dtype"],
                "checksum": record.param_checksum(b.full_parameters())}
    finally:
        b.teardown()


def _ds_zero2_bf16(rank: int) -> dict:
    b = backends.create("ds_zero2")
    b.unavailable(tiny_cfg("ds_zero2", "bf16"))  # sets DS_ACCELERATOR=cpu before deepspeed is imported
    b.setup(tiny_cfg("ds_zero2", "bf16"))
    try:
        b.batches = synthetic(rank)
        b.train(2)
        info = b.describe()
        keys = ("grad_reduce_dtype", "overlap_comm", "grad_norm", "throughput_timer", "wall_clock_breakdown",
                "param_dtype")
        return {**{k: info[k] for k in keys}, "skipped_steps": b.skipped_steps(),
                "checksum": record.param_checksum(b.full_parameters())}
    finally:
        b.teardown()


PARTS = {"fsdp2_compute_only": _fsdp2_compute_only_with_a_scaler, "fsdp2_groups": _fsdp2_norm_groups_and_compile,
         "ddp_zero": _ddp_zero, "ds_zero2": _ds_zero2_bf16}


def _rank_main(rank: int, ports: list[int], out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    seen = {}
    for (name, part), port in zip(PARTS.items(), ports):
        os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous per process group (reusing one hung DDP's init)
        try:
            seen[name] = part(rank)
        except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
            seen[name] = {"crashed": f"{type(e).__name__}: {e}"}
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fairness")
    ports = []
    for _ in PARTS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    torch.multiprocessing.spawn(_rank_main, args=(ports, str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


# -- item 1: FSDP2's compute-only windows under a GradScaler ----------------------------------------------------------

@pytest.mark.slow
def test_fsdp2_compute_only_step_gives_the_scaler_sharded_grads(two_ranks):
    for rank in two_ranks:
        seen = rank["fsdp2_compute_only"]
        # without local grads GradScaler.step raised "No inf checks were recorded for this optimizer."
        assert seen["error"] is None
        assert seen["sharded_grads"] == seen["params"] == 62  # every resnet18 parameter, shard-shaped
        assert seen["momentum_buffers"] == 62  # the step did the optimizer's arithmetic
        assert seen["scale"] == 2.0 ** 16  # zeros are finite: no skip recorded
        assert seen["reduce_grads_restored"] is True


@two_gpus("FSDP2")
@pytest.mark.gpu
def test_fsdp2_fp16_on_two_gpus_measures_compute_only(results_dir):
    proc = bench("run", "--backends", "fsdp2", "--gpus", 2, "--device", "cuda", "--model", "resnet18",
                 "--image-size", "64", "--batch-size", "16", "--warmup", "3", "--steps", "3", "--windows", "3",
                 "--precision", "fp16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = records(results_dir)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["backend_info"]["grad_scaler"] is True and rec["backend_info"]["param_dtype"] == "float16"
    assert rec["compute_only"]["measured"] is True and len(rec["compute_only_window_seconds"]) == 3
    assert rec["replicas_consistent"] is True


@two_gpus("DeepSpeed")
@pytest.mark.gpu
def test_deepspeed_fp16_on_two_gpus_reduces_in_fp32_and_counts_its_skips(results_dir):
    skip_without("deepspeed")
    proc = bench("run", "--backends", "ds_zero1,ds_zero2,ds_zero3", "--gpus", 2, "--device", "cuda", "--model",
                 "resnet18", "--image-size", "64", "--batch-size", "16", "--warmup", "3", "--steps", "3",
                 "--windows", "3", "--precision", "fp16", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["backend"]: r for r in records(results_dir)}
    for stage in (1, 2, 3):
        rec = recs[f"ds_zero{stage}"]
        assert rec["status"] == "ok", rec["reason"]
        info = rec["backend_info"]
        assert (info["grad_reduce_dtype"], info["overlap_comm"], info["throughput_timer"]) == ("float32", True, "off")
        assert info["grad_norm"] == ("computed" if stage == 3 else "skipped")
        assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
        assert rec["replicas_consistent"] is True


# -- item 16 and --compile: FSDP2's groups ----------------------------------------------------------------------------

@pytest.mark.slow
def test_fsdp2_old_torch_groups_each_blocks_norms_together(two_ranks):
    seen = two_ranks[0]["fsdp2_groups"]
    assert seen["via"] == "fully_shard per block's BatchNorms"
    norm_groups = [g for g in seen["groups"] if all(".bn" in n or n.startswith("bn") or "downsample.1" in n for n in g)]
    # resnet18: the stem's bn1, then per BasicBlock its bn1, bn2 (and downsample's norm): 9 groups, not 20
    assert norm_groups[0] == ["bn1"]
    assert norm_groups[1] == ["layer1.0.bn1", "layer1.0.bn2"]
    assert norm_groups[3] == ["layer2.0.bn1", "layer2.0.bn2", "layer2.0.downsample.1"]
    assert len(norm_groups) == 9 and sum(map(len, norm_groups)) == 20
    assert len(seen["groups"]) == 9 + 8 + 1  # norm groups, blocks, root


def test_norm_groups_follow_the_blocks():
    import torchvision

    model = torchvision.models.resnet18()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    groups = fsdp2_module.norm_groups(norms, fsdp2_module.blocks(model))
    assert [len(g) for g in groups] == [2, 2, 3, 2, 3, 2, 3, 2, 1]  # eight blocks, then the stem's bn1
    assert groups[-1] == [model.bn1] and groups[2] == [model.layer2[0].bn1, model.layer2[0].bn2,
                                                        model.layer2[0].downsample[1]]


@pytest.mark.slow
def test_fsdp2_compile_compiles_each_block_not_the_root(two_ranks):
    seen = two_ranks[0]["fsdp2_groups"]
    assert seen["compile"] == "per block"
    assert seen["root_compiled"] is False
    assert seen["compiled_blocks"] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


# -- item 14: ZeroRedundancyOptimizer's bucket view -------------------------------------------------------------------

@pytest.mark.slow
def test_ddp_zero_broadcasts_bucket_views(two_ranks):
    for rank in two_ranks:
        assert rank["ddp_zero"]["bucket_view"] is True
        assert rank["ddp_zero"]["grad_reduce_dtype"] == "float32"
    assert two_ranks[0]["ddp_zero"]["checksum"] == two_ranks[1]["ddp_zero"]["checksum"]


# -- items 11-13: DeepSpeed's generated config, read back from a real engine ------------------------------------------

@pytest.mark.slow
def test_deepspeed_engine_runs_with_the_fair_settings(two_ranks):
    for rank in two_ranks:
        assert rank["ds_zero2"] == {
            "grad_reduce_dtype": "float32",  # DeepSpeed's default at bf16 is bfloat16
            "overlap_comm": True, "grad_norm": "skipped", "throughput_timer": "off", "wall_clock_breakdown": False,
            "param_dtype": "bfloat16", "skipped_steps": 0, "checksum": two_ranks[0]["ds_zero2"]["checksum"]}


def deepspeed_config(monkeypatch, stage: int, precision: str) -> dict:
    """The config ds_zero<stage> hands deepspeed.initialize (stopped there: no process group, no engine)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed

    class Handed(Exception):
        pass

    def initialize(**kwargs):
        raise Handed(kwargs["config"])

    b = backends.create(f"ds_zero{stage}")
    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(b, "init_process_group", lambda cfg: setattr(b, "device", torch.device("cpu")))
    b.world_size = 2
    with pytest.raises(Handed) as e:
        b.setup(tiny_cfg(f"ds_zero{stage}", precision))
    return e.value.args[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_config_parsed_by_deepspeed(monkeypatch, stage):
    """DeepSpeed's own parsers read the generated config (their defaults are what the config must override)."""
    from deepspeed.runtime.config import get_communication_data_type
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.utils.config import get_timers_config

    config = deepspeed_config(monkeypatch, stage, "fp16")
    timers = get_timers_config(config)
    assert (timers.enabled, timers.synchronized) == (False, False)
    assert get_communication_data_type(config) == torch.float32
    zero = DeepSpeedZeroConfig(**config["zero_optimization"])
    assert zero.overlap_comm is True
    assert zero.compute_grad_norm is (stage == 3)  # stage 3 has no switch (DeepSpeed refuses it there)
    assert config["wall_clock_breakdown"] is False and config["gradient_clipping"] == 0.0


# -- item 8: DeepSpeed's skipped steps --------------------------------------------------------------------------------

class HysteresisEngine:
    """DeepSpeed's engine and fp16 optimizer, reduced to what the harness reads: every step overflows, and the loss
    scale halves only on every second overflow (DynamicLossScaler, hysteresis 2)."""

    def __init__(self):
        self.skipped_steps, self.cur_scale, self.overflows = 0, 2.0 ** 16, 0

    def fp16_enabled(self):
        return True

    def overflow_step(self):
        self.skipped_steps += 1
        self.overflows += 1
        if self.overflows % 2 == 0:
            self.cur_scale /= 2


def test_deepspeed_skipped_steps_are_its_own_count_not_the_scale_ratio():
    b = backends.create("ds_zero1")
    engine = HysteresisEngine()
    b.engine, b.optimizer = engine, engine  # loss_scale reads optimizer.cur_scale
    b.train = lambda steps: [engine.overflow_step() for _ in range(steps)]
    b.batches, b.barrier = None, lambda: None  # no process group here
    cfg = types.SimpleNamespace(windows=3, steps=4)
    meter = types.SimpleNamespace(read=lambda: None)
    out = train.windows(b, cfg, lambda: None, meter, waited=False)
    assert out["skipped"] == [4, 4, 4]  # the scale ratio says [2, 2, 2]
    assert b.skipped_steps() == 12


def test_gradscaler_backends_keep_the_scale_ratio():
    assert backends.create("ddp").skipped_steps() is None
    assert train.skips(2.0 ** 16, 2.0 ** 14) == 2
    assert train.skips(2.0 ** 16, 2.0 ** 15, 3, 7) == 4  # a count, where the backend keeps one, wins
    assert train.skips(None, None, 3, 7) is None  # no loss scale: no fp16, nothing recorded


# -- item 12: one reduction dtype rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("options,expected", [
    ({}, "float32"), ({"ddp_comm_hook": "none"}, "float32"), ({"ddp_comm_hook": "fp16"}, "float16"),
    ({"ddp_comm_hook": "bf16"}, "bfloat16"), ({"compression": "fp16"}, "float16"), ({"compression": "none"}, "float32"),
    ({"ddp_comm_hook": "powersgd"}, "float32 (PowerSGD low-rank factors)")])
def test_grad_reduce_dtype_is_fp32_unless_a_knob_compresses(options, expected):
    b = backends.create("ddp")
    b.module, b.options = torch.nn.Linear(2, 2), options  # fp32 parameters, as under autocast
    assert b.grad_reduce_dtype() == expected


# -- the report's settings table ---------------------------------------------------------------------------------------

def test_report_shows_the_settings_table_in_markdown_and_html(tmp_path, capsys):
    from tests.test_report import make, run_report, write

    infos = {
        "ddp": {"grad_reduce_dtype": "float32", "bucket_cap_mb": 25.0, "compile": None},
        "ds_zero2": {"grad_reduce_dtype": "float32", "overlap_comm": True, "bucket_elements": 25 * 2 ** 20 // 4,
                     "grad_norm": "skipped", "throughput_timer": "off"},
        "ddp_zero": {"grad_reduce_dtype": "float32", "bucket_cap_mb": 25.0, "parameters_as_bucket_view": True},
        "fsdp2": {"grad_reduce_dtype": "float32", "norm_fp32_via": "fully_shard per block's BatchNorms",
                  "compile": "per block"},
    }
    recs = [make(name, 2, 100.0, precision="bf16", backend_info=info) for name, info in infos.items()]
    recs.append(make("ddp", 2, 120.0, precision="bf16", options={"ddp_comm_hook": "fp16"},
                     backend_info={"grad_reduce_dtype": "float16", "bucket_cap_mb": 25.0}))
    code, _ = run_report(write(tmp_path, *recs), tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    table = md.split("## Backend settings\n", 1)[1].split("\n\n")[1].splitlines()
    assert table[0] == ("| backend | precision | grad reduce dtype | overlap comm | bucket | grad norm | throughput timer "
                        "| params as bucket view | norms fp32 via | compile |")
    assert table[2:] == [
        "| ddp (ddp_comm_hook=fp16) | bf16 | float16 | — | 25 MiB | — | — | — | — | — |",
        "| ddp | bf16 | float32 | — | 25 MiB | — | — | — | — | — |",
        "| ddp_zero | bf16 | float32 | — | 25 MiB | — | — | on | — | — |",
        "| ds_zero2 | bf16 | float32 | on | 25 MiB | skipped | off | — | — | — |",
        "| fsdp2 | bf16 | float32 | — | — | — | — | — | fully_shard per block's BatchNorms | per block |"]
    html = (tmp_path / "rep" / "REPORT.html").read_text()
    assert '<section id="s-backend-settings">' in html
    assert "<td>fully_shard per block's BatchNorms</td>" in html and "<th>params as bucket view</th>" in html


def test_single_reduces_no_gradient():
    import backends

    assert backends.create("single").grad_reduce_dtype() is None

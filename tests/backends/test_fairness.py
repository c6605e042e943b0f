"""The library defaults that tilt a comparison between backends, set on purpose and read back from 2 real ranks: FSDP2's
compute-only step under a GradScaler and the unsharded gradients it must not keep, its norm groups and per-block
--compile; ZeroRedundancyOptimizer's bucket view; DeepSpeed's timer, communication dtype, overlap and gradient norm.
Each is recorded in backend_info and shown in the report's "Backend settings" table (tests/test_report.py).

The distributed checks run in one module fixture: 2 ranks over gloo (torch.multiprocessing.spawn), each backend set
up, stepped and torn down in turn, every rank writing what it saw; the tests assert on those files. Each backend's
in-process tests are in its own file (test_fsdp2.py, test_deepspeed.py, ...)."""
import json
import os
import time
from pathlib import Path

import pytest
import torch

import backends
from backends import fsdp2 as fsdp2_module
from bench.core.config import RunConfig
from bench.core.results import write_json_atomic
from bench.launch.run import free_port
from bench.rank import data, entry, record


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


def _held(model) -> int:
    """Bytes of unsharded gradients FSDP2 holds right now."""
    return sum(p._unsharded_param.grad.numel() * p._unsharded_param.grad.element_size()
               for p in fsdp2_module.fsdp_params(model)
               if getattr(p, "_unsharded_param", None) is not None and p._unsharded_param.grad is not None)


def _fsdp2_held(rank: int, drop: bool = True) -> dict:
    """The unsharded gradients FSDP2 holds after real steps and between compute-only steps, the backend as the harness
    drives it (its batches from bench/rank/data.py); ``drop=False``: the code before the fix (this call only)."""
    cfg = RunConfig(backend="fsdp2", launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    fixed = fsdp2_module.drop_unsharded_grads
    if not drop:
        fsdp2_module.drop_unsharded_grads = lambda model: 0
    b = backends.create("fsdp2")
    try:
        b.setup(cfg)
        b.batches = data.batches_for(cfg, b)
        b.train(2)
        held = {"real": _held(b.module), "compute_only": []}
        with b.skip_gradient_sync():
            for _ in range(3):
                b.train(1)
                held["compute_only"].append(_held(b.module))
        b.train(1)
        held["real_after"] = _held(b.module)
        held["params_bytes"] = sum(p.numel() * 4 for _, p in b.full_parameters())
        return held
    finally:
        fsdp2_module.drop_unsharded_grads = fixed
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
        via, count = fsdp2_module.shard(model, init_device_mesh("cpu", (2,)), torch.bfloat16)
        out.update(via=via, groups=fsdp_groups(model), count=count)
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
    """--ds-mp params (DeepSpeed's bf16 section, whose communication dtype defaults to the model's), then in the same
    process group the default (its torch_autocast section, which by default marks every Linear and Conv parameter to
    be reduced in bf16: torch_autocast.py comm_dtype). In this order: DeepSpeed keeps a process-wide flag once autocast
    is initialised, and caches its groups (a second process group would not do)."""
    from deepspeed.runtime.torch_autocast import get_comm_dtype

    b = backends.create("ds_zero2")
    b.unavailable(tiny_cfg("ds_zero2", "bf16"))  # sets DS_ACCELERATOR=cpu before deepspeed is imported
    b.setup(tiny_cfg("ds_zero2", "bf16", ds_mp="params"))
    try:
        b.batches = synthetic(rank)
        b.train(2)
        info = b.describe()
        keys = ("grad_reduce_dtype", "overlap_comm", "grad_norm", "throughput_timer", "wall_clock_breakdown",
                "param_dtype")
        params = {**{k: info[k] for k in keys}, "skipped_steps": b.skipped_steps(),
                  "checksum": record.param_checksum(b.full_parameters())}
        a = backends.create("ds_zero2")
        a.setup(tiny_cfg("ds_zero2", "bf16"))  # the process group exists: setup keeps it
        a.batches = synthetic(rank)
        a.train(2)
        info = a.describe()
        return {"params": params,
                "autocast": {"comm_dtypes": sorted({str(get_comm_dtype(p)) for p in a.module.parameters()}),
                             "buckets": sorted(str(d) for d in a.optimizer.ipg_buckets),
                             **{k: info[k] for k in ("grad_reduce_dtype", "param_dtype", "autocast_dtype",
                                                     "optimizer_impl")},
                             "checksum": record.param_checksum(a.full_parameters())}}
    finally:
        b.teardown()


# In this order: fsdp2_groups leaves FSDP2's old-torch path set in the process, and DeepSpeed keeps process-wide state.
PARTS = {"fsdp2_compute_only": _fsdp2_compute_only_with_a_scaler, "fsdp2_held": _fsdp2_held,
         "fsdp2_held_before_fix": lambda rank: _fsdp2_held(rank, drop=False),
         "fsdp2_groups": _fsdp2_norm_groups_and_compile, "ddp_zero": _ddp_zero, "ds_zero2": _ds_zero2_bf16}


RANKS_TIMEOUT_S = 300  # a guard against a hang only: the two ranks take 20-40 s on this 2-core VM beside the other worker


def _port(name: str, rank: int, out: str) -> int:
    """A part's rendezvous port (a fresh one per process group: reusing one hung DDP's init): rank 0 asks the kernel
    for a free port as the part starts and leaves it in a file for rank 1. Ports the parent picked before the spawn
    waited up to a minute for their part while the other test worker's runs opened and closed hundreds of sockets;
    one `make test` here hung in this fixture until pytest's 600-s timeout, a rank still waiting on its store."""
    path = Path(out, f"port-{name}.json")
    if rank == 0:
        port = free_port()
        write_json_atomic(port, path)  # whole or absent for rank 1
        return port
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 never chose a port for {name}")
        time.sleep(0.05)
    return json.loads(path.read_text())


def _rank_main(rank: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    seen = {}
    for name, part in PARTS.items():
        with open(Path(out, f"rank{rank}.progress"), "a") as f:
            f.write(f"{name}\n")  # what a hang was in, should the fixture's deadline pass
        os.environ["MASTER_PORT"] = str(_port(name, rank, out))
        try:
            seen[name] = part(rank)
        except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
            seen[name] = {"crashed": f"{type(e).__name__}: {e}"}
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    entry.exit_done()  # as the harness's ranks end: torch's Gloo may abort at interpreter shutdown (1 run in 10 here)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fairness")
    ranks = torch.multiprocessing.spawn(_rank_main, args=(str(out),), nprocs=2, join=False)
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            last = [(out / f"rank{r}.progress").read_text().split()[-1:] if (out / f"rank{r}.progress").exists()
                    else [] for r in (0, 1)]
            pytest.fail(f"the two ranks did not finish in {RANKS_TIMEOUT_S} s; the part each was in: {last}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


# -- FSDP2's compute-only windows under a GradScaler -------------------------------------------------------------------

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


# -- FSDP2's compute-only windows hold no unsharded gradients ----------------------------------------------------------
# (bench/rank/train.py's reference without gradient synchronisation): under set_requires_gradient_sync(False) FSDP2
# keeps and accumulates them, which made compute-only steps heavier than real ones and could run a --find-max-model
# probe out of memory after its real steps fitted.

@pytest.mark.slow
def test_compute_only_steps_hold_no_unsharded_gradients(two_ranks):
    for rank in two_ranks:
        held = rank["fsdp2_held"]
        assert held["real"] == 0 and held["real_after"] == 0  # a real step reduce-scatters and frees them
        assert held["compute_only"] == [0, 0, 0]  # flat: nothing held between compute-only steps
        before = rank["fsdp2_held_before_fix"]  # without the fix: the whole model's gradients, every step
        assert before["compute_only"][0] >= 0.99 * before["params_bytes"] and min(before["compute_only"]) > 0


# -- FSDP2's groups and --compile --------------------------------------------------------------------------------------

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
    assert len(seen["groups"]) == seen["count"] == 9 + 8 + 1  # norm groups, blocks, root


@pytest.mark.slow
def test_fsdp2_compile_compiles_each_block_not_the_root(two_ranks):
    seen = two_ranks[0]["fsdp2_groups"]
    assert seen["compile"] == "per block"
    assert seen["root_compiled"] is False
    assert seen["compiled_blocks"] == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


# -- ZeroRedundancyOptimizer's bucket view -----------------------------------------------------------------------------

@pytest.mark.slow
def test_ddp_zero_broadcasts_bucket_views(two_ranks):
    for rank in two_ranks:
        assert rank["ddp_zero"]["bucket_view"] is True
        assert rank["ddp_zero"]["grad_reduce_dtype"] == "float32"
    assert two_ranks[0]["ddp_zero"]["checksum"] == two_ranks[1]["ddp_zero"]["checksum"]


# -- DeepSpeed's generated config, read back from a real engine --------------------------------------------------------

@pytest.mark.slow
def test_deepspeed_engine_runs_with_the_fair_settings(two_ranks):
    for rank in two_ranks:
        assert rank["ds_zero2"]["params"] == {
            "grad_reduce_dtype": "float32",  # DeepSpeed's default at bf16 is bfloat16
            "overlap_comm": True, "grad_norm": "skipped", "throughput_timer": "off", "wall_clock_breakdown": False,
            "param_dtype": "bfloat16", "skipped_steps": 0, "checksum": two_ranks[0]["ds_zero2"]["params"]["checksum"]}


@pytest.mark.slow
def test_deepspeed_autocast_reduces_every_gradient_in_fp32(two_ranks):
    for rank in two_ranks:
        assert rank["ds_zero2"]["autocast"] == {
            "comm_dtypes": ["torch.float32"],  # DeepSpeed's default would mark the convs and the linear bfloat16
            "buckets": ["torch.float32"], "grad_reduce_dtype": "float32", "param_dtype": "float32",
            "autocast_dtype": "bfloat16", "optimizer_impl": "fused",
            "checksum": two_ranks[0]["ds_zero2"]["autocast"]["checksum"]}


# -- the rule: every backend runs as its library ships it, or says why (docs/backends.md, "The rule") ----------------

def _default_configs(name: str):
    backend = backends.create(name)
    for world_size in (1, 2):
        for precision in ("fp32", "bf16"):
            yield RunConfig(backend=name, launcher=backend.launcher, world_size=world_size, device_type="cpu",
                            model="gpt-micro", image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1,
                            precision=precision).validate()


@pytest.mark.slow  # imports DeepSpeed and Horovod to read their defaults: seconds of CPU, nothing launched
@pytest.mark.parametrize("name", backends.names())
def test_every_departure_from_a_library_default_has_its_reason_in_the_registry(name):
    """Each backend's settings (what it hands its library, ``library_settings``) against the library's own defaults
    (``library_defaults``, read from the library's signatures and configuration classes) at its default configuration:
    every setting that differs is named in its registry entry with a reason, and every reason there is for a setting
    that still differs (a reason left behind by a change would explain nothing)."""
    from tests.conftest import skip_without

    if name == "horovod":
        skip_without("horovod")
    if name.startswith("ds_zero"):
        skip_without("deepspeed")
    departed = set()
    for cfg in _default_configs(name):
        departed |= set(backends.create(name).departures(cfg))
    reasons = backends.departs(name)
    assert departed <= set(reasons), (f"{name} departs from its library's default without a reason in "
                                      f"backends/__init__.py: {sorted(departed - set(reasons))}")
    assert set(reasons) <= departed, (f"{name}'s registry gives reasons for settings at their library's default: "
                                      f"{sorted(set(reasons) - departed)}")
    assert all(len(why) > 20 for why in reasons.values()), reasons


def test_ddp_and_horovod_run_at_their_libraries_defaults():
    """The rule's plainest case, read without a library: DDP hands DistributedDataParallel only what a knob asks."""
    ddp = backends.create("ddp")
    cfg = next(_default_configs("ddp"))
    assert ddp.library_settings(cfg) == {"bucket_cap_mb": None, "static_graph": False, "gradient_as_bucket_view": False,
                                         "find_unused_parameters": False}
    assert ddp.departures(cfg) == {} and backends.departs("ddp") == {} and backends.departs("horovod") == {}
    asked = RunConfig(**{**cfg.to_dict(), "options": {"ddp_bucket_mb": 5.0, "ddp_static_graph": True}})
    assert ddp.departures(asked) == {"bucket_cap_mb": {"library": None, "ours": 5.0},
                                     "static_graph": {"library": False, "ours": True}}

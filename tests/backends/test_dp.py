"""dp's own tests (nn.DataParallel), in process: the replicas run the recorded autocast dtype in their own threads,
setup feeds B x N and wraps the autocast wrapper in DataParallel over every GPU (GPUs faked), the wrapper passes
every argument on, and the knobs it cannot honour skip its run with the reason. On CPU dp runs at world size 1 only; that run, and its skip at 2, are in test_contract.py."""
import threading

import pytest
import torch

import backends
from backends.dp import ReplicaForward
from bench.core.config import RunConfig

pytestmark = pytest.mark.mutation


def _in_new_thread(fn):
    """Call ``fn`` in a fresh thread, as torch.nn.parallel.parallel_apply calls each replica."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(value=fn()))
    thread.start()
    thread.join()
    return out["value"]


def test_dataparallel_replicas_run_the_recorded_dtype_where_autocast_defaults_to_another():
    """parallel_apply re-enters autocast with no dtype in each replica's thread, so the wrapper must set the record's
    dtype itself. CPU autocast defaults to bf16, which a bf16 run cannot tell from no dtype at all: fp16 can. (On CPU
    dp is skipped at N > 1 and fp16 altogether; setup runs both, and setup is what this checks: B x N fed.)"""
    dp = backends.create("dp")
    dp.setup(RunConfig(backend="dp", launcher="inproc", world_size=2, device_type="cpu", model="resnet18", image_size=8,
                       batch_size=3, warmup=2, steps=1, windows=1, precision="fp16").validate())
    assert dp.feed_batch == 6 and dp.device_ids is None and dp.devices() == [torch.device("cpu")]
    assert type(dp.model) is ReplicaForward and dp.model.module is dp.module  # no DataParallel wrapper on CPU
    x = torch.randn(2, 3, 8, 8)
    # autocast state is per thread: a new thread starts without it, as parallel_apply's replica threads do
    assert _in_new_thread(lambda: dp.module(x)).dtype == torch.float32
    assert _in_new_thread(lambda: dp.model(x)).dtype == torch.float16
    with torch.autocast("cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # the default the wrapper must override
    assert dp.describe()["autocast_dtype"] == "float16"
    # the optimizer steps the very parameters the wrapper calls, and the checksum reads the bare model
    assert {id(p) for g in dp.optimizer.param_groups for p in g["params"]} == {id(p) for p in dp.model.parameters()}
    assert not any(n.startswith("module.") for n, _ in dp.module.named_parameters())


def test_dataparallel_on_gpus_wraps_the_autocast_wrapper_over_every_device(monkeypatch):
    """The CUDA half of setup, with the GPUs faked: DataParallel over devices 0..N-1, around the autocast wrapper."""
    from backends import dp as dp_module

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
    assert type(dp.model.module) is ReplicaForward and dp.model.module.module is model is dp.module
    assert (dp.model.module.device_type, dp.model.module.dtype) == ("cuda", torch.bfloat16)
    assert dp.devices() == [torch.device("cuda", i) for i in range(3)]


def test_the_autocast_wrapper_passes_every_argument_on():
    class Scaled(torch.nn.Module):
        def forward(self, x, scale=1.0):
            return torch.nn.functional.linear(x, torch.eye(2)) * scale

    out = ReplicaForward(Scaled(), "cpu", torch.bfloat16)(torch.ones(1, 2), scale=3.0)
    assert out.dtype == torch.bfloat16 and out.tolist() == [[3.0, 3.0]]


def _cfg(**kw):
    base = dict(backend="dp", launcher="inproc", world_size=2, device_type="cuda", model="resnet18", image_size=32,
                batch_size=2, warmup=3, steps=2, windows=3)
    return RunConfig(**{**base, **kw})


@pytest.mark.parametrize("options,reason", [
    ({"compile": True}, "dp cannot honour --compile: torch.compile cannot trace nn.DataParallel's per-step "
                        "replicate and replica threads, and compiling the inner model would be bypassed (it would "
                        "run eager)"),
    ({"channels_last": True}, "dp cannot honour --channels-last: nn.DataParallel's replicate() gives replicas "
                              "1..N-1 contiguous weights (broadcast_coalesced), so their convolutions would convert "
                              "every weight on every step"),
])
def test_dp_refuses_compile_and_channels_last_with_the_reason(options, reason):
    dp = backends.create("dp")
    assert dp.unavailable(_cfg(options=options)) == reason
    assert dp.unavailable(_cfg(options=options, world_size=1, device_type="cpu")) == reason
    assert dp.unavailable(_cfg(options={k: False for k in options})) is None  # switched off: nothing to refuse
    assert backends.create("ddp").unavailable(_cfg(backend="ddp", launcher="torchrun", options=options)) is None


class ThreadedDataParallel(torch.nn.Module):
    """nn.DataParallel's forward at two GPUs, on the CPU: the batch split in two, the wrapper replicated as
    ``replicate`` does (``_replicate_for_data_parallel``: a shallow copy of its attributes, the model inside shared)
    and torch's own ``parallel_apply`` running each replica in a thread of its own; the outputs gathered. What
    parallel_apply asks torch.accelerator (it asserts one) is answered for the CPU while it runs; ``started`` names
    the threads that entered a replica's device."""

    def __init__(self, module):
        super().__init__()
        self.module, self.started = module, []

    def forward(self, x):
        import contextlib
        from unittest import mock

        from torch.nn.parallel import parallel_apply

        replicas = [self.module._replicate_for_data_parallel() for _ in range(2)]
        enter = lambda i: self.started.append(threading.current_thread().name) or contextlib.nullcontext()  # noqa: E731
        with mock.patch.multiple(torch.accelerator, is_available=lambda: True, device_index=enter,
                                 current_accelerator=lambda *a, **k: torch.device("cpu"),
                                 current_stream=lambda *a, **k: contextlib.nullcontext()):
            return torch.cat(parallel_apply(replicas, [(c,) for c in x.chunk(2)], devices=[0, 1]))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_numerics_probe_sees_every_replica_thread_and_reads_what_single_reads(precision):
    """At two or more GPUs parallel_apply runs each replica's forward in a new thread, where the probe's dispatch mode
    (per thread) is not: dp read "loss float32, residual float32" against single's full signature, and the verdict
    found no like-for-like winner at any world size >= 2 with dp in the sweep. Each replica thread enters a watch of
    its own (Backend.replica_contexts), so dp's threaded forward reads what single's reads."""
    from bench.rank import data
    from bench.rank.numerics import probe

    got = {}
    for name in ("single", "dp"):
        b = backends.create(name)
        cfg = RunConfig(backend=name, launcher="inproc", world_size=1, device_type="cpu", model="gpt-micro",
                        image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1,
                        precision=precision).validate()
        b.setup(cfg)
        if name == "dp":
            b.model = ThreadedDataParallel(b.model)
        b.batches = data.batches_for(cfg, b)
        got[name] = probe(b)
    started = b.model.started
    assert len(started) == 2 and threading.current_thread().name not in started  # two replica threads ran it
    assert got["dp"]["signature"] == got["single"]["signature"]
    assert got["single"]["matmul"] == ("bfloat16" if precision == "bf16" else "float32")
    assert got["single"]["norm"] == got["single"]["residual"] == "float32"
    assert b.replica_contexts == []  # the probe leaves nothing behind in the replicas

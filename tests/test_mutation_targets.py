"""Fast, in-process tests of the code where a silent change corrupts numbers: the gradient reduction of the backends,
the data shards, the timed loop's arithmetic, the record, the statistics and the gate. Written against the mutants
`make mutation` (README: "Mutation testing") found alive; each test pins values, not just types.

Nothing here starts a process group, launches a run or trains more than a few steps of a tiny model: collectives are
replaced by fakes that behave as the other rank would, so the arithmetic around them is checked exactly."""
import contextlib
import copy
import hashlib
import json
import math
import types
import warnings

import numpy as np
import pytest
import scipy.stats  # noqa: F401
import torch
import torch._dynamo  # noqa: F401
import torch.nn.functional as F
import torchvision  # noqa: F401

import backends
from backends import allreduce_manual, ddp, deepspeed_zero, fsdp2
from backends.base import SGD
from bench.commands import compare
from bench.core import stats
from bench.core.config import RunConfig
from bench.rank import data, record, train
from bench.rank.loaders import tv

# scipy.stats (the gate's tests), torch._dynamo (imported by an optimizer's first step) and torchvision (build_model)
# are imported above, at collection, on purpose: `make mutation` forks every mutant's test run from a process that
# collected the tests and ran none, so what collection imports is paid once, not seconds per mutant.


def cfg_for(backend="ddp", launcher="torchrun", world_size=2, batch_size=3, **over):
    return RunConfig(backend=backend, launcher=launcher, world_size=world_size, device_type="cpu", model="resnet18",
                     image_size=8, batch_size=batch_size, warmup=2, steps=1, windows=1, **over).validate()


class Moved:
    """A model that remembers where ``.to`` moved it: on CPU, ``.to(None)`` and ``.to(cpu)`` look alike."""

    moved_to = "never"

    def to(self, *args, **kwargs):
        self.moved_to = args[0] if args else kwargs.get("device")
        return super().to(*args, **kwargs)


class Tiny(Moved, torch.nn.Sequential):
    pass


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return Tiny(torch.nn.Flatten(), torch.nn.Linear(12, 5))


def built(model, name):
    """backends' build_model, handing out ``model`` for a config of backend ``name`` only."""
    def build_model(cfg):
        assert cfg.backend == name, cfg
        return model

    return build_model


def fake_init(b, name, local_rank=0, device=torch.device("cpu")):
    """DDP.init_process_group without a process group: rank 0 of 2, on the CPU (or ``device``, which nothing here
    touches)."""
    def init_process_group(cfg):
        assert cfg.backend == name, cfg
        b.rank, b.world_size, b.local_rank, b.device = 0, 2, local_rank, device

    return init_process_group


def tiny_batches(n, batch=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 2, 2, generator=gen), torch.randint(0, 5, (batch,), generator=gen)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------
# Gradient reduction

class OtherRank:
    """``torch.distributed`` as rank 0 of 2 sees it, in this one process: every all-reduce adds rank 1's gradient
    (a fixed tensor per call), every broadcast records its source."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self):
        self.reduced, self.sources, self.broadcast_tensors = 0, [], []

    @staticmethod
    def gradient(k, like):
        return torch.full_like(like, 0.25 * (k + 1))

    def all_reduce(self, tensor, op=None):
        assert op == torch.distributed.ReduceOp.SUM, op
        tensor.add_(self.gradient(self.reduced, tensor))
        self.reduced += 1

    def broadcast(self, tensor, src=None):
        self.sources.append(src)
        self.broadcast_tensors.append(tensor)


def test_allreduce_manual_averages_every_gradient_over_the_ranks(monkeypatch):
    model = tiny_model()
    reference = copy.deepcopy(model)
    fake = OtherRank()
    monkeypatch.setattr(allreduce_manual, "dist", fake)
    monkeypatch.setattr(allreduce_manual, "build_model", built(model, "allreduce_manual"))
    b = backends.create("allreduce_manual")
    monkeypatch.setattr(b, "init_process_group", fake_init(b, "allreduce_manual"))
    b.setup(cfg_for("allreduce_manual"))
    assert fake.sources == [0] * len(list(model.parameters()))  # every parameter from rank 0
    assert [t.data_ptr() for t in fake.broadcast_tensors] == [p.data_ptr() for p in model.parameters()]
    assert b.feed_batch == 3 and b.module is model and model.moved_to == torch.device("cpu")
    batches = tiny_batches(2)
    b.batches = iter(batches)
    ref_opt = torch.optim.SGD(reference.parameters(), **SGD)
    n = len(list(model.parameters()))
    for step, (x, y) in enumerate(batches):  # two steps: gradients must not accumulate across steps
        loss = b.step()
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        for k, p in enumerate(reference.parameters()):
            p.grad = (p.grad + OtherRank.gradient(step * n + k, p.grad)) / 2  # the mean of the two ranks' gradients
        ref_opt.step()
        assert not loss.requires_grad and torch.equal(loss, ref_loss.detach())
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    assert fake.reduced == 2 * n  # one all-reduce per tensor per step

    with b.skip_gradient_sync():  # the compute-only reference: local gradients, no all-reduce
        assert b.sync is False
        b.batches = iter(tiny_batches(1))
        b.step()
    assert fake.reduced == 2 * n and b.sync is True
    b.batches = iter(tiny_batches(1))
    b.step()
    assert fake.reduced == 3 * n  # synchronised again after the context

    marks = []  # bench run --trace: the phases of a step, with the all-reduces inside their own

    @contextlib.contextmanager
    def marker(name):
        marks.append((name, fake.reduced))
        yield
        marks.append(("/" + name, fake.reduced))

    b.phase_marker, b.batches = marker, iter(tiny_batches(1))
    b.step()
    assert [m for m, _ in marks] == ["data", "/data", "forward", "/forward", "backward", "/backward", "all-reduce",
                                     "/all-reduce", "optimizer", "/optimizer"]
    assert (dict(marks)["all-reduce"], dict(marks)["/all-reduce"]) == (3 * n, 4 * n)


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


# -- FSDP2: which dtypes the parameters are gathered and the gradients reduced in

class NormModel(Moved, torch.nn.Sequential):
    pass


def norm_model():
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    return NormModel(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), BasicBlock(4, 4), BasicBlock(4, 4),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5))


def shard_calls(monkeypatch, model, dtype, override=True, compile=False):
    import torch.distributed.fsdp as fsdp_module

    calls, mesh = [], object()

    def fully_shard(module, mesh=None, mp_policy=None):
        calls.append((module, mesh, mp_policy))

    monkeypatch.setattr(fsdp_module, "fully_shard", fully_shard)
    monkeypatch.setattr(fsdp2, "has_param_dtype_override", lambda: override)
    for block in fsdp2.blocks(model):
        monkeypatch.setattr(block, "compile", lambda block=block: calls.append(("compiled", block)))
    via = fsdp2.shard(model, mesh, dtype, compile=True) if compile else fsdp2.shard(model, mesh, dtype)
    assert all(c[1] is mesh for c in calls if c[0] != "compiled")
    return via, calls


def test_fsdp2_gathers_in_the_half_dtype_reduces_in_fp32_and_keeps_norms_fp32(monkeypatch):
    model = norm_model()
    blocks = [model[2], model[3]]
    via, calls = shard_calls(monkeypatch, model, torch.bfloat16)
    assert via == "param_dtype_override_fn"
    assert [c[0] for c in calls] == blocks + [model]  # every block, then the root
    for _, _, policy in calls:
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
        norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()}
        assert {policy.param_dtype_override_fn(p) for p in model.parameters() if id(p) in norms} == {torch.float32}
        assert {policy.param_dtype_override_fn(p) for p in model.parameters() if id(p) not in norms} == {None}
    assert [c[2].output_dtype for c in calls] == [None, None, torch.float32]  # fp32 logits from the root only


def test_fsdp2_on_old_torch_shards_each_blocks_norms_in_fp32_first(monkeypatch):
    model = norm_model()
    via, calls = shard_calls(monkeypatch, model, torch.float16, override=False)
    assert via == "fully_shard per block's BatchNorms"
    groups = [[model[2].bn1, model[2].bn2], [model[3].bn1, model[3].bn2], [model[1]]]  # blocks' norms, then the rest
    assert [c[0] for c in calls] == groups + [model[2], model[3], model]
    for _, _, policy in calls[:3]:
        assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (torch.float32, torch.float32,
                                                                                          False)
    for _, _, policy in calls[3:]:
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.float16, torch.float32)
        assert policy.param_dtype_override_fn is None


def test_fsdp2_fp32_has_no_policy_and_compiles_each_block_before_sharding_it(monkeypatch):
    model = norm_model()
    via, calls = shard_calls(monkeypatch, model, None, compile=True)
    assert via is None
    b1, b2 = model[2], model[3]
    assert [(c[0] if c[0] == "compiled" else "shard", c[1] if c[0] == "compiled" else c[0]) for c in calls] == [
        ("compiled", b1), ("shard", b1), ("compiled", b2), ("shard", b2), ("shard", model)]
    for policy in (c[2] for c in calls if c[0] != "compiled"):
        assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (None, None, None)


def test_fsdp2_norm_groups_and_blocks():
    model = norm_model()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert fsdp2.norm_groups(norms, [model[2], model[3]]) == [[model[2].bn1, model[2].bn2],
                                                              [model[3].bn1, model[3].bn2], [model[1]]]
    assert fsdp2.norm_groups(norms[1:], [model[3], model[2]]) == [[model[3].bn1, model[3].bn2],
                                                                  [model[2].bn1, model[2].bn2]]
    assert fsdp2.blocks(model) == [model[2], model[3]]
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    assert fsdp2.blocks(plain) == [plain[0], plain[2]]  # no residual blocks: the children holding parameters


def test_fsdp2_compute_only_step_gives_unreduced_parameters_a_local_zero_gradient():
    """In the compute-only windows FSDP2 leaves the sharded gradients None; the step must still update every
    parameter as a real step would (momentum, weight decay): with a local zero where the gradient is None, and with
    its own gradient everywhere else."""
    class WithUnused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = tiny_model(), torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.used(x)

    b = backends.create("fsdp2")
    b.device = torch.device("cpu")
    b.init_training(cfg_for("fsdp2"), WithUnused(), 3)
    b.compute_only, b.zero_grads = True, None
    reference = copy.deepcopy(b.module)
    ref_opt = torch.optim.SGD(reference.parameters(), **SGD)
    batches = tiny_batches(2)
    b.batches = iter(batches)
    for x, y in batches:
        loss = b.step()
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        for p in reference.unused.parameters():
            p.grad = torch.zeros_like(p)
        ref_opt.step()
        assert torch.equal(loss, ref_loss.detach())
        for p, q in zip(b.module.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert not any(torch.equal(p, q) for p, q in zip(b.module.unused.parameters(), WithUnused().unused.parameters()))


# -- DeepSpeed: the config it is handed, and what the harness reads back

class Handed(Exception):
    pass


def deepspeed_setup(monkeypatch, stage, precision, options=None, engine=None, device_type="cpu"):
    import deepspeed

    model = norm_model()
    seen = {}

    def initialize(model=None, optimizer=None, config=None, dist_init_required=None):
        seen.update(model=model, optimizer=optimizer, config=config, dist_init_required=dist_init_required)
        if engine is None:
            raise Handed()
        return engine(model), "the optimizer", None, None

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(deepspeed_zero, "build_model", built(model, f"ds_zero{stage}"))
    b = backends.create(f"ds_zero{stage}")
    monkeypatch.setattr(b, "init_process_group", fake_init(b, f"ds_zero{stage}"))
    cfg = cfg_for(f"ds_zero{stage}", precision=precision, options=options or {})
    cfg.device_type = device_type
    try:
        b.setup(cfg)
    except Handed:
        pass
    assert model.moved_to == torch.device("cpu")
    return b, seen, model


@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_gets_the_suites_config(monkeypatch, stage):
    _, seen, model = deepspeed_setup(monkeypatch, stage, "bf16", options={"ds_bucket_mb": 2})
    elements = 2 * 2 ** 20 // 4
    zero = {"stage": stage, "reduce_bucket_size": elements, "allgather_bucket_size": elements, "overlap_comm": True}
    if stage == 1:
        zero["compute_grad_norm"] = False
    assert seen["config"] == {
        "train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
        "zero_optimization": zero, "communication_data_type": "fp32",
        "timers": {"throughput": {"enabled": False, "synchronized": False}}, "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0, "fp16": {"enabled": False, "initial_scale_power": 16}, "bf16": {"enabled": True},
        "steps_per_print": 2 ** 31 - 1, "wall_clock_breakdown": False}
    assert seen["model"] is model and seen["dist_init_required"] is False
    opt = seen["optimizer"]
    assert type(opt) is torch.optim.SGD and {k: opt.defaults[k] for k in SGD} == SGD
    assert [p for g in opt.param_groups for p in g["params"]] == list(model.parameters())


def test_deepspeed_default_buckets_and_what_the_harness_reads_back(monkeypatch):
    class Engine:
        """What deepspeed.initialize returns, with its bf16 cast of the parameters (not the buffers)."""

        def __init__(self, model):
            self.module = torch.nn.Module.to(model, torch.bfloat16)  # not Moved.to: where setup moved it stays
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean, m.running_var = m.running_mean.float(), m.running_var.float()

    b, seen, model = deepspeed_setup(monkeypatch, 2, "bf16", engine=Engine)
    assert seen["config"]["zero_optimization"]["reduce_bucket_size"] == 25 * 2 ** 20 // 4 == b.bucket_elements
    assert seen["config"]["fp16"]["enabled"] is False
    assert isinstance(b.engine, Engine) and b.model is b.engine and b.module is model and b.optimizer == "the optimizer"
    assert b.buffers_cast == 2 * 5  # running mean and variance of each of the 5 BatchNorms
    assert b.autocast_dtype is None and b.scaler is None and b.device_type == "cpu"
    assert b.feed_batch == 3 and b.data_device == torch.device("cpu") and b.input_dtype == torch.bfloat16
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "fp16")
    assert seen["config"]["fp16"] == {"enabled": True, "initial_scale_power": 16} and seen["config"]["bf16"] == {
        "enabled": False}
    b, _, _ = deepspeed_setup(monkeypatch, 2, "fp32", engine=lambda model: types.SimpleNamespace(module=model))
    assert b.input_dtype == torch.float32 and b.buffers_cast == 0
    b, _, _ = deepspeed_setup(monkeypatch, 2, "fp16", engine=lambda model: types.SimpleNamespace(module=model))
    assert b.input_dtype == torch.float16


def test_deepspeed_is_told_to_use_the_cpu_only_on_cpu(monkeypatch):
    import os

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    deepspeed_setup(monkeypatch, 1, "fp32", device_type="cuda")
    assert "DS_ACCELERATOR" not in os.environ
    deepspeed_setup(monkeypatch, 1, "fp32")
    assert os.environ["DS_ACCELERATOR"] == "cpu"


def test_deepspeed_loss_scale_only_under_fp16():
    b = backends.create("ds_zero1")
    b.optimizer = types.SimpleNamespace(cur_scale=1024)
    b.engine = types.SimpleNamespace(fp16_enabled=lambda: False, skipped_steps=3)
    assert b.loss_scale() is None and b.skipped_steps() == 3
    b.engine.fp16_enabled = lambda: True
    assert b.loss_scale() == 1024.0 and isinstance(b.loss_scale(), float)
    b.engine = types.SimpleNamespace(skipped_steps=5)  # an engine without fp16 at all
    assert b.loss_scale() is None and b.skipped_steps() == 5


# ---------------------------------------------------------------------------------------------------
# Data shards

def test_verify_batches_hand_each_rank_its_distributed_sampler_share_of_one_seeded_set():
    from torch.utils.data import DistributedSampler

    global_batch, world, steps, size, seed = 4, 2, 3, 2, 5
    n = global_batch * steps
    gen = torch.Generator().manual_seed(3000 + seed)  # the set: bench verify's reference reads the same one
    images = torch.randn(n, 3, size, size, generator=gen)
    labels = torch.randint(0, 1000, (n,), generator=gen)
    cpu = torch.device("cpu")
    everything = list(data.verify_batches(global_batch, world, steps, size, seed, cpu, rank=None))
    assert len(everything) == steps
    for rank in range(world):
        order = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed))
        mine = list(data.verify_batches(global_batch, world, steps, size, seed, cpu, rank=rank))
        assert len(mine) == steps
        for k, (x, y) in enumerate(mine):
            idx = order[k * 2:(k + 1) * 2]  # this rank's share of step k
            assert torch.equal(x, images[idx]) and torch.equal(y, labels[idx])
            # DataParallel's whole batch is the ranks' shares one after the other: replica r gets rank r's share
            assert torch.equal(everything[k][0][rank * 2:(rank + 1) * 2], x)
            assert torch.equal(everything[k][1][rank * 2:(rank + 1) * 2], y)
    assert everything[0][0].shape == (4, 3, 2, 2)
    meta = torch.device("meta")
    assert {t.device for batch in data.verify_batches(global_batch, world, steps, size, seed, meta, rank=0)
            for t in batch} == {meta}
    other = next(data.verify_batches(global_batch, world, steps, size, seed + 1, cpu, rank=0))[0]
    assert not torch.equal(other, next(data.verify_batches(global_batch, world, steps, size, seed, cpu, rank=0))[0])


def test_loader_workers_per_device_and_the_default(monkeypatch):
    monkeypatch.setattr(data, "usable_cpus", lambda: 10)
    for workers, feeds, expected in [(None, 4, 0), (0, 4, 0), (2, 1, 2), (2, 3, 6), (4, 3, 10)]:
        assert data.loader_workers(types.SimpleNamespace(workers=workers), feeds) == expected, (workers, feeds)
    # each device's share of the cores, one left for its training process, at most 8, never negative
    assert [data.default_workers(d) for d in (0, 1, 2, 3, 5, 10, 11)] == [8, 8, 4, 2, 1, 0, 0]
    monkeypatch.setattr(data, "usable_cpus", lambda: 64)
    assert data.default_workers(4) == 8 and data.default_workers(8) == 7


def test_synthetic_batches_differ_by_shard_rank_and_stay_fixed():
    cpu = torch.device("cpu")
    rank0 = data.synthetic(3, 4, cpu, rank=0)
    x, y = next(rank0)
    assert x.shape == (3, 3, 4, 4) and y.shape == (3,) and y.dtype == torch.int64 and 0 <= y.min() <= y.max() < 1000
    again = next(rank0)
    assert again[0] is x and again[1] is y  # one batch, forever
    x_same, y_same = next(data.synthetic(3, 4, cpu, rank=0))
    gen = torch.Generator().manual_seed(1000)  # rank r's seed is 1000 + r
    assert torch.equal(x_same, torch.randn(3, 3, 4, 4, generator=gen)) and torch.equal(y_same, y)
    assert torch.equal(y_same, torch.randint(0, 1000, (3,), generator=gen))
    x1, _ = next(data.synthetic(3, 4, cpu, rank=1))
    assert torch.equal(x1, torch.randn(3, 3, 4, 4, generator=torch.Generator().manual_seed(1001)))
    meta = torch.device("meta")
    assert [t.device for t in next(data.synthetic(3, 4, meta, rank=0))] == [meta, meta]
    xl, _ = next(data.synthetic(3, 4, cpu, rank=0, channels_last=True))
    assert xl.is_contiguous(memory_format=torch.channels_last) and torch.equal(xl, x)
    assert not x.is_contiguous(memory_format=torch.channels_last)


def test_batches_come_from_the_shard_of_the_rank_and_the_loader_the_config_names(monkeypatch):
    from bench.rank import loaders

    cpu = torch.device("cpu")
    b = types.SimpleNamespace(feed_batch=6, data_device=cpu, rank=1, world_size=2, launcher="torchrun")
    x, _ = next(data.batches_for(cfg_for(), b))
    assert x.shape == (6, 3, 8, 8) and torch.equal(x, next(data.synthetic(6, 8, cpu, 1))[0])
    b.shard_rank = 0  # BENCH_FAULT wrong-shard
    assert data.shard_rank(b) == 0 and torch.equal(next(data.batches_for(cfg_for(), b))[0],
                                                   next(data.synthetic(6, 8, cpu, 0))[0])
    xl, _ = next(data.batches_for(cfg_for(options={"channels_last": True}), b))
    assert xl.is_contiguous(memory_format=torch.channels_last)
    meta = types.SimpleNamespace(feed_batch=6, data_device=torch.device("meta"), rank=1)
    assert next(data.batches_for(cfg_for(), meta))[0].device == torch.device("meta")
    assert data.shard_rank(types.SimpleNamespace(rank=3)) == 3

    built = []

    class Source:
        info, empty_classes = {"what": "fake"}, ["a", "b"]

        def epoch(self, n):
            yield torch.zeros(6, 3, 8, 8), torch.zeros(6, dtype=torch.int64), 0

    def build(*args, **kwargs):
        built.append((args, kwargs))
        return Source()

    monkeypatch.setattr(loaders, "build", build)
    monkeypatch.setattr(data, "usable_cpus", lambda: 16)
    real = dict(data="imagenet", data_dir="/d", workers=3, seed=7)
    del b.shard_rank
    timed = data.batches_for(cfg_for(**real), b)
    assert built[-1] == (("torchvision", "cpu", "/d", 8, 6, 3, 1, 2),
                         {"distributed": True, "device": cpu, "seed": 7})
    assert b.loader_workers == 3 and isinstance(timed, data.TimedBatches) and timed.info == {"what": "fake"}
    assert timed.empty_classes == 2 and timed.device == cpu and timed.memory_format == torch.contiguous_format
    # DataParallel: one process feeds every GPU, reads the whole set (not a shard), with workers for each device
    dp = types.SimpleNamespace(feed_batch=12, data_device=cpu, rank=0, world_size=1, launcher="inproc")
    timed = data.batches_for(cfg_for("dp", "inproc", world_size=4, loader="dali", decode="gpu",
                                     options={"channels_last": True}, **real), dp)
    assert built[-1] == (("dali", "gpu", "/d", 8, 12, 12, 0, 1), {"distributed": False, "device": cpu, "seed": 7})
    assert dp.loader_workers == 12 and timed.memory_format == torch.channels_last
    old_record = cfg_for(**real)
    old_record.loader = old_record.decode = None  # a config from before --loader: torchvision on the CPU
    data.batches_for(old_record, b)
    assert built[-1][0][:2] == ("torchvision", "cpu")


class FakeSource:
    """A loader with two batches per epoch that skipped 1 and 2 images; records the epochs asked for."""

    def __init__(self):
        self.epochs = []

    def epoch(self, n):
        self.epochs.append(n)
        for skipped in (1, 2):
            yield torch.full((2, 3, 2, 2), float(n)), torch.tensor([n, skipped]), skipped


def test_timed_batches_count_epochs_skips_and_every_wait(monkeypatch):
    clock = iter(range(100))
    monkeypatch.setattr(data, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock)) ** 2))
    source = FakeSource()
    timed = data.TimedBatches(source, torch.device("cpu"), channels_last=True)
    assert (timed.epoch, timed.skipped, timed.wait_seconds, timed.empty_classes, timed.info) == (0, 0, 0.0, 0, None)
    seen = [next(timed) for _ in range(5)]
    assert iter(timed) is timed
    assert [int(y[0]) for _, y in seen] == [0, 0, 1, 1, 2] and source.epochs == [0, 1, 2] and timed.epoch == 2
    assert timed.skipped == 1 + 2 + 1 + 2 + 1
    assert seen[0][0].is_contiguous(memory_format=torch.channels_last) and seen[0][0].shape == (2, 3, 2, 2)
    # waits: (1 - 0) + (9 - 4) + (25 - 16) + (49 - 36) + (81 - 64): each next() on its own, summed
    assert timed.wait_seconds == 1 + 5 + 9 + 13 + 17


class Moves:
    """A batch tensor's ``.to``, recorded (what TimedBatches asks for on a GPU, on a machine without one)."""

    def __init__(self):
        self.calls = []

    def to(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


class MovesSource:
    def epoch(self, n):
        yield Moves(), Moves(), 0


@pytest.mark.parametrize("device,channels_last", [("cuda", True), ("cpu", False)])
def test_timed_batches_copy_to_the_device_asynchronously_on_gpus(device, channels_last):
    images, targets = next(data.TimedBatches(MovesSource(), torch.device(device), channels_last=channels_last))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert images.calls == [((torch.device(device),), {"non_blocking": device == "cuda", "memory_format": fmt})]
    assert targets.calls == [((torch.device(device),), {"non_blocking": device == "cuda"})]


def test_a_dataloader_source_reshuffles_by_epoch_and_sums_skips():
    from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler, TensorDataset

    ds = TensorDataset(torch.zeros(8, 1), torch.arange(8), torch.tensor([0, 1, 0, 2, 0, 0, 1, 0]))
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    source = data._DataLoaderSource(DataLoader(ds, batch_size=2, sampler=sampler))
    epochs = {n: [(y.tolist(), s) for _, y, s in source.epoch(n)] for n in (0, 1, 0)}
    for n in (0, 1):
        sampler.set_epoch(n)
        order = list(sampler)
        assert [t for batch, _ in epochs[n] for t in batch] == order
        skips = ds.tensors[2][order].view(-1, 2).sum(1).tolist()
        assert [s for _, s in epochs[n]] == skips and all(type(s) is int for _, s in epochs[n])
    assert source.info == {"shuffle": "DistributedSampler, reshuffled every epoch (set_epoch)", "pin_memory": False,
                           "workers": 0}
    plain = data._DataLoaderSource(DataLoader(ds, batch_size=4, sampler=SequentialSampler(ds)))
    assert plain.info == {"shuffle": "SequentialSampler", "pin_memory": False, "workers": 0}
    assert [y.tolist() for _, y, _ in plain.epoch(5)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_torchvision_loader_shards_shuffles_by_seed_and_keeps_batches_full():
    from torch.utils.data import DistributedSampler, RandomSampler, TensorDataset

    ds = TensorDataset(torch.arange(11))
    loader = tv.data_loader(ds, 3, 0, rank=1, world_size=2, distributed=True, pin_memory=False, seed=4)
    s = loader.sampler
    assert type(s) is DistributedSampler and (s.num_replicas, s.rank, s.shuffle, s.seed) == (2, 1, True, 4)
    assert loader.batch_size == 3 and loader.drop_last is True and loader.num_workers == 0
    assert loader.persistent_workers is False and loader.pin_memory is False
    assert [len(b[0]) for b in loader] == [3, 3]  # 6 of the padded 12 go to rank 1: two full batches, none short
    whole = tv.data_loader(ds, 4, 0, rank=0, world_size=1, distributed=False, pin_memory=False, seed=4,
                           collate_fn=lambda items: [int(i[0]) for i in items])
    assert type(whole.sampler) is RandomSampler
    first = [x for batch in whole for x in batch]
    assert len(first) == 8 and len(set(first)) == 8  # 11 // 4 full batches
    again = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=4, collate_fn=lambda items: [int(i[0]) for i in items])
    other = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=5, collate_fn=lambda items: [int(i[0]) for i in items])
    assert [x for b in again for x in b] == first != [x for b in other for x in b]  # the seed decides the order
    assert [x for b in whole for x in b] != first  # the next epoch draws another order
    default = tv.data_loader(ds, 4, 0, 0, 1, False, False, collate_fn=lambda items: [int(i[0]) for i in items])
    seeded = tv.data_loader(ds, 4, 0, 0, 1, False, False, seed=0, collate_fn=lambda items: [int(i[0]) for i in items])
    assert [x for b in default for x in b] == [x for b in seeded for x in b]  # the default seed is 0
    workers = tv.data_loader(ds, 4, 1, 0, 2, True, True)  # built, never iterated: no process starts
    assert (workers.num_workers, workers.persistent_workers, workers.pin_memory) == (1, True, True)
    assert workers.sampler.seed == 0


def test_skipping_image_folder_replaces_unreadable_images_and_counts_them(tmp_path):
    from bench.core.errors import UsageError

    (tmp_path / "n0").mkdir()
    for i in range(4):
        (tmp_path / "n0" / f"{i}.JPEG").write_bytes(b"")
    tried = []

    def load(path):
        tried.append(path)
        assert len(tried) <= 8, "kept trying past every sample"
        if path.endswith(("0.JPEG", "1.JPEG")) or bad_everywhere:
            raise OSError("unreadable")
        return path

    bad_everywhere = False
    ds = tv.SkippingImageFolder(tmp_path, load=load)
    assert ds[0] == (str(tmp_path / "n0" / "2.JPEG"), 0, 2)  # two unreadable ones skipped, counted
    assert ds[3] == (str(tmp_path / "n0" / "3.JPEG"), 0, 0)
    bad_everywhere, tried[:] = True, []
    with pytest.raises(UsageError) as e:
        ds[1]
    assert str(e.value) == f"no readable image in {tmp_path}" and len(tried) == 4


# ---------------------------------------------------------------------------------------------------
# The timed loop

class Clock:
    """time.perf_counter for bench.rank.train: moves only when the fakes below say so (binary fractions: exact)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def time(self):
        return 1.7e9 + self.now


def test_windows_time_only_the_steps_and_read_everything_else_outside(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(train, "time", clock)
    calls = []

    class Backend:
        def __init__(self):
            self.scale, self.window, self.batches = 2.0 ** 16, 0, types.SimpleNamespace(wait_seconds=0.0)

        def barrier(self):
            calls.append("barrier")
            clock.now += 64.0  # outside the timed region, like everything but the steps

        def loss_scale(self):
            clock.now += 128.0
            return self.scale

        def skipped_steps(self):
            return None

        def train(self, steps):
            calls.append(("train", steps))
            clock.now += 1.0 * steps
            if self.batches is not None:  # real data: time waited for input, inside the steps
                self.batches.wait_seconds += 0.125 * steps
            self.scale /= 2 ** self.window  # window i skips i steps (GradScaler halves the scale on each)
            self.window += 1
            meter.joules += 10.0 * steps

    class Meter:
        joules = 0.0

        def read(self):
            clock.now += 8.0
            return [self.joules, 2 * self.joules]  # two GPUs

    def sync():
        calls.append("sync")
        clock.now += 0.25

    meter = Meter()
    phases = []
    monkeypatch.setattr(train.lifeline, "set_phase", phases.append)
    cfg = types.SimpleNamespace(windows=3, steps=2)
    out = train.windows(Backend(), cfg, sync, meter, waited=True)
    assert phases == ["window 1 of 3", "window 2 of 3", "window 3 of 3"]  # where a lost node was, for the others
    assert out["wall_span"] == [1.7e9 + 200.25, 1.7e9 + 200.25 + out["energy_span"][1]]
    assert calls == ["barrier", "sync", ("train", 2), "sync"] * 3
    assert out["seconds"] == [2.25, 2.25, 2.25]  # the steps and the synchronize after them, nothing else
    assert out["data_wait"] == [0.25, 0.25, 0.25] and out["skipped"] == [0, 1, 2]
    assert out["energy"] == [60.0, 60.0, 60.0]  # 20 J on one GPU and 40 J on the other, each window
    # first read of window 1 to the last read of window 3: (2.25 + 128 + 8) + 2 x (64 + 0.25 + 128 + 8 + 2.25 + 128 + 8)
    assert out["energy_span"] == (180.0, 138.25 + 2 * 338.5)
    b = Backend()
    b.batches = None  # synthetic data: nothing to wait for, and nothing read
    assert train.windows(b, types.SimpleNamespace(windows=2, steps=1), sync, meter, waited=False)["data_wait"] == [
        0.0, 0.0]
    train.windows(b, types.SimpleNamespace(windows=1, steps=1), sync, meter, waited=False, phase="compute-only window")
    assert phases[-1] == "compute-only window 1 of 1"
    # whether a profiler ran, read at every window's start and end: any one edge is enough
    assert out["profiler"] is False
    edges = iter([False, True, False, False])  # window 1's end only
    monkeypatch.setattr(train, "profiler_active", lambda: next(edges))
    assert train.windows(b, types.SimpleNamespace(windows=2, steps=1), sync, meter, waited=False)["profiler"] is True


def test_skips_from_the_scale_or_the_backends_own_count():
    assert train.skips(2.0 ** 16, 2.0 ** 13) == 3 and train.skips(8.0, 8.0) == 0
    assert train.skips(8.0, 16.0) == 0  # a growth is no negative skip
    assert train.skips(8.0, 8.0 / 2 ** 0.6) == 1  # rounded, not truncated
    assert train.skips(None, 8.0) is None and train.skips(8.0, None) is None and train.skips(None, None, 1, 2) is None
    assert train.skips(8.0, 8.0, 3, 7) == 4 and train.skips(8.0, 4.0, None, 7) == 1 and train.skips(8.0, 4.0, 3) == 1


def test_compute_only_reason():
    b = types.SimpleNamespace(no_compute_only="why not")
    assert train.compute_only_reason(b, cfg_for(world_size=1)) == "world size 1: nothing to synchronise"
    assert train.compute_only_reason(b, cfg_for(options={"compile": True})) == (
        "not with --compile (skipping the synchronisation would recompile inside the windows)")
    assert train.compute_only_reason(b, cfg_for(options={"compile": False})) == "why not"
    assert train.compute_only_reason(types.SimpleNamespace(no_compute_only=None), cfg_for()) is None


# ---------------------------------------------------------------------------------------------------
# The record

H100 = "NVIDIA H100 80GB HBM3"


def rank_measures(rank, **over):
    """What one rank hands rank 0 (bench/rank/train.py ``mine``), for 3 windows."""
    mine = [{
        "rank": 0, "window_seconds": [1.0, 2.0, 4.0], "data_wait_seconds": [0.1, 0.2, 0.3],
        "corrupt_images_skipped": 1, "empty_classes": 2, "loader_info": {"shuffle": "rank 0's"},
        "memory": [{"device_index": 1, "device_name": "an unknown GPU", "peak_reserved_bytes": 300}],
        "param_sha256": "same", "eval": {"eval_samples": 100, "eval_loss": 2.5, "eval_accuracy": 0.25,
                                         "eval_seconds": 2.0},
        "energy_joules": [10.0, 20.0, 30.0], "energy_span_joules": 100.0, "energy_span_seconds": 10.0,
        "energy_reason": "rank 0's", "compute_only_window_seconds": [0.5, 0.7, 0.9], "no_compute_only": None,
        "compute_only_keeps": "a broadcast", "host_peak_rss_bytes": 10, "warmup_host_peak_rss_bytes": 30,
        "skipped_steps": [0, 1, 0], "warmup_skipped_steps": 3, "backend_info": {"who": 0}, "loader_workers": 4,
        "warmup_step_seconds": [5.0, 1.0, 1.0],
    }, {
        "rank": 1, "window_seconds": [1.5, 1.0, 5.0], "data_wait_seconds": [0.2, 0.1, 0.5],
        "corrupt_images_skipped": 2, "empty_classes": 5, "loader_info": {"shuffle": "rank 1's"},
        "memory": [{"device_index": 0, "device_name": H100, "peak_reserved_bytes": 100}],
        "param_sha256": "same", "eval": {"eval_samples": 7, "eval_loss": 9.0, "eval_accuracy": 0.9, "eval_seconds": 4.0},
        "energy_joules": [1.0, 2.0, None], "energy_span_joules": 300.0, "energy_span_seconds": 20.0,
        "energy_reason": "rank 1's", "compute_only_window_seconds": [0.6, 0.4, 1.0], "no_compute_only": "rank 1's",
        "compute_only_keeps": "rank 1's", "host_peak_rss_bytes": 20, "warmup_host_peak_rss_bytes": 40,
        "skipped_steps": [0, 0, 2], "warmup_skipped_steps": 1, "backend_info": {"who": 1}, "loader_workers": 9,
        "warmup_step_seconds": [4.0, 0.5, 1.5],
    }][rank]
    return {**mine, **over}


def build(per_rank, **cfg):
    cfg = cfg_for(world_size=len(per_rank), batch_size=4, **{"precision": "fp16", "flops_per_sample": 1e9, **cfg})
    cfg.steps, cfg.windows = 5, 3
    return record.build_record(cfg, {"run_id": "r1", "env": {"host": "h"}, "threads_per_rank": 3}, per_rank, 1)


def test_the_record_takes_the_slowest_rank_and_sums_what_adds_up():
    from bench.core import mfu

    rec = build([rank_measures(0), rank_measures(1)], options={"compile": True})
    assert rec["status"] == "ok" and rec["run_id"] == "r1" and rec["env"] == {"host": "h"}
    assert rec["window_seconds"] == [1.5, 2.0, 5.0]  # each window: its slowest rank
    throughputs = [40 / 1.5, 40 / 2.0, 40 / 5.0]  # global batch 8 x 5 steps per window
    assert (rec["throughput"], rec["throughput_ci95"]) == stats.median_ci95(throughputs) and rec["throughput"] == 20.0
    assert rec["per_device_throughput"] == 10.0
    assert [m["device_index"] for m in rec["memory"]] == [0, 1] and rec["memory_imbalance"] == 1.5  # 300 / 200
    assert rec["replicas_consistent"] is True
    assert rec["data_wait_seconds"] == [0.2, 0.2, 0.5] and rec["corrupt_images_skipped"] == 3
    assert rec["empty_classes"] == 2 and rec["loader_info"] == {"shuffle": "rank 0's"}
    assert rec["host_peak_rss_bytes"] == [10, 20] and rec["warmup_host_peak_rss_bytes"] == [30, 40]
    assert rec["skipped_steps"] == [0, 1, 2] and rec["warmup_skipped_steps"] == 3 and rec["settle_steps"] == 1
    assert rec["warmup_step_seconds"] == [5.0, 1.0, 1.5]
    assert rec["compile_seconds"] == 3.5  # (5 - 1.5) + nothing for the step faster than the last
    assert rec["backend_info"] == {"who": 0} and rec["loader_workers_per_process"] == 4 and rec["threads_per_rank"] == 3
    assert (rec["eval_samples"], rec["eval_loss"], rec["eval_accuracy"], rec["eval_throughput"]) == (100, 2.5, 0.25, 25.0)
    assert rec["compute_only_window_seconds"] == [0.6, 0.7, 1.0]
    assert rec["compute_only"] == {"measured": True, "reason": None, "keeps": "a broadcast"}
    assert rec["energy_total_joules"] == 400.0 and rec["energy_span_seconds"] == 20.0
    assert rec["energy_reason"] == "rank 0's"
    assert rec["joules_per_image"] == 400.0 / 120 and rec["mean_watts"] == 100 / 10 + 300 / 20
    assert rec["energy_window_diagnostic"] == {"joules": [11.0, 22.0, None],
                                               "median_joules_per_image": float(np.median([11 / 40, 22 / 40])),
                                               "median_mean_watts": float(np.median([11 / 1.5, 22 / 2.0]))}
    peak, source = mfu.peak_tflops(H100, "fp16")  # the first device's model
    assert peak and (rec["peak_tflops_per_device"], rec["peak_tflops_source"]) == (peak, source)
    assert rec["flops_per_sample"] == 1e9 and rec["mfu"] == 1e9 * 20.0 / (peak * 1e12 * 2)
    assert isinstance(rec["finished_at"], str) and rec["finished_at"]


def test_the_record_says_none_where_nothing_was_measured():
    quiet = dict(data_wait_seconds=None, corrupt_images_skipped=None, eval=None, skipped_steps=None,
                 warmup_skipped_steps=None, compute_only_window_seconds=None, no_compute_only="world size 1")
    rec = build([rank_measures(0, energy_span_joules=None, energy_joules=None, memory=[], **quiet)],
                peak_tflops=50.0)
    assert rec["window_seconds"] == [1.0, 2.0, 4.0] and rec["throughput"] == 10.0 == rec["per_device_throughput"]
    assert rec["replicas_consistent"] is None  # one rank: nothing to compare
    assert rec["data_wait_seconds"] is None and rec["corrupt_images_skipped"] is None
    assert rec["skipped_steps"] is None and rec["warmup_skipped_steps"] is None
    assert rec["compile_seconds"] is None and rec["memory_imbalance"] is None
    assert rec["eval_throughput"] is None and rec["eval_samples"] is None
    assert rec["compute_only_window_seconds"] is None
    assert rec["compute_only"] == {"measured": False, "reason": "world size 1", "keeps": None}
    assert (rec["energy_total_joules"], rec["energy_span_seconds"], rec["energy_window_diagnostic"]) == (None, None, None)
    assert (rec["joules_per_image"], rec["mean_watts"]) == (None, None)
    assert (rec["peak_tflops_per_device"], rec["peak_tflops_source"]) == (50.0, "--peak-tflops")
    assert rec["mfu"] == 1e9 * 10.0 / (50.0 * 1e12 * 1)
    assert rec["trace"] is None and rec["profiler_in_windows"] is False


def test_the_record_gathers_every_rank_s_trace_and_a_profiler_seen_in_any_window():
    def traced(rank, size, profiled, exported, forward, step_ms, reason=None, gpu=None, analysed=None):
        return {"file": None if reason else f"/l/r.rank{rank}.trace.json.gz", "bytes": size, "steps": 2,
                "profiled_seconds": profiled, "export_seconds": exported, "reason": reason, "gpu": gpu,
                "analysis_seconds": analysed,
                "phase_times": {"steps": 2, "step_ms": step_ms, "timeline": {"start_us": rank},
                                "phase_ms": {"forward": forward, "other": [a - b for a, b in zip(step_ms, forward)]}}}

    rec = build([rank_measures(0, trace=traced(0, 10, 1.0, 0.5, [1.0, 3.0], [1.5, 3.5], gpu={"overlap_pct": 50.0},
                                               analysed=0.25), profiler_in_windows=False),
                 rank_measures(1, trace=traced(1, 20, 0.5, 0.75, [2.0, 1.0], [2.0, 1.0], reason="over the cap"),
                               profiler_in_windows=True)])
    assert rec["profiler_in_windows"] is True  # one rank is enough
    assert rec["trace"] == {
        "files": ["/l/r.rank0.trace.json.gz", None], "bytes": [10, 20], "profiled_seconds": 1.0,
        "export_seconds": 0.75, "analysis_seconds": 0.25, "gpu": [{"overlap_pct": 50.0}, None],
        "reasons": ["over the cap"], "steps": 2, "step_ms": [[1.5, 3.5], [2.0, 1.0]],
        "phase_ms_per_step": [{"forward": 2.0, "other": 0.5}, {"forward": 1.5, "other": 0.0}],
        "slowest_rank_per_step": [1, 0], "timeline": [{"start_us": 0}, {"start_us": 1}]}


def test_the_record_flags_diverged_replicas_and_instant_evaluation():
    two = [rank_measures(0), rank_measures(1, param_sha256="other", warmup_skipped_steps=None)]
    two[0]["eval"]["eval_seconds"] = two[1]["eval"]["eval_seconds"] = 0.0
    two[0]["energy_joules"] = None  # a rank without per-window joules
    rec = build(two)
    assert rec["replicas_consistent"] is False and rec["eval_throughput"] is None and rec["eval_samples"] == 100
    assert rec["warmup_skipped_steps"] == 3  # a rank that counted none counts as 0
    assert rec["energy_window_diagnostic"]["joules"] == [None, None, None] and rec["energy_total_joules"] == 400.0
    assert rec["compile_seconds"] is None  # not compiled
    assert rec["peak_tflops_source"] == flops_source(H100, "fp16")


def flops_source(device, precision):
    from bench.core import mfu

    return mfu.peak_tflops(device, precision)[1]


def test_the_record_counts_no_warmup_skip_where_no_rank_counted_one_and_evaluation_under_a_second():
    two = [rank_measures(0, warmup_skipped_steps=0), rank_measures(1, warmup_skipped_steps=None)]
    two[0]["eval"]["eval_seconds"], two[1]["eval"]["eval_seconds"] = 0.25, 0.5
    rec = build(two)
    assert rec["warmup_skipped_steps"] == 0 and rec["eval_throughput"] == 200.0  # 100 samples / 0.5 s


def test_flops_fields():
    from bench.core import mfu

    cfg = cfg_for(precision="bf16", flops_per_sample=2e9)
    peak, source = mfu.peak_tflops(H100, "bf16")
    assert record.flops_fields(cfg, [{"device_name": H100}, {"device_name": "other"}], 500.0) == {
        "flops_per_sample": 2e9, "peak_tflops_per_device": peak, "peak_tflops_source": source,
        "mfu": 2e9 * 500.0 / (peak * 1e12 * 2)}
    assert record.flops_fields(cfg, [], 500.0) == {
        "flops_per_sample": 2e9, "peak_tflops_per_device": None, "peak_tflops_source": "no GPU: MFU is for GPUs",
        "mfu": None}


def test_compile_seconds_is_what_each_warmup_step_took_beyond_the_last():
    assert record.compile_seconds([9.0, 3.0, 2.0]) == 8.0 and record.compile_seconds([1.0, 3.0, 2.0]) == 1.0
    assert record.compile_seconds([2.0]) == 0.0


def test_the_replica_checksum_covers_every_name_and_byte():
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    expected = hashlib.sha256(b"w" + np.array([1, 3, 2, 4], dtype=np.float32).tobytes() + b"b"
                              + np.array([0.5], dtype=np.float32).tobytes()).hexdigest()
    assert record.param_checksum([("w", w.t()), ("b", torch.tensor([0.5]))]) == expected  # row-major bytes
    assert record.param_checksum([("w", w.t().contiguous()), ("b", torch.tensor([0.5]))]) == expected
    assert record.param_checksum([("v", w.t()), ("b", torch.tensor([0.5]))]) != expected
    w.requires_grad_()
    assert record.param_checksum([("w", w.t()), ("b", torch.tensor([0.5]))]) == expected


# ---------------------------------------------------------------------------------------------------
# Statistics

def test_throughputs_from_window_times():
    assert stats.window_throughputs([2.0, 4.0], 8).tolist() == [4.0, 2.0]
    rec = {"window_seconds": [2.0, 0.5], "global_batch": 4, "steps_per_window": 3}
    assert stats.record_throughputs(rec).tolist() == [6.0, 24.0]
    for bad in ([], None, [1.0, 0.0], [1.0, -1.0], [1.0, float("nan")], [float("inf")]):
        assert stats.record_throughputs({**rec, "window_seconds": bad}) is None, bad
    assert stats.record_throughputs({"global_batch": 4, "steps_per_window": 3}) is None
    assert stats.record_throughputs({**rec, "window_seconds": [1.0, None]}) is None  # a window never measured


def test_quantiles_interpolate_as_numpy_linear():
    ordered = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    for p in (0.0, 0.025, 0.2, 0.5, 0.7, 0.975, 1.0):
        assert stats._quantile_linear(ordered, p) == pytest.approx(float(np.quantile(ordered, p)), rel=1e-12), p
    assert stats._quantile_linear(np.array([3.0]), 0.5) == 3.0


def test_median_ci95_of_few_or_equal_values_and_its_fixed_seed():
    assert stats.median_ci95([4.0]) == (4.0, [4.0, 4.0]) and stats.median_ci95([2.0, 2.0, 2.0]) == (2.0, [2.0, 2.0])
    x = [8.56, 8.43, 6.9, 10.38, 13.73, 9.73, 10.31, 6.78]  # seed 1 would give another lower bound (6.9)
    med, (lo, hi) = stats.median_ci95(x)
    rng = np.random.default_rng(0)  # fixed: the same records give the same interval
    theta = np.sort(np.median(np.asarray(x)[rng.integers(0, 8, (stats.N_RESAMPLES, 8))], axis=-1))
    assert med == float(np.median(x)) and (lo, hi) == (float(np.quantile(theta, 0.025)), float(np.quantile(theta, 0.975)))
    assert lo == pytest.approx(7.665)
    assert stats.median_ci95(x) == (med, [lo, hi]) and lo < med < hi
    assert stats.median_ci95([3, 1, 2]) == stats.median_ci95([3.0, 1.0, 2.0])


def reference_hierarchical(runs, n_resamples, seed):
    """The same definition, resample by resample: pick r runs with replacement, resample each picked run's windows,
    take the median of the resampled run medians; then the 2.5th and 97.5th percentiles over the resamples."""
    rng = np.random.default_rng(seed)
    r = len(runs)
    picks = rng.integers(0, r, size=(n_resamples, r))
    boots = [rng.integers(0, w.size, size=(n_resamples, r, w.size)) for w in runs]
    stat = [np.median([np.median(runs[picks[k, j]][boots[picks[k, j]][k, j]]) for j in range(r)])
            for k in range(n_resamples)]
    return [float(np.percentile(stat, 2.5)), float(np.percentile(stat, 97.5))]


def test_hierarchical_interval_resamples_runs_then_windows():
    # no ties in the tails: the 2.5th and 97.5th percentiles differ from their neighbours
    runs = [np.round(np.random.default_rng(405 + i).normal(10 + i, 1, 5), 3) for i in range(4)]
    for seed in (0, 3):
        assert stats.hierarchical_ci95(runs, n_resamples=64, seed=seed) == reference_hierarchical(runs, 64, seed)
    assert stats.hierarchical_ci95(runs, n_resamples=64) == reference_hierarchical(runs, 64, 0)
    assert stats.hierarchical_ci95(runs) == reference_hierarchical(runs, stats.N_RESAMPLES, 0)
    assert stats.hierarchical_ci95([np.array([5.0, 5.0])] * 3) == [5.0, 5.0]


def test_summarise_runs_one_run_several_runs_and_none():
    assert stats.summarise_runs([None, [], np.array([])]) == {
        "median": None, "ci95": None, "interval": None, "runs": 0, "windows": 0, "cv_runs": None, "run_medians": []}
    one = stats.summarise_runs([None, [1.0, 2.0, 6.0]])
    assert one == {"median": 2.0, "ci95": stats.median_ci95([1.0, 2.0, 6.0])[1], "interval": stats.WITHIN_RUN,
                   "runs": 1, "windows": 3, "cv_runs": None, "run_medians": [2.0]}
    runs = [[1.0, 2.0, 3.0], [4.0, 6.0], [5.0, 5.0, 9.0, 10.0]]
    several = stats.summarise_runs(runs)
    assert several == {"median": 5.0, "ci95": stats.hierarchical_ci95([np.asarray(w) for w in runs]),
                       "interval": stats.ACROSS_RUNS, "runs": 3, "windows": 9,
                       "cv_runs": float(np.std([2.0, 5.0, 7.0], ddof=1) / np.mean([2.0, 5.0, 7.0])),
                       "run_medians": [2.0, 5.0, 7.0]}
    assert stats.summarise_runs([[3.0], [5.0]])["median"] == 4.0


def test_significance_is_scipys_on_the_run_medians():
    from scipy import stats as sp

    base, cur = [10.0, 11.0, 10.5], [8.0, 8.5, 8.2, 8.1]
    p, floor = stats.significance(base, cur)
    assert p == float(sp.ttest_ind(np.log(cur), np.log(base), equal_var=False).pvalue) and floor == 0.0
    assert stats.significance(base, cur, "welch") == (p, floor) and p < 0.01
    p, floor = stats.significance(base, cur, "mwu")
    assert p == float(sp.mannwhitneyu(cur, base, alternative="two-sided").pvalue)
    assert floor == float(sp.mannwhitneyu(np.arange(4), np.arange(4, 7), alternative="two-sided").pvalue) > 0.05
    assert stats.significance([10.0], [8.0, 9.0]) == (1.0, 1.0) and stats.significance([10.0, 9.0], [8.0]) == (1.0, 1.0)
    assert stats.significance([5.0, 5.0], [5.0, 5.0]) == (1.0, 0.0)  # no spread and no difference
    assert stats.significance([5.0, 5.0], [4.0, 4.0]) == (0.0, 0.0)  # no spread, a difference: exact
    assert stats.significance([5.0, float("nan")], [4.0, 4.5]) == (1.0, 0.0)  # no p-value counts as none
    # spread on one side only: Welch's test, not the no-spread shortcut
    for b, c in (([10.0, 11.0, 12.0], [8.0, 8.0]), ([8.0, 8.0], [10.0, 11.0, 12.0])):
        with warnings.catch_warnings():  # scipy warns of the constant side's lost precision
            warnings.simplefilter("ignore")
            p = float(sp.ttest_ind(np.log(c), np.log(b), equal_var=False).pvalue)
        assert stats.significance(b, c) == (p, 0.0) and 0.0 < p < 1.0
    with pytest.raises(ValueError, match="unknown test 'ks'; choose from welch, mwu"):
        stats.significance(base, cur, "ks")


def test_imbalance_and_cv_ignore_missing_values():
    assert stats.imbalance([100, None, 300]) == 1.5 and stats.imbalance([]) is None
    assert stats.imbalance([None]) is None and stats.imbalance([0, 0]) is None and stats.imbalance([7]) == 1.0
    assert stats.cv([2.0, None, 4.0]) == float(np.std([2.0, 4.0], ddof=1) / 3.0)
    assert stats.cv([2.0]) is None and stats.cv([1.0, -1.0]) is None and stats.cv([None, 3.0]) is None


# ---------------------------------------------------------------------------------------------------
# The gate: compare.compare on records whose run medians are exact (1280 images a window: 0.5 s is 2560 img/s)

def gate_records(thr, k=3, **over):
    from tests.test_compare import record

    windows = over.pop("window_seconds", [1280 / thr] * 3)
    return [record(windows, **over) for _ in range(k)]


def side(ok, other=()):
    return {"path": "x", "ok": list(ok), "other": list(other)}


def judge(base, cur, threshold=0.05, alpha=0.01, **kw):
    warned = []
    result = compare.compare(side(*base) if isinstance(base, tuple) else side(base),
                             side(*cur) if isinstance(cur, tuple) else side(cur), threshold, alpha,
                             warn=warned.append, **kw)
    return result, warned


@pytest.mark.parametrize("cur,threshold,verdict,note", [
    (2048.0, 0.2, "no significant change", "-20.0% is significant (p=0) but within the 20% threshold"),
    (1920.0, 0.2, "slower", "-25.0% throughput, beyond the 20% threshold"),
    (3200.0, 0.25, "no significant change", "+25.0% is significant (p=0) but within the 25% threshold"),
    (3328.0, 0.25, "faster", "+30.0% throughput, beyond the 25% threshold"),
])
def test_a_change_counts_only_beyond_the_threshold(cur, threshold, verdict, note):
    result, warned = judge(gate_records(2560.0), gate_records(cur), threshold=threshold)
    [row] = result["rows"]
    assert (row["verdict"], row["throughput_verdict"], row["notes"]) == (verdict, verdict, [note])
    assert row["ratio"] == cur / 2560.0 and (row["p_value"], row["min_p_value"]) == (0.0, 0.0)
    assert row["regression"] is (verdict == "slower") and result["regressed"] is (verdict == "slower")
    assert row["underpowered"] is False and warned == []
    assert result["schema"] == 1 and result["test"] == "welch" and result["allow_different_hardware"] is False
    assert result["threshold"] == threshold and result["alpha"] == 0.01 and result["compared"] == 1


def test_p_equal_to_alpha_is_not_significant_and_a_floor_equal_to_alpha_is_not_underpowered():
    base = [r for t in (2560.0, 2561.0, 2562.0) for r in gate_records(t, k=1)]
    cur = [r for t in (2000.0, 2001.0, 2002.0) for r in gate_records(t, k=1)]
    result, warned = judge(base, cur, alpha=0.1, test="mwu")  # 3 against 3, fully apart: p = 0.1 exactly
    [row] = result["rows"]
    assert (row["p_value"], row["min_p_value"], row["underpowered"]) == (0.1, 0.1, False)
    assert row["verdict"] == "no significant change" and row["notes"] == ["-21.9%, not significant (p=0.1 >= alpha 0.1)"]
    assert warned == []


def test_no_valid_windows_on_one_side_compares_memory_only():
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, window_seconds=[], mem_gib=20.0))
    [row] = result["rows"]
    assert row["ratio"] is None and row["current"]["windows"] == 0 and row["baseline"]["windows"] == 9
    assert row["throughput_verdict"] == "no significant change" and row["verdict"] == "more memory"
    assert row["notes"] == ["no valid window times on one side: throughput not compared",
                            "peak device memory +100.0%, beyond the 5% threshold"]


@pytest.mark.parametrize("mem,verdict,memory_verdict,note", [
    (12.5, "no significant change", None, None),  # exactly +25%: not beyond
    (15.0, "more memory", "more memory", "peak device memory +50.0%, beyond the 25% threshold"),
    (7.5, "no significant change", None, None),  # exactly -25%
    (5.0, "less memory", "less memory", None),
])
def test_device_memory_verdicts_beyond_the_threshold_only(mem, verdict, memory_verdict, note):
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, mem_gib=mem), threshold=0.25)
    [row] = result["rows"]
    assert (row["memory_kind"], row["memory_ratio"]) == ("device", mem / 10.0)
    assert (row["verdict"], row["memory_verdict"]) == (verdict, memory_verdict)
    assert row["notes"][1:] == ([note] if note else []) and row["regression"] is (verdict == "more memory")


def test_host_memory_is_reported_or_gated_and_missing_memory_is_not_compared():
    cpu = dict(device_type="cpu")
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=3.0, **cpu), threshold=0.25)
    [row] = result["rows"]
    assert (row["memory_kind"], row["memory_ratio"], row["memory_verdict"]) == ("host RSS", 1.5, None)
    assert row["notes"][1:] == ["host RSS +50.0% (not gated; --gate-host-memory gates it)"]
    assert row["verdict"] == "no significant change" and result["gate_host_memory"] is False
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=2.5, **cpu), threshold=0.25)
    assert result["rows"][0]["notes"][1:] == []  # exactly +25%: nothing to say
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=3.0, **cpu), threshold=0.25,
                      gate_host_memory=True)
    [row] = result["rows"]
    assert row["verdict"] == "more memory" and row["notes"][1:] == ["peak host RSS +50.0%, beyond the 25% threshold"]
    # device memory on one side only (a record without its memory): the host RSS is what both sides have
    result, _ = judge(gate_records(2560.0, memory=[]), gate_records(2560.0, host_rss_gib=3.0), threshold=0.25)
    assert (result["rows"][0]["memory_kind"], result["rows"][0]["memory_ratio"]) == ("host RSS", 1.5)
    result, _ = judge(gate_records(2560.0, host_peak_rss_bytes=[], **cpu),
                      gate_records(2560.0, host_peak_rss_bytes=[None], **cpu))
    assert (result["rows"][0]["memory_kind"], result["rows"][0]["memory_ratio"]) == (None, None)


def test_one_sided_rows_say_why_and_keep_every_field():
    from tests.test_compare import record

    ok = gate_records(2560.0)
    new = gate_records(2560.0, world_size=4)
    missing = gate_records(2560.0, world_size=8)
    crashed = gate_records(2560.0, world_size=16)
    gone = [record([], world_size=4, status="failed", reason="first"),
            record([], world_size=4, status="skipped", reason="second")]
    result, _ = judge((ok + missing + crashed, gone[:1]),
                      (ok + new, [record([], world_size=8, status="skipped"),
                                  record([], world_size=16, status="failed")]))
    rows = {r["key"]["world_size"]: r for r in result["rows"]}
    assert [r["key"]["world_size"] for r in result["rows"]] == [2, 4, 8, 16]
    assert rows[4]["status"] == "new" and rows[4]["notes"] == ["baseline run failed: first"]
    assert rows[4]["current"]["runs"] == 3 and rows[4]["baseline"] is None
    assert rows[8]["status"] == "missing" and rows[8]["notes"] == ["current run skipped: no reason recorded"]
    assert rows[8]["baseline"]["runs"] == 3 and rows[8]["current"] is None
    assert rows[16]["status"] == "failed" and rows[16]["notes"] == ["current run failed: no reason recorded"]
    assert rows[16]["baseline"]["runs"] == 3 and rows[16]["regression"] is True
    assert set(rows[4]) == set(rows[8]) == set(rows[16]) == set(rows[2])  # every row has every field, as JSON
    assert rows[4]["min_p_value"] is None and rows[8]["throughput_verdict"] is None and rows[16]["memory_kind"] is None
    assert rows[4]["memory_ratio"] is None and rows[8]["memory_verdict"] is None
    assert rows[2]["key"]["hardware"] and rows[2]["key"]["device_type"] == "cuda"
    assert rows[2]["current"]["run_ids"] == [r["run_id"] for r in ok]
    assert result["new"] == [rows[4]["config"]] and result["missing"] == [rows[8]["config"]]
    assert result["regressions"] == [rows[16]["config"]] and result["regressed"] is True
    result, _ = judge((ok, [record([], world_size=4, status="failed", reason="first"),
                            record([], world_size=4, status="failed", reason="last")]), new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["baseline run failed: last"]]
    result, _ = judge((ok, [record([], world_size=4, status="failed")]), ok + new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["baseline run failed: no reason recorded"]]
    result, _ = judge(ok + missing, ok)
    assert [r["notes"] for r in result["rows"] if r["status"] == "missing"] == [["no ok run in current"]]
    result, _ = judge(ok, ok + new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["not in the baseline"]]


def test_one_window_is_a_valid_side_and_zero_device_memory_is_not_compared():
    result, _ = judge(gate_records(2560.0, k=1, window_seconds=[0.5], mem_gib=0.0), gate_records(2560.0))
    [row] = result["rows"]
    assert row["ratio"] == 1.0 and row["baseline"]["windows"] == 1 and row["underpowered"] is True
    assert (row["memory_ratio"], row["memory_kind"]) == (None, None)


def test_diverged_replicas_say_so():
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, replicas_consistent=False))
    [row] = result["rows"]
    assert row["verdict"] == "replicas differ" and row["regression"] is True
    assert row["notes"][-1] == "ranks ended with different parameters (replicas_consistent: false)"


def test_disturbed_runs_make_the_speed_verdict_inconclusive_and_say_where_to_rerun():
    def disturbed(reasons, **over):
        recs = gate_records(2560.0, **over)
        recs[0].update(disturbed=True, disturbed_reasons=reasons)
        return recs

    result, warned = judge(gate_records(2560.0), disturbed(["cpu", "gpu", "clocks"]))
    [row] = result["rows"]
    assert row["inconclusive"] is True and row["verdict"] == "inconclusive" and row["regression"] is False
    assert row["notes"][-1] == ("inconclusive: 1 current run(s) disturbed (cpu; gpu); on these runs the verdict would "
                                "be 'no significant change'; run the gate again on a quiet machine")
    assert [w.split(":")[0] for w in row["warnings"]] == ["⚠ current ddp x2 fp32"]
    assert result["inconclusive"] == [row["config"]] and result["warnings"] == row["warnings"]
    assert warned == ["1 configuration(s) compared on disturbed runs: their throughput was NOT judged "
                      "(inconclusive); run the gate again on a quiet machine"]
    result, _ = judge(disturbed([]), disturbed(["cpu"]) + disturbed(["gpu"]))
    [row] = result["rows"]
    assert row["notes"][-1] == ("inconclusive: 1 baseline, 2 current run(s) disturbed (cpu; gpu); on these runs the "
                                "verdict would be 'no significant change'; re-record the baseline on a quiet machine")
    assert [w.split(":")[0] for w in row["warnings"]] == ["⚠ baseline ddp x2 fp32", "⚠ current ddp x2 fp32"]
    result, _ = judge(disturbed([]), gate_records(2560.0))
    assert "disturbed (no reason recorded);" in result["rows"][0]["notes"][-1]


def test_a_failed_repeat_beside_a_slower_verdict_keeps_both():
    from tests.test_compare import record

    result, _ = judge(gate_records(2560.0), (gate_records(1280.0), [record([], status="failed")]))
    [row] = result["rows"]
    assert row["verdict"] == "slower, failed" and row["notes"][-1] == "1 of 4 current runs failed: no reason recorded"


def test_rows_sort_numbers_as_numbers_and_none_as_text():
    result, _ = judge(gate_records(2560.0, cudnn_benchmark=None) + gate_records(2560.0),
                      gate_records(2560.0) + gate_records(2560.0, cudnn_benchmark=None))
    assert [r["key"]["cudnn_benchmark"] for r in result["rows"]] == [True, None]  # None is not compared with True
    result, _ = judge(gate_records(2560.0, world_size=16) + gate_records(2560.0),
                      gate_records(2560.0) + gate_records(2560.0, world_size=16))
    assert [r["key"]["world_size"] for r in result["rows"]] == [2, 16]


def test_different_hardware_is_refused_by_default_and_matched_without_it_when_allowed():
    from bench.core.errors import UsageError

    cpu, gpu = gate_records(2560.0, device_type="cpu", cudnn_benchmark=True), gate_records(2560.0)
    with pytest.raises(UsageError, match="refusing to compare across hardware"):
        compare.compare(side(gpu), side(cpu), 0.05, 0.01)
    result, warned = judge(gpu, cpu, allow_different_hardware=True)
    [row] = result["rows"]
    assert row["status"] == "compared" and result["allow_different_hardware"] is True
    assert row["key"]["device_type"] == "cpu" and "hardware" in row["key"]  # the row still names its hardware
    assert warned and warned[0].startswith("comparing different hardware")


def test_peak_memory_of_a_record():
    """The largest over the run's devices (ranks for host RSS), skipping what was not measured."""
    mem = [{"peak_reserved_bytes": 5}, {"peak_reserved_bytes": None}, {"peak_reserved_bytes": 7}, {}]
    assert compare.peak_device_memory({"memory": mem}) == 7.0 and type(compare.peak_device_memory({"memory": mem})) is float
    for rec in ({"memory": []}, {"memory": None}, {}, {"memory": [{"peak_reserved_bytes": None}]}):
        assert compare.peak_device_memory(rec) is None, rec
    assert compare.peak_host_rss({"host_peak_rss_bytes": [3, None, 9]}) == 9.0
    for rec in ({"host_peak_rss_bytes": []}, {"host_peak_rss_bytes": None}, {}, {"host_peak_rss_bytes": [None]}):
        assert compare.peak_host_rss(rec) is None, rec
    assert compare._median([3.0, None, 1.0, 2.0]) == 2.0 and compare._median([None]) is None


def test_threshold_and_alpha_ranges():
    from bench.core.errors import UsageError

    assert compare._fraction("0", "threshold", low_inclusive=True) == 0.0
    assert compare._fraction("0.5", "alpha", low_inclusive=False) == 0.5
    for text, name, low, message in [
            ("1", "threshold", True, "--threshold '1': expected a number with 0 <= threshold < 1 (0.05 = 5%)"),
            ("x", "threshold", True, "--threshold 'x': expected a number with 0 <= threshold < 1 (0.05 = 5%)"),
            ("0", "alpha", False, "--alpha '0': expected a number with 0 < alpha < 1 (e.g. 0.01)"),
            ("1", "alpha", False, "--alpha '1': expected a number with 0 < alpha < 1 (e.g. 0.01)")]:
        with pytest.raises(UsageError) as e:
            compare._fraction(text, name, low_inclusive=low)
        assert str(e.value) == message


def test_cmd_compare_exit_codes_paths_and_the_out_file(tmp_path, capsys):
    import argparse

    from bench.core import results
    from bench.core.errors import UsageError

    def write(directory, recs):
        for r in recs:
            results.save(r, directory)
        return str(directory)

    base = write(tmp_path / "base", gate_records(2560.0))
    slower = write(tmp_path / "slow", gate_records(1280.0))

    def cmd(cur, out=None, threshold="0", fmt="json"):
        args = argparse.Namespace(baseline=base, current=cur, threshold=threshold, alpha="0.01", test="welch",
                                  format=fmt, out=out, allow_different_hardware=False, gate_host_memory=False)
        code = compare.cmd_compare(args)
        return code, capsys.readouterr().out

    code, out = cmd(base, out=str(tmp_path / "new" / "deeper" / "gate.json"))
    data = json.loads(out)
    assert code == 0 and (data["baseline_path"], data["current_path"]) == (base, base) and data["threshold"] == 0.0
    assert (tmp_path / "new" / "deeper" / "gate.json").read_text() == out
    code, out = cmd(slower, out=str(tmp_path / "new" / "gate.md"), fmt="md")  # into a folder that exists
    assert code == 1 and (tmp_path / "new" / "gate.md").read_text() == out
    assert f"## Regression gate: {slower} vs {base}" in out
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as e:
        cmd(base, out=str(tmp_path / "file" / "gate.md"))
    assert str(e.value) == f"cannot write --out {str(tmp_path / 'file' / 'gate.md')!r}: File exists"

"""fsdp2's own tests, in process (fully_shard faked): which dtypes the parameters are gathered and the gradients
reduced in (bf16/fp16 gathers, fp32 reductions, fp32 norms on every torch), what --compile compiles, the norm groups
and blocks it shards, and the compute-only step's local zero gradients. Its 2-rank run (62 sharded parameters, sharded
state bytes, NCHW parameters under --channels-last) is in test_contract.py; its settings read back from 2 real ranks in
test_fairness.py."""
import copy

import pytest
import torch
import torch.nn.functional as F

import backends
from backends import fsdp2
from backends.base import SGD
from tests.conftest import two_gpus
from tests.fakes import cfg_for, norm_model, tiny_batches, tiny_model

pytestmark = pytest.mark.mutation


def shard_calls(monkeypatch, model, dtype, override=True, compile=False):
    import torch.distributed.fsdp as fsdp_module

    calls, mesh = [], object()

    def fully_shard(module, mesh=None, mp_policy=None, reshard_after_forward=None):
        calls.append((module, mesh, mp_policy, reshard_after_forward))

    monkeypatch.setattr(fsdp_module, "fully_shard", fully_shard)
    monkeypatch.setattr(fsdp2, "has_param_dtype_override", lambda: override)
    for block in fsdp2.blocks(model):
        monkeypatch.setattr(block, "compile", lambda block=block: calls.append(("compiled", block)))
    via, groups = fsdp2.shard(model, mesh, dtype, compile=True) if compile else fsdp2.shard(model, mesh, dtype)
    assert all(c[1] is mesh for c in calls if c[0] != "compiled")
    assert groups == sum(c[0] != "compiled" for c in calls)
    return via, calls


def test_fsdp2_gathers_in_the_half_dtype_reduces_in_fp32_and_keeps_norms_fp32(monkeypatch):
    model = norm_model()
    blocks = [model[2], model[3]]
    via, calls = shard_calls(monkeypatch, model, torch.bfloat16)
    assert via == "param_dtype_override_fn"
    assert [c[0] for c in calls] == blocks + [model]  # every block, then the root
    # several ranks (shard's default): every block reshards after forward but the last, which backward needs first;
    # the root keeps FSDP2's own default
    assert [c[3] for c in calls] == [True, False, None]
    for _, _, policy, _ in calls:
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
    assert [c[3] for c in calls] == [False, False, False, True, False, None]  # the tiny norm groups never reshard
    for _, _, policy, _ in calls[:3]:
        assert (policy.param_dtype, policy.reduce_dtype, policy.cast_forward_inputs) == (torch.float32, torch.float32,
                                                                                          False)
    for _, _, policy, _ in calls[3:]:
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


def test_fsdp2_reshards_nothing_at_world_size_1(monkeypatch):
    """A one-rank shard is the whole parameter: resharding after forward only adds a second copy-in in backward."""
    import torch.distributed.fsdp as fsdp_module

    calls = []
    monkeypatch.setattr(fsdp_module, "fully_shard", lambda module, **kw: calls.append(kw["reshard_after_forward"]
                                                                                      if "reshard_after_forward" in kw
                                                                                      else "default"))
    assert fsdp2.reshard_policy(1) == "never" and fsdp2.reshard_policy(2) == "blocks but the last"
    model = norm_model()
    assert fsdp2.shard(model, object(), None, reshard="never") == (None, 3)
    assert calls == [False, False, "default"]


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


def test_norm_groups_follow_the_blocks():
    import torchvision

    model = torchvision.models.resnet18()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    groups = fsdp2.norm_groups(norms, fsdp2.blocks(model))
    assert [len(g) for g in groups] == [2, 2, 3, 2, 3, 2, 3, 2, 1]  # eight blocks, then the stem's bn1
    assert groups[-1] == [model.bn1] and groups[2] == [model.layer2[0].bn1, model.layer2[0].bn2,
                                                        model.layer2[0].downsample[1]]


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


@two_gpus("FSDP2")
@pytest.mark.gpu
def test_fsdp2_fp16_on_two_gpus_measures_compute_only(gpu_plan):
    rec = gpu_plan.record("fsdp2-2gpus-fp16", "fsdp2")
    assert rec["backend_info"]["grad_scaler"] is True and rec["backend_info"]["param_dtype"] == "float16"
    assert rec["compute_only"]["measured"] is True and len(rec["compute_only_window_seconds"]) == 3
    assert rec["replicas_consistent"] is True

"""allreduce_manual's own tests: its hand-written gradient averaging, checked exactly against a reference step in one
process (``torch.distributed`` replaced by a fake that behaves as rank 1 would), its compute-only context and the
all-reduce phase it marks for --trace. Its 2-rank run is in test_contract.py."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

import backends
from backends import allreduce_manual
from backends.base import SGD
from tests.fakes import built, cfg_for, fake_init, tiny_batches, tiny_model

pytestmark = pytest.mark.mutation


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

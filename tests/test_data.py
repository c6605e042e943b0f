"""The data a rank trains on (bench/rank/data.py): bench verify's seeded global batches and each rank's
DistributedSampler share of them, the fixed synthetic batch of each shard, the loader the config names and its
workers per device, and TimedBatches: epochs, reshuffles, skipped images, the time waited and the copy to the
device. Values are pinned, not just types. The loaders themselves are in tests/test_loaders.py."""
import types

import pytest
import torch

from bench.rank import data
from tests.fakes import cfg_for

pytestmark = pytest.mark.mutation


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


def test_timed_batches_reshuffle_every_epoch_on_disjoint_shards():
    """The suite's own epoch loop calls set_epoch: without it, epoch 2 repeats epoch 1's order."""
    from torch.utils.data import DataLoader, DistributedSampler

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return torch.zeros(1), i, 0  # (image, target = the index, skipped)

    def epochs(rank):
        loader = DataLoader(Indexed(), batch_size=4, drop_last=True,
                            sampler=DistributedSampler(Indexed(), num_replicas=2, rank=rank, shuffle=True, seed=0))
        batches = data.TimedBatches(loader, torch.device("cpu"))
        seen = [next(batches)[1].tolist() for _ in range(4)]  # 2 batches per epoch per rank
        return sum(seen[:2], []), sum(seen[2:], [])

    (a1, a2), (b1, b2) = epochs(0), epochs(1)
    assert a1 != a2 and b1 != b2  # reshuffled
    assert set(a1).isdisjoint(b1) and set(a2).isdisjoint(b2)  # disjoint shards in every epoch
    assert set(a1) | set(b1) == set(range(16)) == set(a2) | set(b2)

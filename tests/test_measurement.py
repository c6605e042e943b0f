"""Numbers that hold up: DataParallel's precision in replica threads, timed-window memory peaks, a warm-up
that reaches steady state, GradScaler skips, runs as the statistical unit, matched precisions, per-device
loader workers and reshuffled shards. Each test fails without the piece it names."""
import threading

import pytest
import torch

from bench.commands import _plan as cli
from bench.core.config import RunConfig
from bench.rank import data
from bench.rank.faults import BLOAT_BYTES
from bench.rank.train import skips
from tests.conftest import TINY, bench_inproc, records

MiB = 2 ** 20


def _in_new_thread(fn):
    """Call ``fn`` in a fresh thread, as torch.nn.parallel.parallel_apply calls each replica."""
    out = {}
    t = threading.Thread(target=lambda: out.update(value=fn()))
    t.start()
    t.join()
    return out["value"]


def test_dataparallel_replicas_run_the_recorded_dtype_in_their_own_threads():
    import backends

    cfg = RunConfig(backend="dp", launcher="inproc", world_size=1, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1, precision="bf16").validate()
    dp = backends.create("dp")
    dp.setup(cfg)
    x = torch.randn(2, 3, 32, 32)
    # autocast state is per thread: a new thread starts without it, as parallel_apply's replica threads do
    # (they re-enter autocast with no dtype, which on CUDA means fp16)
    assert _in_new_thread(lambda: dp.module(x)).dtype == torch.float32
    assert _in_new_thread(lambda: dp.model(x)).dtype == torch.bfloat16
    assert dp.describe()["autocast_dtype"] == "bfloat16"
    # the optimizer steps the very parameters the wrapper calls, and the checksum reads the bare model
    assert {id(p) for g in dp.optimizer.param_groups for p in g["params"]} == {id(p) for p in dp.model.parameters()}
    assert not any(n.startswith("module.") for n, _ in dp.module.named_parameters())


@pytest.mark.slow
def test_peaks_are_the_timed_windows_and_warmup_keeps_its_own(results_dir):
    # 256 MiB held through the last warm-up step: a one-time peak like cuDNN's search workspace
    proc = bench_inproc("run", "--backends", "single", "--gpus", 1, *TINY, "--results", results_dir,
                        env={"BENCH_FAULT": "bloat@rank0:step2"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    [timed], [warm] = rec["host_peak_rss_bytes"], rec["warmup_host_peak_rss_bytes"]
    assert warm - timed > 0.8 * BLOAT_BYTES, (warm / MiB, timed / MiB)


def test_gradscaler_skips_are_counted_from_the_scale():
    """Each skipped step halves the scale: log2 of the ratio of two reads counts the skips."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    before = scaler.get_scale()
    for bad in (False, True, False, True, True, False):
        opt.zero_grad()
        loss = model(torch.ones(1, 4)).sum() * (float("inf") if bad else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert skips(before, scaler.get_scale()) == 3
    assert skips(None, 1.0) is None


def test_interleave_runs_every_configuration_before_repeating():
    cfgs = [RunConfig(backend=b, launcher="inproc", world_size=1, device_type="cpu", model="resnet18", image_size=32,
                      batch_size=2, warmup=2, steps=1, windows=1) for b in ("single", "dp", "ddp")]
    order = [(c.backend, c.repeat_index, c.repeats) for c in cli.interleave(cfgs, 3)]
    assert order == [(b, r, 3) for r in (1, 2, 3) for b in ("single", "dp", "ddp")]


def _plan(monkeypatch, *argv, device=("cuda", 4)):
    monkeypatch.setattr(cli, "detect_device", lambda requested: device)
    args = cli.parse_run(list(argv))
    configs, _ = cli.plan(args)
    return [(c.backend, c.world_size, c.precision, c.cudnn_benchmark) for c in configs]


def test_plan_matches_precisions_and_adds_the_dataparallel_cudnn_variant(monkeypatch):
    planned = _plan(monkeypatch, "--backends", "single,dp,ddp_amp_syncbn", "--max-gpus", "4")
    # single at every precision in use, so every efficiency cell has a matched baseline
    assert ("single", 1, "fp32", True) in planned and ("single", 1, "fp16", True) in planned
    # dp with cudnn.benchmark off beside the default, at N >= 2 only
    assert [p for p in planned if p[0] == "dp"] == [
        ("dp", 1, "fp32", True), ("dp", 2, "fp32", True), ("dp", 2, "fp32", False), ("dp", 4, "fp32", True),
        ("dp", 4, "fp32", False)]
    # an explicit knob is obeyed everywhere and adds no variant
    explicit = _plan(monkeypatch, "--backends", "dp", "--gpus", "2", "--cudnn-benchmark", "off")
    assert explicit == [("dp", 2, "fp32", False)]
    # on CPU: no cuDNN, and no fp16 single for a backend that cannot run there
    cpu = _plan(monkeypatch, "--backends", "single,ddp_amp_syncbn", "--gpus", "1", device=("cpu", 2))
    assert cpu == [("single", 1, "fp32", None), ("ddp_amp_syncbn", 1, "fp16", None)]
    # a CPU sweep (make bench): the multi-process backends at the top world size only, single at 1
    sweep = _plan(monkeypatch, "--backends", "single,ddp,fsdp2", "--max-gpus", "all", device=("cpu", 2))
    assert sweep == [("single", 1, "fp32", None), ("ddp", 2, "fp32", None), ("fsdp2", 2, "fp32", None)]


def test_workers_are_per_device_for_every_backend(monkeypatch):
    monkeypatch.setattr(data, "usable_cpus", lambda: 16)  # the cores this job may use
    cfg = RunConfig(backend="dp", launcher="inproc", world_size=4, device_type="cuda", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1, workers=3)
    assert data.loader_workers(cfg, feeds_devices=4) == 12  # dp's one process feeds 4 GPUs
    assert data.loader_workers(cfg, feeds_devices=1) == 3  # one DDP rank feeds its own GPU
    cfg.workers = 5
    assert data.loader_workers(cfg, feeds_devices=4) == 16  # capped by the cores
    assert data.default_workers(4) == 3  # 16 cores / 4 devices, one core left for each training process


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

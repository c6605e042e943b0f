"""Numbers that hold up: the timed loop (bench/rank/train.py: only the steps are timed, everything else is read
outside the windows), timed-window memory peaks, GradScaler skips, runs as the statistical unit and matched
precisions. Each test fails without the piece it names."""
import types

import pytest
import torch

from bench.plan import sweep as cli
from bench.core.config import RunConfig
from bench.rank import train
from bench.rank.faults import BLOAT_BYTES
from bench.rank.train import skips
from tests.conftest import TINY, bench_inproc, records
from tests.fakes import cfg_for

pytestmark = pytest.mark.mutation

MiB = 2 ** 20


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


def test_interleave_runs_every_configuration_before_repeating_each_repetition_in_its_own_order():
    """Every configuration once per repetition: the first in the planned order, each later one shuffled by the seed and
    turned so that no repetition starts or ends with the configuration the one before did: single@1, the baseline, is
    not always first, and the same seed gives the same sweep. The planned order in every repetition for
    --to-accuracy."""
    names = ("single", "dp", "ddp", "fsdp2")
    cfgs = [RunConfig(backend=b, launcher="inproc", world_size=1, device_type="cpu", model="resnet18", image_size=32,
                      batch_size=2, warmup=2, steps=1, windows=1) for b in names]
    for seed in range(20):
        runs = cli.interleave(cfgs, 3, seed)
        reps = [[c.backend for c in runs if c.repeat_index == r] for r in (1, 2, 3)]
        assert all(sorted(rep) == sorted(names) for rep in reps) and [c.repeats for c in runs] == [3] * 12
        assert reps[0] == list(names)  # the first as planned
        assert len({rep[0] for rep in reps}) > 1 and len({rep[-1] for rep in reps}) > 1, (seed, reps)
        for a, b in zip(reps, reps[1:]):
            assert a[0] != b[0] and a[-1] != b[-1], (seed, reps)
        assert [(c.order_seed, c.order_index) for c in runs] == [(seed, i) for _ in range(3) for i in range(1, 5)]
        assert [c.backend for c in cli.interleave(cfgs, 3, seed)] == [c.backend for c in runs]  # seeded
    assert {tuple(c.backend for c in cli.interleave(cfgs, 1, seed)) for seed in range(20)} == {names}
    assert [(c.backend, c.repeat_index) for c in cli.interleave(cfgs, 2, shuffle=False)] == [
        (b, r) for r in (1, 2) for b in names]


def _plan(monkeypatch, *argv, device=("cuda", 4)):
    monkeypatch.setattr(cli, "detect_device", lambda requested: device)
    args = cli.parse_run(list(argv))
    configs, _ = cli.plan(args)
    return [(c.backend, c.world_size, c.precision, c.cudnn_benchmark) for c in configs]


def test_plan_matches_precisions_and_adds_the_dataparallel_cudnn_variant(monkeypatch):
    planned = _plan(monkeypatch, "--backends", "single,dp,ddp_amp_syncbn", "--max-gpus", "4")
    # single at every precision in use, so every efficiency cell has a matched baseline
    assert ("single", 1, "fp32", True) in planned and ("single", 1, "fp16", True) in planned
    # dp with cudnn.benchmark off beside the default at N >= 2, and the baselines of that setting at 1: dp's own and
    # single's (an efficiency divides by a baseline of its own setting: issue 59)
    assert [p for p in planned if p[0] == "dp"] == [
        ("dp", 1, "fp32", True), ("dp", 2, "fp32", True), ("dp", 2, "fp32", False), ("dp", 4, "fp32", True),
        ("dp", 4, "fp32", False), ("dp", 1, "fp32", False)]
    assert [p for p in planned if p[0] == "single"] == [("single", 1, "fp32", True), ("single", 1, "fp16", True),
                                                       ("single", 1, "fp32", False)]
    # no world size 1 in the sweep: no baseline to add
    assert _plan(monkeypatch, "--backends", "single,dp", "--gpus", "2") == [("dp", 2, "fp32", True),
                                                                            ("dp", 2, "fp32", False)]
    # an explicit knob is obeyed everywhere and adds no variant
    explicit = _plan(monkeypatch, "--backends", "dp", "--gpus", "2", "--cudnn-benchmark", "off")
    assert explicit == [("dp", 2, "fp32", False)]
    # on CPU: no cuDNN, and no fp16 single for a backend that cannot run there
    cpu = _plan(monkeypatch, "--backends", "single,ddp_amp_syncbn", "--gpus", "1", device=("cpu", 2))
    assert cpu == [("single", 1, "fp32", None), ("ddp_amp_syncbn", 1, "fp16", None)]
    # a CPU sweep (make bench): the multi-process backends at the top world size only, single at 1
    sweep = _plan(monkeypatch, "--backends", "single,ddp,fsdp2", "--max-gpus", "all", device=("cpu", 2))
    assert sweep == [("single", 1, "fp32", None), ("ddp", 2, "fp32", None), ("fsdp2", 2, "fp32", None)]


# ---------------------------------------------------------------------------------------------------
# The timed loop (bench/rank/train.py), in process: a fake clock, backend and energy meter

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

        def devices(self):
            return [torch.device("cpu")]

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


def test_the_collector_stays_off_in_every_timed_window_and_collects_outside_them(monkeypatch):
    """One policy for every backend (torchtitan's): after set-up one full collection, then automatic collection off,
    and the young generations collected before each window, outside it, on every rank. A collection that starts inside
    one rank's window and not in another's is a straggler, and a window lasts as long as its slowest rank."""
    import gc

    from bench.rank import startup

    events = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: events.append(("collect", generation)) or 0)

    class Backend:
        batches = None

        def barrier(self):
            events.append("barrier")

        def loss_scale(self):
            return None

        def skipped_steps(self):
            return None

        def devices(self):
            return [torch.device("cpu")]

        def train(self, steps):
            events.append(("train", gc.isenabled()))

    class Meter:
        def read(self):
            return None

    try:
        gc.enable()
        assert startup.done(timed=True) == startup.TIMED_POLICY and not gc.isenabled()
        train.windows(Backend(), types.SimpleNamespace(windows=2, steps=3), lambda: None, Meter(), waited=False)
    finally:
        gc.enable()
    assert events == [("collect", 2)] + [("collect", 1), "barrier", ("train", False)] * 2
    assert startup.done() is None and gc.isenabled()  # every other task: the collector back on, as a script has it


class VirtualGpu:
    """A GPU that runs behind the host on the test's clock, for the fake GPU machine's events (tests/fake_gpu.py:
    FakeEvent): each step the host spends ``host_s`` launching and the GPU ``gpu_s`` on kernels that start when it has
    finished what came before; an event is reached when the GPU gets to it; a synchronize waits for the GPU."""

    def __init__(self, clock, host_s: float, gpu_s: float):
        self.clock, self.host_s, self.gpu_s, self.busy_until = clock, host_s, gpu_s, 0.0

    def step(self):
        self.clock.now += self.host_s  # the host's launch work
        self.busy_until = max(self.busy_until, self.clock.now) + self.gpu_s

    def sync(self):
        self.clock.now = max(self.clock.now, self.busy_until)

    def wrap(self, event):
        gpu = self

        def record(stream=None):
            event.t = max(gpu.clock.now, gpu.busy_until)  # reached after the work enqueued before it

        event.record = record
        return event


@pytest.mark.parametrize("host_s,gpu_s,bound", [(1 / 8, 1 / 64, True), (1 / 64, 1 / 8, False)])
def test_on_cuda_each_window_times_the_hosts_enqueueing_beside_the_gpus_time(monkeypatch, host_s, gpu_s, bound):
    """Issue 46, item 4, on the fake GPU machine: the events come from bench.core.cuda.timing_event (the device seam),
    the host's time is t0 to the return of the steps; a window whose host needs at least 90% of the GPU's time is
    host-bound (the GPU waited for its work)."""
    from bench.core import cuda
    from tests.fake_gpu import FakeGpuMachine

    machine = FakeGpuMachine().install(monkeypatch)
    clock = Clock()
    monkeypatch.setattr(train, "time", clock)
    gpu = VirtualGpu(clock, host_s, gpu_s)
    fake = cuda.timing_event  # the fake machine's (a FakeEvent, logged), on the test's clock
    monkeypatch.setattr(cuda, "timing_event", lambda: gpu.wrap(fake()))
    monkeypatch.setattr(train.lifeline, "set_phase", lambda phase: None)

    class Backend:
        batches = None

        def barrier(self):
            clock.now += 1.0

        def loss_scale(self):
            return None

        def skipped_steps(self):
            return None

        def devices(self):
            return [torch.device("cuda", 0)]

        def train(self, steps):
            for _ in range(steps):
                gpu.step()

    meter = types.SimpleNamespace(read=lambda: None)
    out = train.windows(Backend(), types.SimpleNamespace(windows=3, steps=4), gpu.sync, meter, waited=False)
    assert len(machine.called("timing_event")) == 6  # two events a window, through the seam
    assert out["host"] == [4 * host_s] * 3  # four steps' launch work: t0 to the return of train()
    # the GPU's time from the window's start to its last kernel's end: behind a host-bound loop the host's pace (it
    # idles between kernels), else its own kernels after the first launch; the synchronize ends the window with it
    assert out["gpu"] == [4 * host_s + gpu_s if bound else host_s + 4 * gpu_s] * 3
    assert out["seconds"] == out["gpu"]
    fields = train.host_bound([{"window_host_seconds": out["host"], "window_gpu_seconds": out["gpu"]}] * 2)
    assert fields["host_bound"] is bound and fields["window_host_seconds"] == out["host"]
    assert fields["host_over_gpu"] == pytest.approx(out["host"][0] / out["gpu"][0])


def test_host_bound_is_none_off_cuda_and_takes_the_slowest_rank_per_window():
    assert train.host_bound([{"window_host_seconds": None, "window_gpu_seconds": None}]) == {
        "window_host_seconds": None, "window_gpu_seconds": None, "host_over_gpu": None, "host_bound": None}
    got = train.host_bound([{"window_host_seconds": [0.8, 0.5], "window_gpu_seconds": [1.0, 1.0]},
                            {"window_host_seconds": [0.1, 0.95], "window_gpu_seconds": [0.5, 1.0]}])
    assert got["window_host_seconds"] == [0.8, 0.95] and got["window_gpu_seconds"] == [1.0, 1.0]
    assert got["host_over_gpu"] == pytest.approx(0.875) and got["host_bound"] is False
    edge = train.host_bound([{"window_host_seconds": [0.9], "window_gpu_seconds": [1.0]}])
    assert edge["host_bound"] is True and train.HOST_BOUND_RATIO == 0.9


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

"""bench run --reference (issue 39, item 1): every world-size-1 run beside its plain twin (bench/twins: the plainest
PyTorch loop of the same workload, harness-free), interleaved, and the harness overhead 1 - harness / twin with its
interval in the record, the report and the verdict.

The twin's sameness is checked in this process (the same weights, batch, optimizer settings and loss as the harness
builds); the arithmetic, the interleaving and the report on made-up records; one real sweep on the CPU shows the
figure reads single near its twin and sees a 50% delay injected into dp's step (BENCH_FAULT slow50), see
``test_a_fifty_percent_delay_is_seen_and_single_reads_near_its_twin``."""
import ast
import contextlib
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from bench.core import reference, results, stats
from bench.core.config import RunConfig
from tests.conftest import REPO, cli_error, records, skip_without

TWIN_IMPORTS = {"gc", "json", "sys", "time", "os", "importlib", "dataclasses", "inspect", "torch", "torch.nn.functional", "torchvision",
                "backends.models.gpt", "bench.twins",  # bench.twins: loop.py (the step and windows), ddp.py's group
                # the backends' own loops: DDP, FSDP2 as torchtitan writes it, DeepSpeed's engine
                "torch.distributed", "torch.distributed.optim", "torch.nn.parallel", "torch.distributed.device_mesh",
                "torch.distributed.fsdp", "torchvision.models.resnet", "deepspeed"}


def cfg_of(model="resnet18", image_size=32, seq_len=None, precision="fp32", world_size=1, backend="single",
           options=None, repeat_index=1, repeats=1, data="synthetic", device_type="cpu", launcher="inproc"):
    return RunConfig(backend=backend, launcher=launcher, world_size=world_size, device_type=device_type, model=model,
                     image_size=image_size, seq_len=seq_len, batch_size=2, warmup=2, steps=2, windows=4,
                     precision=precision, options=options or {}, repeat_index=repeat_index, repeats=repeats,
                     data=data, data_dir="/x" if data == "imagenet" else None).validate()


def record(backend="single", wall=(1.0,) * 4, cpu=(1.0,) * 4, device="cpu", world_size=1, repeat_index=1,
           model="resnet18", options=None, precision="fp32", launcher="inproc", **extra) -> dict:
    """An ok record of 2 samples per window whose windows took ``wall`` (and ``cpu``) seconds."""
    cfg = dict(backend=backend, launcher=launcher, world_size=world_size, device_type=device, model=model,
               image_size=32 if not model.startswith("gpt") else None, seq_len=16 if model.startswith("gpt") else None,
               precision=precision, batch_size=2, warmup=2, steps=1, windows=len(wall), options=options or {},
               repeat_index=repeat_index, repeats=2, cudnn_benchmark=True if device == "cuda" else None)
    env = {"cpu_model": "EPYC", "cpu_count": 2, "gpu_names": ["NVIDIA H100 80GB HBM3"] if device == "cuda" else [],
           "torch": "2.15.0", "started_at": "2026-01-01T00:00:00+00:00", "hostname": "h"}
    rec = results.skeleton(cfg, results.new_run_id(backend, world_size), env)
    thr, ci = stats.median_ci95(stats.window_throughputs(list(wall), 2 * world_size))
    rec.update(status="ok", window_seconds=list(wall), window_cpu_seconds=list(cpu), throughput=thr,
               throughput_ci95=ci, per_device_throughput=thr / world_size, host_peak_rss_bytes=[2 ** 30] * world_size,
               **extra)
    if device == "cuda":
        rec["memory"] = [{"rank": 0, "device_index": 0, "device_name": "NVIDIA H100 80GB HBM3",
                          "peak_allocated_bytes": 1, "peak_reserved_bytes": 2}]
    return rec


def twin_of(rec: dict, wall=(1.0,) * 4, cpu=(1.0,) * 4, status="ok", eager=None, loop=None) -> dict:
    """A twin record with the key of ``rec`` whose windows took ``wall`` (``cpu``) seconds, running ``loop`` (the
    plain one by default)."""
    twin = {k: rec[k] for k in ("model", "image_size", "seq_len", "optimizer", "precision", "batch_per_device",
                                "data", "device_type", "cudnn_benchmark", "repeat_index", "env")}
    twin.update(schema=reference.TWIN_SCHEMA, kind="twin", run_id=results.new_run_id("twin", 1), status=status,
                reason=None if status == "ok" else "exit code 1", twin="bench/twins/vision.py", global_batch=2,
                steps_per_window=1, hardware=results.hardware(rec),
                options={k: True for k in ("channels_last", "compile") if (rec.get("options") or {}).get(k)},
                window_seconds=list(wall), window_cpu_seconds=list(cpu), loop=loop or reference.PLAIN,
                throughput=stats.median_ci95(stats.window_throughputs(list(wall), 2))[0])
    if eager:
        twin.update(eager_window_seconds=list(eager), eager_window_cpu_seconds=list(eager),
                    eager_throughput=2 / float(np.median(eager)))
    return twin


# -- the twins: short, harness-free, and training exactly what the harness trains ------------------------------------

def test_the_twins_import_nothing_of_the_harness():
    files = sorted(p for p in (REPO / "bench" / "twins").glob("*.py") if p.name != "__init__.py")
    assert {str(p.relative_to(REPO)) for p in files} == {*reference.TWINS.values(), *reference.LOOPS.values(),
                                                         "bench/twins/loop.py"}
    for path in files:
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert names <= TWIN_IMPORTS, (path.name, names - TWIN_IMPORTS)
        assert len(path.read_text().splitlines()) <= 110, path.name  # a file a reader checks line by line
    for loop in reference.LOOPS.values():  # a backend's own loop: short enough to write plainly
        assert len((REPO / loop).read_text().splitlines()) <= 50, loop


@pytest.mark.parametrize("kind,cfg", [
    ("vision", dict(model="resnet18", image_size=32, options={"channels_last": True})),
    ("gpt", dict(model="gpt-micro", image_size=None, seq_len=16)),
])
def test_the_twin_builds_the_same_model_batch_optimizer_and_loss_as_the_harness(kind, cfg):
    from backends import models
    from backends.base import build_model, make_optimizer
    from bench.rank import data, train

    cfg = cfg_of(**cfg)
    settings = reference.settings(cfg.to_dict(), threads=1)
    assert settings["settle"] == train.SETTLE_STEPS and (settings["warmup"], settings["steps"], settings["windows"]) == (
        cfg.warmup, cfg.steps, cfg.windows)
    twin = importlib.import_module(f"bench.twins.{kind}")
    model, optimizer, x, y, _ = twin.setup(settings)
    harness = build_model(cfg)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in harness.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), harness.parameters()))
    hx, hy = next(data.synthetic(cfg.batch_size, cfg.image_size, torch.device("cpu"), 0,
                                 bool(cfg.options.get("channels_last")), models.for_config(cfg)))
    assert torch.equal(x, hx) and torch.equal(y, hy) and x.stride() == hx.stride()  # channels-last: NHWC strides
    theirs = make_optimizer(cfg, harness.parameters())
    assert type(optimizer) is type(theirs) and optimizer.defaults == theirs.defaults
    workload = models.for_config(cfg)
    with torch.no_grad():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        assert torch.equal(loss, workload.loss(harness(hx), hy))


# -- each backend's own plain loop (issue 46): which backends have one, and that it builds what the backend builds ----

@pytest.mark.parametrize("backend,options,expected", [
    ("single", {}, {"name": "plain"}), ("single", {"compile": True}, {"name": "plain"}),
    ("ddp", {}, {"name": "ddp"}), ("ddp_spawn", {"channels_last": True}, {"name": "ddp"}),
    ("ddp", {"ddp_bucket_mb": 5.0}, None),  # a knob its loop does not reproduce: compared with the plain loop, whole
    ("ddp_zero", {}, {"name": "ddp", "zero": True}),
    ("fsdp2", {}, {"name": "fsdp2", "mp": "autocast", "reshard": "never"}),
    ("fsdp2", {"fsdp_mp": "params", "fsdp_reshard": "always"}, {"name": "fsdp2", "mp": "params", "reshard": "every block"}),
    ("fsdp2", {"compile": True}, None),  # the loops do not compile per block as fsdp2 does
    ("dp", {}, None), ("allreduce_manual", {}, None), ("ddp_amp_syncbn", {}, None), ("horovod", {}, None)])
def test_which_backends_have_a_plain_loop_of_their_own(backend, options, expected):
    import backends

    assert backends.create(backend).twin(cfg_of(backend=backend, options=options)) == expected


def test_deepspeeds_loop_reads_the_config_the_backend_hands_deepspeed():
    import backends

    b = backends.create("ds_zero3")
    cfg = cfg_of(backend="ds_zero3", precision="bf16", options={"ds_bucket_mb": 2.0})
    loop = b.twin(cfg)
    assert loop == {"name": "ds_zero", "config": b.config(cfg, 1)[2]}
    assert loop["config"]["train_batch_size"] == 2 and loop["config"]["zero_optimization"]["stage"] == 3
    assert loop["config"]["torch_autocast"]["enabled"] is True and loop["config"]["bf16"]["enabled"] is False


@pytest.mark.parametrize("model,precision,mp,old_torch", [("resnet18", "bf16", "autocast", False),
                                                           ("resnet18", "bf16", "params", False),
                                                           ("resnet18", "bf16", "params", True),
                                                           ("gpt-micro", "fp16", "params", False)])
def test_fsdp2s_loop_shards_what_the_backend_shards(monkeypatch, model, precision, mp, old_torch):
    """The twin's fully_shard calls (torchtitan's apply_fsdp, written plainly) against backends/fsdp2.py's: the same
    modules in the same order, policies and reshard flags; its optimizer as the backend's. ``old_torch``: a
    MixedPrecisionPolicy without param_dtype_override_fn (torch 2.14 and older, the GPU machines' 2.11): BatchNorm's
    fp32 groups, one per block (before, the twin asked for the field and stopped on a TypeError)."""
    import dataclasses

    import torch.distributed.fsdp as fsdp_module

    from backends import fsdp2
    from backends.base import build_model, implementation, make_optimizer, optimizer_impl
    from bench.twins import ddp as ddp_twin
    from bench.twins import fsdp2 as twin

    if old_torch:
        @dataclasses.dataclass(frozen=True)
        class OldPolicy:  # torch 2.11's fields
            param_dtype: torch.dtype | None = None
            reduce_dtype: torch.dtype | None = None
            output_dtype: torch.dtype | None = None
            cast_forward_inputs: bool = True

        monkeypatch.setattr(fsdp_module, "MixedPrecisionPolicy", OldPolicy)
        monkeypatch.setattr(twin, "MixedPrecisionPolicy", OldPolicy)

    def calls_of(run):
        calls = []
        monkeypatch.setattr(fsdp_module, "fully_shard", lambda module, **kw: calls.append((module, kw)))
        monkeypatch.setattr(twin, "fully_shard", lambda module, **kw: calls.append((module, kw)))
        run()
        return calls

    def same(kw):
        p = kw["mp_policy"]
        return (kw.get("reshard_after_forward"), p.param_dtype, p.reduce_dtype, p.output_dtype)

    cfg = cfg_of(backend="fsdp2", model=model, image_size=32 if model == "resnet18" else None,
                 seq_len=16 if model != "resnet18" else None, precision=precision, options={"fsdp_mp": mp})
    ours, theirs = build_model(cfg), build_model(cfg)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    backend = calls_of(lambda: fsdp2.shard(ours, object(), half if mp == "params" else None, reshard="never"))
    monkeypatch.setattr(ddp_twin, "init", lambda device: None)
    monkeypatch.setattr(twin, "init_device_mesh", lambda *a: object())
    settings = {**reference.settings(cfg.to_dict(), 1, backends_twin(cfg)), "channels_last": False}
    out = {}
    plain = make_optimizer(cfg_of(backend="single", model=model, image_size=cfg.image_size, seq_len=cfg.seq_len),
                           theirs.parameters())
    loop = calls_of(lambda: out.update(r=twin.wrap(settings, theirs, plain, torch.device("cpu"))))
    def names(model, calls):  # a module's name; a group's (a list of modules): its names
        named = {id(m): n for n, m in model.named_modules()}
        return [tuple(named[id(m)] for m in c[0]) if isinstance(c[0], list) else named[id(c[0])] for c in calls]

    assert names(theirs, loop) == names(ours, backend) and [same(kw) for _, kw in loop] == [same(kw) for _, kw in
                                                                                             backend]
    if mp == "params" and model == "resnet18" and old_torch:  # BatchNorm's own fp32 groups in both, first
        assert [same(kw) for _, kw in loop[:2]] == [(False, torch.float32, torch.float32, None)] * 2
        assert all(isinstance(m, list) and all(isinstance(n, torch.nn.BatchNorm2d) for n in m) for m, _ in loop[:2])
    elif mp == "params" and model == "resnet18":  # BatchNorm's parameters stay fp32 in both
        bn = next(m for m in theirs.modules() if isinstance(m, torch.nn.BatchNorm2d)).weight
        assert loop[0][1]["mp_policy"].param_dtype_override_fn(bn) == torch.float32
    _, optimizer, autocast, step = out["r"]
    assert autocast is (mp == "autocast") and step is None
    sharded = torch.nn.Parameter(torch.zeros(1))
    sharded.placements = ()  # fully_shard is faked here: what the backend's optimizer sees on real DTensors
    assert optimizer_impl(optimizer) == implementation(cfg.optimizer, [sharded])  # fused AdamW, foreach SGD
    assert {k: v for k, v in optimizer.defaults.items() if k not in ("fused", "foreach")} == {
        k: v for k, v in make_optimizer(cfg, ours.parameters()).defaults.items() if k not in ("fused", "foreach")}


def backends_twin(cfg):
    import backends

    return backends.create(cfg.backend).twin(cfg)


def test_one_plain_twin_and_one_per_backend_loop_beside_the_world_size_1_runs():
    from bench.plan import reference as _reference

    configs = [cfg_of(backend=b, launcher="torchrun") if b != "single" else cfg_of() for b in
               ("single", "ddp", "ddp_spawn", "fsdp2", "dp")] + [cfg_of(backend="ddp", world_size=2)]
    items = _reference.plan(configs, runnable=lambda c: True)
    got = [(what, c.backend) for what, c in items]
    # the plain twin (single's loop), then DDP's (one for ddp and ddp_spawn: the same loop) and FSDP2's; dp has none
    assert got == [("twin", "single"), ("twin", "ddp"), ("twin", "fsdp2"), ("run", "single"), ("run", "ddp"),
                   ("run", "ddp_spawn"), ("run", "fsdp2"), ("run", "dp"), ("run", "ddp")]
    assert items[0][1].options == {} and items[0][1].launcher == "inproc"


def test_a_twin_is_for_world_size_1_on_synthetic_data_of_a_known_kind():
    assert reference.unavailable(cfg_of().to_dict()) is None
    assert reference.unavailable(cfg_of(model="gpt-micro", image_size=None, seq_len=16).to_dict()) is None
    assert reference.unavailable(cfg_of(world_size=2, backend="ddp").to_dict()).startswith(
        "the plain twin trains on one device")
    assert reference.unavailable(cfg_of(model="tests.user_model:factory", image_size=None).to_dict()).startswith(
        "no plain twin for your own model")
    assert reference.unavailable(cfg_of(data="imagenet").to_dict()).startswith("the plain twin trains on the synthetic")


# -- the figure: 1 - harness / twin, its interval, the timing that applies ------------------------------------------

def test_the_overhead_is_one_minus_harness_over_twin_with_the_interval_of_both():
    exact = reference.overhead([np.full(5, 95.0)], [np.full(5, 100.0)])
    assert exact["overhead"] == pytest.approx(0.05) and exact["ci95"] == pytest.approx([0.05, 0.05])
    assert exact["interval"] == stats.WITHIN_RUN and exact["runs"] == [1, 1]
    spread = reference.overhead([np.array([94.0, 95.0, 96.0, 95.0])], [np.array([99.0, 100.0, 101.0, 100.0])])
    assert spread["overhead"] == pytest.approx(0.05)
    lo, hi = spread["ci95"]
    assert 0.03 < lo < 0.05 < hi < 0.07  # the extremes of the two window sets: 1 - 101/94, 1 - 99/96
    across = reference.overhead([np.full(3, 100.0), np.full(3, 104.0)], [np.full(3, 100.0), np.full(3, 100.0)])
    assert across["interval"] == stats.ACROSS_RUNS and across["overhead"] == pytest.approx(-0.02)
    assert across["ci95"][0] == pytest.approx(-0.04) and across["ci95"][1] == pytest.approx(0.0)
    assert reference.overhead([], [np.ones(3)]) is None
    assert reference.judge({"overhead": 0.05, "ci95": [0.02, 0.08]}) == "over"
    assert reference.judge({"overhead": 0.02, "ci95": [-0.01, 0.05]}) == "over by the median"
    assert reference.judge({"overhead": 0.005, "ci95": [-0.01, 0.02]}) == "within"


def test_a_record_gets_its_repetitions_twin_in_cpu_time_on_cpus_and_wall_time_on_gpus():
    cpu = record(wall=(2.0,) * 4, cpu=(1.05,) * 4)  # a loaded machine: wall time says little, CPU time the truth
    f = reference.fields(cpu, [twin_of(cpu, wall=(1.5,) * 4, cpu=(1.0,) * 4)])
    assert f["timing"] == "CPU time" and f["overhead"] == pytest.approx(1 - 1 / 1.05)
    assert f["overhead_wall"] == pytest.approx(0.25) and f["over_threshold"] is True
    assert f["twin_throughput"] == pytest.approx(2 / 1.5) and f["twin_window_cpu_seconds"] == [[1.0] * 4]
    gpu = record(device="cuda", wall=(1.005,) * 4, cpu=(1.0,) * 4)  # the host only waits for the GPU: wall time
    g = reference.fields(gpu, [twin_of(gpu, wall=(1.0,) * 4, cpu=(3.0,) * 4)])
    assert g["timing"] == "wall time" and g["overhead"] == pytest.approx(1 - 1.0 / 1.005)
    assert g["over_threshold"] is False and g["overhead_cpu"] == pytest.approx(-2.0)
    assert reference.fields(cpu, []) == {"reason": "its plain twin did not run", "loop": None}
    assert reference.fields(cpu, [twin_of(cpu, status="failed")])["reason"] == "its plain twin failed: exit code 1"
    compiled = record(options={"compile": True}, wall=(1.0,) * 4, cpu=(1.0,) * 4)
    c = reference.fields(compiled, [twin_of(compiled, eager=(0.8,) * 4)])
    assert c["compiled_vs_eager"] == pytest.approx(0.8) and c["compiled_slower_than_eager"] is True


def test_the_slow_fault_burns_five_percent_more_cpu_time_inside_the_step():
    from bench.rank import faults

    now = [0.0]

    def clock():  # every read costs 1 ms of CPU, as a busy loop would
        now[0] += 0.001
        return now[0]

    def step():
        now[0] += 2.0
        return "loss"

    assert faults.slowed(step, clock=clock)() == "loss"
    assert now[0] == pytest.approx(2.1, abs=0.005)  # the 2 s step, then 5% of it more
    fault = faults.Fault.parse("dp/slow@rank0")

    class B:
        def __init__(self, name):
            self.name, self.rank, self.step = name, 0, step

    dp, single = B("dp"), B("single")
    fault.install(dp)
    fault.install(single)
    assert dp.step is not step and single.step is step  # only the backend named
    now[0] = 0.0
    [fifty] = faults.Fault.parse("dp/slow50@rank0").faults  # slowN: N% (the sweep below uses 50%)
    assert (fifty.kind, fifty.share) == ("slow", 0.5)
    faults.slowed(step, fifty.share, clock=clock)()
    assert now[0] == pytest.approx(3.0, abs=0.005)  # the 2 s step, then 50% of it more


# -- the sweep: where the twins go, and what the records get -----------------------------------------------------------

def test_one_twin_per_key_and_repetition_before_its_runs_then_after_them():
    from bench.plan import sweep as _plan
    from bench.plan import reference as _reference

    configs = _plan.interleave([cfg_of(backend="single"), cfg_of(backend="dp"), cfg_of(backend="ddp", world_size=2),
                                cfg_of(backend="single", precision="bf16")], 2, shuffle=False)
    items = _reference.plan(configs, runnable=lambda c: True)
    got = [(what, c.backend if what == "run" else "twin", c.precision, c.repeat_index) for what, c in items]
    assert got == [("twin", "twin", "fp32", 1), ("run", "single", "fp32", 1), ("run", "dp", "fp32", 1),
                   ("run", "ddp", "fp32", 1), ("twin", "twin", "bf16", 1), ("run", "single", "bf16", 1),
                   ("run", "single", "fp32", 2), ("run", "dp", "fp32", 2), ("twin", "twin", "fp32", 2),
                   ("run", "ddp", "fp32", 2), ("run", "single", "bf16", 2), ("twin", "twin", "bf16", 2)]
    # no twin where no world-size-1 run of the key can run here, nor for world sizes above 1 alone
    assert _reference.plan(configs, runnable=lambda c: c.precision != "bf16").count(("twin", configs[3])) == 0
    assert [w for w, _ in _reference.plan([cfg_of(backend="ddp", world_size=2)], lambda c: True)] == ["run"]


def test_attach_writes_each_records_reference_into_its_file(tmp_path):
    from bench.plan import reference as _reference

    one, two = record(repeat_index=1, cpu=(1.0,) * 4), record(repeat_index=2, cpu=(1.1,) * 4)
    wide = record(backend="ddp", world_size=2)
    custom = record(model="tests.user_model:factory")
    for rec in (one, two, wide, custom):
        results.save(rec, tmp_path)
    twins = [twin_of(one, cpu=(1.0,) * 4), twin_of(two, cpu=(1.0,) * 4)]
    twins[1]["repeat_index"] = 2
    got = {r["run_id"]: r for r in _reference.attach([one, two, wide, custom], twins, tmp_path)}
    on_disk = {r["run_id"]: r for r in records(tmp_path)}
    assert on_disk[one["run_id"]]["reference"] == got[one["run_id"]]["reference"]
    assert on_disk[one["run_id"]]["reference"]["twin_run_ids"] == [twins[0]["run_id"]]  # its own repetition's
    assert on_disk[two["run_id"]]["reference"]["overhead"] == pytest.approx(1 - 1 / 1.1)
    assert "reference" not in on_disk[wide["run_id"]]
    assert on_disk[custom["run_id"]]["reference"]["reason"].startswith("no plain twin for your own model")
    lines = _reference.lines(list(got.values()))
    assert lines[1].startswith("Harness vs its plain twin (1 - harness / twin; > 0: the harness is slower; ")
    # issue 47: in the run's own unit, CPU time labelled, the overhead computed from the two rates printed beside it
    assert "  single x1 fp32 repeat 2: 1.818 img/CPU-s in the harness vs 2 img/CPU-s in its plain twin (CPU time): " \
           "harness overhead +9.1% (95% interval +9.1 to +9.1%, CPU time, within-run only) ⚠ over 1%" in lines, lines
    assert 1 - 1.818 / 2 == pytest.approx(0.091, abs=5e-4)


def test_the_report_gives_the_overhead_across_runs_and_the_verdict_says_when_it_is_over_one_percent(tmp_path):
    from bench.commands import report
    from bench.plan import reference as _reference

    recs, twins = [], []
    for rep in (1, 2, 3):
        single = record("single", repeat_index=rep, cpu=(1.0,) * 4)
        dp = record("dp", repeat_index=rep, cpu=(1.06,) * 4)
        twin = twin_of(single, cpu=(1.0,) * 4)
        twin["repeat_index"] = rep
        recs += [single, dp]
        twins.append(twin)
    for rec in recs:
        results.save(rec, tmp_path / "raw")
    _reference.attach(recs, twins, tmp_path / "raw")
    assert report.cmd_report(__import__("argparse").Namespace(results=str(tmp_path / "raw"),
                                                              out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "**6. Harness vs its plain twin**" in md
    # issue 47: CPU-time figures labelled as such in the cells (img/CPU-s), not only in the header
    assert ("| single | fp32 | 2.0 img/CPU-s | the plain loop | 2.0 img/CPU-s | — (it is the plain loop) | +0.0 % (+0.0 "
            "to +0.0%) | CPU time | 3 / 3 | within 1% |") in md
    assert ("| dp | fp32 | 1.9 img/CPU-s | none | 2.0 img/CPU-s | — (no loop of its own: both parts together →) | "
            "+5.7 % (+5.7 to +5.7%) | CPU time | 3 / 3 | ⚠ over 1% |") in md
    assert "- Harness within 1% of its plain twin: single (+0.0%) (CPU time)." in md
    assert ("- Harness over 1% for dp: +5.7% slower than its plain twin (95% interval +5.7 to +5.7%, CPU time)."
            in md)


def test_a_backends_gap_splits_into_the_librarys_price_and_the_harnesss_part(tmp_path):
    """fsdp2 beside its own loop (bench/twins/fsdp2.py) and the plain loop: its harness windows 1.25 CPU-s, its loop's
    1.2, the plain loop's 1.0: the harness's part 1 - 1.2/1.25 = 4.0%, the library's price 1 - 1.0/1.2 = 16.7%; the
    console, the record, the report's table and the verdict give the same figures, in img/CPU-s."""
    from bench.commands import report
    from bench.plan import reference as _reference

    loop = {"name": "fsdp2", "mp": "autocast", "reshard": "never"}
    recs, twins = [], []
    for rep in (1, 2, 3):
        fsdp2 = record("fsdp2", repeat_index=rep, cpu=(1.25,) * 4, launcher="torchrun")
        plain, own = twin_of(fsdp2, cpu=(1.0,) * 4), twin_of(fsdp2, cpu=(1.2,) * 4, loop=loop)
        plain["repeat_index"] = own["repeat_index"] = rep
        recs.append(fsdp2)
        twins += [plain, own]
    for rec in recs:
        results.save(rec, tmp_path / "raw")
    got = _reference.attach(recs, twins, tmp_path / "raw")
    f = got[0]["reference"]
    assert f["loop"] == loop and f["own_loop"] is True and f["twin_run_ids"] == [twins[1]["run_id"]]
    assert f["overhead"] == pytest.approx(1 - 1.2 / 1.25) and f["library_price"] == pytest.approx(1 - 1.0 / 1.2)
    assert f["plain_twin_run_ids"] == [twins[0]["run_id"]]
    line = [ln for ln in _reference.lines(got) if ln.startswith("  fsdp2 x1 fp32 repeat 1:")][0]
    assert line == ("  fsdp2 x1 fp32 repeat 1: 1.6 img/CPU-s in the harness vs 1.667 img/CPU-s in its own loop's twin "
                    "(fsdp2) (CPU time): harness's part +4.0% (95% interval +4.0 to +4.0%, CPU time, within-run only) "
                    "⚠ over 1%; library's price +16.7% (1.667 vs 2 img/CPU-s in the plain loop; 95% interval +16.7 to "
                    "+16.7%)")
    assert report.cmd_report(__import__("argparse").Namespace(results=str(tmp_path / "raw"),
                                                              out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert ("| fsdp2 | fp32 | 1.6 img/CPU-s | 1.7 img/CPU-s (fsdp2) | 2.0 img/CPU-s | +16.7 % (+16.7 to +16.7%) | "
            "+4.0 % (+4.0 to +4.0%) | CPU time | 3 / 3 | ⚠ over 1% |") in md
    assert ("- fsdp2's gap from the plain loop: the library's price +16.7% (+16.7 to +16.7%), the harness's part +4.0% "
            "(+4.0 to +4.0%), CPU time.") in md


def test_the_report_says_host_bound_beside_the_number_and_names_what_is_left_of_a_sharded_gap(tmp_path):
    """Issue 46, items 4 and 5, on hand-built CUDA records: fsdp2 at world size 1 host-bound in 2 of its 3 runs and
    traced, single not: the throughput cell says "(host-bound)", a note says by how much, and fsdp2's gap from single is
    explained by its trace's library ranges, with their ms per step."""
    from tests.test_report import make, run_report, write

    ranges = {"FSDP::pre_forward": 2.96, "FSDP::post_backward_reduce": 7.35, "Optimizer.step#AdamW.step": 4.1,
              "aten::copy_": 9.0}
    trace = {"files": ["/r/x.rank0.trace.json.gz"], "bytes": [1000], "steps": 2, "profiled_seconds": 0.3,
             "export_seconds": 0.1, "reasons": [], "phase_ms_per_step": [{"forward": 10.0, "backward": 20.0}],
             "step_ms": [[40.0, 42.0]], "slowest_rank_per_step": [0, 0], "timeline": [None],
             "library_ms_per_step": [ranges]}
    recs = []
    for i, bound in enumerate((True, True, False)):
        recs.append(make("fsdp2", 1, 600.0, stamp=f"2026010{i}T000000Z", host_bound=bound,
                         host_over_gpu=0.97 if bound else 0.5, trace=trace if i == 2 else None))
        recs.append(make("single", 1, 1000.0, stamp=f"2026010{i}T000000Z", host_bound=False, host_over_gpu=0.3))
    assert run_report(write(tmp_path, *recs), tmp_path / "rep")[0] == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    fsdp2 = [ln for ln in md.splitlines() if ln.startswith("| fsdp2 | 1 | fp32 |")][0]
    assert "600.0 img/s ⚠ (host-bound)" in fsdp2  # ⚠: 0.6x single at world size 1 (same computation apart)
    single = [ln for ln in md.splitlines() if ln.startswith("| **single** ★ | 1 | fp32 |")][0]
    assert "host-bound" not in single
    assert ("- `fsdp2` ×1 fp32: host-bound in 2 of 3 run(s): the host took 97% of the GPU's time to enqueue each "
            "window's steps") in md
    assert ("- `fsdp2` ×1 fp32 runs at 0.60× single's throughput: at world size 1 nothing is sharded or communicated, "
            "and what is left is fsdp2's own work per step, named by its trace (rank 0, ms per traced step of 41.0): "
            "`FSDP::pre_forward` 3.0 ms (every parameter cast and copied into the unsharded buffer each step, and the "
            "group's hooks); `FSDP::post_backward_reduce` 7.3 ms (gradients copied into and out of the reduce-scatter "
            "buffer and wrapped as DTensors); `Optimizer.step#AdamW.step` 4.1 ms (the optimizer on DTensors") in md


def test_reference_is_refused_where_nothing_is_timed(capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--device", "cpu", "--find-max-batch", "--reference")
    assert (code, err) == (2, "bench: error: --reference compares timed runs with their plain twins; "
                              "--find-max-batch and --find-max-model time no run\n")


# -- a real sweep on the CPU -------------------------------------------------------------------------------------------

SWEEP_TIMEOUT_S = 420  # a guard against a hang only: the sweep takes 50-75 s on the 2-core VM beside the other worker


def _kill_tree(pid: int) -> None:
    """``pid`` and every process it started, killed."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _sweep(tmp):
    """single and dp (each step 50% slower: BENCH_FAULT dp/slow50) beside their twin, 3 interleaved repetitions; gpt-tiny
    at 1 thread (~0.2 s of CPU per window); ``python -m bench run`` in a process of its own on one core (its affinity,
    which every run and twin inherits: one core, one thread), at normal priority, in make test's run beside the other
    worker's tests.

    It ran in a second pass of its own, alone, at real-time priority on one core (SCHED_RR), from when its control was
    4% (single against its twin: beside the other worker it read -6.1, -8.3 and +6.0%): a core idled for the sweep's
    50-65 s in every make test. With the tolerance sized since (the test's docstring), sweeps beside the contract
    test's 2-rank runs read (single, dp) (-4.0, 32.7) and (1.4, 31.2) at SCHED_RR, (3.6, 33.8) and (3.1, 32.1) at
    normal priority, on one core each time: well inside it. Real-time priority is gone with the pass: beside other
    tests it would starve any process pinned to its core (test_compare.py pins its two sides). Past SWEEP_TIMEOUT_S the
    tree is killed and the test fails saying so."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
    env.update(BENCH_FAULT="dp/slow50@rank0", BENCH_PEAK_CACHE=str(tmp / "peak"), OMP_WAIT_POLICY="PASSIVE")
    args = ["run", "--backends", "single,dp", "--gpus", "1", "--device", "cpu", "--model", "gpt-tiny", "--seq-len",
            "64", "--batch-size", "4", "--warmup", "2", "--steps", "2", "--windows", "5", "--repeat", "3",
            "--reference", "--results", str(tmp / "raw")]
    cpu = max(os.sched_getaffinity(0))
    with subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) as p:
        try:
            out, err = p.communicate(timeout=SWEEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_tree(p.pid)
            out, err = p.communicate()
            pytest.fail(f"the sweep did not end in {SWEEP_TIMEOUT_S} s; killed\n{out[-2000:]}\n{err[-2000:]}")
    proc = subprocess.CompletedProcess(["bench", *args], p.returncode, out, err)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, proc


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("reference"))


@pytest.mark.slow
def test_a_fifty_percent_delay_is_seen_and_single_reads_near_its_twin(sweep):
    """The tolerance: dp (50% more CPU time per step: 1 - 1/1.5 = 33.3%) 20 to 50 points above single (dp - single:
    both are read against the same three twins, and each dp run follows its single run, so the machine's drift mostly
    cancels there), and single within 30% of its twin (a gross-error check: a harness that times other work than its
    twin, another batch, model or steps per window, reads 30% or more).

    Sized on what one sweep of 3 repetitions resolves on this 2-core VM (docs/close-to-the-machine.md, "How the delay
    test is sized"): the machine's speed drifts by up to 20% over seconds, so the CPU time of the same run moves by that
    much from one process to the next (one sweep's twins: 247, 318, 301 ms per window), and single's figure read -18.6
    to +12.0% in 16 sweeps, CI's included (it read -6.1, -8.3 and +6.0 in one make test, when the control was 4%). dp -
    single, with a 20% delay (16.7 points expected), read 9.9 to 23.2 in 6 sweeps; with the delay switched off, 0.9,
    2.7 and 1.4 in 3. At 50% it read 30.6, 33.9 and 40.4 (a spin after each step also slows the step itself a little:
    the figure reads a few points above 33.3). A broken delay (0 points) fails by 4 standard deviations. A harness a
    few percent slower than its twin is what ``bench run --reference`` with more repetitions resolves, on a quieter
    machine (its interval says how far), not what one sweep of 3 on this VM can.

    A sweep that misses either is followed by another, at most two more; the test passes on the first sweep where both
    hold, and fails naming every sweep's pair."""
    from bench.report.summary import summarise, usable_records

    tmp, proc = sweep
    seen = []
    for attempt in range(3):
        if attempt:
            tmp, proc = _sweep(tmp / f"again{attempt}")
        rows = {r["backend"]: r for r in summarise(usable_records(tmp / "raw", print)).to_dict("records")}
        single, dp = rows["single"]["harness_overhead_pct"], rows["dp"]["harness_overhead_pct"]
        assert rows["single"]["overhead_timing"] == "CPU time" and rows["single"]["twin_runs"] == 3
        seen.append((round(single, 1), round(dp, 1)))
        if abs(single) <= 30.0 and 20.0 <= dp - single <= 50.0:
            break
    assert abs(single) <= 30.0 and 20.0 <= dp - single <= 50.0, (
        f"no sweep both kept single within 30% of its twin and saw the 50% delay as 20 to 50 points on dp; "
        f"(single, dp) per sweep: {seen}")
    assert "Harness vs its plain twin (1 - harness / twin; > 0: the harness is slower; " in proc.stdout
    assert "seq/CPU-s in the harness vs " in proc.stdout  # issue 47: the rates it is computed from, CPU time said


@pytest.mark.slow
def test_the_sweep_interleaves_the_twins_and_every_record_names_its_own(sweep):
    tmp, _ = sweep
    recs, twins = records(tmp / "raw"), records(tmp / "raw" / "reference")
    assert len(recs) == 6 and len(twins) == 3 and all(t["status"] == "ok" for t in twins)
    order = sorted([(r["env"]["started_at"], r["run_id"], r.get("backend", "twin")) for r in recs + twins])
    # twins start only after the previous run ended: started_at (seconds) orders them; ties keep the run id's order
    # the first repetition as planned, the second turned so it neither starts nor ends as the first, the third again
    assert [name for *_, name in order] == ["twin", "single", "dp", "dp", "single", "twin", "twin", "single", "dp"]
    by_rep = {t["repeat_index"]: t for t in twins}
    for rec in recs:
        ref = rec["reference"]
        assert ref["twin_run_ids"] == [by_rep[rec["repeat_index"]]["run_id"]] and ref["timing"] == "CPU time"
        assert reference.key(rec) == reference.key(by_rep[rec["repeat_index"]], by_rep[1]["hardware"])
        assert len(rec["window_cpu_seconds"]) == 5 and all(0 < c for c in rec["window_cpu_seconds"])
        assert rec["sdpa"]["kernels"] == ["flash (CPU)"]  # a GPT's attention kernel, from one profiled step
    for twin in twins:
        assert twin["twin"] == "bench/twins/gpt.py" and len(twin["window_cpu_seconds"]) == 5
        settings = json.loads((tmp / "raw" / "reference" / "logs" / f"{twin['run_id']}.settings.json").read_text())
        assert settings["threads"] == 1 and settings["gpt"] == [4, 256, 4, 8192]  # one core: one thread, as the runs


@pytest.mark.slow
def test_the_first_run_measures_the_matmul_peak_and_every_later_run_reuses_it(sweep):
    """Issue 39, item 2, in the same sweep: MFU against the measured CPU peak in every record."""
    from backends.models.flops import flops_per_sample

    tmp, _ = sweep
    recs = sorted(records(tmp / "raw"), key=lambda r: (r["repeat_index"], r["order_index"]))  # the sweep's order
    entries = list((tmp / "peak").glob("*.json"))
    assert len(entries) == 1 and "1threads" in entries[0].name and "-fp32-" in entries[0].name
    entry = json.loads(entries[0].read_text())
    assert [r["peak_measured"]["measured_now"] for r in recs] == [True] + [False] * 5  # once, then the cache
    for rec in recs:
        p = rec["peak_measured"]
        assert (p["cache"], p["measured_at"], p["tflops"], p["mode"]) == (str(entries[0]), entry["measured_at"],
                                                                          entry["tflops"], "fp32")
        assert rec["peak_mode"] == "fp32" and rec["mfu"] is None  # no datasheet for a CPU
        assert rec["mfu_measured"] == pytest.approx(flops_per_sample("gpt-tiny", None, 64) * rec["throughput"]
                                                    / (entry["tflops"] * 1e12))
        assert 0 < rec["mfu_measured"] < 1
    assert entry["best_shape"] in [s["shape"] for s in entry["shapes"]]
    assert entry["tflops"] == max(s["tflops"] for s in entry["shapes"])


@pytest.fixture(scope="module")
def own_loops(tmp_path_factory):
    """fsdp2 and ddp at world size 1 beside their own loops and the plain loop: one repetition, gpt-micro."""
    from tests.conftest import bench_inproc

    tmp = tmp_path_factory.mktemp("loops")
    proc = bench_inproc("run", "--backends", "fsdp2,ddp", "--gpus", 1, "--device", "cpu", "--model", "gpt-micro",
                        "--seq-len", 16, "--batch-size", 2, "--warmup", 2, "--steps", 1, "--windows", 3,
                        "--precision", "bf16", "--reference", "--results", tmp / "raw")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp, proc


@pytest.mark.slow
def test_each_backend_runs_beside_its_own_loop_and_the_plain_loop(own_loops):
    tmp, proc = own_loops
    twins = {t["loop"]["name"]: t for t in records(tmp / "raw" / "reference")}
    assert set(twins) == {"plain", "fsdp2", "ddp"} and all(t["status"] == "ok" for t in twins.values())
    assert twins["fsdp2"]["loop"] == {"name": "fsdp2", "mp": "autocast", "reshard": "never"}
    assert twins["fsdp2"]["loop_file"] == "bench/twins/fsdp2.py" and twins["plain"]["loop_file"] is None
    for rec in records(tmp / "raw"):
        f = rec["reference"]
        name = rec["backend"]
        assert f["own_loop"] is True and f["loop"]["name"] == name and f["twin_run_ids"] == [twins[name]["run_id"]]
        assert f["plain_twin_run_ids"] == [twins["plain"]["run_id"]] and f["timing"] == "CPU time"
        assert f["library_price"] == pytest.approx(1 - f["twin_rate"] / f["plain_twin_rate"])
        assert f["overhead"] == pytest.approx(1 - f["harness_rate"] / f["twin_rate"])
        assert len(f["library_price_ci95"]) == 2 and f["library_price_ci95"][0] <= f["library_price"]
    for name in ("fsdp2", "ddp"):  # the console: rates in the run's unit, CPU time said
        assert any(ln.startswith(f"  {name} x1 bf16: ") and " seq/CPU-s in its own loop's twin (" in ln and
                   "library's price" in ln for ln in proc.stdout.splitlines()), proc.stdout
    assert "ok (fsdp2's own loop, bench/twins/fsdp2.py): " in proc.stderr + proc.stdout


@pytest.mark.slow
def test_deepspeeds_own_loop_trains_as_a_script_of_its_own(tmp_path):
    """bench/twins/ds_zero.py run as the harness runs a twin (python bench/twins/gpt.py SETTINGS OUT), with the config
    ds_zero2 hands DeepSpeed: it writes its window times."""
    import backends
    from bench.launch import twin

    skip_without("deepspeed")
    cfg = cfg_of(backend="ds_zero2", launcher="torchrun", model="gpt-micro", image_size=None, seq_len=16,
                 precision="bf16")
    loop = twin.loop_of(cfg)
    assert loop == backends.create("ds_zero2").twin(cfg) and loop["name"] == "ds_zero"
    settings, out = tmp_path / "settings.json", tmp_path / "out.json"
    settings.write_text(json.dumps(reference.settings(cfg.to_dict(), 1, loop)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(reference.script("language")), str(settings), str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    assert len(got["window_seconds"]) == len(got["window_cpu_seconds"]) == cfg.windows
    assert all(t > 0 for t in got["window_seconds"])

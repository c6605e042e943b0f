"""bench tune (issue 39, item 3): per backend, the settings a user would try, searched one at a time from the shared
defaults within a time budget; a candidate replaces the incumbent only when its 95% interval lies above the
incumbent's; each backend's best as a reusable bench run command line and in RESULTS/tune; the report's "At their
best" section and verdict line. The search is tested with a made-up measure and clock (no launches); one small real
search runs on the CPU. FSDP2's --fsdp-reshard knob, which the search tries, is tested here too."""
import argparse
import json
import shlex

import pytest

import backends
from bench.commands import tune
from bench.plan.sweep import parse_run, plan
from bench.core import results
from bench.core.tune import describe
from tests.conftest import bench_inproc, cli_error


def fake(table: dict, seconds: float = 10.0, clock=None):
    """A measure function: each settings' (median, half-width of its interval), or a failure; ``clock`` advances by
    ``seconds`` per trial. Records what it was asked."""
    asked = []

    def measure(settings):
        asked.append(dict(settings))
        if clock is not None:
            clock[0] += seconds
        got = table.get(tuple(sorted(settings.items())))
        if got is None or isinstance(got, str):
            return {"status": got or "failed", "reason": "out of memory", "median": None, "ci95": None,
                    "seconds": seconds}
        median, half = got
        return {"status": "ok", "reason": None, "median": median, "ci95": [median - half, median + half],
                "seconds": seconds}

    return measure, asked


def key(**settings):
    return tuple(sorted(settings.items()))


DIMS = [("batch_size", (4, 8, 16)), ("channels_last", (True,)), ("compile", (True,))]


def test_a_candidate_replaces_the_best_only_above_its_interval_and_the_batch_doubles_while_it_wins():
    measure, asked = fake({key(): (100.0, 2.0), key(batch_size=4): (130.0, 2.0), key(batch_size=8): (129.0, 3.0),
                           key(batch_size=4, channels_last=True): (133.0, 5.0),  # faster, but within the noise
                           key(batch_size=4, compile=True): (150.0, 1.0)})
    now = [0.0]
    found = tune.search(DIMS, measure, budget_s=1000, clock=lambda: now[0])
    assert asked == [{}, {"batch_size": 4}, {"batch_size": 8}, {"batch_size": 4, "channels_last": True},
                     {"batch_size": 4, "compile": True}]  # no batch 16: batch 8 did not win
    assert found["best"]["settings"] == {"batch_size": 4, "compile": True} and found["best"]["median"] == 150.0
    assert found["default"]["median"] == 100.0 and found["default"]["verdict"] == "the starting point"
    verdicts = [t["verdict"] for t in found["trials"]]
    assert verdicts[1] == "faster than the defaults beyond the intervals: the new best"
    assert verdicts[2] == verdicts[3] == "not faster than batch 4 beyond the intervals"
    assert tune.above({"ci95": [10.1, 11]}, {"ci95": [9, 10]}) and not tune.above({"ci95": [10, 11]}, {"ci95": [9, 10]})


def test_no_candidate_starts_that_would_not_finish_within_the_budget():
    now = [0.0]
    measure, asked = fake({key(): (100.0, 1.0), key(batch_size=4): (90.0, 1.0), key(channels_last=True): (99.0, 1.0),
                           key(compile=True): (120.0, 1.0)}, seconds=10.0, clock=now)
    found = tune.search(DIMS, measure, budget_s=38.0, clock=lambda: now[0], extra_s=lambda s: 30.0 if s.get("compile")
                        else 0.0)
    # 10 s each, started only where 1.25 x the slowest (12.5 s) fits; compile would need 12.5 + 30 s
    assert asked == [{}, {"batch_size": 4}, {"channels_last": True}]
    assert found["trials"][-1]["verdict"] == "not run: about 42 s needed, 8 s of the budget left"
    assert found["best"]["settings"] == {} and found["spent_s"] == 30.0
    # a backend's first trial is estimated from the trials of those before it: it is not started when that cannot fit
    measure, asked = fake({key(): (100.0, 1.0)}, seconds=10.0, clock=now)
    found = tune.search(DIMS, measure, budget_s=20.0, clock=lambda: now[0], first_s=20.0)
    assert asked == [] and found["best"] is None and found["default"]["status"] == "not run"
    assert found["default"]["verdict"] == "not run: about 25 s needed, 20 s of the budget left"


def test_a_disturbed_trial_decides_nothing_and_the_console_gives_the_unit():
    """Issue 47: trials at load 3.5-4.6 were never flagged, and "the defaults: 10.0/s" had no unit."""
    measure, asked = fake({key(): (100.0, 1.0), key(batch_size=4): (130.0, 1.0)})

    def disturbed(settings):
        got = measure(settings)
        return {**got, "disturbed": True, "disturbed_reasons": ["other processes used 45% of the 2 CPUs"]} \
            if settings else got

    said = []
    found = tune.search(DIMS[:1], disturbed, budget_s=1000, clock=lambda: 0.0, say=said.append, unit="img/s")
    assert found["best"]["settings"] == {}  # faster beyond the intervals, but disturbed: not the new best
    assert said[:2] == ["  the defaults: 100.0 img/s (95% CI 99.0-101.0); the starting point",
                        "  batch 4: 130.0 img/s (95% CI 129.0-131.0); faster than the defaults beyond the intervals, "
                        "but not judged: disturbed runs decide nothing (⚠ disturbed: other processes used 45% of the 2 "
                        "CPUs)"]
    assert tune.exit_code([{"status": "ok", "disturbed_trials": 1}]) == 3
    assert tune.exit_code([{"status": "failed"}, {"status": "ok", "disturbed_trials": 1}]) == 1
    assert tune.exit_code([{"status": "ok", "disturbed_trials": 0}, {"status": "skipped"}]) == 0


def test_it_tunes_at_the_world_sizes_and_thread_shares_the_sweep_would_run(monkeypatch):
    """Issue 47: bench tune tuned ddp at world size 1 where `make bench` runs it at 2 on the CPU."""
    from bench.plan import sweep as _plan

    monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cpu", 4))
    sweep, _ = plan(parse_run(["--backends", "single,dp,ddp", "--device", "cpu"]))
    got = tune.targets(sweep, every_size=False)
    assert [(c.backend, c.world_size) for c in got] == [("single", 1), ("dp", 1), ("ddp", 4)]
    assert {c.threads for c in got} == {c.threads for c in sweep}  # every rank the sweep's share of the cores
    every, _ = plan(parse_run(["--backends", "single,ddp", "--device", "cpu", "--gpus", "1,2"]))
    assert [(c.backend, c.world_size) for c in tune.targets(every, every_size=True)] == [
        ("single", 1), ("ddp", 1), ("ddp", 2)]


def test_a_failed_default_has_no_best_and_a_failed_candidate_keeps_the_incumbent():
    measure, _ = fake({})
    found = tune.search(DIMS, measure, budget_s=100, clock=lambda: 0.0)
    assert found["best"] is None and found["default"]["verdict"] == "failed: out of memory"
    measure, asked = fake({key(): (100.0, 1.0), key(channels_last=True): (120.0, 1.0)})
    found = tune.search(DIMS, measure, budget_s=100, clock=lambda: 0.0)
    assert asked == [{}, {"batch_size": 4}, {"channels_last": True}, {"channels_last": True, "compile": True}]
    assert found["trials"][1]["verdict"] == "failed: out of memory"  # and the doubling stopped there
    assert found["best"]["settings"] == {"channels_last": True}


@pytest.mark.parametrize("backend,device,kind,want", [
    ("ddp", "cpu", "vision", ["batch_size", "channels_last", "ddp_bucket_mb", "ddp_grad_as_bucket_view",
                              "ddp_static_graph", "compile"]),
    ("fsdp2", "cuda", "language", ["batch_size", "cudnn_benchmark", "fsdp_reshard", "fsdp_blocks_per_group",
                                   "compile"]),
    ("single", "cpu", "vision", ["batch_size", "channels_last", "compile"]),
    ("dp", "cuda", "vision", ["batch_size", "cudnn_benchmark"]),  # dp refuses channels_last and --compile
])
def test_each_backend_is_searched_over_the_settings_it_honours(backend, device, kind, want):
    dims = tune.dimensions(backend, set(), device, kind, 8)
    assert [k for k, _ in dims] == want
    assert dims[0] == ("batch_size", (16, 32, 64))
    if backend == "fsdp2":
        assert dict(dims)["fsdp_reshard"] == ("never", "always")
    assert "cudnn_benchmark" not in dict(tune.dimensions(backend, {"cudnn_benchmark"}, device, kind, 8))


def test_the_best_settings_become_a_bench_run_command_that_plans_them():
    args = parse_run(["--backends", "ddp", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
                      "--warmup", "2", "--windows", "3", "--results", "/tmp/x"])
    base = tune.argv_of(args, drop=("backends", "gpus", "max_gpus", "results"))
    assert base == ["--device", "cpu", "--model", "resnet18", "--image-size", "32", "--warmup", "2", "--windows", "3"]
    best = {"batch_size": 16, "channels_last": True, "ddp_bucket_mb": 100.0, "ddp_static_graph": True}
    flags = tune.flags_of(best)
    assert flags == ["--batch-size", "16", "--channels-last", "--ddp-bucket-mb", "100", "--ddp-static-graph"]
    [cfg], _ = plan(parse_run([*base, "--backends", "ddp", "--gpus", "1", *flags]))
    assert cfg.batch_size == 16 and cfg.options == {"channels_last": True, "ddp_bucket_mb": 100.0,
                                                    "ddp_static_graph": True}
    assert describe(best) == "batch 16, channels_last, ddp_bucket_mb=100.0, ddp_static_graph"
    assert describe({}) == "the defaults" and describe({"cudnn_benchmark": "off"}) == "cudnn.benchmark off"
    # the command gives each flag once: a shared --batch-size 2 gives way to the best's --batch-size 4
    assert tune.reproduce(["--device", "cpu", "--batch-size", "2", "--channels-last", "--backends", "ddp"],
                          ["--batch-size", "4", "--compile"]) == ["--device", "cpu", "--channels-last", "--backends",
                                                                  "ddp", "--batch-size", "4", "--compile"]

    def configure(settings):
        return plan(parse_run([*base, "--backends", "ddp", "--gpus", "1", *tune.flags_of(settings)]))[0][0]

    # --compile needs 3 warm-up steps; this sweep gives 2: that trial (and its command) gets 3
    assert tune.widen_warmup({"compile": True}, configure) == {"compile": True, "warmup": 3}
    assert tune.widen_warmup({"channels_last": True}, configure) == {"channels_last": True}


def summary_doc() -> dict:
    def trial(settings, median, half=1.0):
        return {"settings": settings, "status": "ok", "median": median, "ci95": [median - half, median + half],
                "unit": "img/s", "seconds": 5.0, "verdict": "x"}

    return {"schema": "tune-1", "kind": "tune", "created_at": "2026-01-01T00:00:00+00:00", "budget_s": 120.0,
            "spent_s": 100.0, "device_type": "cpu", "hardware": "CPU: EPYC", "world_size": 1,
            "workload": {"model": "resnet18", "image_size": 32, "precision": "fp32"},
            "backends": [
                {"backend": "single", "world_size": 1, "status": "ok", "default": trial({}, 100.0),
                 "best": trial({"batch_size": 16}, 140.0), "command": "python -m bench run --backends single",
                 "trials": [trial({}, 100.0), trial({"batch_size": 16}, 140.0)]},
                {"backend": "ddp", "world_size": 1, "status": "ok", "default": trial({}, 104.0),
                 "best": trial({"batch_size": 16, "channels_last": True}, 150.0),
                 "command": "python -m bench run --backends ddp --batch-size 16 --channels-last",
                 "trials": [trial({}, 104.0)] * 3},
                {"backend": "dp", "world_size": 1, "status": "skipped", "reason": "no", "default": None, "best": None}]}


def test_the_report_compares_the_backends_at_their_best_and_at_the_defaults(tmp_path):
    from bench.commands import report
    from tests.test_reference import record

    results.save(record("single"), tmp_path / "raw")
    (tmp_path / "raw" / "tune").mkdir()
    (tmp_path / "raw" / "tune" / "summary-20250101T000000Z.json").write_text(json.dumps({**summary_doc(), "hardware":
                                                                                       "an older one"}))
    (tmp_path / "raw" / "tune" / "summary-20260101T000000Z.json").write_text(json.dumps(summary_doc()))
    assert report.cmd_report(argparse.Namespace(results=str(tmp_path / "raw"), out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    section = md.split("## At their best (bench tune)\n", 1)[1].split("\n## ", 1)[0]
    assert "(CPU: EPYC, cpu, model resnet18, image_size 32, precision fp32; budget 120 s, 100 s spent)" in section
    assert ("| ddp | resnet18 | 1 | 104.0 img/s (103.0–105.0) | 150.0 img/s (149.0–151.0) | 1.44× |  | batch 16, "
            "channels_last | 3 | `python -m bench run --backends ddp --batch-size 16 --channels-last` |") in section
    assert "| dp | resnet18 | 1 |  |  |  |  | skipped: no | 0 |  |" in section
    assert ("**At their best (bench tune): ddp is fastest, 150.0 img/s with batch 16, channels_last; at the shared "
            "defaults ddp was, 104.0 img/s.**") in md
    tied = summary_doc()
    tied["backends"][0]["best"]["median"], tied["backends"][0]["best"]["ci95"] = 149.5, [148.5, 150.5]
    from bench.report import tune as report_tune

    [v] = report_tune.verdicts({**tied, "_path": "x"})
    assert v["headline"].startswith("At their best (bench tune): ddp is fastest, 150.0 img/s with batch 16, "
                                    "channels_last (its interval overlaps single: not established)")
    assert report_tune.verdicts(None) == [] and report_tune.section(None) == []
    # a disturbed best decides nothing: no winner named
    busy = summary_doc()
    busy["backends"][1]["best"]["disturbed"] = True
    [v] = report_tune.verdicts({**busy, "_path": "x"})
    assert not v["established"] and v["short"] == ("ddp is fastest at its best (150.0 img/s), but trials of ddp were "
                                                   "disturbed: no winner established.")


def test_two_workloads_get_a_verdict_each_and_their_mfu_against_the_measured_peak():
    """Issue 63: gpu-best tunes ResNet-50 and gpt-350m in one summary. The backends are compared within a workload, never
    across (a verdict each), and each row gives MFU against the measured peak at the defaults and at the best."""
    from bench.report import tune as report_tune

    doc = summary_doc()
    doc["workload"] = {"model": "resnet50", "precision": "bf16"}
    one, two, _ = doc["backends"]
    one.update(model="resnet50")
    one["default"]["mfu_measured"], one["best"]["mfu_measured"] = 0.312, 0.44
    gpt = {**json.loads(json.dumps(two)), "model": "gpt-350m"}
    gpt["best"].update(median=90.0, ci95=[89.0, 91.0], unit="tok/s", mfu_measured=0.455)
    gpt["default"].update(unit="tok/s")
    two.update(model="resnet50")
    doc["backends"] = [one, two, gpt]
    lines = report_tune.section({**doc, "_path": "x"})
    assert "(CPU: EPYC, cpu, models resnet50, gpt-350m, precision bf16; budget 120 s, 100 s spent)" in lines[2]
    rows = [ln for ln in "\n".join(lines).splitlines() if ln.startswith(("| single", "| ddp"))]
    assert rows[0].startswith("| single | resnet50 | 1 | 100.0 img/s (99.0–101.0) | 140.0 img/s (139.0–141.0) | 1.40× | "
                              "31.2% → 44.0% | batch 16 |")
    assert rows[2].startswith("| ddp | gpt-350m | 1 | 104.0 tok/s (103.0–105.0) | 90.0 tok/s (89.0–91.0) | 0.87× | "
                              "— → 45.5% |")
    vs = report_tune.verdicts({**doc, "_path": "x"})
    assert [v["title"] for v in vs] == ["CPU: EPYC, cpu, resnet50: the backends at their best (bench tune)",
                                        "CPU: EPYC, cpu, gpt-350m: the backends at their best (bench tune)"]
    assert vs[0]["headline"].startswith("At their best (bench tune), resnet50: ddp is fastest, 150.0 img/s")
    assert vs[1]["headline"] == ("At their best (bench tune), gpt-350m: ddp is fastest, 90.0 tok/s with batch 16, "
                                 "channels_last, 45.5% MFU against the measured peak; at the shared defaults ddp was, "
                                 "104.0 tok/s.")
    assert vs[1]["short"] is None  # alone in its workload: nothing to compare it with


class FakeTrials:
    """``launch.run_one`` for bench tune, with no launch: each trial takes the next of ``durations`` (seconds on a fake
    clock, which bench tune reads), or is killed at its time limit; an ok one writes a record as a rank 0 would."""

    def __init__(self, monkeypatch, durations, throughput=100.0):
        import types

        from bench import launch

        self.now, self.durations, self.throughput, self.configs = 0.0, list(durations), throughput, []
        monkeypatch.setattr(tune, "time", types.SimpleNamespace(monotonic=lambda: self.now))
        monkeypatch.setattr(launch, "run_one", self.run_one)

    def run_one(self, cfg, results_dir, env_meta, backend, **kw):
        import time

        self.configs.append(cfg)
        took = self.durations.pop(0)
        rec = results.skeleton(cfg.to_dict(), results.new_run_id(cfg.backend, cfg.world_size), env_meta)
        if took > cfg.timeout:
            self.now += cfg.timeout
            rec.update(status="failed", reason=f"timed out after {cfg.timeout:.0f} s")
        else:
            self.now += took
            t = time.time()
            rec.update(status="ok", throughput=self.throughput, throughput_ci95=[self.throughput - 1,
                                                                                 self.throughput + 1],
                       window_seconds=[0.1, 0.1], windows_wall_span=[t - 0.2, t])
        results.save(rec, results_dir)
        return rec


def test_it_stays_in_its_budget_tunes_the_sweep_s_world_sizes_writes_sweep_records_and_reports_alone(
        tmp_path, monkeypatch, capsys):
    """Issue 47: with --budget-s 120 bench tune took 131 s (ddp 74.6 s of a 67 s share), tuned ddp at world size 1,
    wrote records without machine or disturbed fields, and bench report could not read its results alone."""
    from bench.plan import sweep as _plan
    from bench.core import trust

    monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cpu", 2))
    trials = FakeTrials(monkeypatch, [20, 30, 20, 20, 60, 60])
    calls = []

    def reasons(machine, device_type):  # the third trial (ddp's first) ran beside another process
        calls.append(1)
        return ["other processes used 45% of the 2 CPUs (0.90 cores) during the timed windows"] if len(calls) == 3 \
            else []

    monkeypatch.setattr(trust, "machine_reasons", reasons)
    code, out = None, None
    with pytest.raises(SystemExit) as e:
        from bench import cli

        cli.main(["tune", "--backends", "single,ddp", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
                  "--batch-size", "2", "--warmup", "2", "--steps", "1", "--windows", "2", "--budget-s", "120",
                  "--results", str(tmp_path / "raw")])
    code, (out, err) = e.value.code, capsys.readouterr()
    [path] = (tmp_path / "raw" / "tune").glob("summary-*.json")
    doc = json.loads(path.read_text())
    single, ddp = doc["backends"]
    assert (single["world_size"], ddp["world_size"]) == (1, 2)  # as the sweep runs them on 2 cores
    assert [(c.backend, c.world_size) for c in trials.configs] == [("single", 1)] * 2 + [("ddp", 2)] * 3
    # single: 20 + 30 s; the next (1.25 x 30 s) did not fit its 60 s share. ddp: 70 s left; its first trial estimated
    # from single's (37.5 s) fits; the third one, started with 30 s left, was stopped at the budget's end
    assert doc["spent_s"] == 120.0 and [t["status"] for t in ddp["trials"]][:3] == ["ok", "ok", "stopped"]
    assert ddp["trials"][2]["verdict"] == "stopped: stopped at the end of the budget, after 30 s"
    assert trials.configs[-1].timeout == 30.0  # its time limit was what was left of the budget
    recs = [json.loads(p.read_text()) for p in sorted((tmp_path / "raw" / "tune" / "raw").glob("*.json"))]
    assert len(recs) == 5 and all("machine" in r and "disturbed" in r for r in recs if r["status"] == "ok")
    assert sum(bool(r.get("disturbed")) for r in recs) == 1 and ddp["disturbed_trials"] == 1
    assert code == 3  # nothing failed, but a trial was disturbed: inconclusive
    assert "  the defaults: 100.0 img/s (95% CI 99.0-101.0); the starting point\n" in out
    assert f"tune: {path} (120 s of a 120 s budget)" in out
    # bench report reads the tune results alone
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--results", str(tmp_path / "raw"), "--out", str(tmp_path / "rep")])
    out, _ = capsys.readouterr()
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert e.value.code == 0 and "## At their best (bench tune)" in md and "| ddp | resnet18 | 2 |" in md
    assert "5 trial record(s)" in md and "== Verdict" in out


@pytest.mark.parametrize("args,message", [
    (["--budget-s", 0], "bench: error: --budget-s must be a positive number of seconds, got 0"),
    (["--precision", "fp16"], "bench: error: nothing to run: every backend to tune would be skipped here (single x1, "
                              "dp x1, ddp x"),
    (["--reference"], "bench: error: bench tune runs one timed run per candidate; --reference is for bench run"),
    (["--backends", "nope"], "bench: error: --backends 'nope': unknown backend nope; choose from single,"),
])
def test_bad_input_is_one_line(capsys, tmp_path, args, message):
    code, err = cli_error(capsys, "tune", "--device", "cpu", "--results", tmp_path, *map(str, args))
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(message), err


# -- FSDP2's reshard policy, the knob the search tries for it ---------------------------------------------------------

def test_fsdp_reshard_is_fsdp2s_knob_recorded_in_options_and_default_records_nothing():
    from backends import fsdp2

    assert fsdp2.FSDP_RESHARD in fsdp2.FSDP2.knobs and fsdp2.RESHARD == {"never": "never", "always": "every block",
                                                                          "default": None}
    configs, _ = plan(parse_run(["--backends", "fsdp2,ddp", "--gpus", "2", "--device", "cpu", "--fsdp-reshard",
                                 "always"]))
    by = {c.backend: c for c in configs}
    assert by["fsdp2"].options == {"fsdp_reshard": "always"}
    assert backends.create("ddp").unavailable(by["ddp"]).startswith("ddp cannot honour --fsdp-reshard")
    configs, _ = plan(parse_run(["--backends", "fsdp2", "--gpus", "2", "--device", "cpu", "--fsdp-reshard", "default"]))
    assert configs[0].options == {}  # the same configuration as no flag


def test_always_reshards_every_block_the_last_included(monkeypatch):
    import torch.distributed.fsdp as fsdp_module
    from torchvision.models.resnet import BasicBlock

    import torch
    from backends import fsdp2

    calls = []
    monkeypatch.setattr(fsdp_module, "fully_shard", lambda module, **kw: calls.append(kw.get("reshard_after_forward",
                                                                                             "default")))
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), BasicBlock(4, 4), BasicBlock(4, 4), BasicBlock(4, 4))
    fsdp2.shard(model, object(), None, reshard="every block")
    assert calls == [True, True, True, "default"]  # every block, then the root with FSDP2's default
    calls.clear()
    fsdp2.shard(model, object(), None, reshard="blocks but the last")
    assert calls == [True, True, False, "default"]


@pytest.mark.slow
def test_fsdp2_setup_reads_the_knob(monkeypatch):
    """In this process, one gloo rank: what setup built, read back by describe()."""
    import torch.distributed as dist

    from backends import fsdp2
    from bench.core.config import RunConfig
    from bench.launch.run import free_port

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    got = {}
    try:
        for value in ("always", "never", None):
            cfg = RunConfig(backend="fsdp2", launcher="torchrun", world_size=1, device_type="cpu", model="gpt-micro",
                            image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1,
                            options={"fsdp_reshard": value} if value else {}).validate()
            backend = fsdp2.FSDP2("fsdp2", "torchrun")
            backend.setup(cfg)
            got[value] = backend.describe()["reshard_after_forward"]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert got == {"always": "every block", "never": "never", None: "never"}  # None: world size 1's default


@pytest.mark.slow
def test_a_small_real_search_on_the_cpu(tmp_path):
    budget = 60
    proc = bench_inproc("tune", "--backends", "single", "--device", "cpu", "--model", "gpt-micro", "--seq-len", 32,
                        "--batch-size", 2, "--warmup", 2, "--steps", 10, "--windows", 3, "--budget-s", budget,
                        "--results", tmp_path / "raw", env={"BENCH_PEAK_CACHE": tmp_path / "peak",
                                                            "OMP_WAIT_POLICY": "PASSIVE"})
    [path] = (tmp_path / "raw" / "tune").glob("summary-*.json")
    doc = json.loads(path.read_text())
    [s] = doc["backends"]
    # 3 (inconclusive) exactly where another process disturbed a trial (a busy machine decides nothing), else 0
    assert proc.returncode == (3 if s["disturbed_trials"] else 0), proc.stdout + proc.stderr
    assert s["status"] == "ok" and doc["budget_s"] == budget and doc["spent_s"] <= budget + 5  # it stays in its budget
    trials = s["trials"]
    assert trials[0]["settings"] == {} and trials[0]["status"] == "ok" and trials[1]["settings"] == {"batch_size": 4}
    ran = [t for t in trials if t["status"] == "ok"]
    assert len(list((tmp_path / "raw" / "tune" / "raw").glob("*.json"))) == len(ran)  # one record per trial run
    assert s["best"] in ran and all(t["status"] in ("ok", "not run") for t in trials)
    # nothing ran beyond the best's interval, unless one of the two was disturbed (then it was not judged)
    assert all(not tune.above(t, s["best"]) or t.get("disturbed") or s["best"].get("disturbed") for t in ran)
    recs = [json.loads(p.read_text()) for p in (tmp_path / "raw" / "tune" / "raw").glob("*.json")]
    assert all(isinstance(r["machine"], dict) and isinstance(r["disturbed"], bool) for r in recs)
    cmd = shlex.split(s["command"])
    assert cmd[:4] == ["python", "-m", "bench", "run"] and f"single: {s['command']}" in proc.stdout
    [cfg], _ = plan(parse_run(cmd[4:]))
    assert (cfg.backend, cfg.model, cfg.seq_len, cfg.batch_size) == ("single", "gpt-micro", 32,
                                                                      s["best"]["settings"].get("batch_size", 2))
    assert bool(cfg.options.get("compile")) == bool(s["best"]["settings"].get("compile"))
    assert ("| backend | workload | world size | at the shared defaults | at its best | best / defaults | MFU (measured "
            "peak) defaults → best | best settings |") in proc.stdout


def test_each_backend_tunes_its_own_search_space_from_the_registry_within_the_budget(tmp_path, monkeypatch, capsys):
    """bench tune --backends ddp,fsdp2,ds_zero2,horovod: every backend's own knobs (Backend.tune_space: DDP's buckets,
    bucket view and static graph; FSDP2's resharding and grouping; DeepSpeed's buckets; Horovod's fusion threshold and
    cycle time) are tried, inside the budget, and the report shows each at its default and at its best. The trials
    are planned for real (bench run's planner) and faked at launch (FakeTrials: 5 s each on a fake clock)."""
    from bench import cli
    from bench.plan import sweep as _plan

    from tests.conftest import skip_without

    skip_without("horovod")
    skip_without("deepspeed")
    monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cpu", 2))
    trials = FakeTrials(monkeypatch, [5.0] * 200)
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--backends", "ddp,fsdp2,ds_zero2,horovod", "--device", "cpu", "--model", "gpt-micro",
                  "--seq-len", "16", "--batch-size", "2", "--warmup", "2", "--steps", "1", "--windows", "2",
                  "--budget-s", "400", "--results", str(tmp_path / "raw")])
    assert e.value.code == 0, capsys.readouterr()
    [path] = (tmp_path / "raw" / "tune").glob("summary-*.json")
    doc = json.loads(path.read_text())
    assert doc["spent_s"] <= 400
    tried = {b["backend"]: {k for t in b["trials"] for k in t["settings"]} for b in doc["backends"]}
    own = {"ddp": {"ddp_bucket_mb", "ddp_grad_as_bucket_view", "ddp_static_graph"},
           "fsdp2": {"fsdp_reshard", "fsdp_blocks_per_group"}, "ds_zero2": {"ds_bucket_mb"},
           "horovod": {"hvd_fusion_mb", "hvd_cycle_ms"}}
    for name, knobs in own.items():
        assert knobs <= tried[name], (name, tried[name])
        others = set().union(*(v for k, v in own.items() if k != name))
        assert not (tried[name] & others), (name, tried[name])  # never another backend's knob
    # the planner gave each trial the backend's knob in its options, as bench run would
    assert {"fsdp_blocks_per_group": 2} in [{k: v for k, v in c.options.items() if k == "fsdp_blocks_per_group"}
                                            for c in trials.configs if c.backend == "fsdp2"]
    with pytest.raises(SystemExit):
        cli.main(["report", "--results", str(tmp_path / "raw"), "--out", str(tmp_path / "rep")])
    section = (tmp_path / "rep" / "REPORT.md").read_text().split("## At their best (bench tune)")[1]
    for name in own:
        assert f"| {name} | gpt-micro | 2 |" in section, name


def test_the_gpu_best_preset_tunes_three_backends_on_two_workloads_from_the_gpu_sweep_s_start(tmp_path, monkeypatch,
                                                                                              capsys):
    """Issue 63: bench tune --preset gpu-best on a fake machine of one H200: single, ddp and fsdp2 at one GPU on
    ResNet-50 (from batch 256, channels_last fixed) and gpt-350m (from 8 sequences, no channels_last), bf16, windows of
    1 s; each target's first candidate is --compile; the whole inside its 540 s. The trials are planned for real and
    faked at launch (FakeTrials: 20 s each on a fake clock). Every flag given wins; an unknown preset is one line."""
    from bench import cli
    from tests.fake_gpu import FakeGpu, FakeGpuMachine

    FakeGpuMachine([FakeGpu(name="NVIDIA H200")]).install(monkeypatch)
    trials = FakeTrials(monkeypatch, [20.0] * 200)
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--preset", "gpu-best", "--results", str(tmp_path / "raw")])
    out, err = capsys.readouterr()
    assert e.value.code == 0, out + err
    assert ("tune --preset gpu-best: 6 targets (single, ddp, fsdp2 x resnet50, gpt-350m) at 1 GPU(s), bf16, 540 s: "
            "about 90 s each where none finishes early; tried first: compile") in out
    [path] = (tmp_path / "raw" / "tune").glob("summary-*.json")
    doc = json.loads(path.read_text())
    assert doc["spent_s"] <= 540 and doc["budget_s"] == 540
    assert [(b["backend"], b["model"], b["world_size"], b["status"]) for b in doc["backends"]] == [
        (b, m, 1, "ok") for m in ("resnet50", "gpt-350m") for b in ("single", "ddp", "fsdp2")]
    for b in doc["backends"]:
        assert b["trials"][1]["settings"] == {"compile": True}, b["trials"]
        assert "channels_last" not in {k for t in b["trials"] for k in t["settings"]}  # fixed, or not the GPT's
    resnet = [c for c in trials.configs if c.model == "resnet50"]
    gpt = [c for c in trials.configs if c.model == "gpt-350m"]
    assert {(c.precision, c.window_s, c.windows, c.device_type) for c in trials.configs} == {("bf16", 1.0, 3, "cuda")}
    assert {c.options.get("channels_last") for c in resnet} == {True} and resnet[0].batch_size == 256
    assert {c.options.get("channels_last") for c in gpt} == {None} and gpt[0].batch_size == 8
    # a flag given wins: one backend, one workload, its own batch
    trials.configs.clear()
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--preset", "gpu-best", "--backends", "single", "--model", "resnet50", "--batch-size", "128",
                  "--budget-s", "60", "--results", str(tmp_path / "mine")])
    assert e.value.code == 0 and trials.configs[0].batch_size == 128 and {c.model for c in trials.configs} == {
        "resnet50"}
    capsys.readouterr()
    code, err = cli_error(capsys, "tune", "--preset", "fastest")
    assert (code, err) == (2, "bench: error: --preset 'fastest': unknown preset; choose from gpu-best\n")

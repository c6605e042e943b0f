"""Saying when a number should not be believed: the machine around a run (bench/launch/machine.py), the
judgement and its thresholds (bench/core/trust.py), and the warnings where the numbers are shown: the console after
`bench run`, REPORT.md / REPORT.html / the report's console, the verdict, and the gate (exit 3: inconclusive).

Records are built in process (fast): each warning has a case that triggers it and plain records trigger none. The GPU
half of the sampler runs against the fake GPU machine (tests/fake_gpu.py: this machine has none). One slow test
runs a real tiny run beside a (simulated) neighbour, end to end.
"""
import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.commands import compare, report
from bench.report import console as _summary
from bench.core import results, trust
from bench.launch import machine
from tests.conftest import TINY, bench_inproc, records
from tests.fake_gpu import FakeGpu, FakeGpuMachine
from tests.test_compare import gate, pair
from tests.test_compare import runs as gate_runs
from tests.test_report import make, write

GiB = 2 ** 30


def sweep(device="cuda", disturbed_ddp2=False, **spreads):
    """single@1, ddp@1, ddp@2, dp@2: 3 runs each, 1% apart, ddp's compute-only reference 5% faster than ddp."""
    levels = {"single": (1, 100.0), "ddp1": (1, 98.0), "ddp": (2, 190.0), "dp": (2, 150.0)}
    recs = []
    for name, (n, thr) in levels.items():
        for i, f in enumerate(spreads.get(name, (0.99, 1.0, 1.01))):
            r = make(name.rstrip("1"), n, thr * f, device=device, stamp=f"2026010{i + 1}T000000Z")
            if name == "ddp":
                r["compute_only_window_seconds"] = [s / 1.05 for s in r["window_seconds"]]
                if disturbed_ddp2 and i == 1:
                    r.update(disturbed=True, disturbed_reasons=["other processes used 48% of the 2 CPUs (0.96 cores) "
                                                                "during the timed windows (limit 10%)"])
            recs.append(r)
    return recs


def render(tmp_path, recs, name="rep"):
    raw, out = write(tmp_path / name, *recs), tmp_path / name / "out"
    stdout = io.StringIO()
    with __import__("contextlib").redirect_stdout(stdout):
        code = report.cmd_report(argparse.Namespace(results=str(raw), out=str(out)))
    assert code == 0
    return (out / "REPORT.md").read_text(), (out / "REPORT.html").read_text(), stdout.getvalue()


def verdict_at(tmp_path, world_size, name="rep"):
    from bench.report import verdict
    from bench.report.summary import summarise, usable_records

    rows = summarise(usable_records(tmp_path / name / "raw", print)).to_dict("records")
    return next(v for v in verdict.verdicts(rows) if f", {world_size} GPU" in v["title"])


def kinds(recs):
    return sorted({w["kind"] for w in trust.sweep_warnings(recs)})


# ---------------------------------------------------------------------------------------------------
# Plain records: no warning anywhere

def test_plain_records_trigger_no_warning_anywhere(tmp_path, capsys):
    recs = sweep()
    assert trust.sweep_warnings(recs) == []
    md, page, console = render(tmp_path, recs)
    assert "⚠" not in md and "⚠" not in page and "⚠" not in console and "Warnings" not in md
    assert "Use ddp: faster than every alternative beyond the 95% intervals." in md  # at 2 GPUs
    assert verdict_at(tmp_path, 2)["established"] is True
    out = io.StringIO()
    _summary.print_warnings(recs, out)
    assert out.getvalue() == ""


# ---------------------------------------------------------------------------------------------------
# Disturbed runs: the record, the console, the report, the verdict

def test_a_disturbed_run_is_marked_everywhere_and_the_verdict_names_no_winner(tmp_path):
    recs = sweep(disturbed_ddp2=True)
    found = trust.sweep_warnings(recs)
    assert [(w["kind"], w["subject"]) for w in found] == [("disturbed", "ddp x2 fp32")]
    assert "1 of 3 runs disturbed: other processes used 48% of the 2 CPUs" in found[0]["reason"]
    assert "--wait-quiet-s" in found[0]["advice"]
    # the console after bench run: the run's status, and one line naming the kinds of warning: the report's verdict
    # tells them (each warning once on the console of make bench)
    console = io.StringIO()
    _summary.print_table(recs[6:9], __import__("rich.console", fromlist=["Console"]).Console(file=console, width=160))
    _summary.print_warnings(recs, console)
    text = console.getvalue()
    assert text.count("ok, ⚠ disturbed") == 1
    assert text.endswith("\n⚠ warnings about these numbers (disturbed): `python -m bench report` tells them with its "
                         "verdict, one line per kind, with what to do\n")
    assert _summary.one_line(recs[7]).endswith(" ⚠ disturbed (see the record's disturbed_reasons)")  # no machine here
    md, page, console = render(tmp_path, recs)
    assert "| **ddp** ★ | 2 | fp32 | 3 (9) | 190.0 img/s ⚠ |" in md  # the figure is marked where it is shown
    assert "**⚠ Warnings**" in md and "- ⚠ `ddp` ×2 fp32: 1 of 3 runs disturbed" in md
    assert md.split("## Verdict in detail")[0].count("⚠ disturbed: 1 of 12 runs") == 1  # its kind's line, at the top
    assert ("No winner established: 1 run of ddp was disturbed (other processes used the machine while they were "
            "timed), so its figures are not to be believed; fastest by the medians: ddp.") in md
    assert "Use ddp" not in md
    v = verdict_at(tmp_path, 2)
    assert v["established"] is False and v["best"] == "ddp"
    assert '<p class="no-winner"><strong>No winner established: 1 run of ddp was disturbed' in page
    # the report's console verdict gives it once, as its kind's line
    assert console.count("other processes used 48%") == 1 and "  ⚠ disturbed: 1 of 12 runs: other processes used " \
        "48% of the 2 CPUs (0.96 cores) during the timed windows (limit 10%); re-run with `--wait-quiet-s`" in console


# ---------------------------------------------------------------------------------------------------
# A sweep with every doubt: unstable repeats, impossible efficiency, a negative loss component, the same computation
# far apart, a slow first window

def test_a_sweep_with_every_doubt_gets_every_warning_with_its_reason(tmp_path):
    single = [make("single", 1, t, device="cpu", stamp=f"2026010{i}T000000Z") for i, t in enumerate((2.0, 3.1, 4.2))]
    single[0]["window_seconds"] = [3 * single[0]["window_seconds"][0]] + single[0]["window_seconds"][1:]
    ddp1 = [make("ddp", 1, 7.1, device="cpu")]
    ddp2 = [make("ddp", 2, 44.8, device="cpu")]
    ddp2[0]["compute_only_window_seconds"] = [s * 44.8 / 50.0 for s in ddp2[0]["window_seconds"]]
    recs = single + ddp1 + ddp2
    assert kinds(recs) == ["same computation apart", "slow first window", "unstable"]
    found = {w["kind"]: w for w in trust.sweep_warnings(recs)}
    assert ("run-to-run CV 35.5% over 3 runs, above the 15% a CPU run should repeat within"
            in found["unstable"]["reason"])
    assert "7.1 img/s is 2.29x single at 1 CPU worker (3.1 img/s)" in found["same computation apart"]["reason"]
    assert "the first timed window took 3.0x the median of the others in 1 of 3 runs" in \
        found["slow first window"]["reason"]
    md, page, console = render(tmp_path, recs)
    # the report adds what needs the summary: efficiency and the loss split
    assert "scaling efficiency 723% vs single@1: above 105%" in md
    assert "scaling loss to everything else is -706.5% of the ideal (below -5%)" in md
    assert "| 35.5 % ⚠ |" in md  # the CV cell
    assert "| ddp | 1 | fp32 | 7.1 img/s ⚠ | 229.0 % ⚠ |" in md  # world size 1: the efficiency cell too
    assert "| ddp | 2 | fp32 | 44.8 img/s | ⚠ above 105% |" in md  # impossible: the reason in place of the figure
    assert "| ⚠ efficiency above 105% | ⚠ efficiency above 105% |" in md  # the split over it: not shown either
    for line in ("what to do: raise `--warmup`", "what to do: repeat with more runs", "what to do: re-run both"):
        assert line in md and line in page.replace("<code>", "`").replace("</code>", "`")
    assert ("  ⚠ impossible efficiency: 1 configuration: scaling efficiency 315-723% (limits 0 and 105%), not shown; re-run "
            "the baseline with `--repeat 3 --wait-quiet-s`") in console  # the console: one line per kind
    # the plots ring what they draw of it (the legend says so)
    svg = "".join(p.read_text() for p in (tmp_path / "rep" / "out" / "plots").glob("*-efficiency.svg"))
    assert "not to be believed as it stands" in svg


@pytest.mark.mutation
@pytest.mark.parametrize("device,spread,warned", [("cuda", (0.92, 1.0, 1.08), True), ("cuda", (0.98, 1.0, 1.02), False),
                                                  ("cpu", (0.92, 1.0, 1.08), False), ("cpu", (0.8, 1.0, 1.2), True)])
def test_unstable_means_a_cv_above_5_percent_on_gpus_and_15_on_cpus(device, spread, warned):
    recs = [make("single", 1, 100 * f, device=device) for f in spread]
    assert (kinds(recs) == ["unstable"]) is warned and (kinds(recs) == []) is (not warned)


@pytest.mark.mutation
@pytest.mark.parametrize("ratio,warned", [(1.2, False), (0.85, False), (1.3, True), (0.7, True)])
def test_the_same_computation_at_world_size_1_far_from_single(ratio, warned):
    recs = [make("single", 1, 100.0), make("ddp", 1, 100.0 * ratio)]
    assert (kinds(recs) == ["same computation apart"]) is warned
    compiled = [make("single", 1, 100.0), make("ddp", 1, 100.0 * ratio, options={"compile": True})]
    assert kinds(compiled) == []  # a compiled backend is not single's computation


@pytest.mark.mutation
def test_efficiency_and_loss_limits():
    assert trust.efficiency("x", 105.0, "single@1", "eff") is None
    assert trust.efficiency("x", 106.0, "single@1", "eff")["reason"].startswith("scaling efficiency 106% vs single@1")
    assert trust.efficiency("x", -1.0, "single@1", "eff")["reason"].endswith("below 0%")
    assert trust.loss_split("x", -0.05, 0.0) == []
    assert [w["field"] for w in trust.loss_split("x", -0.06, -0.2)] == ["comm_loss", "other_loss"]
    assert trust.first_window_ratio([1.5, 1.0, 1.0]) == 1.5 and trust.first_window_ratio([9.0, 1.0]) is None


# ---------------------------------------------------------------------------------------------------
# The machine: what makes a run disturbed

def cpu_part(share, cpus):
    return {"others_cpu_share": share, "others_cpu_cores": share * cpus}


@pytest.mark.mutation
@pytest.mark.parametrize("device,cpus,share,disturbed", [
    ("cpu", 2, 0.09, False), ("cpu", 2, 0.11, True),        # 10% of the CPUs
    ("cuda", 16, 0.04, False), ("cpu", 16, 0.04, True),     # 0.64 cores: enough on a CPU run, whose ranks use them all
])
def test_others_cpu_share_limits(device, cpus, share, disturbed):
    m = {"cpus": cpus, "windows": cpu_part(share, cpus), "gpus": []}
    assert bool(trust.machine_reasons(m, device)) is disturbed
    m = {"cpus": cpus, "windows": cpu_part(0.0, cpus), "compute_only": cpu_part(share, cpus), "gpus": []}
    reasons = trust.machine_reasons(m, device)
    assert bool(reasons) is disturbed and all("compute-only windows" in r for r in reasons)


@pytest.mark.mutation
def test_gpu_processes_and_throttling():
    quiet = {"index": 0, "other_processes": [], "throttled": ["sw_power_cap", "gpu_idle"]}  # power cap: by design
    assert trust.machine_reasons({"cpus": 8, "gpus": [quiet]}, "cuda") == []
    held = {"index": 1, "other_processes": [4242], "throttled": ["hw_thermal_slowdown"]}
    assert trust.machine_reasons({"cpus": 8, "gpus": [quiet, held]}, "cuda") == [
        "another process held GPU 1 during the windows (pid 4242)",
        "GPU 1 was throttled during the windows (hw_thermal_slowdown)"]
    assert trust.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


@pytest.mark.mutation
def test_other_gpu_pids_in_this_namespace_and_in_a_container():
    seen = {10, 11, 99}.__contains__
    assert machine.other_gpu_pids([10, 99], {10, 11}, seen) == [99]
    # a container: NVML gives host pids this namespace does not show; one per GPU is the run's own rank
    assert machine.other_gpu_pids([5001], {10}, lambda p: False) == []
    assert machine.other_gpu_pids([5001, 5002], {10}, lambda p: False) == [5002]


@pytest.mark.mutation
def test_cpu_busy_counts_only_the_run_s_cpus_and_steal(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  900 0 900 900 0 0 0 0 0 0\n"
                    "cpu0 100 10 50 999 5 1 2 7 0 0\n"    # busy: user nice system irq softirq steal = 170
                    "cpu1 400 0 0 999 0 0 0 0 0 0\n"
                    "intr 1 2 3\n")
    assert machine.cpu_busy_seconds({0}, str(stat)) == pytest.approx(170 / machine.CLK_TCK)
    assert machine.cpu_busy_seconds({0, 1}, str(stat)) == pytest.approx(570 / machine.CLK_TCK)
    assert machine.cpu_busy_seconds({0}, str(tmp_path / "none")) is None


def scripted_machine() -> FakeGpuMachine:
    """Two GPUs: GPU 0 holds a stranger's pid (1) and, from the third clock-event read on, a thermal slowdown; both
    report the power cap (0x4) all along."""
    return FakeGpuMachine([FakeGpu(pids=[1], reasons=lambda n: 0x40 | 0x4 if n > 2 else 0x4),
                           FakeGpu(reasons=0x4)])


@pytest.mark.mutation
def test_the_gpu_sampler_against_a_fake_nvml_and_the_record_it_rewrites(tmp_path, monkeypatch):
    scripted_machine().install(monkeypatch)
    rec = make("ddp", 2, 190.0)
    with machine.Watch("cuda", [0, 1], interval=0.05) as watch:
        t0 = time.time()
        time.sleep(0.3)
        t1 = time.time()
    rec.update(windows_wall_span=[t0, t1], hosts=[])
    results.save(rec, tmp_path)
    got = machine.attach(dict(rec), watch, tmp_path, {"quiet": True, "waited_seconds": 0.0})
    on_disk = json.loads((tmp_path / f"{rec['run_id']}.json").read_text())
    assert on_disk == {k: v for k, v in got.items() if k != "_path"}
    gpus = on_disk["machine"]["gpus"]
    assert [g["other_processes"] for g in gpus] == [[1], []]  # our own pid is the run's, pid 1 is not
    assert gpus[0]["throttled"] == ["hw_thermal_slowdown", "sw_power_cap"] and gpus[1]["throttled"] == ["sw_power_cap"]
    assert gpus[0]["start"]["sm_mhz"] == 1980 and gpus[0]["end"]["mem_mhz"] == 2619
    assert on_disk["disturbed"] is True and on_disk["disturbed_reasons"][-2:] == [
        "another process held GPU 0 during the windows (pid 1)",
        "GPU 0 was throttled during the windows (hw_thermal_slowdown)"]
    assert on_disk["machine"]["nvml"] == "ok" and on_disk["machine"]["span_source"] == "windows"
    assert on_disk["machine"]["nvml_unsupported"] == {} and on_disk["machine"]["sampler_error"] is None
    assert not list(tmp_path.glob(".tmp-*"))  # replaced whole, nothing left beside it


@pytest.mark.mutation
def test_without_nvml_the_gpu_half_says_why_and_measures_the_rest(monkeypatch):
    FakeGpuMachine(nvml="missing").install(monkeypatch)
    with machine.Watch("cuda", [0], interval=0.05) as watch:
        time.sleep(0.1)
    m = watch.summary()
    assert m["gpus"] == [] and m["nvml"] == "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    assert m["windows"]["others_cpu_share"] >= 0 and m["load_before"] and m["samples"] >= 2


@pytest.mark.mutation
def test_a_query_one_gpu_does_not_support_is_none_with_its_reason_and_the_others_are_read(monkeypatch):
    FakeGpuMachine(nvml="nvmlDeviceGetClockInfo").install(monkeypatch)
    with machine.Watch("cuda", [0, 1], interval=0.05) as watch:
        time.sleep(0.1)
    m = watch.summary()
    assert m["nvml"] == "ok" and m["sampler_errors"] == 0
    assert m["nvml_unsupported"] == {"sm_mhz": "NVML sm clock: NVMLError_NotSupported: Not Supported",
                                     "mem_mhz": "NVML mem clock: NVMLError_NotSupported: Not Supported"}
    assert [g["start"]["sm_mhz"] for g in m["gpus"]] == [None, None] and m["gpus"][0]["throttled"] == ["gpu_idle"]


def test_a_broken_sampler_says_why_in_the_record(monkeypatch):
    """A mistake in the sampler's own code (not NVML's refusal) is counted and named, never a silent null."""
    FakeGpuMachine().install(monkeypatch)
    with machine.Watch("cuda", [0], interval=0.05) as watch:
        monkeypatch.setattr(machine, "tree_cpu", lambda: (_ for _ in ()).throw(KeyError("ppid")))
        time.sleep(0.2)
        monkeypatch.undo()
    m = watch.summary()
    assert m["sampler_errors"] >= 1 and m["sampler_error"] == "KeyError: 'ppid'"


def test_the_run_s_own_cpu_is_not_others_and_a_stranger_s_is(tmp_path):
    """A busy child of this process is the run's (counted as ours); a busy loop started outside the tree is others'.
    Each burns about a core for a second; the sampler's own cost is measured."""
    mine = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 1.0: pass"])
    before, tree = machine.tree_cpu()
    assert mine.pid in tree
    mine.wait()
    after, _ = machine.tree_cpu()
    assert after - before > 0.8  # the child's second, reaped into this process's cutime: still ours
    # a stranger: started by a shell that exits at once, so the loop belongs to init, not to this process
    pid = int(subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True).stdout)
    try:
        with machine.Watch("cpu", [], interval=0.25) as watch:
            time.sleep(1.5)
    finally:
        os.kill(pid, signal.SIGKILL)
    m = watch.summary()
    assert m["windows"]["others_cpu_cores"] > 0.6, m
    assert m["sampler_cpu_seconds"] < 0.1 * m["windows"]["span_seconds"]  # the watch costs little itself
    assert "other processes used" in trust.machine_reasons(m, "cpu")[0]


@pytest.mark.mutation
def test_wait_quiet_waits_within_its_bound():
    said, now = [], [0.0]

    def clock():
        return now[0]

    def look(busy_until):
        def probe(device, gpus):
            now[0] += 1.0
            return ["other processes used 50% of the 2 CPUs"] if now[0] <= busy_until else []
        return probe

    got = machine.wait_quiet("cpu", [], 10, say=said.append, clock=clock, look=look(3))
    assert got == {"quiet": True, "waited_seconds": 4.0, "bound_seconds": 10, "reasons": []}
    assert said == ["waiting up to 10 s for a quiet machine: other processes used 50% of the 2 CPUs"]
    said.clear()
    now[0] = 0.0
    got = machine.wait_quiet("cpu", [], 5, say=said.append, clock=clock, look=look(99))
    assert got["quiet"] is False and got["waited_seconds"] == 5.0
    assert said[-1].startswith("the machine did not become quiet within 5 s") and "running anyway" in said[-1]


@pytest.mark.mutation
def test_wait_quiet_must_be_a_positive_bound(capsys):
    from tests.conftest import cli_error

    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", "1", "--device", "cpu", "--wait-quiet-s", "0")
    assert code == 2 and err.strip() == ("bench: error: --wait-quiet-s 0: expected a positive number of seconds (the "
                                         "longest wait before each run)")
    from bench.cli import build_parser

    args = build_parser().parse_args(["run", "--wait-quiet-s"])
    assert args.wait_quiet == 120.0 and build_parser().parse_args(["run"]).wait_quiet is None  # off by default


# ---------------------------------------------------------------------------------------------------
# The gate: disturbed runs are inconclusive (exit 3), never a regression on speed

def disturb(recs, *which):
    for i in which:
        recs[i].update(disturbed=True, disturbed_reasons=["another process held GPU 0 during the windows (pid 7)"])
    return recs


@pytest.mark.mutation
def test_gate_is_inconclusive_not_failed_on_disturbed_runs(tmp_path, capsys):
    b, c = pair(tmp_path / "slow", gate_runs(1), disturb(gate_runs(2, scale=1.25), 0))  # 20% slower, 1 disturbed
    code, data, _, err = gate(capsys, b, c, "--format", "json")
    row = data["rows"][0]
    assert code == compare.EXIT_INCONCLUSIVE == 3
    assert row["verdict"] == "inconclusive" and row["regression"] is False and row["inconclusive"] is True
    assert "inconclusive: 1 current run(s) disturbed (another process held GPU 0" in row["notes"][-1]
    assert "the verdict would be 'slower'" in row["notes"][-1] and data["inconclusive"] == [row["config"]]
    assert "compared on disturbed runs" in err
    code, _, out, _ = gate(capsys, b, c)
    assert code == 3 and "**INCONCLUSIVE**" in out and out.rstrip().endswith("Exit 3.")
    # the same numbers undisturbed: a regression (exit 1); a disturbed baseline: inconclusive, re-record it
    b2, c2 = pair(tmp_path / "clean", gate_runs(1), gate_runs(2, scale=1.25))
    assert gate(capsys, b2, c2)[0] == 1
    b3, c3 = pair(tmp_path / "base", disturb(gate_runs(1), 2), gate_runs(2, scale=1.25))
    code, data, _, _ = gate(capsys, b3, c3, "--format", "json")
    assert code == 3 and "re-record the baseline on a quiet machine" in data["rows"][0]["notes"][-1]


@pytest.mark.mutation
def test_disturbed_runs_still_fail_the_gate_on_memory_and_crashes(tmp_path, capsys):
    b, c = pair(tmp_path / "mem", gate_runs(1), disturb(gate_runs(2, mem_gib=12.0), 0))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 1 and data["rows"][0]["verdict"] == "inconclusive, more memory"
    cur = disturb(gate_runs(3), 1) + [gate_runs(4)[0] | {"status": "failed", "reason": "rank 1 exited 1",
                                                         "window_seconds": [], "memory": []}]
    b, c = pair(tmp_path / "crash", gate_runs(1), cur)
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 1 and data["rows"][0]["verdict"] == "inconclusive, failed"


@pytest.mark.mutation
def test_gate_lists_unstable_runs_as_warnings_without_changing_the_exit(tmp_path, capsys):
    b, c = pair(tmp_path, gate_runs(1), gate_runs(2, run_sigma=0.2))
    code, data, out, _ = gate(capsys, b, c, "--format", "json")
    assert code == 0 and any("current ddp x2 fp32: run-to-run CV" in w for w in data["warnings"])
    assert data["inconclusive"] == []


# ---------------------------------------------------------------------------------------------------
# End to end: a real tiny run, its windows' span from rank 0, the harness's machine state in its record

@pytest.mark.slow
def test_a_real_run_beside_a_neighbour_is_recorded_disturbed(results_dir, monkeypatch):
    """The neighbour is half a core of busy time added to /proc/stat's reading (deterministic, and no busy loop
    taking a core from the test suite); a real busy loop is measured in process above."""
    real, start = machine.cpu_busy_seconds, time.time()
    monkeypatch.setattr(machine, "cpu_busy_seconds", lambda cpus, *a: real(cpus, *a) + 0.5 * (time.time() - start))
    t0 = time.time()
    # resnet18, not TINY's cnn-tiny: on cnn-tiny (windows of milliseconds, inside one of the machine watch's 0.5 s
    # intervals) this read 0.28 cores once in a fresh clone's make test
    proc = bench_inproc("run", "--backends", "single", "--gpus", "1", *TINY, "--model", "resnet18",
                        "--results", results_dir)
    t1 = time.time()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    a, b = rec["windows_wall_span"]
    assert t0 < a < b < t1 and rec["machine"]["span_source"] == "windows"
    m = rec["machine"]
    assert m["windows"]["span_seconds"] == pytest.approx(b - a) and m["cpus"] == len(os.sched_getaffinity(0))
    assert m["windows"]["others_cpu_cores"] >= 0.45  # the neighbour's half core, and whatever else ran
    assert len(m["load_before"]) == len(m["load_after"]) == 3 and m["gpus"] == [] and m["nvml"] is None
    assert m["sampler_cpu_seconds"] < 0.05 * (t1 - t0)  # the watch costs little itself
    assert rec["disturbed"] is True and rec["disturbed_reasons"][0].startswith("other processes used")
    assert "ok, ⚠ disturbed" in proc.stdout  # the table's status; the progress line says it in a few words
    assert f"⚠ disturbed (others used {trust.others_share(rec):.0f}% of the CPUs)" in proc.stdout
    assert proc.stdout.rstrip().endswith("⚠ warnings about these numbers (disturbed): `python -m bench report` tells "
                                         "them with its verdict, one line per kind, with what to do")

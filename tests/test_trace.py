"""bench run --trace: a few profiled steps after every measurement, one Chrome trace per rank, the phases of a step
read off it (bench/core/traces.py). Every backend's trace (a file per rank, the phases it marks) rides on the
contract's sweep (tests/backends/test_contract.py); here: ddp with and without --trace, and everything that runs
nothing."""
import contextlib
import gzip
import json
import re

import pytest

import backends
from bench.report import console as _summary
from bench.core import results, traces
from tests.conftest import TINY, bench_inproc, cli_error, records, skip_without


def event(name, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


TRACE = {"traceEvents": [
    event("bench step", 0, 10_000), event("bench step", 20_000, 12_000),
    event("data", 100, 400), event("forward", 500, 3_000), event("backward", 3_500, 5_000),
    event("optimizer", 8_500, 1_000),
    event("data", 20_100, 900), event("forward", 21_000, 2_000), event("backward", 23_000, 6_000),
    event("optimizer", 29_000, 2_500),
    event("backward", 9_900, 10_100),  # straddles the gap, ends as step 2 starts: its 100 us inside step 1 count
    event("forward", 500, 3_000, cat="gpu_user_annotation"),  # the GPU's copy of a host range: not counted twice
    event("aten::conv2d", 600, 200, cat="cpu_op"),
    event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 23_500, 2_000, cat="kernel"),  # on the GPU, in step 2
    event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5_000, 1_000, cat="kernel"),  # step 1: not the one drawn
    event("void at::native::vectorized_elementwise_kernel", 24_000, 100, cat="kernel"),  # compute, not communication
    {"ph": "i", "name": "forward", "ts": 1, "s": "t"},  # an instant event, not a range
]}


def test_phases_per_step_are_the_sums_of_their_ranges_inside_each_step():
    got = traces.phase_times(TRACE)
    assert got["steps"] == 2 and got["step_ms"] == [10.0, 12.0]
    assert got["phase_ms"] == {"data": [0.4, 0.9], "forward": [3.0, 2.0], "backward": [5.1, 6.0],
                               "optimizer": [1.0, 2.5], "other": pytest.approx([0.5, 0.6])}
    assert "all-reduce" not in got["phase_ms"]  # no range of it anywhere
    # the last step, for the report's figure: ranges from the step's start, and the NCCL kernels on their stream
    assert got["timeline"] == {"start_us": 20_000, "ms": 12.0, "comm": [[3.5, 2.0]], "ranges": [
        ["data", 0.1, 0.9], ["forward", 1.0, 2.0], ["backward", 3.0, 6.0], ["optimizer", 9.0, 2.5]]}
    assert traces.phase_times({"traceEvents": []}) == {"steps": 0, "step_ms": [], "phase_ms": {"other": []},
                                                       "library_ms": {}, "timeline": None}
    assert got["library_ms"] == {}  # the harness's own ranges only, and a cpu_op is no range


LIBRARY = {"traceEvents": TRACE["traceEvents"] + [
    event("FSDP::pre_forward (layer1.0)", 600, 300), event("FSDP::pre_forward (layer1.1)", 1_000, 200),
    event("FSDP::pre_forward (layer1.0)", 21_000, 400),
    event("FSDP::backward_prefetch for layer4.1", 4_000, 100),
    event("FSDP::post_backward_reduce (layer4.1)", 9_500, 1_000),  # straddles step 1's end: its 500 us inside count
    event("Optimizer.step#SGD.step", 29_100, 2_000),
    event("FSDP::pre_forward (layer1.0)", 15_000, 700),  # between the steps: not counted
    event("FSDP::pre_forward (layer1.0)", 600, 300, cat="gpu_user_annotation"),  # the GPU's copy: not counted
    event("ProfilerStep#3", 0, 10_000),
]}


def test_the_libraries_own_ranges_are_summed_per_step_one_name_per_kind():
    got = traces.phase_times(LIBRARY)
    assert got["library_ms"] == {"Optimizer.step#SGD.step": [0.0, 2.0], "FSDP::pre_forward": [0.5, 0.4],
                                 "FSDP::post_backward_reduce": [0.5, 0.0], "FSDP::backward_prefetch": [0.1, 0.0],
                                 "ProfilerStep#3": [10.0, 0.0]}
    assert list(got["library_ms"]) == ["ProfilerStep#3", "Optimizer.step#SGD.step", "FSDP::pre_forward",
                                       "FSDP::post_backward_reduce", "FSDP::backward_prefetch"]  # largest first
    # another script's step range (bench trace --step 'ProfilerStep*') is its own, not a library's
    assert "ProfilerStep#3" not in traces.phase_times(LIBRARY, step="ProfilerStep*")["library_ms"]
    many = {"traceEvents": [event("bench step", 0, 1_000)] + [event(f"lib::r{i}", 0, 10 + i) for i in range(20)]}
    kept = traces.phase_times(many)["library_ms"]
    assert list(kept) == [f"lib::r{i}" for i in range(19, 19 - traces.LIBRARY_RANGES_KEPT, -1)]
    summary = traces.summarise([got, {**got, "library_ms": {}}])
    assert summary["library_ms_per_step"] == [{"Optimizer.step#SGD.step": 1.0, "FSDP::pre_forward": 0.45,
                                               "FSDP::post_backward_reduce": 0.25, "FSDP::backward_prefetch": 0.05,
                                               "ProfilerStep#3": 5.0}, {}]


def test_the_report_line_names_rank_0_s_largest_library_ranges():
    from bench.report.timeline import library_line

    trace = {"library_ms_per_step": [{"a": 1.0, "FSDP::post_backward_reduce": 7.35, "FSDP::pre_forward": 2.96,
                                      "Optimizer.step#SGD.step": 7.67}, {"other rank": 99.0}]}
    assert library_line(trace, shown=3) == [
        "Inside the phases, the libraries' own ranges on rank 0, ms per traced step (inclusive: one inside another "
        "counts in both; the module each is for left out): `Optimizer.step#SGD.step` 7.7, "
        "`FSDP::post_backward_reduce` 7.3, `FSDP::pre_forward` 3.0 and 1 more.", ""]
    assert library_line({"library_ms_per_step": [{}]}) == library_line({}) == []  # older records have none


def test_ranks_are_summarised_per_step_and_the_slowest_is_named():
    rank0 = traces.phase_times(TRACE)
    rank1 = {"steps": 3, "step_ms": [9.0, 15.0, 1.0], "phase_ms": {"forward": [1.0, 2.0, 3.0], "other": [8.0, 13.0, 0]}}
    got = traces.summarise([rank0, rank1])
    assert got["steps"] == 2  # the steps every rank traced
    assert got["step_ms"] == [[10.0, 12.0], [9.0, 15.0]] and got["slowest_rank_per_step"] == [0, 1]
    assert got["phase_ms_per_step"][1] == {"forward": 1.5, "other": 10.5}
    assert got["phase_ms_per_step"][0]["backward"] == pytest.approx(5.55)


def test_traces_load_plain_or_gzip(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps(TRACE))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump(TRACE, f)
    assert traces.load(tmp_path / "t.json") == traces.load(tmp_path / "t.json.gz") == TRACE


def test_a_phase_is_a_shared_no_op_without_a_trace_and_the_marker_while_tracing():
    backend = backends.create("single")
    assert backend.phase("forward") is backend.phase("backward")  # one do-nothing context, nothing allocated
    seen = []
    backend.phase_marker = lambda name: seen.append(name) or contextlib.nullcontext()
    with backend.phase("forward"):
        pass
    assert seen == ["forward"] and traces.PHASES == ("data", "forward", "backward", "all-reduce", "optimizer")


def test_profiler_active_is_the_profiler_s_own_state():
    from torch.profiler import ProfilerActivity, profile

    from bench.rank.trace import profiler_active

    assert profiler_active() is False
    with profile(activities=[ProfilerActivity.CPU]):
        assert profiler_active() is True
    assert profiler_active() is False


def test_the_console_line_gives_rank_0_s_phases_in_step_order_and_where_the_files_are():
    trace = {"steps": 2, "files": ["/r/logs/x.rank0.trace.json.gz", None], "reasons": ["rank 1's trace was over the cap"],
             "phase_ms_per_step": [{"other": 0.5, "backward": 5.0, "data": 0.25, "forward": 3.0, "optimizer": 1.0}]}
    assert _summary.trace_line(trace) == (
        "\n    trace, rank 0, ms per step over 2 step(s): data 0.2, forward 3.0, backward 5.0, optimizer 1.0, "
        "other 0.5; 1 trace file(s) in /r/logs; rank 1's trace was over the cap")
    assert _summary.trace_line(None) == ""
    gpu = {"comm_ms": 4.04, "overlap_pct": 62.5, "idle_pct": 3.2}
    assert _summary.trace_line({**trace, "reasons": [], "gpu": [gpu, None]}).endswith(
        "other 0.5; GPU (HTA): communication kernels 4.0 ms, 62% overlapped by computation, idle 3%; 1 trace file(s) in "
        "/r/logs")
    assert "; Holistic Trace Analysis is not installed" in _summary.trace_line(
        {**trace, "gpu": [{"reason": "Holistic Trace Analysis is not installed (hta): make install"}]})


@pytest.mark.parametrize("args,message", [
    (["--trace", "0"], "bench: error: --trace 0: expected a number of steps from 1 to 20 (a trace is for reading a "
                       "step, not for statistics)"),
    (["--trace", "21"], "bench: error: --trace 21: expected a number of steps from 1 to 20"),
    (["--trace", "many"], "bench: error: argument --trace: invalid int value: 'many'"),
    (["--trace", "--find-max-batch"], "bench: error: --trace profiles timed runs; --find-max-batch runs none"),
])
def test_bad_trace_input_is_one_line(results_dir, args, message, capsys):
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, *args, "--results", results_dir)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), err
    assert not results_dir.exists() or records(results_dir) == []


@pytest.fixture(scope="module")
def ddp_with_and_without(tmp_path_factory):
    """ddp at 2 ranks with its knobs traced (the run tests/backends/test_ddp.py's knob test reads too, once a session),
    and the same configuration untraced."""
    from tests.backends.test_ddp import KNOBS, knobs_traced

    raw, proc = knobs_traced()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = {"traced": next(r for r in records(raw) if r["backend"] == "ddp"), "traced_stdout": proc.stdout}
    raw = tmp_path_factory.mktemp("plain") / "raw"
    proc = bench_inproc("run", "--backends", "ddp", "--gpus", 2, *TINY, *KNOBS, "--results", raw)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [out["plain"]] = records(raw)
    out["plain_stdout"] = proc.stdout
    return out


@pytest.mark.slow
def test_a_traced_ddp_run_writes_one_chrome_trace_per_rank_with_every_phase(ddp_with_and_without):
    rec = ddp_with_and_without["traced"]
    trace = rec["trace"]
    assert trace["steps"] == 2 and len(trace["files"]) == 2 and trace["reasons"] == []
    for rank, path in enumerate(trace["files"]):
        assert path.endswith(f"/logs/{rec['run_id']}.rank{rank}.trace.json.gz")
        data = traces.load(path)  # gzip, Chrome trace JSON
        assert trace["bytes"][rank] == len(open(path, "rb").read()) < 5 * 2 ** 20
        names = {e["name"] for e in data["traceEvents"] if e.get("cat") == "user_annotation"}
        assert {"bench step", "data", "forward", "backward", "optimizer"} <= names, names
        assert traces.summarise([traces.phase_times(data)])["phase_ms_per_step"][0] == \
            pytest.approx(trace["phase_ms_per_step"][rank])
    for phases in trace["phase_ms_per_step"]:
        assert set(phases) == {"data", "forward", "backward", "optimizer", "other"}
        assert phases["backward"] > 0 and phases["forward"] > 0 and phases["other"] >= 0
    assert len(trace["step_ms"]) == 2 and all(len(s) == 2 for s in trace["step_ms"])
    for ranges in trace["library_ms_per_step"]:  # torch's own ranges inside the step, beside the harness's phases
        assert ranges["Optimizer.step#SGD.step"] > 0 and not set(ranges) & {"bench step", *traces.PHASES}
    assert trace["slowest_rank_per_step"] in ([0, 0], [0, 1], [1, 0], [1, 1])
    assert trace["profiled_seconds"] > 0 and trace["export_seconds"] > 0
    assert "trace, rank 0, ms per step over 2 step(s): data " in ddp_with_and_without["traced_stdout"]


@pytest.mark.slow
def test_tracing_changes_no_measured_field_and_no_profiler_runs_in_a_window(ddp_with_and_without):
    traced, plain = ddp_with_and_without["traced"], ddp_with_and_without["plain"]
    assert set(traced) == set(plain) and plain["trace"] is None
    for rec in (traced, plain):
        # read from the profiler's own state before and after every timed and compute-only window, on every rank
        assert rec["profiler_in_windows"] is False
        assert rec["status"] == "ok" and rec["replicas_consistent"] is True and rec["compute_only"]["measured"]
        assert len(rec["window_seconds"]) == len(rec["compute_only_window_seconds"])
    assert results.config_key(traced) == results.config_key(plain)  # the report and the gate group them together


def traced(start1=1500.0):
    """A --trace part of a 2-rank record: rank 1 starts 0.5 ms after rank 0; the GPU lanes carry NCCL kernels."""
    steps = {"data": 0.1, "forward": 10.0, "backward": 20.0, "optimizer": 3.0, "other": 0.5}
    line = lambda start: {"start_us": start, "ms": 33.6, "comm": [[12.0, 4.0], [25.0, 6.0]], "ranges": [  # noqa: E731
        ["data", 0.0, 0.1], ["forward", 0.1, 10.0], ["backward", 10.1, 20.0], ["optimizer", 30.1, 3.0]]}
    return {"files": ["/r/logs/x.rank0.trace.json.gz", None], "bytes": [1000, 70 * 2 ** 20], "steps": 2,
            "profiled_seconds": 0.3, "export_seconds": 0.1, "reasons": ["rank 1: trace of 73400320 bytes ..."],
            "phase_ms_per_step": [steps, {**steps, "backward": 22.0}], "step_ms": [[33.6, 33.7], [33.5, 36.0]],
            "slowest_rank_per_step": [0, 1], "timeline": [line(1000.0), line(start1)]}


def test_the_report_gives_each_traced_configuration_its_phase_table_timeline_and_files(tmp_path):
    from tests.test_report import make, run_report, write

    plain = make("ddp", 2, 100.0, stamp="20260101T000000Z")
    older = make("ddp", 2, 100.0, stamp="20260101T000001Z", trace={**traced(), "files": ["/old.gz", None]})
    newer = make("ddp", 2, 100.0, stamp="20260101T000002Z", trace=traced())
    out = tmp_path / "rep"
    code, _ = run_report(write(tmp_path, plain, older, newer, make("single", 1, 60.0)), out)
    md = (out / "REPORT.md").read_text()
    assert code == 0 and md.count("## Where a step's time goes (traces)") == 1
    section = md.split("## Where a step's time goes (traces)")[1]
    assert "### ddp × 2, resnet50 224px b64 fp32 (cuda)\n\n2 traced step(s); slowest rank per step: 0, 1.\n\n" \
           "| rank | data | forward | backward | optimizer | other | step |\n" \
           "|---|---:|---:|---:|---:|---:|---:|\n| 0 | 0.1 | 10.0 | 20.0 | 3.0 | 0.5 | 33.7 |\n" \
           "| 1 | 0.1 | 10.0 | 22.0 | 3.0 | 0.5 | 34.8 |" in section  # the newest traced run of the configuration
    assert "drag the file in): [rank 0](" in section and \
        "/r/logs/x.rank0.trace.json.gz); rank 1: trace of 73400320 bytes ..." in section
    assert "/old.gz" not in section and "### single" not in section  # untraced configurations have no entry
    [png] = re.findall(r"!\[timeline\]\(plots/(timeline-[^)]+\.png)\)", section)
    assert (out / "plots" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / "plots" / png).with_suffix(
        ".svg").is_file()
    svg = (out / "plots" / png).with_suffix(".svg").read_text()
    for lane in ("rank 0", "rank 0 comm", "rank 1", "rank 1 comm", "earliest rank"):
        assert lane in svg, lane


def test_no_traced_run_no_section_and_ranks_on_two_hosts_start_at_their_own_step(tmp_path):
    from bench.report import timeline
    from tests.test_report import make, run_report, write

    out = tmp_path / "rep"
    assert run_report(write(tmp_path, make("ddp", 2, 100.0)), out)[0] == 0
    assert "Where a step's time goes" not in (out / "REPORT.md").read_text()
    stem = tmp_path / "two-hosts"
    assert timeline.draw(traced(start1=9e9)["timeline"], ["a", "b"], stem, "t") is True
    assert "rank's own step start" in stem.with_suffix(".svg").read_text()
    assert timeline.draw([None, None], None, tmp_path / "none", "t") is False


def test_bench_trace_reads_a_trace_of_another_script_by_its_step_and_phase_names(tmp_path, capsys):
    """A user's own script: torch.profiler's schedule marks each step ProfilerStep#N; the phases are its own ranges."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from bench import cli

    model, x = torch.nn.Linear(32, 32), torch.randn(4, 32)
    mine = tmp_path / "mine.json"
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(mine))) as prof:
        for _ in range(3):
            with record_function("fwd"):
                y = model(x).sum()
            with record_function("bwd"):
                y.backward()
            prof.step()
    with pytest.raises(SystemExit) as done:
        cli.main(["trace", str(mine), str(mine), "--step", "ProfilerStep*", "--phases", "fwd,bwd"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("2 step(s) in every file; mean ms per step:\n\n| file | fwd | bwd | "
                                                   "other | step |\n|---|---:|---:|---:|---:|\n")
    assert out.count(f"| {mine} | ") == 2 and "slowest file per step: 0, 0 (0 = the first file)" in out
    assert "the libraries' own ranges" not in out  # the script marks none; its ProfilerStep#N ranges are its steps
    with pytest.raises(SystemExit):
        cli.main(["trace", str(mine), "--step", "ProfilerStep*", "--phases", "fwd,bwd", "--format", "json"])
    got = json.loads(capsys.readouterr().out)
    assert got["steps"] == 2 and set(got["phase_ms_per_step"][0]) == {"fwd", "bwd", "other"}
    assert got["phase_ms_per_step"][0]["fwd"] > 0 and len(got["step_ms"][0]) == 2


@pytest.mark.parametrize("make_file,args,message", [
    (None, [], "bench: error: {d}/missing.json: no such file"),
    (lambda p: p.write_text("{not json"), [], "bench: error: {d}/t.json: not a Chrome trace (JSON, or gzip-compressed "
                                              "JSON): "),
    (lambda p: p.write_text("[]"), [], "bench: error: {d}/t.json: not a Chrome trace (no traceEvents list)"),
    (lambda p: p.write_text(json.dumps(TRACE)), ["--step", "ProfilerStep*"],
     "bench: error: {d}/t.json: no 'ProfilerStep*' range in the trace; name the range around each step with --step"),
    (lambda p: p.write_text(json.dumps(TRACE)), ["--phases", ","], "bench: error: --phases ',': expected "
                                                                   "comma-separated range names"),
])
def test_bench_trace_bad_input_is_one_line(tmp_path, capsys, make_file, args, message):
    path = tmp_path / ("t.json" if make_file else "missing.json")
    if make_file:
        make_file(path)
    code, err = cli_error(capsys, "trace", path, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message.format(d=tmp_path)), err


# --- GPU traces: Holistic Trace Analysis, on a trace made like a CUDA machine's (tests/gpu_trace.py) ---------------

def test_hta_reads_the_known_overlap_idle_time_and_kernel_types_of_a_gpu_trace(tmp_path):
    skip_without("hta")
    from tests import gpu_trace

    paths = gpu_trace.write(tmp_path)
    assert all(p.stat().st_size < 2 ** 20 for p in paths)
    assert traces.has_kernels(traces.load(paths[0])) and not traces.has_kernels(TRACE | {"traceEvents": TRACE[
        "traceEvents"][:4]})
    for rank, path in enumerate(paths):
        got = traces.gpu_analysis(path, rank, gpu_trace.STEPS)
        assert got["analysis"] == "holistictraceanalysis 0.5.0"
        assert {k: got[k] for k in gpu_trace.expected(rank)} == pytest.approx(gpu_trace.expected(rank))
        # the compute stream waits 100 us for the all-reduce in each step and 100 us between steps: the host's
        assert got["idle_ms_by_cause"] == pytest.approx({"host_wait": 0.5 / 3, "kernel_wait": 0.0, "other": 0.0})
    # the host-side phases of the same trace are read as on a CPU
    assert traces.phase_times(traces.load(paths[0]))["phase_ms"]["backward"] == pytest.approx([0.4] * 3)


def test_without_hta_the_trace_says_how_to_install_it_and_a_bad_trace_says_why(tmp_path, monkeypatch):
    from tests import gpu_trace

    [path, _] = gpu_trace.write(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"traceEvents": [event("k", 0, 1, cat="kernel")]}))
    assert traces.gpu_analysis(bad, 0, 1)["reason"].startswith("Holistic Trace Analysis failed on bad.json: ")
    monkeypatch.setitem(__import__("sys").modules, "hta.configs.config", None)  # as if not installed
    assert traces.gpu_analysis(path, 0, 3) == {"reason": "Holistic Trace Analysis is not installed "
                                                         "(hta.configs.config): make install, or pip install "
                                                         "holistictraceanalysis==0.5.0"}


def test_bench_trace_adds_hta_s_table_for_gpu_traces(tmp_path, capsys):
    skip_without("hta")
    from bench import cli
    from tests import gpu_trace

    paths = gpu_trace.write(tmp_path)
    with pytest.raises(SystemExit) as done:
        cli.main(["trace", *map(str, paths)])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "| communication | overlapped by computation | communication alone |" in out
    assert (f"| {paths[0]} | 0.30 | 67 % | 0.10 | 0.85 | 0.05 | 0.07 (6 %) | host_wait 0.17, kernel_wait 0.00, "
            "other 0.00 |") in out and f"| {paths[1]} | 0.25 | 60 % | 0.10 |" in out
    with pytest.raises(SystemExit):
        cli.main(["trace", str(paths[1]), "--format", "json"])
    [gpu] = json.loads(capsys.readouterr().out)["gpu"]
    assert gpu["overlap_pct"] == 60.0 and gpu["busiest_stream"] == gpu_trace.COMPUTE


def test_the_report_sets_the_trace_s_exposed_communication_beside_the_compute_only_reference(tmp_path):
    from bench.report import html
    from tests.test_report import make, run_report, write

    co = lambda thr: [64 * 2 * 10 / thr] * 3  # noqa: E731 - compute-only windows at a given global img/s, 2 ranks
    measured = {"compute_only": {"measured": True, "reason": None, "keeps": None}}
    hta = lambda alone: {"analysis": "holistictraceanalysis 0.5.0", "comm_ms": 40.0, "exposed_comm_ms": alone,  # noqa: E731
                         "overlap_pct": 100 * (40.0 - alone) / 40.0, "compute_ms": 300.0, "memory_ms": 1.0,
                         "idle_ms": 2.0, "idle_pct": 0.6, "busiest_stream": 7,
                         "idle_ms_by_cause": {"host_wait": 1.5, "kernel_wait": 0.5, "other": 0.0}}
    cpu_trace = traced()
    cpu_trace["phase_ms_per_step"] = [{**p, "all-reduce": 10.0} for p in cpu_trace["phase_ms_per_step"]]
    missing = {"reason": "Holistic Trace Analysis is not installed (hta): make install, or pip install x"}
    raw = write(tmp_path, make("single", 1, 100.0), make("single", 1, 100.0, device="cpu"),
                make("ddp", 2, 180.0, compute_only_window_seconds=co(190.0), **measured,
                     trace={**traced(), "gpu": [hta(35.0), hta(30.0)]}),
                make("fsdp2", 2, 150.0, compute_only_window_seconds=co(190.0), **measured,
                     trace={**traced(), "gpu": [missing, missing]}),
                make("allreduce_manual", 2, 180.0, device="cpu", compute_only_window_seconds=co(190.0), **measured,
                     trace=cpu_trace),
                make("ddp", 2, 180.0, device="cpu", compute_only_window_seconds=co(190.0), **measured,
                     trace=traced()))
    out = tmp_path / "rep"
    assert run_report(raw, out)[0] == 0
    md = (out / "REPORT.md").read_text()
    section = md.split("### Exposed communication, two ways")[1].split("\n### ")[0]
    assert "Both measured for 2 configuration(s); within 25% (or 0.5 ms) of each other in 1." in section
    assert "| ddp | 2 | fp32 | 37.4 | 40.0 | 19 % | 32.5 | GPU kernels (HTA) | agree (-4.9 ms) |" in section
    assert "| fsdp2 | 2 | fp32 | 179.6 | - | - | - | Holistic Trace Analysis is not installed (hta): make install, " \
           "or pip install x | - |" in section
    assert "| allreduce_manual | 2 | fp32 | 37.4 | 10.0 | 0 % | 10.0 | all-reduce ranges (host) | differ (-27.4 ms) |" \
        in section
    assert "| ddp | 2 | fp32 | 37.4 | - | - | - | communicates inside backward and the optimizer step; a CPU trace " \
           "has no kernels to tell it apart | - |" in section
    # the GPU kernels per rank under the configuration, and links to its trace files, relative to the report
    assert "| 0 | 40.00 | 12 % | 35.00 | 300.00 | 1.00 | 2.00 (1 %) | host_wait 1.50, kernel_wait 0.50, other 0.00 |" \
        in md and "| 1 | 40.00 | 25 % | 30.00 |" in md
    link = "[rank 0](../../../r/logs/x.rank0.trace.json.gz)".replace("../../../", "../" * len(out.resolve().parts[1:]))
    assert f"Trace files (open one at https://ui.perfetto.dev: drag the file in): {link}; rank 1: trace" in md
    assert 'x.rank0.trace.json.gz">rank 0</a>' in (out / "REPORT.html").read_text()
    # only a path relative to the page becomes a link
    assert html.inline("[x](javascript:alert(1)) [y](https://a.b/c) [z](a/b.gz) [w](../c%20d.gz)") == \
        '[x](javascript:alert(1)) [y](https://a.b/c) <a href="a/b.gz">z</a> <a href="../c%20d.gz">w</a>'


@pytest.mark.gpu
def test_a_traced_cuda_run_has_hta_s_analysis_on_every_rank(gpu_plan):
    """On a GPU machine (the GPU check's trace-hta launch): the trace holds the CUDA kernels, and Holistic Trace
    Analysis reads them in the rank."""
    skip_without("hta")
    rec = gpu_plan.record("trace-hta", "ddp")
    [gpu] = rec["trace"]["gpu"]
    assert gpu.get("reason") is None and gpu["analysis"] == "holistictraceanalysis 0.5.0", gpu
    assert gpu["compute_ms"] > 0 and 0 <= gpu["idle_pct"] <= 100 and gpu["busiest_stream"] is not None
    assert traces.has_kernels(traces.load(rec["trace"]["files"][0]))
    assert "GPU (HTA): communication kernels " in gpu_plan.log("trace-hta")

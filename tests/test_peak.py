"""MFU against a measured peak (issue 39, item 2): bench peak and the first run of a sweep measure the matmul rate
this device sustains per precision mode (bench/rank/peak.py), cache it per device and software (bench/core/peak.py),
and every record gives MFU against it beside the datasheet's, naming the entry and the mode. The sweep in
tests/test_reference.py shows a real run measuring once and the others reusing it."""
import argparse
import json
import os

import pytest
import torch

from bench.core import peak, results
from tests.conftest import bench_inproc, cli_error


def cpu_key(precision="fp32", threads=1, machine="node1"):
    return peak.key("cpu", "CPU: EPYC", "2.15.0", None, precision, None, threads, machine=machine)


def test_a_key_holds_the_machine_the_device_the_software_the_mode_and_on_cpus_the_threads(tmp_path):
    """Issue 47: the cache in ~/.cache was shared by every machine that shares the home directory; the machine (its
    host name) is part of the key and of the file's name."""
    import socket

    gpu = peak.key("cuda", "NVIDIA H100 80GB HBM3", "2.15.0+cu132", "13.2", "fp32", True, 8, machine="gpu01")
    assert gpu["tf32"] is True and gpu["threads"] is None  # a GPU's rate is not the host's threads'
    assert peak.key("cuda", "NVIDIA H100 80GB HBM3", "2.15.0", "13.2", "bf16", True, 8)["tf32"] is None
    assert peak.key("cpu", "CPU: EPYC", "2.15.0", None, "fp32", None, 1)["machine"] == socket.gethostname()
    assert peak.entry_path(gpu, tmp_path).name == ("gpu01-NVIDIA-H100-80GB-HBM3-torch2.15.0+cu132-cuda13.2-fp32-"
                                                   "TF32-on.json")
    assert peak.entry_path(cpu_key(threads=2), tmp_path).name == "node1-CPU-EPYC-torch2.15.0-nocuda-fp32-2threads.json"
    assert peak.entry_path(cpu_key(machine="node2"), tmp_path) != peak.entry_path(cpu_key(), tmp_path)
    assert peak.entry_path(cpu_key(threads=1), tmp_path) != peak.entry_path(cpu_key(threads=2), tmp_path)
    assert [peak.mode("fp32", True), peak.mode("fp32", False), peak.mode("fp32", None), peak.mode("bf16", None)] == [
        "fp32 (TF32 on)", "fp32 (TF32 off)", "fp32", "bf16"]


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_PEAK_CACHE", str(tmp_path / "here"))
    assert peak.cache_dir() == tmp_path / "here"
    monkeypatch.delenv("BENCH_PEAK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert peak.cache_dir() == tmp_path / "xdg" / "torch-parallel-bench" / "peak"


def test_the_measurement_is_the_best_batch_of_the_best_shape():
    from bench.rank import peak as rank_peak

    got = rank_peak.measure(torch.device("cpu"), "fp32", shapes=(32, 64))
    assert [s["shape"] for s in got["shapes"]] == [[32, 32, 32], [64, 64, 64]]
    assert got["tflops"] == max(s["tflops"] for s in got["shapes"]) > 0
    assert got["best_shape"] == max(got["shapes"], key=lambda s: s["tflops"])["shape"]
    assert got["how"].startswith("largest rate over square matmuls of 32, 64: per shape 1 warm-up iterations")
    # the rate is FLOPs over the time of a batch: with a clock that says every multiplication took 1 s, 2 n^3 / 1e12
    ticks = iter(range(10 ** 6))
    timed = rank_peak.measure(torch.device("cpu"), "fp32", shapes=(32,), clock=lambda: float(next(ticks)))
    assert timed["tflops"] == pytest.approx(2 * 32 ** 3 / 1e12)


def test_measured_once_then_read_from_the_cache_and_again_after_a_refresh(monkeypatch, tmp_path):
    from bench.rank import peak as rank_peak

    calls = []
    monkeypatch.setattr(rank_peak, "measure", lambda device, precision, tf32: calls.append(precision) or {
        "tflops": 0.5, "best_shape": [64, 64, 64], "shapes": [{"shape": [64, 64, 64], "tflops": 0.5}], "how": "fake"})
    cpu = torch.device("cpu")
    first = rank_peak.entry(cpu_key(), cpu, tmp_path, None)
    assert first["measured_now"] is True and calls == ["fp32"]
    on_disk = json.loads(peak.entry_path(cpu_key(), tmp_path).read_text())
    assert on_disk["key"] == cpu_key() and on_disk["tflops"] == 0.5 and on_disk["load_average"] >= 0
    assert set(on_disk["load"]) == {"load_average_before", "cpus", "seconds", "others_cpu_share", "others_cpu_cores",
                                    "disturbed", "reason"}
    again = rank_peak.entry(cpu_key(), cpu, tmp_path, None)
    assert calls == ["fp32"] and "measured_now" not in again and again["cache"] == first["cache"]
    assert again["measured_at"] == first["measured_at"]
    rank_peak.entry(cpu_key(), cpu, tmp_path, "9999-01-01T00:00:00+00:00")  # a refresh that started after it
    assert calls == ["fp32", "fp32"]
    rank_peak.entry(cpu_key("bf16"), cpu, tmp_path, None)  # another mode: its own entry
    assert calls == ["fp32", "fp32", "bf16"] and len(list(tmp_path.glob("*.json"))) == 2
    peak.entry_path(cpu_key(), tmp_path).write_text("{not json")
    assert peak.read(cpu_key(), tmp_path) is None  # a broken entry is measured again, not trusted


def test_a_run_asks_for_its_peak_only_when_the_harness_says_and_a_failure_costs_only_the_figure(tmp_path):
    from bench.core.config import RunConfig
    from bench.rank import peak as rank_peak

    cfg = RunConfig(backend="single", launcher="inproc", world_size=1, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    spec = {"threads_per_rank": 1, "env": {"cpu_model": "EPYC"}}
    assert rank_peak.for_run(spec, cfg, torch.device("cpu"), None) is None  # searches, bench overhead, --external
    (tmp_path / "a-file").write_text("")
    got = rank_peak.for_run({**spec, "peak": {"cache": str(tmp_path / "a-file" / "peak")}}, cfg, torch.device("cpu"),
                            None)
    assert got["tflops"] is None and got["reason"].startswith("not measured: ")


def test_a_measurement_torch_refuses_is_a_reason_and_a_mistake_of_ours_an_error(tmp_path, monkeypatch):
    from bench.core.config import RunConfig
    from bench.rank import peak as rank_peak

    cfg = RunConfig(backend="single", launcher="inproc", world_size=1, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    spec = {"threads_per_rank": 1, "env": {"cpu_model": "EPYC"}, "peak": {"cache": str(tmp_path / "peak")}}
    monkeypatch.setattr(rank_peak, "measure", lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    got = rank_peak.for_run(spec, cfg, torch.device("cpu"), None)
    assert got == {"tflops": None, "reason": "not measured: OutOfMemoryError: oom"}
    monkeypatch.setattr(rank_peak, "measure", lambda *a, **k: (_ for _ in ()).throw(AttributeError("a typo")))
    with pytest.raises(AttributeError):  # not turned into a null figure
        rank_peak.for_run(spec, cfg, torch.device("cpu"), None)


def test_every_record_gives_mfu_against_the_measured_peak_and_names_the_mode():
    from bench.core.config import RunConfig
    from bench.rank import record

    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="gpt-micro",
                    image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1).validate()
    cfg.flops_per_sample = 3e9
    entry = {"tflops": 600.0, "cache": "/c/x.json", "measured_at": "2026-01-01T00:00:00+00:00",
             "key": peak.key("cuda", "H100", "2.15", "13.2", "fp32", False, None, machine="gpu01"),
             "best_shape": [8192] * 3}
    measured = peak.record_fields(entry)
    assert measured == {"tflops": 600.0, "cache": "/c/x.json", "measured_at": "2026-01-01T00:00:00+00:00",
                        "measured_now": False, "mode": "fp32 (TF32 off)", "shape": [8192] * 3, "threads": None,
                        "device_name": "H100", "machine": "gpu01", "load_average": None, "cpus": None, "load": None,
                        "how": None}
    got = record.measured_peak_fields(cfg, 1000.0, measured)
    assert got["mfu_measured"] == pytest.approx(3e9 * 1000.0 / (600.0e12 * 2))
    # fp32 on a GPU: the mode is TF32's where TF32 is on for the model's FLOPs (the matmul flag for a GPT)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert record.measured_peak_fields(cfg, 1000.0, measured)["peak_mode"] == "fp32 (TF32 off)"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert record.measured_peak_fields(cfg, 1000.0, None) == {"peak_mode": "fp32 (TF32 on)", "peak_measured": None,
                                                                  "mfu_measured": None}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_the_report_shows_mfu_against_both_peaks_and_the_mode(tmp_path):
    from bench.commands import report
    from tests.test_reference import record

    measured = peak.record_fields({"tflops": 0.2, "cache": "/c/e.json", "measured_at": "2026-01-01T00:00:00+00:00",
                                   "key": cpu_key(threads=1), "best_shape": [512] * 3})
    rec = record(wall=(0.5,) * 4, flops_per_sample=2e9, peak_measured=measured, peak_mode="fp32",
                 peak_tflops_per_device=None)
    results.save(rec, tmp_path / "raw")
    assert report.cmd_report(argparse.Namespace(results=str(tmp_path / "raw"), out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert ("| backend | CPU workers | precision | FLOPs / sample | achieved per device | MFU (datasheet) | energy / sample"
            " | power (all GPUs) | MFU (measured peak) | measured peak per device | precision mode |") in md
    # 4 img/s x 2 GFLOP = 8 GFLOP/s of a measured 200 GFLOP/s: 4%
    assert "| single | 1 | fp32 | 2.00 GFLOP | 8.0 GFLOP/s |  |  |  | 4.0 % | 200.0 GFLOP/s | fp32 |" in md


@pytest.mark.parametrize("args,message", [
    (["--threads", 0], "bench: error: --threads 0: a positive number of threads, for the CPU only"),
    (["--precision", "fp8"], "bench: error: --precision 'fp8': unknown precision fp8; choose from fp32, bf16, fp16"),
    (["--precision", "fp16"], "bench: error: --precision fp16: the suite trains fp16 on CUDA only"),
])
def test_bad_input_is_one_line(capsys, args, message):
    code, err = cli_error(capsys, "peak", "--device", "cpu", *args)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(message), err


def test_the_modes_measured_by_default():
    from bench.commands.peak import modes

    assert modes("cuda", None) == [["fp32", False], ["fp32", True], ["bf16", None], ["fp16", None]]
    assert modes("cpu", None) == [["fp32", None], ["bf16", None]]
    assert modes("cuda", "bf16,bf16") == [["bf16", None]]


@pytest.mark.slow
def test_bench_peak_measures_in_a_process_of_its_own_and_prints_the_table(tmp_path):
    proc = bench_inproc("peak", "--device", "cpu", "--precision", "bf16", "--threads", 1, "--results", tmp_path / "raw",
                        env={"BENCH_PEAK_CACHE": tmp_path / "cache", "OMP_WAIT_POLICY": "PASSIVE"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [entry_file] = (tmp_path / "cache").glob("*.json")
    entry = json.loads(entry_file.read_text())
    assert entry["key"]["precision"] == "bf16" and entry["key"]["threads"] == 1 and entry["tflops"] > 0
    [rec_file] = (tmp_path / "raw" / "peak").glob("*.json")
    rec = json.loads(rec_file.read_text())
    assert rec["kind"] == "peak" and rec["threads"] == 1 and rec["entries"][0]["cache"] == str(entry_file)
    assert "| device | mode | threads | TFLOP/s |" in proc.stdout and "| bf16 | 1 |" in proc.stdout
    assert "measured now" in proc.stdout and os.path.basename(entry_file) in proc.stdout


def test_a_peak_measured_beside_load_says_so_in_the_report(tmp_path):
    from bench.commands import report
    from tests.test_reference import record

    assert peak.busy({"load_average": 1.5, "cpus": 2}) is None and peak.busy(None) is None
    assert peak.busy({"load_average": 4.4, "cpus": 2}) == (  # an entry of an earlier version: its load average
        "the measured peak was measured under load (the load average was 4.4 on 2 CPUs): it may read low and the MFU "
        "against it high (--refresh-peak on a quiet machine measures it again)")
    measured = peak.record_fields({"tflops": 0.075, "cache": "/c/e.json", "measured_at": "2026-01-01T00:00:00+00:00",
                                   "key": cpu_key(threads=2), "load_average": 4.4, "cpus": 2})
    results.save(record(flops_per_sample=2e9, peak_measured=measured, peak_mode="fp32"), tmp_path / "raw")
    assert report.cmd_report(argparse.Namespace(results=str(tmp_path / "raw"), out=str(tmp_path / "rep"))) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert ("⚠ MFU (measured peak): the measured peak was measured under load (the load average was 4.4 on 2 CPUs)"
            in md)


class Busy:
    """The machine as the load probe sees it: 1 s of measurement, during which this process used 0.1 s of CPU and
    the CPUs were busy for ``others`` s more (other processes)."""

    def __init__(self, monkeypatch, others):
        import types

        self.calls = 0
        clock = iter([0.0, 1.0])
        own = iter([0.0, 0.1])
        busy = iter([100.0, 100.0 + 0.1 + others])
        monkeypatch.setattr(peak, "time", types.SimpleNamespace(monotonic=lambda: next(clock),
                                                                process_time=lambda: next(own)))
        monkeypatch.setattr(peak, "_busy_seconds", lambda cpus: next(busy))
        monkeypatch.setattr(peak.os, "sched_getaffinity", lambda pid: {0, 1})
        monkeypatch.setattr(peak.os, "getloadavg", lambda: (3.52, 2.0, 1.0))


def test_an_entry_keeps_the_load_it_was_measured_under_and_a_sweep_that_uses_it_says_so_once(monkeypatch, tmp_path,
                                                                                               capsys):
    """Issue 47: the cached peak was measured under load before the sweep that used it, and nothing said so. The
    entry stores the load (the others' share of the CPUs while it ran, judged as a run's timed windows are); a run that
    uses a loaded entry warns once per sweep, the record carries the load, and --refresh-peak measures again."""
    from bench import cli
    from bench.rank import peak as rank_peak
    from tests.test_exit_codes import launcher, ok_record

    monkeypatch.setattr(rank_peak, "measure", lambda device, precision, tf32: {
        "tflops": 0.5, "best_shape": [64] * 3, "shapes": [{"shape": [64] * 3, "tflops": 0.5}], "how": "fake"})
    Busy(monkeypatch, others=0.9)
    loaded = rank_peak.entry(cpu_key(), torch.device("cpu"), tmp_path, None)
    assert loaded["load"] == {"load_average_before": [3.52, 2.0, 1.0], "cpus": 2, "seconds": 1.0,
                              "others_cpu_share": 0.45, "others_cpu_cores": 0.9, "disturbed": True,
                              "reason": "other processes used 45% of the 2 CPUs (0.90 cores) during the measurement "
                                        "(limit 10%)"}
    assert peak.table([loaded]).splitlines()[2].split(" | ")[6] == "⚠ others 45% of 2 CPUs (load average 3.5)"
    measured = peak.record_fields(json.loads(peak.entry_path(cpu_key(), tmp_path).read_text()) | {
        "cache": str(peak.entry_path(cpu_key(), tmp_path))})
    note = (f"the matmul peak of CPU: EPYC fp32 (cached, measured {loaded['measured_at']}: "
            f"{peak.entry_path(cpu_key(), tmp_path)}) was measured under load (other processes used 45% of the 2 CPUs "
            "(0.90 cores) during the measurement (limit 10%)): it may read low and every MFU against it high; "
            "--refresh-peak on a quiet machine measures it again")
    assert peak.warning(measured) == note and peak.busy(measured).startswith("the measured peak was measured under")
    # a sweep of two runs that both used it: one warning line
    launcher(monkeypatch, lambda cfg, spec: {**ok_record(cfg), "peak_measured": measured})
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--backends", "single,dp", "--gpus", "1", "--device", "cpu", "--model", "resnet18",
                  "--image-size", "32", "--batch-size", "2", "--warmup", "2", "--steps", "1", "--windows", "2",
                  "--results", str(tmp_path / "raw")])
    err = capsys.readouterr().err
    assert e.value.code == 0 and err.count(f"warning: {note}\n") == 1
    # measured quietly: nothing to say
    Busy(monkeypatch, others=0.01)
    quiet = rank_peak.entry(cpu_key("bf16"), torch.device("cpu"), tmp_path, None)
    assert quiet["load"]["disturbed"] is False and quiet["load"]["reason"] is None
    assert peak.warning(peak.record_fields(quiet)) is None and peak.busy(peak.record_fields(quiet)) is None

"""The regression gate (``bench compare``) and baselines (``bench baseline save``).

Synthetic records with known window distributions (seeded numpy) exercise every verdict and exit code in
process, in well under a second each. One end-to-end test compares two real CPU runs of the same
configuration through the real CLI.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import cli
from bench.commands import baseline
from bench.core import results
from tests.conftest import REPO, bench

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
GiB = 2 ** 30
BASE_SECONDS = 0.5  # per window: 64 x 2 ranks x 10 steps / 0.5 s = 2560 img/s


def windows(seed, n=5, scale=1.0, sigma=0.005):
    """Window times, lognormal around BASE_SECONDS * scale: sigma 0.005 is tight, 0.5 is huge variance."""
    return list(BASE_SECONDS * scale * np.random.default_rng(seed).lognormal(0.0, sigma, n))


def runs(seed, k=3, scale=1.0, run_sigma=0.005, sigma=0.005, n=5, **over):
    """k records of one configuration: each run's level is lognormal(run_sigma) around ``scale``, its windows
    lognormal(sigma) around that level, as repeated runs on a real machine behave."""
    levels = np.random.default_rng(seed).lognormal(0.0, run_sigma, k)
    return [record(windows(seed * 100 + i, n=n, scale=scale * lv, sigma=sigma), **over) for i, lv in enumerate(levels)]


def record(window_seconds, backend="ddp", world_size=2, device_type="cuda", gpu=A100, mem_gib=10.0,
           status="ok", reason=None, torch="2.4.0", cuda="12.4", driver="550.54.15", host_rss_gib=2.0, **over):
    env = {"torch": torch, "cuda": cuda if device_type == "cuda" else None, "cudnn": 90100, "nccl": "2.20.5",
           "driver": driver if device_type == "cuda" else None, "gpu_names": [gpu] * world_size if device_type == "cuda" else [],
           "gpu_count": world_size if device_type == "cuda" else 0, "cpu_model": "Test CPU @ 3.00GHz",
           "cpu_count": 16, "hostname": "test", "python": "3.11", "git_commit": "abc", "started_at": "2025-01-01T00:00:00+00:00"}
    memory = [{"device_index": i, "device_name": gpu, "peak_allocated_bytes": int(mem_gib * GiB * 0.8),
               "peak_reserved_bytes": int(mem_gib * GiB), "nvml_used_bytes": int(mem_gib * GiB * 1.1)}
              for i in range(world_size)] if device_type == "cuda" and status == "ok" else []
    rec = {
        "schema": results.SCHEMA, "run_id": results.new_run_id(backend, world_size), "status": status, "reason": reason,
        "backend": backend, "launcher": "torchrun", "world_size": world_size, "device_type": device_type,
        "model": "resnet50", "image_size": 224, "precision": "fp32", "batch_per_device": 64,
        "global_batch": 64 * world_size, "warmup_steps": 10, "steps_per_window": 10,
        "windows": len(window_seconds), "window_seconds": list(window_seconds) if status == "ok" else [],
        "throughput": None, "throughput_ci95": None, "memory": memory, "memory_imbalance": 1.0, "data": "synthetic",
        "options": {}, "replicas_consistent": True, "env": env,
        "host_peak_rss_bytes": [int(host_rss_gib * GiB)] * world_size,
        "cudnn_benchmark": True if device_type == "cuda" else None, "repeat_index": 1, "repeats": 1,
    }
    rec.update(over)
    return rec


def write(directory, *recs):
    for r in recs:
        results.save(r, directory)
    return directory


def gate(capsys, *argv):
    """Run ``python -m bench compare ...`` in process: (exit code, parsed JSON or None, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    data = json.loads(out) if "--format" in argv and "json" in argv and out.strip() else None
    return e.value.code, data, out, err


def pair(tmp_path, base_recs, cur_recs):
    return write(tmp_path / "base", *base_recs), write(tmp_path / "cur", *cur_recs)


def only_row(data):
    assert len(data["rows"]) == 1, data["rows"]
    return data["rows"][0]


# ---------------------------------------------------------------------------------------------------
# Throughput verdicts

def test_identical_pair_passes(tmp_path, capsys):
    side = runs(1)
    b, c = pair(tmp_path, side, [dict(r, run_id=r["run_id"] + "-again") for r in side])
    code, data, _, err = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 0 and err == ""
    assert row["verdict"] == "no significant change" and row["regression"] is False
    assert row["ratio"] == pytest.approx(1.0) and row["p_value"] == pytest.approx(1.0)
    assert data["test"] == "welch" and data["regressed"] is False


def test_twenty_percent_slowdown_across_runs_fails(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2, scale=1.25))  # 1/1.25 = 0.8x throughput
    code, data, out, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 1
    assert row["verdict"] == "slower" and row["regression"] is True
    assert row["ratio"] == pytest.approx(0.8, rel=0.02)
    assert row["p_value"] < 0.001  # 3 vs 3 run medians, 0.5% run-to-run spread
    assert (row["baseline"]["runs"], row["baseline"]["windows"], len(row["current"]["run_medians"])) == (3, 15, 3)
    assert data["regressions"] == [row["config"]]


def test_slowdown_table_in_markdown(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2, scale=1.25))
    code, _, out, _ = gate(capsys, b, c)
    assert code == 1
    header = next(line for line in out.splitlines() if line.startswith("| config"))
    assert [h.strip() for h in header.strip("|").split("|")] == [
        "config", "baseline img/s", "current img/s", "ratio", "p-value", "peak memory (GiB)", "verdict", "notes"]
    row = next(line for line in out.splitlines() if line.startswith("| ddp x2"))
    assert "**slower**" in row and "| 0.80" in row and "(3 runs, 15 windows, CV " in row
    assert "Welch's t-test on log run medians" in out and "The run is the unit" in out and "**REGRESSION**" in out


def test_three_percent_under_five_percent_threshold_passes(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2, scale=1.03))
    code, data, _, _ = gate(capsys, b, c, "--threshold", "0.05", "--format", "json")
    row = only_row(data)
    assert code == 0
    assert row["p_value"] < 0.01  # the change is real ...
    assert row["verdict"] == "no significant change"  # ... but smaller than the threshold
    assert "within the 5% threshold" in row["notes"][0]


def test_twenty_percent_in_huge_run_to_run_variance_is_not_significant(tmp_path, capsys):
    # 30% run-to-run spread, 3 runs a side: these seeds' medians differ by about 20%, and nothing is established
    b, c = pair(tmp_path, runs(9, run_sigma=0.3), runs(10, scale=1.25, run_sigma=0.3))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 0
    assert row["verdict"] == "no significant change" and row["p_value"] > 0.05
    assert abs(row["ratio"] - 1) > 0.05  # beyond the threshold: significance is what's missing


def test_tight_windows_do_not_make_run_to_run_drift_significant(tmp_path, capsys):
    """Windows inside a run agree within 0.2%, runs differ by about 4%: the medians of these seeds' sides differ
    by about 6%. Pooled windows as samples (the old gate) call that a significant slowdown; across runs it
    is not established, so the gate passes."""
    from scipy import stats

    base, cur = runs(2, run_sigma=0.04, sigma=0.002), runs(20, run_sigma=0.04, sigma=0.002)
    b, c = pair(tmp_path, base, cur)
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert abs(row["ratio"] - 1) > 0.05
    pooled = [[64 * 2 * 10 / t for r in side for t in r["window_seconds"]] for side in (base, cur)]
    assert stats.mannwhitneyu(pooled[1], pooled[0]).pvalue < 0.01  # what a window-level test would conclude
    assert code == 0 and row["verdict"] == "no significant change" and row["p_value"] > 0.01


def test_faster_is_reported_and_passes(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2, scale=0.8))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 0 and only_row(data)["verdict"] == "faster"


def test_one_run_a_side_is_said_not_silently_passed(tmp_path, capsys):
    # One run a side: the run-to-run spread is unknown, so no test can say anything; the gate says so.
    b, c = pair(tmp_path, runs(1, k=1), runs(2, k=1, scale=1.25))
    code, data, _, err = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 0
    assert row["verdict"] == "no significant change" and row["underpowered"] is True
    assert row["min_p_value"] == pytest.approx(1.0)
    assert "too few runs for significance at alpha 0.01 (1 vs 1 runs" in row["notes"][0]
    assert "too few runs for significance at alpha 0.01" in err and "NOT gated" in err


def test_mann_whitney_on_run_medians_needs_five_runs_a_side(tmp_path, capsys):
    # Exact two-sided Mann-Whitney U: 3 vs 3 cannot go below p = 0.1; 5 vs 5 reaches 2 / C(10, 5) = 0.0079.
    b, c = pair(tmp_path, runs(1), runs(2, scale=1.25))
    code, data, _, _ = gate(capsys, b, c, "--test", "mwu", "--format", "json")
    row = only_row(data)
    assert code == 0 and row["underpowered"] is True and row["min_p_value"] == pytest.approx(0.1)
    b, c = pair(tmp_path / "5", runs(1, k=5), runs(2, k=5, scale=1.25))
    code, data, _, _ = gate(capsys, b, c, "--test", "mwu", "--format", "json")
    row = only_row(data)
    assert code == 1 and row["verdict"] == "slower" and row["p_value"] == pytest.approx(2 / 252)
    assert data["test_name"] == "Mann-Whitney U on run medians (two-sided)"


def test_a_failed_repeat_beside_ok_ones_fails_the_gate(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2)[:2] + [record([], status="failed", reason="rank 1 exited with code 13")])
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 1 and row["verdict"] == "failed" and row["regression"] is True
    assert "1 of 3 current runs failed: rank 1 exited with code 13" in row["notes"]


# ---------------------------------------------------------------------------------------------------
# Memory

def test_memory_growth_is_flagged(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1, mem_gib=10.0), runs(1, mem_gib=12.0))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 1
    assert row["verdict"] == "more memory" and row["memory_verdict"] == "more memory"
    assert row["throughput_verdict"] == "no significant change"
    assert row["memory_ratio"] == pytest.approx(1.2, rel=1e-6) and row["regression"] is True


def test_memory_growth_inside_threshold_passes(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1, mem_gib=10.0), runs(1, mem_gib=10.3))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 0 and only_row(data)["verdict"] == "no significant change"


def test_slower_and_more_memory_together(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1, mem_gib=10.0), runs(2, scale=1.25, mem_gib=12.0))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 1 and only_row(data)["verdict"] == "slower, more memory"


def test_host_rss_is_reported_not_gated_unless_asked(tmp_path, capsys):
    cpu = dict(device_type="cpu", world_size=1, backend="single")
    b, c = pair(tmp_path, runs(1, host_rss_gib=2.0, **cpu), runs(1, host_rss_gib=3.0, **cpu))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    row = only_row(data)
    assert code == 0 and row["verdict"] == "no significant change"
    assert row["memory_kind"] == "host RSS" and row["memory_ratio"] == pytest.approx(1.5)
    assert any("not gated" in n for n in row["notes"])
    code, data, _, _ = gate(capsys, b, c, "--gate-host-memory", "--format", "json")
    assert code == 1 and only_row(data)["verdict"] == "more memory"


# ---------------------------------------------------------------------------------------------------
# Hardware and environment

def test_hardware_mismatch_is_refused(tmp_path, capsys):
    w = windows(1)
    b, c = pair(tmp_path, [record(w, gpu=A100)], [record(w, gpu=H100)])
    code, _, out, err = gate(capsys, b, c)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench: error: refusing to compare across hardware")
    assert A100 in lines[0] and H100 in lines[0] and "--allow-different-hardware" in lines[0]


def test_device_type_mismatch_is_refused(tmp_path, capsys):
    w = windows(1)
    b, c = pair(tmp_path, [record(w)], [record(w, device_type="cpu")])
    code, _, _, err = gate(capsys, b, c)
    assert code == 2 and "refusing to compare across hardware" in err and "(cpu)" in err


def test_different_hardware_compares_when_allowed(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1, gpu=A100), runs(2, scale=0.5, gpu=H100))
    code, data, _, err = gate(capsys, b, c, "--allow-different-hardware", "--format", "json")
    row = only_row(data)
    assert code == 0 and row["verdict"] == "faster" and row["status"] == "compared"
    assert "comparing different hardware" in err


def test_version_differences_warn_but_compare(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1, torch="2.4.0", driver="550.54.15"), runs(1, torch="2.5.1", driver="560.28.03"))
    code, data, out, err = gate(capsys, b, c)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "torch differs: baseline 2.4.0, current 2.5.1" in warnings[0]
    assert "driver differs: baseline 550.54.15, current 560.28.03" in warnings[1]
    assert "torch differs" in out  # the report carries them too


# ---------------------------------------------------------------------------------------------------
# New and missing configurations

def test_missing_and_new_configs_are_listed_without_failing(tmp_path, capsys):
    b, c = pair(tmp_path, [record(windows(1)), record(windows(2), world_size=4)],
                [record(windows(3)), record(windows(4), world_size=8)])
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    verdicts = {r["config"]: r["verdict"] for r in data["rows"]}
    assert code == 0
    assert verdicts == {"ddp x2 resnet50 224px b64/dev fp32": "no significant change",
                        "ddp x4 resnet50 224px b64/dev fp32": "missing",
                        "ddp x8 resnet50 224px b64/dev fp32": "new"}
    assert data["missing"] == ["ddp x4 resnet50 224px b64/dev fp32"]
    assert data["new"] == ["ddp x8 resnet50 224px b64/dev fp32"]


def test_failed_current_run_fails_the_gate_with_its_reason(tmp_path, capsys):
    b, c = pair(tmp_path, [record(windows(1)), record(windows(2), backend="dp", launcher="inproc")],
                [record(windows(3)), record([], backend="dp", status="failed", reason="out of memory")])
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    dp = next(r for r in data["rows"] if r["config"].startswith("dp "))
    assert code == 1 and dp["verdict"] == "failed" and dp["regression"] is True
    assert dp["notes"] == ["current run failed: out of memory"]


def test_skipped_current_run_is_missing_without_failing(tmp_path, capsys):
    b, c = pair(tmp_path, [record(windows(1)), record(windows(2), backend="horovod")],
                [record(windows(3)), record([], backend="horovod", status="skipped", reason="horovod is not installed")])
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    hvd = next(r for r in data["rows"] if r["config"].startswith("horovod "))
    assert code == 0 and hvd["verdict"] == "missing"
    assert hvd["notes"] == ["current run skipped: horovod is not installed"]


def test_diverged_replicas_fail_the_gate_even_when_faster(tmp_path, capsys):
    b, c = pair(tmp_path, runs(1), runs(2, scale=0.7, replicas_consistent=False))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    [row] = data["rows"]
    assert code == 1 and row["verdict"] == "faster, replicas differ" and row["regression"] is True


def test_nothing_in_common_is_an_error(tmp_path, capsys):
    b, c = pair(tmp_path, [record(windows(1))], [record(windows(2), world_size=4)])
    code, _, out, err = gate(capsys, b, c)
    assert code == 2
    assert "| ddp x2" in out and "| ddp x4" in out  # the table still shows what was there
    assert err.strip().splitlines()[-1].startswith("bench: error: no configuration is present in both")


# ---------------------------------------------------------------------------------------------------
# Bad input: one "bench: error:" line, exit 2, no traceback

@pytest.mark.parametrize("extra,message", [
    (["--format", "xml"], "unknown format 'xml'; choose from md, json"),
    (["--threshold", "-0.1"], "--threshold '-0.1'"),
    (["--threshold", "1.5"], "--threshold '1.5'"),
    (["--threshold", "five"], "--threshold 'five'"),
    (["--alpha", "0"], "--alpha '0'"),
    (["--alpha", "1"], "--alpha '1'"),
    (["--alpha", "nan"], "--alpha 'nan'"),
    (["--test", "ks"], "unknown test 'ks'"),
])
def test_bad_options(tmp_path, capsys, extra, message):
    w = windows(1)
    b, c = pair(tmp_path, [record(w)], [record(w)])
    code, _, out, err = gate(capsys, b, c, *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"bench: error: {message}")


def test_missing_path_and_empty_dir(tmp_path, capsys):
    b = write(tmp_path / "base", record(windows(1)))
    code, _, _, err = gate(capsys, b, tmp_path / "nope")
    assert code == 2 and err == f"bench: error: current '{tmp_path / 'nope'}' does not exist\n"
    (tmp_path / "empty").mkdir()
    code, _, _, err = gate(capsys, tmp_path / "empty", b)
    assert code == 2 and err.startswith("bench: error: baseline") and "holds no readable schema-2 records" in err


def test_only_failed_records_is_bad_input(tmp_path, capsys):
    b = write(tmp_path / "base", record(windows(1)))
    c = write(tmp_path / "cur", record([], status="failed", reason="boom"))
    code, _, _, err = gate(capsys, b, c)
    assert code == 2 and "holds no ok records (1 failed, 0 skipped)" in err


def test_out_file_gets_the_report(tmp_path, capsys):
    w = windows(1)
    b, c = pair(tmp_path, [record(w)], [record(w)])
    code, _, out, _ = gate(capsys, b, c, "--out", tmp_path / "report" / "regress.md")
    assert code == 0 and (tmp_path / "report" / "regress.md").read_text() == out


# ---------------------------------------------------------------------------------------------------
# Baselines

def save(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "save", *map(str, argv)])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_baseline_save_writes_ok_records_and_compares(tmp_path, capsys):
    raw = write(tmp_path / "raw", record(windows(1)), record(windows(2), world_size=4),
                record([], backend="dp", status="failed", reason="boom"))
    code, out, _ = save(capsys, "--from", raw, "--name", "nightly", "--out-dir", tmp_path / "baselines")
    path = tmp_path / "baselines" / "nightly.json"
    assert code == 0 and str(path) in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["name"] == "nightly" and doc["created_at"]
    assert len(doc["records"]) == 2 and all(r["status"] == "ok" for r in doc["records"])
    assert not any(k.startswith("_") for r in doc["records"] for k in r)
    assert list(tmp_path.joinpath("baselines").iterdir()) == [path]  # no temp file left behind
    assert len(results.load(path)) == 2
    code, data, _, _ = gate(capsys, path, raw, "--format", "json")
    assert code == 0 and [r["verdict"] for r in data["rows"]] == ["no significant change"] * 2


def test_baseline_save_refuses_overwrite_without_force(tmp_path, capsys):
    raw = write(tmp_path / "raw", record(windows(1)))
    args = ("--from", raw, "--name", "x", "--out-dir", tmp_path / "b")
    assert save(capsys, *args)[0] == 0
    before = (tmp_path / "b" / "x.json").read_text()
    write(tmp_path / "raw", record(windows(2)))
    code, _, err = save(capsys, *args)
    assert code == 2 and err.startswith("bench: error: baseline") and "--force" in err
    assert (tmp_path / "b" / "x.json").read_text() == before
    code, _, _ = save(capsys, *args, "--force")
    assert code == 0 and len(json.loads((tmp_path / "b" / "x.json").read_text())["records"]) == 2


def test_baseline_save_latest_and_default_name(tmp_path, capsys):
    old = record(windows(1), finished_at="2025-01-01T00:00:00+00:00")
    new = record(windows(2), finished_at="2025-02-01T00:00:00+00:00")
    raw = write(tmp_path / "raw", old, new, record(windows(3), world_size=4))
    code, _, _ = save(capsys, "--from", raw, "--latest", "--out-dir", tmp_path / "b")
    path = tmp_path / "b" / "NVIDIA-A100-SXM4-80GB-x4.json"  # named after the GPU model and largest world size
    assert code == 0 and path.exists()
    run_ids = {r["run_id"] for r in json.loads(path.read_text())["records"]}
    assert len(run_ids) == 2 and new["run_id"] in run_ids and old["run_id"] not in run_ids


@pytest.mark.parametrize("bad", ["empty", "bad-name"])
def test_baseline_save_bad_input(tmp_path, capsys, bad):
    raw = write(tmp_path / "raw", record([], status="failed", reason="boom") if bad == "empty" else record(windows(1)))
    name = "../evil" if bad == "bad-name" else "x"
    code, out, err = save(capsys, "--from", raw, "--name", name, "--out-dir", tmp_path / "b")
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("bench: error:")
    assert ("no ok records to save" if bad == "empty" else "baseline name '../evil'") in err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_baseline_name_from_records(tmp_path, capsys):
    raw = write(tmp_path / "raw", record(windows(1), gpu=H100))
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "name", "--from", str(raw)])
    assert e.value.code == 0 and capsys.readouterr().out == "NVIDIA-H100-80GB-HBM3-x2\n"
    assert baseline.slug("CPU: Intel(R) Xeon(R) Processor @ 2.80GHz") == "CPU-Intel-R-Xeon-R-Processor-2.80GHz"


# ---------------------------------------------------------------------------------------------------
# End to end: two real CPU runs of one configuration pass the gate.

RUN = ["--backends", "single", "--gpus", "1", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
       "--batch-size", "4", "--warmup", "2", "--steps", "2", "--windows", "3", "--repeat", "2"]


@pytest.mark.slow
def test_two_real_cpu_sides_of_one_config_pass_the_gate(tmp_path, capsys):
    # The two runs execute at the same time, so whatever else loads this (shared, 2-core) machine slows both
    # alike; run one after the other, a neighbour starting between them can shift every window of the second.
    # --threshold 0.5: the statistics are pinned down by the synthetic tests above; this test checks that real
    # records of one configuration group together, pass the hardware check and go through the gate, and a
    # 5% threshold on two real runs on a busy 2-core machine would make it flaky, not stricter.
    # Each side gets a core of its own (an affinity mask, which sets its threads): two sides of 2 threads each on 2
    # cores would oversubscribe them, and OpenMP's spinning threads then take several times as long.
    dirs, cores = [tmp_path / "a", tmp_path / "b"], sorted(os.sched_getaffinity(0))
    pins = [{cores[i % len(cores)]} for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "bench", "run", *RUN, "--results", str(d)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=lambda pin=pin: os.sched_setaffinity(0, pin)) for d, pin in zip(dirs, pins)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    capsys.readouterr()
    for way, (base, cur) in enumerate((dirs, dirs[::-1])):  # a slowdown one way would be a speed-up the other
        args = ("--threshold", "0.5", "--format", "json")
        if way == 0:  # as a user runs it
            proc = bench("compare", base, cur, *args)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        else:  # in this process (one torch start-up less)
            code, _, out, err = gate(capsys, base, cur, *args)
        data = json.loads(out)
        row = only_row(data)
        # a neighbour (another test worker) during a side's windows makes the comparison inconclusive (exit 3)
        disturbed = row["inconclusive"] and row["verdict"] == "inconclusive"
        assert code == (3 if disturbed else 0), out + err
        assert row["status"] == "compared" and row["config"] == "single x1 resnet18 32px b4/dev fp32"
        assert row["verdict"] in ("no significant change", "faster", "inconclusive")  # never slower
        assert (row["baseline"]["runs"], row["current"]["runs"], row["current"]["windows"]) == (2, 2, 6)
        assert row["memory_kind"] == "host RSS"  # CPU: reported, not gated
        assert data["hardware"]["baseline"] == data["hardware"]["current"]
        assert data["hardware"]["current"][0][0] == "cpu"
    # `make regress` finds the baseline by this machine's name: it must be the name its records carry
    here = subprocess.run([sys.executable, "-m", "bench", "baseline", "name", "--gpus", "1"], cwd=REPO, text=True,
                          capture_output=True, preexec_fn=lambda: os.sched_setaffinity(0, pins[0]))  # as side a ran
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "name", "--from", str(dirs[0])])
    assert here.returncode == 0 and e.value.code == 0, here.stderr
    assert here.stdout == capsys.readouterr().out and here.stdout.startswith("CPU-")


def test_within_run_interval_is_scipy_s_percentile_bootstrap_to_the_bit_and_ranks_need_no_scipy():
    """median_ci95 resamples and interpolates as scipy.stats.bootstrap(method="percentile") does, without importing
    scipy (2 s of CPU in every rank that imports bench.core.stats)."""
    from scipy import stats as sp

    from bench.core.stats import N_RESAMPLES, _quantile_linear, median_ci95

    rng = np.random.default_rng(3)
    samples = [[10.0, 12.0], [5.0, 5.0, 6.0], list(np.round(rng.lognormal(0, 0.3, 7) * 100, 1))]
    samples += [list(rng.lognormal(0, 0.3, n) * 100) for n in (3, 5, 10, 31)]
    for x in samples:
        ref = sp.bootstrap((np.asarray(x),), np.median, confidence_level=0.95, n_resamples=N_RESAMPLES,
                           method="percentile", random_state=np.random.default_rng(0)).confidence_interval
        assert median_ci95(x) == (float(np.median(x)), [float(ref.low), float(ref.high)]), x
    alpha = (1 - 0.95) / 2  # the interpolation alone, on values that are all distinct
    for n in (N_RESAMPLES, 7, 2):
        values = np.sort(rng.normal(size=n))
        for p in (alpha, 1 - alpha, 0.5):
            assert _quantile_linear(values, p) == float(sp.quantile(values, p, method="linear")), (n, p)
    assert median_ci95([7.0]) == (7.0, [7.0, 7.0]) and median_ci95([3.0, 3.0]) == (3.0, [3.0, 3.0])
    probe = subprocess.run([sys.executable, "-c", "import sys, bench.core.stats; print('scipy' in sys.modules)"],
                           cwd=REPO, capture_output=True, text=True)
    assert probe.stdout.strip() == "False", probe.stderr

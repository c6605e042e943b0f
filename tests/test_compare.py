"""The regression gate (``bench compare``) and baselines (``bench baseline save``).

Synthetic records with known window distributions (seeded numpy) exercise every verdict and exit code in
process, in well under a second each, through the command line and through the verdict function itself
(``compare.compare``). One end-to-end test compares two real CPU runs of the same configuration through the real CLI.
The statistics the gate stands on are in tests/test_stats.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats  # noqa: F401 - imported at collection on purpose: see tests/README.md (Mutation testing)

from bench import cli
from bench.commands import baseline, compare
from bench.core import results
from tests.conftest import REPO, bench

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
GiB = 2 ** 30
BASE_SECONDS = 0.5  # per window: 64 x 2 ranks x 10 steps / 0.5 s = 2560 img/s

pytestmark = pytest.mark.mutation


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
    (["--format", "xml"], "--format 'xml': unknown format; choose from md, json"),
    (["--threshold", "-0.1"], "--threshold '-0.1'"),
    (["--threshold", "1.5"], "--threshold '1.5'"),
    (["--threshold", "five"], "--threshold 'five'"),
    (["--alpha", "0"], "--alpha '0'"),
    (["--alpha", "1"], "--alpha '1'"),
    (["--alpha", "nan"], "--alpha 'nan'"),
    (["--test", "ks"], "--test 'ks': unknown test"),
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


def test_only_failed_current_records_fail_the_gate_and_only_failed_baseline_ones_are_bad_input(tmp_path, capsys):
    """Every current run failed: those runs failed (exit 1, as the exit-code contract says), not bad input; a baseline
    with no ok run is unusable (exit 2)."""
    b = write(tmp_path / "base", record(windows(1)))
    c = write(tmp_path / "cur", record([], status="failed", reason="boom"))
    code, data, _, _ = gate(capsys, b, c, "--format", "json")
    assert code == 1 and only_row(data)["verdict"] == "failed" and "current run failed: boom" in only_row(data)["notes"]
    code, _, _, err = gate(capsys, c, b)
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
                record([], backend="dp", status="skipped", reason="not here"))
    code, out, _ = save(capsys, "--from", raw, "--name", "nightly", "--out-dir", tmp_path / "baselines")
    path = tmp_path / "baselines" / "nightly.json"
    assert code == 0 and str(path) in out and "(1 record(s) left out)" in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["name"] == "nightly" and doc["created_at"]
    assert len(doc["records"]) == 2 and all(r["status"] == "ok" for r in doc["records"])
    assert not any(k.startswith("_") for r in doc["records"] for k in r)
    assert list(tmp_path.joinpath("baselines").iterdir()) == [path]  # no temp file left behind
    assert len(results.load(path)) == 2
    code, data, _, _ = gate(capsys, path, raw, "--format", "json")
    assert code == 0 and [r["verdict"] for r in data["rows"]] == ["no significant change"] * 2


QUIET = {"cpus": 2, "load_before": [1.3, 1.1, 0.9], "load_after": [2.1, 1.4, 1.0],
         "windows": {"others_cpu_share": 0.03, "others_cpu_cores": 0.06}}
BUSY = {"cpus": 2, "load_before": [3.5, 2.0, 1.0], "load_after": [4.6, 2.5, 1.2],
        "windows": {"others_cpu_share": 0.45, "others_cpu_cores": 0.9}}
BUSY_WHY = "other processes used 45% of the 2 CPUs (0.90 cores) during the timed windows (limit 10%)"


def test_baseline_save_refuses_failed_or_disturbed_runs_unless_accepted_and_records_the_load(tmp_path, capsys):
    """Issue 47: `make baseline` saved 6 disturbed records without a word, and every later gate against them was
    inconclusive. A failed run is refused with exit 1, disturbed runs with exit 3 (inconclusive, as the gate calls
    them), one line naming the runs and why, nothing written; --accept-disturbed saves the ok runs and says so."""
    out_dir = tmp_path / "b"
    clean = record(windows(1), machine=QUIET, disturbed=False, disturbed_reasons=[])
    busy = record(windows(2), world_size=4, machine=BUSY, disturbed=True, disturbed_reasons=[BUSY_WHY])
    crashed = record([], backend="dp", status="failed", reason="rank 1 exited with SIGKILL (out of memory?)")
    raw = write(tmp_path / "failed", clean, crashed)
    code, out, err = save(capsys, "--from", raw, "--name", "x", "--out-dir", out_dir)
    assert (code, out, err) == (1, "", f"bench: error: --from {str(raw)!r}: 1 failed run (dp x2 fp32: rank 1 exited "
                                       "with SIGKILL (out of memory?)); a baseline holds only clean runs: fix and "
                                       "re-run, or pass --accept-disturbed to save the ok runs anyway\n")
    raw = write(tmp_path / "disturbed", clean, busy)
    code, out, err = save(capsys, "--from", raw, "--name", "x", "--out-dir", out_dir)
    assert (code, out, err) == (3, "", f"bench: error: --from {str(raw)!r}: 1 of 2 ok runs disturbed (ddp x4 fp32: "
                                       f"{BUSY_WHY}); every comparison against it would be inconclusive: record it on "
                                       "a quiet machine (bench run --wait-quiet-s), or pass --accept-disturbed\n")
    assert not out_dir.exists()
    write(raw, crashed)
    code, out, err = save(capsys, "--from", raw, "--name", "x", "--out-dir", out_dir, "--accept-disturbed")
    doc = json.loads((out_dir / "x.json").read_text())
    assert code == 0 and len(doc["records"]) == 2 and {r["status"] for r in doc["records"]} == {"ok"}
    assert doc["load"] == {"runs": 2, "watched_runs": 2, "disturbed_runs": 1, "cpus": 2,
                           "load_average_1m": [1.3, 4.6], "others_cpu_share_max": 0.45, "accepted_disturbed": True}
    assert ("load average 1.3-4.6 on 2 CPUs, other processes at most 45% of the CPUs while timed, 1 of 2 runs "
            "disturbed") in out
    assert err == ("warning: baseline x was saved with --accept-disturbed: 1 disturbed run(s) in it, 1 failed left out; "
                   "comparisons against its disturbed configurations will be inconclusive (exit 3)\n")
    # a clean one records its load too, and was not accepted as disturbed
    code, out, _ = save(capsys, "--from", write(tmp_path / "clean", clean), "--name", "y", "--out-dir", out_dir)
    assert code == 0 and json.loads((out_dir / "y.json").read_text())["load"] == {
        "runs": 1, "watched_runs": 1, "disturbed_runs": 0, "cpus": 2, "load_average_1m": [1.3, 2.1],
        "others_cpu_share_max": 0.03, "accepted_disturbed": False}


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
    assert ("no ok records to save" if bad == "empty" else "--name '../evil'") in err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_baseline_name_from_records(tmp_path, capsys):
    raw = write(tmp_path / "raw", record(windows(1), gpu=H100))
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "name", "--from", str(raw)])
    assert e.value.code == 0 and capsys.readouterr().out == "NVIDIA-H100-80GB-HBM3-x2\n"
    assert baseline.slug("CPU: Intel(R) Xeon(R) Processor @ 2.80GHz") == "CPU-Intel-R-Xeon-R-Processor-2.80GHz"


def test_a_gpu_baseline_is_named_for_its_gpu_and_keeps_its_driver_and_torch(tmp_path, capsys, monkeypatch):
    """Issue 63: on a machine of one H200 (fake), `make baseline` and `make regress` and the GPU workflow all name
    results/baselines/NVIDIA-H200-x1.json: the name `bench baseline name` gives the machine is the one `bench baseline
    save` gives that machine's records, and the file says which driver, CUDA and torch its numbers came from."""
    from tests.fake_gpu import FakeGpu, FakeGpuMachine

    FakeGpuMachine([FakeGpu(name="NVIDIA H200")]).install(monkeypatch)
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "name", "--max-gpus", "all", "--dir", str(tmp_path / "none")])
    assert e.value.code == 0 and capsys.readouterr().out == "NVIDIA-H200-x1\n"
    h200 = dict(gpu="NVIDIA H200", world_size=1, backend="single", driver="580.159.04", torch="2.11.0+cu130",
                cuda="13.0", machine=QUIET, disturbed=False, disturbed_reasons=[])
    raw = write(tmp_path / "raw", record(windows(1), **h200), record(windows(2), **{**h200, "backend": "ddp"}))
    out_dir = tmp_path / "results" / "baselines"
    code, out, err = save(capsys, "--from", raw, "--out-dir", out_dir)
    path = out_dir / "NVIDIA-H200-x1.json"
    assert (code, err) == (0, "") and path.exists()
    doc = json.loads(path.read_text())
    assert doc["hardware"] == ["NVIDIA H200"] and doc["environment"] == {
        "driver": ["580.159.04"], "cuda": ["13.0"], "torch": ["2.11.0+cu130"], "nccl": ["2.20.5"], "cudnn": ["90100"]}
    assert ("on NVIDIA H200 (driver 580.159.04, cuda 13.0, torch 2.11.0+cu130, nccl 2.20.5, cudnn 90100)"
            in out), out
    # where make regress and the workflow look for it: results/baselines/<bench baseline name>.json
    makefile = (REPO / "Makefile").read_text()
    assert "base=results/baselines/$$name.json" in makefile and "bench baseline name --max-gpus $(GPUS)" in makefile
    workflow = (REPO / ".github" / "workflows" / "gpu-regression.yml").read_text()
    assert 'bench baseline name --max-gpus all)}"' in workflow and 'file="results/baselines/$name.json"' in workflow


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


# ---------------------------------------------------------------------------------------------------
# The verdict function, in process: compare.compare on records whose run medians are exact (1280 images a window:
# 0.5 s is 2560 img/s)

def gate_records(thr, k=3, **over):
    windows = over.pop("window_seconds", [1280 / thr] * 3)
    return [record(windows, **over) for _ in range(k)]


def side(ok, other=()):
    return {"path": "x", "ok": list(ok), "other": list(other)}


def judge(base, cur, threshold=0.05, alpha=0.01, **kw):
    warned = []
    result = compare.compare(side(*base) if isinstance(base, tuple) else side(base),
                             side(*cur) if isinstance(cur, tuple) else side(cur), threshold, alpha,
                             warn=warned.append, **kw)
    return result, warned


@pytest.mark.parametrize("cur,threshold,verdict,note", [
    (2048.0, 0.2, "no significant change", "-20.0% is significant (p=0) but within the 20% threshold"),
    (1920.0, 0.2, "slower", "-25.0% throughput, beyond the 20% threshold"),
    (3200.0, 0.25, "no significant change", "+25.0% is significant (p=0) but within the 25% threshold"),
    (3328.0, 0.25, "faster", "+30.0% throughput, beyond the 25% threshold"),
])
def test_a_change_counts_only_beyond_the_threshold(cur, threshold, verdict, note):
    result, warned = judge(gate_records(2560.0), gate_records(cur), threshold=threshold)
    [row] = result["rows"]
    assert (row["verdict"], row["throughput_verdict"], row["notes"]) == (verdict, verdict, [note])
    assert row["ratio"] == cur / 2560.0 and (row["p_value"], row["min_p_value"]) == (0.0, 0.0)
    assert row["regression"] is (verdict == "slower") and result["regressed"] is (verdict == "slower")
    assert row["underpowered"] is False and warned == []
    assert result["schema"] == 1 and result["test"] == "welch" and result["allow_different_hardware"] is False
    assert result["threshold"] == threshold and result["alpha"] == 0.01 and result["compared"] == 1


def test_p_equal_to_alpha_is_not_significant_and_a_floor_equal_to_alpha_is_not_underpowered():
    base = [r for t in (2560.0, 2561.0, 2562.0) for r in gate_records(t, k=1)]
    cur = [r for t in (2000.0, 2001.0, 2002.0) for r in gate_records(t, k=1)]
    result, warned = judge(base, cur, alpha=0.1, test="mwu")  # 3 against 3, fully apart: p = 0.1 exactly
    [row] = result["rows"]
    assert (row["p_value"], row["min_p_value"], row["underpowered"]) == (0.1, 0.1, False)
    assert row["verdict"] == "no significant change" and row["notes"] == ["-21.9%, not significant (p=0.1 >= alpha 0.1)"]
    assert warned == []


def test_no_valid_windows_on_one_side_compares_memory_only():
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, window_seconds=[], mem_gib=20.0))
    [row] = result["rows"]
    assert row["ratio"] is None and row["current"]["windows"] == 0 and row["baseline"]["windows"] == 9
    assert row["throughput_verdict"] == "no significant change" and row["verdict"] == "more memory"
    assert row["notes"] == ["no valid window times on one side: throughput not compared",
                            "peak device memory +100.0%, beyond the 5% threshold"]


@pytest.mark.parametrize("mem,verdict,memory_verdict,note", [
    (12.5, "no significant change", None, None),  # exactly +25%: not beyond
    (15.0, "more memory", "more memory", "peak device memory +50.0%, beyond the 25% threshold"),
    (7.5, "no significant change", None, None),  # exactly -25%
    (5.0, "less memory", "less memory", None),
])
def test_device_memory_verdicts_beyond_the_threshold_only(mem, verdict, memory_verdict, note):
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, mem_gib=mem), threshold=0.25)
    [row] = result["rows"]
    assert (row["memory_kind"], row["memory_ratio"]) == ("device", mem / 10.0)
    assert (row["verdict"], row["memory_verdict"]) == (verdict, memory_verdict)
    assert row["notes"][1:] == ([note] if note else []) and row["regression"] is (verdict == "more memory")


def test_host_memory_is_reported_or_gated_and_missing_memory_is_not_compared():
    cpu = dict(device_type="cpu")
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=3.0, **cpu), threshold=0.25)
    [row] = result["rows"]
    assert (row["memory_kind"], row["memory_ratio"], row["memory_verdict"]) == ("host RSS", 1.5, None)
    assert row["notes"][1:] == ["host RSS +50.0% (not gated; --gate-host-memory gates it)"]
    assert row["verdict"] == "no significant change" and result["gate_host_memory"] is False
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=2.5, **cpu), threshold=0.25)
    assert result["rows"][0]["notes"][1:] == []  # exactly +25%: nothing to say
    result, _ = judge(gate_records(2560.0, **cpu), gate_records(2560.0, host_rss_gib=3.0, **cpu), threshold=0.25,
                      gate_host_memory=True)
    [row] = result["rows"]
    assert row["verdict"] == "more memory" and row["notes"][1:] == ["peak host RSS +50.0%, beyond the 25% threshold"]
    # device memory on one side only (a record without its memory): the host RSS is what both sides have
    result, _ = judge(gate_records(2560.0, memory=[]), gate_records(2560.0, host_rss_gib=3.0), threshold=0.25)
    assert (result["rows"][0]["memory_kind"], result["rows"][0]["memory_ratio"]) == ("host RSS", 1.5)
    result, _ = judge(gate_records(2560.0, host_peak_rss_bytes=[], **cpu),
                      gate_records(2560.0, host_peak_rss_bytes=[None], **cpu))
    assert (result["rows"][0]["memory_kind"], result["rows"][0]["memory_ratio"]) == (None, None)


def test_one_sided_rows_say_why_and_keep_every_field():
    ok = gate_records(2560.0)
    new = gate_records(2560.0, world_size=4)
    missing = gate_records(2560.0, world_size=8)
    crashed = gate_records(2560.0, world_size=16)
    gone = [record([], world_size=4, status="failed", reason="first"),
            record([], world_size=4, status="skipped", reason="second")]
    result, _ = judge((ok + missing + crashed, gone[:1]),
                      (ok + new, [record([], world_size=8, status="skipped"),
                                  record([], world_size=16, status="failed")]))
    rows = {r["key"]["world_size"]: r for r in result["rows"]}
    assert [r["key"]["world_size"] for r in result["rows"]] == [2, 4, 8, 16]
    assert rows[4]["status"] == "new" and rows[4]["notes"] == ["baseline run failed: first"]
    assert rows[4]["current"]["runs"] == 3 and rows[4]["baseline"] is None
    assert rows[8]["status"] == "missing" and rows[8]["notes"] == ["current run skipped: no reason recorded"]
    assert rows[8]["baseline"]["runs"] == 3 and rows[8]["current"] is None
    assert rows[16]["status"] == "failed" and rows[16]["notes"] == ["current run failed: no reason recorded"]
    assert rows[16]["baseline"]["runs"] == 3 and rows[16]["regression"] is True
    assert set(rows[4]) == set(rows[8]) == set(rows[16]) == set(rows[2])  # every row has every field, as JSON
    assert rows[4]["min_p_value"] is None and rows[8]["throughput_verdict"] is None and rows[16]["memory_kind"] is None
    assert rows[4]["memory_ratio"] is None and rows[8]["memory_verdict"] is None
    assert rows[2]["key"]["hardware"] and rows[2]["key"]["device_type"] == "cuda"
    assert rows[2]["current"]["run_ids"] == [r["run_id"] for r in ok]
    assert result["new"] == [rows[4]["config"]] and result["missing"] == [rows[8]["config"]]
    assert result["regressions"] == [rows[16]["config"]] and result["regressed"] is True
    result, _ = judge((ok, [record([], world_size=4, status="failed", reason="first"),
                            record([], world_size=4, status="failed", reason="last")]), new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["baseline run failed: last"]]
    result, _ = judge((ok, [record([], world_size=4, status="failed")]), ok + new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["baseline run failed: no reason recorded"]]
    result, _ = judge(ok + missing, ok)
    assert [r["notes"] for r in result["rows"] if r["status"] == "missing"] == [["no ok run in current"]]
    result, _ = judge(ok, ok + new)
    assert [r["notes"] for r in result["rows"] if r["status"] == "new"] == [["not in the baseline"]]


def test_one_window_is_a_valid_side_and_zero_device_memory_is_not_compared():
    result, _ = judge(gate_records(2560.0, k=1, window_seconds=[0.5], mem_gib=0.0), gate_records(2560.0))
    [row] = result["rows"]
    assert row["ratio"] == 1.0 and row["baseline"]["windows"] == 1 and row["underpowered"] is True
    assert (row["memory_ratio"], row["memory_kind"]) == (None, None)


def test_diverged_replicas_say_so():
    result, _ = judge(gate_records(2560.0), gate_records(2560.0, replicas_consistent=False))
    [row] = result["rows"]
    assert row["verdict"] == "replicas differ" and row["regression"] is True
    assert row["notes"][-1] == "ranks ended with different parameters (replicas_consistent: false)"


def test_disturbed_runs_make_the_speed_verdict_inconclusive_and_say_where_to_rerun():
    def disturbed(reasons, **over):
        recs = gate_records(2560.0, **over)
        recs[0].update(disturbed=True, disturbed_reasons=reasons)
        return recs

    result, warned = judge(gate_records(2560.0), disturbed(["cpu", "gpu", "clocks"]))
    [row] = result["rows"]
    assert row["inconclusive"] is True and row["verdict"] == "inconclusive" and row["regression"] is False
    assert row["notes"][-1] == ("inconclusive: 1 current run(s) disturbed (cpu; gpu); on these runs the verdict would "
                                "be 'no significant change'; run the gate again on a quiet machine")
    assert [w.split(":")[0] for w in row["warnings"]] == ["⚠ current ddp x2 fp32"]
    assert result["inconclusive"] == [row["config"]] and result["warnings"] == row["warnings"]
    assert warned == ["1 configuration(s) compared on disturbed runs: their throughput was NOT judged "
                      "(inconclusive); run the gate again on a quiet machine"]
    result, _ = judge(disturbed([]), disturbed(["cpu"]) + disturbed(["gpu"]))
    [row] = result["rows"]
    assert row["notes"][-1] == ("inconclusive: 1 baseline, 2 current run(s) disturbed (cpu; gpu); on these runs the "
                                "verdict would be 'no significant change'; re-record the baseline on a quiet machine")
    assert [w.split(":")[0] for w in row["warnings"]] == ["⚠ baseline ddp x2 fp32", "⚠ current ddp x2 fp32"]
    result, _ = judge(disturbed([]), gate_records(2560.0))
    assert "disturbed (no reason recorded);" in result["rows"][0]["notes"][-1]


def test_a_failed_repeat_beside_a_slower_verdict_keeps_both():
    result, _ = judge(gate_records(2560.0), (gate_records(1280.0), [record([], status="failed")]))
    [row] = result["rows"]
    assert row["verdict"] == "slower, failed" and row["notes"][-1] == "1 of 4 current runs failed: no reason recorded"


def test_rows_sort_numbers_as_numbers_and_none_as_text():
    result, _ = judge(gate_records(2560.0, cudnn_benchmark=None) + gate_records(2560.0),
                      gate_records(2560.0) + gate_records(2560.0, cudnn_benchmark=None))
    assert [r["key"]["cudnn_benchmark"] for r in result["rows"]] == [True, None]  # None is not compared with True
    result, _ = judge(gate_records(2560.0, world_size=16) + gate_records(2560.0),
                      gate_records(2560.0) + gate_records(2560.0, world_size=16))
    assert [r["key"]["world_size"] for r in result["rows"]] == [2, 16]


def test_different_hardware_is_refused_by_default_and_matched_without_it_when_allowed():
    from bench.core.errors import UsageError

    cpu, gpu = gate_records(2560.0, device_type="cpu", cudnn_benchmark=True), gate_records(2560.0)
    with pytest.raises(UsageError, match="refusing to compare across hardware"):
        compare.compare(side(gpu), side(cpu), 0.05, 0.01)
    result, warned = judge(gpu, cpu, allow_different_hardware=True)
    [row] = result["rows"]
    assert row["status"] == "compared" and result["allow_different_hardware"] is True
    assert row["key"]["device_type"] == "cpu" and "hardware" in row["key"]  # the row still names its hardware
    assert warned and warned[0].startswith("comparing different hardware")


def test_peak_memory_of_a_record():
    """The largest over the run's devices (ranks for host RSS), skipping what was not measured."""
    mem = [{"peak_reserved_bytes": 5}, {"peak_reserved_bytes": None}, {"peak_reserved_bytes": 7}, {}]
    assert compare.peak_device_memory({"memory": mem}) == 7.0 and type(compare.peak_device_memory({"memory": mem})) is float
    for rec in ({"memory": []}, {"memory": None}, {}, {"memory": [{"peak_reserved_bytes": None}]}):
        assert compare.peak_device_memory(rec) is None, rec
    assert compare.peak_host_rss({"host_peak_rss_bytes": [3, None, 9]}) == 9.0
    for rec in ({"host_peak_rss_bytes": []}, {"host_peak_rss_bytes": None}, {}, {"host_peak_rss_bytes": [None]}):
        assert compare.peak_host_rss(rec) is None, rec
    assert compare._median([3.0, None, 1.0, 2.0]) == 2.0 and compare._median([None]) is None


def test_threshold_and_alpha_ranges():
    from bench.core.errors import UsageError

    assert compare._fraction("0", "threshold", low_inclusive=True) == 0.0
    assert compare._fraction("0.5", "alpha", low_inclusive=False) == 0.5
    for text, name, low, message in [
            ("1", "threshold", True, "--threshold '1': expected a number with 0 <= threshold < 1 (0.05 = 5%)"),
            ("x", "threshold", True, "--threshold 'x': expected a number with 0 <= threshold < 1 (0.05 = 5%)"),
            ("0", "alpha", False, "--alpha '0': expected a number with 0 < alpha < 1 (e.g. 0.01)"),
            ("1", "alpha", False, "--alpha '1': expected a number with 0 < alpha < 1 (e.g. 0.01)")]:
        with pytest.raises(UsageError) as e:
            compare._fraction(text, name, low_inclusive=low)
        assert str(e.value) == message


def test_cmd_compare_exit_codes_paths_and_the_out_file(tmp_path, capsys):
    import argparse

    from bench.core import results
    from bench.core.errors import UsageError

    def write(directory, recs):
        for r in recs:
            results.save(r, directory)
        return str(directory)

    base = write(tmp_path / "base", gate_records(2560.0))
    slower = write(tmp_path / "slow", gate_records(1280.0))

    def cmd(cur, out=None, threshold="0", fmt="json"):
        args = argparse.Namespace(baseline=base, current=cur, threshold=threshold, alpha="0.01", test="welch",
                                  format=fmt, out=out, allow_different_hardware=False, gate_host_memory=False)
        code = compare.cmd_compare(args)
        return code, capsys.readouterr().out

    code, out = cmd(base, out=str(tmp_path / "new" / "deeper" / "gate.json"))
    data = json.loads(out)
    assert code == 0 and (data["baseline_path"], data["current_path"]) == (base, base) and data["threshold"] == 0.0
    assert (tmp_path / "new" / "deeper" / "gate.json").read_text() == out
    code, out = cmd(slower, out=str(tmp_path / "new" / "gate.md"), fmt="md")  # into a folder that exists
    assert code == 1 and (tmp_path / "new" / "gate.md").read_text() == out
    assert f"## Regression gate: {slower} vs {base}" in out
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError) as e:
        cmd(base, out=str(tmp_path / "file" / "gate.md"))
    assert str(e.value) == f"cannot write --out {str(tmp_path / 'file' / 'gate.md')!r}: File exists"

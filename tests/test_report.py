"""The comparison report on hand-built records: exact table values, baselines, sections, plots, bad files."""
import argparse
import itertools
import json
import subprocess
import sys

import pandas as pd
import pytest

from bench.commands import report
from bench.core import results
from tests.conftest import REPO, bench

GiB = 2 ** 30
H100 = "NVIDIA H100 80GB HBM3"
KINDS = ("throughput", "efficiency", "memory", "step-time")
HVD = {"version": "0.28.1", "controllers": "gloo, mpi", "tensor_ops": "nccl, gloo"}
_ids = itertools.count()


def make(backend, n, thr=None, status="ok", device="cuda", precision="fp32", reserved=None, reason=None,
         note=None, options=None, windows=3, model="resnet50", env=None, stamp="20260101T000000Z", cudnn=True,
         **extra):
    """A record whose every window runs at exactly ``thr`` global img/s (so the median is ``thr``)."""
    cfg = dict(backend=backend, launcher="torchrun", world_size=n, device_type=device, model=model, image_size=224,
               precision=precision, batch_size=64, warmup=5, steps=10, windows=windows, note=note,
               options=options or {}, cudnn_benchmark=cudnn if device == "cuda" else None)
    env = {"torch": "2.5.1+cu124", "torchvision": "0.20.1", "cuda": "12.4", "nccl": "2.21.5", "cudnn": 90100,
           "driver": "550.54.15", "gpu_count": 4, "gpu_names": [H100] * 4, "cpu_count": 32, "cpu_model": "EPYC",
           "hostname": "node1", "python": "3.11.7", "git_commit": "abc123", "horovod": None, "topology": None,
           "started_at": "2026-01-01T00:00:00+00:00", **(env or {})}
    if device == "cpu":
        env.update(cuda_available=False, gpu_count=0, gpu_names=[], driver=None, cpu_count=2, cpu_model="Xeon")
    rec = results.skeleton(cfg, f"{stamp}-{backend}-w{n}-{next(_ids):06d}", env)
    rec.update(status=status, reason=reason, host_peak_rss_bytes=[GiB] * n if device == "cpu" else [])
    if status == "ok":
        secs = rec["global_batch"] * rec["steps_per_window"] / thr
        rec.update(window_seconds=[secs] * windows, throughput=thr, throughput_ci95=[thr, thr],
                   per_device_throughput=thr / n, replicas_consistent=True)
        if device == "cuda":
            reserved = reserved or [10 * GiB] * n
            rec["memory"] = [{"rank": 0 if backend == "dp" else i, "device_index": i, "device_name": H100,
                              "peak_allocated_bytes": int(b * 0.8), "peak_reserved_bytes": int(b),
                              "nvml_used_bytes": int(b) + GiB, "warmup_peak_reserved_bytes": int(b) + 2 * GiB}
                             for i, b in enumerate(reserved)]
    rec.update(extra)
    return rec


def write(tmp_path, *recs):
    raw = tmp_path / "raw"
    for rec in recs:
        results.save(rec, raw)
    return raw


def run_report(raw, out, capsys=None):
    """In-process (fast); one test below goes through the real CLI."""
    code = report.cmd_report(argparse.Namespace(results=str(raw), out=str(out)))
    return code, (capsys.readouterr() if capsys else None)


def summary(out) -> pd.DataFrame:
    return pd.read_csv(out / "summary.csv")


def row(df, backend, n, **match):
    sel = df[(df.backend == backend) & (df.world_size == n)]
    for k, v in match.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def assert_plots(out, count=1):
    for kind in KINDS:
        pngs = sorted((out / "plots").glob(f"*-{kind}.png"))
        assert len(pngs) == count, (kind, pngs)
        for png in pngs:
            data = png.read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
            svg = png.with_suffix(".svg")
            assert svg.stat().st_size > 5_000 and b"<svg" in svg.read_bytes()[:500]


FULL_SWEEP = [("single", 1, 100.0), ("dp", 1, 95.0), ("dp", 2, 150.0), ("dp", 4, 240.0),
              ("ddp", 1, 98.0), ("ddp", 2, 180.0), ("ddp", 4, 360.0)]


@pytest.mark.slow
def test_full_sweep_through_the_cli(tmp_path):
    recs = [make(b, n, t) for b, n, t in FULL_SWEEP]
    recs[3] = make("dp", 4, 240.0, reserved=[20 * GiB, 12 * GiB, 12 * GiB, 12 * GiB])  # DataParallel's GPU 0
    recs += [make("ddp_amp_syncbn", 1, 200.0, precision="fp16"), make("ddp_amp_syncbn", 2, 390.0, precision="fp16"),
             make("horovod", 2, 170.0, options={"compression": "fp16"}, env={"horovod": HVD})]
    raw, out = write(tmp_path, *recs), tmp_path / "rep"
    proc = bench("report", "--results", raw, "--out", out, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert str((out / "REPORT.md").resolve()) in proc.stdout
    assert ("| **ddp** ★ | 4 | fp32 | 1 (3) | 360.0 img/s | 360.0 – 360.0 img/s (within-run only) |  | 90.0 img/s |"
            in proc.stdout)

    df = summary(out)
    assert len(df) == 10
    # thr(b, N) / (N x thr(single, 1)), exactly from the inputs
    for b, n, eff in [("single", 1, 100.0), ("ddp", 2, 90.0), ("ddp", 4, 90.0), ("dp", 2, 75.0), ("dp", 4, 60.0)]:
        assert row(df, b, n).eff_vs_single_pct == pytest.approx(eff, abs=1e-3)
    assert row(df, "dp", 4).eff_vs_own_ws1_pct == pytest.approx(100 * 240 / (4 * 95), abs=1e-3)
    assert row(df, "ddp", 2).eff_vs_own_ws1_pct == pytest.approx(100 * 180 / (2 * 98), abs=1e-3)
    # fp16 AMP has no fp16 single baseline: empty, not 0 and not 100 %; its own world-size-1 run is there
    assert pd.isna(row(df, "ddp_amp_syncbn", 2).eff_vs_single_pct)
    assert row(df, "ddp_amp_syncbn", 2).eff_vs_own_ws1_pct == pytest.approx(97.5, abs=1e-3)
    assert row(df, "dp", 4).per_device_img_s == pytest.approx(60.0, abs=1e-3)
    # best per world size and precision: fp16 AMP is never ranked against fp32
    assert set(df[df.best_at_world_size].apply(lambda r: (r.backend, r.world_size), axis=1)) == {
        ("single", 1), ("ddp_amp_syncbn", 1), ("ddp", 2), ("ddp_amp_syncbn", 2), ("ddp", 4)}

    md = (out / "REPORT.md").read_text()
    assert f"4 × {H100}" in md and "driver 550.54.15" in md and "NCCL 2.21.5" in md and "CUDA 12.4" in md
    assert "CPU figures" not in md
    assert "**Horovod build:** 0.28.1 (controllers: gloo, mpi; tensor_ops: nccl, gloo)" in md
    assert "| horovod (compression=fp16) | 2 | fp32 | 170.0 img/s | 85.0 % |  |" in md  # options not matched
    assert "| **ddp_amp_syncbn** ★ | 2 | fp16 | 1 (3) | 390.0 img/s |" in md
    assert "| ddp | 4 | fp32 | 360.0 img/s | 90.0 % | 91.8 % |" in md
    assert "| dp | 4 | fp32 | 240.0 img/s | 60.0 % | 63.2 % |" in md
    assert "| ddp_amp_syncbn | 2 | fp16 | 390.0 img/s |  | 97.5 % |" in md
    # memory: DataParallel's GPU-0 excess is visible (reserved 20 vs 12 GiB, allocated 16 vs 9.6: imbalance 20/14 on
    # each; NVML's whole-GPU figure a GiB more each: 21/14), per GPU allocated / reserved / NVML used side by side
    dp4 = next(line for line in md.splitlines() if line.startswith("| dp | 4 | 2026"))
    assert "0: 16.00 / 20.00 / 21.00 · 1: 9.60 / 12.00 / 13.00 · 2: 9.60 / 12.00 / 13.00 · 3: 9.60 / 12.00 / 13.00 GiB" in dp4
    assert "| 1.43 × | 1.43 × | 1.40 × | +6.40 GiB |" in dp4
    assert dp4.endswith("| 22.00 GiB |")  # the warm-up peak, in its own column, never the timed one
    assert row(df, "dp", 4).memory_imbalance == pytest.approx(20 / 14, abs=1e-3)
    assert "### Skipped and failed runs\n\nNone." in md
    assert_plots(out)


def test_missing_baseline_leaves_the_cell_empty_and_runs_are_the_unit(tmp_path, capsys):
    # no single@1; ddp@1 ran twice (3 windows at 100 and 3 at 120 img/s): the median of run medians is 110
    raw = write(tmp_path, make("ddp", 1, 100.0), make("ddp", 1, 120.0), make("ddp", 2, 165.0))
    code, _ = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    df = summary(tmp_path / "rep")
    assert df.eff_vs_single_pct.isna().all()
    ddp1 = row(df, "ddp", 1)
    assert (ddp1.runs_ok, ddp1.global_img_s) == (2, pytest.approx(110.0))
    # the interval spans the runs (a window-level interval of 6 identical-per-run windows would not)
    assert (ddp1.ci95_low_img_s, ddp1.ci95_high_img_s) == (pytest.approx(100.0), pytest.approx(120.0))
    assert ddp1.interval == "across runs" and ddp1.cv_runs_pct == pytest.approx(100 * 14.142 / 110, abs=0.01)
    assert row(df, "ddp", 2).eff_vs_own_ws1_pct == pytest.approx(75.0)  # 165 / (2 x 110)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "| 2 (6) | 110.0 img/s | 100.0 – 120.0 img/s | 12.9 % ⚠ |" in md  # above the 5% a GPU run repeats within
    assert "| ddp | 2 | fp32 | 165.0 img/s |  | 75.0 % |" in md
    assert_plots(tmp_path / "rep")


def test_skipped_and_failed_runs_are_listed_with_reasons(tmp_path, capsys):
    # the skipped run is read first (earliest run id), as a skipped dp x2 is in a real CPU sweep
    raw = write(tmp_path, make("horovod", 2, status="skipped", reason="horovod is not installed: run make horovod",
                               stamp="20251231T000000Z"),
                make("single", 1, 100.0), make("dp", 2, 150.0, note="a caveat worth reading"), make("ddp", 2, 180.0),
                make("ddp", 2, status="failed", reason="rank 1 exited with code 1 (NCCL timeout)"))
    code, cap = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    failed = md.split("### Skipped and failed runs")[1]
    assert "| ddp | 2 | resnet50 224px b64 | fp32 | failed | rank 1 exited with code 1 (NCCL timeout) |" in failed
    assert ("| horovod | 2 | resnet50 224px b64 | fp32 | skipped | horovod is not installed: run make horovod |"
            in failed)
    assert "horovod" not in md.split("**1. Throughput**")[1].split("**2.")[0]  # not in the throughput table
    assert "- `dp` ×2: a caveat worth reading" in md
    assert "| **ddp** ★ | 2 | fp32 | 1 (3) | 180.0 img/s |" in md  # a skipped run never takes the star
    df = summary(tmp_path / "rep")
    assert (row(df, "ddp", 2).runs_ok, row(df, "ddp", 2).runs_not_ok) == (1, 1)
    assert row(df, "horovod", 2).status == "skipped" and pd.isna(row(df, "horovod", 2).global_img_s)


def test_mixed_devices_get_separate_sections(tmp_path, capsys):
    raw = write(tmp_path, make("single", 1, 1000.0), make("ddp", 2, 1800.0),
                make("ddp", 1, 40.0, device="cpu"), make("ddp", 2, 60.0, device="cpu"))
    code, cap = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    gpu, cpu = md.split(f"## {H100} (cuda)")[1].split("## CPU: Xeon (cpu)")
    assert "1,800.0 img/s" in gpu and "60.0 img/s" not in gpu and "CPU figures" not in gpu
    assert "60.0 img/s" in cpu and "1,800.0 img/s" not in cpu and "say nothing about GPU scaling" in cpu
    assert "| ddp | 2 | fp32 | 60.0 img/s |  | 75.0 % |" in cpu  # never the GPU single as a CPU baseline
    assert "host peak RSS" in cpu and "| ddp | 2 | 2026" in cpu and "0: 1.00 · 1: 1.00 GiB" in cpu
    df = summary(tmp_path / "rep")
    assert row(df, "ddp", 2, device_type="cuda").eff_vs_single_pct == pytest.approx(90.0)
    assert pd.isna(row(df, "ddp", 2, device_type="cpu").eff_vs_single_pct)
    assert "CPU figures: nothing about GPU scaling" in cap.out
    assert_plots(tmp_path / "rep", count=2)


def test_cpu_only_records_render_with_the_cpu_caveat(tmp_path, capsys):
    raw = write(tmp_path, *[make(b, n, t, device="cpu") for b, n, t in [("single", 1, 50.0), ("ddp", 2, 80.0)]])
    code, cap = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "CPU, 2 cores" in md and "say nothing about GPU scaling" in md
    assert "| ddp | 2 | fp32 | 80.0 img/s | 80.0 % |" in md
    assert "| **ddp** ★ | 2 |" in cap.out
    assert_plots(tmp_path / "rep")


def test_bad_files_are_skipped_with_one_warning_each(tmp_path, capsys):
    raw = write(tmp_path, make("single", 1, 100.0), make("ddp", 2, 180.0))
    (raw / "half.json").write_text('{"schema": 1, "run_id": "x", "stat')
    (raw / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (raw / "future.json").write_text(json.dumps({**make("ddp", 4, 1.0), "schema": results.SCHEMA + 1}))
    bad = make("ddp", 8, 1.0)
    bad.update(window_seconds=[], throughput=None)
    (raw / "no-windows.json").write_text(json.dumps(bad))
    code, cap = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    warnings = [line for line in cap.err.splitlines() if line]
    assert len(warnings) == 4 and all(w.startswith("warning: skipping") for w in warnings)
    for name in ("half.json", "binary.json", "future.json", "no-windows.json"):
        assert sum(name in w for w in warnings) == 1
    assert row(summary(tmp_path / "rep"), "ddp", 2).eff_vs_single_pct == pytest.approx(90.0)
    assert "## Files not read" in (tmp_path / "rep" / "REPORT.md").read_text()


def test_cudnn_variant_is_labelled_matched_and_explained(tmp_path, capsys):
    raw = write(tmp_path, make("single", 1, 100.0), make("dp", 2, 120.0), make("dp", 2, 150.0, cudnn=False),
                make("dp", 4, 200.0), make("dp", 4, 205.0, cudnn=False), make("dp", 4, 195.0, cudnn=False),
                make("single", 1, 125.0, cudnn=False), make("dp", 1, 110.0), make("dp", 1, 100.0, cudnn=False))
    code, _ = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    df = summary(tmp_path / "rep")
    off, on = row(df, "dp", 2, cudnn_benchmark=False), row(df, "dp", 2, cudnn_benchmark=True)
    # each efficiency divides by baselines of its own cuDNN setting: single@1 and dp@1 with cudnn.benchmark off
    assert off.eff_vs_single_pct == pytest.approx(60.0) and off.eff_vs_own_ws1_pct == pytest.approx(75.0)
    assert on.eff_vs_single_pct == pytest.approx(60.0) and on.eff_vs_own_ws1_pct == pytest.approx(120 / 220 * 100, abs=1e-3)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "| dp (cudnn.benchmark off) | 2 | fp32 | 150.0 img/s | 60.0 % |" in md
    # without a baseline of its setting, the variant has no efficiency (none of the default's, mixing two settings)
    alone = write(tmp_path / "alone", make("single", 1, 100.0), make("dp", 2, 150.0, cudnn=False))
    assert run_report(alone, tmp_path / "rep-alone", capsys)[0] == 0
    eff = row(summary(tmp_path / "rep-alone"), "dp", 2, cudnn_benchmark=False).eff_vs_single_pct
    assert eff != eff  # empty in summary.csv (NaN), not the default's 150.0
    assert ("- `dp` ×2 fp32, cudnn.benchmark on vs off: 120.0 vs 150.0 img/s (on/off = 0.80). cuDNN keeps its "
            "benchmark cache per thread") in md
    assert "Here off is faster: the on figure includes that repeated search" in md
    ws4 = next(line for line in md.splitlines() if line.startswith("- `dp` ×4 fp32, cudnn.benchmark on vs off"))
    assert "200.0 vs 200.0 img/s (on/off = 1.00)" in ws4 and ws4.endswith("no difference is established.")


def test_windows_with_gradscaler_skips_are_flagged(tmp_path, capsys):
    raw = write(tmp_path, make("ddp", 2, 300.0, precision="fp16", skipped_steps=[0, 2, 0]),
                make("ddp", 2, 310.0, precision="fp16", skipped_steps=[0, 0, 0]))
    code, _ = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    flagged = [line for line in md.splitlines() if "GradScaler skipped" in line]
    assert len(flagged) == 1
    assert "GradScaler skipped 2 optimizer step(s) (fp16 overflow) in window(s) 2:" in flagged[0]


def test_missing_or_empty_results_directory(tmp_path, capsys):
    """A missing folder is bad input and an empty one is nothing to report: both exit 2, one line naming --results and
    the folder (issue 47: the empty one exited 1, like a failed run)."""
    code, (_, err) = run_report(tmp_path / "nope", tmp_path / "rep", capsys)
    assert (code, err) == (2, f"bench: error: --results {str(tmp_path / 'nope')!r} does not exist\n")
    (tmp_path / "empty").mkdir()
    code, (_, err) = run_report(tmp_path / "empty", tmp_path / "rep", capsys)
    assert (code, err) == (2, f"bench: error: nothing to report: no readable schema-2 records, to-accuracy records or "
                              f"bench tune summary in {tmp_path / 'empty'}\n")
    assert not (tmp_path / "rep").exists()


def test_importing_the_module_stays_light():
    """cli.py imports bench.commands.report for every command: pandas and matplotlib load only when a report is
    made."""
    code = "import sys, bench.commands.report\nassert not {'pandas', 'matplotlib'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_memory_headroom_and_training_equivalence_sections(tmp_path, capsys):
    raw = write(tmp_path, make("ddp", 2, 180.0, reserved=[10 * GiB] * 2), make("fsdp2", 2, 150.0, reserved=[6 * GiB] * 2))
    (raw / "maxbatch").mkdir()
    probes = [{"batch": b, "result": r} for b, r in ((64, "fits"), (128, "out of memory"), (96, "fits"))]
    (raw / "maxbatch" / "summary-1.json").write_text(json.dumps({
        "schema": 1, "kind": "maxbatch", "created_at": "2026-01-02T00:00:00+00:00", "cap": 4096,
        "memory_limit_gib": None, "rows": [
            {"backend": "ddp", "world_size": 2, "precision": "fp32", "options": {}, "max_batch": 96, "capped": False,
             "error": None, "probes": probes},
            {"backend": "fsdp2", "world_size": 2, "precision": "fp32", "options": {}, "max_batch": 4096,
             "capped": True, "error": None, "probes": probes}]}))
    (raw / "verify").mkdir()
    row = {"backend": "ddp", "world_size": 2, "precision": "fp32", "reference": "single @ batch 128 as 2 micro-batches",
           "max_loss_deviation": 0.0, "param_distance": 0.0, "max_abs_param_diff": 0.0, "rounding_noise": 0.0,
           "eval_samples": 37, "eval_accuracy": 0.0, "verdict": "pass", "why": None, "note": "per replica"}
    (raw / "verify" / "summary-1.json").write_text(json.dumps({
        "schema": 1, "kind": "verify", "created_at": "2026-01-03T00:00:00+00:00", "noise_factor": 10,
        "settings": {"model": "resnet18", "image_size": 32, "batch_size": 4, "steps": 20, "device_type": "cpu"},
        "rows": [row, {**row, "backend": "fsdp2", "verdict": "FAIL", "param_distance": 0.4,
                       "why": "final parameters are 0.4 of the reference's update away from it"}]}))
    code, _ = run_report(raw, tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    head = md.split("## Memory headroom")[1]
    assert "| ddp | 2 | fp32 | 96 | 10.00 GiB reserved at batch 64 | 3 |" in head
    assert "| fsdp2 | 2 | fp32 | >= 4096 (the cap; nothing ran out of memory) | 6.00 GiB reserved at batch 64 | 3 |" in head
    eq = md.split("## Training equivalence (bench verify)")[1]
    assert "**1 FAILED.**" in eq and "| ddp | 2 | fp32 | single @ batch 128 as 2 micro-batches | 0.00e+00 |" in eq
    assert "| FAIL: final parameters are 0.4 of the reference's update away from it |" in eq


def test_runs_over_several_nodes_split_intra_and_inter_node_efficiency(tmp_path):
    """ddp at 8 = 2 nodes x 4: intra-node efficiency is ddp@4 on one node vs ddp@1, inter-node is thr(2x4) against
    2 x thr(ddp@4 on one node)."""
    def two_nodes(rec):
        rec.update(nnodes=2, nproc_per_node=4)
        return rec

    raw = write(tmp_path, make("single", 1, 100.0), make("ddp", 1, 100.0), make("ddp", 4, 360.0),
                make("ddp", 8, 720.0), two_nodes(make("ddp", 8, 576.0)))
    code, _ = run_report(raw, tmp_path / "rep")
    assert code == 0
    rows = pd.read_csv(tmp_path / "rep" / "summary.csv")
    multi = rows[(rows.backend == "ddp") & (rows.nnodes == 2)].iloc[0]
    assert (multi.world_size, multi.eff_vs_single_pct) == (8, 72.0)
    assert (multi.intra_node_eff_pct, multi.inter_node_eff_pct) == (90.0, 80.0)
    one = rows[(rows.backend == "ddp") & (rows.world_size == 8) & (rows.nnodes == 1)].iloc[0]
    assert one.eff_vs_single_pct == 90.0 and pd.isna(one.inter_node_eff_pct)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "| ddp (2 nodes × 4) | 8 | fp32 | 576.0 img/s | 72.0 % | 72.0 % | 90.0 % | 80.0 % |" in md


def test_report_shows_the_settings_table_in_markdown_and_html(tmp_path, capsys):
    infos = {
        "ddp": {"grad_reduce_dtype": "float32", "bucket_cap_mb": 25.0, "compile": None},
        "ds_zero2": {"grad_reduce_dtype": "float32", "overlap_comm": True, "bucket_elements": 25 * 2 ** 20 // 4,
                     "grad_norm": "skipped", "throughput_timer": "off"},
        "ddp_zero": {"grad_reduce_dtype": "float32", "bucket_cap_mb": 25.0, "parameters_as_bucket_view": True},
        "fsdp2": {"grad_reduce_dtype": "float32", "norm_fp32_via": "fully_shard per block's BatchNorms",
                  "compile": "per block", "fsdp_groups": 18, "reshard_after_forward": "blocks but the last",
                  "mixed_precision": "MixedPrecisionPolicy (half parameters, fp32 gradient reduction)",
                  "optimizer_impl": "foreach"},
    }
    autocast = {"norm": "float32", "residual": "float32", "matmul": "bfloat16"}  # bench/rank/numerics.py's reading
    half = {"norm": "bfloat16", "residual": "bfloat16", "matmul": "bfloat16"}
    recs = [make(name, 2, 100.0, precision="bf16", backend_info=info,
                 numerics=half if name in ("fsdp2", "ds_zero2") else autocast) for name, info in infos.items()]
    recs.append(make("ddp", 2, 120.0, precision="bf16", options={"ddp_comm_hook": "fp16"},
                     backend_info={"grad_reduce_dtype": "float16", "bucket_cap_mb": 25.0}))
    code, _ = run_report(write(tmp_path, *recs), tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    table = md.split("## Backend settings\n", 1)[1].split("\n\n")[1].splitlines()
    assert table[0] == ("| backend | precision | grad reduce dtype | overlap comm | bucket | grad norm | throughput timer "
                        "| params as bucket view | norms fp32 via | compile | FSDP2 groups, reshard | norms, residual in "
                        "| mixed precision | optimizer |")
    assert table[2:] == [
        "| ddp (ddp_comm_hook=fp16) | bf16 | float16 | — | 25 MiB | — | — | — | — | — | — | — | — | — |",
        "| ddp | bf16 | float32 | — | 25 MiB | — | — | — | — | — | — | norm fp32, residual fp32 | — | — |",
        "| ddp_zero | bf16 | float32 | — | 25 MiB | — | — | on | — | — | — | norm fp32, residual fp32 | — | — |",
        "| ds_zero2 | bf16 | float32 | on | 25 MiB | skipped | off | — | — | — | — | norm bf16, residual bf16 | — | — |",
        "| fsdp2 | bf16 | float32 | — | — | — | — | — | fully_shard per block's BatchNorms | per block | 18, blocks but "
        "the last | norm bf16, residual bf16 | MixedPrecisionPolicy (half parameters, fp32 gradient reduction) | foreach |"]
    html = (tmp_path / "rep" / "REPORT.html").read_text()
    assert '<section id="s-backend-settings">' in html
    assert "<td>fully_shard per block's BatchNorms</td>" in html and "<th>params as bucket view</th>" in html


# --- the verdict -------------------------------------------------------------------------------------------------

def runs(backend, n, *thrs, **kw):
    """One record per run, each at its own throughput: the run-to-run spread gives a real interval."""
    return [make(backend, n, t, **kw) for t in thrs]


def verdict_of(tmp_path, capsys, *recs, world_size):
    code, cap = run_report(write(tmp_path, *recs), tmp_path / "rep", capsys)
    assert code == 0, cap.err
    from bench.report import verdict
    from bench.report.summary import summarise, usable_records

    vs = verdict.verdicts(summarise(usable_records(tmp_path / "raw", print)).to_dict("records"))
    return next(v for v in vs if f", {world_size} GPU" in v["title"]), cap.out


def test_verdict_names_a_clear_winner_and_costs_dataparallel_s_gpu0(tmp_path, capsys):
    dp_mem = [20 * GiB, 12 * GiB, 12 * GiB, 12 * GiB]
    v, out = verdict_of(tmp_path, capsys, *runs("single", 1, 98.0, 100.0, 102.0),
                        *runs("ddp", 4, 355.0, 360.0, 365.0), *runs("dp", 4, 235.0, 240.0, 245.0, reserved=dp_mem),
                        world_size=4)
    assert v["established"] and v["best"] == "ddp"
    assert v["headline"] == "Use ddp: faster than every alternative beyond the 95% intervals."
    assert v["evidence"][0].startswith("ddp: 360.0 img/s (95% interval 355.0–365.0, 3 runs), 90% scaling efficiency "
                                       "vs single@1, 10.00 GiB peak reserved per GPU (largest)")
    assert v["evidence"][0].endswith("ImageNet-1k epoch ≈ 59 min 19 s")  # 1,281,167 / 360 s
    [dp] = v["alternatives"]
    # 1 - 240/360 = 33%; the interval of the difference from both intervals: 1 - 245/355 .. 1 - 235/365
    assert dp == ("dp: 33% slower (CI 31–36%), GPU 0 holds 1.7× the peak allocated memory of the others, 2.00× the peak memory per "
                  "GPU (20.00 vs 10.00 GiB)")
    # the console ends with the verdict's first screen, after the path of REPORT.html: the winner, by how much, how sure
    assert out.index("REPORT.html") < out.index("== Verdict") < out.index("Use ddp")
    assert out.rstrip().endswith("4 GPUs: Use ddp (360.0 img/s), 33% ahead of dp (95% CI 31–36%, 3 runs each).")
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert md.index("## Verdict") < md.index(f"## {H100}")
    assert "| ImageNet-1k epoch |" in md and "| 59 min 19 s |" in md


def test_verdict_names_no_winner_when_the_intervals_overlap(tmp_path, capsys):
    v, out = verdict_of(tmp_path, capsys, *runs("single", 1, 100.0, 100.0), *runs("ddp", 2, 180.0, 190.0, 200.0),
                        *runs("horovod", 2, 185.0, 195.0, 205.0, env={"horovod": HVD}), world_size=2)
    assert not v["established"]
    assert v["headline"].startswith("No winner established: the 95% intervals of horovod, ddp overlap, so their "
                                    "difference is not established")
    assert [e.split(":")[0] for e in v["evidence"]] == ["horovod", "ddp"]
    assert v["alternatives"] == ["ddp: 3% slower by the medians, within noise (the 95% intervals overlap: the "
                                 "difference is not established)"]
    assert "Use " not in out.split("== Verdict")[1]


def test_verdict_with_one_run_each_names_no_winner(tmp_path, capsys):
    # intervals that do not overlap, but each from the windows of one run: the run-to-run spread is unknown
    v, out = verdict_of(tmp_path, capsys, make("ddp", 2, 180.0), make("dp", 2, 150.0), world_size=2)
    assert not v["established"] and v["best"] == "ddp" and "within-run only" in v["evidence"][0]
    assert v["headline"] == ("Fastest here: ddp, but no winner established: with one run per configuration the 95% "
                             "intervals are within-run only and miss the run-to-run spread (repeat with "
                             "`bench run --repeat 3`).")
    assert v["alternatives"] == ["dp: 17% slower (CI 17–17%, within-run only)"]
    assert "--repeat 3" in v["caveat"] and "Use " not in out.split("== Verdict")[1]
    assert out.rstrip().endswith("2 GPUs: No winner: one run each, whose within-run interval misses the run-to-run "
                                 "spread (`--repeat 3`); fastest ddp (180.0 img/s), 17% ahead of dp (95% CI 17–17%, within-run "
                                 "only).")


def test_a_cpu_verdict_says_it_is_no_guide_to_gpus(tmp_path, capsys):
    code, cap = run_report(write(tmp_path, *runs("ddp", 2, 80.0, 82.0, 84.0, device="cpu"),
                                 *runs("ddp_spawn", 2, 60.0, 61.0, 62.0, device="cpu")), tmp_path / "rep", capsys)
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    verdict = md.split("## Verdict in detail")[1].split("\n## ")[0]
    assert "**Use ddp: faster than every alternative beyond the 95% intervals.**" in verdict
    assert ("> CPU worker processes over gloo: this says which backend is fastest on this CPU, nothing about which "
            "to use on GPUs.") in verdict


def test_records_from_two_torch_versions_are_flagged(tmp_path, capsys):
    one = write(tmp_path / "one", make("single", 1, 100.0), make("ddp", 2, 180.0))
    run_report(one, tmp_path / "rep1", capsys)
    assert "torch versions" not in (tmp_path / "rep1" / "REPORT.md").read_text()
    two = write(tmp_path / "two", make("single", 1, 100.0), make("ddp", 2, 180.0, env={"torch": "2.15.0+cu132"}))
    run_report(two, tmp_path / "rep2", capsys)
    assert ("- **Warning: 2 torch versions** (2.15.0+cu132, 2.5.1+cu124) produced these records: a difference "
            "between rows may come from torch, not the backend.") in (tmp_path / "rep2" / "REPORT.md").read_text()


def test_a_winner_needs_a_lead_of_five_percent_and_more_than_the_baseline_s_drift(tmp_path, capsys):
    """Intervals apart are not enough: a 3% lead is not named (the regression gate's 5% threshold, pyperf's rule), nor
    a 10% lead where single@1's own repetitions moved 20% over the sweep (the drift of clocks, heat, neighbours)."""
    calm = [*runs("single", 1, 99.0, 100.0, 101.0), *runs("ddp", 4, 359.0, 360.0, 361.0),
            *runs("fsdp2", 4, 347.0, 348.0, 349.0)]
    v, _ = verdict_of(tmp_path / "small", capsys, *calm, world_size=4)
    assert not v["established"] and v["short"].startswith("No winner: ddp leads by 3.3%, under the 5% a winner needs;")
    drifting = [*runs("single", 1, 90.0, 100.0, 110.0), *runs("ddp", 4, 359.0, 360.0, 361.0),
                *runs("fsdp2", 4, 323.0, 324.0, 325.0)]
    v, _ = verdict_of(tmp_path / "drift", capsys, *drifting, world_size=4)
    assert not v["established"] and v["short"].startswith(
        "No winner: single@1 drifted 20.0% over its repetitions, more than the 10.0% lead;")
    assert v["drift"] == "single@1's repetitions drifted 20.0% (slowest run to fastest, of their median)"
    v, _ = verdict_of(tmp_path / "clear", capsys, *calm[:3], *drifting[3:], world_size=4)
    assert v["established"] and v["short"].startswith("Use ddp (360.0 img/s), 10% ahead of fsdp2")
    # the GPU sweep's ResNet-50 runs channels_last, single@1 included: its drift is the sweep's witness all the same
    # (before: only a single@1 without options was read, so the rule never applied to a channels_last workload)
    nhwc = [make(r["backend"], r["world_size"], r["throughput"], options={"channels_last": True}) for r in drifting]
    v, _ = verdict_of(tmp_path / "nhwc", capsys, *nhwc, world_size=4)
    assert not v["established"] and v["short"].startswith(
        "No winner: single@1 drifted 20.0% over its repetitions, more than the 10.0% lead;")


def test_each_efficiency_divides_by_a_single_at_1_of_its_own_layout(tmp_path):
    """The GPU sweep runs ResNet-50 channels_last, and dp NCHW beside it (it cannot honour the layout): dp's efficiency
    divides by the NCHW single@1 the planner adds (tests/test_default_sweep.py), ddp's by the channels_last one, and
    with no single@1 of dp's layout dp has none. Before, dp@4 divided by the channels_last single@1: 240 / (4 x 120)."""
    from bench.report.summary import summarise, usable_records

    cl = {"channels_last": True}
    both = [*runs("single", 1, 120.0, options=cl), *runs("single", 1, 100.0), *runs("ddp", 4, 432.0, options=cl),
            *runs("dp", 4, 240.0), *runs("ddp", 4, 450.0, options={**cl, "ddp_bucket_mb": 5.0})]
    rows = summarise(usable_records(write(tmp_path / "both", *both), print)).to_dict("records")
    eff = {(r["backend"], r["options"]): r["eff_vs_single_pct"] for r in rows if r["world_size"] == 4}
    assert eff == {("ddp", '{"channels_last": true}'): pytest.approx(90.0), ("dp", "{}"): pytest.approx(60.0),
                   ("ddp", '{"channels_last": true, "ddp_bucket_mb": 5.0}'): pytest.approx(93.75)}
    rows = summarise(usable_records(write(tmp_path / "one", *both[:1], *both[2:]), print)).to_dict("records")
    assert {r["backend"]: r["eff_vs_single_pct"] for r in rows if r["world_size"] == 4 and r["backend"] == "dp"} == {
        "dp": None}

"""The record (bench/rank/record.py and bench/core/results.py): built by rank 0 from what every rank measured (the
slowest rank per window, what adds up summed, what was not measured None, the trace of every rank, MFU and energy),
the replica checksum, and the file it is written to and read from. Built in process from hand-made rank measures;
real records are checked in tests/backends/test_contract.py."""
import hashlib
import json

import numpy as np
import pytest
import torch

from bench.core import results, stats
from bench.rank import record
from tests.fakes import cfg_for

pytestmark = pytest.mark.mutation

H100 = "NVIDIA H100 80GB HBM3"


def rank_measures(rank, **over):
    """What one rank hands rank 0 (bench/rank/train.py ``mine``), for 3 windows."""
    mine = [{
        "rank": 0, "window_seconds": [1.0, 2.0, 4.0], "data_wait_seconds": [0.1, 0.2, 0.3],
        "corrupt_images_skipped": 1, "empty_classes": 2, "loader_info": {"shuffle": "rank 0's"},
        "memory": [{"device_index": 1, "device_name": "an unknown GPU", "peak_reserved_bytes": 300}],
        "param_sha256": "same", "eval": {"eval_samples": 100, "eval_loss": 2.5, "eval_accuracy": 0.25,
                                         "eval_seconds": 2.0},
        "energy_joules": [10.0, 20.0, 30.0], "energy_span_joules": 100.0, "energy_span_seconds": 10.0,
        "energy_reason": "rank 0's", "compute_only_window_seconds": [0.5, 0.7, 0.9], "no_compute_only": None,
        "compute_only_keeps": "a broadcast", "host_peak_rss_bytes": 10, "warmup_host_peak_rss_bytes": 30,
        "skipped_steps": [0, 1, 0], "warmup_skipped_steps": 3, "backend_info": {"who": 0}, "loader_workers": 4,
        "warmup_step_seconds": [5.0, 1.0, 1.0],
    }, {
        "rank": 1, "window_seconds": [1.5, 1.0, 5.0], "data_wait_seconds": [0.2, 0.1, 0.5],
        "corrupt_images_skipped": 2, "empty_classes": 5, "loader_info": {"shuffle": "rank 1's"},
        "memory": [{"device_index": 0, "device_name": H100, "peak_reserved_bytes": 100}],
        "param_sha256": "same", "eval": {"eval_samples": 7, "eval_loss": 9.0, "eval_accuracy": 0.9, "eval_seconds": 4.0},
        "energy_joules": [1.0, 2.0, None], "energy_span_joules": 300.0, "energy_span_seconds": 20.0,
        "energy_reason": "rank 1's", "compute_only_window_seconds": [0.6, 0.4, 1.0], "no_compute_only": "rank 1's",
        "compute_only_keeps": "rank 1's", "host_peak_rss_bytes": 20, "warmup_host_peak_rss_bytes": 40,
        "skipped_steps": [0, 0, 2], "warmup_skipped_steps": 1, "backend_info": {"who": 1}, "loader_workers": 9,
        "warmup_step_seconds": [4.0, 0.5, 1.5],
    }][rank]
    return {**mine, **over}


def build(per_rank, **cfg):
    cfg = cfg_for(world_size=len(per_rank), batch_size=4, **{"precision": "fp16", "flops_per_sample": 1e9, **cfg})
    cfg.steps, cfg.windows = 5, 3
    return record.build_record(cfg, {"run_id": "r1", "env": {"host": "h"}, "threads_per_rank": 3}, per_rank, 1)


def test_the_record_takes_the_slowest_rank_and_sums_what_adds_up():
    from bench.core import mfu

    rec = build([rank_measures(0), rank_measures(1)], options={"compile": True})
    assert rec["status"] == "ok" and rec["run_id"] == "r1" and rec["env"] == {"host": "h"}
    assert rec["window_seconds"] == [1.5, 2.0, 5.0]  # each window: its slowest rank
    throughputs = [40 / 1.5, 40 / 2.0, 40 / 5.0]  # global batch 8 x 5 steps per window
    assert (rec["throughput"], rec["throughput_ci95"]) == stats.median_ci95(throughputs) and rec["throughput"] == 20.0
    assert rec["per_device_throughput"] == 10.0
    assert [m["device_index"] for m in rec["memory"]] == [0, 1] and rec["memory_imbalance"] == 1.5  # 300 / 200
    assert rec["replicas_consistent"] is True
    assert rec["data_wait_seconds"] == [0.2, 0.2, 0.5] and rec["corrupt_images_skipped"] == 3
    assert rec["empty_classes"] == 2 and rec["loader_info"] == {"shuffle": "rank 0's"}
    assert rec["host_peak_rss_bytes"] == [10, 20] and rec["warmup_host_peak_rss_bytes"] == [30, 40]
    assert rec["skipped_steps"] == [0, 1, 2] and rec["warmup_skipped_steps"] == 3 and rec["settle_steps"] == 1
    assert rec["warmup_step_seconds"] == [5.0, 1.0, 1.5]
    assert rec["compile_seconds"] == 3.5  # (5 - 1.5) + nothing for the step faster than the last
    assert rec["backend_info"] == {"who": 0} and rec["loader_workers_per_process"] == 4 and rec["threads_per_rank"] == 3
    assert (rec["eval_samples"], rec["eval_loss"], rec["eval_accuracy"], rec["eval_throughput"]) == (100, 2.5, 0.25, 25.0)
    assert rec["compute_only_window_seconds"] == [0.6, 0.7, 1.0]
    assert rec["compute_only"] == {"measured": True, "reason": None, "keeps": "a broadcast"}
    assert rec["energy_total_joules"] == 400.0 and rec["energy_span_seconds"] == 20.0
    assert rec["energy_reason"] == "rank 0's"
    assert rec["joules_per_image"] == 400.0 / 120 and rec["mean_watts"] == 100 / 10 + 300 / 20
    assert rec["energy_window_diagnostic"] == {"joules": [11.0, 22.0, None],
                                               "median_joules_per_image": float(np.median([11 / 40, 22 / 40])),
                                               "median_mean_watts": float(np.median([11 / 1.5, 22 / 2.0]))}
    peak, source = mfu.peak_tflops(H100, "fp16")  # the first device's model
    assert peak and (rec["peak_tflops_per_device"], rec["peak_tflops_source"]) == (peak, source)
    assert rec["flops_per_sample"] == 1e9 and rec["mfu"] == 1e9 * 20.0 / (peak * 1e12 * 2)
    assert isinstance(rec["finished_at"], str) and rec["finished_at"]


def test_the_record_says_none_where_nothing_was_measured():
    quiet = dict(data_wait_seconds=None, corrupt_images_skipped=None, eval=None, skipped_steps=None,
                 warmup_skipped_steps=None, compute_only_window_seconds=None, no_compute_only="world size 1")
    rec = build([rank_measures(0, energy_span_joules=None, energy_joules=None, memory=[], **quiet)],
                peak_tflops=50.0)
    assert rec["window_seconds"] == [1.0, 2.0, 4.0] and rec["throughput"] == 10.0 == rec["per_device_throughput"]
    assert rec["replicas_consistent"] is None  # one rank: nothing to compare
    assert rec["data_wait_seconds"] is None and rec["corrupt_images_skipped"] is None
    assert rec["skipped_steps"] is None and rec["warmup_skipped_steps"] is None
    assert rec["compile_seconds"] is None and rec["memory_imbalance"] is None
    assert rec["eval_throughput"] is None and rec["eval_samples"] is None
    assert rec["compute_only_window_seconds"] is None
    assert rec["compute_only"] == {"measured": False, "reason": "world size 1", "keeps": None}
    assert (rec["energy_total_joules"], rec["energy_span_seconds"], rec["energy_window_diagnostic"]) == (None, None, None)
    assert (rec["joules_per_image"], rec["mean_watts"]) == (None, None)
    assert (rec["peak_tflops_per_device"], rec["peak_tflops_source"]) == (50.0, "--peak-tflops")
    assert rec["mfu"] == 1e9 * 10.0 / (50.0 * 1e12 * 1)
    assert rec["trace"] is None and rec["profiler_in_windows"] is False


def test_the_record_gathers_every_rank_s_trace_and_a_profiler_seen_in_any_window():
    def traced(rank, size, profiled, exported, forward, step_ms, reason=None, gpu=None, analysed=None, library=None):
        return {"file": None if reason else f"/l/r.rank{rank}.trace.json.gz", "bytes": size, "steps": 2,
                "profiled_seconds": profiled, "export_seconds": exported, "reason": reason, "gpu": gpu,
                "analysis_seconds": analysed,
                "phase_times": {"steps": 2, "step_ms": step_ms, "timeline": {"start_us": rank}, "library_ms": library,
                                "phase_ms": {"forward": forward, "other": [a - b for a, b in zip(step_ms, forward)]}}}

    rec = build([rank_measures(0, trace=traced(0, 10, 1.0, 0.5, [1.0, 3.0], [1.5, 3.5], gpu={"overlap_pct": 50.0},
                                               analysed=0.25, library={"FSDP::pre_forward": [0.5, 1.5]}),
                               profiler_in_windows=False),
                 rank_measures(1, trace=traced(1, 20, 0.5, 0.75, [2.0, 1.0], [2.0, 1.0], reason="over the cap"),
                               profiler_in_windows=True)])
    assert rec["profiler_in_windows"] is True  # one rank is enough
    assert rec["trace"] == {
        "files": ["/l/r.rank0.trace.json.gz", None], "bytes": [10, 20], "profiled_seconds": 1.0,
        "export_seconds": 0.75, "analysis_seconds": 0.25, "gpu": [{"overlap_pct": 50.0}, None],
        "reasons": ["over the cap"], "steps": 2, "step_ms": [[1.5, 3.5], [2.0, 1.0]],
        "phase_ms_per_step": [{"forward": 2.0, "other": 0.5}, {"forward": 1.5, "other": 0.0}],
        "library_ms_per_step": [{"FSDP::pre_forward": 1.0}, {}],
        "slowest_rank_per_step": [1, 0], "timeline": [{"start_us": 0}, {"start_us": 1}]}


def test_the_record_flags_diverged_replicas_and_instant_evaluation():
    two = [rank_measures(0), rank_measures(1, param_sha256="other", warmup_skipped_steps=None)]
    two[0]["eval"]["eval_seconds"] = two[1]["eval"]["eval_seconds"] = 0.0
    two[0]["energy_joules"] = None  # a rank without per-window joules
    rec = build(two)
    assert rec["replicas_consistent"] is False and rec["eval_throughput"] is None and rec["eval_samples"] == 100
    assert rec["warmup_skipped_steps"] == 3  # a rank that counted none counts as 0
    assert rec["energy_window_diagnostic"]["joules"] == [None, None, None] and rec["energy_total_joules"] == 400.0
    assert rec["compile_seconds"] is None  # not compiled
    assert rec["peak_tflops_source"] == flops_source(H100, "fp16")


def flops_source(device, precision):
    from bench.core import mfu

    return mfu.peak_tflops(device, precision)[1]


def test_the_record_counts_no_warmup_skip_where_no_rank_counted_one_and_evaluation_under_a_second():
    two = [rank_measures(0, warmup_skipped_steps=0), rank_measures(1, warmup_skipped_steps=None)]
    two[0]["eval"]["eval_seconds"], two[1]["eval"]["eval_seconds"] = 0.25, 0.5
    rec = build(two)
    assert rec["warmup_skipped_steps"] == 0 and rec["eval_throughput"] == 200.0  # 100 samples / 0.5 s


def test_flops_fields():
    from bench.core import mfu

    cfg = cfg_for(precision="bf16", flops_per_sample=2e9)
    peak, source = mfu.peak_tflops(H100, "bf16")
    assert record.flops_fields(cfg, [{"device_name": H100}, {"device_name": "other"}], 500.0) == {
        "flops_per_sample": 2e9, "peak_tflops_per_device": peak, "peak_tflops_source": source, "tf32": None,
        "mfu": 2e9 * 500.0 / (peak * 1e12 * 2)}
    assert record.flops_fields(cfg, [], 500.0) == {
        "flops_per_sample": 2e9, "peak_tflops_per_device": None, "peak_tflops_source": "no GPU: MFU is for GPUs",
        "tf32": None, "mfu": None}


def test_compile_seconds_is_what_each_warmup_step_took_beyond_the_last():
    assert record.compile_seconds([9.0, 3.0, 2.0]) == 8.0 and record.compile_seconds([1.0, 3.0, 2.0]) == 1.0
    assert record.compile_seconds([2.0]) == 0.0


def test_the_replica_checksum_covers_every_name_and_byte():
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    expected = hashlib.sha256(b"w" + np.array([1, 3, 2, 4], dtype=np.float32).tobytes() + b"b"
                              + np.array([0.5], dtype=np.float32).tobytes()).hexdigest()
    assert record.param_checksum([("w", w.t()), ("b", torch.tensor([0.5]))]) == expected  # row-major bytes
    assert record.param_checksum([("w", w.t().contiguous()), ("b", torch.tensor([0.5]))]) == expected
    assert record.param_checksum([("v", w.t()), ("b", torch.tensor([0.5]))]) != expected
    w.requires_grad_()
    assert record.param_checksum([("w", w.t()), ("b", torch.tensor([0.5]))]) == expected


def test_record_roundtrip_never_overwrites(tmp_path):
    cfg = {"backend": "ddp", "launcher": "torchrun", "world_size": 2, "device_type": "cpu", "model": "resnet18",
           "image_size": 32, "precision": "fp32", "batch_size": 4, "warmup": 1, "steps": 2, "windows": 3}
    rec = results.skeleton(cfg, "run-1", {"torch": "x"})
    rec.update(status="ok", window_seconds=[0.5, 0.4, 0.6], throughput=20.0, throughput_ci95=[16.0, 20.0])
    path = results.save(rec, tmp_path)
    assert path.name == "run-1.json" and json.loads(path.read_text()) == rec
    [loaded] = results.load(tmp_path)
    assert {k: v for k, v in loaded.items() if k != "_path"} == rec
    with pytest.raises(FileExistsError):
        results.save(rec, tmp_path)
    assert json.loads(path.read_text()) == rec
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.json"]  # no temporary file left behind


def test_load_skips_bad_files_with_one_warning_each(tmp_path):
    (tmp_path / "half.json").write_text('{"schema": 1, "status": "o')
    (tmp_path / "old.json").write_text('{"schema": 0}')
    warnings = []
    assert results.load(tmp_path, warn=warnings.append) == []
    assert len(warnings) == 2
    assert "half.json: not a readable JSON record" in warnings[0]
    assert "old.json: schema 0, this version reads schema 2" in warnings[1]

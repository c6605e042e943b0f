"""The DDP scaling model ``bench predict`` prints and the report's prediction section shows (bench/commands/predict.py
says what it assumes): all-reduce time from the measured bus-bandwidth curve, the step's bounds with and without
overlap, and the inputs read from a results directory."""
from __future__ import annotations

import math
from pathlib import Path


def busbw_at(curve: list[tuple[int, float]], size: int) -> float:
    """Bus bandwidth (GB/s) for a message of ``size`` bytes, log-linear between measured sizes, clamped at the
    ends."""
    pts = sorted(curve)
    if size <= pts[0][0]:
        return pts[0][1]
    if size >= pts[-1][0]:
        return pts[-1][1]
    for (s0, b0), (s1, b1) in zip(pts, pts[1:]):
        if s0 <= size <= s1:
            w = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return b0 + w * (b1 - b0)
    raise AssertionError("unreachable")


def allreduce_seconds(grad_bytes: int, n: int, curve, bucket_bytes: int, gpus_per_node: int | None = None,
                      inter_node_gbps: float | None = None) -> float:
    """Time to all-reduce ``grad_bytes`` in buckets on n ranks (one node, or M nodes of G with a network)."""
    if n <= 1:
        return 0.0
    full, last = divmod(grad_bytes, bucket_bytes)
    buckets = [bucket_bytes] * full + ([last] if last else [])
    g = gpus_per_node or n
    if n <= g or not inter_node_gbps:
        return sum(b * 2 * (n - 1) / n / (busbw_at(curve, b) * 1e9) for b in buckets)
    m = math.ceil(n / g)
    inter = inter_node_gbps / 8 * 1e9  # bytes/s
    return sum(b * 2 * (g - 1) / g / (busbw_at(curve, b) * 1e9) + (b / g) * 2 * (m - 1) / m / inter for b in buckets)


def predict(t_compute: float, grad_bytes: int, n: int, curve, bucket_bytes: int, gpus_per_node=None,
            inter_node_gbps=None) -> dict:
    t_ar = allreduce_seconds(grad_bytes, n, curve, bucket_bytes, gpus_per_node, inter_node_gbps)
    no_overlap, full_overlap = t_compute + t_ar, max(t_compute, t_ar)
    return {"world_size": n, "t_compute": t_compute, "t_allreduce": t_ar, "step_no_overlap": no_overlap,
            "step_full_overlap": full_overlap, "efficiency_low": t_compute / no_overlap,
            "efficiency_high": t_compute / full_overlap}


def gradient_bytes(rec: dict) -> tuple[int | None, str]:
    """What DDP all-reduces per step for ``rec``'s model, and where the figure comes from: the parameters' bytes as
    the run's one process held them (its ``state_bytes``; a gradient has its parameter's dtype), else counted from the
    model's name at the run's sequence length (fp32 parameters, as every backend keeps them). (None, why) for a
    user's model (``pkg.mod:factory``) with no such record: its size is known only from its runs."""
    from bench.core import workloads
    from backends.models import flops

    state = rec.get("state_bytes") or []
    if len(state) == 1 and (state[0] or {}).get("parameters"):
        return int(state[0]["parameters"]), "the run's parameters (state_bytes)"
    if workloads.of_record(rec).kind == "custom":
        return None, (f"{rec['model']} is a user's model, whose size only a one-process run's record gives "
                      "(state_bytes), and this one has none")
    return 4 * flops.parameter_count(rec["model"], rec.get("seq_len")), "4 bytes x the model's parameters"


def inputs(results_dir: Path, warn, unsized: bool = False) -> list[dict]:
    """One prediction input per (hardware, workload, precision): t_c from single@1, the gradient size, the curve
    of the matching device type, and the measured efficiencies of every backend at every N. A workload whose
    gradient size is unknown (``gradient_bytes``) is left out with a warning; with ``unsized`` it is kept, with
    ``grad_bytes`` None and the reason in ``grad_source``."""
    from bench.core import comm, results, stats
    from bench.report.common import plain, workload_options

    recs = [r for r in results.load(results_dir, warn=warn) if r["status"] == "ok"]
    curves: dict[str, dict[int, list]] = {}  # device type -> world size -> the all_reduce curve measured there
    for c in comm.load(results_dir, warn):
        if c["backend"] != "ddp":
            continue
        points = [(r["bytes"], r["busbw_gbps"]) for r in c["results"] if r["op"] == "all_reduce"]
        if points:
            curves.setdefault(c["device_type"], {})[c["world_size"]] = points
    fields = ("model", "image_size", "seq_len", "optimizer", "precision", "batch_per_device", "data", "device_type")
    # single@1 at its defaults (the sweep's shared settings, the GPU sweep's channels_last say, are its defaults too),
    # one input per layout: the runs beside it that share its settings and are their backends' defaults
    keys = {tuple(r.get(k) for k in fields) + (results.hardware(r), workload_options(r)): r for r in recs
            if r["backend"] == "single" and r["world_size"] == 1 and r["device_type"] in curves and plain(r)
            and r.get("cudnn_benchmark") in (True, None)}  # cuDNN's default: a variant off is not mixed in
    out = []
    for (*values, hw, shared), base in keys.items():
        key = dict(zip(fields, values))
        grad, source = gradient_bytes(base)
        if grad is None and not unsized:
            warn(f"no prediction for {key['model']}: {source}")
            continue
        same = [x for x in recs if all(x.get(k) == v for k, v in key.items())
                and results.hardware(x) == hw and plain(x) and workload_options(x) == shared
                and x.get("cudnn_benchmark") in (True, None)]
        thr = stats.summarise_runs([stats.record_throughputs(x) for x in same if x["backend"] == "single"])["median"]
        measured, disturbed = {}, {}
        for x in same:
            if x["backend"] != "single":
                at = (x["backend"], x["world_size"])
                measured.setdefault(at, []).append(stats.record_throughputs(x))
                disturbed[at] = disturbed.get(at, 0) + bool(x.get("disturbed"))
        out.append({**key, "hardware": hw, "t_compute": key["batch_per_device"] / thr,
                    "throughput_1": thr, "grad_bytes": grad, "grad_source": source,
                    "curves": curves[key["device_type"]],
                    "measured": {k: stats.summarise_runs(v)["median"] for k, v in measured.items()},
                    "base_disturbed": sum(bool(x.get("disturbed")) for x in same if x["backend"] == "single"),
                    "measured_disturbed": disturbed})
    return out


def withheld(inp: dict, row: dict) -> tuple[str | None, str | None]:
    """Why a prediction row's figures are not results: (the predicted and measured efficiencies: single@1, whose
    compute time and throughput they are built on, was disturbed; the measured one alone: a run measured at that N
    was disturbed). None where they stand (bench/core/trust.py says when a run is disturbed)."""
    base = "single@1 disturbed" if inp.get("base_disturbed") else None
    run = "run disturbed" if row.get("measured_disturbed") else None
    return base, run


def nearest_curve(curves: dict[int, list], n: int) -> int:
    """The world size whose measured all_reduce curve predicts N: N's own, else the nearest measured (on a log scale:
    2 ranks are as far from 4 as 8 are; a tie goes to the larger, whose ring is the longer)."""
    return min(curves, key=lambda m: (abs(math.log(m) - math.log(max(n, 1))), -m))


def rows(inp: dict, sizes: list[int], backend: str, bucket_mb: float, gpus_per_node=None, inter=None) -> list[dict]:
    """Predictions for ``sizes`` and every N where ``backend`` was measured, with the measured efficiency; each from
    the bus-bandwidth curve measured at N, or at the nearest world size measured (``curve_world_size``)."""
    measured = {n: thr for (b, n), thr in inp["measured"].items() if b == backend}
    out = []
    for n in sorted(set(sizes) | set(measured)):
        at = nearest_curve(inp["curves"], n)
        p = predict(inp["t_compute"], inp["grad_bytes"], n, inp["curves"][at], int(bucket_mb * 2 ** 20), gpus_per_node,
                    inter)
        p["curve_world_size"] = at
        thr = measured.get(n)
        p["measured_efficiency"] = thr / (n * inp["throughput_1"]) if thr else None
        p["measured_disturbed"] = (inp.get("measured_disturbed") or {}).get((backend, n), 0)
        out.append(p)
    return out

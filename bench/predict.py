"""``python -m bench predict``: the step time and scaling efficiency of DDP-style training at larger N, from two
measurements the suite already has, and how far the prediction can be trusted where N was measured.

- Compute time per step, t_c: ``single`` at world size 1 (global batch / median throughput).
- The all-reduce bus bandwidth curve: ``bench collectives`` (busbw against message size, at the largest
  world size measured on this node).

DDP all-reduces the fp32 gradient (4 bytes per parameter) in buckets of ``--bucket-mb`` (DDP's 25 MiB).
Each bucket of b bytes takes b x 2(N-1)/N / busbw(b) on N ranks (nccl-tests' ring model; busbw is taken
from the curve at the bucket's size, log-interpolated, and assumed not to fall with N inside a node). Two
bounds on the step: no overlap, t_c + t_ar (every bucket after the whole backward), and full overlap,
max(t_c, t_ar) (all communication hidden behind compute). Efficiency = t_c / t_step.

Several nodes (``--gpus-per-node G --inter-node-gbps X``, X in gigabits per second as networks are rated):
a hierarchical all-reduce, as NCCL's tree/ring over nodes does in effect: reduce-scatter and all-gather inside
each node (the measured curve) around an all-reduce of 1/G of the data over the M nodes at X.
"""
from __future__ import annotations

import math
import sys
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


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict DDP's step time and efficiency at larger N from single@1 and the "
                                       "measured all-reduce bandwidth, against what was measured")
    p.add_argument("--results", default="results/raw", help="records and RESULTS/collectives (default results/raw)")
    p.add_argument("--world-sizes", default="2,4,8,16,32,64", help="N to predict (default 2,4,8,16,32,64)")
    p.add_argument("--backend", default="ddp", help="measured backend to compare with (default ddp)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (default 25)")
    p.add_argument("--gpus-per-node", type=int, help="with --inter-node-gbps: GPUs per node")
    p.add_argument("--inter-node-gbps", type=float, help="network bandwidth between nodes, Gbit/s (e.g. 400)")
    p.set_defaults(func=cmd_predict)


def inputs(results_dir: Path, warn) -> list[dict]:
    """One prediction input per (hardware, workload, precision): t_c from single@1, the gradient size, the curve
    of the matching device type, and the measured efficiencies of every backend at every N."""
    from bench import collectives, flops, results, stats

    recs = [r for r in results.load(results_dir, warn=warn) if r["status"] == "ok"]
    curves = {}
    for c in collectives.load(results_dir, warn):
        if c["backend"] != "ddp":
            continue
        points = [(r["bytes"], r["busbw_gbps"]) for r in c["results"] if r["op"] == "all_reduce"]
        best = curves.get(c["device_type"])
        if points and (best is None or c["world_size"] >= best[0]):
            curves[c["device_type"]] = (c["world_size"], points)
    fields = ("model", "image_size", "precision", "batch_per_device", "data", "device_type")
    keys = {tuple(r[k] for k in fields) + (results.hardware(r),): r for r in recs
            if r["backend"] == "single" and r["world_size"] == 1 and r["device_type"] in curves}
    out = []
    for *values, hw in keys:
        key = dict(zip(fields, values))
        same = [x for x in recs if all(x[k] == v for k, v in key.items())
                and results.hardware(x) == hw and not x.get("options")]
        thr = stats.summarise_runs([stats.record_throughputs(x) for x in same if x["backend"] == "single"])["median"]
        measured = {}
        for x in same:
            if x["backend"] != "single":
                measured.setdefault((x["backend"], x["world_size"]), []).append(stats.record_throughputs(x))
        out.append({**key, "hardware": hw, "t_compute": key["batch_per_device"] / thr,
                    "throughput_1": thr, "grad_bytes": 4 * flops.parameter_count(key["model"]),
                    "curve_world_size": curves[key["device_type"]][0], "curve": curves[key["device_type"]][1],
                    "measured": {k: stats.summarise_runs(v)["median"] for k, v in measured.items()}})
    return out


def cmd_predict(args) -> int:
    from bench.cli import UsageError

    src = Path(args.results)
    if not src.is_dir():
        raise UsageError(f"results directory {str(src)!r} does not exist")
    try:
        sizes = sorted({int(x) for x in args.world_sizes.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--world-sizes {args.world_sizes!r}: expected comma-separated positive integers") from None
    if not sizes or min(sizes) < 1 or args.bucket_mb <= 0:
        raise UsageError("--world-sizes must be positive integers and --bucket-mb a positive number")
    if (args.gpus_per_node is None) != (args.inter_node_gbps is None) or (args.gpus_per_node or 1) < 1 \
            or (args.inter_node_gbps is not None and args.inter_node_gbps <= 0):
        raise UsageError("--gpus-per-node and --inter-node-gbps go together, both positive")
    found = inputs(src, lambda m: print(f"warning: {m}", file=sys.stderr))
    if not found:
        raise UsageError(f"{src} needs an ok single@1 record and a `bench collectives` all_reduce curve on the same "
                         "device type (run: make bench)")
    for inp in found:
        print_prediction(inp, rows(inp, sizes, args.backend, args.bucket_mb, args.gpus_per_node, args.inter_node_gbps),
                         args)
    return 0


def rows(inp: dict, sizes: list[int], backend: str, bucket_mb: float, gpus_per_node=None, inter=None) -> list[dict]:
    """Predictions for ``sizes`` and every N where ``backend`` was measured, with the measured efficiency."""
    measured = {n: thr for (b, n), thr in inp["measured"].items() if b == backend}
    out = []
    for n in sorted(set(sizes) | set(measured)):
        p = predict(inp["t_compute"], inp["grad_bytes"], n, inp["curve"], int(bucket_mb * 2 ** 20), gpus_per_node,
                    inter)
        thr = measured.get(n)
        p["measured_efficiency"] = thr / (n * inp["throughput_1"]) if thr else None
        out.append(p)
    return out


def print_prediction(inp: dict, table_rows: list[dict], args) -> None:
    from rich.console import Console
    from rich.table import Table

    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    where = (f"{args.gpus_per_node} GPUs per node, {args.inter_node_gbps:g} Gbit/s between nodes"
             if args.inter_node_gbps else "one node")
    table = Table(title=f"predicted {args.backend}-style scaling: {inp['model']} {inp['image_size']}px b"
                        f"{inp['batch_per_device']}/device {inp['precision']} on {inp['hardware']} ({where}); "
                        f"t_compute {1000 * inp['t_compute']:.1f} ms, gradient {inp['grad_bytes'] / 2 ** 20:.1f} MiB, "
                        f"busbw from {inp['curve_world_size']} ranks")
    for col in ("N", "all-reduce ms", "step ms (overlap .. none)", "efficiency (none .. full overlap)", "measured"):
        table.add_column(col, justify="right")
    for r in table_rows:
        table.add_row(str(r["world_size"]), f"{1000 * r['t_allreduce']:.1f}",
                      f"{1000 * r['step_full_overlap']:.1f} .. {1000 * r['step_no_overlap']:.1f}",
                      f"{pct(r['efficiency_low'])} .. {pct(r['efficiency_high'])}", pct(r["measured_efficiency"]))
    Console(width=170).print(table)

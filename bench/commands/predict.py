"""``python -m bench predict``: the step time and scaling efficiency of DDP-style training at larger N, from two
measurements the suite already has, and how far the prediction can be trusted where N was measured.

- Compute time per step, t_c: ``single`` at world size 1 (global batch / median throughput).
- The all-reduce bus bandwidth curve: ``bench collectives`` (busbw against message size), the one measured at N, or
  at the nearest world size measured on this node (the table's "busbw from" column says which).

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

from pathlib import Path

from bench.report.scaling import inputs, rows, withheld
from bench.core import workloads
from bench.core.errors import UsageError, warn


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict DDP's step time and efficiency at larger N from single@1 and the "
                                       "measured all-reduce bandwidth, against what was measured")
    p.add_argument("--results", default="results/raw", help="records and RESULTS/collectives (default results/raw)")
    p.add_argument("--gpus", "--world-sizes", dest="gpus", default="2,4,8,16,32,64",
                   help="world sizes N to predict, comma-separated (default 2,4,8,16,32,64; --world-sizes is the old "
                        "spelling)")
    p.add_argument("--backend", default="ddp", help="measured backend to compare with (default ddp)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (default 25)")
    p.add_argument("--gpus-per-node", type=int, help="with --inter-node-gbps: GPUs per node")
    p.add_argument("--inter-node-gbps", type=float, help="network bandwidth between nodes, Gbit/s (e.g. 400)")
    p.set_defaults(func=cmd_predict)


def cmd_predict(args) -> int:
    src = Path(args.results)
    if not src.is_dir():
        raise UsageError(f"--results {str(src)!r} {'is a file, not a directory' if src.exists() else 'does not exist'}")
    try:
        sizes = sorted({int(x) for x in args.gpus.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--gpus {args.gpus!r}: expected comma-separated positive integers") from None
    if not sizes or min(sizes) < 1 or args.bucket_mb <= 0:
        raise UsageError("--gpus must be positive integers and --bucket-mb a positive number")
    if (args.gpus_per_node is None) != (args.inter_node_gbps is None) or (args.gpus_per_node or 1) < 1 \
            or (args.inter_node_gbps is not None and args.inter_node_gbps <= 0):
        raise UsageError("--gpus-per-node and --inter-node-gbps go together, both positive")
    found = inputs(src, warn)
    if not found:
        raise UsageError(f"{src} needs an ok single@1 record and a `bench collectives` all_reduce curve on the same "
                         "device type (run: make bench)")
    for inp in found:
        print_prediction(inp, rows(inp, sizes, args.backend, args.bucket_mb, args.gpus_per_node, args.inter_node_gbps),
                         args)
    return 0


def print_prediction(inp: dict, table_rows: list[dict], args) -> None:
    from rich.console import Console
    from rich.table import Table

    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    where = (f"{args.gpus_per_node} GPUs per node, {args.inter_node_gbps:g} Gbit/s between nodes"
             if args.inter_node_gbps else "one node")
    table = Table(title=f"predicted {args.backend}-style scaling: {inp['model']} {workloads.shape(inp)} b"
                        f"{inp['batch_per_device']}/device {inp['precision']} on {inp['hardware']} ({where}); "
                        f"t_compute {1000 * inp['t_compute']:.1f} ms, gradient {inp['grad_bytes'] / 2 ** 20:.1f} MiB")
    for col in ("N", "busbw from", "all-reduce ms", "step ms (overlap .. none)", "efficiency (none .. full overlap)",
                "measured"):
        table.add_column(col, justify="right")
    for r in table_rows:
        base, run = withheld(inp, r)  # a disturbed single@1 or measured run: the reason, not the figure
        measured = pct(r["measured_efficiency"])
        step = f"{1000 * r['step_full_overlap']:.1f} .. {1000 * r['step_no_overlap']:.1f}"
        table.add_row(str(r["world_size"]), f"{r['curve_world_size']} ranks", f"{1000 * r['t_allreduce']:.1f}",
                      f"⚠ {base}" if base else step,
                      f"⚠ {base}" if base else f"{pct(r['efficiency_low'])} .. {pct(r['efficiency_high'])}",
                      f"⚠ {base or run}" if measured != "-" and (base or run) else measured)
    Console(width=170).print(table)

"""``python -m bench collectives``: bus bandwidth of the collectives the backends use, over the process group
they use (NCCL on GPUs, gloo on CPU), and of Horovod's allreduce (under horovodrun).

Definitions are nccl-tests' (PERFORMANCE.md there): for a message of S bytes on n ranks, algbw = S / t, and
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for reduce_scatter and all_gather (S is the full, gathered
size), x 1 for broadcast. busbw is comparable across n and with the hardware's link bandwidth. t is timed as
nccl-tests times it (common.cu, ``BenchTime``): ``--warmup`` untimed operations, a synchronize and a barrier,
then ``--iters`` operations back to back between one pair of clock reads closed by one synchronize, divided by
``--iters``; the slowest rank's t. Bracketing every operation with a barrier and a synchronize instead adds
launch, synchronize and barrier skew (tens of microseconds) to each sample, which is most of a ~100 us 25 MiB
all-reduce on NVLink. The ranks agree on the message sizes before the sweep (the smallest free memory of any
rank sets the largest size): a rank that skipped a size alone would leave the others waiting in a collective
forever. One record per launcher in RESULTS/collectives/ (schema ``collectives-1``); the report
draws busbw against message size with the model's gradient size and DDP's bucket size marked.
"""
from __future__ import annotations

from pathlib import Path

from bench.plan.sweep import check_writable, world_sizes
from bench.core.devices import detect_device
from bench.core.errors import UsageError
from bench.core.text import human
from bench.core import environment

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
DEFAULT_RANGE = {"cuda": ("4K", "1G"), "cpu": ("4K", "16M")}  # NVLink/NVLS reach their plateau near 1 GiB


def parse_size(text: str) -> int:
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise ValueError(f"message size {text!r}: expected bytes or a size such as 4K, 16M, 1G") from None


def sizes(lo: int, hi: int, factor: int = 4) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def register(sub) -> None:
    c = sub.add_parser("collectives", help="bus bandwidth of all_reduce, reduce_scatter, all_gather, broadcast "
                                           "(and Horovod's allreduce) over the backends' process group")
    c.add_argument("--gpus", help="world sizes, e.g. 2,4 (on CPU: worker processes; default: every device, CPU 2)")
    c.add_argument("--max-gpus", help="sweep 2, 4, ... up to N; 'all' = every device (as bench run's --max-gpus)")
    c.add_argument("--device", default="auto", help="auto | cuda | cpu")
    c.add_argument("--min-bytes", help="smallest message (default 4K)")
    c.add_argument("--max-bytes", help="largest message (default 1G on GPU, 16M on CPU; capped by the smallest free memory of any rank)")
    c.add_argument("--ops", default=",".join(OPS), help=f"comma-separated from {', '.join(OPS)}")
    c.add_argument("--iters", type=int, default=20, help="operations per size timed back to back, one synchronize "
                                                         "at the end (default 20, as nccl-tests' -n)")
    c.add_argument("--warmup", type=int, default=3, help="untimed iterations per size (default 3)")
    c.add_argument("--no-horovod", action="store_true", help="skip Horovod's allreduce")
    c.add_argument("--results", default="results/raw", help="records go to RESULTS/collectives")
    c.set_defaults(func=cmd_collectives)


def plan(args):
    device, present = detect_device(args.device)
    unit = "GPU" if device == "cuda" else "core"
    if not args.gpus and present < 2:  # nothing to run (exit 2), as a plan whose every run would be skipped
        raise UsageError(f"nothing to run: collectives need at least 2 ranks and this machine has one {unit}")
    if args.gpus or not args.max_gpus:
        world = world_sizes(args.gpus or (str(present) if device == "cuda" else str(min(2, present))), None,
                            device, present)
    else:
        world = world_sizes(None, args.max_gpus, device, present)
        if max(world) < 2:
            raise UsageError(f"nothing to run: collectives need at least 2 ranks; --max-gpus {args.max_gpus} sweeps "
                             f"{', '.join(map(str, world))}")
    if max(world) < 2:
        raise UsageError(f"nothing to run: collectives need at least 2 ranks; got --gpus {args.gpus}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise UsageError(f"--ops {args.ops!r}: unknown collective {', '.join(bad) or repr(args.ops)}; choose from "
                         f"{', '.join(OPS)}")
    lo_default, hi_default = DEFAULT_RANGE[device]
    try:
        lo, hi = parse_size(args.min_bytes or lo_default), parse_size(args.max_bytes or hi_default)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not 0 < lo <= hi:
        raise UsageError(f"--min-bytes {lo} and --max-bytes {hi}: need 0 < min <= max")
    for name in ("iters", "warmup"):
        if getattr(args, name) < (1 if name == "iters" else 0):
            raise UsageError(f"--{name} must be a {'positive' if name == 'iters' else 'non-negative'} integer, "
                                 f"got {getattr(args, name)}")
    return device, [n for n in world if n >= 2], ops, sizes(lo, hi)


def cmd_collectives(args) -> int:
    import backends
    from bench import launch
    from bench.core.config import RunConfig

    device, world, ops, message_sizes = plan(args)
    out = Path(args.results) / "collectives"
    check_writable(out)
    env = environment.collect_env()
    status = 0
    runs = [("ddp", ops)] + ([] if args.no_horovod else [("horovod", ["horovod_allreduce"])])
    for n in world:
        for name, run_ops in runs:
            backend = backends.create(name)
            cfg = RunConfig(backend=name, launcher=backend.launcher, world_size=n, device_type=device,
                            model="none", image_size=1, batch_size=1, warmup=2, steps=1, windows=1).validate()
            reason = backend.unavailable(cfg)
            if reason:
                print(f"collectives x{n} {name}: skipped: {reason}", flush=True)
                continue
            spec = {"task": "collectives", "collectives": {"ops": run_ops, "sizes": message_sizes,
                                                            "iters": args.iters, "warmup": args.warmup}}
            rec = launch.run_one(cfg, out, env, backend, extra_spec=spec,
                                 timeout=300 + len(message_sizes) * len(run_ops) * 20)
            if rec["status"] != "ok":
                status = 1
                print(f"collectives x{n} {name}: {rec['status']}: {rec['reason']}", flush=True)
                continue
            print_table(rec)
    return status


def print_table(rec: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{rec['process_group']} collectives, {rec['world_size']} ranks on {rec['device_type']} "
                        f"(busbw GB/s; nccl-tests definitions)")
    table.add_column("size", justify="right")
    ops = list(dict.fromkeys(r["op"] for r in rec["results"]))
    for op in ops:
        table.add_column(op, justify="right")
    by = {(r["op"], r["bytes"]): r for r in rec["results"]}
    for size in dict.fromkeys(r["bytes"] for r in rec["results"]):
        table.add_row(human(size), *[f"{by[(op, size)]['busbw_gbps']:.3f}" if (op, size) in by else "-" for op in ops])
    Console(width=160).print(table)

"""``python -m bench overhead``: each backend's fixed host cost per step, beside ``single``'s.

A model whose compute is negligible (backends/models/overhead.py) trains in one rank process on the CPU with one
thread, every backend at world size 1 set up side by side and timed in interleaved rounds (bench/rank/overhead.py):
what remains per step is what the backend does on the host around the kernels (hooks, wrappers, copies, per-parameter
bookkeeping, one-rank collectives). On a GPU that time is idle device time whenever the kernels are faster than it.
The figure is CPU time of the process per step (robust beside other load; wall time is recorded beside it), so any
machine can take it. Its record goes to ``RESULTS/overhead``; the report's backend table and the README quote it."""
from __future__ import annotations

import sys
from pathlib import Path

from bench.core import environment, overhead
from bench.core.errors import UsageError

DEFAULTS = {"steps": 100, "rounds": 7, "warmup": 10, "batch": 4}


def register(sub) -> None:
    o = sub.add_parser("overhead", help="each backend's host cost per step on a negligible model, beside single's "
                                        "(one process, the CPU, interleaved rounds)")
    o.add_argument("--backends", default="all", help="comma-separated, or all (default)")
    o.add_argument("--steps", type=int, default=DEFAULTS["steps"], help=f"steps per round (default {DEFAULTS['steps']})")
    o.add_argument("--rounds", type=int, default=DEFAULTS["rounds"],
                   help=f"interleaved rounds; the median is reported (default {DEFAULTS['rounds']})")
    o.add_argument("--results", default="results/raw", help="records go to RESULTS/overhead (default results/raw)")
    o.set_defaults(func=cmd_overhead)


def plan(args):
    """The backends to time (``single`` always, as the reference) and the rank's configuration."""
    import backends
    from backends.models.overhead import MODEL
    from bench.plan.sweep import parse_backends
    from bench.core.config import RunConfig

    for name in ("steps", "rounds"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    names = parse_backends(args.backends)
    names = list(dict.fromkeys([backends.BASELINE, *names]))
    cfg = RunConfig(backend=backends.BASELINE, launcher="inproc", world_size=1, device_type="cpu", model=MODEL,
                    image_size=None, batch_size=DEFAULTS["batch"], warmup=DEFAULTS["warmup"], steps=args.steps,
                    windows=args.rounds).validate()
    return names, cfg


def cmd_overhead(args) -> int:
    import backends
    from bench import launch
    from bench.plan.sweep import check_writable

    names, cfg = plan(args)
    out = Path(args.results) / "overhead"
    check_writable(out)
    spec = {"task": "overhead", "overhead": {"backends": names, "steps": args.steps, "rounds": args.rounds,
                                             "warmup": DEFAULTS["warmup"]}}
    print(f"overhead: {len(names)} backends in one process, {args.rounds} rounds of {args.steps} steps, "
          f"{cfg.model} batch {cfg.batch_size}", file=sys.stderr, flush=True)
    rec = launch.run_one(cfg, out, environment.collect_env(backends.environment(names)), backends.create(cfg.backend),
                         extra_spec=spec, threads=1, timeout=300 + 0.05 * args.steps * args.rounds * len(names))
    if rec["status"] != "ok":
        print(f"overhead: {rec['status']}: {rec['reason']}", file=sys.stderr)
        return 1
    print(overhead.table(rec))
    return 0

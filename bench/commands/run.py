"""``python -m bench run``: plan backends x world sizes (bench/plan), print the plan and its cost, then run each
configuration as its own process tree (bench/launch), one record per run; ``--find-max-batch`` searches each one's
largest batch instead, ``--to-accuracy A`` trains each one to a held-out accuracy (bench/plan/accuracy.py), and
``--external`` runs this process as one rank of a run another engine started."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import backends
from bench.core import environment, peak, results, traces, workloads
from bench.core.devices import detect_device, usable_cpus
from bench.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError, warn
from bench.core.flags import add_renamed
from bench.core.trust import OTHERS_CPU_SHARE
from bench.plan import accuracy as _accuracy
from bench.plan import estimate, reference, sweep
from bench.plan import nodes as _nodes
from bench.plan.measure import run_watched
from bench.plan.sweep import (add_run_arguments, check_something_runs, check_writable, interleave, loader_unavailable,
                              plan, skip_reason)

WAIT_QUIET_S = 120.0  # --wait-quiet-s with no value: the longest wait before each run


def register(sub) -> None:
    r = sub.add_parser("run", help="run backends x world sizes and write one JSON record per run")
    add_run_arguments(r)
    add_renamed(r, "--wait-quiet-s", "--wait-quiet", dest="wait_quiet", nargs="?", type=float, const=WAIT_QUIET_S,
                default=None, metavar="SECONDS",
                help="before each run, wait up to SECONDS (default {:g}) for a quiet machine: other processes using "
                     "less than {:g}%% of the CPUs, none on the run's GPUs (off by default)".format(
                         WAIT_QUIET_S, 100 * OTHERS_CPU_SHARE))
    r.add_argument("--trace", nargs="?", type=int, const=traces.DEFAULT_STEPS, default=None, metavar="STEPS",
                   help=f"after each run's measurements, profile STEPS more steps (default {traces.DEFAULT_STEPS}, at "
                        f"most {traces.MAX_STEPS}) on every rank with torch.profiler: one Chrome trace per rank next to "
                        "the run's log, its phases per step in the record (never inside a timed window)")
    r.add_argument("--plan", action="store_true",
                   help="print the sweep's plan (every run in its order, with its estimated time) and the total, then "
                        "exit without launching anything")
    r.add_argument("--quick", action="store_true",
                   help="the first look: one repetition of single, ddp and fsdp2 (on GPUs windows of 1 s); the verdict "
                        "then names no winner, by its rule (make bench QUICK=1)")
    r.add_argument("--no-bind", action="store_true",
                   help="leave each rank free to run on any CPU (default on a GPU machine with several NUMA nodes: "
                        "bound to the CPUs near its GPU, NVML's CPU affinity; recorded as cpu_binding)")
    r.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    from bench.plan import progress
    from bench.report import console as summary
    from bench.launch import machine

    wait_quiet = getattr(args, "wait_quiet", None)
    if wait_quiet is not None and not wait_quiet > 0:
        raise UsageError(f"--wait-quiet-s {wait_quiet:g}: expected a positive number of seconds (the longest wait "
                         "before each run)")
    trace = getattr(args, "trace", None)
    if trace is not None and not 1 <= trace <= traces.MAX_STEPS:
        raise UsageError(f"--trace {trace}: expected a number of steps from 1 to {traces.MAX_STEPS} (a trace is for "
                         "reading a step, not for statistics)")
    if trace and args.find_max_batch:
        raise UsageError("--trace profiles timed runs; --find-max-batch runs none (trace the batch it finds with "
                         "bench run --batch-size B --trace)")
    if args.find_max_model and (args.find_max_batch or trace):
        raise UsageError(f"--find-max-model runs no timed run{': it cannot go with --trace' if trace else ''}"
                         f"{'; search one thing at a time: --find-max-model or --find-max-batch' if args.find_max_batch else ''}")
    if getattr(args, "skip_peak", False) and args.refresh_peak:
        raise UsageError("--skip-peak measures no matmul peak and --refresh-peak measures it again: give one")
    _accuracy.check_flags(args)  # --to-accuracy's flags and --data learnable only with it; its own defaults
    if args.reference:
        why = ("--external runs one rank of another engine" if args.external else
               "--to-accuracy trains to a target, not in timed windows" if args.to_accuracy is not None else
               "--find-max-batch and --find-max-model time no run" if args.find_max_batch or args.find_max_model
               else None)
        if why:
            raise UsageError(f"--reference compares timed runs with their plain twins; {why}")
    if args.find_max_model:
        from bench.plan import maxmodel as _maxmodel

        if args.model:
            raise UsageError(f"--find-max-model walks the GPT ladder: give the sizes with --ladder, not --model "
                             f"{args.model}")
        sizes = _maxmodel.ladder(args.ladder, detect_device(args.device)[0])
        args.model = sizes[0]  # the plan's workload: the ladder's first size, the others probed from it
    elif args.ladder:
        raise UsageError("--ladder is for --find-max-model")
    timed = not (args.find_max_batch or args.find_max_model or args.to_accuracy is not None or args.external)
    chosen = sweep.run_defaults(args, quick=getattr(args, "quick", False)) if timed else []
    configs, notes = plan(args)
    if not configs:
        raise UsageError(f"nothing to run: {'; '.join(notes) or 'no backend and world size match'}")
    if args.external:
        return run_external(args, configs)
    check_something_runs(configs)  # every run skipped for a reason known now: refused (exit 2), nothing launched
    nodes = _nodes.parse_nodes(args)
    if nodes is not None and args.reference:
        raise UsageError("--reference runs each plain twin on one device of this machine; run it in a single-node sweep")
    if nodes is not None and args.resume:
        raise UsageError("--resume cannot be used with --nnodes: every node must run the same sweep in the same order")
    if args.find_max_batch:
        return find_max_batch(args, configs, notes)
    if args.find_max_model:
        return find_max_model(args, configs, notes, sizes)
    if args.to_accuracy is not None:
        return _accuracy.run(args, configs, notes)
    configs = interleave(configs, args.repeat or 1, args.order_seed)
    results_dir = Path(args.results)
    if not args.plan:
        check_writable(results_dir)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    env_meta = environment.collect_env(backends.environment(c.backend for c in configs))
    if args.resume:
        configs = _not_yet_done(configs, results_dir, env_meta)
    runnable = lambda c: not skip_reason(c)  # noqa: E731
    items = reference.plan(configs, runnable) if args.reference else [(reference.RUN, c) for c in configs]
    seconds = [s if runnable(c) else 0.0 for (_, c), s in  # a run skipped here costs its record only
               zip(items, estimate.plan_seconds(items, estimate.device_name(configs[0].device_type) if configs else None))]
    if args.plan:
        print_plan(items, seconds, runnable)
    print(plan_line(items, seconds, chosen), flush=True)
    if args.plan:
        return EXIT_OK
    # The first run that finds no cached matmul peak for its device and precision mode measures it (bench/rank/peak.py)
    measured_peak = None if getattr(args, "skip_peak", False) else {
        "cache": str(peak.cache_dir()), "refresh_since": results.utc_now() if args.refresh_peak else None}
    # Ctrl-C and SIGTERM end the sweep, whatever this process inherited: a shell script's background job starts with
    # SIGINT ignored, and Python then never installs its KeyboardInterrupt handler, so a `kill -INT` was lost.
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    records, twins, peak_warned = [], [], set()
    try:
        with progress.Sweep(len(items)) as bar:
            for i, (what, cfg) in enumerate(items, 1):
                rep = f" (repeat {cfg.repeat_index}/{cfg.repeats})" if cfg.repeats > 1 else ""
                knob = " cudnn.benchmark off" if cfg.cudnn_benchmark is False else ""
                if what == reference.TWIN:
                    twins.append(run_twin(cfg, results_dir, env_meta, bar, rep))
                    continue
                bar.start(f"{cfg.backend} x{cfg.world_size} on {cfg.device_type}: {cfg.model} {workloads.shape(cfg.to_dict())} "
                          f"batch {cfg.batch_size}/device {cfg.precision}{knob}{rep}")
                # The machine around the run: load, others' CPU time and GPUs during its windows (bench/launch/
                # machine.py); the record says whether it was disturbed (bench/core/trust.py judges).
                gpus = machine.run_gpus(cfg.device_type, cfg.world_size // max(1, cfg.nnodes))
                runs = wait_quiet and not skip_reason(cfg)
                waited = machine.wait_quiet(cfg.device_type, gpus, wait_quiet, say=bar.say) if runs else None
                rec = run_watched(cfg, results_dir, env_meta, gpus=gpus, waited=waited, nodes=nodes,
                                  rdzv_id=f"{nodes.rdzv_id}-{i}" if nodes else "", unavailable=loader_unavailable(cfg),
                                  extra_spec={"peak": measured_peak, "bind_cpus": not getattr(args, "no_bind", False),
                                              **({"trace_steps": trace} if trace else {})})
                note = peak.warning(rec.get("peak_measured"))  # once per cache entry and sweep
                if note and note not in peak_warned:
                    peak_warned.add(note)
                    warn(note)
                records.append(rec)
                bar.finish(summary.one_line(rec))
    except KeyboardInterrupt:
        print(f"\ninterrupted: {len(records)} of {len(configs)} runs finished; their records are in {results_dir}",
              file=sys.stderr)
        summary.print_table(records)
        summary.print_warnings(records)
        return EXIT_INTERRUPTED
    if args.reference:
        records = reference.attach(records, twins, results_dir)
    summary.print_table(records)
    summary.print_warnings(records)
    for line in reference.lines(records):
        print(line)
    return exit_code(records)


def plan_line(items: list, seconds: list[float], chosen: list[str]) -> str:
    """The plan and its cost in one line, printed before the first launch (and by --plan, after the table)."""
    runs = [c for kind, c in items if kind == reference.RUN]
    twins = len(items) - len(runs)
    models = list(dict.fromkeys(c.model for c in runs))
    reps = max((c.repeats for c in runs), default=1)
    order = ("1 repetition in the planned order" if reps == 1 else
             f"{reps} repetitions, the first in the planned order, the rest shuffled "
             f"(--order-seed {runs[0].order_seed if runs else 0})")
    shape = f"{len(models)} workload{'s' if len(models) != 1 else ''} ({', '.join(models)}), {order}"
    line = (f"plan: {len(runs)} run{'s' if len(runs) != 1 else ''}"
            + (f" and {twins} plain twin{'s' if twins != 1 else ''}" if twins else "")
            + f": {shape}; about {estimate.duration(sum(seconds))} by the estimate (bench/plan/estimate.py)")
    if chosen:
        line += f"\nplan: defaults for this machine, each overridden by its flag: {'; '.join(chosen)}"
    return line


def print_plan(items: list, seconds: list[float], runnable) -> None:
    """--plan: every run and twin in its order, what it is, and its estimated time."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bench run --plan: the sweep in its order")
    for col in ("#", "repetition", "what", "world size", "workload", "precision", "options", "estimate"):
        table.add_column(col, justify="right" if col in ("#", "world size", "estimate") else "left")
    for i, ((kind, c), s) in enumerate(zip(items, seconds), 1):
        what = "plain twin" if kind == reference.TWIN else c.backend + ("" if runnable(c) else " (skipped here)")
        options = ", ".join(f"{k}={v}" for k, v in (c.options or {}).items()) + (
            " cudnn.benchmark off" if c.cudnn_benchmark is False else "")
        table.add_row(str(i), f"{c.repeat_index}/{c.repeats}", what, str(1 if kind == reference.TWIN else c.world_size),
                      f"{c.model} {workloads.shape(c.to_dict())} b{c.batch_size}", c.precision, options,
                      estimate.duration(s))
    Console(width=160).print(table)


def exit_code(records: list[dict]) -> int:
    """docs/command-line.md, "Exit codes": 1 when a run failed (a run whose replicas diverged measured something other
    than data-parallel training: it fails like a crash); 2 when every run was skipped (at launch, for a reason the plan
    could not know): nothing was measured, which a script must not read as success; else 0."""
    if any(r["status"] == "failed" or r.get("replicas_consistent") is False for r in records):
        return EXIT_FAILED
    if records and all(r["status"] == "skipped" for r in records):
        print(f"bench: error: nothing measured: all {len(records)} run{'s' if len(records) != 1 else ''} were skipped "
              "(the reasons are above)", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def run_twin(cfg, results_dir, env_meta, bar, rep: str) -> dict:
    """One configuration's plain twin (bench run --reference), watched like a run."""
    from bench import launch
    from bench.launch import machine

    bar.start(f"plain twin x1 on {cfg.device_type}: {cfg.model} {workloads.shape(cfg.to_dict())} batch {cfg.batch_size} "
              f"{cfg.precision}{''.join(f' {k}' for k in ('channels_last', 'compile') if (cfg.options or {}).get(k))}{rep}")
    with machine.Watch(cfg.device_type, machine.run_gpus(cfg.device_type, 1)) as watch:
        rec = launch.run_twin(cfg, results_dir, env_meta)
    rec = machine.attach(rec, watch, Path(results_dir) / "reference")
    bar.finish(reference.twin_line(rec))
    return rec


def find_max_batch(args, configs, notes) -> int:
    from bench.plan import maxbatch

    device = configs[0].device_type
    cap = args.max_batch if args.max_batch is not None else (4096 if device == "cuda" else 256)
    if cap < 1:
        raise UsageError(f"--max-batch must be a positive integer, got {cap}")
    configs, results_dir, env_meta = _search_setup(args, configs, notes)
    rows = maxbatch.run(configs, results_dir, env_meta, cap, args.memory_limit_gib, lambda line: print(line, flush=True))
    return EXIT_FAILED if any(r["error"] for r in rows) else EXIT_OK


def find_max_model(args, configs, notes, sizes) -> int:
    from bench.plan import maxmodel as _maxmodel

    configs, results_dir, env_meta = _search_setup(args, configs, notes)
    rows = _maxmodel.run(configs, sizes, results_dir, env_meta, args.memory_limit_gib,
                         lambda line: print(line, flush=True))
    return EXIT_FAILED if any(r["error"] for r in rows) else EXIT_OK


def _search_setup(args, configs, notes):
    """What --find-max-batch and --find-max-model share: the heap budget checked, the results directory, the notes,
    the environment; the configurations to search (the labelled cudnn.benchmark-off variant is not one)."""

    if args.memory_limit_gib is not None and (configs[0].device_type == "cuda" or args.memory_limit_gib <= 0):
        raise UsageError(f"--memory-limit-gib {args.memory_limit_gib:g}: a positive number of GiB, for CPU runs only "
                         "(on GPUs the device's memory is the limit)")
    results_dir = Path(args.results)
    check_writable(results_dir)
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    env_meta = environment.collect_env(backends.environment(c.backend for c in configs))
    return [c for c in configs if c.cudnn_benchmark is not False], results_dir, env_meta


def _not_yet_done(configs, results_dir, env_meta):
    """--resume: drop the runs already done. A configuration with k ok records (same grouping as reports and
    the gate) has its first k repetitions done."""
    from collections import Counter

    from bench.core import results

    done = Counter(results.config_key(r) for r in results.load(results_dir, warn=warn) if r["status"] == "ok")
    todo = [c for c in configs if done[results.config_key(results.skeleton(c.to_dict(), "", env_meta))] < c.repeat_index]
    print(f"resume: {len(configs) - len(todo)} of {len(configs)} runs already have an ok record in "
          f"{results_dir}; running {len(todo)}", file=sys.stderr)
    return todo


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_external(args, configs) -> int:
    """Run the single planned configuration as this process's rank; global rank 0 writes the record. The process ends
    here, as every rank's does (bench/rank/entry.py exit_done)."""
    import socket

    from bench.core import results
    from bench.rank.entry import exit_done, guarded

    if len(configs) != 1 or configs[0].launcher != "torchrun":
        torchrun = ", ".join(n for n in backends.names() if backends.REGISTRY[n]["launcher"] == "torchrun")
        raise UsageError(f"--external runs one torch.distributed backend (launched by torchrun otherwise: {torchrun}) "
                         "at the world size the engine set; got "
                         f"{', '.join(f'{c.backend} x{c.world_size}' for c in configs)}")
    cfg = configs[0]
    os.environ.setdefault("LOCAL_RANK", "0")  # external_world (called by plan) exported the engine's values
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    rank = int(os.environ["RANK"])
    spec = {"config": cfg.to_dict(), "run_id": results.new_run_id(cfg.backend, cfg.world_size),
            "results_dir": args.results, "env": environment.collect_env(), "threads_per_rank": max(1, usable_cpus()
                                                                                                // local),
            "launched_by": "external", "master_port": int(os.environ["MASTER_PORT"]),
            "trace_steps": getattr(args, "trace", None)}
    print(f"bench run --external: rank {rank} of {cfg.world_size} on {socket.gethostname()}, {cfg.backend}",
          file=sys.stderr, flush=True)
    guarded(spec)
    exit_done()

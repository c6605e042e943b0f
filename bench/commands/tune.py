"""``python -m bench tune``: each backend's fastest configuration, found within a time budget.

Per backend, the settings a user would try, one at a time from the shared defaults (coordinate search): the batch
(doubled while it wins), channels_last (vision models), cuDNN's benchmark flag (GPUs), the backend's own knobs that
trade speed (DDP's bucket size, gradient_as_bucket_view and static_graph; FSDP2's reshard policy) and ``--compile``
last (the costliest to try). Each candidate is one ``bench run`` of that backend (its own process tree, records in
RESULTS/tune/raw); it replaces the incumbent only when its 95% interval lies above the incumbent's, so noise never
picks a "best". A candidate that would not finish within what is left of the budget is not started. Every other
``bench run`` flag given here (model, precision, windows, ...) is shared by all candidates; a knob given on the command
line is fixed, not searched (``--batch-size`` is where the batch search starts).

Each backend's best is written as a reusable ``bench run`` command line, and all of it to RESULTS/tune/summary-*.json
(bench/core/tune.py), which the report reads ("At their best (bench tune)", and one line of the verdict)."""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from bench.core.errors import UsageError

DEFAULT_BUDGET_S = 600.0
BATCH_STEPS = 3  # at most 2x, 4x, 8x the default batch (doubling stops at the first that does not win)
# knob -> the values a user tries besides the default; a backend's own knobs are searched where it declares them
TRY = {"channels_last": (True,), "ddp_bucket_mb": (5.0, 100.0), "ddp_grad_as_bucket_view": (True,),
       "ddp_static_graph": (True,), "fsdp_reshard": ("never", "always"), "compile": (True,)}
COMPILE_EXTRA_S = {"cpu": 60.0, "cuda": 120.0}  # what compiling adds to a run, for the budget's estimate
NOT_WITH_TUNE = ("find_max_batch", "find_max_model", "reference", "resume", "trace", "external", "repeat")


def register(sub) -> None:
    from bench.commands._plan import add_run_arguments

    t = sub.add_parser("tune", help="each backend's fastest configuration within a time budget (batch, channels_last, "
                                    "--compile, cuDNN benchmark, its own knobs), as a reusable bench run command")
    t.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds for the whole search, shared by the backends (default {DEFAULT_BUDGET_S:g})")
    add_run_arguments(t)
    t.set_defaults(func=cmd_tune)


# -- the search (pure: measure and clock are given) --------------------------------------------------------------------

def above(candidate: dict, incumbent: dict) -> bool:
    """Whether ``candidate``'s 95% interval lies wholly above ``incumbent``'s: faster beyond the noise."""
    return bool(candidate.get("ci95") and incumbent.get("ci95")) and candidate["ci95"][0] > incumbent["ci95"][1]


def dimensions(knob_keys: set[str], fixed: set[str], device_type: str, kind: str, batch: int) -> list[tuple[str, tuple]]:
    """What to try, in order: (setting, the values to try besides the default). ``fixed``: settings the user gave."""
    dims = []
    if "batch_size" not in fixed:
        dims.append(("batch_size", tuple(batch * 2 ** i for i in range(1, BATCH_STEPS + 1))))
    if "channels_last" in knob_keys and kind == "vision":
        dims.append(("channels_last", TRY["channels_last"]))
    if device_type == "cuda" and "cudnn_benchmark" not in fixed:
        dims.append(("cudnn_benchmark", ("off",)))
    dims += [(k, TRY[k]) for k in TRY if k in knob_keys and k not in ("channels_last", "compile")]
    if "compile" in knob_keys:
        dims.append(("compile", TRY["compile"]))
    return [(k, v) for k, v in dims if k not in fixed]


def search(dims: list[tuple[str, tuple]], measure, budget_s: float, clock=time.monotonic,
           extra_s=lambda settings: 0.0, say=lambda line: None) -> dict:
    """Coordinate search from the defaults. ``measure(settings)`` -> a trial: ``status`` ("ok" or why not), ``median``,
    ``ci95``, ``seconds`` (what it took). A candidate replaces the incumbent only when its interval lies above the
    incumbent's (``above``); the batch is doubled only while each doubling wins. A candidate is started only when
    the slowest ok trial so far plus ``extra_s(settings)`` fits in what is left of ``budget_s``."""
    from bench.core.tune import describe

    start = clock()
    best = {**measure({}), "settings": {}}
    best["verdict"] = "the starting point" if best["status"] == "ok" else f"{best['status']}: {best.get('reason')}"
    trials = [best]
    say(line(best))
    if best["status"] != "ok":
        return {"default": best, "best": None, "trials": trials, "spent_s": clock() - start}
    for key, values in dims:
        for value in values:
            settings = {**best["settings"], key: value}
            need = max(t["seconds"] for t in trials if t["status"] == "ok") + extra_s(settings)
            left = budget_s - (clock() - start)
            if need > left:
                trials.append({"settings": settings, "status": "not run", "median": None, "ci95": None, "seconds": 0.0,
                               "verdict": f"not run: about {need:.0f} s needed, {max(0.0, left):.0f} s of the budget "
                                          "left"})
                say(line(trials[-1]))
                continue
            t = {**measure(settings), "settings": settings}
            if t["status"] != "ok":
                t["verdict"] = f"{t['status']}: {t.get('reason')}"
            elif above(t, best):
                t["verdict"] = f"faster than {describe(best['settings'])} beyond the intervals: the new best"
            else:
                t["verdict"] = f"not faster than {describe(best['settings'])} beyond the intervals"
            trials.append(t)
            say(line(t))
            if t["status"] == "ok" and above(t, best):
                best = t
            elif key == "batch_size":
                break  # a larger batch that does not win (or does not fit) ends the doubling
    return {"default": trials[0], "best": best, "trials": trials, "spent_s": clock() - start}


def line(t: dict) -> str:
    from bench.core.tune import describe

    got = (f"{t['median']:,.1f}/s (95% CI {t['ci95'][0]:,.1f}-{t['ci95'][1]:,.1f})" if t.get("median") is not None
           else "")
    return f"  {describe(t['settings'])}: {got}{'; ' if got else ''}{t['verdict']}"


# -- the command ---------------------------------------------------------------------------------------------------------

def argv_of(args: argparse.Namespace, drop: tuple = ()) -> list[str]:
    """``bench run``'s command line for the flags ``args`` sets away from their defaults (the ones in ``drop`` left
    out): what every candidate shares."""
    from bench.commands._plan import add_run_arguments

    p = argparse.ArgumentParser(add_help=False)
    add_run_arguments(p)
    out = []
    for a in p._actions:
        if not a.option_strings or a.dest in drop:
            continue
        value = getattr(args, a.dest, a.default)
        if value == a.default or value is None:
            continue
        out += [a.option_strings[0]] if isinstance(a, argparse._StoreTrueAction) else [a.option_strings[0], str(value)]
    return out


def flags_of(settings: dict) -> list[str]:
    """A trial's settings as ``bench run`` flags (bench/core/knobs.py gives each knob's flag)."""
    import backends

    flag = {k.key: k.flag for k in backends.knobs()}
    out = []
    for key, value in settings.items():
        if key in ("batch_size", "warmup"):
            out += [f"--{key.replace('_', '-')}", str(value)]
        elif key == "cudnn_benchmark":
            out += ["--cudnn-benchmark", str(value)]
        elif value is True:
            out.append(flag[key])
        else:
            out += [flag[key], f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def cmd_tune(args) -> int:
    import backends
    from bench import launch
    from bench.commands._plan import check_writable, parse_run, plan
    from bench.core import environment, results, tune, workloads
    from bench.core.devices import detect_device

    given = [f"--{k.replace('_', '-')}" for k in NOT_WITH_TUNE if getattr(args, k, None) not in (None, False)]
    if given:
        raise UsageError(f"bench tune runs one timed run per candidate; {', '.join(given)} is for bench run")
    if not args.budget_s > 0:
        raise UsageError(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    device_type, present = detect_device(args.device)
    if args.gpus and "," in args.gpus:
        raise UsageError(f"--gpus {args.gpus}: bench tune searches at one world size (give one number)")
    world = int(args.gpus) if args.gpus else (present if device_type == "cuda" else 1)
    names = [n.strip() for n in (args.backends.split(",") if args.backends != "all" else backends.names()) if n.strip()]
    base = argv_of(args, drop=("backends", "gpus", "max_gpus", "results"))
    plan(parse_run([*base, "--backends", ",".join(names), "--gpus", str(world), "--results", args.results]))  # checks
    fixed = {"cudnn_benchmark"} if args.cudnn_benchmark is not None else set()  # --batch-size: where the batch starts
    fixed |= {k.key for k in backends.knobs() if getattr(args, k.dest, None) not in k.off + (None,)}
    raw = Path(args.results) / "tune" / "raw"
    check_writable(raw)
    env_meta = environment.collect_env(backends.environment(names))
    start, summaries, first = time.monotonic(), [], None
    stamp = results.new_run_id("tune", world).split("-tune")[0]
    for i, name in enumerate(names):
        backend = backends.create(name)
        n = min(world, backend.world_size_limit(device_type)[0] or world)
        run_args = [*base, "--backends", name, "--gpus", str(n), "--results", str(raw)]

        def configure(settings, run_args=run_args):
            configs, _ = plan(parse_run([*run_args, *flags_of(settings)]))
            return configs[0]  # the backend's own run (DataParallel's labelled cudnn.benchmark-off variant comes after)

        try:
            cfg0 = configure({})
        except UsageError as e:
            summaries.append({"backend": name, "world_size": n, "status": "skipped", "reason": str(e)})
            continue
        first = first or cfg0
        why = backend.unavailable(cfg0)
        if why:
            print(f"tune {name}: skipped: {why}", file=sys.stderr)
            summaries.append({"backend": name, "world_size": n, "status": "skipped", "reason": why})
            continue

        def measure(settings, configure=configure, backend=backend):
            try:
                cfg = configure(widen_warmup(settings, configure))
            except UsageError as e:
                return {"status": "refused", "reason": str(e), "median": None, "ci95": None, "seconds": 0.0}
            t0 = time.monotonic()
            rec = launch.run_one(cfg, raw, env_meta, backend)
            got = {"status": rec["status"], "reason": rec.get("reason"), "median": rec.get("throughput"),
                   "ci95": rec.get("throughput_ci95"), "run_id": rec["run_id"], "seconds": time.monotonic() - t0,
                   "unit": f"{workloads.sample_unit(rec)}/s"}
            return got

        left = args.budget_s - (time.monotonic() - start)
        budget = left / (len(names) - i)  # an even share of what is left: a backend that finished early gives back
        print(f"tune {name} x{n} ({budget:.0f} s of the budget):", flush=True)
        kind = cfg0.workload.kind
        dims = dimensions({k.key for k in backend.knobs}, fixed, device_type, kind, cfg0.batch_size)
        found = search(dims, measure, budget, extra_s=lambda s: COMPILE_EXTRA_S[device_type] if s.get("compile") else 0,
                       say=lambda text: print(text, flush=True))
        best = found["best"]
        command = None if best is None else shlex.join(
            ["python", "-m", "bench", "run", *run_args[:-2], *flags_of(widen_warmup(best["settings"], configure))])
        summaries.append({"backend": name, "world_size": n, "status": "ok" if best else "failed",
                          "reason": None if best else found["default"].get("reason"), "budget_s": budget,
                          "spent_s": found["spent_s"], "default": found["default"], "best": best, "command": command,
                          "trials": found["trials"]})
    doc = {"schema": tune.TUNE_SCHEMA, "kind": "tune", "created_at": results.utc_now(), "budget_s": args.budget_s,
           "spent_s": time.monotonic() - start, "device_type": device_type,
           "hardware": results.hardware({"device_type": device_type, "env": env_meta}), "world_size": world,
           "workload": {k: getattr(first, k, None) for k in (*workloads.FIELDS, "precision", "data")}
           if first else None, "shared_flags": base, "backends": summaries, "env": env_meta}
    target = tune.path(args.results, stamp)
    results.write_json_atomic(doc, target)
    print(table(doc))
    for s in summaries:
        if s.get("command"):
            print(f"{s['backend']}: {s['command']}")
    print(f"tune: {target}")
    return 0 if all(s["status"] != "failed" for s in summaries) else 1


def widen_warmup(settings: dict, configure) -> dict:
    """--compile needs a longer warm-up than the defaults may give (Backend.min_warmup): raise it for that trial."""
    if not settings.get("compile"):
        return settings
    try:
        configure(settings)
        return settings
    except UsageError as e:
        import re

        least = re.search(r"use at least (\d+)", str(e))
        if not least:
            raise
        return {**settings, "warmup": int(least.group(1))}


def table(doc: dict) -> str:
    """Each backend at the shared defaults and at its best, as a Markdown table."""
    from bench.core.text import md_table
    from bench.core.tune import describe

    rows = []
    for s in doc["backends"]:
        if s["status"] == "skipped":
            rows.append([s["backend"], s["world_size"], None, None, None, f"skipped: {s['reason']}"])
            continue
        d, b = s["default"], s["best"]
        thr = lambda t: None if not t or t.get("median") is None else (  # noqa: E731
            f"{t['median']:,.1f} {t.get('unit', '/s')} ({t['ci95'][0]:,.1f}–{t['ci95'][1]:,.1f})")
        gain = f"{b['median'] / d['median']:.2f}×" if b and d.get("median") else None
        rows.append([s["backend"], s["world_size"], thr(d), thr(b), gain,
                     describe(b["settings"]) if b else f"failed: {s['reason']}"])
    return md_table(["backend", "world size", "at the shared defaults", "at its best", "best / defaults",
                     "best settings"], rows, {1, 4})

"""``python -m bench tune``: each backend's fastest configuration, found within a time budget.

Per backend, the settings a user would try, one at a time from the shared defaults (coordinate search): the batch
(doubled while it wins), channels_last (vision models), cuDNN's benchmark flag (GPUs), the backend's own knobs that
trade speed (DDP's bucket size, gradient_as_bucket_view and static_graph; FSDP2's reshard policy) and ``--compile``
last (the costliest to try). Every other ``bench run`` flag given here (model, precision, windows, ...) is shared by
all candidates; a knob given on the command line is fixed, not searched (``--batch-size`` is where the batch search
starts).

It follows the suite's rules:

- **The sweep's configurations.** The backends and world sizes are ``bench run``'s plan for the same flags: each
  backend at the largest world size the sweep runs it at (on CPU ``single`` at 1, the others at the sweep's top), with
  the sweep's share of the cores; ``--gpus 1,2`` tunes at each size listed.
- **The same records.** Each candidate is one ``bench run`` of that configuration (its own process tree, the machine
  watched around it: bench/plan/measure.py), so its record in RESULTS/tune/raw carries ``machine``,
  ``disturbed`` and ``disturbed_reasons`` like a sweep's. A candidate replaces the incumbent only when its 95% interval
  lies above the incumbent's and neither run was disturbed, so neither noise nor a busy machine picks a "best".
- **The budget.** A trial is started only when it can finish in what is left of its backend's share (an even share of
  what is left): 1.25 x the slowest trial so far, plus what compiling adds; a backend's first trial is estimated from
  the others' (the very first starts). No trial may outlast the whole budget: its time limit is what is left of it.

- **Presets.** ``--preset gpu-best`` (PRESETS) is the question one GPU answers first: single, ddp and fsdp2 at one GPU
  on ResNet-50 and gpt-350m at bf16 (fp16 where the GPU lacks it), each from the GPU sweep's starting point (ResNet-50
  at batch 256 with channels_last, gpt-350m at 8 sequences), --compile tried first (the largest lever published:
  torchtitan's), then the batch and the backend's own knobs, windows of 1 s, in 540 s. Every flag given wins.

Each backend's best is written as a reusable ``bench run`` command line, and all of it to RESULTS/tune/summary-*.json
(bench/core/tune.py), which the report reads ("At their best (bench tune)", and one line of the verdict); ``bench report``
reads a folder of tune results alone too. Exit codes: 0, 1 when a backend's starting point failed, 2 bad input or
nothing to tune here, 3 when a trial was disturbed (nothing failed, but the search decided nothing on it), 130."""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from bench.core.config import RunConfig
from bench.core.errors import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, UsageError

DEFAULT_BUDGET_S = 600.0
BATCH_STEPS = 3  # at most 2x, 4x, 8x the default batch (doubling stops at the first that does not win)
# the common settings a user tries besides the default; a backend's own come from it (Backend.tune_space)
TRY = {"channels_last": (True,), "compile": (True,)}
# What compiling adds to a run, for the budget's estimate. CUDA's is not measured yet: ResNet-50's and gpt-350m's first
# compile on an H100-class GPU is taken to be tens of seconds (the record's compile_seconds will say: the GPU evidence's
# tune run, scripts/gpu_evidence.sh, records each --compile trial's)
COMPILE_EXTRA_S = {"cpu": 60.0, "cuda": 45.0}
# A trial is started only when this many times the slowest ok trial so far (plus what compiling adds) fits in what is
# left: trials of one backend vary (a doubled batch, a busy machine), and a budget is a promise
ESTIMATE_MARGIN = 1.25
NOT_WITH_TUNE = ("find_max_batch", "find_max_model", "reference", "resume", "trace", "external", "repeat")
# --preset NAME: flags filled where the user gave none. ``batches``: each workload's starting batch; ``first``: the
# settings tried first (in the order of what they are expected to give). gpu-best: single, ddp and fsdp2 at their best on
# one GPU, for the GPU evidence (issue 63). Its budget is what 6 targets need for a starting trial (about 20 s on one
# GPU: a process tree's start, 13-28 s in the GPU check) and a --compile trial each (1.25 x that + COMPILE_EXTRA_S, 70
# s): 540 s, 90 s a target where none finishes early; 300 s would hold no --compile trial. A trial runs only when its
# estimate fits what is left, so --budget-s buys the batch and the backends' own knobs after --compile
PRESETS: dict[str, dict] = {
    "gpu-best": {"backends": "single,ddp,fsdp2", "model": "resnet50,gpt-350m", "gpus": "1", "budget_s": 540.0,
                 "window_s": 1.0, "windows": 3, "channels_last": True, "batches": {"resnet50": 256, "gpt-350m": 8},
                 "first": ("compile",), "device": "cuda"},
}


def register(sub) -> None:
    from bench.plan.sweep import add_run_arguments

    t = sub.add_parser("tune", help="each backend's fastest configuration within a time budget (batch, channels_last, "
                                    "--compile, cuDNN benchmark, its own knobs), as a reusable bench run command")
    t.add_argument("--budget-s", type=float,
                   help=f"seconds for the whole search, shared by the backends (default {DEFAULT_BUDGET_S:g}; a "
                        "preset's own)")
    t.add_argument("--preset", help=f"a search made for a question ({', '.join(PRESETS)}): gpu-best is single, ddp "
                                    "and fsdp2 on one GPU, ResNet-50 and gpt-350m, --compile first, 540 s; every flag "
                                    "given wins")
    add_run_arguments(t)
    t.set_defaults(func=cmd_tune)


# -- the search (pure: measure and clock are given) --------------------------------------------------------------------

def above(candidate: dict, incumbent: dict) -> bool:
    """Whether ``candidate``'s 95% interval lies wholly above ``incumbent``'s: faster beyond the noise."""
    return bool(candidate.get("ci95") and incumbent.get("ci95")) and candidate["ci95"][0] > incumbent["ci95"][1]


def dimensions(name: str, fixed: set[str], device_type: str, kind: str, batch: int,
               first: tuple[str, ...] = ()) -> list[tuple[str, tuple]]:
    """What to try for backend ``name``, in order: (setting, the values to try besides the default): the batch,
    channels_last, cuDNN's search, then the backend's own search space (``Backend.tune_space``, declared in its file:
    a new backend brings its own), --compile last; the settings in ``first`` (a preset's) before the others.
    ``fixed``: settings the user gave."""
    import backends

    backend = backends.create(name)
    knob_keys = {k.key for k in backend.knobs}
    dims = []
    if "batch_size" not in fixed:
        dims.append(("batch_size", tuple(batch * 2 ** i for i in range(1, BATCH_STEPS + 1))))
    if "channels_last" in knob_keys and kind == "vision":
        dims.append(("channels_last", TRY["channels_last"]))
    if device_type == "cuda" and "cudnn_benchmark" not in fixed:
        dims.append(("cudnn_benchmark", ("off",)))
    dims += [(k, values) for k, values in backend.tune_space().items() if k in knob_keys]
    if "compile" in knob_keys:
        dims.append(("compile", TRY["compile"]))
    dims = [d for k in first for d in dims if d[0] == k] + [d for d in dims if d[0] not in first]
    return [(k, v) for k, v in dims if k not in fixed]


def search(dims: list[tuple[str, tuple]], measure, budget_s: float, clock=time.monotonic,
           extra_s=lambda settings: 0.0, say=lambda line: None, first_s: float | None = None,
           unit: str = "/s") -> dict:
    """Coordinate search from the defaults. ``measure(settings)`` -> a trial: ``status`` ("ok" or why not), ``median``,
    ``ci95``, ``seconds`` (what it took), ``disturbed``. A trial is started only when it can finish in what is left of
    ``budget_s``: its estimate is
    ``ESTIMATE_MARGIN`` x the slowest ok trial so far (``first_s`` for the first, from other backends' trials; none
    known, it starts) plus ``extra_s(settings)``. A candidate replaces the incumbent only when its interval lies above
    the incumbent's (``above``) and neither run was disturbed (a busy machine, not the setting, would have decided it);
    the batch is doubled only while each doubling wins."""
    from bench.core.tune import describe

    start = clock()
    trials: list[dict] = []

    def fits(settings: dict, known: float | None) -> tuple[bool, float | None, float]:
        left = budget_s - (clock() - start)
        need = None if known is None else ESTIMATE_MARGIN * known + extra_s(settings)
        return need is None or need <= left, need, left

    def not_run(settings: dict, need: float, left: float) -> dict:
        return {"settings": settings, "status": "not run", "median": None, "ci95": None, "seconds": 0.0,
                "verdict": f"not run: about {need:.0f} s needed, {max(0.0, left):.0f} s of the budget left"}

    ok, need, left = fits({}, first_s)
    if not ok:
        best = not_run({}, need, left)
        say(line(best, unit))
        return {"default": best, "best": None, "trials": [best], "spent_s": clock() - start}
    best = {**measure({}), "settings": {}}
    best["verdict"] = ("the starting point" if best["status"] == "ok" else f"{best['status']}: {best.get('reason')}") \
        + disturbed_note(best)
    trials.append(best)
    say(line(best, unit))
    if best["status"] != "ok":
        return {"default": best, "best": None, "trials": trials, "spent_s": clock() - start}
    for key, values in dims:
        for value in values:
            settings = {**best["settings"], key: value}
            ok, need, left = fits(settings, max(t["seconds"] for t in trials if t["status"] == "ok"))
            if not ok:
                trials.append(not_run(settings, need, left))
                say(line(trials[-1], unit))
                continue
            t = {**measure(settings), "settings": settings}
            wins = t["status"] == "ok" and above(t, best) and not t.get("disturbed") and not best.get("disturbed")
            if t["status"] != "ok":
                t["verdict"] = f"{t['status']}: {t.get('reason')}"
            elif wins:
                t["verdict"] = f"faster than {describe(best['settings'])} beyond the intervals: the new best"
            elif above(t, best):
                t["verdict"] = (f"faster than {describe(best['settings'])} beyond the intervals, but not judged: "
                                "disturbed runs decide nothing")
            else:
                t["verdict"] = f"not faster than {describe(best['settings'])} beyond the intervals"
            t["verdict"] += disturbed_note(t)
            trials.append(t)
            say(line(t, unit))
            if wins:
                best = t
            elif key == "batch_size":
                break  # a larger batch that does not win (or does not fit) ends the doubling
    return {"default": trials[0], "best": best, "trials": trials, "spent_s": clock() - start}


def disturbed_note(t: dict) -> str:
    return f" (⚠ disturbed: {t['disturbed_reasons'][0]})" if t.get("disturbed") and t.get("disturbed_reasons") else \
        " (⚠ disturbed)" if t.get("disturbed") else ""


def line(t: dict, unit: str = "/s") -> str:
    """A trial on the console, its throughput in the run's own unit: "  batch 16: 140.2 img/s (95% CI ...); ..."."""
    from bench.core.tune import describe

    unit = t.get("unit") or unit
    got = (f"{t['median']:,.1f} {unit} (95% CI {t['ci95'][0]:,.1f}-{t['ci95'][1]:,.1f})" if t.get("median") is not None
           else "")
    return f"  {describe(t['settings'])}: {got}{'; ' if got else ''}{t['verdict']}"


# -- the command ---------------------------------------------------------------------------------------------------------

def argv_of(args: argparse.Namespace, drop: tuple = ()) -> list[str]:
    """``bench run``'s command line for the flags ``args`` sets away from their defaults (the ones in ``drop`` left
    out): what every candidate shares."""
    from bench.plan.sweep import add_run_arguments

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


def targets(configs: list, every_size: bool) -> list:
    """What to tune: the sweep's own configurations (``bench run``'s plan for the same flags), one per backend, workload
    and world size (the backend's own run, not DataParallel's labelled cudnn.benchmark-off variant). Without
    ``--gpus``, each backend at the largest world size the sweep runs it at (on CPU: single at 1, the others at the
    sweep's top); with ``--gpus``, at each size listed."""
    own: dict[tuple, RunConfig] = {}
    for c in configs:
        if c.cudnn_benchmark is not False:
            own.setdefault((c.backend, c.model, c.world_size), c)
    if every_size:
        return list(own.values())
    top: dict[tuple, RunConfig] = {}
    for (name, model, n), c in own.items():
        if (name, model) not in top or n > top[(name, model)].world_size:
            top[(name, model)] = c
    return list(top.values())


def apply_preset(args) -> dict:
    """Fill from ``--preset`` what the user did not give (every flag given wins); the preset, or {} without one."""
    if not args.preset:
        return {}
    if args.preset not in PRESETS:
        raise UsageError(f"--preset {args.preset!r}: unknown preset; choose from {', '.join(PRESETS)}")
    preset = PRESETS[args.preset]
    for key in ("backends", "model", "budget_s", "window_s", "windows"):
        if getattr(args, key, None) is None and not (key == "window_s" and args.steps is not None):
            setattr(args, key, preset[key])
    if args.device == "auto":
        args.device = preset["device"]
    if not args.gpus and not args.max_gpus:
        args.gpus = preset["gpus"]
    if args.precision is None and preset["device"] == "cuda":
        from bench.plan.sweep import gpu_precision

        args.precision = gpu_precision()
    return preset


def cmd_tune(args) -> int:
    import dataclasses

    import backends
    from bench import launch
    from bench.plan.measure import run_watched
    from bench.plan.sweep import check_writable, parse_run, plan, skip_reason
    from bench.core import environment, peak, results, tune, workloads

    start = time.monotonic()
    given = [f"--{k.replace('_', '-')}" for k in NOT_WITH_TUNE if getattr(args, k, None) not in (None, False)]
    if given:
        raise UsageError(f"bench tune runs one timed run per candidate; {', '.join(given)} is for bench run")
    preset = apply_preset(args)
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S
    if not args.budget_s > 0:
        raise UsageError(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    base = argv_of(args, drop=("backends", "gpus", "max_gpus", "results", "model", "preset", "budget_s"))
    sizes = ["--gpus", args.gpus] if args.gpus else ["--max-gpus", args.max_gpus] if args.max_gpus else []
    models = ["--model", args.model] if args.model else []
    # bench run's own plan for these flags: every check, and the world sizes and thread shares the sweep would use
    configs, _ = plan(parse_run([*base, *models, "--backends", args.backends, *sizes, "--results", args.results]))
    todo = targets(configs, every_size=bool(args.gpus))
    why = {(c.backend, c.model, c.world_size): skip_reason(c) for c in todo}
    if all(why.values()):
        parts: dict[str, list[str]] = {}
        for (name, _, n), reason in why.items():
            parts.setdefault(reason, []).append(f"{name} x{n}")
        raise UsageError(f"nothing to run: every backend to tune would be skipped here "
                         f"({'; '.join(', '.join(v) + ': ' + r for r, v in parts.items())})")
    device_type = todo[0].device_type
    fixed = {"cudnn_benchmark"} if args.cudnn_benchmark is not None else set()  # --batch-size: where the batch starts
    fixed |= {k.key for k in backends.knobs() if getattr(args, k.dest, None) not in k.off + (None,)}
    raw = Path(args.results) / "tune" / "raw"
    check_writable(raw)
    env_meta = environment.collect_env(backends.environment(c.backend for c in todo))
    # the records are a sweep's: the same writer, the machine watched, the measured peak as bench run asks for it
    measured_peak = None if getattr(args, "skip_peak", False) else {
        "cache": str(peak.cache_dir()), "refresh_since": results.utc_now() if args.refresh_peak else None}
    summaries, first, slowest, peak_warned = [], None, None, set()
    stamp = results.new_run_id("tune", max(c.world_size for c in todo)).split("-tune")[0]
    deadline = start + args.budget_s
    models_of = list(dict.fromkeys(c.model for c in todo))
    if preset:
        print(f"tune --preset {args.preset}: {len(todo)} targets ({', '.join(dict.fromkeys(c.backend for c in todo))} "
              f"x {', '.join(dict.fromkeys(c.model for c in todo))}) at {', '.join(sorted({str(c.world_size) for c in todo}))} "
              f"GPU(s), {todo[0].precision}, {args.budget_s:g} s: about {args.budget_s / len(todo):.0f} s each where "
              f"none finishes early; tried first: {', '.join(preset['first'])}", flush=True)
    for i, target in enumerate(todo):
        name, n = target.backend, target.world_size
        vision = target.workload.kind == "vision"
        start_at = []  # the preset's starting point for this workload, where the user gave none
        if preset and args.batch_size is None and target.model in preset["batches"]:
            start_at += ["--batch-size", str(preset["batches"][target.model])]
        if preset and preset.get("channels_last") and vision and args.channels_last is None:
            start_at.append("--channels-last")
        # of several workloads' flags, each takes its own (bench run's rule): --image-size the images', --seq-len the GPTs'
        shared = without(base, "--seq-len" if vision else "--image-size") if len(models_of) > 1 else base
        run_args = [*shared, "--model", target.model, *start_at, "--backends", name, "--gpus", str(n), "--results",
                    str(raw)]

        def configure(settings, run_args=run_args, target=target):
            configs, _ = plan(parse_run([*run_args, *flags_of(settings)]))
            # the backend's own run, with the sweep's share of the cores (a CPU sweep gives every rank the same)
            return dataclasses.replace(configs[0], threads=target.threads)

        reason = why[(name, target.model, n)]
        if reason:
            print(f"tune {name} x{n}: skipped: {reason}", file=sys.stderr)
            summaries.append({"backend": name, "model": target.model, "world_size": n, "status": "skipped",
                              "reason": reason})
            continue
        first = first or target

        def measure(settings, configure=configure):
            try:
                cfg = configure(widen_warmup(settings, configure))
            except UsageError as e:
                return {"status": "refused", "reason": str(e), "median": None, "ci95": None, "seconds": 0.0}
            normal = cfg.timeout or launch.default_timeout(cfg)
            cap = min(normal, max(1.0, deadline - time.monotonic()))  # no trial outlasts the whole budget
            t0 = time.monotonic()
            rec = run_watched(dataclasses.replace(cfg, timeout=cap), raw, env_meta, extra_spec={"peak": measured_peak})
            took = time.monotonic() - t0
            note = peak.warning(rec.get("peak_measured"))  # a peak measured under load: used, said once
            if note and note not in peak_warned:
                peak_warned.add(note)
                print(f"warning: {note}", file=sys.stderr)
            status, reason = rec["status"], rec.get("reason")
            if status == "failed" and cap < normal and took >= cap - 1.0:
                status, reason = "stopped", f"stopped at the end of the budget, after {took:.0f} s"
            return {"status": status, "reason": reason, "median": rec.get("throughput"),
                    "ci95": rec.get("throughput_ci95"), "run_id": rec["run_id"], "seconds": took,
                    "mfu_measured": rec.get("mfu_measured"), "mfu": rec.get("mfu"),
                    "unit": f"{workloads.sample_unit(rec)}/s", "disturbed": bool(rec.get("disturbed")),
                    "disturbed_reasons": rec.get("disturbed_reasons") or []}

        share = (deadline - time.monotonic()) / (len(todo) - i)  # an even share of what is left (early finishers give)
        unit = f"{workloads.sample_unit(target.to_dict())}/s"
        print(f"tune {name} x{n} {target.model} ({max(0.0, share):.0f} s of the budget):", flush=True)
        try:
            batch = configure({}).batch_size  # where the batch search starts: a preset's, the flag's or the default
        except UsageError:
            batch = target.batch_size  # the starting point is refused: its trial says why
        dims = dimensions(name, fixed | ({"channels_last"} if "--channels-last" in start_at else set()), device_type,
                          target.workload.kind, batch, preset.get("first", ()))
        found = search(dims, measure, share, clock=time.monotonic, first_s=slowest, unit=unit,
                       extra_s=lambda s: COMPILE_EXTRA_S[device_type] if s.get("compile") else 0,
                       say=lambda text: print(text, flush=True))
        ran = [t["seconds"] for t in found["trials"] if t["status"] == "ok"]
        slowest = max([*ran, slowest or 0.0]) or None
        best, default = found["best"], found["default"]
        command = None if best is None else shlex.join(
            ["python", "-m", "bench", "run", *reproduce(run_args[:-2], flags_of(widen_warmup(best["settings"], configure)))])
        status = "ok" if best else "not run" if default["status"] in ("not run", "stopped") else "failed"
        summaries.append({"backend": name, "model": target.model, "world_size": n, "status": status,
                          "reason": None if best else default.get("reason") or default.get("verdict"),
                          "budget_s": share, "spent_s": found["spent_s"], "default": default, "best": best,
                          "command": command, "trials": found["trials"],
                          "disturbed_trials": sum(bool(t.get("disturbed")) for t in found["trials"])})
    doc = {"schema": tune.TUNE_SCHEMA, "kind": "tune", "created_at": results.utc_now(), "budget_s": args.budget_s,
           "spent_s": time.monotonic() - start, "device_type": device_type,
           "hardware": results.hardware({"device_type": device_type, "env": env_meta}),
           "world_size": max(c.world_size for c in todo), "world_sizes": sorted({c.world_size for c in todo}),
           "workload": {k: getattr(first, k, None) for k in (*workloads.FIELDS, "precision", "data")}
           if first else None, "shared_flags": base, "backends": summaries, "env": env_meta}
    target_path = tune.path(args.results, stamp)
    results.write_json_atomic(doc, target_path)
    print(table(doc))
    for s in summaries:
        if s.get("command"):
            print(f"{s['backend']}: {s['command']}")
    print(f"tune: {target_path} ({doc['spent_s']:.0f} s of a {args.budget_s:g} s budget)")
    return exit_code(summaries)


def exit_code(summaries: list[dict]) -> int:
    """docs/command-line.md, "Exit codes": 1 when a backend's starting point failed; 3 when nothing failed but a trial
    was disturbed (its search decided nothing on it: re-run on a quiet machine); else 0."""
    if any(s["status"] == "failed" for s in summaries):
        return EXIT_FAILED
    if any(s.get("disturbed_trials") for s in summaries):
        return EXIT_INCONCLUSIVE
    return EXIT_OK


def without(argv: list[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def reproduce(shared: list[str], best: list[str]) -> list[str]:
    """The shared flags, less those the best settings give another value (``--batch-size 2`` where the best is
    ``--batch-size 4``: one flag, not two), then the best's."""
    given = {f for f in best if f.startswith("--")}
    out, i = [], 0
    while i < len(shared):
        if shared[i] in given:
            i += 1 if i + 1 >= len(shared) or shared[i + 1].startswith("--") else 2
            continue
        out.append(shared[i])
        i += 1
    return out + best


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


def mfu_pair(d: dict | None, b: dict | None) -> str | None:
    """MFU against the measured peak at the shared defaults and at the best: ``31.2% → 44.0%``."""
    def pct(t):
        return None if not t or t.get("mfu_measured") is None else f"{100 * t['mfu_measured']:.1f}%"

    got = [pct(d), pct(b)]
    return None if got == [None, None] else f"{got[0] or '—'} → {got[1] or '—'}"


def table(doc: dict) -> str:
    """Each backend at the shared defaults and at its best, as a Markdown table: per workload where there are several,
    with MFU against the measured peak at each."""
    from bench.core.text import md_table
    from bench.core.tune import describe

    rows = []
    for s in doc["backends"]:
        head = [s["backend"], s.get("model") or (doc.get("workload") or {}).get("model"), s["world_size"]]
        if s["status"] == "skipped":
            rows.append([*head, None, None, None, None, f"skipped: {s['reason']}"])
            continue
        d, b = s["default"], s["best"]
        thr = lambda t: None if not t or t.get("median") is None else (  # noqa: E731
            f"{t['median']:,.1f} {t.get('unit', '/s')} ({t['ci95'][0]:,.1f}–{t['ci95'][1]:,.1f})")
        gain = f"{b['median'] / d['median']:.2f}×" if b and d.get("median") else None
        note = f" (⚠ {s['disturbed_trials']} disturbed trial(s))" if s.get("disturbed_trials") else ""
        rows.append([*head, thr(d), thr(b), gain, mfu_pair(d, b),
                     (describe(b["settings"]) if b else f"{s['status']}: {s['reason']}") + note])
    return md_table(["backend", "workload", "world size", "at the shared defaults", "at its best", "best / defaults",
                     "MFU (measured peak) defaults → best", "best settings"], rows, {2, 5})

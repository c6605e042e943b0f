"""When a number should not be believed: every threshold in one place, and the pure logic that turns a run's machine
state and a sweep's figures into warnings (docs/measuring.md, "Warnings: when not to believe a number").

A warning is a dict: ``kind`` (one of KINDS, its key), ``subject`` (the configuration or run it is about), ``reason``
(what was seen, with the figure and the limit), ``advice`` (what to do), ``field`` (the figure it casts doubt on, so a
table can mark that cell), ``key`` (``results.config_key`` of the configuration, where it has one), ``figures`` (the
numbers it is about, in the unit of ``SUMMARY``'s line), and for a disturbed configuration ``runs`` (how many of its
runs) and ``also`` (a held or throttled GPU, in a few words). ``by_kind`` folds a list of them into one line per kind,
with counts and the range of the figures: what the verdict's first screen shows. The harness measures the machine
(bench/launch/machine.py); this module only judges, so the console, the report, the verdict and the gate all judge
alike.
"""
from __future__ import annotations

from bench.core import workloads

# ---------------------------------------------------------------------------------------------------
# The thresholds (docs/measuring.md: the table under "Warnings" says why each was chosen).

# A run is *disturbed* when processes outside its own tree used more than this share of the CPUs the run may use
# (its affinity mask), time-weighted over its timed windows (or its compute-only windows). A quiet machine's
# daemons use well under 2%; one busy loop on a 2-core machine is 50%, on a 16-core one 6%.
OTHERS_CPU_SHARE = 0.10
# On CPU runs the ranks' threads occupy every core, so a rank that shares its core with another process slows
# down, and the slowest rank sets every window's pace: there half a core of others is enough, whatever the count.
OTHERS_CPU_CORES_ON_CPU = 0.5
# NVML's clock-event reasons (nvmlClocksEventReason*), by bit. Only the ones that mean the GPU was slowed by
# something outside the run disturb it: hardware slowdown (HW_SLOWDOWN, an external power-brake signal, thermal
# limits). SW_POWER_CAP is not among them: a GPU at full load runs at its power limit by design, every run alike.
# GPU_IDLE, APPLICATIONS_CLOCKS, SYNC_BOOST and DISPLAY_CLOCKS are settings or states, not disturbances.
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clocks"}
THROTTLE_DISTURBS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
# Run-to-run coefficient of variation of a configuration's run medians above which its figure is *unstable*. On a
# GPU the regression gate looks for 5% changes, so a spread above 5% hides exactly what it looks for; CPU runs
# share cores with the OS and each other and repeat within 5-15% on a quiet machine.
CV_RUNS_MAX = {"cuda": 0.05, "cpu": 0.15}
# Scaling efficiency against a world-size-1 baseline: above 105% N devices did more than N times the work of one
# (with a fixed per-device batch, only a baseline that ran slow does that; 5% is the run-to-run noise of a quiet
# machine); below 0 is arithmetic nonsense.
EFFICIENCY_MAX_PCT = 105.0
EFFICIENCY_MIN_PCT = 0.0
# The scaling loss split (communication, everything else) as fractions of the ideal N x single@1: a component
# below -5% (the same slack) says the compute-only reference and the run were measured under different conditions.
LOSS_MIN = -0.05
# At world size 1 every backend trains the same model on one device as `single` (DDP, Horovod and the hand-written
# all-reduce have nothing to communicate, dp calls the module). Wrappers cost a few percent, sharding hooks up to
# ~15%; runs further apart than this factor measured the machine, not the backend.
SAME_COMPUTATION_RATIO = 1.25
# The first timed window more than this factor slower than the median of the others (with >= 3 windows): the
# warm-up did not reach steady state (hyperfine warns on a first run much slower than the rest).
FIRST_WINDOW_RATIO = 1.5
# Options that change the computation on one device (matched when comparing a backend at 1 with single@1).
COMPUTE_OPTIONS = ("compile", "channels_last")

DISTURBED, UNSTABLE, EFFICIENCY, LOSS, SAME_COMPUTATION, FIRST_WINDOW = (
    "disturbed", "unstable", "impossible efficiency", "negative loss component", "same computation apart",
    "slow first window")
KINDS = (DISTURBED, UNSTABLE, EFFICIENCY, LOSS, SAME_COMPUTATION, FIRST_WINDOW)

ADVICE = {
    DISTURBED: "re-run it on a quiet machine (`bench run --wait-quiet-s` waits for one); the verdict names no winner "
               "from disturbed runs and the regression gate calls them inconclusive (exit 3)",
    UNSTABLE: "repeat with more runs (`--repeat 5`), longer windows (`--steps`), or on a quieter machine "
              "(`--wait-quiet-s`); differences smaller than this spread are not established",
    EFFICIENCY: "check the baseline's own warnings and re-run it (`--repeat 3 --wait-quiet-s`): a baseline that ran slow "
                "makes every efficiency built on it too high",
    LOSS: "the compute-only reference and the run were measured under different conditions: re-run on a quiet "
          "machine (`--repeat 3 --wait-quiet-s`) before reading the split",
    SAME_COMPUTATION: "re-run both (`--repeat 3 --wait-quiet-s`); at world size 1 the difference should be the wrapper's "
                      "few percent",
    FIRST_WINDOW: "raise `--warmup` (the warm-up did not reach steady state: compilation, autotuning, allocation) or "
                  "re-run",
}


# One line per kind for the verdict's first screen (``by_kind``): what is counted, what the figures are, what to do.
# {n}: runs (disturbed) or configurations; {range}: the figures' range; {total}: ok runs in the report.
SUMMARY = {
    DISTURBED: ("{n} of {total} runs", "other processes used {range}% of the CPUs", "re-run with `--wait-quiet-s`"),
    UNSTABLE: ("{n} configuration{s}", f"run-to-run CV {{range}}% (limit {100 * CV_RUNS_MAX['cuda']:.0f}% on GPUs, "
               f"{100 * CV_RUNS_MAX['cpu']:.0f}% on CPUs)", "repeat with `--repeat 5`"),
    EFFICIENCY: ("{n} configuration{s}", f"scaling efficiency {{range}}% (limits {EFFICIENCY_MIN_PCT:g} and "
                 f"{EFFICIENCY_MAX_PCT:g}%), not shown", "re-run the baseline with `--repeat 3 --wait-quiet-s`"),
    LOSS: ("{n} configuration{s}", f"scaling-loss or exposed shares of {{range}}% (limit {100 * LOSS_MIN:.0f}%), not "
           "shown", "re-run with `--wait-quiet-s`"),
    SAME_COMPUTATION: ("{n} backend{s} at world size 1", f"{{range}}x single's throughput (limit "
                       f"{SAME_COMPUTATION_RATIO:g}x either way)", "re-run both with `--repeat 3 --wait-quiet-s`; `--trace` "
                       "says where the time goes"),
    FIRST_WINDOW: ("{n} configuration{s}", f"first timed window {{range}}x the others (limit {FIRST_WINDOW_RATIO:g}x)",
                   "raise `--warmup`"),
}


def warning(kind: str, subject: str, reason: str, field: str, key=None, advice: str | None = None,
            figures=(), runs: int | None = None, also=()) -> dict:
    return {"kind": kind, "subject": subject, "reason": reason, "advice": advice or ADVICE[kind], "field": field,
            "key": key, "figures": [float(x) for x in figures], "runs": runs, "also": list(also)}


def text(w: dict) -> str:
    """One line: ``⚠ SUBJECT: REASON; what to do: ADVICE``."""
    return f"⚠ {w['subject']}: {w['reason']}; what to do: {w['advice']}"


def span(values, unit: str = "") -> str:
    """``36-64`` (rounded as the line shows them; ``-706 to -64`` below zero), or one value when all round alike."""
    digits = 2 if unit == "x" else 0 if max(abs(v) for v in values) >= 10 else 1
    lo, hi = (f"{v:.{digits}f}" for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo} to {hi}" if lo.startswith("-") else f"{lo}-{hi}"


def by_kind(found: list[dict], total_runs: int) -> list[str]:
    """One line per kind of warning, in KINDS order: ``⚠ KIND: COUNT: FIGURES; WHAT TO DO``. Disturbed counts runs
    (of ``total_runs``), the others configurations; the figures' range spans every warning of the kind."""
    out = []
    for kind in KINDS:
        mine = [w for w in found if w["kind"] == kind]
        if not mine:
            continue
        count, what, advice = SUMMARY[kind]
        n = (sum(w.get("runs") or 1 for w in mine) if kind == DISTURBED else
             len({(w["key"], w["subject"]) for w in mine}))
        figures = [x for w in mine for x in w.get("figures") or []]
        parts = [what.format(range=span(figures, "x" if kind == SAME_COMPUTATION else ""))] if figures else []
        parts += sorted({x for w in mine for x in w.get("also") or []})  # disturbed: GPUs held or throttled
        if not parts:  # a record without the machine's figures: its reason as it was judged
            parts = [mine[0]["reason"].split(" disturbed: ", 1)[-1]]
        head = count.format(n=n, total=total_runs, s="s" if n != 1 else "")
        out.append(f"⚠ {kind}: {head}: {'; '.join(parts)}; {advice}")
    return out


def disturbed_brief(rec: dict) -> str:
    """A disturbed run in a few words, for a progress line: ``others used 48% of the CPUs``."""
    share = others_share(rec)
    words = [f"others used {share:.0f}% of the CPUs"] if share is not None else []
    words += _gpu_words((rec.get("machine") or {}).get("gpus") or [])
    return ", ".join(words) or "see the record's disturbed_reasons"


def others_share(rec: dict) -> float | None:
    """The largest share (%) of the run's CPUs that other processes used during its timed or compute-only windows,
    where that is among the reasons it is disturbed; None otherwise."""
    machine = rec.get("machine") or {}
    cpus = machine.get("cpus") or 1
    parts = [machine.get(part) for part in ("windows", "compute_only")]
    over = [p["others_cpu_share"] for p in parts if cpu_reason(p, cpus, rec.get("device_type"), "")]
    return 100 * max(over) if over else None


def _gpu_words(gpus: list[dict]) -> list[str]:
    words = []
    if any(g.get("other_processes") for g in gpus):
        words.append("another process on a GPU")
    if any(n in THROTTLE_DISTURBS for g in gpus for n in g.get("throttled") or []):
        words.append("a GPU throttled")
    return words


def subject(rec: dict) -> str:
    """A configuration as the console names it: ``ddp x2 fp32`` plus its knobs."""
    opts = [f"{k}={v}" for k, v in sorted((rec.get("options") or {}).items()) if v not in (None, False, "none")]
    if rec.get("cudnn_benchmark") is False:
        opts.append("cudnn.benchmark off")
    return f"{rec['backend']} x{rec['world_size']} {rec['precision']}" + (f" ({', '.join(opts)})" if opts else "")


# ---------------------------------------------------------------------------------------------------
# The machine around one run (measured by bench/launch/machine.py)

def throttle_names(mask: int | None) -> list[str]:
    return [] if not mask else [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def cpu_reason(part: dict | None, cpus: int, device_type: str, during: str) -> str | None:
    """Why others' CPU use during ``during`` disturbed the run, or None. ``part``: ``others_cpu_share`` (of the
    CPUs the run may use) and ``others_cpu_cores`` (core-equivalents), time-weighted over the span."""
    if not part or part.get("others_cpu_share") is None:
        return None
    share, cores = part["others_cpu_share"], part.get("others_cpu_cores") or 0.0
    over_share = share > OTHERS_CPU_SHARE
    over_cores = device_type == "cpu" and cores > OTHERS_CPU_CORES_ON_CPU
    if not (over_share or over_cores):
        return None
    limit = (f"limit {100 * OTHERS_CPU_SHARE:.0f}%" if over_share else
             f"limit {OTHERS_CPU_CORES_ON_CPU:g} core on a CPU run, whose ranks occupy every core")
    return (f"other processes used {100 * share:.0f}% of the {cpus} CPU{'s' if cpus != 1 else ''} "
            f"({cores:.2f} cores) during {during} ({limit})")


def gpu_reasons(gpus: list[dict], during: str) -> list[str]:
    out = []
    for g in gpus or []:
        others = g.get("other_processes") or []
        if others:
            pids = ", ".join(str(p) for p in others[:5]) + (" ..." if len(others) > 5 else "")
            out.append(f"another process held GPU {g.get('index')} during {during} (pid {pids})")
        bad = [n for n in g.get("throttled") or [] if n in THROTTLE_DISTURBS]
        if bad:
            out.append(f"GPU {g.get('index')} was throttled during {during} ({', '.join(bad)})")
    return out


def machine_reasons(machine: dict, device_type: str, windows: str | None = None) -> list[str]:
    """Why a run is disturbed (empty: it is not), from the machine state the harness recorded around it. ``windows``
    names the span the watch judged where it was not timed windows (a to-accuracy run's training)."""
    cpus = machine.get("cpus") or 1
    reasons = []
    for part, during in (("windows", windows or "the timed windows"), ("compute_only", "the compute-only windows")):
        why = cpu_reason(machine.get(part), cpus, device_type, during)
        if why:
            reasons.append(why)
    return reasons + gpu_reasons(machine.get("gpus") or [], windows or "the windows")


# ---------------------------------------------------------------------------------------------------
# Figures of one run, one configuration, one sweep

def first_window_ratio(window_seconds) -> float | None:
    """The first timed window's time over the median of the others; None with fewer than 3 windows."""
    import numpy as np

    w = [float(x) for x in window_seconds or []]
    if len(w) < 3 or min(w) <= 0:
        return None
    return w[0] / float(np.median(w[1:]))


def config_warnings(recs: list[dict], key=None) -> list[dict]:
    """Warnings about one configuration's ok runs: disturbed runs, a slow first window, an unstable figure."""
    from bench.core import stats

    recs = [r for r in recs if r.get("status") == "ok"]
    if not recs:
        return []
    who, n, out = subject(recs[0]), len(recs), []
    disturbed = [r for r in recs if r.get("disturbed")]
    if disturbed:  # the first disturbed run's reasons; every run's are in its record
        first = "; ".join(disturbed[0].get("disturbed_reasons") or []) or "no reason recorded"
        more = len(disturbed) - 1
        shares = [x for x in map(others_share, disturbed) if x is not None]
        gpus = {x for r in disturbed for x in _gpu_words((r.get("machine") or {}).get("gpus") or [])}
        out.append(warning(DISTURBED, who, f"{len(disturbed)} of {n} run{'s' if n > 1 else ''} disturbed: {first}"
                           + (f" (and {more} more disturbed run{'s' if more > 1 else ''}, reasons in the records)"
                              if more else ""), "throughput", key, figures=shares, runs=len(disturbed),
                           also=sorted(gpus)))
    slow = [x for x in (first_window_ratio(r.get("window_seconds")) for r in recs) if x and x > FIRST_WINDOW_RATIO]
    if slow:
        out.append(warning(FIRST_WINDOW, who, f"the first timed window took {max(slow):.1f}x the median of the others "
                           f"in {len(slow)} of {n} run{'s' if n > 1 else ''} (limit {FIRST_WINDOW_RATIO:g}x)",
                           "throughput", key, figures=slow))
    runs = stats.summarise_runs([stats.record_throughputs(r) for r in recs])  # the report's and the gate's CV
    cv, medians = runs["cv_runs"], runs["run_medians"]
    device = recs[0].get("device_type")
    limit = CV_RUNS_MAX.get(device, CV_RUNS_MAX["cuda"])
    if cv is not None and cv > limit:
        out.append(warning(UNSTABLE, who, f"run-to-run CV {100 * cv:.1f}% over {len(medians)} runs, above the "
                           f"{100 * limit:.0f}% a {'GPU' if device == 'cuda' else 'CPU'} run should repeat within",
                           "cv", key, figures=[100 * cv]))
    return out


def same_computation(who: str, thr: float, single_thr: float, unit: str, key=None, rate: str = "img/s") -> dict | None:
    """A backend at world size 1 against single@1 (the same computation): a warning when they are far apart."""
    if not thr or not single_thr:
        return None
    ratio = thr / single_thr
    if 1 / SAME_COMPUTATION_RATIO <= ratio <= SAME_COMPUTATION_RATIO:
        return None
    return warning(SAME_COMPUTATION, who, f"{thr:,.1f} {rate} is {ratio:.2f}x single at 1 {unit} ({single_thr:,.1f} "
                   f"{rate}), yet at world size 1 both train the same model on one device (limit "
                   f"{SAME_COMPUTATION_RATIO:g}x either way)", "throughput", key, figures=[ratio])


def efficiency(who: str, pct: float | None, baseline: str, field: str, device_type: str | None = None,
               key=None) -> dict | None:
    if pct is None or EFFICIENCY_MIN_PCT <= pct <= EFFICIENCY_MAX_PCT:
        return None
    if pct > EFFICIENCY_MAX_PCT:
        why = (f"scaling efficiency {pct:.0f}% vs {baseline}: above {EFFICIENCY_MAX_PCT:g}%, more than N times the "
               "work of one device")
        if device_type == "cpu":
            why += " (on CPU, a baseline whose threads scale worse than processes can also do it)"
    else:
        why = f"scaling efficiency {pct:.0f}% vs {baseline}: below {EFFICIENCY_MIN_PCT:g}%"
    return warning(EFFICIENCY, who, why, field, key, figures=[pct])


def loss_split(who: str, comm_loss: float | None, other_loss: float | None, key=None,
               exposed_share: float | None = None) -> list[dict]:
    """A component of the scaling loss below ``LOSS_MIN`` of the ideal, or exposed communication below ``LOSS_MIN`` of
    the step (the compute-only reference ran slower than the run it is the reference of)."""
    out = []
    for value, name, field in ((comm_loss, "scaling loss to communication", "comm_loss"),
                               (other_loss, "scaling loss to everything else", "other_loss")):
        if value is not None and value < LOSS_MIN:
            out.append(warning(LOSS, who, f"{name} is {100 * value:.1f}% of the ideal (below "
                               f"{100 * LOSS_MIN:.0f}%): a loss cannot be a gain", field, key, figures=[100 * value]))
    if exposed_share is not None and exposed_share < LOSS_MIN:
        out.append(warning(LOSS, who, f"exposed communication is {100 * exposed_share:.1f}% of the step (below "
                           f"{100 * LOSS_MIN:.0f}%): the compute-only reference ran slower than the run", "exposed",
                           key, figures=[100 * exposed_share]))
    return out


def _same_key(rec: dict, backend: str) -> tuple:
    """What must match for two runs at world size 1 to be the same computation."""
    from bench.core import results

    key = dict(zip(results.CONFIG_KEYS, results.config_key(rec)))
    key["backend"] = backend
    key["options"] = tuple((k, (rec.get("options") or {}).get(k)) for k in COMPUTE_OPTIONS)
    return tuple(key.items())


def sweep_warnings(records: list[dict]) -> list[dict]:
    """Every warning about a set of records, configuration by configuration (``config_warnings``), and each backend
    at world size 1 against single@1 (``same_computation``). Efficiency and the loss split are the report's."""
    from bench.core import results, stats

    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("status") == "ok" and not r.get("record_elsewhere") and r.get("window_seconds"):
            groups.setdefault(results.config_key(r), []).append(r)
    out, medians = [], {}
    for key, recs in groups.items():
        out += config_warnings(recs, key)
        medians[key] = stats.summarise_runs([stats.record_throughputs(r) for r in recs])["median"]
    singles = {_same_key(recs[0], "single"): medians[key] for key, recs in groups.items()
               if recs[0]["backend"] == "single" and recs[0]["world_size"] == 1}
    for key, recs in groups.items():
        r = recs[0]
        if r["world_size"] != 1 or r["backend"] == "single":
            continue
        unit = "GPU" if r.get("device_type") == "cuda" else "CPU worker"
        w = same_computation(subject(r), medians[key], singles.get(_same_key(r, "single")), unit, key,
                             f"{workloads.sample_unit(r)}/s")
        if w:
            out.append(w)
    return out

"""The plain twin of a run (``bench run --reference``): the vocabulary the planner, the launcher, the record and the
report share. No torch here.

A configuration's twin is the plainest PyTorch loop that trains the same workload (model, input shape, optimizer) at
the same precision, per-device batch, memory format, compile setting and synthetic batch on one device, with the same
warm-up, settle step and windows: ``bench/twins/<kind>.py``, a short file with no harness code in it. It runs as its
own process beside the harness's runs (interleaved with them under ``--repeat``), writes its window times as a small
JSON, and the harness keeps them as a twin record in ``RESULTS/reference``.

Each backend with a plain loop of its own short enough to write plainly (``Backend.twin_loop``: DDP's, FSDP2's as
torchtitan writes it, DeepSpeed's engine loop; ``bench/twins/ddp.py``, ``fsdp2.py``, ``ds_zero.py``, which the
workload's file runs through loop.py) gets that loop as a twin too, its ``loop`` settings in the twin record. A
world-size-1 run is then compared with both, which splits its gap from single into two parts:

    harness's part  = 1 - harness / its own twin         (the suite around that backend; > 0: the suite is slower)
    library's price = 1 - its own twin / the plain twin  (the backend's library at world size 1, outside the suite)

For single (the plain loop is its own) and for a backend with no loop of its own (dp, horovod, allreduce_manual,
ddp_amp_syncbn, or a knob its loop does not reproduce) the overhead is against the plain twin, the two parts
together:

    harness overhead = 1 - harness / twin        (throughput; > 0: the harness is slower)

with a 95% interval from the two bootstrap distributions of the medians (``stats.bootstrap_medians``: the windows of
one run, or runs then windows with ``--repeat``), so the run stays the statistical unit. On a GPU the figure is
wall time; on the CPU it is CPU time of the process (``time.process_time`` around each window), which other
processes on a shared machine disturb far less than wall time; both are recorded.
"""
from __future__ import annotations

import json

import numpy as np

from bench.core import results, stats, workloads

TWIN_SCHEMA = "twin-1"
# Above this the verdict says so. Lightning's parity test against plain PyTorch (tests/parity_pytorch) holds its
# Trainer to a few hundredths of a second per epoch of plain PyTorch; a harness measuring backends must cost less
# than the differences it reports, and the backends' own wrappers cost a few percent.
THRESHOLD = 0.01
TWINS = {"vision": "bench/twins/vision.py", "language": "bench/twins/gpt.py"}  # one twin per workload kind
SETTLE_STEPS = 1  # bench/rank/train.py's SETTLE_STEPS: untimed steps between warm-up and the first window
# (field of the window times, words) per timing; the headline is CPU time on the CPU, wall time on GPUs
TIMINGS = {"cpu": ("window_cpu_seconds", "CPU time"), "wall": ("window_seconds", "wall time")}


def headline_timing(device_type: str) -> str:
    """Which timing the overhead's headline uses: on GPUs wall time (the host only waits for the device), on the CPU
    CPU time, which a neighbour on a shared machine slows far less than wall time."""
    return "cpu" if device_type == "cpu" else "wall"


def script(kind: str):
    """The twin file of a workload kind."""
    return results.REPO_ROOT / TWINS[kind]


PLAIN = {"name": "plain"}  # the loop of the plain twin: single's, no backend's wrapper
LOOPS = {"ddp": "bench/twins/ddp.py", "fsdp2": "bench/twins/fsdp2.py", "ds_zero": "bench/twins/ds_zero.py"}


def loop_file(loop: dict | None) -> str | None:
    """The file of a backend's own loop (None: the plain loop, in the workload's file)."""
    return LOOPS.get((loop or PLAIN)["name"])


def same_loop(a: dict | None, b: dict | None) -> bool:
    return json.dumps(a or PLAIN, sort_keys=True) == json.dumps(b or PLAIN, sort_keys=True)


def unavailable(cfg: dict) -> str | None:
    """Why a configuration (a RunConfig's dict) has no plain twin, or None."""
    kind = workloads.of_record(cfg).kind
    if cfg["world_size"] != 1:
        return "the plain twin trains on one device: it is compared with world-size-1 runs only"
    if (cfg.get("options") or {}).get("activation_checkpointing"):
        return "the plain twins do not checkpoint activations (--activation-checkpointing)"
    if kind not in TWINS:
        return ("no plain twin for your own model (package.module:factory): the twins are one per workload kind, "
                f"{', '.join(sorted(TWINS))}")
    if (cfg.get("data") or "synthetic") != "synthetic":
        return "the plain twin trains on the synthetic batch; the input pipeline is bench loader's to measure"
    return None


def settings(cfg: dict, threads: int, loop: dict | None = None) -> dict:
    """What the twin file reads (plain values, no harness object): the configuration's workload, precision, batch,
    memory format, compile setting, windows, device, threads and seed, and the loop (``loop``: a backend's own, from
    ``Backend.twin``; the plain one by default)."""
    o = cfg.get("options") or {}
    out = {"model": cfg["model"], "image_size": cfg.get("image_size"), "seq_len": cfg.get("seq_len"),
           "batch": cfg["batch_size"], "precision": cfg["precision"], "optimizer": cfg["optimizer"],
           "channels_last": bool(o.get("channels_last")), "compile": bool(o.get("compile")),
           "device": cfg["device_type"], "cudnn_benchmark": cfg.get("cudnn_benchmark"), "threads": threads,
           "seed": cfg.get("seed", 0), "warmup": cfg["warmup"], "settle": SETTLE_STEPS, "steps": cfg["steps"],
           "windows": cfg["windows"], "window_s": cfg.get("window_s"), "optimizer_impl": o.get("optimizer_impl"),
           "loop": loop or PLAIN}
    if workloads.of_record(cfg).kind == "language":
        out["gpt"] = list(workloads.GPT_SIZES[cfg["model"]])  # layers, width, heads, vocabulary
    return out


def key(rec: dict, hardware: str | None = None) -> tuple:
    """What a run and its twin share: the workload, precision, per-device batch, data, device and hardware, cuDNN's
    benchmark flag, the memory format and the compile setting (a record's or a twin record's)."""
    o = rec.get("options") or {}
    w = workloads.of_record(rec)
    return (w.model, w.image_size, w.seq_len, w.optimizer, rec["precision"], rec["batch_per_device"],
            rec.get("data") or "synthetic", rec["device_type"], hardware or results.hardware(rec),
            rec.get("cudnn_benchmark"), bool(o.get("channels_last")), bool(o.get("compile")), o.get("optimizer_impl"))


def speeds(rec: dict, timing: str, field: str | None = None) -> np.ndarray | None:
    """Samples per second of each window of a record (or a twin's), by ``timing`` ("wall" or "cpu"); None when the
    record has no valid windows of that timing."""
    t = np.asarray(rec.get(field or TIMINGS[timing][0]) or [], dtype=float)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        return None
    return rec["global_batch"] * rec["steps_per_window"] / t


def ratio(numerator: list, denominator: list) -> dict | None:
    """median(numerator) / median(denominator) of two configurations' runs (each a list of per-window speeds), with
    the 95% interval of the two independent bootstrap distributions' ratio; ``interval`` says whether the runs'
    spread is in it (several runs on both sides) or only the windows' (``within-run only``)."""
    a = [np.asarray(x, dtype=float) for x in numerator if x is not None and len(x)]
    b = [np.asarray(x, dtype=float) for x in denominator if x is not None and len(x)]
    if not a or not b:
        return None
    med = lambda runs: float(np.median([np.median(x) for x in runs]))  # noqa: E731 - the median of run medians
    dist = stats.bootstrap_medians(a, seed=0) / stats.bootstrap_medians(b, seed=1)
    return {"ratio": med(a) / med(b), "ci95": [float(np.percentile(dist, 2.5)), float(np.percentile(dist, 97.5))],
            "interval": stats.ACROSS_RUNS if len(a) > 1 and len(b) > 1 else stats.WITHIN_RUN,
            "runs": [len(a), len(b)]}


def overhead(harness: list, twin: list) -> dict | None:
    """``1 - harness / twin`` (each a list of runs' per-window speeds) with its 95% interval."""
    r = ratio(harness, twin)
    if r is None:
        return None
    return {"overhead": 1 - r["ratio"], "ci95": [1 - r["ci95"][1], 1 - r["ci95"][0]], "interval": r["interval"],
            "runs": r["runs"]}


def fields(rec: dict, twins: list[dict], plain: list[dict] | None = None, loop: dict | None = None) -> dict:
    """The ``reference`` field of a harness record: its twin(s) of the same repetition (``twins``: the run's own loop's,
    ``loop`` its settings; the plain loop's when it has none), the overhead against them in both timings (the
    headline's named in ``timing``: the harness's part), and, for a backend with a loop of its own, the library's
    price, its own twin against the plain twins ``plain`` (``library_price``); under --compile the run against its
    eager twin."""
    own = loop is not None and not same_loop(loop, PLAIN)
    if not twins:
        return {"reason": f"its plain twin{' (' + loop['name'] + ' loop)' if own else ''} did not run", "loop": loop}
    ok = [t for t in twins if t.get("status") == "ok"]
    if not ok:
        return {"reason": f"its plain twin {twins[0].get('status')}: {twins[0].get('reason')}",
                "twin_run_ids": [t["run_id"] for t in twins], "loop": loop}
    headline = headline_timing(rec["device_type"])
    out = {"twin_run_ids": [t["run_id"] for t in ok], "twin": ok[0].get("twin"), "timing": TIMINGS[headline][1],
           "loop": ok[0].get("loop") or PLAIN, "own_loop": own,
           "twin_throughput": float(np.median([t["throughput"] for t in ok])), "threshold": THRESHOLD,
           "twin_window_seconds": [t["window_seconds"] for t in ok],
           "twin_window_cpu_seconds": [t.get("window_cpu_seconds") for t in ok]}
    for timing in TIMINGS:
        o = overhead([speeds(rec, timing)], [speeds(t, timing) for t in ok])
        out[f"overhead_{timing}"] = None if o is None else o["overhead"]
        out[f"overhead_{timing}_ci95"] = None if o is None else o["ci95"]
    out.update(overhead=out[f"overhead_{headline}"], overhead_ci95=out[f"overhead_{headline}_ci95"],
               interval=stats.WITHIN_RUN)
    med = lambda runs: float(np.median([np.median(x) for x in runs])) if runs else None  # noqa: E731
    harness_rate, twin_rate = med([x for x in [speeds(rec, headline)] if x is not None]), med(
        [x for x in (speeds(t, headline) for t in ok) if x is not None])
    out.update(harness_rate=harness_rate, twin_rate=twin_rate)  # by the headline's timing: what the overhead is of
    out["over_threshold"] = out["overhead"] is not None and out["overhead"] > THRESHOLD
    good = [t for t in plain or [] if t.get("status") == "ok"]
    if own and good:  # the library's price: its own loop against the plain loop, outside the suite
        price = overhead([speeds(t, headline) for t in ok], [speeds(t, headline) for t in good])
        out.update(plain_twin_run_ids=[t["run_id"] for t in good],
                   plain_twin_window_seconds=[t["window_seconds"] for t in good],
                   plain_twin_window_cpu_seconds=[t.get("window_cpu_seconds") for t in good],
                   plain_twin_rate=med([x for x in (speeds(t, headline) for t in good) if x is not None]),
                   library_price=price and price["overhead"], library_price_ci95=price and price["ci95"])
    elif own:
        out["library_reason"] = "the plain twin did not run"
    eager = [t for t in ok if t.get("eager_window_seconds")]
    if eager:  # --compile: the twin also timed its eager model after its compiled windows
        field = TIMINGS[headline][0]
        c = ratio([speeds(rec, headline)], [speeds(t, headline, "eager_" + field) for t in eager])
        out["eager_twin_throughput"] = float(np.median([t["eager_throughput"] for t in eager]))
        out["compiled_vs_eager"] = c and c["ratio"]
        out["compiled_vs_eager_ci95"] = c and c["ci95"]
        out["compiled_slower_than_eager"] = bool(c and c["ratio"] < 1)
    return out


def rate_unit(unit: str, timing: str) -> str:
    """The unit of a rate by ``timing``'s clock: "img/s", or "img/CPU-s" (images per second of the process's CPU
    time: the CPU-time figures, labelled as such wherever they appear)."""
    return f"{unit}/CPU-s" if timing in ("cpu", TIMINGS["cpu"][1]) else f"{unit}/s"


def describe(o: dict, timing: str) -> str:
    """One phrase for an overhead (``overhead`` result or a record's fields): "0.4% (95% interval -1.2–2.0%, CPU time,
    within-run only)"."""
    lo, hi = o["ci95"]
    return (f"{100 * o['overhead']:+.1f}% (95% interval {100 * lo:+.1f} to {100 * hi:+.1f}%, {timing}"
            + (", within-run only)" if o["interval"] == stats.WITHIN_RUN else ", across runs)"))


def judge(o: dict) -> str:
    """Whether the harness is within THRESHOLD of its twin: "over" (the whole interval above it), "over by the
    median" (the median above, the interval reaching below), or "within"."""
    if o["ci95"][0] > THRESHOLD:
        return "over"
    return "over by the median" if o["overhead"] > THRESHOLD else "within"

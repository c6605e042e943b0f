"""``bench run --reference``: where each configuration's plain twins go in the sweep, and what the world-size-1
runs' records get from them (the vocabulary is bench/core/reference.py; the twin's process, bench/launch/twin.py).

Per configuration key (``reference.key``: workload, precision, batch, memory format, compile, data, device) and
repetition, the plain twin (single's loop) and the own loop of each backend at world size 1 that has one
(``Backend.twin``: DDP's, FSDP2's, DeepSpeed's), next to the world-size-1 runs they are compared with: before them in
odd repetitions, after them in even ones, so slow drift favours neither side."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from bench.core import reference, results, workloads
from bench.core.config import RunConfig

TWIN, RUN = "twin", "run"


def _key(cfg) -> tuple:
    return reference.key(results.skeleton(cfg.to_dict(), "", {}), hardware="this machine")


def loop_of(cfg: RunConfig) -> dict | None:
    """The backend's own plain loop for ``cfg`` (``Backend.twin``), None where it has none."""
    import backends

    return backends.create(cfg.backend).twin(cfg)


def _plain(cfg: RunConfig) -> RunConfig:
    """The configuration of the plain twin beside ``cfg``: single's loop, the common knobs only."""
    from backends.base import COMMON_KNOBS

    common = {k.key for k in COMMON_KNOBS}
    return dataclasses.replace(cfg, backend="single", launcher="inproc",
                               options={k: v for k, v in (cfg.options or {}).items() if k in common})


def plan(configs: list, runnable) -> list[tuple[str, RunConfig]]:
    """``(RUN, cfg)`` for every configuration in its order, with ``(TWIN, cfg)`` placed beside the world-size-1 runs
    of each key and repetition: the plain twin (its cfg is single's), then one per backend loop those runs use;
    ``runnable(cfg)``: whether that run can run here (no twin for runs that are all skipped)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        if c.world_size == 1 and runnable(c) and reference.unavailable(c.to_dict()) is None:
            groups.setdefault((c.repeat_index, _key(c)), []).append(i)
    before: dict[int, list] = {}
    for (rep, _), idx in groups.items():
        twins, loops = [_plain(configs[idx[0]])], [reference.PLAIN]
        for i in idx:
            loop = loop_of(configs[i])
            if loop and not any(reference.same_loop(loop, seen) for seen in loops):
                twins.append(configs[i])
                loops.append(loop)
        before.setdefault(idx[0] if rep % 2 else idx[-1] + 1, []).extend(twins)
    out = []
    for i in range(len(configs) + 1):
        out += [(TWIN, c) for c in before.get(i, [])]
        if i < len(configs):
            out.append((RUN, configs[i]))
    return out


def _config_of(rec: dict) -> RunConfig:
    """The parts of a record's configuration a backend's ``twin`` reads."""
    return RunConfig(backend=rec["backend"], launcher=rec["launcher"], world_size=rec["world_size"],
                     device_type=rec["device_type"], model=rec["model"], image_size=rec.get("image_size"),
                     seq_len=rec.get("seq_len"), batch_size=rec["batch_per_device"], warmup=rec["warmup_steps"],
                     steps=rec["steps_per_window"], windows=rec["windows"], precision=rec["precision"],
                     options=dict(rec.get("options") or {}), optimizer=rec.get("optimizer"))


def attach(records: list[dict], twins: list[dict], results_dir: Path) -> list[dict]:
    """Every ok world-size-1 record with its ``reference`` field (its repetition's twins: its own loop's and the plain
    one, the two parts of its gap, under --compile the eager twin), written into its file atomically; the records
    returned updated."""
    by: dict[tuple, list[dict]] = {}
    for t in twins:
        by.setdefault((reference.key(t, t["hardware"]), t["repeat_index"]), []).append(t)
    out = []
    for rec in records:
        if rec.get("status") != "ok" or rec.get("world_size") != 1 or rec.get("record_elsewhere"):
            out.append(rec)
            continue
        why = reference.unavailable(rec)
        if why:
            field = {"reason": why}
        else:
            mine = by.get((reference.key(rec), rec.get("repeat_index", 1)), [])
            loop = loop_of(_config_of(rec))
            plain = [t for t in mine if reference.same_loop(t.get("loop"), reference.PLAIN)]
            own = [t for t in mine if reference.same_loop(t.get("loop"), loop)] if loop else plain
            field = reference.fields(rec, own, plain, loop)
        rec = {**rec, "reference": field}
        path = Path(results_dir) / f"{rec['run_id']}.json"
        try:
            on_disk = json.loads(path.read_text())
        except (OSError, ValueError):
            out.append(rec)
            continue
        on_disk["reference"] = rec["reference"]
        results.write_json_atomic(on_disk, path, overwrite=True)
        out.append(rec)
    return out


def _unit(rec: dict) -> str:
    return workloads.sample_unit(rec)


def twin_line(rec: dict) -> str:
    """The progress line of a finished twin: which loop, its wall-time throughput (as a run's progress line gives
    its), and on CPUs its rate per CPU-second beside it, labelled."""
    loop = (rec.get("loop") or reference.PLAIN)["name"]
    which = "the plain loop" if loop == "plain" else f"{loop}'s own loop, {reference.loop_file(rec.get('loop'))}"
    if rec["status"] != "ok":
        return f"{rec['status']} ({which}): {rec['reason']}"
    lo, hi = rec["throughput_ci95"]
    unit = _unit(rec)
    eager = f"; eager twin {rec['eager_throughput']:.1f} {unit}/s" if rec.get("eager_throughput") else ""
    cpu = reference.speeds(rec, "cpu")
    per_cpu = (f"; {float(np.median(cpu)):,.4g} {reference.rate_unit(unit, 'cpu')} (CPU time)"
               if rec.get("device_type") == "cpu" and cpu is not None else "")
    disturbed = f"; ⚠ disturbed: {'; '.join(rec.get('disturbed_reasons') or [])}" if rec.get("disturbed") else ""
    return f"ok ({which}): {rec['throughput']:.1f} {unit}/s (95% CI {lo:.1f}-{hi:.1f}){per_cpu}{eager}{disturbed}"


def lines(records: list[dict]) -> list[str]:
    """The console's summary: each world-size-1 run against its plain twin in the run's own unit, by the timing the
    figure uses (CPU time on CPUs, labelled), the overhead computed from exactly the two rates printed beside it; for
    a backend with a loop of its own, the library's price (its own loop against the plain loop) after it."""
    out = []
    for rec in records:
        f = rec.get("reference")
        if not f:
            continue
        opts = ", ".join(k for k, v in (rec.get("options") or {}).items() if v)
        who = f"{rec['backend']} x1 {rec['precision']}{' (' + opts + ')' if opts else ''}" + (
            f" repeat {rec['repeat_index']}" if rec.get("repeats", 1) > 1 else "")
        if f.get("overhead") is None:
            out.append(f"  {who}: no overhead figure ({f.get('reason') or 'no valid windows'})")
            continue
        o = {"overhead": f["overhead"], "ci95": f["overhead_ci95"], "interval": f["interval"]}
        verdict = {"over": f" ⚠ over {100 * reference.THRESHOLD:g}%",
                   "over by the median": f" ⚠ over {100 * reference.THRESHOLD:g}% by the median (its interval reaches below)",
                   "within": ""}[reference.judge(o)]
        unit = reference.rate_unit(_unit(rec), f["timing"])
        own = f.get("own_loop")
        twin = f"its own loop's twin ({f['loop']['name']})" if own else "its plain twin"
        part = "harness's part" if own else "harness overhead"
        line = (f"  {who}: {f['harness_rate']:,.4g} {unit} in the harness vs {f['twin_rate']:,.4g} {unit} in {twin} "
                f"({f['timing']}): {part} {reference.describe(o, f['timing'])}{verdict}")
        if own and f.get("library_price") is not None:
            lo, hi = f["library_price_ci95"]
            line += (f"; library's price {100 * f['library_price']:+.1f}% ({f['twin_rate']:,.4g} vs "
                     f"{f['plain_twin_rate']:,.4g} {unit} in the plain loop; 95% interval {100 * lo:+.1f} to "
                     f"{100 * hi:+.1f}%)")
        if f.get("compiled_vs_eager") is not None:
            slower = " ⚠ the compiled run is slower than its eager twin" if f["compiled_slower_than_eager"] else ""
            line += f"; compiled / eager twin {f['compiled_vs_eager']:.2f}x{slower}"
        out.append(line)
    return ["", "Harness vs its plain twin (1 - harness / twin; > 0: the harness is slower; a backend with a loop of "
                "its own: the harness's part against that loop, the library's price = 1 - its loop / the plain loop):"
            ] + out if out else []

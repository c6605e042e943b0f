"""How close to the machine, in the report: each world-size-1 configuration against its plain twin (``bench run
--reference``: harness overhead = 1 - harness / twin, across runs), what ``--compile`` did (compile time, graph breaks,
graphs compiled inside a window, the compiled run against its eager twin or the same configuration's eager runs) and
which attention kernel a GPT ran. The figures' vocabulary is bench/core/reference.py; the records carry everything."""
from __future__ import annotations

import json

import numpy as np

from bench.report.common import BASELINE, fmt, label, md_table, rate
from bench.core import reference, stats, workloads


def config_fields(ok: list[dict]) -> dict:
    """A configuration's row: its harness overhead across its runs (each run's own twins, once each; for a backend
    with a loop of its own, the harness's part against that loop and the library's price, that loop against the plain
    loop), the compile figures and the attention kernels."""
    out = {"harness_overhead_pct": None, "harness_overhead_ci_pct": None, "overhead_timing": None,
           "harness_rate": None, "twin_rate": None, "twin_loop": None, "own_loop": False,
           "library_price_pct": None, "library_price_ci_pct": None, "plain_twin_rate": None, "plain_twin_runs": 0,
           "library_interval": None,
           "overhead_interval": None, "twin_img_s": None, "twin_runs": 0, "twin_reason": None,
           "compiled_vs_eager_twin": None, "compile_graph_breaks": None, "compile_graphs": None,
           "graphs_compiled_in_windows": None, "sdpa_kernels": None}
    refs = [(r, r.get("reference") or {}) for r in ok]
    reasons = sorted({f["reason"] for _, f in refs if f.get("reason")})
    out["twin_reason"] = "; ".join(reasons) or None
    with_twin = [(r, f) for r, f in refs if f.get("twin_run_ids")]
    if with_twin:
        timing = reference.headline_timing(with_twin[0][0]["device_type"])
        field = reference.TIMINGS[timing][0]

        def twin_speeds(ids, walls, cpus, r, into):
            for rid, wall, cpu in zip(ids, walls, cpus):
                into[rid] = reference.speeds({"global_batch": r["global_batch"], "steps_per_window":
                                              r["steps_per_window"], field: wall if timing == "wall" else cpu}, timing)

        twins, plain = {}, {}
        for r, f in with_twin:
            twin_speeds(f["twin_run_ids"], f["twin_window_seconds"], f["twin_window_cpu_seconds"], r, twins)
            if f.get("plain_twin_run_ids"):
                twin_speeds(f["plain_twin_run_ids"], f["plain_twin_window_seconds"],
                            f["plain_twin_window_cpu_seconds"], r, plain)
        harness = [reference.speeds(r, timing) for r, _ in with_twin]
        o = reference.overhead(harness, list(twins.values()))
        med = lambda runs: float(np.median([np.median(x) for x in runs if x is not None])) if any(  # noqa: E731
            x is not None for x in runs) else None
        out.update(harness_rate=med(harness), twin_rate=med(list(twins.values())),
                   twin_loop=(with_twin[0][1].get("loop") or reference.PLAIN)["name"],
                   own_loop=bool(with_twin[0][1].get("own_loop")))
        if o is not None:
            out.update(harness_overhead_pct=100 * o["overhead"], harness_overhead_ci_pct=[100 * x for x in o["ci95"]],
                       overhead_interval=o["interval"])
        price = reference.overhead(list(twins.values()), list(plain.values())) if plain else None
        if price is not None:  # the library's price: its own loop against the plain loop, across runs
            out.update(library_price_pct=100 * price["overhead"], library_price_ci_pct=[100 * x for x in price["ci95"]],
                       library_interval=price["interval"], plain_twin_rate=med(list(plain.values())),
                       plain_twin_runs=len(plain))
        out.update(overhead_timing=reference.TIMINGS[timing][1], twin_runs=len(twins),
                   twin_img_s=float(np.median([f["twin_throughput"] for _, f in with_twin])))  # wall time
        ratios = [f["compiled_vs_eager"] for _, f in with_twin if f.get("compiled_vs_eager") is not None]
        out["compiled_vs_eager_twin"] = float(np.median(ratios)) if ratios else None
    graphs = [r["compile_graphs"] for r in ok if r.get("compile_graphs")]
    if graphs:
        out.update(compile_graph_breaks=max(g["graph_breaks"] for g in graphs),
                   compile_graphs=max(g["unique_graphs"] for g in graphs),
                   graphs_compiled_in_windows=max(g["graphs_compiled_in_windows"] for g in graphs))
    kernels = {k for r in ok for k in (r.get("sdpa") or {}).get("kernels") or []}
    out["sdpa_kernels"] = ", ".join(sorted(kernels)) or None
    # CUDA: whether the GPU waited for the host (bench/rank/train.py host_bound), in how many of the runs
    judged = [r for r in ok if r.get("host_bound") is not None]
    out["host_bound_runs"] = sum(bool(r["host_bound"]) for r in judged) if judged else None
    out["host_over_gpu"] = float(np.median([r["host_over_gpu"] for r in judged])) if judged else None
    out["host_bound"] = bool(judged) and 2 * out["host_bound_runs"] > len(judged)  # most of its runs
    return out


def judged(r: dict) -> str | None:
    """Within or over the threshold, for a row with an overhead."""
    if r.get("harness_overhead_pct") is None:
        return None
    lo, _ = r["harness_overhead_ci_pct"]
    o = {"overhead": r["harness_overhead_pct"] / 100, "ci95": [lo / 100, 0], "interval": r["overhead_interval"]}
    limit = f"{100 * reference.THRESHOLD:g}%"
    return {"over": f"⚠ over {limit}", "over by the median": f"⚠ over {limit} by the median (its interval reaches below)",
            "within": f"within {limit}"}[reference.judge(o)]


def interval(r: dict, field: str = "harness_overhead", kind: str = "overhead_interval") -> str:
    lo, hi = r[f"{field}_ci_pct"]
    return f"{lo:+.1f} to {hi:+.1f}%" + (" (within-run only)" if r[kind] == stats.WITHIN_RUN else "")


def _rate(r: dict, value) -> str | None:
    """A twin-table rate, labelled by the clock it is per: img/s, or img/CPU-s on CPUs."""
    return fmt(value, reference.rate_unit(workloads.sample_unit(r), r.get("overhead_timing") or ""))


def twin_table(ok: list[dict]) -> list[str]:
    """The workload block's "Harness vs its plain twin" table (world-size-1 rows with a twin, or the reason), each
    backend's gap from the plain loop split into the library's price and the harness's part."""
    rows = [r for r in ok if r["world_size"] == 1 and (r.get("twin_runs") or r.get("twin_reason"))]
    if not rows:
        return []
    body = []
    for r in rows:
        has = r.get("harness_overhead_pct") is not None
        own, plain = r.get("own_loop"), r["backend"] == BASELINE
        if own:
            loop, price = f"{_rate(r, r.get('twin_rate'))} ({r['twin_loop']})", (
                f"{r['library_price_pct']:+.1f} % ({interval(r, 'library_price', 'library_interval')})"
                if r.get("library_price_pct") is not None else "— (the plain twin did not run)")
        else:
            loop = "the plain loop" if plain else "none"
            price = "— (it is the plain loop)" if plain else "— (no loop of its own: both parts together →)"
        body.append([label(r), r["precision"], _rate(r, r.get("harness_rate")), loop,
                     _rate(r, r.get("plain_twin_rate") if own else r.get("twin_rate")), price,
                     f"{r['harness_overhead_pct']:+.1f} % ({interval(r)})" if has else None, r.get("overhead_timing"),
                     f"{r['runs_ok']} / {r['twin_runs']}", judged(r) or r.get("twin_reason")])
    return ["**6. Harness vs its plain twin** (`bench run --reference`: `bench/twins/`, the plainest PyTorch loop of the "
            "same workload, precision, batch, memory format and compile setting on one device, run interleaved with "
            "these runs, and for a backend with a plain loop of its own (DDP's, FSDP2's as torchtitan writes it, "
            "DeepSpeed's engine loop) that loop too. A backend's gap from the plain loop splits into *the library's "
            "price* = 1 − its own loop / the plain loop and *the harness's part* = 1 − harness / its own loop; > 0: "
            "slower. CPU time on CPUs, wall time on GPUs, and every rate by that clock: img/CPU-s = images per second "
            "of the process's CPU time, not of wall time)", "",
            md_table(["backend", "precision", "harness", "its own loop", "plain loop", "library's price (95% interval)",
                      "harness's part (95% interval)", "timing", "runs / twin runs", ""], body, {2, 3, 4}), ""]


def _eager_of(r: dict, ok: list[dict]) -> dict | None:
    """The same configuration without --compile, among ``ok``."""
    options = r["options"] if isinstance(r["options"], dict) else json.loads(r["options"] or "{}")
    if not options.get("compile"):
        return None
    want = json.dumps({k: v for k, v in options.items() if k != "compile"}, sort_keys=True)
    for o in ok:
        theirs = o["options"] if isinstance(o["options"], dict) else json.loads(o["options"] or "{}")
        if (o["backend"], o["world_size"], o["precision"]) == (r["backend"], r["world_size"], r["precision"]) and \
                json.dumps(theirs, sort_keys=True) == want and o["global_img_s"]:
            return o
    return None


def compile_table(ok: list[dict]) -> list[str]:
    """Compile time, graph breaks, graphs compiled inside windows, compiled against eager (its eager twin, or the same
    configuration's eager runs in these records), and the attention kernel a GPT ran."""
    rows = [r for r in ok if r.get("compile_graphs") is not None or r.get("sdpa_kernels")]
    if not rows:
        return []
    body = []
    for r in rows:
        eager = _eager_of(r, ok)
        seconds = [rec.get("compile_seconds") for rec in r["_recs"] if rec.get("compile_seconds") is not None]
        body.append([label(r), r["world_size"], r["precision"], fmt(max(seconds), "s") if seconds else None,
                     r.get("compile_graph_breaks"), r.get("compile_graphs"), r.get("graphs_compiled_in_windows"),
                     fmt(r.get("compiled_vs_eager_twin"), "×", 2),
                     fmt(r["global_img_s"] / eager["global_img_s"], "×", 2) if eager and r["global_img_s"] else None,
                     r.get("sdpa_kernels")])
    return ["**7. Compile and attention** (compile time: warm-up beyond its last step, never inside a window; graph "
            "breaks and graphs from TorchDynamo's counters; compiled / eager < 1: the compiled run is slower than "
            "eager; the attention kernel from the aten operations of one profiled step)", "",
            md_table(["backend", "world size", "precision", "compile time", "graph breaks", "graphs",
                      "compiled inside windows", "compiled / eager twin", "compiled / eager run", "attention kernel"],
                     body, {1, 3, 4, 5, 6, 7, 8}), ""]


# What a sharded backend does at world size 1 that single does not, by the library range that shows it in a trace
# (bench run --trace; bench/core/traces.py keeps each rank's library ranges, ms per step): nothing is sharded or
# communicated there, so this is what is left of its gap (FSDP2: _fsdp_param_group.py, _fsdp_collectives.py).
INHERENT = (
    ("FSDP::pre_forward", "every parameter cast and copied into the unsharded buffer each step, and the group's hooks"),
    ("FSDP::post_backward_reduce", "gradients copied into and out of the reduce-scatter buffer and wrapped as DTensors"),
    ("FSDP::post_backward_reshard", "the unsharded parameters freed after backward, to be copied in again next step"),
    ("Optimizer.step#", "the optimizer on DTensors (each operation dispatched through DTensor's sharding rules)"),
)
SHARDED = ("fsdp2", "ds_zero1", "ds_zero2", "ds_zero3", "ddp_zero")


def gap_lines(ok: list[dict]) -> list[str]:
    """For each sharded backend at world size 1 beside single@1 (same precision and options) and traced: its gap
    from single, and what is left of it named from its trace's library ranges, with their ms per traced step."""
    out = []
    singles = {(r["precision"], json.dumps(_common(r), sort_keys=True)): r for r in ok
               if r["backend"] == BASELINE and r["world_size"] == 1 and r.get("global_img_s")}
    for r in ok:
        if r["backend"] not in SHARDED or r["world_size"] != 1 or not r.get("global_img_s"):
            continue
        base = singles.get((r["precision"], json.dumps(_common(r), sort_keys=True)))
        traced = [rec["trace"] for rec in r["_recs"] if rec.get("status") == "ok" and rec.get("trace")]
        ranges = ((traced[-1].get("library_ms_per_step") or [{}])[0]) if traced else {}
        if base is None or not ranges:
            continue
        named = []
        for prefix, what in INHERENT:
            for name, ms in sorted(ranges.items(), key=lambda kv: -kv[1]):
                if name.startswith(prefix):
                    named.append(f"`{name}` {ms:.1f} ms ({what})")
        if not named:
            continue
        step = (traced[-1].get("step_ms") or [[]])[0]
        out.append(f"- `{label(r)}` ×1 {r['precision']} runs at {r['global_img_s'] / base['global_img_s']:.2f}× "
                   f"single's throughput: at world size 1 nothing is sharded or communicated, and what is left is "
                   f"{r['backend']}'s own work per step, named by its trace (rank 0, ms per traced step"
                   + (f" of {sum(step) / len(step):.1f}" if step else "") + "): " + "; ".join(named) + ".")
    return out


def _common(r: dict) -> dict:
    """A row's options that make two backends the same computation (memory format, compile, optimizer impl)."""
    options = r["options"] if isinstance(r["options"], dict) else json.loads(r["options"] or "{}")
    return {k: options.get(k) for k in ("channels_last", "compile", "optimizer_impl", "activation_checkpointing")}


def host_bound_mark(r: dict) -> str:
    """What goes beside a configuration's throughput when most of its runs were host-bound (CUDA)."""
    return " (host-bound)" if r.get("host_bound") else ""


def notes(ok: list[dict]) -> list[str]:
    """A line for every host-bound configuration (CUDA), every compiled configuration slower than eager, and for graphs
    compiled inside a window."""
    out = [f"- `{label(r)}` ×{r['world_size']} {r['precision']}: host-bound in {r['host_bound_runs']} of "
           f"{r['runs_ok']} run(s): the host took {100 * r['host_over_gpu']:.0f}% of the GPU's time to enqueue each "
           "window's steps (CUDA events beside the host's clock), so the GPU waited for it: this throughput measures "
           "the host's launch cost per step (Python, hooks, per-operation dispatch) more than the GPU"
           for r in ok if r.get("host_bound")]
    out += gap_lines(ok)
    for r in ok:
        eager = _eager_of(r, ok)
        vs_twin = r.get("compiled_vs_eager_twin")
        if vs_twin is not None and vs_twin < 1:
            out.append(f"- ⚠ `{label(r)}` ×{r['world_size']}: the compiled run is slower than its eager twin "
                       f"({vs_twin:.2f}× its throughput): --compile does not pay here")
        if eager and r["global_img_s"] and r["global_img_s"] < eager["global_img_s"]:
            out.append(f"- ⚠ `{label(r)}` ×{r['world_size']}: compiled, {r['global_img_s']:,.1f} {rate(r)}, slower than "
                       f"the same configuration eager, {eager['global_img_s']:,.1f} {rate(r)}")
        if r.get("graphs_compiled_in_windows"):
            out.append(f"- ⚠ `{label(r)}` ×{r['world_size']}: {r['graphs_compiled_in_windows']} graph(s) compiled "
                       "inside the timed windows (a recompilation): those windows include compile time")
    return out


def verdict_lines(ok: list[dict]) -> list[str]:
    """The verdict's line about the harness: which runs are within THRESHOLD of their plain twins, which over."""
    rows = [r for r in ok if r.get("harness_overhead_pct") is not None]
    if not rows:
        return []
    within = [r for r in rows if judged(r).startswith("within")]
    over = [r for r in rows if r not in within]
    limit = f"{100 * reference.THRESHOLD:g}%"
    out = []
    if within:
        out.append(f"Harness within {limit} of its plain twin: "
                   + ", ".join(f"{label(r)} ({r['harness_overhead_pct']:+.1f}%)" for r in within)
                   + f" ({within[0]['overhead_timing']}).")
    for r in over:
        twin = f"its own loop's twin ({r['twin_loop']})" if r.get("own_loop") else "its plain twin"
        out.append(f"Harness over {limit} for {label(r)}: {r['harness_overhead_pct']:+.1f}% slower than {twin} "
                   f"(95% interval {interval(r)}, {r['overhead_timing']}){'' if judged(r) == '⚠ over ' + limit else f'; its interval reaches below {limit}: not established'}.")
    for r in rows:
        if r.get("library_price_pct") is not None:
            out.append(f"{label(r)}'s gap from the plain loop: the library's price {r['library_price_pct']:+.1f}% "
                       f"({interval(r, 'library_price', 'library_interval')}), the harness's part "
                       f"{r['harness_overhead_pct']:+.1f}% ({interval(r)}), {r['overhead_timing']}.")
    return out

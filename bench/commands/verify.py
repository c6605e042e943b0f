"""``python -m bench verify``: prove that each backend trains the model it claims to.

For each backend and world size N, train K steps from one seed on one deterministic sequence of global
batches (``data.verify_batches``: each rank gets exactly the share a DistributedSampler gives it; ``single``
and DataParallel get the whole global batch, the shares in rank order), evaluate the distributed way
(``bench.rank.evaluate``), and compare with a reference run in one process on the same global batches:

- the per-step global loss (mean over the global batch: the ranks' equal shares averaged);
- the final full parameters: distance ``||p - p_ref|| / ||p_ref - p_0||``, i.e. relative to how far the
  reference moved from the shared initialisation ``p_0`` ("0.5": half a training run's worth of error,
  whatever the size of the parameters), and the max abs difference.

The reference is ``single`` computing what N replicas compute (``Reference``). Where each replica's
BatchNorm normalises over its own share (dp, ddp, horovod with plain BatchNorm), it runs the global batch
as N micro-batches of one share each and averages their gradients: that differs from plain ``single`` at the
global batch by design (BatchNorm statistics over B, not N x B), and is the same training as the backend.
Where BatchNorm sees the global batch (SyncBatchNorm), or the model has none, one pass over the global
batch is the same training.

Training like this is chaotic: one rounding difference in a gradient grows by one to two orders of magnitude
a step, so after 20 steps two runs that differ only in summation order can be as far apart as two
different trainings. So the reference reproduces the backend's arithmetic (micro-batches of the ranks'
shapes, the ranks' thread count), and a *twin* reference that differs from it only in summation order
(the shares in reverse order) measures how far rounding alone moves this training. A backend may deviate by
``NOISE_FACTOR`` times the twin's deviation, at each step and at the end, and at least by the precision's
floor (``FLOORS``). With 2 replicas the twin is bit-identical to the reference (a + b = b + a), so every
correct backend must be too, within the floor; with more, the all-reduce's own order is rounding the twin
imitates, and a fault still shows in the first steps, before rounding has grown.

Exit codes (docs/command-line.md, "Exit codes"): 0 every backend passed (skipped ones are listed with the reason), 1
one failed or could not run, 2 bad input or nothing to verify here (every backend would be skipped), 130 interrupted.
"""
from __future__ import annotations

import sys
from pathlib import Path

from bench.plan.verify import Entry, add_verify_arguments, config, plan, skipped_here
from bench.core import environment, workloads
from bench.core.devices import usable_cpus
from bench.core.errors import UsageError

# Deviations a correct backend may show where rounding alone moves nothing (the twin is bit-identical):
# (max |loss - loss_ref| over the steps, final parameter distance relative to the update). Measured on
# CPU over gloo (docs/verifying.md): every correct backend was bit-identical there in fp32 and
# bf16; injected faults gave loss deviations above 1e-3 and distances above 0.1.
FLOORS = {"fp32": (1e-5, 1e-4), "bf16": (1e-3, 1e-2), "fp16": (1e-3, 1e-2)}
NOISE_FACTOR = 10
PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"


def register(sub) -> None:
    v = sub.add_parser("verify", help="train every backend K steps on the same data and compare with a "
                                      "single-process reference (exit 1 when one trains something else)")
    add_verify_arguments(v)
    v.set_defaults(func=cmd_verify)


# ---------------------------------------------------------------------------------------------------
# The command

def cmd_verify(args) -> int:
    import backends
    from bench import launch
    from bench.plan.sweep import backend_options, check_writable, parse_run
    from bench.core import results

    base, entries = plan(args)
    why = skipped_here(entries)
    if why:  # nothing to verify here: refused, nothing launched (exit 2)
        parts = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in why.items())
        raise UsageError(f"nothing to run: all {len(entries)} planned verification{'s' if len(entries) != 1 else ''} "
                         f"would be skipped here ({parts})")
    out = Path(args.results) / "verify"
    check_writable(out)
    env = environment.collect_env(backends.environment(e.backend for e in entries if not e.skipped))
    todo = [e for e in entries if not e.skipped]
    cores = usable_cpus()

    def run(cfg, backend, world, reference=None):
        """One verify run; every run of world size N gets the threads one of N ranks gets."""
        run_id = results.new_run_id(f"verify-{cfg.backend}", cfg.world_size)
        spec = {"task": "verify", "verify": {
            "steps": base["steps"], "global_batch": base["batch_size"] * world, "data_world": world,
            "reference": reference, "params_out": str(out / "params" / f"{run_id}.npz")}}
        threads = max(1, cores // world) if base["device_type"] == "cpu" else None
        return launch.run_one(cfg, out, env, backend, run_id=run_id, extra_spec=spec, threads=threads,
                              timeout=launch.default_timeout(cfg) + 60)

    refs = sorted({e.reference for e in todo})
    shape = config(base, "single", "inproc", 1, "fp32")
    print(f"verify: {len(todo)} run(s) against {len(refs)} reference(s), {base['steps']} steps each, {base['model']} "
          f"{workloads.shape(shape.to_dict())}, {shape.optimizer}, batch {base['batch_size']}/device", flush=True)
    ran = {}
    for ref in refs:
        n, batchnorm, precision = ref
        cfg = config(base, "single", "inproc", 1, precision, batch_size=base["batch_size"] * n)
        for twin in (False, True) if n > 1 else (False,):
            ran[ref + (twin,)] = run(cfg, backends.create("single"), n, {"batchnorm": batchnorm, "twin": twin})
        print(f"  reference: {describe_reference(ref, base['batch_size'])}", flush=True)
    for i, e in enumerate(todo, 1):
        backend = backends.create(e.backend)
        cfg = config(base, e.backend, backend.launcher, e.world_size, e.precision,
                     options=backend_options(e.backend, parse_run([])))
        e.record = run(cfg, backend, e.world_size)
        print(f"  [{i}/{len(todo)}] {e.backend} x{e.world_size} {e.precision}: {e.record['status']}", flush=True)
    rows = [compare(e, ran, base) for e in entries]
    if not args.keep_params:
        for f in (out / "params").glob("*.npz"):
            f.unlink()
    summary = {"schema": 1, "kind": "verify", "created_at": results.utc_now(), "settings": base,
               "floors": FLOORS, "noise_factor": NOISE_FACTOR, "env": env, "rows": rows}
    results.write_json_atomic(summary, out / f"summary-{results.new_run_id('verify', len(rows))}.json")
    print_table(rows)
    failed = [r for r in rows if r["verdict"] == FAIL]
    for r in failed:
        print(f"verify: FAIL {r['backend']} x{r['world_size']} {r['precision']}: {r['why']}", file=sys.stderr)
    return 1 if failed else 0


def describe_reference(ref, batch) -> str:
    n, batchnorm, _ = ref
    if n == 1:
        return f"single @ batch {batch}"
    if batchnorm == "global":
        return f"single @ batch {batch * n}, one pass (BatchNorm over the global batch)"
    return f"single @ batch {batch * n} as {n} micro-batches of {batch} (BatchNorm per replica's share)"


def deviations(rec: dict, ref: dict):
    """(per-step |loss - loss_ref|, parameter distance relative to the reference's update, max abs diff), or a
    reason the two cannot be compared."""
    import numpy as np

    p, p_ref = _load(rec["verify"]["params_out"]), _load(ref["verify"]["params_out"])
    p0 = _load(ref["verify"]["params_out"].replace(".npz", "-initial.npz"))
    if set(p) != set(p_ref):
        return f"parameter names differ from the reference: {sorted(set(p) ^ set(p_ref))[:3]}"
    loss = np.abs(np.asarray(rec["losses"]) - np.asarray(ref["losses"]))
    diff = np.sqrt(sum(float(np.sum((p[k].astype(np.float64) - p_ref[k]) ** 2)) for k in p))
    moved = np.sqrt(sum(float(np.sum((p_ref[k].astype(np.float64) - p0[k]) ** 2)) for k in p))
    return loss, diff / moved if moved > 0 else float("inf"), max(float(np.max(np.abs(p[k] - p_ref[k]))) for k in p)


def compare(e: Entry, ran: dict, base: dict) -> dict:
    import numpy as np

    row = {"backend": e.backend, "world_size": e.world_size, "precision": e.precision, "reference": None,
           "max_loss_deviation": None, "param_distance": None, "max_abs_param_diff": None, "rounding_noise": None,
           "allowed_param_distance": None, "eval_samples": None, "eval_accuracy": None, "verdict": SKIPPED,
           "why": e.skipped, "note": None}
    if e.skipped:
        return row
    row["reference"] = describe_reference(e.reference, base["batch_size"])
    if e.reference[0] > 1 and e.reference[1] == "local" and workloads.of(base["model"]).kind == "vision":
        row["note"] = ("BatchNorm normalises each replica's share: not the same training as single at the global "
                       "batch, and compared with single running the shares as micro-batches")
    ref, twin = ran[e.reference + (False,)], ran.get(e.reference + (True,))
    rec = e.record
    row["verdict"] = FAIL
    broken = [(who, r) for who, r in (("reference", ref), ("twin reference", twin), ("run", rec))
              if r is not None and r["status"] != "ok"]
    if broken:
        who, r = broken[-1]
        row["why"] = f"the {who} {r['status']}: {r['reason']}"
        return row
    got = deviations(rec, ref)
    if isinstance(got, str):
        row["why"] = got
        return row
    loss, dist, max_abs = got
    noise_loss, noise_dist = (np.zeros_like(loss), 0.0) if twin is None else deviations(twin, ref)[:2]
    floor_loss, floor_dist = FLOORS[e.precision]
    allowed_loss = np.maximum(floor_loss, NOISE_FACTOR * noise_loss)
    allowed_dist = max(floor_dist, NOISE_FACTOR * noise_dist)
    row.update(max_loss_deviation=float(loss.max()), param_distance=dist, max_abs_param_diff=max_abs,
               rounding_noise=noise_dist, allowed_param_distance=allowed_dist,
               eval_samples=rec.get("eval_samples"), eval_accuracy=rec.get("eval_accuracy"))
    problems = []
    bad = np.flatnonzero(loss > allowed_loss)
    if bad.size:
        k = int(bad[0])
        problems.append(f"loss deviates from the reference by {loss[k]:.3g} at step {k + 1} (allowed {allowed_loss[k]:.3g})")
    if dist > allowed_dist:
        problems.append(f"final parameters are {dist:.3g} of the reference's update away from it (allowed "
                        f"{allowed_dist:.3g}; max abs difference {max_abs:.3g})")
    if rec.get("replicas_consistent") is False:
        problems.append("replicas hold different parameters")
    if rec.get("eval_samples") != base["eval_samples"]:
        problems.append(f"evaluated {rec.get('eval_samples')} samples, the set has {base['eval_samples']}")
    row["verdict"] = FAIL if problems else PASS
    row["why"] = "; ".join(problems) or None
    return row


def _load(path: str) -> dict:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="bench verify: training equivalence")
    for col in ("backend", "world size", "precision", "max loss deviation", "parameter distance",
                "rounding noise", "eval samples", "verdict"):
        table.add_column(col, overflow="fold")
    fmt = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
    for r in rows:
        verdict = {SKIPPED: f"skipped: {r['why']}", FAIL: f"FAIL: {r['why']}"}.get(r["verdict"], r["verdict"])
        table.add_row(r["backend"], str(r["world_size"]), r["precision"], fmt(r["max_loss_deviation"]),
                      fmt(r["param_distance"]), fmt(r["rounding_noise"]),
                      "-" if r["eval_samples"] is None else str(r["eval_samples"]), escape(verdict))
    Console(width=160).print(table)
    for note in dict.fromkeys(f"{r['backend']} x{r['world_size']}: {r['note']}" for r in rows if r["note"]):
        print(f"note: {note}")

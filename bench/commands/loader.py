"""``python -m bench loader``: the ceiling every input pipeline puts on training, with no model at all.

Every loader and decode path (bench/rank/loaders) reads the same folder the way a run's ranks do: ``--ranks N``
processes at once on this node, each reading its own shard with ``--workers`` loader workers (DataLoader processes,
or DALI threads), timed after warm-up batches. One line per path: images per second for the node (all ranks'
images over the slowest rank's time) and per rank. ``--results DIR`` also writes a record to DIR/loader/, which
the report's "Input bound" section reads next to the training runs. The ranks are plain processes started
here (a barrier and a queue, no process group); what each one does is bench/rank/loader.py.
"""
from __future__ import annotations

from pathlib import Path

from bench.core.devices import usable_cpus
from bench.core.errors import UsageError
from bench.core.results import LOADER_SCHEMA
from bench.rank.loader import measure_rank
from bench.core import environment


def register(sub) -> None:
    ld = sub.add_parser("loader", help="the input pipelines' ceiling (img/s, no model): every loader and decode "
                                       "path side by side, per rank and per node")
    ld.add_argument("--data-dir", required=True)
    ld.add_argument("--loaders", default="all", help="comma-separated: torchvision, dali (default all)")
    ld.add_argument("--decodes", default="all", help="comma-separated: cpu, gpu (default all; gpu needs CUDA)")
    ld.add_argument("--gpus", "--ranks", dest="ranks", type=int,
                    help="processes reading disjoint shards at once, as a run's ranks on this node do (default: the "
                         "GPUs here, or 1 on CPU; --ranks is the old spelling)")
    ld.add_argument("--workers", type=int, help="loader workers per rank (default: the cores / ranks, one per core)")
    ld.add_argument("--device", default="auto", help="auto | cuda | cpu (where decoded batches go)")
    ld.add_argument("--batch-size", type=int, help="per rank (default: bench run's, 64 on GPU, 8 on CPU)")
    ld.add_argument("--image-size", type=int, help="px (default: bench run's, 224 on GPU, 64 on CPU)")
    ld.add_argument("--batches", type=int, default=50, help="batches to time per rank after the warm-up ones")
    ld.add_argument("--warmup-batches", type=int, default=5)
    ld.add_argument("--results", help="also write a record to RESULTS/loader/ (bench report reads it)")
    ld.set_defaults(func=cmd_loader)


def choices(text: str, valid: tuple, what: str) -> list[str]:
    names = list(valid) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise UsageError(f"--{what}s {text!r}: unknown {what} {', '.join(bad) or repr(text)}; choose from "
                         f"{', '.join(valid)} or all")
    return names


def cmd_loader(args) -> int:
    import torch.multiprocessing as mp

    from bench.plan.sweep import check_writable
    from bench.core import results
    from bench.core.config import DEFAULTS
    from bench.core.devices import detect_device
    from bench.rank import data, loaders

    device_type, present = detect_device(args.device)
    names = choices(args.loaders, loaders.LOADERS, "loader")
    decodes = choices(args.decodes, loaders.DECODES, "decode")
    d = DEFAULTS[device_type]
    batch = d["batch_size"] if args.batch_size is None else args.batch_size
    size = d["image_size"] if args.image_size is None else args.image_size
    ranks = (present if device_type == "cuda" else 1) if args.ranks is None else args.ranks
    for flag, value in (("batch-size", batch), ("image-size", size), ("batches", args.batches), ("gpus", ranks)):
        if value <= 0:
            raise UsageError(f"--{flag} must be a positive integer, got {value}")
    if device_type == "cuda" and ranks > present:
        raise UsageError(f"--gpus {ranks}: this machine has {present} CUDA device(s)")
    workers = max(1, usable_cpus() // ranks) if args.workers is None else args.workers
    if workers < 0 or args.warmup_batches < 0:
        raise UsageError(f"--workers and --warmup-batches must be non-negative integers, got {workers}, "
                         f"{args.warmup_batches}")
    data.check_imagenet(args.data_dir, batch * ranks)
    if args.results:
        check_writable(Path(args.results) / "loader")
    ctx = mp.get_context("spawn")
    rows = []
    for name in names:
        for decode in decodes:
            row = {"loader": name, "decode": decode, "status": "ok", "reason": None}
            try:
                loaders.check(name, decode, device_type)
                row["reason"] = loaders.unavailable(name)
            except ValueError as e:
                row["reason"] = str(e)
            if row["reason"]:
                row["status"] = "skipped"
            rows.append(row)
    if all(r["status"] == "skipped" for r in rows):  # nothing to run: refused before any process starts (exit 2)
        why: dict[str, list[str]] = {}
        for r in rows:
            why.setdefault(r["reason"], []).append(f"{r['loader']} decode {r['decode']}")
        parts = "; ".join(f"{', '.join(paths)}: {reason}" for reason, paths in why.items())
        raise UsageError(f"nothing to run: every loader path asked for would be skipped here ({parts})")
    for row in rows:
        if row["status"] == "ok":
            row.update(measure(ctx, row["loader"], row["decode"], args.data_dir, size, batch, workers, ranks,
                               device_type, args.batches, args.warmup_batches))
        print(line(row, workers, ranks, batch, size, args.batches), flush=True)
    if args.results:
        env = environment.collect_env()
        record = {"schema": LOADER_SCHEMA, "kind": "loader", "run_id": results.new_run_id("loader", ranks), "status": "ok",
                  "data_dir": str(args.data_dir), "image_size": size, "batch_per_rank": batch, "ranks": ranks,
                  "workers_per_rank": workers, "batches": args.batches, "device_type": device_type,
                  "hardware": results.hardware({"device_type": device_type, "env": env}), "results": rows,
                  "env": env, "finished_at": results.utc_now()}
        out = Path(args.results) / "loader" / f"{record['run_id']}.json"
        results.write_json_atomic(record, out)
        print(f"loader: record {out}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def line(row: dict, workers: int, ranks: int, batch: int, size: int, batches: int) -> str:
    head = f"loader: {row['loader']} decode {row['decode']}: "
    if row["status"] != "ok":
        return head + f"{row['status']}: {row['reason']}"
    per = ", ".join(f"{x:.1f}" for x in row["per_rank_img_s"])
    return (head + f"{row['node_img_s']:.1f} img/s with {workers} workers per rank, {ranks} rank(s) on this node "
            f"(per rank: {per} img/s; {batches} batches of {batch} at {size} px; {row['skipped']} unreadable images "
            f"skipped, {row['empty_classes']} empty class folders)")


def measure(ctx, name, decode, data_dir, size, batch, workers, ranks, device_type, batches, warmup) -> dict:
    """Start ``ranks`` processes at once, each timing its own shard; the node's figure is all ranks' images over
    the slowest rank's time."""
    queue, barrier = ctx.Queue(), ctx.Barrier(ranks)
    procs = [ctx.Process(target=measure_rank, args=(queue, barrier, name, decode, data_dir, size, batch, workers, r, ranks,
                                             device_type, batches, warmup)) for r in range(ranks)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in procs:
            rank, out = queue.get(timeout=1800)
            got[rank] = out
    except Exception as e:  # noqa: BLE001 - a rank that died: report it, keep measuring the other paths
        got = {None: f"a rank did not report ({type(e).__name__})"}
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    errors = [v for v in got.values() if isinstance(v, str)]
    if errors or len(got) < ranks:
        return {"status": "failed", "reason": errors[0] if errors else "a rank did not report"}
    seconds = [got[r]["seconds"] for r in range(ranks)]
    images = batches * batch
    return {"per_rank_img_s": [images / s for s in seconds], "node_img_s": ranks * images / max(seconds),
            "skipped": sum(got[r]["skipped"] for r in range(ranks)), "empty_classes": got[0]["empty_classes"]}

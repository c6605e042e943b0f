"""``python -m bench loader``: the ceiling every input pipeline puts on training, with no model at all.

Every loader and decode path (bench/loaders) reads the same folder the way a run's ranks do: ``--ranks N``
processes at once on this node, each reading its own shard with ``--workers`` loader workers (DataLoader processes,
or DALI threads), timed after warm-up batches. One line per path: images per second for the node (all ranks'
images over the slowest rank's time) and per rank. ``--results DIR`` also writes a record to DIR/loader/, which
the report's "Input bound" section reads next to the training runs.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from bench.config import usable_cpus

SCHEMA = "loader-1"


def register(sub) -> None:
    ld = sub.add_parser("loader", help="the input pipelines' ceiling (img/s, no model): every loader and decode "
                                       "path side by side, per rank and per node")
    ld.add_argument("--data-dir", required=True)
    ld.add_argument("--loaders", default="all", help="comma-separated: torchvision, dali (default all)")
    ld.add_argument("--decodes", default="all", help="comma-separated: cpu, gpu (default all; gpu needs CUDA)")
    ld.add_argument("--ranks", type=int, help="processes reading disjoint shards at once, as a run's ranks do "
                                              "(default: the GPUs here, or 1 on CPU)")
    ld.add_argument("--workers", type=int, help="loader workers per rank (default: the cores / ranks, one per core)")
    ld.add_argument("--device", default="auto", help="auto | cuda | cpu (where decoded batches go)")
    ld.add_argument("--batch-size", type=int, help="per rank (default: bench run's, 64 on GPU, 8 on CPU)")
    ld.add_argument("--image-size", type=int, help="px (default: bench run's, 224 on GPU, 64 on CPU)")
    ld.add_argument("--batches", type=int, default=50, help="batches to time per rank after the warm-up ones")
    ld.add_argument("--warmup-batches", type=int, default=5)
    ld.add_argument("--results", help="also write a record to RESULTS/loader/ (bench report reads it)")
    ld.set_defaults(func=cmd_loader)


def choices(text: str, valid: tuple, what: str) -> list[str]:
    from bench.cli import UsageError

    names = list(valid) if text == "all" else [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise UsageError(f"unknown {what} {', '.join(bad) or repr(text)}; choose from {', '.join(valid)} or all")
    return names


def cmd_loader(args) -> int:
    import torch.multiprocessing as mp

    from bench import data, loaders, results
    from bench.cli import UsageError, check_writable, detect_device
    from bench.config import DEFAULTS

    device_type, present = detect_device(args.device)
    names = choices(args.loaders, loaders.LOADERS, "loader")
    decodes = choices(args.decodes, loaders.DECODES, "decode")
    d = DEFAULTS[device_type]
    batch = d["batch_size"] if args.batch_size is None else args.batch_size
    size = d["image_size"] if args.image_size is None else args.image_size
    ranks = (present if device_type == "cuda" else 1) if args.ranks is None else args.ranks
    for flag, value in (("batch-size", batch), ("image-size", size), ("batches", args.batches), ("ranks", ranks)):
        if value <= 0:
            raise UsageError(f"--{flag} must be a positive integer, got {value}")
    if device_type == "cuda" and ranks > present:
        raise UsageError(f"--ranks {ranks}: this machine has {present} CUDA device(s)")
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
            else:
                row.update(measure(ctx, name, decode, args.data_dir, size, batch, workers, ranks, device_type,
                                   args.batches, args.warmup_batches))
            rows.append(row)
            print(line(row, workers, ranks, batch, size, args.batches), flush=True)
    if args.results:
        env = results.collect_env()
        record = {"schema": SCHEMA, "kind": "loader", "run_id": results.new_run_id("loader", ranks), "status": "ok",
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
    procs = [ctx.Process(target=_rank, args=(queue, barrier, name, decode, data_dir, size, batch, workers, r, ranks,
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


def _rank(queue, barrier, name, decode, data_dir, size, batch, workers, rank, ranks, device_type, batches, warmup):
    import torch

    from bench import data, loaders

    try:
        torch.set_num_threads(1)  # the workers do the work; the rank's own threads should not compete with them
        device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
        if device.type == "cuda":
            # Before anything touches CUDA: the DataLoader's pin-memory thread (torch/utils/data/_utils/
            # pin_memory.py, _pin_memory_loop) sets its device to torch.accelerator.current_device_index() of this
            # process, read when the iterator starts (dataloader.py, _MultiProcessingDataLoaderIter.__init__), and
            # DALI's and nvJPEG's allocations land on the current device too: without this, every rank opens a
            # context on GPU 0.
            torch.cuda.set_device(device)
        source = loaders.build(name, decode, data_dir, size, batch, workers, rank, ranks, distributed=ranks > 1,
                               device=device)
        timed = data.TimedBatches(source, device)
        for _ in range(warmup):
            next(timed)
        barrier.wait(timeout=1800)
        t0 = time.perf_counter()
        for _ in range(batches):
            next(timed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        queue.put((rank, {"seconds": time.perf_counter() - t0, "skipped": timed.skipped,
                          "empty_classes": timed.empty_classes}))
    except Exception as e:  # noqa: BLE001 - one line back to the parent
        print(f"loader rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        queue.put((rank, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
        barrier.abort()

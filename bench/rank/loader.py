"""One rank of ``bench loader``: read this rank's shard through one loader and decode path, time the batches after
warm-up (no model), and send the figures back to the command (bench/commands/loader.py) through its queue."""
from __future__ import annotations

import sys
import time


def measure_rank(queue, barrier, name, decode, data_dir, size, batch, workers, rank, ranks, device_type, batches, warmup):
    import torch

    from bench.core import cuda
    from bench.rank import data, loaders

    try:
        torch.set_num_threads(1)  # the workers do the work; the rank's own threads should not compete with them
        device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
        if device.type == "cuda":
            # Before anything touches CUDA: the DataLoader's pin-memory thread (torch/utils/data/_utils/
            # pin_memory.py, _pin_memory_loop) sets its device to torch.accelerator.current_device_index() of this
            # process, read when the iterator starts (dataloader.py, _MultiProcessingDataLoaderIter.__init__), and
            # DALI's and nvJPEG's allocations land on the current device too: without this, every rank opens a
            # context on GPU 0.
            cuda.set_device(device)
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
            cuda.synchronize(device)
        queue.put((rank, {"seconds": time.perf_counter() - t0, "skipped": timed.skipped,
                          "empty_classes": timed.empty_classes}))
    except Exception as e:  # noqa: BLE001 - one line back to the parent
        print(f"loader rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        queue.put((rank, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"))
        barrier.abort()

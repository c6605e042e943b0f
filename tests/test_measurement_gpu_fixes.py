"""Issue 24, measurement correctness: collectives (agreed sizes, nccl-tests timing), energy over the whole timed
span, dp's knobs, MFU peaks of the NVL parts, DataParallel's memory imbalance under cudnn.benchmark, and the
warmed-up evaluation. CPU tests show each mechanism; ``gpu``-marked ones need CUDA."""
import json
import os
import time
from pathlib import Path

import pytest
import torch

GiB = 2 ** 30


# -- 4. collectives: the ranks agree on the sizes -------------------------------------------------------

def _collectives_rank(rank, world, port, out_dir, free_by_rank):
    """One rank of a 2-rank gloo collectives sweep whose free memory is ``free_by_rank[rank]``; it writes the
    (op, size) pairs it timed to out_dir/rank{rank}.json."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from bench import collectives
    from bench.config import RunConfig

    collectives._free_bytes = lambda device: free_by_rank[rank]
    ran, timed = [], collectives._time

    def spy(op, size, *args):
        ran.append([op, size])
        return timed(op, size, *args)

    collectives._time = spy
    cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=world, device_type="cpu", model="none",
                    image_size=1, batch_size=1, warmup=2, steps=1, windows=1).validate()
    collectives.run_rank({"config": cfg.to_dict(), "threads_per_rank": 1, "run_id": "agreed", "env": {},
                          "results_dir": out_dir,
                          "collectives": {"ops": ["all_reduce", "all_gather"], "sizes": [4096, 16384, 65536],
                                          "iters": 2, "warmup": 1}})
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(ran))


def test_collectives_ranks_agree_on_the_sizes_the_tightest_rank_fits(tmp_path):
    import torch.multiprocessing as mp

    from bench import collectives, launch

    # rank 1 has room for a 64 KiB all_gather but not a 64 KiB all_reduce; rank 0 has room for everything
    tight = collectives._needs("all_gather", 65536, 2)
    assert collectives._needs("all_reduce", 65536, 2) > tight
    ctx = mp.start_processes(_collectives_rank, args=(2, launch.free_port(), str(tmp_path), [GiB, tight]),
                             nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 90
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "collectives ranks hung (they ran different sizes)"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    expected = [["all_reduce", 4096], ["all_reduce", 16384], ["all_gather", 4096], ["all_gather", 16384],
                ["all_gather", 65536]]
    assert r0 == r1 == expected
    rec = json.loads((tmp_path / "agreed.json").read_text())
    assert rec["free_bytes_min"] == tight
    assert rec["left_out"] == [{"op": "all_reduce", "bytes": 65536}]
    assert [[r["op"], r["bytes"]] for r in rec["results"]] == expected


# -- 5. collectives: timed as nccl-tests does -------------------------------------------------------------

def test_collectives_time_iters_back_to_back_between_one_sync():
    from bench import collectives

    log, ticks = [], iter([10.0, 10.8])

    def clock():
        log.append("clock")
        return next(ticks)

    seconds = collectives.time_block(lambda: log.append("op"), lambda: log.append("sync"),
                                     lambda: log.append("barrier"), warmup=2, iters=4, clock=clock)
    assert log == ["op", "op", "sync", "barrier", "clock", "op", "op", "op", "op", "sync", "clock"]
    assert seconds == pytest.approx(0.8 / 4)


def test_collectives_gpu_range_reaches_1_gib():
    from bench import collectives

    lo, hi = map(collectives.parse_size, collectives.DEFAULT_RANGE["cuda"])
    assert collectives.sizes(lo, hi)[-1] >= GiB

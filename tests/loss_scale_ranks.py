"""What every rank of a 2-rank fp16 run does in tests/test_loss_scale.py: each backend named trains a few steps of
gpt-micro at fp16 on the CPU (autocast and GradScaler("cpu") run there; bench run refuses fp16 without CUDA, so the
backends are driven here as bench/rank/train.py drives them: setup, the harness's data, ``train(1)``), with the fault
``overflow@rank1:step3`` installed as BENCH_FAULT would install it: at step 3 one element of one gradient is inf on
rank 1 alone, before any reduction. After each step every rank notes its loss scale and the steps it skipped (the
harness's own reading, ``bench.rank.train.skips``); rank 0 writes what every rank noted, and the replica checksums.

Started by torch.multiprocessing.spawn (``spawned``: one gloo group for every case, as tests/test_numerics.py does) or,
for horovod, by horovodrun (``python -m tests.loss_scale_ranks OUT horovod``), which starts Horovod's own ranks."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STEPS = 5
FAULT = "overflow@rank1:step3"


def cases(names: list[str]) -> list[tuple[str, dict]]:
    """``name`` at its defaults, ``name:knob=value`` with one option (fsdp2:fsdp_mp=params)."""
    out = []
    for name in names:
        backend, _, option = name.partition(":")
        key, _, value = option.partition("=")
        out.append((backend, {key: value} if option else {}))
    return out


def run_cases(names: list[str], out: str) -> None:
    import torch

    import backends
    from bench.core.config import RunConfig
    from bench.rank import data
    from bench.rank.faults import Fault
    from bench.rank.record import param_checksum
    from bench.rank.train import skips

    torch.set_num_threads(1)
    seen = {}
    for name, options in cases(names):
        b = backends.create(name)
        cfg = RunConfig(backend=name, launcher=b.launcher, world_size=2, device_type="cpu", model="gpt-micro",
                        image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1, precision="fp16",
                        options=options).validate()
        try:
            b.setup(cfg)
            Fault.parse(FAULT).install(b)
            b.batches = data.batches_for(cfg, b)
            trail = []
            for _ in range(STEPS):
                scale, count = b.loss_scale(), b.skipped_steps()
                b.train(1)
                trail.append([b.loss_scale(), skips(scale, b.loss_scale(), count, b.skipped_steps())])
            mine = {"trail": trail, "checksum": param_checksum(b.full_parameters())}
        except Exception as e:  # noqa: BLE001 - one case failing must not hide the others
            mine = {"crashed": f"{type(e).__name__}: {e}"}
        seen[name + (f":{json.dumps(options)}" if options else "")] = b.all_gather(mine) if "crashed" not in mine \
            else [mine]
    if int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))) == 0:
        Path(out).write_text(json.dumps(seen))


def spawned(rank: int, port: int, names: list[str], out: str) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    dist.init_process_group("gloo")  # one group for every case (each backend skips its own when one exists)
    run_cases(names, out)


if __name__ == "__main__":  # under horovodrun: OUT NAME...
    run_cases(sys.argv[2:], sys.argv[1])

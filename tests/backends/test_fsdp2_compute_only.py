"""FSDP2's compute-only windows (bench/rank/train.py's reference without gradient synchronisation) must not hold the
whole model's unsharded gradients: under set_requires_gradient_sync(False) FSDP2 keeps and accumulates them, which
made compute-only steps heavier than real ones and could run a --find-max-model probe out of memory after its real
steps fitted. 2 gloo ranks (torch.multiprocessing.spawn), the backend as the harness drives it."""
import json
import os
import socket

import pytest
import torch

import backends
from backends import fsdp2 as fsdp2_module
from bench.core.config import RunConfig
from bench.rank import data, entry


def _held(model) -> int:
    """Bytes of unsharded gradients FSDP2 holds right now."""
    return sum(p._unsharded_param.grad.numel() * p._unsharded_param.grad.element_size()
               for p in fsdp2_module.fsdp_params(model)
               if getattr(p, "_unsharded_param", None) is not None and p._unsharded_param.grad is not None)


def _rank(rank: int, port: int, out: str, drop: bool) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if not drop:
        fsdp2_module.drop_unsharded_grads = lambda model: 0  # the code before the fix
    cfg = RunConfig(backend="fsdp2", launcher="torchrun", world_size=2, device_type="cpu", model="resnet18",
                    image_size=32, batch_size=2, warmup=2, steps=1, windows=1).validate()
    b = backends.create("fsdp2")
    b.setup(cfg)
    b.batches = data.batches_for(cfg, b)
    b.train(2)
    held = {"real": _held(b.module), "compute_only": []}
    with b.skip_gradient_sync():
        for _ in range(3):
            b.train(1)
            held["compute_only"].append(_held(b.module))
    b.train(1)
    held["real_after"] = _held(b.module)
    held["params_bytes"] = sum(p.numel() * 4 for _, p in b.full_parameters())
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(held, f)
    b.teardown()
    entry.exit_done()  # as the harness's ranks end: torch's Gloo may abort at interpreter shutdown (1 run in 10 here)


def _spawn(tmp_path, drop: bool) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank, args=(port, str(tmp_path), drop), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_compute_only_steps_hold_no_unsharded_gradients(tmp_path):
    for held in _spawn(tmp_path, drop=True):
        assert held["real"] == 0 and held["real_after"] == 0  # a real step reduce-scatters and frees them
        assert held["compute_only"] == [0, 0, 0]  # flat: nothing held between compute-only steps
    (tmp_path / "before").mkdir()
    for held in _spawn(tmp_path / "before", drop=False):  # without the fix: the whole model's gradients, every step
        assert held["compute_only"][0] >= 0.99 * held["params_bytes"] and min(held["compute_only"]) > 0

"""Cluster-facing settings (issue 24): --external's local rank from the engine's own variables, the per-run
timeout's growth with --compile and world size, and baseline names keyed on GPU model and count."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from bench import cli, multinode

ENGINE_VARS = [v for rank, sizes in multinode.LOCAL_ENV for v in (rank, *sizes)] + ["SLURM_NODEID"]


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this node has N CUDA devices; clears every engine variable and returns a setter."""
    for v in ENGINE_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "node01")
    monkeypatch.setenv("MASTER_PORT", "29500")

    def fake(n):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    return fake


def world(device="auto"):
    return multinode.external_world(argparse.Namespace(device=device))


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"}, (1, 4)),
    ({"SLURM_LOCALID": "3", "SLURM_TASKS_PER_NODE": "4(x2)"}, (3, 4)),
    ({"SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4,2(x2)", "SLURM_NODEID": "2"}, (1, 2)),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (2, 4)),
    ({"MV2_COMM_WORLD_LOCAL_RANK": "3", "MV2_COMM_WORLD_LOCAL_SIZE": "4"}, (3, 4)),
    ({"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, (1, 2)),
    # torchrun's own variables win over the engine's underneath it (torchrun inside an srun task)
    ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1"}, (0, 4)),
])
def test_external_local_rank_from_the_engine(gpus, monkeypatch, env, expected):
    gpus(4)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import os
    w, nodes = world()
    assert (int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])) == expected
    assert (w, nodes) == (8, 8 // expected[1])


def test_external_without_a_local_rank_is_refused_on_several_gpus(gpus, capsys, tmp_path):
    gpus(2)
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--external", "--backends", "ddp", "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err == ("bench: error: --external on a node with 2 GPUs needs this process's local rank from its engine, "
                   "and none of LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK, "
                   "MPI_LOCALRANKID is set (every rank would use cuda:0)\n")


@pytest.mark.parametrize("n, device", [(1, "auto"), (0, "auto"), (4, "cpu")])
def test_external_without_a_local_rank_is_rank_0_of_1_with_one_gpu_or_on_cpu(gpus, n, device):
    import os
    gpus(n)
    assert world(device) == (8, 8) and (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("0", "1")


def test_external_local_rank_beyond_the_node_gpus_is_refused(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    with pytest.raises(cli.UsageError) as e:
        world()
    assert str(e.value) == ("OMPI_COMM_WORLD_LOCAL_RANK=2 but this node has 2 GPU(s): start at most one process "
                            "per GPU")


# ---------------------------------------------------------------------------------------------------
# The per-run timeout grows with --compile and the world size (bench/launch.py default_timeout)

def _cfg(world=1, compile=False, warmup=10, steps=10, windows=5):
    from bench.config import RunConfig
    return RunConfig(backend="ddp", launcher="torchrun", world_size=world, device_type="cuda", model="resnet50",
                     image_size=224, batch_size=32, warmup=warmup, steps=steps, windows=windows,
                     options={"compile": True} if compile else {})


@pytest.mark.parametrize("world, compile, expected", [
    (1, False, 180 + 5 * 60),                      # unchanged for one rank, eager
    (1, True, 180 + 600 + 5 * 60),                 # --compile: a fixed 600 s allowance
    (2, False, 180 + 2 + 20 + 5 * 60),             # 2 s per rank beyond the first, 20 s per doubling
    (8, False, 180 + 14 + 60 + 5 * 60),
    (64, True, 180 + 600 + 126 + 120 + 5 * 60),
])
def test_default_timeout_grows_with_compile_and_world_size(world, compile, expected):
    from bench import launch
    assert launch.default_timeout(_cfg(world, compile)) == expected


def test_default_timeout_adds_the_rendezvous_wait_of_several_nodes():
    from bench import launch
    from bench.config import Nodes
    nodes = Nodes(nnodes=2, node_rank=0, endpoint="h:1", rdzv_id="x", join_timeout=300, hosts=None, local_addr=None)
    assert launch.default_timeout(_cfg(16), nodes) == 180 + 300 + 30 + 80 + 5 * 60

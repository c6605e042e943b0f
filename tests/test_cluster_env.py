"""Cluster-facing settings: --external's local rank from the engine's own variables, the per-run
timeout's growth with --compile and world size, and baseline names keyed on GPU model and count."""
from __future__ import annotations

import argparse

import pytest

from bench import cli
from bench.plan import nodes as multinode
from bench.plan.sweep import world_sizes
from bench.core.errors import UsageError
from tests.fake_gpu import FakeGpu, FakeGpuMachine

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
        FakeGpuMachine([FakeGpu() for _ in range(n)]).install(monkeypatch)
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


def test_external_refuses_a_backend_torchrun_does_not_launch_naming_those_it_does(gpus, capsys, tmp_path, monkeypatch):
    gpus(0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--external", "--backends", "single", "--results", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "bench: error: --external runs one torch.distributed backend (launched by torchrun otherwise: ddp, "
        "ddp_amp_syncbn, fsdp2, ds_zero1, ds_zero2, ds_zero3, ddp_zero, allreduce_manual) at the world size the "
        "engine set; got single x1\n")


@pytest.mark.parametrize("n, device", [(1, "auto"), (0, "auto"), (4, "cpu")])
def test_external_without_a_local_rank_is_rank_0_of_1_with_one_gpu_or_on_cpu(gpus, n, device):
    import os

    gpus(n)
    assert world(device) == (8, 8) and (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]) == ("0", "1")


def test_external_local_rank_beyond_the_node_gpus_is_refused(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    with pytest.raises(UsageError) as e:
        world()
    assert str(e.value) == ("OMPI_COMM_WORLD_LOCAL_RANK=2 but this node has 2 GPU(s): start at most one process "
                            "per GPU")


# ---------------------------------------------------------------------------------------------------
# The per-run timeout grows with --compile and the world size (bench/launch/run.py, default_timeout)

def _cfg(world=1, compile=False, warmup=10, steps=10, windows=5):
    from bench.core.config import RunConfig

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
    from bench.core.config import Nodes

    nodes = Nodes(nnodes=2, node_rank=0, endpoint="h:1", rdzv_id="x", join_timeout=300, hosts=None, local_addr=None)
    assert launch.default_timeout(_cfg(16), nodes) == 180 + 300 + 30 + 80 + 5 * 60


# ---------------------------------------------------------------------------------------------------
# Baseline names key on the GPU model and the sweep's largest world size (bench/baseline.py)

H100 = "NVIDIA H100 80GB HBM3"


def _rec(world_size, device_type="cuda", gpu=H100, cpus=16):
    return {"status": "ok", "device_type": device_type, "world_size": world_size,
            "memory": [{"device_name": gpu}] * world_size if device_type == "cuda" else [],
            "env": {"cpu_model": "Test CPU @ 3.00GHz", "cpu_count": cpus}}


def test_baseline_name_from_records_keys_on_model_and_world_size():
    from bench.commands import baseline

    eight = [_rec(n) for n in (1, 2, 4, 8)]
    assert baseline.default_name(eight) == "NVIDIA-H100-80GB-HBM3-x8"
    assert baseline.default_name(eight[:2]) == "NVIDIA-H100-80GB-HBM3-x2"
    assert baseline.default_name([_rec(2, "cpu", cpus=4)]) == "CPU-Test-CPU-3.00GHz-4cores-x2"
    with pytest.raises(UsageError) as e:
        baseline.default_name([_rec(1, "cpu", cpus=4), _rec(1, "cpu", cpus=8)])
    assert str(e.value) == "the records come from CPUs with 4, 8 cores; give --name"


@pytest.fixture
def six_h100(monkeypatch):
    FakeGpuMachine([FakeGpu(H100) for _ in range(6)]).install(monkeypatch)


def name(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        cli.main(["baseline", "name", *argv])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_machine_baseline_name_is_the_name_of_the_sweep_it_would_run(six_h100, capsys, tmp_path):
    from bench.commands import baseline

    # GPUS=all on 6 GPUs sweeps 1, 2, 4, 6 (world_sizes): the records of that sweep get the same name
    sweep = world_sizes(None, "all", "cuda", 6)
    assert sweep == [1, 2, 4, 6] and baseline.default_name([_rec(n) for n in sweep]) == "NVIDIA-H100-80GB-HBM3-x6"
    assert name(capsys, "--dir", str(tmp_path)) == (0, "NVIDIA-H100-80GB-HBM3-x6\n", "")
    assert name(capsys, "--max-gpus", "2", "--dir", str(tmp_path)) == (0, "NVIDIA-H100-80GB-HBM3-x2\n", "")
    assert name(capsys, "--gpus", "1,4", "--dir", str(tmp_path)) == (0, "NVIDIA-H100-80GB-HBM3-x4\n", "")
    code, out, err = name(capsys, "--max-gpus", "8", "--dir", str(tmp_path))
    assert (code, out, err) == (2, "", "bench: error: --gpus 8: this machine has 6 CUDA device(s)\n")


def test_machine_baseline_name_still_reads_a_model_only_baseline(six_h100, capsys, tmp_path):
    (tmp_path / "NVIDIA-H100-80GB-HBM3.json").write_text("{}")
    code, out, err = name(capsys, "--dir", str(tmp_path))
    assert (code, out) == (0, "NVIDIA-H100-80GB-HBM3\n")
    assert err == (f"bench baseline name: using {tmp_path}/NVIDIA-H100-80GB-HBM3.json, named before the world size "
                   "was part of the name; if it was recorded with this sweep, rename it to "
                   "NVIDIA-H100-80GB-HBM3-x6.json\n")
    (tmp_path / "NVIDIA-H100-80GB-HBM3-x6.json").write_text("{}")  # the new name wins once it exists
    assert name(capsys, "--dir", str(tmp_path)) == (0, "NVIDIA-H100-80GB-HBM3-x6\n", "")

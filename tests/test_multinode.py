"""Several nodes, on one machine: two `bench run --nnodes 2` processes joined by torchrun's c10d rendezvous, as two
machines would run them; the external-launcher entry with the environment set by hand; the Slurm script's
command for a given allocation."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY, bench, cli_error, records
from bench.launch.run import free_port
from tests.test_faults import _leftovers


def start_node(rank: int, port: int, results, *args, timeout=60):
    """One node's `bench run`, in the background, as a user starts it on each machine."""
    cmd = [sys.executable, "-m", "bench", "run", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint",
           f"127.0.0.1:{port}", "--rdzv-timeout-s", str(timeout), "--gpus", "1", "--results", str(results), *args]
    env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
    return subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.mark.slow
def test_two_nodes_on_one_machine_give_one_record_per_run(tmp_path):
    """Each node has its own results directory, as two machines without shared storage would: the record is on
    whichever node global rank 0 landed, and nowhere else."""
    port = free_port()
    nodes = [start_node(r, port, tmp_path / f"node{r}", "--backends", "ddp,ddp_spawn", *TINY) for r in (0, 1)]
    done = [finish(p) for p in nodes]
    for rc, out, err in done:
        assert rc == 0, out + err
    recs = records(tmp_path / "node0") + records(tmp_path / "node1")
    ok = sorted((r for r in recs if r["status"] == "ok"), key=lambda r: r["backend"])
    assert [r["backend"] for r in ok] == ["ddp"]  # (every torchrun backend joins nodes the same way)
    for r in ok:
        assert (r["world_size"], r["nnodes"], r["nproc_per_node"]) == (2, 2, 1)
        assert r["replicas_consistent"] is True
        assert r["launched_by"] == "torchrun c10d rendezvous" and len(r["hosts"]) == 2
    [skipped] = [r for r in recs if r["status"] == "skipped"]  # written by node 0 only
    assert skipped["backend"] == "ddp_spawn" and skipped["reason"].startswith("ddp_spawn is single-node by design")
    assert "record written by global rank 0 on another node" in done[0][1] + done[1][1]
    assert not _leftovers(tmp_path)


@pytest.mark.slow
def test_a_node_that_never_starts_fails_the_run_at_the_rendezvous_timeout(tmp_path):
    results = tmp_path / "node0"
    rc, out, err = finish(start_node(0, free_port(), results, "--backends", "ddp", *TINY, timeout=10))
    assert rc == 1
    [rec] = records(results)
    assert rec["status"] == "failed" and rec["nnodes"] == 2
    assert rec["reason"].startswith("rendezvous timeout: not all 2 nodes joined the rendezvous at 127.0.0.1:")
    assert "within 10 s" in rec["reason"]
    assert not _leftovers(tmp_path)


def test_a_refused_run_lost_no_peer_even_when_its_store_went_away():
    """The refused node's partner writes no record: node 0's agent, which hosts the store, may exit first, and the other
    agent's RendezvousConnectionError then looked like a lost store (a flaky run of the test below, beside a busy
    loop)."""
    from bench.launch.diagnose import lost_peer

    log = ("$ torchrun --nnodes=2 --rdzv-endpoint=127.0.0.1:29555 -m bench.rank --spec s.json\n"
           "[rank1]: BENCH-REFUSED: rank 1 on b differs from rank 0 on a in config batch_size: 4 vs 2 on rank 0\n"
           "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
           "failed.\n")
    assert lost_peer(log) is None
    assert lost_peer(log.replace("BENCH-REFUSED:", "said:")) == {
        "store": "127.0.0.1:29555",
        "error": "torchrun's agent on this node lost its connection to the rendezvous store (RendezvousConnectionError)"}


@pytest.mark.slow
def test_a_node_with_another_config_is_refused_with_one_line(tmp_path):
    port = free_port()
    base = list(TINY)
    other = list(base)
    other[other.index("--batch-size") + 1] = "4"
    nodes = [start_node(0, port, tmp_path / "node0", "--backends", "ddp", *base),
             start_node(1, port, tmp_path / "node1", "--backends", "ddp", *other)]
    done = [finish(p) for p in nodes]
    assert [rc for rc, _, _ in done] == [1, 1]
    [rec] = records(tmp_path / "node0")  # node 0 writes failed records
    assert not records(tmp_path / "node1")
    assert rec["status"] == "failed"
    # which node holds global rank 0 is the rendezvous' choice, so either value may be rank 0's
    assert re.fullmatch(r"refused: rank 1 on \S+ differs from rank 0 on \S+ in config batch_size: (4 vs 2|2 vs 4) "
                        r"on rank 0 \(start every node with the same command and software\)", rec["reason"]), rec
    assert not _leftovers(tmp_path)


@pytest.mark.slow
def test_external_launcher_entry_with_the_environment_set_by_hand(tmp_path):
    """What Kubeflow's PyTorchJob or Ray set for each process; here two processes on this machine."""
    results, port = tmp_path / "raw", free_port()
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "bench", "run", "--external", "--backends", "ddp",
                                       *TINY, "--results", str(results)], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        rc, out, err = finish(p)
        assert rc == 0, out + err
    [rec] = records(results)
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["launched_by"] == "external"
    assert rec["replicas_consistent"] is True and (rec["nnodes"], rec["nproc_per_node"]) == (1, 2)
    assert rec["hosts"] == [socket.gethostname()] * 2


def test_external_without_the_engine_environment_is_one_line(tmp_path, capsys, monkeypatch):
    env = {k: "" for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    code, err = cli_error(capsys, "run", "--external", "--backends", "ddp", *TINY, "--results", tmp_path, env=env,
                          monkeypatch=monkeypatch)
    assert code == 2
    assert err.strip() == ("bench: error: --external needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and "
                                   "LOCAL_RANK) from the engine that started this process; missing: RANK, "
                                   "WORLD_SIZE, MASTER_ADDR, MASTER_PORT")


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
     "--node-rank must be 0 .. 1 with --nnodes 2, got 2"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "nohost"],
     "--rdzv-endpoint 'nohost': expected HOST:PORT of the rendezvous, the same on every node (e.g. node01:29500)"),
    (["--node-rank", "1"], "--node-rank is for several nodes; give --nnodes N (N > 1) too"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--backends", "horovod", "--hosts", "a:1,b:2"],
     "--hosts 'a:1,b:2' has 3 slots for a world size of 2"),
])
def test_bad_node_arguments_are_one_line(tmp_path, args, message, capsys):
    code, err = cli_error(capsys, "run", "--gpus", "1", "--device", "cpu", *args, "--results", tmp_path)
    assert code == 2 and err.strip() == f"bench: error: {message}"


@pytest.mark.slow
def test_nodelist_expands_slurm_host_lists():
    proc = bench("nodelist", "gpu[01-03,10],login1,rack[1-2]-n[7-8]", check=True)
    assert proc.stdout.split() == ["gpu01", "gpu02", "gpu03", "gpu10", "login1", "rack1-n7", "rack1-n8", "rack2-n7",
                                   "rack2-n8"]
    assert bench("nodelist", "--first", "gpu[08-09]", check=True).stdout.strip() == "gpu08"


@pytest.mark.slow
def test_a_light_command_imports_its_own_module_and_no_torch(capsys):
    """The CLI imports the named command's module alone: a Slurm script's ``nodelist`` on every node, a report or a
    comparison, starts without importing torch (2 s of CPU a call on 2 cores)."""
    # what bench/__main__.py does, and at exit the modules it had imported
    main = ("import atexit, json, sys; atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr));"
            " from bench.cli import main; main()")
    for args in (["nodelist", "gpu[01-02]"], ["report", "--help"], ["compare", "--help"]):
        proc = subprocess.run([sys.executable, "-c", main, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        imported = set(json.loads(proc.stderr.splitlines()[-1]))
        assert f"bench.commands.{args[0]}" in imported and "bench.commands.run" not in imported, args
        assert "torch" not in imported, args
    # no command named first: every command's parser, so the help lists each and a wrong name lists every choice
    from bench.cli import build_parser
    from bench.commands import COMMANDS
    assert "{" + ",".join(COMMANDS) + "}" in build_parser().format_help()
    code, err = cli_error(capsys, "nodelists")
    assert code == 2 and err.strip() == ("bench: error: argument command: invalid choice: 'nodelists' (choose from "
                                         + ", ".join(f"'{c}'" for c in COMMANDS) + ") (see python -m bench --help)")


SBATCH = REPO / "scripts" / "slurm" / "bench.sbatch"


@pytest.mark.slow
def test_slurm_script_builds_the_srun_command_for_an_allocation(tmp_path):
    env = {**os.environ, "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "42",
           "SLURM_SUBMIT_DIR": str(REPO), "GPUS": "4", "BACKENDS": "ddp,fsdp2", "PYTHON": sys.executable,
           "RESULTS": "/shared/raw", "ARGS": "--model resnet50 --repeat 3", "BENCH_DRY_RUN": "1"}
    proc = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # printf %q quoting, read back the way bash reads it
    words = subprocess.run(["bash", "-c", f"for w in {proc.stdout.strip()}; do echo \"$w\"; done"],
                           capture_output=True, text=True).stdout.splitlines()
    assert words == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash", "-c",
                     'exec "$@" --node-rank "$SLURM_NODEID"', "bench", sys.executable, "-m", "bench", "run",
                     "--nnodes", "2", "--gpus", "4", "--backends", "ddp,fsdp2", "--rdzv-endpoint", "gpu07:29500",
                     "--rdzv-id", "slurm-42", "--hosts", "gpu07:4,gpu08:4", "--results", "/shared/raw",
                     "--model", "resnet50", "--repeat", "3"]
    outside = subprocess.run(["bash", str(SBATCH)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert outside.returncode == 1 and "not inside a Slurm allocation" in outside.stderr


def test_slurm_script_passes_bash_n_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (.ci/run installs Debian's shellcheck)")
    proc = subprocess.run(["shellcheck", str(SBATCH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout

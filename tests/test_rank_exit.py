"""A rank that finished its task ends without the interpreter's finalisation (bench/rank/entry.py exit_done): torch's
Gloo can abort a process there, after its results were written ("terminate called without an active exception"),
which made a finished fsdp2 run's launcher report FAILED and failed 2-rank tests that spawn their ranks. The crash is
a race; here a task arms the same kind of crash deterministically (abort() from an exit handler), on each way a rank
process starts: the torchrun/horovodrun entry and a torch.multiprocessing.spawn child."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _abort_at_exit(spec: dict) -> None:
    import atexit

    atexit.register(os.abort)  # what a library's shutdown crash does to a process that finalises
    print(f"task done: {spec['task']}", flush=True)


_START = {
    "entry": "entry.main(['--spec', sys.argv[1]])",
    "spawned": "entry._spawned(0, json.load(open(sys.argv[1])), 1)",
}


@pytest.mark.parametrize("start", sorted(_START))
def test_a_finished_rank_exits_0_even_when_finalisation_would_abort(tmp_path, start):
    spec = tmp_path / "spec.json"
    spec.write_text('{"task": "abort_at_exit", "config": {"nnodes": 1}, "master_port": 29999}')
    code = ("import json, sys\nfrom bench.rank import entry\n"
            "entry.TASKS['abort_at_exit'] = 'tests.test_rank_exit:_abort_at_exit'\n" + _START[start])
    env = {k: v for k, v in os.environ.items() if k != "BENCH_HARNESS"}
    proc = subprocess.run([sys.executable, "-c", code, str(spec)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout == "task done: abort_at_exit\n", proc.stdout + proc.stderr
    assert proc.returncode == 0, (proc.returncode, proc.stderr)

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


# -- a rank's set-up without the cyclic garbage collector (bench/rank/startup.py) ----------------------------------------

def _say_collector(spec: dict) -> None:
    import gc

    print(f"collector on in set-up: {gc.isenabled()}", flush=True)


def test_a_spawned_rank_sets_up_with_the_collector_off(tmp_path):
    """A torch.multiprocessing.spawn child starts as multiprocessing starts it, not through ``python -m bench.rank``
    (tests/test_workloads.py checks that path and two tasks, in real runs): _spawned turns the collector off itself."""
    spec = tmp_path / "spec.json"
    spec.write_text('{"task": "say_collector", "config": {"nnodes": 1}, "master_port": 29999}')
    code = ("import json, sys\nfrom bench.rank import entry\n"
            "entry.TASKS['say_collector'] = 'tests.test_rank_exit:_say_collector'\n" + _START["spawned"])
    env = {k: v for k, v in os.environ.items() if k != "BENCH_HARNESS"}
    proc = subprocess.run([sys.executable, "-c", code, str(spec)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "collector on in set-up: False\n"), proc.stderr


def test_every_task_turns_the_collector_back_on_before_its_steps():
    """Each task function in bench.rank.entry.TASKS calls ``startup.done()`` (a task that forgot would time its loop
    with the collector off); the train and verify tasks are also checked where their losses are computed
    (tests/test_workloads.py)."""
    import ast

    from bench.rank import entry

    for task, target in entry.TASKS.items():
        module, _, func = target.partition(":")
        tree = ast.parse((REPO / (module.replace(".", "/") + ".py")).read_text())
        [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func]
        calls = [ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)]
        assert "startup.done" in calls, f"task {task!r} ({target}) never calls startup.done()"

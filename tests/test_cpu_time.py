"""`make test`'s CPU accounting (tests/cpu_time.py): a test's CPU counts the processes it waited for, and the summary
adds the workers' lines up per module."""
import json
import os
import subprocess
import sys

import pytest

from tests import cpu_time
from tests.conftest import REPO

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_a_tests_cpu_time_counts_the_processes_it_waited_for(tmp_path):
    with cpu_time.measure("tests/test_x.py::test_burns", tmp_path):
        subprocess.run([sys.executable, "-c", BURN], check=True)
    [line] = [json.loads(ln) for f in tmp_path.glob("*.jsonl") for ln in f.read_text().splitlines()]
    assert line["test"] == "tests/test_x.py::test_burns"
    assert 0.3 <= line["cpu"] < line["wall"] + 5 and line["wall"] >= 0.3  # the child's 0.3 s of CPU, at least


@pytest.mark.slow  # an interpreter importing torch: not for make test-fast
def test_a_fresh_import_of_torch_is_timed_in_its_own_process():
    got = cpu_time.calibrate()
    assert set(got) == {"cpu", "wall"} and got["cpu"] > 0.2 and got["wall"] > 0.2  # not this process's, done already


def test_the_summary_adds_the_workers_lines_up_per_module(tmp_path):
    lines = [("tests/a.py::t1", 100.0, 10.0, 18.0), ("tests/a.py::t2", 110.0, 5.0, 2.0),
             ("tests/b.py::t1", 100.0, 20.0, 30.0), ("tests/c.py::t[x]", 105.0, 1.0, 0.5)]
    for worker, chunk in (("1", lines[:2]), ("2", lines[2:])):
        (tmp_path / f"{worker}.jsonl").write_text("".join(
            json.dumps({"test": t, "start": s, "wall": w, "cpu": c}) + "\n" for t, s, w, c in chunk))
    got = cpu_time.summary(tmp_path, {"cpu": 1.934, "wall": 2.0}, top=2)
    assert got == [
        "this machine: a fresh `import torch` took 1.93 s of CPU, 2.00 s of wall time, before the tests",
        "CPU time: 50 s in 20 s of wall time (2.52 cores busy on average; the tests' own processes and those they "
        "reaped)",
        "    30.0 s CPU     20.0 s wall    1 tests  tests/b.py",
        "    20.0 s CPU     15.0 s wall    2 tests  tests/a.py",
        "worker 1: 2 tests, 20 s CPU, its last test ended at 15 s (tests/a.py::t2, 5.0 s)",
        "worker 2: 2 tests, 30 s CPU, its last test ended at 20 s (tests/b.py::t1, 20.0 s)",
    ]
    assert cpu_time.summary(tmp_path / "none") == []


@pytest.mark.slow  # two pytest processes importing torch
@pytest.mark.parametrize("nested", [False, True])
def test_a_pass_prints_its_cpu_and_a_pytest_a_test_starts_writes_none(tmp_path, nested):
    """The summary at the end of a pass, and none from a pytest started inside a test (its CPU is that test's)."""
    (tmp_path / "test_one.py").write_text(f"def test_burns():\n    {BURN.replace(chr(10), chr(10) + '    ')}\n")
    env = {k: v for k, v in os.environ.items() if k != "BENCH_TEST_CPU_DIR"}  # this session's, which a nested one sees
    env.update(BENCH_TEST_CALIBRATE="", PYTHONPATH=str(REPO))  # make test's: it would time an import of torch
    if nested:
        env["BENCH_TEST_CPU_DIR"] = str(tmp_path / "outer")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "--rootdir", tmp_path,
                           "-p", "no:cacheprovider", str(tmp_path / "test_one.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if nested:
        assert "CPU time" not in proc.stdout and not (tmp_path / "outer").exists()
    else:
        assert "= CPU time =" in proc.stdout and " 1 tests  test_one.py" in proc.stdout, proc.stdout

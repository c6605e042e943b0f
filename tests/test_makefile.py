"""The Makefile shows a user the commands it runs, not its shell recipes (`if [ -n "" ]; then ...` once filled the
screen of `make bench`)."""
import os
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_make_bench_prints_each_command_and_no_shell_block(tmp_path):
    # PY=true: every step "succeeds" at once; the install steps are the real ones (quick: already done). Run under
    # `make test ARGS=...`, the outer make's variables reach this one through MAKEFLAGS: a user's `make bench` has none
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    proc = subprocess.run(["make", "--no-print-directory", "bench", "PY=true", f"RESULTS={tmp_path}/raw",
                           f"REPORT={tmp_path}/rep"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("true ")]
    assert lines == [f"true -m bench run --max-gpus all --results {tmp_path}/raw --reference",
                     f"true -m bench collectives --max-gpus all --results {tmp_path}/raw",
                     f"true -m bench overhead --results {tmp_path}/raw",
                     f"true -m bench report --results {tmp_path}/raw --out {tmp_path}/rep"]
    assert not [ln for ln in proc.stdout.splitlines() if "status=" in ln or "if [" in ln or ln.endswith("\\")]


@pytest.mark.slow
def test_make_bench_stops_where_bench_run_refuses_its_input(tmp_path):
    """bench run's exit 2 (bad input, or GPUs torch cannot use) means nothing ran: make bench ends there with that
    code, and neither sweeps on nor re-renders a report of older records."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\necho \"ran: $*\"\ncase \"$*\" in *'bench run'*) exit 2;; esac\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    proc = subprocess.run(["make", "--no-print-directory", "bench", f"PY={fake}", f"RESULTS={tmp_path}/raw",
                           f"REPORT={tmp_path}/rep"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("ran: ")] == [
        f"ran: -m bench run --max-gpus all --results {tmp_path}/raw --reference"]


@pytest.mark.slow
def test_make_bench_quick_is_the_first_look_and_args_may_name_the_sizes(tmp_path):
    """QUICK=1: bench run --quick, no twins, no collectives sweep, no host-cost rounds; ARGS naming --gpus replaces
    the GPUS sweep (every size the user lists)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    make = ["make", "--no-print-directory", "bench", "PY=true", f"RESULTS={tmp_path}/raw", f"REPORT={tmp_path}/rep"]
    quick = subprocess.run([*make, "QUICK=1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert [ln for ln in quick.stdout.splitlines() if ln.startswith("true ")] == [
        f"true -m bench run --max-gpus all --results {tmp_path}/raw --quick",
        f"true -m bench report --results {tmp_path}/raw --out {tmp_path}/rep"]
    sizes = subprocess.run([*make, "ARGS=--gpus 1,2,4"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert f"true -m bench run --results {tmp_path}/raw --reference --gpus 1,2,4" in sizes.stdout.splitlines()

"""scripts/gpu_evidence.sh (make gpu-evidence, issue 63): the GPU evidence in one script. With stand-ins for python,
make and timeout that record what they are asked: the steps in order of value, each under its own timeout, the budget
deciding what is reached, FROM and STEPS, everything under OUT and a summary of what was reached. Then one step for
real on a fake H200 (tests/fake_gpu_python.py), up to the first CUDA kernel."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_evidence.sh"


def stand_ins(tmp_path, stop: str = "") -> tuple[dict, object]:
    """A bin folder of `python`, `make` and `timeout` that log their arguments and succeed at once; the `timeout`
    stand-in exits 124 (its limit reached) for a command holding ``stop``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    (bin_ / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    # make: gpu-check leaves the Horovod build's log in VENV, baseline a baseline file in BASELINES, as the real ones do
    (bin_ / "make").write_text(f'#!/bin/sh\necho "make $*" >> {log}\ncase "$*" in\n'
                               f'  *gpu-check*) mkdir -p "$VENV" && echo built > "$VENV/horovod-build.log";;\n'
                               f'  *" baseline "*) mkdir -p "$BASELINES" && echo {{}} > "$BASELINES/NVIDIA-H200-x1.json";;\n'
                               f'esac\n')
    (bin_ / "timeout").write_text(f'#!/bin/sh\necho "timeout $1 $2 $3" >> {log}\nshift 3\n'
                                  f'case "$*" in *"{stop or "@never@"}"*) exit 124;; esac\nexec "$@"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in ("FROM", "STEPS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
           "PATH": f"{bin_}:{os.environ['PATH']}", "PY": str(bin_ / "python"), "MAKE": str(bin_ / "make"),
           "VENV": str(tmp_path / "venv"), "BASELINES": str(tmp_path / "baselines")}
    return env, log


def evidence(env, out, *args, **extra):
    return subprocess.run(["bash", str(SCRIPT), str(out), *map(str, args)], env={**env, **extra}, capture_output=True,
                          text=True, timeout=120)


def test_every_step_in_order_of_value_each_under_its_own_timeout_everything_under_out(tmp_path):
    env, log = stand_ins(tmp_path)
    out = tmp_path / "out"
    proc = evidence(env, out, 2000)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    py, make = env["PY"], env["MAKE"]
    calls = log.read_text().splitlines()
    assert calls == [
        "timeout --signal=INT --kill-after=30 460",
        f"make --no-print-directory -o venv gpu-check FULL=1 PY={py} ARGS=--backends horovod --budget-s 420 "
        f"--results {out}/horovod",
        "timeout --signal=INT --kill-after=30 600",
        f"python -m bench tune --preset gpu-best --budget-s 540 --results {out}/tune",
        "timeout --signal=INT --kill-after=30 60",
        f"python -m bench report --results {out}/tune --out {out}/tune/report",
        "timeout --signal=INT --kill-after=30 150",
        f"python -m bench run --backends single,fsdp2 --gpus 1 --device cuda --model resnet50 --precision bf16 "
        f"--batch-size 256 --channels-last --repeat 1 --reference --trace 2 --results {out}/parity/raw",
        "timeout --signal=INT --kill-after=30 30",
        f"python -m bench report --results {out}/parity/raw --out {out}/parity/report",
        "timeout --signal=INT --kill-after=30 390",
        f"make --no-print-directory -o install baseline GPUS=1 PY={py} REGRESS_RESULTS={out}/regress "
        "REGRESS_WAIT_QUIET=30"]
    assert make == str(tmp_path / "bin" / "make")
    summary = (out / "evidence.md").read_text().splitlines()
    rows = [ln.split(" | ")[:2] for ln in summary if ln.startswith("| ") and not ln.startswith("| step")]
    assert rows == [["| horovod", "ok"], ["| tune", "ok"], ["| parity", "ok"], ["| baseline", "ok"]]
    assert summary[-1].startswith("reached: horovod tune parity baseline; not reached: none; ")
    assert {p.name for p in out.iterdir()} == {"evidence.md", "horovod.log", "tune.log", "parity.log", "baseline.log",
                                               ".started"}
    assert f"gpu_evidence: [tune] {py} -m bench tune --preset gpu-best" in (out / "tune.log").read_text()
    assert proc.stdout.endswith((out / "evidence.md").read_text())


def test_the_budget_decides_what_is_reached_and_a_step_at_its_limit_is_stopped_not_failed(tmp_path):
    """290 s: Horovod's step and tune's need 300 and are not reached; parity's run is cut at its limit (the timeout
    stand-in exits 124) and its report still made; the baseline gets what is left less its kill's 30 s. Every step's
    limits, its reports' and the 30 s a stopped command is given included, lie inside what it was given."""
    env, log = stand_ins(tmp_path, stop="--trace 2")
    out = tmp_path / "out"
    proc = evidence(env, out, 290)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text()
    assert "gpu-check" not in calls and "bench tune" not in calls
    assert "gpu_evidence: [horovod] not reached: 290 s of the budget left, it needs 300 s" in proc.stderr
    summary = (out / "evidence.md").read_text()
    assert "| horovod | not reached: 290 s left, it needs 300 s | 0 |" in summary
    assert "| tune | not reached: 290 s left, it needs 300 s | 0 |" in summary
    assert "| parity | stopped at its limit (exit 124) |" in summary and "report --results" in calls
    assert "timeout --signal=INT --kill-after=30 150\n" in calls  # parity's 240 s: 150 + 30, then its report 30 + 30
    assert re.search(r"timeout --signal=INT --kill-after=30 2(60|59|58)\nmake .* baseline", calls), calls
    assert summary.splitlines()[-2:] == [
        summary.splitlines()[-2], f"go on with: make gpu-evidence OUT={out} FROM=horovod"]
    assert summary.splitlines()[-2].startswith("reached: parity baseline; not reached: horovod tune; ")
    # tune alone at 400 s: its preset's budget is what is left less 190 s (its limit 60 s beyond, the report 60 s, each
    # stopped command's 30 s)
    (tmp_path / "t").mkdir()
    env, log = stand_ins(tmp_path / "t")
    proc = evidence(env, tmp_path / "t" / "out", 400, STEPS="tune")
    calls = log.read_text()
    assert proc.returncode == 0 and "--budget-s 210 --results" in calls and "kill-after=30 270\n" in calls, calls


def test_pack_gets_the_summary_and_everything_in_two_files_whatever_ended_the_script(tmp_path):
    """A lent machine's $OUT returns 8 files at most, 2 folders deep: PACK=DIR gets evidence.md and evidence.tgz, which
    holds OUT whole, the Horovod build's log and the baseline the run wrote; also when a step fails (exit 1)."""
    env, log = stand_ins(tmp_path, stop="--trace 2")
    out, pack = tmp_path / "work" / "ev", tmp_path / "pack"
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "CPU-old-x2.json").write_text("{}")  # an older baseline: not this run's
    time.sleep(1.1)  # older by the file system's clock
    proc = evidence(env, out, 2000, PACK=str(pack))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in pack.iterdir()) == ["evidence.md", "evidence.tgz"]
    assert (pack / "evidence.md").read_text() == (out / "evidence.md").read_text()
    with tarfile.open(pack / "evidence.tgz") as tar:
        names = set(tar.getnames())
    assert {"ev/evidence.md", "ev/horovod.log", "ev/tune.log", "ev/parity.log", "ev/baseline.log",
            "ev/horovod-build.log", "ev/baselines/NVIDIA-H200-x1.json"} <= names, names
    assert not any("CPU-old" in n for n in names)
    bad = tmp_path / "bin" / "python"  # every python call fails: the steps fail, the script exits 1, and still packs
    bad.write_text(bad.read_text() + "exit 1\n")
    shutil.rmtree(pack)
    proc = evidence(env, tmp_path / "work" / "ev2", 2000, PACK=str(pack), STEPS="tune")
    assert proc.returncode == 1 and "| tune | failed (exit 1) |" in (pack / "evidence.md").read_text()
    assert f"report --results {tmp_path}/work/ev2/tune --out" in log.read_text()  # its report whatever tune's exit
    assert (pack / "evidence.tgz").stat().st_size > 0
    # over the device tool's 16 MiB a file: packed again without the traces
    (tmp_path / "work" / "ev2" / "tune" / "logs").mkdir(parents=True)
    (tmp_path / "work" / "ev2" / "tune" / "logs" / "r.rank0.trace.json.gz").write_bytes(os.urandom(4000))
    proc = evidence(env, tmp_path / "work" / "ev2", 2000, PACK=str(pack), STEPS="tune", PACK_MAX_BYTES="3000")
    assert "packed again without the traces" in proc.stderr, proc.stderr
    with tarfile.open(pack / "evidence.tgz") as tar:
        assert not [n for n in tar.getnames() if n.endswith(".trace.json.gz")] and "ev2/tune.log" in tar.getnames()


def test_from_and_steps_choose_the_steps_and_bad_input_is_one_line(tmp_path):
    env, log = stand_ins(tmp_path)
    proc = evidence(env, tmp_path / "a", 2000, FROM="parity")
    assert proc.returncode == 0 and "reached: parity baseline;" in proc.stdout
    proc = evidence(env, tmp_path / "b", 2000, STEPS="baseline,tune")
    assert proc.returncode == 0 and "reached: baseline tune;" in proc.stdout
    for args, extra, line in (((2000,), {"STEPS": "tune,bench"}, "gpu_evidence: step 'bench': unknown; choose from "
                                                                "horovod,tune,parity,baseline\n"),
                              ((2000,), {"FROM": "tune", "STEPS": "parity"}, "gpu_evidence: FROM=tune is not among "
                                                                             "STEPS\n"),
                              (("ten",), {}, "gpu_evidence: BUDGET_S ten: a positive number of seconds\n")):
        proc = evidence(env, tmp_path / "c", *args, **extra)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: scripts/gpu_evidence.sh OUT [BUDGET_S]")


def test_the_script_passes_shellcheck_and_make_gpu_evidence_calls_it():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (.ci/run installs Debian's shellcheck)")
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "-n", "-o", "venv", "gpu-evidence", "OUT=/tmp/ev", "EVIDENCE_BUDGET=300"], cwd=REPO,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "scripts/gpu_evidence.sh /tmp/ev 300" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(["make", "-o", "venv", "gpu-evidence"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "make gpu-evidence: say where, e.g. OUT=results/evidence" in proc.stderr


@pytest.mark.slow
def test_a_step_runs_for_real_on_a_fake_h200_up_to_the_first_cuda_kernel(tmp_path):
    """The parity step with the real bench on a fake machine of one H200: bench run plans single and fsdp2 on CUDA
    beside their twins and launches them; each rank stops at its first CUDA call (no GPU here), so the step fails,
    with its log, records and report under OUT, and the script exits 1."""
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO}/tests/fake_gpu_python.py "$@"\n')
    py.chmod(0o755)
    out = tmp_path / "out"
    env = {**{k: v for k, v in os.environ.items() if k not in ("FROM", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
           "PY": str(py), "STEPS": "parity", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", str(SCRIPT), str(out), "300"], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (out / "parity.log").read_text()
    assert "single x1 on cuda: resnet50 224px batch 256/device bf16" in log, log
    assert "Found no NVIDIA driver" in log or "no CUDA" in log, log
    assert "| parity | failed (exit 1) |" in (out / "evidence.md").read_text()
    assert list((out / "parity" / "raw").glob("*.json")) and (out / "parity" / "report" / "REPORT.md").exists()

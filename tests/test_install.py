"""Installs: the lock's staleness check, what TORCH=system keeps, and a real TORCH=system environment."""
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, records

spec = importlib.util.spec_from_file_location("lockfile", REPO / "scripts" / "lockfile.py")
lockfile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lockfile)


def test_the_committed_lock_matches_pyproject_and_pins_torch():
    assert lockfile.stale() is None
    _, entries = lockfile.parse()
    pins = {e.key: e.version for e in entries if e.applies()}
    assert pins["torch"] and pins["torchvision"] and pins["deepspeed"] and pins["pytest"]
    assert all(e.hashes for e in entries), "every pin carries its hashes"
    import torch
    import torchvision

    # the environment the tests run in is the locked one (make test installs it)
    assert torch.__version__.split("+")[0] == pins["torch"] and torchvision.__version__.split("+")[0] == pins["torchvision"]


def test_make_check_lock_passes_on_the_committed_lock():
    # what .ci/run calls first: the script itself, as make runs it (a crash here once kept every landing out)
    proc = subprocess.run(["make", "-s", "check-lock", f"PYTHON={sys.executable}"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "requirements.lock matches pyproject.toml", "")


def test_a_lock_older_than_pyproject_is_stale(tmp_path):
    lock, pyproject = tmp_path / "requirements.lock", tmp_path / "pyproject.toml"
    shutil.copy(lockfile.LOCK, lock)
    shutil.copy(lockfile.PYPROJECT, pyproject)
    assert lockfile.stale(lock, pyproject) is None
    pyproject.write_text(pyproject.read_text().replace('"rich>=13",', '"rich>=13",\n    "tabulate>=0.9",'))
    why = lockfile.stale(lock, pyproject)
    assert why.startswith("requirements.lock is stale: pyproject.toml's dependencies changed since it was made")
    assert why.endswith("refresh it with `make lock` and commit it")
    # a fresh fingerprint does not hide a pin that pyproject no longer accepts
    text = lock.read_text().splitlines()
    text[0] = lockfile.FINGERPRINT + lockfile.fingerprint(pyproject)
    lock.write_text("\n".join(text) + "\n")
    assert lockfile.stale(lock, pyproject) == ("requirements.lock has no pin for tabulate (pyproject.toml asks for "
                                               "'tabulate>=0.9'); run `make lock`")
    pyproject.write_text(lockfile.PYPROJECT.read_text().replace('"rich>=13"', '"rich>=99"'))
    text[0] = lockfile.FINGERPRINT + lockfile.fingerprint(pyproject)
    lock.write_text("\n".join(text) + "\n")
    assert "outside pyproject.toml's 'rich>=99'" in lockfile.stale(lock, pyproject)


def test_torch_system_keeps_torch_and_what_only_torch_needs():
    _, entries = lockfile.parse()
    closure = lockfile.torch_closure([e for e in entries if e.applies()])
    assert {"torch", "triton", "nvidia-cublas", "nvidia-nccl-cu13", "sympy"} <= closure
    assert not closure & {"torchvision", "numpy", "deepspeed", "pillow", "nvidia-dali-cuda130", "pytest"}


def run_install(*args, timeout=600):
    return subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_bad_install_switches_are_one_line(tmp_path):
    proc = run_install(tmp_path / "venv", sys.executable, "conda")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"make: TORCH=conda: choose locked (the default: torch from requirements.lock) or "
                                   f"system (the torch {sys.executable} already has)")
    no_torch = tmp_path / "python-without-torch"
    no_torch.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # no site-packages: no torch
    no_torch.chmod(0o755)
    proc = run_install(tmp_path / "venv", no_torch, "system")
    assert proc.returncode == 2 and not (tmp_path / "venv").exists()
    assert proc.stderr.strip().startswith(f"make: TORCH=system: {no_torch} cannot import torch;")
    proc = run_install(tmp_path / "venv", sys.executable, "locked", tmp_path / "nowhere")
    assert proc.returncode == 2 and "WHEELS=" in proc.stderr and "no such directory" in proc.stderr


@pytest.mark.slow
def test_make_venv_installs_the_lock_with_make_lock_s_uv(tmp_path):
    """From a registry, `make venv` hands the lock's files to the uv that `make lock` uses (the Makefile's UV_VERSION,
    in .tools/lock-venv), hashes checked and bytecode compiled as pip does them; from WHEELS=DIR, pip."""
    dry = subprocess.run(["make", "-n", "venv"], capture_output=True, text=True, cwd=REPO, timeout=60).stdout
    version = next(line.split("?=")[1].strip() for line in (REPO / "Makefile").read_text().splitlines()
                   if line.startswith("UV_VERSION ?="))
    assert f"UV_VERSION={version} UV_VENV={REPO / '.tools' / 'lock-venv'} scripts/install.sh" in dry, dry
    uv_venv, log = tmp_path / "uv", tmp_path / "uv.log"
    (uv_venv / "bin").mkdir(parents=True)
    uv = uv_venv / "bin" / "uv"  # answers its version, logs the install it is asked for, then fails to stop there
    uv.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "uv {version} (x86_64-unknown-linux-gnu)"; exit 0; }}\n'
                  f'echo "$@" > {log}; exit 3\n')
    uv.chmod(0o755)
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_VERSION": version, "UV_VENV": str(uv_venv)}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), str(venv), sys.executable], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 3, proc.stderr
    assert log.read_text().split() == ["pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-deps",
                                       "--require-hashes", "--compile-bytecode", "-r", str(venv / ".lock-selected.txt")]
    log.unlink()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), str(venv), sys.executable, "locked",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and not log.exists()  # pip, from an empty folder: nothing to install from
    assert "no matching distribution" in proc.stderr.lower(), proc.stderr


def torch_system_verify() -> dict:
    """A TORCH=system environment built on the test's own interpreter, and in it ``python -m bench verify`` of the first
    backend of every launcher that starts ranks (tests/test_verify.py's bit-for-bit check reads the same run), once a
    session (tests/conftest.py, ``shared``): {"venv", "install": (exit code, stderr), "verify": (exit code, stdout,
    stderr), "results"}. Its references run the in-process launcher, so every launcher starts ranks in the venv.

    The base interpreter's console scripts first on PATH, as on the first GPU machine: this venv has no torchrun or
    horovodrun of its own, and one found on PATH starts ranks in the base environment, which do not see the venv
    (DeepSpeed, installed in the venv, was "not installed" in every ds_zero3 rank there)."""
    from tests.test_verify import QUICK, one_backend_per_launcher

    def build(folder: Path) -> dict:
        venv = folder / "sysvenv"
        install = run_install(venv, sys.executable, "system")
        out = {"venv": str(venv), "install": [install.returncode, install.stderr], "verify": None,
               "results": str(folder / "results")}
        if install.returncode == 0:
            env = {k: v for k, v in os.environ.items() if k != "BENCH_FAULT"}
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            verify = subprocess.run([str(venv / "bin" / "python"), "-m", "bench", "verify", "--backends",
                                     ",".join(one_backend_per_launcher()), "--gpus", "2", *QUICK, "--results",
                                     out["results"]], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
            out["verify"] = [verify.returncode, verify.stdout, verify.stderr]
        return out

    from tests.conftest import shared

    got = shared("torch-system-verify", build)
    assert got["install"][0] == 0, f"TORCH=system install failed: {got['install'][1]}"
    return got


@pytest.mark.slow
def test_torch_system_builds_on_the_interpreter_s_torch_and_runs():
    """An interpreter that already has torch (here the test's own environment, a venv: the harder case, whose
    torch a --system-site-packages venv does not see): the new environment imports that torch, installs none, and
    its runs record torch_source "system", every rank in the venv whichever launcher started it."""
    import torch

    import backends

    got = torch_system_verify()
    venv = Path(got["venv"])
    py = venv / "bin" / "python"
    where = subprocess.run([str(py), "-c", "import torch, json, sys; print(json.dumps([torch.__file__, sys.prefix]))"],
                           capture_output=True, text=True, check=True)
    torch_file, prefix = json.loads(where.stdout)
    assert torch_file == torch.__file__ and prefix == str(venv)
    assert not list(venv.glob("lib/python*/site-packages/torch")), "TORCH=system must not install torch"
    assert (venv / ".torch-mode").read_text().strip() == "system"
    assert run_install(venv, sys.executable, "system").stdout == ""  # already done: nothing to do
    assert not (venv / "bin" / "torchrun").exists() and (Path(sys.executable).parent / "torchrun").exists()
    code, stdout, stderr = got["verify"]
    assert code == 0, stdout + stderr
    # the first registered backend of every launcher (single, ddp, ddp_spawn, horovod): verify's references are single
    # in process at 1 (the reference and its twin), the rest run at 2
    first = {}
    for name, entry in backends.REGISTRY.items():
        first.setdefault(entry["launcher"], name)
    recs = [r for r in records(Path(got["results"]) / "verify") if "backend" in r]  # not the summary
    assert sorted(r["backend"] for r in recs) == sorted([first["inproc"], *first.values()]), sorted(recs)
    for rec in recs:
        name = rec["backend"]
        assert rec["status"] == "ok" and rec["world_size"] == (1 if name == first["inproc"] else 2), (name, rec["reason"])
        assert rec["env"]["torch_source"] == "system" and rec["env"]["torch"] == torch.__version__
        # every rank, whichever launcher started it (in process, torchrun, mp.spawn, horovodrun), ran in this venv
        assert rec["env"]["python_prefix"] == str(venv)
        assert rec["rank_python_prefixes"] == [str(venv)] * rec["world_size"], name


def test_torch_system_with_a_wheel_folder_installs_what_it_has_and_names_what_it_lacks(tmp_path):
    """The test's interpreter has every locked package, so TORCH=system only needs the build tools (always the
    locked ones); a folder holding one of them gets that one installed and the other named as absent."""
    (tmp_path / "wheel-0.48.0-py3-none-any.whl").write_bytes(b"")
    keep, left, absent = lockfile.select("system", wheels=tmp_path)
    assert [e.key for e in keep] == ["wheel"] and absent == ["setuptools"]
    assert "torch" in left and "numpy" in left
    keep, _, absent = lockfile.select("system")
    assert sorted(e.key for e in keep) == ["setuptools", "wheel"] and absent == []



def test_make_test_runs_a_module_s_fixture_once_under_xdist(tmp_path):
    """`make test` runs pytest-xdist; a module fixture (one 2-rank run feeding many assertions) must run once, so all
    of a module's tests must go to one worker. (--dist loadgroup with xdist_group marks stopped grouping, silently, on
    pytest 9.2: pytest-xdist issue #1386.) Runs make test's own pytest flags on two small modules."""
    dry = subprocess.run(["make", "-n", "test", "TEST_JOBS=2"], cwd=REPO, capture_output=True, text=True, check=True)
    [line] = [ln for ln in dry.stdout.splitlines() if " -m pytest " in ln and not ln.lstrip().startswith("echo ")]
    assert "BENCH_TEST_CALIBRATE=1 " in line, line  # one run of pytest, which times a fresh import of torch first
    words = shlex.split(line.split(" -m pytest ", 1)[1].split(";")[0])
    flags = words[:words.index("tests")]
    assert flags[flags.index("-n") + 1] == "2", flags
    for name in "ab":
        (tmp_path / f"test_{name}.py").write_text(textwrap.dedent(f"""
            import os, time, pytest

            @pytest.fixture(scope="module")
            def once():
                with open("setups.txt", "a") as f:
                    f.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

            @pytest.mark.parametrize("i", range(4))
            def test_it(once, i):
                time.sleep(0.2)
            """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *flags, "."], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    setups = sorted(line.split()[0] for line in (tmp_path / "setups.txt").read_text().splitlines())
    assert setups == ["a", "b"], (tmp_path / "setups.txt").read_text()

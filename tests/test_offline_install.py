"""The offline recipe: `make wheels` puts into a folder everything a machine with no package registry
lacks, Horovod's source archive and its build and runtime requirements included, and Horovod builds there from that
folder alone.

The GPU machine's failure, reproduced by the slow tests before the fix: Horovod's setup.py lists its runtime
requirements, cffi among them, as setup_requires; neither the machine nor the folder had cffi, so the build stopped
at "Could not find a version that satisfies the requirement cffi>=1.4.0".

The slow tests download Horovod's part of the lock once per session (`lockfile.py wheels --horovod`, ~7 MB, through
pip and its cache, the way `make wheels` does), then work with no index, no pip configuration, no find-links but the
folder, and a proxy that refuses every connection: a fresh venv with only the interpreter's own packages (no torch)
installs the build requirements from the folder, builds the hash-checked sdist with --no-build-isolation (Horovod's
HOROVOD_SKIP_COMPILE=1 skips only the CMake compile, which needs torch) and installs the wheel with its runtime
requirements, all from the folder.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCKFILE = REPO / "scripts" / "lockfile.py"
PROFILE = REPO / "scripts" / "machines" / "h200-torch2.11-py3.12.txt"
spec = importlib.util.spec_from_file_location("lockfile", LOCKFILE)
lockfile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lockfile)

# What a download failure looks like when the network (not the lock or the folder) is the cause.
NETWORK_DOWN = ("NewConnectionError", "Temporary failure in name resolution", "Name or service not known",
                "Network is unreachable", "Max retries exceeded", "ConnectTimeout", "Connection refused",
                "ReadTimeoutError", "ProxyError")


def lockfile_cli(*args, env=None):
    return subprocess.run([sys.executable, str(LOCKFILE), *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)


def offline_env(home: Path) -> dict:
    """No pip configuration, no find-links, an index and a proxy that refuse every connection: what pip (and the
    pips that setuptools starts) reads must come from the folder given on its command line or in PIP_FIND_LINKS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k.lower() not in (
        "http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_INDEX_URL="http://127.0.0.1:9/simple",
               PIP_RETRIES="0", PIP_TIMEOUT="5", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HOME=str(home))
    home.mkdir(parents=True, exist_ok=True)
    return env


def fresh_venv(path: Path) -> Path:
    """A venv of the base interpreter with its own packages only (pip, and setuptools where ensurepip has it)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    py = path / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import torch"], capture_output=True).returncode != 0, "venv sees a torch"
    return py


@pytest.fixture(scope="session")
def horovod_folder(tmp_path_factory) -> Path:
    """`lockfile.py wheels --horovod` for this Python, once per session (pip's cache serves a second session)."""
    folder = tmp_path_factory.mktemp("wheels")
    proc = lockfile_cli("wheels", "-d", folder, "--horovod")
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        down = [ln for ln in out.splitlines() if any(s in ln for s in NETWORK_DOWN)]
        if down:
            pytest.skip(f"cannot download from the package index: {down[-1].strip()[:200]}")
        pytest.fail(f"lockfile.py wheels --horovod failed:\n{out}")
    return folder


def without(folder: Path, name: str, dest: Path) -> Path:
    """A copy (by links) of ``folder`` without ``name``'s files."""
    dest.mkdir()
    for f in folder.iterdir():
        if lockfile.canonicalize_name(re.split(r"-\d", f.name, maxsplit=1)[0]) != name:
            (dest / f.name).symlink_to(f)
    return dest


# ---------------------------------------------------------------------------------------------------------------------
# What goes into the folder (fast: no download)

def test_the_folder_for_the_gpu_machine_is_what_it_lacks_plus_horovod_and_the_build_tools():
    """The committed profile of the GPU machine (GPU-MACHINE.md) gives the issue's list: the ten files of its first
    install, the DALI packages, and now Horovod's source with cffi and pycparser, for its Python 3.12."""
    chosen, python = lockfile.choose(have=PROFILE)
    assert python == "3.12.3"
    dali = {"nvidia-dali-cuda130", "astunparse", "gast", "libcst", "makefun", "nvidia-libnvcomp-cu13",
            "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "nvidia-nvjpeg2k-cu13", "nvidia-nvtiff-cu13", "nvtx", "optree",
            "six"}
    first_install = {"deepspeed", "hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                     "holistictraceanalysis", "plotly", "setuptools", "wheel"}
    # the static checks and make coverage (mypy, coverage and what mypy needs), locked since issue 44
    checks = {"mypy", "mypy-extensions", "librt", "ast-serialize", "pathspec", "coverage"}
    # packaging: the machine has it, but pip builds DeepSpeed's sdist in an isolated environment, where wheel needs it
    assert {e.key for e in chosen} == first_install | dali | checks | {"horovod", "cffi", "pycparser", "packaging"}
    assert all(e.hashes for e in chosen)
    # Horovod's part alone: what the machine lacks of it
    chosen, _ = lockfile.choose(have=PROFILE, horovod=True)
    assert {e.key for e in chosen} == {"horovod", "cffi", "pycparser", "setuptools", "wheel", "packaging"}


def test_horovod_s_part_of_the_lock_is_its_source_and_every_build_and_runtime_requirement():
    chosen, python = lockfile.choose(horovod=True)
    assert python is None  # this interpreter's
    pins = {e.key: e for e in chosen}
    # horovod 0.28.1's setup.py: setup_requires = install_requires = cloudpickle, psutil, pyyaml, packaging, cffi>=1.4.0
    # (cffi unless HOROVOD_WITHOUT_PYTORCH); setuptools and wheel build it; cffi needs pycparser
    assert set(pins) == {"horovod", "cloudpickle", "psutil", "pyyaml", "packaging", "cffi", "pycparser", "setuptools",
                         "wheel"}
    assert pins["horovod"].version == "0.28.1" and pins["horovod"].hashes == [
        "sha256:92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"]  # PyPI's horovod-0.28.1.tar.gz
    # never installed from the lock (scripts/build_horovod.sh compiles it against the installed torch)
    keep, _, _ = lockfile.select("locked")
    assert "horovod" not in {e.key for e in keep} and "cffi" in {e.key for e in keep}


def test_make_wheels_passes_have_and_the_python(tmp_path):
    dry = subprocess.run(["make", "-n", "wheels", "WHEELS=out", f"HAVE={PROFILE}", "WHEELS_PYTHON=3.12"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    line = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert f"scripts/lockfile.py wheels -d out --python-version 3.12 --have {PROFILE}" in line, dry.stdout


@pytest.mark.parametrize("args, message", [
    (["--have", "{tmp}/nowhere.txt"], "HAVE={tmp}/nowhere.txt: cannot read it (No such file or directory); give the "
                                      "output of `python3 -m pip list --format=freeze` taken on the other machine"),
    (["--have", "{tmp}/garbled.txt"], "HAVE={tmp}/garbled.txt line 2: 'Package    Version' is not a line of `pip list "
                                      "--format=freeze`"),
    (["--have", "{tmp}/notorch.txt", "--python-version", "3.12"],
     "HAVE={tmp}/notorch.txt has no torch: the folder is for TORCH=system, which keeps the other machine's own torch; "
     "leave HAVE out to download every locked package"),
    (["--have", "{tmp}/nopython.txt"], "HAVE={tmp}/nopython.txt does not say which Python that machine has: give it, "
                                       "e.g. --python-version 3.12 (make wheels ... WHEELS_PYTHON=3.12)"),
    (["--have", str(PROFILE), "--python-version", "3.11"],
     f"--python-version 3.11, but HAVE={PROFILE} says its machine has Python 3.12.3"),
    (["--have", str(PROFILE), "--only", "cffi"], "--only names the packages by hand; leave it out with --have or "
                                                 "--horovod"),
    (["--python-version", "twelve"], "--python-version twelve: give the other machine's Python as 3.12 or 3.12.3"),
    (["--have", "{tmp}/badpython.txt"], "HAVE={tmp}/badpython.txt line 1: python twelve: write the machine's Python "
                                        "as 3.12.3"),
    (["--only", "cffi", "nosuchpackage"], "not in requirements.lock for Python here: nosuchpackage"),
])
def test_bad_wheels_input_is_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "garbled.txt").write_text("torch==2.11.0\nPackage    Version\n")
    (tmp_path / "notorch.txt").write_text("numpy==2.0.0\n")
    (tmp_path / "badpython.txt").write_text("# python: twelve\ntorch==2.11.0\n")
    (tmp_path / "nopython.txt").write_text("torch==2.11.0+cu130\nnumpy @ file:///x/numpy.whl\n-e /src/x\n")
    proc = lockfile_cli("wheels", "-d", tmp_path / "out", "--list", *(a.format(tmp=tmp_path) for a in args))
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"lockfile: {message.format(tmp=tmp_path)}\n")
    assert not (tmp_path / "out").exists()


def test_a_pip_freeze_with_urls_editables_and_the_python_given_apart_is_read(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0+cu130\nnumpy @ file:///x/numpy.whl\n-e git+https://x/y#egg=bench\n"
                      "# a comment\n\nPyYAML===6.0.4\nrequests[socks]==2.0\n")
    assert lockfile.read_have(freeze) == ({"torch", "numpy", "pyyaml", "requests"}, None)
    proc = lockfile_cli("wheels", "-d", tmp_path, "--have", freeze, "--python-version", "3.12", "--horovod", "--list")
    assert proc.returncode == 0, proc.stderr
    assert [ln.split("==")[0] for ln in proc.stdout.splitlines()] == [
        "cffi", "cloudpickle", "horovod", "packaging", "psutil", "pycparser", "setuptools", "wheel"]


def test_build_horovod_refuses_a_missing_folder_in_one_line(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/false")
    env = {**os.environ, "WHEELS": str(tmp_path / "nowhere")}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_horovod.sh"), str(venv)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, f"build_horovod: WHEELS={tmp_path / 'nowhere'}: no such directory "
                                                 "(a folder from `make wheels`)\n")
    env = {k: v for k, v in os.environ.items() if k != "WHEELS"} | {"PIP_NO_INDEX": "maybe"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_horovod.sh"), str(venv)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, "build_horovod: PIP_NO_INDEX=maybe: pip reads 1/true/yes/on or "
                                                 "0/false/no/off\n")


# ---------------------------------------------------------------------------------------------------------------------
# Horovod from the folder alone (slow: downloads once per session, then builds offline)

def build_offline(folder: Path, tmp_path: Path) -> tuple[Path, str]:
    """The offline steps in a fresh venv; returns (its python, the first failing step's output or "")."""
    py = fresh_venv(tmp_path / "venv")
    env = offline_env(tmp_path / "home")
    pip = [str(py), "-m", "pip", "--no-cache-dir"]
    src = tmp_path / "horovod.txt"
    src.write_text(lockfile_cli("pin", "horovod").stdout)
    build_reqs = lockfile_cli("requires", "build").stdout.split()
    steps = [
        # what scripts/build_horovod.sh installs before the build (pyproject.toml's build extra, any version)
        [*pip, "install", "--no-index", "--find-links", str(folder), *build_reqs],
        # its build: the hash-checked sdist, against this venv, setup_requires checked; only CMake's compile skipped.
        # PIP_NO_INDEX/PIP_FIND_LINKS in the environment as the script exports them, for setuptools' own pip
        [*pip, "wheel", "--no-index", "--find-links", str(folder), "--no-deps", "--no-build-isolation", "--no-binary",
         "horovod", "-w", str(tmp_path / "built"), "-r", str(src)],
    ]
    env_build = {**env, "HOROVOD_SKIP_COMPILE": "1", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder)}
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env_build, timeout=300)
        if proc.returncode != 0:
            return py, proc.stdout + proc.stderr
    [wheel] = (tmp_path / "built").glob("horovod-0.28.1-*.whl")
    # the wheel with its runtime requirements, resolved from the folder
    proc = subprocess.run([*pip, "install", "--no-index", "--find-links", str(folder), str(wheel)],
                          capture_output=True, text=True, env=env, timeout=300)
    return py, "" if proc.returncode == 0 else proc.stdout + proc.stderr


@pytest.mark.slow
def test_horovod_builds_and_installs_from_the_folder_alone_in_a_fresh_venv(horovod_folder, tmp_path):
    names = sorted(f.name for f in horovod_folder.iterdir())
    assert "horovod-0.28.1.tar.gz" in names and any(n.startswith("cffi-") for n in names), names
    py, failed = build_offline(horovod_folder, tmp_path)
    assert failed == "", failed
    ok = subprocess.run([str(py), "-c", "import horovod, horovod.runner.launch, cffi, cloudpickle, psutil, yaml; "
                         "print(horovod.__version__)"], capture_output=True, text=True, timeout=120)
    assert (ok.returncode, ok.stdout.strip()) == (0, "0.28.1"), ok.stderr


@pytest.mark.slow
def test_without_cffi_in_the_folder_the_build_stops_as_on_the_gpu_machine(horovod_folder, tmp_path):
    """The guard's own check: the same steps with the folder of before (no cffi) fail with the GPU machine's line."""
    folder = without(horovod_folder, "cffi", tmp_path / "no-cffi")
    _, failed = build_offline(folder, tmp_path)
    assert "Could not find a version that satisfies the requirement cffi>=1.4.0" in failed, failed


@pytest.mark.slow
def test_build_horovod_sh_takes_everything_from_the_folder_and_never_the_network(horovod_folder, tmp_path):
    """scripts/build_horovod.sh itself with WHEELS=folder in a fresh venv: its pips, and the ones setuptools starts,
    read the folder only (an index that refuses connections is configured and never asked). The venv has no torch, so
    its python answers build_horovod.sh's torch probe as a CPU torch would, and Horovod's CMake compile is skipped:
    the script then stops at its verification, after the offline build and install. As under TORCH=system with an
    interpreter that has a Horovod of its own (an NGC container), the same version is visible outside the venv: the
    built one must still land in the venv."""
    venv = tmp_path / "venv"
    fresh_venv(venv)
    real = venv / "bin" / "python-real"
    (venv / "bin" / "python").rename(real)  # still this venv's interpreter: pyvenv.cfg sits beside bin/
    tag = "cp%d%d" % sys.version_info[:2]
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\n"
        f'case "$1 $2" in "-c import sys, torch"*) echo "2.15.0 none {tag} none 0"; exit 0;; esac\n'
        f'exec "{real}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    env = {k: v for k, v in offline_env(tmp_path / "home").items() if k not in ("HOROVOD_VERSION", "WHEELS")}
    env |= {"HOROVOD_SKIP_COMPILE": "1", "BENCH_WHEEL_CACHE": str(tmp_path / "cache"),
            "PATH": "/usr/local/bin:/usr/bin:/bin"}
    # the interpreter's own horovod 0.28.1, outside the venv (built by this test's interpreter, compile skipped)
    outside, built = tmp_path / "outside", tmp_path / "outside-wheel"
    for cmd in (["wheel", "--no-deps", "--no-build-isolation", "-w", built, horovod_folder / "horovod-0.28.1.tar.gz"],
                ["install", "--no-deps", "--target", outside, "horovod", "--no-index", "--find-links", built]):
        proc = subprocess.run([sys.executable, "-m", "pip", "--no-cache-dir", *map(str, cmd)], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    site = Path(subprocess.run([str(real), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "_outside.pth").write_text(f"{outside}\n")  # after the venv's own packages, as install.sh's torch .pth
    script = ["bash", str(REPO / "scripts" / "build_horovod.sh"), str(venv)]

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(script, capture_output=True, text=True, timeout=300, env=env | {"WHEELS": str(empty)})
    assert (proc.returncode, proc.stderr.splitlines()[-1]) == (2, (
        f"build_horovod: no horovod-0.28.1.tar.gz in WHEELS={empty}: make the folder where pip works with `make wheels "
        "WHEELS=DIR HAVE=...` (or WHEELS_HOROVOD=1)")), proc.stdout + proc.stderr

    proc = subprocess.run(script, capture_output=True, text=True, timeout=300,
                          env=env | {"WHEELS": str(horovod_folder)})
    log = (venv / "horovod-build.log").read_text()
    # built, installed with its runtime requirements, and only then refused by the check of what was compiled
    assert proc.returncode == 1 and re.search(r"build_horovod: FAILED: horovod was built without (PyTorch|Gloo)",
                                              proc.stderr.splitlines()[-1]), proc.stdout + proc.stderr
    assert f"build_horovod: offline: no package index; from {horovod_folder}" in proc.stdout
    assert "Successfully installed" in log and "127.0.0.1" not in log, log
    ok = subprocess.run([str(real), "-c", "import horovod, cffi, cloudpickle, psutil, yaml; "
                         "print(horovod.__version__, horovod.__file__)"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["0.28.1", str(site / "horovod" / "__init__.py")]
    assert (venv / "bin" / "horovodrun").exists()

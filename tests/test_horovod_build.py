"""The CPU-side steps of the Horovod build on a CUDA torch (scripts/cuda_toolkit.py, scripts/build_horovod.sh):
finding a toolkit of torch's CUDA version, assembling one from PyPI's compiler wheels, the exact pins, the
wheel cache key, and the GPU flavour read from torch. Never compiles Horovod.

BENCH_CUDA_WHEELS=DIR (a `pip install --no-deps --target DIR nvidia-cuda-nvcc==V nvidia-cuda-crt==V
nvidia-nvvm==V` of the venv's nvidia-cuda-runtime version V) also compiles a CUDA kernel for sm_90 with the
toolkit assembled from the real wheels.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cuda_toolkit", REPO / "scripts" / "cuda_toolkit.py")
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def fake_toolkit(home: Path, release: str) -> Path:
    """A directory whose bin/nvcc answers --version like the real one."""
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    nvcc.chmod(0o755)
    return home


def test_find_uses_only_a_toolkit_of_torch_cuda_version(tmp_path, capsys):
    old, new = fake_toolkit(tmp_path / "cuda-13.0", "13.0"), fake_toolkit(tmp_path / "cuda-13.2", "13.2")
    pattern = str(tmp_path / "cuda-{want}"), str(old)
    assert ct.find("13.2", candidates=(str(old),), path_nvcc=False) is None
    assert capsys.readouterr().err == (f"cuda_toolkit: skipping the CUDA 13.0 toolkit at {old}: torch was built "
                                       "with CUDA 13.2\n")
    assert ct.find("13.2", candidates=pattern, path_nvcc=False) == new  # /usr/local/cuda-{want} first
    assert ct.find("13.0", candidates=pattern[::-1], path_nvcc=False) == old


def test_find_honours_cuda_home_of_another_version_but_says_so(tmp_path, capsys):
    old = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    assert ct.find("13.2", cuda_home=str(old)) == old
    assert capsys.readouterr().err.startswith(f"cuda_toolkit: warning: CUDA_HOME={old} is CUDA 13.0, torch was "
                                              "built with CUDA 13.2; using it because CUDA_HOME says so")
    with pytest.raises(ct.ToolkitError) as e:
        ct.find("13.2", cuda_home=str(tmp_path / "nothing"))
    assert str(e.value) == f"CUDA_HOME={tmp_path / 'nothing'} has no working bin/nvcc"


@pytest.mark.skipif(not Path("/usr/local/cuda-13.0/bin/nvcc").exists(), reason="no /usr/local/cuda-13.0 here")
def test_this_machines_cuda_13_0_is_not_used_for_a_13_2_torch(capsys):
    assert ct.find("13.2", path_nvcc=False) is None  # before: the build fell back to /usr/local/cuda (13.0)
    assert "skipping the CUDA 13.0 toolkit at /usr/local/cuda" in capsys.readouterr().err


class Dist:
    def __init__(self, name, version, files=(), root=None):
        self.metadata, self.version, self.files, self.root = {"Name": name}, version, list(files), root

    def locate_file(self, f):
        return self.root / f


def test_pins_are_the_runtime_wheels_exact_version():
    assert ct.pins(dist=Dist("nvidia-cuda-runtime", "13.2.86")) == [
        "nvidia-cuda-nvcc==13.2.86", "nvidia-cuda-crt==13.2.86", "nvidia-nvvm==13.2.86"]
    assert ct.pins(dist=Dist("nvidia-cuda-runtime-cu12", "12.8.90")) == ["nvidia-cuda-nvcc-cu12==12.8.90"]


def test_pins_of_this_venv_match_torch():
    import torch
    if not torch.version.cuda:
        pytest.skip("a CPU build of torch: no CUDA runtime wheel")
    version = ct.runtime_dist(torch.version.cuda).version
    assert ct.major_minor(version) == torch.version.cuda
    assert ct.pins(torch.version.cuda)[0] in (f"nvidia-cuda-nvcc=={version}",
                                              f"nvidia-cuda-nvcc-cu{torch.version.cuda.split('.')[0]}=={version}")


def fake_wheels(target: Path, release="13.2") -> Path:
    root = target / "nvidia" / "cu13"
    fake_toolkit(root, release)
    (root / "bin" / "nvcc.profile").write_text("TOP = $(_HERE_)/..\n")
    (root / "nvvm" / "bin").mkdir(parents=True)
    (root / "include" / "crt").mkdir(parents=True)
    (root / "include" / "crt" / "host_defines.h").write_text("// crt\n")
    (root / "include" / "nvvm.h").write_text("// nvvm\n")
    (root / "lib").mkdir()
    (root / "lib" / "libnvvm.so.4").write_text("")
    return target


def fake_runtime(root: Path) -> Dist:
    """torch's nvidia-cuda-runtime wheel as installed in the venv (site-packages/nvidia/cu13/...)."""
    cu = root / "nvidia" / "cu13"
    (cu / "lib").mkdir(parents=True)
    (cu / "include" / "cccl").mkdir(parents=True)
    for f in ("lib/libcudart.so.13", "lib/libcudart_static.a", "include/cuda_runtime.h", "include/host_defines.h"):
        (cu / f).write_text("")
    return Dist("nvidia-cuda-runtime", "13.2.86",
                [Path("nvidia/cu13/lib/libcudart.so.13"), Path("nvidia/cu13/lib/libcudart_static.a")], root)


def test_assemble_a_toolkit_from_the_wheels_and_torchs_runtime(tmp_path):
    wheels, rt = fake_wheels(tmp_path / "wheels"), fake_runtime(tmp_path / "site-packages")
    out = ct.assemble(wheels, tmp_path / "toolkit", ct._runtime_lib(rt))
    cu, site = wheels / "nvidia" / "cu13", tmp_path / "site-packages" / "nvidia" / "cu13"
    assert sorted(p.name for p in out.iterdir()) == ["bin", "include", "lib", "lib64", "nvvm"]
    assert (out / "bin" / "nvcc").resolve() == cu / "bin" / "nvcc"
    assert (out / "bin" / "nvcc.profile").resolve() == cu / "bin" / "nvcc.profile"  # read from nvcc's own dir
    assert (out / "nvvm").resolve() == cu / "nvvm"
    assert {p.name: p.resolve() for p in (out / "include").iterdir()} == {
        "cccl": site / "include" / "cccl", "cuda_runtime.h": site / "include" / "cuda_runtime.h",
        "host_defines.h": site / "include" / "host_defines.h", "crt": cu / "include" / "crt",
        "nvvm.h": cu / "include" / "nvvm.h"}
    assert {p.name: p.resolve() for p in (out / "lib64").iterdir()} == {
        "libcudart.so": site / "lib" / "libcudart.so.13", "libcudart.so.13": site / "lib" / "libcudart.so.13",
        "libcudart_static.a": site / "lib" / "libcudart_static.a", "libnvvm.so.4": cu / "lib" / "libnvvm.so.4"}
    assert os.readlink(out / "lib") == "lib64"
    assert ct.nvcc_release(out) == "13.2"
    ct.assemble(wheels, out, ct._runtime_lib(rt))  # rebuilt in place, no error on existing links


def test_ensure_installs_the_pinned_wheels_once_into_its_own_directory(tmp_path, monkeypatch, capsys):
    rt = fake_runtime(tmp_path / "site-packages")
    monkeypatch.setattr(ct, "runtime_dist", lambda want=None: rt)
    log = tmp_path / "pip.log"
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text(textwrap.dedent(f"""
        import sys, pathlib
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_horovod_build import fake_wheels
        args = sys.argv[1:]
        pathlib.Path({str(log)!r}).open("a").write(" ".join(args) + "\\n")
        target = pathlib.Path(args[args.index("--target") + 1])
        fake_wheels(target)
    """))
    cache = tmp_path / "cache"
    for _ in range(2):
        home = ct.ensure("13.2", cache, pip=[sys.executable, str(fake_pip)], candidates=(),
                         path_nvcc=False)
        assert home == cache / "cuda-13.2.86" / "toolkit" and ct.nvcc_release(home) == "13.2"
    [line] = log.read_text().splitlines()  # pip ran once: the second call found the completed install
    assert line.endswith("nvidia-cuda-nvcc==13.2.86 nvidia-cuda-crt==13.2.86 nvidia-nvvm==13.2.86")
    assert line.startswith(f"install --no-deps --no-cache-dir --target {cache / 'cuda-13.2.86'}/.wheels-")
    assert (cache / "cuda-13.2.86" / "wheels" / ".complete").read_text().split() == ct.pins(dist=rt)
    assert not (tmp_path / "site-packages" / "nvidia" / "cu13" / "bin").exists()  # torch's tree untouched


def test_ensure_fails_in_one_line_when_pip_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(ct, "runtime_dist", lambda want=None: fake_runtime(tmp_path / "sp"))
    bad = tmp_path / "bad_pip.py"
    bad.write_text("import sys; print('ERROR: No matching distribution found for nvidia-cuda-nvcc==13.2.86', "
                   "file=sys.stderr); sys.exit(1)\n")
    with pytest.raises(ct.ToolkitError) as e:
        ct.ensure("13.2", tmp_path / "cache", pip=[sys.executable, str(bad)], candidates=(),
                  path_nvcc=False)
    assert str(e.value) == ("pip install nvidia-cuda-nvcc==13.2.86 nvidia-cuda-crt==13.2.86 nvidia-nvvm==13.2.86 "
                            "failed: ERROR: No matching distribution found for nvidia-cuda-nvcc==13.2.86")
    assert list((tmp_path / "cache" / "cuda-13.2.86").iterdir()) == []  # no half-installed wheels left


def test_wheel_cache_key_holds_cuda_version_and_architectures():
    key = ct.key("0.28.1", "2.15.0+cu132", "cp311", "gpu", "13.2", "75,80,90")
    assert key == "horovod-0.28.1_torch-2.15.0+cu132_cp311_gpu_cuda-13.2_sm-75-80-90"
    assert ct.key("0.28.1", "2.15.0+cu132", "cp311", "gpu", "13.2", "90") != key
    assert ct.key("0.28.1", "2.15.0", "cp311", "cpu", "none", "75,80,90") == "horovod-0.28.1_torch-2.15.0_cp311_cpu"


# ---------------------------------------------------------------------------------------------------
# build_horovod.sh's fast path with a stand-in python: the flavour comes from torch's device count, and the
# key it checks is cuda_toolkit.py's. Exits before any pip or compile.

@pytest.mark.parametrize("ngpu, flavour", [(0, "cpu"), (1, "gpu")])
def test_build_script_flavour_from_torch_and_key(tmp_path, ngpu, flavour):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    # `-c PROBE` answers as torch would (version, CUDA, tag, installed horovod, device count); cuda_toolkit.py
    # runs for real; anything else (pip: the slow path after a key mismatch) is refused, so nothing is installed
    py.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo "2.15.0+cu132 13.2 cp311 0.28.1 {ngpu}"; exit 0; fi\n'
                  f'case "$1" in */cuda_toolkit.py) exec {sys.executable} "$@";; esac\n'
                  'echo "stand-in python: refusing $*" >&2; exit 97\n')
    py.chmod(0o755)
    key = f"horovod-0.28.1_torch-2.15.0+cu132_cp311_{flavour}_cuda-13.2_sm-75-80-90"
    (venv / ".horovod-built-against").write_text(key + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HOROVOD_BUILD_CUDA_CC_LIST", "HOROVOD_VERSION")}
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi needed, none consulted
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_horovod.sh"), str(venv)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "horovod 0.28.1 already built against torch 2.15.0+cu132\n"), \
        proc.stderr
    assert "nvidia-smi -L" not in (REPO / "scripts" / "build_horovod.sh").read_text()


# ---------------------------------------------------------------------------------------------------
# With the real wheels (BENCH_CUDA_WHEELS): the assembled toolkit compiles and links a kernel for sm_90

@pytest.mark.skipif(not os.environ.get("BENCH_CUDA_WHEELS"), reason="BENCH_CUDA_WHEELS (a --target dir of the "
                    "three compiler wheels) not set")
def test_real_wheels_compile_a_kernel_for_sm90(tmp_path):
    import torch
    if not shutil.which("g++"):
        pytest.skip("no host C++ compiler")
    out = ct.assemble(Path(os.environ["BENCH_CUDA_WHEELS"]), tmp_path / "toolkit",
                      ct._runtime_lib(ct.runtime_dist(torch.version.cuda)))
    assert ct.nvcc_release(out) == torch.version.cuda
    src = tmp_path / "k.cu"
    src.write_text("#include <cuda_runtime.h>\n#include <cuda_fp16.h>\n__global__ void k(float* x, const __half* h)"
                   " { x[threadIdx.x] += __half2float(h[threadIdx.x]); }\n"
                   "int main() { float* p; cudaMalloc(&p, 4); k<<<1, 1>>>(p, nullptr); return 0; }\n")
    proc = subprocess.run([str(out / "bin" / "nvcc"), "-arch=sm_90", "-o", str(tmp_path / "k"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k").stat().st_size > 0

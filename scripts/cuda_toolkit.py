#!/usr/bin/env python3
"""A CUDA toolkit matching torch's CUDA version, for compiling Horovod's CUDA parts (scripts/build_horovod.sh).

Most users install torch from PyPI: a driver and torch's own CUDA runtime wheels, no nvcc. The compiler is on
PyPI too: nvidia-cuda-nvcc, nvidia-cuda-crt and nvidia-nvvm (for CUDA 12: nvidia-cuda-nvcc-cu12, which holds
all three). When no installed toolkit matches torch.version.cuda, ``ensure`` installs those wheels, pinned to
the exact version of the nvidia-cuda-runtime wheel torch uses, into a directory of their own (never into the
venv, whose nvidia/cu13 tree is torch's), and assembles a toolkit there:

    TOOLKIT/bin/      nvcc, nvcc.profile, ptxas, cudafe++, ... (links into the nvcc wheel; nvcc reads its
                      profile from the directory of the path it was started by, so links work)
    TOOLKIT/nvvm      the nvvm wheel's cicc and libdevice
    TOOLKIT/include/  torch's CUDA runtime headers (cuda_runtime.h, cccl, ...) + the compiler's (crt/, ...)
    TOOLKIT/lib64/    libcudart.so -> torch's libcudart.so.N (CMake's find_package(CUDAToolkit) needs the
                      unversioned link), libnvvm; TOOLKIT/lib -> lib64 (nvcc.profile reads $(TOP)/lib)

Commands (stdout: one result line; stderr: what was skipped and why; exit 1 with one line on failure):
    find     --want X.Y [--cuda-home DIR]    a toolkit whose nvcc reports release X.Y, else nothing
    pins     [--want X.Y]                    the pip requirements of the compiler wheels, one a line
    assemble --wheels DIR --out DIR          the toolkit directory from installed wheels and torch's runtime
    ensure   --want X.Y --cache DIR [--cuda-home DIR]   find, else pip-install the pins into the cache and
                                                         assemble; prints the toolkit directory (CUDA_HOME)
    key      --horovod V --torch V --pytag T --flavour F --cuda X.Y|none --cc LIST   the wheel cache key

It imports no torch and needs only the standard library; run it with the venv's python, so that the
distribution metadata it reads (nvidia-cuda-runtime) is the venv's.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SYSTEM_CANDIDATES = ("/usr/local/cuda-{want}", "/usr/local/cuda", "/opt/cuda")


class ToolkitError(Exception):
    """One line for the user; the build fails with it."""


def say(msg: str) -> None:
    print(f"cuda_toolkit: {msg}", file=sys.stderr)


def nvcc_release(home: Path) -> str | None:
    """'13.0' from ``HOME/bin/nvcc --version`` ('Cuda compilation tools, release 13.0, V13.0.88'), or None."""
    nvcc = Path(home) / "bin" / "nvcc"
    if not os.access(nvcc, os.X_OK):
        return None
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def find(want: str, cuda_home: str | None = None, candidates=SYSTEM_CANDIDATES, path_nvcc: bool = True) -> Path | None:
    """A toolkit directory whose nvcc is release ``want`` (torch.version.cuda), or None.

    CUDA_HOME, set by the user, is used whatever its version, with a warning when it differs: that is a
    choice. A toolkit found on the system (/usr/local/cuda-X.Y, /usr/local/cuda, /opt/cuda, nvcc on PATH) is
    used only when it matches; a different release is skipped with a line saying so, never used silently:
    Horovod's CUDA objects would be compiled against other headers than the runtime torch loads."""
    want = major_minor(want)
    if cuda_home:
        got = nvcc_release(Path(cuda_home))
        if got is None:
            raise ToolkitError(f"CUDA_HOME={cuda_home} has no working bin/nvcc")
        if got != want:
            say(f"warning: CUDA_HOME={cuda_home} is CUDA {got}, torch was built with CUDA {want}; using it "
                "because CUDA_HOME says so (unset CUDA_HOME to use a matching toolkit from PyPI's wheels)")
        return Path(cuda_home)
    homes = [Path(c.format(want=want)) for c in candidates]
    nvcc = shutil.which("nvcc") if path_nvcc else None
    if nvcc:
        homes.append(Path(nvcc).resolve().parent.parent)
    seen = set()
    for home in homes:
        real = home.resolve()
        if real in seen or not home.is_dir():
            continue
        seen.add(real)
        got = nvcc_release(home)
        if got == want:
            return home
        if got is not None:
            say(f"skipping the CUDA {got} toolkit at {home}: torch was built with CUDA {want}")
    return None


def runtime_dist(want: str | None = None) -> metadata.Distribution:
    """torch's CUDA runtime wheel in this interpreter's environment (nvidia-cuda-runtime, or -cu12/-cu11)."""
    names = ["nvidia-cuda-runtime"]
    if want:
        names.append(f"nvidia-cuda-runtime-cu{want.split('.')[0]}")
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if want and major_minor(dist.version) != major_minor(want):
            raise ToolkitError(f"{name} {dist.version} is installed, but torch was built with CUDA {want}")
        return dist
    raise ToolkitError(f"no CUDA runtime wheel ({' or '.join(names)}) is installed beside torch, so no toolkit "
                       "can be assembled from wheels; set CUDA_HOME to a CUDA toolkit with nvcc")


def pins(want: str | None = None, dist: metadata.Distribution | None = None) -> list[str]:
    """Exact requirements for the compiler wheels: the runtime wheel's own version (one release train)."""
    dist = dist or runtime_dist(want)
    name, version = dist.metadata["Name"].lower(), dist.version
    suffix = name[len("nvidia-cuda-runtime"):]  # '' for CUDA >= 13, '-cu12' before
    if suffix:  # CUDA 12's nvidia-cuda-nvcc-cu12 holds nvcc, crt and nvvm together
        return [f"nvidia-cuda-nvcc{suffix}=={version}"]
    return [f"nvidia-cuda-nvcc=={version}", f"nvidia-cuda-crt=={version}", f"nvidia-nvvm=={version}"]


def _runtime_lib(dist: metadata.Distribution) -> Path:
    """Directory holding torch's libcudart.so.N, and that file's name."""
    for f in dist.files or []:
        if re.fullmatch(r"libcudart\.so\.\d+", Path(str(f)).name):
            return Path(dist.locate_file(f))
    raise ToolkitError(f"{dist.metadata['Name']} {dist.version} ships no libcudart.so.N")


def _wheel_root(wheels: Path) -> Path:
    """The nvcc wheel's CUDA tree inside a --target directory: nvidia/cu13 (CUDA 13) or nvidia/cuda_nvcc (12)."""
    for nvcc in sorted(Path(wheels).glob("nvidia/*/bin/nvcc")):
        return nvcc.parent.parent
    raise ToolkitError(f"no nvidia/*/bin/nvcc under {wheels}: the compiler wheels are not installed there")


def _link_entries(src: Path, dst: Path) -> None:
    """A link in ``dst`` for every entry of ``src`` (later calls win on a name both hold)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        link = dst / entry.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(entry)


def assemble(wheels: Path, out: Path, runtime_lib: Path) -> Path:
    """Build the toolkit directory ``out`` from the compiler wheels under ``wheels`` and torch's runtime
    (``runtime_lib``: its libcudart.so.N; the headers are in ../include). Rebuilt from scratch; returns out."""
    root = _wheel_root(Path(wheels))
    runtime_lib = Path(runtime_lib)
    runtime_include = runtime_lib.parent.parent / "include"
    if not (runtime_include / "cuda_runtime.h").is_file():
        raise ToolkitError(f"torch's CUDA runtime headers are missing: no cuda_runtime.h in {runtime_include}")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    _link_entries(root / "bin", out / "bin")
    if (root / "nvvm").is_dir():
        (out / "nvvm").symlink_to(root / "nvvm")
    _link_entries(runtime_include, out / "include")  # cuda_runtime.h, cccl, ...
    _link_entries(root / "include", out / "include")  # crt/, nvvm.h, ...: the compiler's own, matching nvcc
    lib = out / "lib64"
    lib.mkdir()
    for f in sorted((root / "lib").glob("*")) if (root / "lib").is_dir() else []:
        (lib / f.name).symlink_to(f)
    for f in sorted(runtime_lib.parent.glob("libcudart*")) + sorted(runtime_lib.parent.glob("libcudadevrt*")):
        if not (lib / f.name).exists():
            (lib / f.name).symlink_to(f)
    (lib / "libcudart.so").symlink_to(runtime_lib)  # what find_package(CUDAToolkit) looks for
    (out / "lib").symlink_to("lib64")
    return out


def ensure(want: str, cache: Path, cuda_home: str | None = None, pip: list[str] | None = None,
           candidates=SYSTEM_CANDIDATES, path_nvcc: bool = True) -> Path:
    """A toolkit for CUDA ``want``: an installed one that matches (find), else one assembled from wheels in
    ``cache``/VERSION (installed once; pip runs into a temporary directory renamed into place)."""
    found = find(want, cuda_home, candidates, path_nvcc)
    if found is not None:
        return found
    dist = runtime_dist(want)
    reqs = pins(want, dist)
    home = Path(cache) / f"cuda-{dist.version}"
    wheels, toolkit = home / "wheels", home / "toolkit"
    if not (wheels / ".complete").is_file():
        say(f"no CUDA {want} toolkit found; installing {' '.join(reqs)} into {wheels}")
        home.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".wheels-", dir=home))
        cmd = (pip or [sys.executable, "-m", "pip"]) + ["install", "--no-deps", "--no-cache-dir", "--target",
                                                         str(tmp), *reqs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise ToolkitError(f"pip install {' '.join(reqs)} failed: {tail[0]}")
        (tmp / ".complete").write_text("\n".join(reqs) + "\n")
        if wheels.exists():
            shutil.rmtree(wheels)
        tmp.rename(wheels)
    assemble(wheels, toolkit, _runtime_lib(dist))
    got = nvcc_release(toolkit)
    if got != major_minor(want):
        raise ToolkitError(f"the toolkit assembled in {toolkit} reports CUDA {got}, not {want}")
    say(f"using the CUDA {want} toolkit assembled from wheels in {toolkit}")
    return toolkit


def key(horovod: str, torch: str, pytag: str, flavour: str, cuda: str, cc: str) -> str:
    """The wheel cache key: everything the compiled wheel depends on. A CUDA torch compiles Horovod's CUDA
    parts even for the cpu flavour, so the CUDA version and the architecture list are in the key then."""
    parts = [f"horovod-{horovod}", f"torch-{torch}", pytag, flavour]
    if cuda and cuda != "none":
        parts += [f"cuda-{cuda}", "sm-" + "-".join(c.strip().replace(".", "") for c in cc.split(",") if c.strip())]
    return "_".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cuda_toolkit.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("find")
    f.add_argument("--want", required=True)
    f.add_argument("--cuda-home")
    pn = sub.add_parser("pins")
    pn.add_argument("--want")
    a = sub.add_parser("assemble")
    a.add_argument("--wheels", required=True)
    a.add_argument("--out", required=True)
    e = sub.add_parser("ensure")
    e.add_argument("--want", required=True)
    e.add_argument("--cache", required=True)
    e.add_argument("--cuda-home")
    k = sub.add_parser("key")
    for name in ("horovod", "torch", "pytag", "flavour", "cuda", "cc"):
        k.add_argument(f"--{name}", required=True)
    args = p.parse_args(argv)
    try:
        if args.cmd == "find":
            home = find(args.want, args.cuda_home)
            if home is not None:
                print(home)
            return 0 if home is not None else 1
        if args.cmd == "pins":
            print("\n".join(pins(args.want)))
        elif args.cmd == "assemble":
            print(assemble(Path(args.wheels), Path(args.out), _runtime_lib(runtime_dist())))
        elif args.cmd == "ensure":
            print(ensure(args.want, Path(args.cache), args.cuda_home or None))
        else:
            print(key(args.horovod, args.torch, args.pytag, args.flavour, args.cuda, args.cc))
    except ToolkitError as err:
        print(f"cuda_toolkit: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

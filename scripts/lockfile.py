"""The dependency lock, requirements.lock: every Python package the suite installs, torch and torchvision included,
pinned to one version with its hashes, for Linux and macOS on Python 3.11+ (uv's universal resolution).

    python scripts/lockfile.py fingerprint            the fingerprint of pyproject.toml's dependencies
    python scripts/lockfile.py check                  exit 1, with one line, when the lock is stale
    python scripts/lockfile.py select --mode M -o F   write to F the entries this interpreter installs (M: locked or
                                                      system, where torch, its runtime and whatever the interpreter
                                                      already has are left as they are)
    python scripts/lockfile.py wheels -d DIR --python-version 3.12 [--only NAME ...]
                                                      download the locked files (hash-checked) for another machine's
                                                      Python, for an install there with no package registry

`make lock` makes the lock with uv (`uv pip compile --universal --generate-hashes`) and writes the fingerprint into
its first line; `check` compares that line with pyproject.toml, so a dependency changed without a new lock fails
the install (and CI) instead of installing something nobody locked. Standard library only (plus the `packaging`
that every pip vendors): it runs before anything is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements.lock"
EXCLUDES = REPO / "scripts" / "lock-excludes.txt"  # packages a locked one declares and never imports
PYPROJECT = REPO / "pyproject.toml"
EXTRAS = ("dev", "build", "trace")  # the extras `make lock` resolves; what `make install` installs
FINGERPRINT = "# pyproject-fingerprint: "
# What TORCH=system keeps from the interpreter: torch and the packages that only torch needs (its CUDA runtime
# wheels, triton); torchvision too when the interpreter has one (it is built for that torch).
TORCH_ROOTS = ("torch", "triton")
# Installed at their locked versions whatever the interpreter has: the editable install and Horovod's build need
# a setuptools that knows PEP 660, and an interpreter's own copy may be years old.
BUILD_TOOLS = ("setuptools", "wheel")


def fingerprint(pyproject: Path = PYPROJECT) -> str:
    """sha256 of what the lock is resolved from: requires-python, the dependencies, the locked extras and the
    packages left out of the resolution (scripts/lock-excludes.txt)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    spec = {"requires-python": project.get("requires-python"), "dependencies": sorted(project["dependencies"]),
            "extras": {e: sorted(extras.get(e, [])) for e in EXTRAS},
            "excludes": sorted(line.split("#")[0].strip() for line in EXCLUDES.read_text().splitlines()
                               if line.split("#")[0].strip())}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _target(python_version: str | None) -> dict | None:
    """A marker environment for another Python (same OS and machine as this one), or None for this interpreter."""
    if not python_version:
        return None
    from platform import python_implementation  # noqa: F401 (markers of other keys keep this machine's values)

    full = python_version if python_version.count(".") >= 2 else python_version + ".0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full}


class Entry:
    def __init__(self, line: str):
        req, _, marker = line.partition(";")
        self.name, _, self.version = req.strip().partition("==")
        self.key = canonicalize_name(self.name)
        self.marker = Marker(marker.strip()) if marker.strip() else None
        self.hashes: list[str] = []
        self.via: set[str] = set()

    def applies(self, environment: dict | None = None) -> bool:
        return self.marker is None or self.marker.evaluate(environment)

    def text(self) -> str:
        return " \\\n".join([f"{self.name}=={self.version}", *(f"    --hash={h}" for h in self.hashes)])


def parse(lock: Path = LOCK) -> tuple[str | None, list[Entry]]:
    """(the fingerprint line's value, the entries) of a lock written by `uv pip compile`."""
    text = lock.read_text()
    found = next((ln[len(FINGERPRINT):].strip() for ln in text.splitlines() if ln.startswith(FINGERPRINT)), None)
    entries, current, in_via = [], None, False
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line:
            continue
        if not raw.startswith((" ", "#")):
            parts = line.split(" --hash=")
            current = Entry(parts[0])
            current.hashes = [h.strip() for h in parts[1:]]
            entries.append(current)
            in_via = False
        elif current is not None and line.startswith("# via"):
            rest = line[len("# via"):].strip()
            if rest:
                current.via.add(canonicalize_name(rest.split()[0]))
            in_via = not rest
        elif current is not None and in_via and line.startswith("#   "):
            current.via.add(canonicalize_name(line[1:].split()[0]))
    return found, entries


def stale(lock: Path = LOCK, pyproject: Path = PYPROJECT) -> str | None:
    """Why the lock does not match pyproject.toml (one line), or None."""
    if not lock.exists():
        return f"{lock.name} is missing; make it with: make lock"
    found, entries = parse(lock)
    if found != fingerprint(pyproject):
        return (f"{lock.name} is stale: pyproject.toml's dependencies changed since it was made (fingerprint "
                f"{found or 'missing'}); refresh it with `make lock` and commit it")
    pinned = {e.key: e for e in entries if e.applies()}
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"]) + [r for e in EXTRAS
                                              for r in project.get("optional-dependencies", {}).get(e, [])]
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        entry = pinned.get(canonicalize_name(req.name))
        if entry is None:
            return f"{lock.name} has no pin for {req.name} (pyproject.toml asks for {text!r}); run `make lock`"
        if not req.specifier.contains(entry.version, prereleases=True):
            return f"{lock.name} pins {entry.name}=={entry.version}, outside pyproject.toml's {text!r}; run `make lock`"
    return None


def torch_closure(entries: list[Entry]) -> set[str]:
    """torch, triton, and every package that only they (or others of the set) need."""
    keep = {canonicalize_name(n) for n in TORCH_ROOTS}
    while True:
        more = {e.key for e in entries if e.key not in keep and e.via and e.via <= keep}
        if not more:
            return keep
        keep |= more


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def select(mode: str, lock: Path = LOCK, wheels: Path | None = None) -> tuple[list[Entry], list[str], list[str]]:
    """The entries to install into this interpreter; what was left to the interpreter (system mode); and, in system
    mode with a folder of wheels, the missing packages that folder has no file for (installed without them: the
    backend or loader that needs one is then skipped with the reason, as on any machine without it)."""
    _, entries = parse(lock)
    entries = [e for e in entries if e.applies()]
    if mode == "locked":
        return entries, [], []
    closure = torch_closure(entries)
    keep, left, absent = [], [], []
    have = {canonicalize_name(re.split(r"-\d", f.name, maxsplit=1)[0]) for f in wheels.iterdir()} if wheels else None
    for e in entries:
        if e.key in closure or (installed(e.name) and e.key not in BUILD_TOOLS):
            left.append(e.name)
        elif have is not None and e.key not in have:
            absent.append(e.name)
        else:
            keep.append(e)
    return keep, left, absent


def download(directory: Path, python_version: str | None, only: list[str] | None, lock: Path = LOCK) -> int:
    """``pip download`` the locked files of the entries for ``python_version`` (all, or ``only`` these names),
    hash-checked, with no dependencies beyond the lock's own pins."""
    import subprocess
    import tempfile

    _, entries = parse(lock)
    env = _target(python_version)
    chosen = [e for e in entries if e.applies(env) and (not only or e.key in {canonicalize_name(n) for n in only})]
    unknown = sorted({canonicalize_name(n) for n in only or []} - {e.key for e in chosen})
    if unknown:
        print(f"lockfile: not in {lock.name} for Python {python_version or 'here'}: {', '.join(unknown)}",
              file=sys.stderr)
        return 2
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(e.text() + "\n" for e in chosen))
    target = ["--python-version", env["python_version"]] if env else []
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", f.name,
           "-d", str(directory), *target]
    return subprocess.call(cmd)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/lockfile.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fingerprint")
    sub.add_parser("check")
    s = sub.add_parser("select")
    s.add_argument("--mode", required=True, choices=("locked", "system"))
    s.add_argument("-o", "--out", required=True)
    s.add_argument("--wheels", help="system mode: leave out the packages this folder has no file for")
    w = sub.add_parser("wheels")
    w.add_argument("-d", "--dir", required=True)
    w.add_argument("--python-version", help="the other machine's Python, e.g. 3.12 (default: this one's)")
    w.add_argument("--only", nargs="*", help="just these packages (default: every one the lock has for it)")
    args = p.parse_args(argv)
    if args.cmd == "fingerprint":
        print(fingerprint())
        return 0
    why = stale()
    if why:
        print(f"lockfile: {why}", file=sys.stderr)
        return 1
    if args.cmd == "check":
        return 0
    if args.cmd == "wheels":
        return download(Path(args.dir), args.python_version, args.only)
    keep, left, absent = select(args.mode, wheels=Path(args.wheels) if args.wheels else None)
    Path(args.out).write_text("".join(e.text() + "\n" for e in keep))
    if left:
        print(f"lockfile: TORCH=system: keeping the interpreter's torch and {len(left) - 1} more packages it "
              f"already has; {len(keep)} to install from the lock", file=sys.stderr)
    if absent:
        print(f"lockfile: no file in {args.wheels} for {', '.join(absent)}: installing without them (what needs "
              "them is skipped with the reason)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

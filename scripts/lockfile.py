"""The dependency lock, requirements.lock: every Python package the suite installs, torch and torchvision included,
pinned to one version with its hashes, for Linux and macOS on Python 3.11+ (uv's universal resolution).

    python scripts/lockfile.py fingerprint            the fingerprint of pyproject.toml's dependencies
    python scripts/lockfile.py check                  exit 1, with one line, when the lock is stale
    python scripts/lockfile.py select --mode M -o F   write to F the entries this interpreter installs (M: locked or
                                                      system, where torch, its runtime and whatever the interpreter
                                                      already has are left as they are)
    python scripts/lockfile.py wheels -d DIR [--python-version 3.12] [--have FREEZE] [--horovod] [--only NAME ...]
                                                      download the locked files (hash-checked) for another machine's
                                                      Python, for an install there with no package registry: every
                                                      one; or, with --have (`pip list --format=freeze` taken there),
                                                      what TORCH=system would install there and finds missing, plus
                                                      Horovod's source archive and the build tools; --horovod: only
                                                      Horovod's source and its build and runtime requirements
    python scripts/lockfile.py pin NAME ...           the lock's lines (with hashes) for these packages, for `pip -r`
    python scripts/lockfile.py requires EXTRA         pyproject.toml's requirements of that extra, one a line

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
# Locked (its source archive, hash-checked, so that `make wheels` carries it) but never installed from the lock:
# scripts/build_horovod.sh compiles it against the installed torch.
BUILT_APART = ("horovod",)
# A freeze line: a name, then nothing, ==version, ===version or @ url (pip list --format=freeze, pip freeze).
FREEZE_LINE = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*(?:(?:===?|@)\s*\S.*)?")
PYTHON_LINE = re.compile(r"#\s*python:\s*(\S+)\s*")  # a profile's own line: which Python the machine has


class Refused(Exception):
    """Bad input: one line for the user, exit 2."""


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
    if not re.fullmatch(r"3\.\d+(\.\d+)?", python_version):
        raise Refused(f"--python-version {python_version}: give the other machine's Python as 3.12 or 3.12.3")
    full = python_version if python_version.count(".") >= 2 else python_version + ".0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full}


def read_have(path: Path) -> tuple[set[str], str | None]:
    """The package names in a `python3 -m pip list --format=freeze` (or `pip freeze`) taken on another machine, and
    the Python version its `# python: 3.12.3` line gives (the committed machine profiles have one), if any."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise Refused(f"HAVE={path}: cannot read it ({e.strerror}); give the output of `python3 -m pip list "
                      "--format=freeze` taken on the other machine") from None
    names, python = set(), None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if m := PYTHON_LINE.fullmatch(line):
            python = m.group(1)
            if not re.fullmatch(r"3\.\d+(\.\d+)?", python):
                raise Refused(f"HAVE={path} line {number}: python {python}: write the machine's Python as 3.12.3")
        elif not line or line.startswith(("#", "-")):  # comments; pip freeze's -e and option lines name no package
            continue
        elif m := FREEZE_LINE.fullmatch(line):
            names.add(canonicalize_name(m.group(1)))
        else:
            raise Refused(f"HAVE={path} line {number}: {line[:60]!r} is not a line of `pip list --format=freeze`")
    if "torch" not in names:
        raise Refused(f"HAVE={path} has no torch: the folder is for TORCH=system, which keeps the other machine's own "
                      "torch; leave HAVE out to download every locked package")
    return names, python


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


def system_rule(entries: list[Entry], has) -> tuple[list[Entry], list[str]]:
    """TORCH=system's rule, here (install.sh) and for another machine (`wheels --have`): (the entries to install, the
    names left to the interpreter). Left: torch and what only torch needs, and whatever ``has(entry)`` says the
    interpreter already has, except the build tools, always the locked ones."""
    closure = torch_closure(entries)
    take, left = [], []
    for e in entries:
        if e.key in closure or (e.key not in BUILD_TOOLS and has(e)):
            left.append(e.name)
        else:
            take.append(e)
    return take, left


def requirements_of(roots: set[str], entries: list[Entry]) -> set[str]:
    """``roots`` and everything they need, transitively, as the lock's `# via` lines say."""
    found = set(roots)
    while more := {e.key for e in entries if e.key not in found and e.via & found}:
        found |= more
    return found


def horovod_set(entries: list[Entry], pyproject: Path = PYPROJECT) -> set[str]:
    """Horovod and what scripts/build_horovod.sh needs to build and run it: pyproject.toml's `build` extra (Horovod,
    its build tools, its setup_requires) and all they need."""
    build = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["build"]
    return requirements_of({canonicalize_name(Requirement(r).name) for r in build}, entries)


def select(mode: str, lock: Path = LOCK, wheels: Path | None = None) -> tuple[list[Entry], list[str], list[str]]:
    """The entries to install into this interpreter; what was left to the interpreter (system mode); and, in system
    mode with a folder of wheels, the missing packages that folder has no file for (installed without them: the
    backend or loader that needs one is then skipped with the reason, as on any machine without it). Horovod is
    never among them (scripts/build_horovod.sh builds it)."""
    _, entries = parse(lock)
    entries = [e for e in entries if e.applies() and e.key not in BUILT_APART]
    if mode == "locked":
        return entries, [], []
    take, left = system_rule(entries, lambda e: installed(e.name))
    have = {canonicalize_name(re.split(r"-\d", f.name, maxsplit=1)[0]) for f in wheels.iterdir()} if wheels else None
    keep = [e for e in take if have is None or e.key in have]
    absent = [e.name for e in take if have is not None and e.key not in have]
    return keep, left, absent


def choose(python_version: str | None = None, only: list[str] | None = None, have: Path | None = None,
           horovod: bool = False, lock: Path = LOCK) -> tuple[list[Entry], str | None]:
    """What `wheels` downloads, and for which Python (None: this one's): every entry for that Python; or ``only``
    these; or, with ``have`` (the other machine's freeze), what TORCH=system would install there and that machine
    lacks, plus Horovod's source and the build tools' own requirements; ``horovod``: only Horovod and what it needs
    (of those)."""
    if only and (have or horovod):
        raise Refused("--only names the packages by hand; leave it out with --have or --horovod")
    names = python = None
    if have:
        names, python = read_have(have)
        if python_version and python and _target(python)["python_version"] != _target(python_version)["python_version"]:
            raise Refused(f"--python-version {python_version}, but HAVE={have} says its machine has Python {python}")
        if not python_version and not python:
            raise Refused(f"HAVE={have} does not say which Python that machine has: give it, e.g. --python-version "
                          "3.12 (make wheels ... WHEELS_PYTHON=3.12)")
    python_version = python_version or python
    env = _target(python_version)
    _, entries = parse(lock)
    entries = [e for e in entries if e.applies(env)]
    if only:
        wanted = {canonicalize_name(n) for n in only}
        unknown = sorted(wanted - {e.key for e in entries})
        if unknown:
            raise Refused(f"not in {lock.name} for Python {python_version or 'here'}: {', '.join(unknown)}")
        return [e for e in entries if e.key in wanted], python_version
    keys = horovod_set(entries) if horovod else {e.key for e in entries}
    if names is not None:
        # Always in the folder, whatever that machine has: Horovod's source, and the build tools with what they need
        # (wheel needs packaging): pip builds a source archive (DeepSpeed's) in an isolated environment, which sees
        # none of the interpreter's packages and, with no registry, can only take them from the folder.
        always = requirements_of(set(BUILD_TOOLS), entries) | set(BUILT_APART)
        entries, _ = system_rule(entries, lambda e: e.key in names and e.key not in always)
    return [e for e in entries if e.key in keys], python_version


def download(directory: Path, chosen: list[Entry], python_version: str | None) -> int:
    """``pip download`` the locked files of ``chosen`` for ``python_version``, hash-checked, with no dependencies
    beyond the lock's own pins (pip's cache serves what an earlier run fetched)."""
    import subprocess
    import tempfile

    env = _target(python_version)
    print(f"lockfile: {len(chosen)} locked packages for Python {env['python_version'] if env else 'here'} into "
          f"{directory}: {' '.join(e.name for e in chosen)}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text("".join(e.text() + "\n" for e in chosen))
        target = ["--python-version", env["python_version"]] if env else []
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "-r", str(req),
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
    w.add_argument("--python-version", help="the other machine's Python, e.g. 3.12 (default: HAVE's `# python:` line, "
                   "else this one's)")
    w.add_argument("--have", help="`python3 -m pip list --format=freeze` taken on the other machine (TORCH=system "
                   "there): download only what it lacks, plus Horovod's source and the build tools")
    w.add_argument("--horovod", action="store_true", help="only Horovod's source and its build and runtime "
                   "requirements (what scripts/build_horovod.sh needs)")
    w.add_argument("--list", action="store_true", help="print the chosen packages, one a line, and download nothing")
    w.add_argument("--only", nargs="*", help="just these packages (default: every one the lock has for it)")
    pin = sub.add_parser("pin")
    pin.add_argument("names", nargs="+")
    req = sub.add_parser("requires")
    req.add_argument("extra")
    args = p.parse_args(argv)
    if args.cmd == "fingerprint":
        print(fingerprint())
        return 0
    why = stale()
    if why:
        print(f"lockfile: {why}", file=sys.stderr)
        return 1
    try:
        return _command(args)
    except Refused as e:
        print(f"lockfile: {e}", file=sys.stderr)
        return 2


def _command(args) -> int:
    if args.cmd == "check":
        return 0
    if args.cmd == "wheels":
        chosen, python_version = choose(args.python_version, args.only, Path(args.have) if args.have else None,
                                        args.horovod)
        if args.list:
            print("".join(f"{e.name}=={e.version}\n" for e in chosen), end="")
            return 0
        return download(Path(args.dir), chosen, python_version)
    if args.cmd == "pin":
        pinned = {e.key: e for e in parse()[1] if e.applies()}
        unknown = [n for n in args.names if canonicalize_name(n) not in pinned]
        if unknown:
            raise Refused(f"not in {LOCK.name} for this Python: {', '.join(unknown)}")
        print("".join(pinned[canonicalize_name(n)].text() + "\n" for n in args.names), end="")
        return 0
    if args.cmd == "requires":
        extras = tomllib.loads(PYPROJECT.read_text())["project"].get("optional-dependencies", {})
        if args.extra not in extras:
            raise Refused(f"pyproject.toml has no extra {args.extra!r} (it has: {', '.join(sorted(extras))})")
        print("".join(f"{r}\n" for r in extras[args.extra]
                      if canonicalize_name(Requirement(r).name) not in BUILT_APART), end="")
        return 0
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

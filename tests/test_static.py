"""Static checks, in make test-fast (docs/tests.md, "Static checks"): a line that only a GPU executes is still read here.

- Every import of a project module resolves: ``from bench.x import NAME`` (module level or inside a function) names a
  module or something that module defines. A refactor once moved ``_visible_nvml_indices`` and left an import of it
  inside ``bench/launch/machine.py run_gpus``, which only a CUDA run executes: every ``bench run`` on a GPU crashed
  while the CPU suite stayed green.
- The type checker (mypy, configured in pyproject.toml's [tool.mypy]) finds nothing in bench/ and backends/: unknown
  names imported from project modules, unknown attributes of project modules and classes, wrong call arity, undefined
  names. One run checks the project and a probe file of known mistakes, so the check cannot pass by checking nothing.
"""
import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.test_layout import modules


def defined_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level (functions, classes, assignments, imports, in if/try blocks too);
    None when it defines ``__getattr__`` (any name may resolve)."""
    names: set[str] = set()

    def targets(node):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
                visit(node.body + node.orelse)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                visit(node.body)
            elif isinstance(node, (ast.If, ast.While)):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)
                for h in node.handlers:
                    visit(h.body)

    tree = ast.parse(path.read_text(), str(path))
    visit(tree.body)
    return None if "__getattr__" in names else names


def project_imports(root: Path = REPO) -> tuple[list[str], int]:
    """(what does not resolve, as ``file:line message``; how many imported names were checked), every import of
    a project module at any depth of every file of bench/ and backends/."""
    mods = modules(root)
    defined: dict[str, set[str] | None] = {}
    bad, checked = [], 0
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ("bench", "backends"):
                        checked += 1
                        if a.name not in mods:
                            bad.append(f"{rel}:{node.lineno} import {a.name}: no such module")
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] not in ("bench", "backends"):
                continue
            if target not in mods:
                bad.append(f"{rel}:{node.lineno} from {target} import ...: no such module")
                continue
            if target not in defined:
                defined[target] = defined_names(mods[target])
            for a in node.names:
                checked += 1
                if a.name == "*" or f"{target}.{a.name}" in mods or defined[target] is None:
                    continue
                if a.name not in defined[target]:
                    bad.append(f"{rel}:{node.lineno} from {target} import {a.name}: {target} defines no {a.name}")
    return bad, checked


def test_every_project_import_resolves_at_every_depth():
    bad, checked = project_imports()
    assert checked > 500, checked  # the walk reaches the imports inside functions too
    assert bad == [], f"{len(bad)} of {checked} imported names do not resolve:\n" + "\n".join(bad)


def test_an_import_of_a_moved_name_inside_a_function_is_found(tmp_path):
    """The failure this check exists for, rebuilt on a copy of the tree: machine.py's run_gpus importing
    ``_visible_nvml_indices`` from bench.core.results, which no longer defines it."""
    import shutil

    for top in ("bench", "backends"):
        shutil.copytree(REPO / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "bench" / "launch" / "machine.py"
    text = path.read_text()
    anchor = "    if device_type != \"cuda\" or gpus_on_node < 1:\n        return []\n"
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + "    from bench.core.results import _visible_nvml_indices\n", 1))
    bad, _ = project_imports(tmp_path)
    assert len(bad) == 1 and bad[0].startswith("bench/launch/machine.py:") and bad[0].endswith(
        "from bench.core.results import _visible_nvml_indices: bench.core.results defines no _visible_nvml_indices")


PROBE = '''"""Known mistakes: each line below must be found."""
from bench.core import cuda, stats
from bench.core.results import no_such_name


def on_a_gpu_only():
    stats.summarise_runs()
    cuda.no_such_query()
    return undefined_name
'''
PROBE_FINDINGS = {(3, "attr-defined"), (7, "call-arg"), (8, "attr-defined"), (9, "name-defined")}


def test_the_type_checker_finds_nothing_in_the_project_and_every_probe_mistake():
    # a fixed place for the probe (mypy's cache is keyed by module and remembers a path), beside that cache
    probe = REPO / ".mypy_cache" / "probe" / "probe_mistakes.py"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(PROBE)
    proc = subprocess.run([sys.executable, "-m", "mypy", "bench", "backends", str(probe)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ": error: " in ln]
    mine = lambda ln: ln.split(":", 1)[0].endswith("probe_mistakes.py")  # noqa: E731 - relative or absolute
    project = [ln for ln in lines if not mine(ln)]
    assert project == [], "mypy (pyproject.toml [tool.mypy]) finds:\n" + "\n".join(project)
    found = {(int(ln.split(":")[1]), ln.rsplit("[", 1)[1].rstrip("]")) for ln in lines if mine(ln)}
    assert found == PROBE_FINDINGS, proc.stdout + proc.stderr

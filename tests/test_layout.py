"""The layering (README: A code tour, in reading order), read from the code's own imports with ast, so it holds without
anyone watching:

    bench/cli.py -> bench/commands -> bench/plan -> bench/launch -> bench/rank -> backends -> bench/core
                                   -> bench/report -> (backends, bench/core)

Imports point down, never up; core imports nothing else of the project; launch never imports rank (they talk through
the spec file and the markers in core); the report reads records: it imports core and backends only, never what plans,
launches or runs a rank, and nothing that plans or launches imports it; no module under bench/commands imports another
(what several commands share lives in the rooms below); and no module imports itself back in a circle. Function-level
imports count as much as module-level ones."""
import ast
from pathlib import Path

from tests.conftest import REPO

LAYERS = ("core", "backends", "rank", "launch", "plan", "report", "commands", "cli")  # bottom to top
REPORT_READS = ("core", "backends", "report")  # the report's own imports: records in, figures out


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for top in ("bench", "backends"):
        for path in sorted((root / top).rglob("*.py")):
            found[".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def imports(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (the most specific module each import names)."""
    mods = modules(root)
    edges = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]  # a submodule, else the module itself
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    edges[mod].add(name)
    return edges


def layer(mod: str) -> str:
    if mod.split(".")[0] == "backends":
        return "backends"
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "cli"  # bench, bench.cli, bench.__main__


def command(mod: str) -> str | None:
    """The subcommand module a module is (bench.commands.run: "run"), or None (the package, or another layer)."""
    parts = mod.split(".")
    return parts[2] if layer(mod) == "commands" and len(parts) > 2 else None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    for a in sorted(edges):
        for b in sorted(edges[a]):
            la, lb = layer(a), layer(b)
            if LAYERS.index(lb) > LAYERS.index(la):
                out.append(f"upward import: {a} ({la}) imports {b} ({lb})")
            elif la == "core" and lb != "core":
                out.append(f"core imports the project: {a} imports {b}")
            elif la == "launch" and lb == "rank":
                out.append(f"launch imports rank: {a} imports {b} (they talk through the spec and core's markers)")
            elif la == "report" and lb not in REPORT_READS:
                out.append(f"the report imports {lb}: {a} imports {b} (it reads records; it never plans, launches or "
                           "runs a rank)")
            elif la == lb == "commands" and command(a) and command(b) and command(b) != command(a):
                out.append(f"commands import each other: {a} imports {b} (share through bench/plan, bench/report or "
                           "bench/core)")
    return out


def test_the_project_keeps_its_layers():
    edges = imports(REPO)
    assert {layer(m) for m in edges} == set(LAYERS)
    assert violations(edges) == []


def test_the_check_finds_a_cycle_an_upward_import_and_commands_importing_each_other(tmp_path):
    files = {
        "bench/__init__.py": "", "bench/cli.py": "from bench.commands import run\n",
        "bench/core/__init__.py": "", "bench/core/config.py": "from bench.rank import train\n",  # upward, from core
        "bench/rank/__init__.py": "", "bench/rank/train.py": "from bench.rank import record\n",
        "bench/rank/record.py": "def f():\n    from bench.rank.train import run\n",  # a cycle, inside a function
        "bench/launch/__init__.py": "import bench.rank.train\n",
        "bench/plan/__init__.py": "", "bench/plan/sweep.py": "from bench.report import verdict\n",  # the plan: report
        "bench/report/__init__.py": "", "bench/report/verdict.py": "from bench.launch import run\n",  # report: launch
        "bench/commands/__init__.py": "",
        "bench/commands/run.py": "from bench.plan import sweep\nfrom bench.commands import verify\n",
        "bench/commands/verify.py": "from bench.plan.sweep import plan\n",
        "bench/commands/report.py": "from bench.report import verdict\n",
        "backends/__init__.py": "from bench.core import config\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = violations(imports(tmp_path))
    assert found == [
        "import cycle: bench.rank.record <-> bench.rank.train",
        "commands import each other: bench.commands.run imports bench.commands.verify (share through bench/plan, "
        "bench/report or bench/core)",
        "upward import: bench.core.config (core) imports bench.rank.train (rank)",
        "launch imports rank: bench.launch imports bench.rank.train (they talk through the spec and core's markers)",
        "upward import: bench.plan.sweep (plan) imports bench.report.verdict (report)",
        "the report imports launch: bench.report.verdict imports bench.launch (it reads records; it never plans, "
        "launches or runs a rank)",
    ]

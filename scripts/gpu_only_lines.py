"""The lines of bench/ and backends/ that only a GPU executes, from a coverage run of the CPU suite (make coverage).

A line the CPU suite never executed is GPU-only when a GPU is what it waits for: it lies under a condition that asks for
CUDA (``device_type == "cuda"``, ``d.type != "cuda"``, ``torch.cuda.is_available()``, NCCL), or it is itself a device
call (``cuda.``, ``nvml.``, ``torch.cuda``), or it is in the device seam (bench/core/cuda.py, bench/core/nvml.py),
whose lines are each one library call. The seam's lines, and a line elsewhere that is one device call and nothing else
(``cuda.synchronize(d)``, the plain twins' ``torch.cuda.synchronize(device)``), are the floor: only a GPU can run them.
Every other GPU-only line is project logic that a CPU test could reach through the fake GPU machine (tests/fake_gpu.py)
and does not yet.

    python scripts/gpu_only_lines.py [--data FILE] [--list] [--json OUT]

prints the counts (and with --list every project-logic line, file:line and its text); exit 0. The other lines the
suite never ran are counted apart ("not run, not GPU-only"): CPU code without a test, or error paths.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEAM = ("bench/core/cuda.py", "bench/core/nvml.py")
GPU_WORDS = re.compile(r"\bcuda\b|\bnccl\b|nvml|is_available", re.IGNORECASE)  # not "gpus": --gpus counts ranks
DEVICE_CALL = re.compile(r"\b(cuda|nvml)\.[a-z_]+\(|torch\.cuda\.")
# a line that is one library call or switch and nothing else: `cuda.synchronize(d)`, `x = torch.cuda.max_memory_allocated()`,
# `dist.init_process_group("nccl", ...)`, `torch.backends.cudnn.benchmark = flag`
LIBRARY_CALL = re.compile(r"^\s*((return\s+|[\w.\[\]\"', ]+\s*=\s*)?(torch\.cuda|torch\.backends\.cud\w+|cuda|nvml|dist)\.[\w.]+"
                          r"(\(.*\))?|torch\.backends\.[\w.]+\s*=\s*.+)\s*(#.*)?$")


def gpu_guarded_lines(source: str) -> set[int]:
    """Lines that run only on a GPU by the code's own conditions: the branch of an ``if``/``while`` whose test asks
    for CUDA, NCCL, a GPU or NVML (the body of ``if x == "cuda"``, the else of ``if x != "cuda"`` or ``if not
    cuda.available()``), and the rest of the block after a guard clause that leaves when there is none (``if d.type
    != "cuda": continue``)."""
    tree = ast.parse(source)
    lines: set[int] = set()

    def span(nodes) -> set[int]:
        out: set[int] = set()
        for n in nodes:
            out.update(range(n.lineno, (n.end_lineno or n.lineno) + 1))
        return out

    def negative(test) -> bool:
        text = ast.unparse(test)
        return "!=" in text or text.startswith("not ") or " not in " in text

    def branches(test) -> tuple[bool, bool]:
        """(the body runs only on a GPU, the else and a guard clause's rest run only on a GPU)."""
        if isinstance(test, ast.BoolOp):
            gpu = [v for v in test.values if GPU_WORDS.search(ast.unparse(v))]
            if isinstance(test.op, ast.And):  # every operand holds in the body
                return any(not negative(v) for v in gpu), False
            return False, any(negative(v) for v in gpu)  # or: every operand fails in the else
        return (False, True) if negative(test) else (True, False)

    def visit_block(body):
        for i, node in enumerate(body):
            if isinstance(node, (ast.If, ast.While)) and GPU_WORDS.search(ast.unparse(node.test)):
                in_body, in_else = branches(node.test)
                if in_body:
                    lines.update(span(node.body))
                if in_else:
                    lines.update(span(node.orelse))
                    leaves = node.body and isinstance(node.body[-1], (ast.Continue, ast.Return, ast.Raise, ast.Break))
                    if leaves and not node.orelse:
                        lines.update(span(body[i + 1:]))  # the rest of the block runs only on a GPU
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    visit_block(block)
            for h in getattr(node, "handlers", None) or []:
                visit_block(h.body)

    visit_block(tree.body)
    return lines


def classify(rel: str, source: str, missed: set[int]) -> dict[str, list[int]]:
    """The missed lines of one file: {"seam": [...], "call": [...], "logic": [...], "other": [...]}: in the device
    seam; GPU-only and one library call alone; GPU-only project logic; not GPU-only."""
    if rel in SEAM:
        return {"seam": sorted(missed), "call": [], "logic": [], "other": []}
    text = source.splitlines()
    guarded = gpu_guarded_lines(source)
    out: dict[str, list[int]] = {"seam": [], "call": [], "logic": [], "other": []}
    for n in sorted(missed):
        line = text[n - 1] if n - 1 < len(text) else ""
        device_call = DEVICE_CALL.search(line) and not re.match(r"\s*(el)?if |\s*while ", line)  # a test runs anywhere
        if n in guarded or device_call:
            out["call" if LIBRARY_CALL.match(line) else "logic"].append(n)
        else:
            out["other"].append(n)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(REPO / "results" / "coverage" / ".coverage"), help="the combined data file")
    p.add_argument("--list", action="store_true", help="every GPU-only line of project logic, with its text")
    p.add_argument("--json", help="write the counts and lines here")
    args = p.parse_args(argv)
    import coverage

    if not Path(args.data).exists():
        print(f"gpu_only_lines: no coverage data at {args.data} (make coverage writes it)", file=sys.stderr)
        return 2
    cov = coverage.Coverage(data_file=args.data)
    cov.load()
    totals = {"seam": 0, "call": 0, "logic": 0, "other": 0, "statements": 0, "run": 0}
    listing: dict[str, dict[str, list[int]]] = {}
    for top in ("bench", "backends"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            try:
                _, statements, _, missing, _ = cov.analysis2(str(path))
            except coverage.CoverageException:  # never imported by any test: all of it is missed
                continue
            totals["statements"] += len(statements)
            totals["run"] += len(statements) - len(missing)
            got = classify(rel, path.read_text(), set(missing))
            for k, v in got.items():
                totals[k] += len(v)
            if got["seam"] or got["call"] or got["logic"]:
                listing[rel] = {"seam": got["seam"], "call": got["call"], "logic": got["logic"]}
    print(f"CPU suite: {totals['run']} of {totals['statements']} statements of bench/ and backends/ run "
          f"({100 * totals['run'] / max(1, totals['statements']):.1f}%)")
    print(f"GPU-only lines: {totals['seam'] + totals['call'] + totals['logic']} = {totals['seam']} in the device seam "
          f"({', '.join(SEAM)}) + {totals['call']} elsewhere that are one device call alone + {totals['logic']} of "
          "project logic")
    print(f"not run, not GPU-only: {totals['other']}")
    if args.list:
        for rel, got in listing.items():
            text = (REPO / rel).read_text().splitlines()
            for n in got["logic"]:
                print(f"  {rel}:{n}: {text[n - 1].strip()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"totals": totals, "lines": listing}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

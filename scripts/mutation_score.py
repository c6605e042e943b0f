"""The mutation score of `make mutation`, per module, from mutmut's results (mutants/<file>.meta).

Usage: python scripts/mutation_score.py [GLOB ...]   (the mutant names `mutmut run` was given; none: every mutant)

One line per mutated module: mutants, killed, timeout, survived, no tests (no test of the subset reaches the
function), other (suspicious, segfault, not checked) and the score, (killed + timeout) / mutants; then every
survivor, by function. `mutmut show NAME` (in .tools/mutmut-venv) prints a survivor's diff. Exit 0; 1 when there are
no results to read.
"""
from __future__ import annotations

import collections
import fnmatch
import json
import re
import sys
import tomllib
from pathlib import Path

KILLED, TIMEOUT, SURVIVED, NO_TESTS, OTHER = "killed", "timeout", "survived", "no tests", "other"
STATUS = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, -24: TIMEOUT, 24: TIMEOUT, 36: TIMEOUT,
          152: TIMEOUT, 255: TIMEOUT}
COLUMNS = (KILLED, TIMEOUT, SURVIVED, NO_TESTS, OTHER)


def main(globs: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    files = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    rows, survivors = [], collections.defaultdict(list)
    for name in files:
        meta = root / "mutants" / (name + ".meta")
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text()).get("exit_code_by_key", {})
        picked = {k: v for k, v in codes.items() if not globs or any(fnmatch.fnmatchcase(k, g) for g in globs)}
        if not picked:
            continue
        counts = collections.Counter(STATUS.get(v, OTHER) for v in picked.values())
        rows.append((name, len(picked), counts))
        for k, v in picked.items():
            if STATUS.get(v) == SURVIVED:
                survivors[re.sub(r"__mutmut_\d+$", "", k)].append(int(k.rsplit("_", 1)[1]))
    if not rows:
        print("mutation_score: no results in mutants/ (run `make mutation` first)", file=sys.stderr)
        return 1
    width = max(len(r[0]) for r in rows)
    print(f"{'module':<{width}}  mutants  " + "  ".join(COLUMNS) + "  score")
    for name, n, counts in rows + [("total", sum(r[1] for r in rows), sum((r[2] for r in rows), collections.Counter()))]:
        score = (counts[KILLED] + counts[TIMEOUT]) / n if n else 0.0
        print(f"{name:<{width}}  {n:>7}  " + "  ".join(f"{counts[c]:>{len(c)}}" for c in COLUMNS) + f"  {score:6.1%}")
    if survivors:
        print("\nsurvivors (function: mutant numbers; `mutmut show NAME__mutmut_N` prints one):")
        for fn in sorted(survivors):
            print(f"  {fn}: {', '.join(map(str, sorted(survivors[fn])))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Rewrite tests/schedule.py from the output of a pytest run with ``--durations=0``.

    make test ARGS=--durations=0 > full.log;  make test-fast ARGS=--durations=0 > fast.log
    python scripts/test_schedule.py --full full.log --fast fast.log

Each module's time is the sum of its items' phases (set-up, call, tear-down) as pytest reports them; modules under
MIN_S seconds are left out (they run after the listed ones, in file order). Only the order the modules start in
depends on these numbers (tests/conftest.py, pytest_collection_modifyitems), never a result."""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ITEM = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")
MIN_S = 3.0
SCHEDULE = Path(__file__).resolve().parent.parent / "tests" / "schedule.py"


def module_seconds(log: str) -> dict[str, float]:
    """Per test module, the seconds of all its items' phases listed in ``log``."""
    total: Counter = Counter()
    for line in log.splitlines():
        m = ITEM.match(line)
        if m:
            total[m.group(2)] += float(m.group(1))
    return {k: round(v, 1) for k, v in total.most_common() if v >= MIN_S}


def render(name: str, seconds: dict[str, float]) -> str:
    rows = "".join(f"    {k!r}: {v},\n" for k, v in seconds.items())
    return f"{name}: dict[str, float] = {{\n{rows}}}\n" if rows else f"{name}: dict[str, float] = {{}}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", type=Path, help="the output of `make test ARGS=--durations=0`")
    ap.add_argument("--fast", type=Path, help="the output of `make test-fast ARGS=--durations=0`")
    args = ap.parse_args(argv)
    text = SCHEDULE.read_text()
    for name, path in (("FULL", args.full), ("FAST", args.fast)):
        if path is None:
            continue
        seconds = module_seconds(path.read_text(errors="replace"))
        if not seconds:
            print(f"test_schedule: {path} lists no durations (run pytest with --durations=0)", file=sys.stderr)
            return 2
        text = re.sub(rf"^{name}: dict\[str, float\] = \{{.*?^\}}\n|^{name}: dict\[str, float\] = \{{\}}\n",
                      lambda _: render(name, seconds), text, count=1, flags=re.S | re.M)
    SCHEDULE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

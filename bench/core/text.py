"""Text every command formats the same way: Markdown tables and byte sizes."""
from __future__ import annotations


def md_table(headers: list[str], rows: list[list], right: set[int] = frozenset()) -> str:
    esc = lambda c: "" if c is None else str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"
    return "\n".join(["| " + " | ".join(headers) + " |", rule] + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def human(n: int) -> str:
    for unit, factor in (("G", 2 ** 30), ("M", 2 ** 20), ("K", 2 ** 10)):
        if n >= factor:
            return f"{n / factor:g} {unit}iB"
    return f"{n} B"

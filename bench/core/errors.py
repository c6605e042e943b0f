"""Bad input: one ``bench: error:`` line naming the bad value and the valid choices, and exit code 2 (bench/cli.py
prints it). Every layer raises this one type; warnings go to stderr as one ``warning:`` line each."""
from __future__ import annotations

import sys


class UsageError(ValueError):
    """Bad user input: the message is one line naming the bad value and the valid choices."""


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)

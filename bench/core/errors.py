"""Bad input: one ``bench: error:`` line naming the bad value and the valid choices, and exit code 2 (bench/cli.py
prints it). Every layer raises this one type; warnings go to stderr as one ``warning:`` line each.

The exit codes every command keeps (docs/command-line.md, "Exit codes", is the contract and tests/test_exit_codes.py
checks it row by row)."""
from __future__ import annotations

import errno
import sys


# 0 measured (or did what was asked); 1 a run failed (or the gate did); 2 bad input or nothing to run; 3 inconclusive
# (nothing failed, but disturbed runs decided nothing); 130 interrupted (Ctrl-C, SIGTERM), as a shell reports SIGINT.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(ValueError):
    """Bad user input: the message is one line naming the bad value and the valid choices."""


class Refused(Exception):
    """Not bad input, but a refusal with the exit code that says why (``code``): ``bench baseline save`` refuses a
    failed run (1) or disturbed runs (3) as a reference. The message is one line, printed like a UsageError's."""

    def __init__(self, msg: str, code: int):
        super().__init__(msg)
        self.code = code


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


# A write that failed for want of room: no space, over quota, over the file size limit (RLIMIT_FSIZE). bench/cli.py
# ends any command that hits one with one line naming the file (exit 1); result files are written whole or not at all.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

"""Bad input: one ``bench: error:`` line naming the bad value and the valid choices, and exit code 2 (bench/cli.py
prints it). Every layer raises this one type; warnings go to stderr as one ``warning:`` line each."""
from __future__ import annotations

import errno
import sys


class UsageError(ValueError):
    """Bad user input: the message is one line naming the bad value and the valid choices."""


def warn(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


# A write that failed for want of room: no space, over quota, over the file size limit (RLIMIT_FSIZE). bench/cli.py
# ends any command that hits one with one line naming the file (exit 1); result files are written whole or not at all.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

"""Command line of the parallel-backend benchmark suite: python -m bench COMMAND (run, list, report, compare, ...).

Bad input ends with one line on stderr naming the bad value and the valid choices, and exit code 2; every exit code
is in docs/command-line.md ("Exit codes"). Each command lives in its own module under bench/commands/ and registers
its own subparser.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import sys

from bench.commands import COMMANDS
from bench.core.errors import DISK_FULL, EXIT_FAILED, EXIT_INTERRUPTED, Refused, UsageError


def fail(msg: str, code: int = 2):
    print(f"bench: error: {msg}", file=sys.stderr)
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    """argparse, but its own errors (a bad choice, a non-integer) are one line too, like every other error, and a
    flag is never guessed from a prefix (``--gpus`` is not ``--gpus-per-node``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        fail(f"{message} (see {self.prog} --help)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; given a command's name, that command's alone, so that a light command (``nodelist``,
    ``report``, ``compare``) does not import what the others need (torch: 2 s of CPU a call on 2 cores)."""
    p = _Parser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in (command,) if command in COMMANDS else COMMANDS:
        importlib.import_module(f"bench.commands.{name}").register(sub)  # adds its parser and a func(args) -> code
    return p


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A command named first needs its own module only; anything else (--help, no command, an unknown one) gets every
    # command's parser, so the help and the list of valid choices stay whole.
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UsageError as e:
        fail(str(e))
    except Refused as e:
        fail(str(e), code=e.code)
    except KeyboardInterrupt:  # Ctrl-C (bench run turns SIGTERM into one too): one line, never a traceback
        print(f"\ninterrupted: python -m bench {args.command} stopped; what it had finished is kept", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        # every result file is written whole or not at all (bench/core/results.write_json_atomic), so stop here
        fail(f"cannot write {e.filename or 'a result file'}: {e.strerror} ({errno.errorcode[e.errno]}); no partial "
             "file was left; free space (or write elsewhere: --results, --out) and run again (bench run --resume "
             "skips the runs already recorded)", code=EXIT_FAILED)
    sys.exit(code)


if __name__ == "__main__":
    main()

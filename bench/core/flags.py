"""One naming rule for flags, in every command: a flag in seconds ends in ``-s`` (``--timeout-s``, ``--budget-s``,
``--wait-quiet-s``, ``--rdzv-timeout-s``), one that measures something again is ``--refresh-<what>``
(``--refresh-peak``). A flag renamed to follow the rule keeps its old name as an alias that still works and says, in
one ``warning:`` line, what it is called now (``add_renamed``). No torch, no argparse subclass of the project's own:
any parser takes it.

    from bench.core.flags import add_renamed
    add_renamed(parser, "--timeout-s", "--timeout", dest="timeout", type=float, metavar="SECONDS", help="...")
"""
from __future__ import annotations

import argparse

from bench.core.errors import warn

SECONDS_RULE = "flags in seconds end in -s"
REFRESH_RULE = "a flag that measures again is --refresh-<what>"


def renamed_action(base: type[argparse.Action], rule: str) -> type[argparse.Action]:
    """``base`` (argparse's store, store_true, ...) that warns when the flag is given by one of its old names: every
    option string but the first (the new name)."""

    class Renamed(base):  # type: ignore[valid-type,misc]  # argparse's action class, chosen at run time
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string is not None and option_string != self.option_strings[0]:
                warn(f"{option_string} is now {self.option_strings[0]} ({rule}); the old name still works")
            super().__call__(parser, namespace, values, option_string)

    Renamed.__name__ = f"Renamed{base.__name__}"
    return Renamed


def add_renamed(parser, new: str, *old: str, rule: str | None = None, **kwargs) -> argparse.Action:
    """``parser.add_argument(new, *old, **kwargs)``, the old names kept as aliases that warn. ``rule`` (default: the
    seconds rule for a name ending in ``-s``, else the refresh rule) is the reason the warning gives; give ``dest``
    to keep the attribute the code reads. The help says which old names still work."""
    if not old:
        raise ValueError(f"{new}: no old name to keep")
    rule = rule or (SECONDS_RULE if new.endswith("-s") else REFRESH_RULE)
    base = parser._registry_get("action", kwargs.get("action"), kwargs.get("action"))
    kwargs["action"] = renamed_action(base, rule)
    if kwargs.get("help") and kwargs["help"] is not argparse.SUPPRESS:
        kwargs["help"] = f"{kwargs['help']} ({', '.join(old)}: the old name{'s' if len(old) > 1 else ''}, still accepted)"
    return parser.add_argument(new, *old, **kwargs)

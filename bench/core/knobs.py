"""A backend's knob: one setting a user may change (``--ddp-bucket-mb 5``), declared once, in the backend's own file
(``backends/ddp.py``), with its flag, type, bounds and help. The planner builds ``bench run``'s flags, the bounds
checks and the ``options`` a run records from these declarations and names no backend (docs/adding-a-backend.md).

A knob given on the command line is recorded in ``options`` (and so in the configuration key) of every run, whichever
backend: a backend that does not declare it cannot honour it, and its run is skipped with the reason, never silently
run without it. A knob with ``own=True`` is recorded only in the runs of the backends that declare it, and always,
its default included (Horovod's compression: none or fp16).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from bench.core.errors import UsageError


@dataclass(frozen=True)
class Knob:
    key: str  # the name in cfg.options and in records ("ddp_bucket_mb")
    help: str
    type: type = bool  # bool: a switch (--flag); int, float or str: a value
    choices: tuple = ()
    low: float | None = None  # a value must be greater than this
    default: object = None  # what ``own`` knobs record when not given (and what argparse holds)
    off: tuple = (None, False, "none")  # values that mean "not set": nothing recorded
    own: bool = False
    flag_name: str | None = None  # the flag, when it is not the key's (--hvd-compression records "compression")
    negatable: bool = False  # a switch with a --no- form too, None when neither is given (a default that depends on
    # the device: --channels-last on GPUs' vision workloads, bench/plan/sweep.py run_defaults)
    extra: dict = field(default_factory=dict, compare=False)  # argparse's metavar and the like

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.key).replace("_", "-")

    @property
    def dest(self) -> str:
        return (self.flag_name or self.key).replace("-", "_")

    def add_to(self, parser) -> None:
        if self.type is bool and self.negatable:
            parser.add_argument(self.flag, action=argparse.BooleanOptionalAction, default=None, help=self.help)
        elif self.type is bool:
            parser.add_argument(self.flag, action="store_true", help=self.help)
        else:
            parser.add_argument(self.flag, type=self.type, help=self.help, default=self.default,
                                **({"choices": self.choices} if self.choices else {}), **self.extra)

    def check(self, value) -> None:
        """One line (exit 2) when ``value`` is out of bounds."""
        if value is None or self.low is None or value > self.low:
            return
        if self.type is int:
            raise UsageError(f"{self.flag} must be a positive integer, got {value}")
        bound = "a non-negative number" if self.low < 0 else "a positive number"
        raise UsageError(f"{self.flag} must be {bound}, got {value:g}")

    def recorded(self, value, declared: bool) -> tuple[bool, object]:
        """Whether a run records this knob, and the value: a given value in every run (``own``: only where
        ``declared``, and its default when not given)."""
        if self.own:
            return declared, self.default if value is None else value
        return value not in self.off, value


def flag_of(key: str, knobs) -> str:
    """The flag of the option ``key``, from the knobs that declare it (``--`` + key otherwise)."""
    for knob in knobs:
        if knob.key == key:
            return knob.flag
    return "--" + key.replace("_", "-")


def add_group(parser, knobs, title: str) -> None:
    group = parser.add_argument_group(title)
    for knob in knobs:
        knob.add_to(group)


def options(knobs, declared: set[str], args: argparse.Namespace) -> dict:
    """The ``options`` a run of a backend that declares the knob keys ``declared`` records, from ``args``."""
    out = {}
    for knob in knobs:
        keep, value = knob.recorded(getattr(args, knob.dest, None), knob.key in declared)
        if keep:
            out[knob.key] = value
    return out

"""``python -m bench nodelist``: Slurm's compressed node list (SLURM_JOB_NODELIST), one host per line, as
``scontrol show hostnames`` prints it (scripts/slurm/bench.sbatch takes the rendezvous host from it)."""
from __future__ import annotations

import re

from bench.core.errors import UsageError


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list, as ``scontrol show hostnames`` expands it: ``gpu[01-03,07],login1`` ->
    gpu01, gpu02, gpu03, gpu07, login1 (zero padding kept)."""
    hosts, depth, part = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            if part:
                hosts.extend(_expand_one(part))
            part = ""
            continue
        depth += (ch == "[") - (ch == "]")
        part += ch
    return hosts


def _expand_one(part: str) -> list[str]:
    m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
    if not m:
        return [part]
    prefix, ranges, rest = m.groups()
    out = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{i:0{width}d}{tail}" for tail in _expand_one(rest))
    return out


def register(sub) -> None:
    n = sub.add_parser("nodelist", help="expand a Slurm node list (SLURM_JOB_NODELIST) into one host per line")
    n.add_argument("nodelist")
    n.add_argument("--first", action="store_true", help="print the first host only (the rendezvous host)")
    n.set_defaults(func=cmd_nodelist)


def cmd_nodelist(args) -> int:
    try:
        hosts = expand_nodelist(args.nodelist)
    except ValueError:
        raise UsageError(f"node list {args.nodelist!r}: expected Slurm's form, e.g. gpu[01-04],login1") from None
    if not hosts:
        raise UsageError(f"node list {args.nodelist!r} names no host")
    print("\n".join(hosts[:1] if args.first else hosts))
    return 0

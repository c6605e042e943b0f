"""``python -m bench list``: every registered backend, its launcher, and whether it can run here (and if not, why
and how to fix it)."""
from __future__ import annotations

import backends
from bench.plan.sweep import backend_options, parse_run
from bench.core.config import DEFAULTS, RunConfig
from bench.core.devices import detect_device


def register(sub) -> None:
    ls = sub.add_parser("list", help="every registered backend, its launcher, and whether it can run here")
    ls.add_argument("--device", default="auto")
    ls.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    device_type, present = detect_device(args.device)
    d = DEFAULTS[device_type]
    table = Table(title=f"backends ({device_type}, {present} {'GPU(s)' if device_type == 'cuda' else 'cores'})")
    for col in ("backend", "launcher", "runs here", "why not / how to fix"):
        table.add_column(col)
    for name in backends.names():
        backend = backends.create(name)
        sizes = [1] if getattr(backend, "max_world_size", None) == 1 or present < 2 else [1, 2]
        why = {}
        for n in sizes:
            cfg = RunConfig(backend=name, launcher=backend.launcher, world_size=n, device_type=device_type,
                            model=d["model"], image_size=d["image_size"], batch_size=d["batch_size"],
                            warmup=d["warmup"], steps=d["steps"], windows=d["windows"],
                            precision=backend.default_precision,
                            options=backend_options(name, parse_run([])))
            why[n] = backend.unavailable(cfg)
        if why[1]:
            runs, detail = "no", why[1]
        elif why.get(2):
            runs, detail = "1 device only", why[2]
        else:
            runs, detail = "yes", backend.note(cfg) or ""
        table.add_row(name, backend.launcher, runs, escape(detail))
    Console(width=160).print(table)
    return 0

"""What ``bench verify`` plans, shared by the command and the GPU check's launch plan (bench/plan/gpu_check.py),
which asks it before it starts a verify launch: the arguments, one entry per backend and world size with the reason it
would be skipped here, and what makes the command refuse (every entry skipped: nothing to verify)."""
from __future__ import annotations

import argparse
import dataclasses

from bench.core.errors import UsageError
from bench.core.flags import add_renamed

DEFAULTS = {"cpu": {"model": "resnet18", "image_size": 32, "batch_size": 4, "steps": 20, "eval_samples": 250},
            "cuda": {"model": "resnet18", "image_size": 64, "batch_size": 16, "steps": 20, "eval_samples": 500}}


def add_verify_arguments(v) -> None:
    """bench verify's arguments (its parser, and the one the GPU check's plan reads a verify launch with)."""
    v.add_argument("--backends", default="all", help="comma-separated, or 'all'")
    v.add_argument("--gpus", help="comma-separated world sizes (on CPU: worker processes)")
    v.add_argument("--max-gpus", help="sweep powers of two up to N, and N itself (default: every GPU; on CPU 2 "
                                      "workers)")
    v.add_argument("--device", default="auto", help="auto | cuda | cpu")
    v.add_argument("--model", help="torchvision classification model (default resnet18), gpt-<size> or "
                                   "package.module:factory (docs/workloads.md)")
    v.add_argument("--batch-size", type=int, help="per-device batch (default 4 on CPU, 16 on GPU)")
    v.add_argument("--image-size", type=int, help="square input in px (default 32 on CPU, 64 on GPU)")
    v.add_argument("--seq-len", type=int, help="gpt-<size>: tokens per sequence (default 64 on CPU, 1024 on GPU)")
    v.add_argument("--optimizer", help="sgd | adamw (default: sgd for torchvision models, adamw for the others)")
    v.add_argument("--steps", type=int, help="training steps compared (default 20)")
    v.add_argument("--precision", help="fp32 | fp16 | bf16 (default: each backend's own)")
    v.add_argument("--eval-samples", type=int, help="synthetic evaluation set size (default 250 on CPU, 500 on GPU)")
    add_renamed(v, "--timeout-s", "--timeout", dest="timeout", type=float, metavar="SECONDS",
                help="seconds per run before it is killed")
    v.add_argument("--results", default="results/raw", help="records go to RESULTS/verify (default results/raw)")
    v.add_argument("--keep-params", action="store_true", help="keep each run's parameters (.npz) after comparing")


def parse_verify(argv: list[str], known: bool = False) -> argparse.Namespace:
    """``bench verify``'s arguments parsed from ``argv`` (``known``: flags it does not know are left out)."""
    p = argparse.ArgumentParser(prog="python -m bench verify", allow_abbrev=False)
    add_verify_arguments(p)
    return p.parse_known_args(argv)[0] if known else p.parse_args(argv)


@dataclasses.dataclass
class Entry:
    backend: str
    world_size: int
    precision: str
    reference: tuple | None = None  # (world size, batchnorm "local"/"global", precision)
    record: dict | None = None
    skipped: str | None = None


def plan(args):
    import backends
    from bench.plan.sweep import check_model, check_precision, parse_backends, world_sizes
    from bench.core.devices import detect_device

    device_type, present = detect_device(args.device)
    if not args.gpus and not args.max_gpus and device_type == "cpu":
        args.max_gpus = str(min(2, present))
    sizes = world_sizes(args.gpus, args.max_gpus, device_type, present)
    names = parse_backends(args.backends)
    d = DEFAULTS[device_type]
    model = args.model or d["model"]
    check_model(model)
    check_precision(args.precision)
    for name in ("batch_size", "image_size", "steps", "eval_samples"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout-s must be a positive number of seconds, got {args.timeout}")
    base = {"device_type": device_type, "model": model, "image_size": args.image_size or d["image_size"],
            "batch_size": args.batch_size or d["batch_size"], "steps": args.steps or d["steps"],
            "eval_samples": args.eval_samples or d["eval_samples"], "timeout": args.timeout,
            "seq_len": args.seq_len, "optimizer": args.optimizer}
    config(base, names[0], "inproc", 1, "fp32")  # --seq-len, --optimizer: one line when they do not fit the model
    entries = []
    for name in names:
        backend = backends.create(name)
        for n in sizes:
            if n > (getattr(backend, "max_world_size", None) or n):
                continue
            entry = Entry(name, n, args.precision or backend.default_precision)
            entry.skipped = (backend.unavailable(config(base, name, backend.launcher, n, entry.precision))
                             or backend.no_verify_reference(entry.precision))
            if not entry.skipped:
                entry.reference = (n, "global" if backend.batchnorm == "global" else "local", entry.precision)
            entries.append(entry)
    return base, entries


def config(base, backend, launcher, world_size, precision, batch_size=None, options=None):
    from bench.core.config import RunConfig

    return RunConfig(backend=backend, launcher=launcher, world_size=world_size, device_type=base["device_type"],
                     model=base["model"], image_size=base["image_size"], batch_size=batch_size or base["batch_size"],
                     warmup=2, steps=base["steps"], windows=1, precision=precision, timeout=base["timeout"],
                     eval=True, eval_samples=base["eval_samples"], options=options or {}, seq_len=base["seq_len"],
                     optimizer=base["optimizer"]).validate()


def skipped_here(entries: list[Entry]) -> dict[str, list[str]] | None:
    """Why every entry would be skipped here, each reason once with the runs it stops ("horovod x1"); None when one
    of them can run (or there are none)."""
    if not entries or not all(e.skipped for e in entries):
        return None
    why: dict[str, list[str]] = {}
    for e in entries:
        why.setdefault(e.skipped, []).append(f"{e.backend} x{e.world_size}")
    return why

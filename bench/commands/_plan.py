"""Planning shared by the commands that run things (run, verify, collectives, doctor): bench run's flags, world
sizes, backends, knobs, and the configurations of a sweep, validated before anything is launched. A helper of the
commands, never a command itself: commands import it, it imports no command."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import backends
from bench.commands import _nodes
from bench.core.config import DEFAULTS, ON_OFF, PRECISIONS, RunConfig
from bench.core.devices import detect_device
from bench.core.errors import UsageError

CPU_DEFAULT_MAX_WORKERS = 4


def add_run_arguments(r) -> None:
    """Every flag of ``bench run`` (README: Command line)."""
    r.add_argument("--backends", default="all", help=f"comma-separated, or 'all' ({', '.join(backends.names())})")
    r.add_argument("--gpus", help="comma-separated world sizes, e.g. 1,2,4 (on CPU: worker processes)")
    r.add_argument("--max-gpus", help="sweep powers of two up to N, and N itself; 'all' = every device (default)")
    r.add_argument("--device", default="auto", help="auto | cuda | cpu (default auto: cuda when present)")
    r.add_argument("--model", help="torchvision classification model (default resnet50 on GPU, resnet18 on CPU), "
                                   "gpt-<size> (README: Workloads) or your own: package.module:factory")
    r.add_argument("--seq-len", type=int, help="gpt-<size>: tokens per sequence (default 1024 on GPU, 64 on CPU)")
    r.add_argument("--optimizer", help="sgd | adamw (default: sgd for torchvision models, adamw for the others)")
    r.add_argument("--batch-size", type=int, help="per-device batch (default 64 on GPU, 8 on CPU)")
    r.add_argument("--image-size", type=int, help="square input size in px (default 224 on GPU, 64 on CPU)")
    r.add_argument("--warmup", type=int, help="untimed steps before the first window")
    r.add_argument("--steps", type=int, help="steps per timed window")
    r.add_argument("--windows", type=int, help="timed windows (raw times are kept in the record)")
    r.add_argument("--precision", help="fp32 | fp16 | bf16 (default: the backend's own, fp32 for most)")
    r.add_argument("--timeout", type=float, help="seconds per run before it is killed (default scales with steps)")
    r.add_argument("--peak-tflops", type=float,
                   help="the GPU's dense peak TFLOP/s at the run's precision, for MFU (default: bench/rank/flops.py's "
                        "table)")
    r.add_argument("--repeat", type=int, help="runs of every configuration, each its own process tree, in "
                                              "interleaved order (default 1); the run is the statistical unit")
    r.add_argument("--cudnn-benchmark", choices=tuple(ON_OFF),
                   help="torch.backends.cudnn.benchmark on CUDA (default on; make bench also runs dp with it off)")
    r.add_argument("--hvd-compression", default="none", choices=("none", "fp16"),
                   help="horovod gradient compression (default none: like-for-like with fp32 DDP)")
    k = r.add_argument_group("knobs (recorded in options; a backend that cannot honour one is skipped with the reason)")
    k.add_argument("--ddp-bucket-mb", type=float, help="DDP bucket_cap_mb (default 25)")
    k.add_argument("--ddp-static-graph", action="store_true", help="DDP static_graph=True")
    k.add_argument("--ddp-grad-as-bucket-view", action="store_true", help="DDP gradient_as_bucket_view=True")
    k.add_argument("--ddp-find-unused", action="store_true",
                   help="DDP find_unused_parameters=True (what the source articles pass; costs a graph walk per step)")
    k.add_argument("--ddp-comm-hook", choices=("none", "fp16", "bf16", "powersgd"),
                   help="DDP communication hook: fp16/bf16 compression, or PowerSGD (rank 2, after 2 plain steps)")
    k.add_argument("--hvd-fusion-mb", type=float, help="Horovod tensor fusion threshold, MiB (HOROVOD_FUSION_THRESHOLD)")
    k.add_argument("--hvd-cycle-ms", type=float, help="Horovod cycle time, ms (HOROVOD_CYCLE_TIME)")
    k.add_argument("--ds-bucket-mb", type=float,
                   help="DeepSpeed reduce and all-gather buckets, MiB of fp32 elements (default 25, DDP's; DeepSpeed's "
                        "own 5e8 elements would allocate 1907 MiB per bucket on every rank)")
    k.add_argument("--ranks-per-gpu", type=int,
                   help="CUDA: start N ranks on each GPU, over gloo instead of NCCL (which refuses two ranks on one "
                        "device); the DDP family only. Checks multi-rank logic on fewer GPUs: not a measurement")
    k.add_argument("--channels-last", action="store_true",
                   help="NHWC model and inputs (torch.channels_last); fsdp2, ds_zero* and ddp_zero keep NCHW parameters "
                        "(recorded in backend_info.channels_last)")
    k.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's activations in backward instead of keeping them (less memory, about "
                        "one more forward of compute); every backend but dp")
    k.add_argument("--compile", action="store_true",
                   help="torch.compile the (wrapped) model; compiles in warm-up, its time recorded as compile_seconds")
    r.add_argument("--data", default="synthetic", help="synthetic (a fixed batch on the device) | imagenet")
    r.add_argument("--data-dir", help="ImageNet folder: DIR/train/<class>/*.JPEG (with --data imagenet)")
    r.add_argument("--loader", help="real data: torchvision (DataLoader workers, default) | dali (NVIDIA DALI)")
    r.add_argument("--decode", help="real data: cpu (default) | gpu (nvJPEG: torchvision.io.decode_jpeg on the GPU, "
                                    "or DALI's mixed decoder); GPU runs only")
    r.add_argument("--workers", type=int, help="DataLoader processes per device, for every backend (dp's one process "
                                               "gets N times as many, capped by the cores; default: cores / N - 1)")
    r.add_argument("--eval", action="store_true",
                   help="after the timed windows, evaluate the distributed way (DistributedSampler shards, all-reduced "
                        "sums): eval_loss, eval_accuracy, eval_throughput")
    r.add_argument("--eval-samples", type=int, help="size of the synthetic evaluation set (default 300; real data: val/)")
    r.add_argument("--find-max-batch", action="store_true",
                   help="instead of timing, find each backend's largest per-device batch that fits (bounded search "
                        "of short isolated runs; records in RESULTS/maxbatch)")
    r.add_argument("--find-max-model", action="store_true",
                   help="instead of timing, find each backend's largest model of the GPT ladder that trains at the "
                        "per-device batch (short isolated runs; records in RESULTS/maxmodel)")
    r.add_argument("--ladder", help="--find-max-model: the GPT sizes to walk, smallest first (default gpt-125m to "
                                    "gpt-6.7b on GPU, gpt-micro to gpt-medium on CPU)")
    r.add_argument("--max-batch", type=int, help="--find-max-batch: the search's cap (default 4096 on GPU, 256 on CPU)")
    r.add_argument("--memory-limit-gib", type=float,
                   help="CPU only: give each rank a heap budget of this many GiB (the CPU stand-in for GPU memory)")
    r.add_argument("--resume", action="store_true",
                   help="skip configurations that already have an ok record in the results directory")
    r.add_argument("--results", default="results/raw", help="directory for the records (default results/raw)")
    _nodes.add_arguments(r)


def parse_run(argv: list[str]) -> argparse.Namespace:
    """``bench run``'s arguments parsed from ``argv``, for commands that plan as bench run does (doctor, verify)."""
    p = argparse.ArgumentParser(prog="python -m bench run", allow_abbrev=False)
    add_run_arguments(p)
    return p.parse_args(argv)


def world_sizes(gpus: str | None, max_gpus: str | None, device_type: str, present: int, per_gpu: int = 1) -> list[int]:
    """The world sizes to run; ``present`` counts the ranks this machine can hold (devices x ``per_gpu``)."""
    unit = "CUDA device(s)" if device_type == "cuda" else "CPU cores (one worker per core)"
    if per_gpu > 1:
        unit = f"rank slots ({present // per_gpu} CUDA device(s) x --ranks-per-gpu {per_gpu})"
    if gpus and max_gpus:
        raise UsageError("give --gpus (a list of world sizes) or --max-gpus (a sweep), not both")
    if gpus:
        try:
            sizes = sorted({int(x) for x in gpus.split(",") if x.strip()})
        except ValueError:
            raise UsageError(f"--gpus {gpus!r}: expected comma-separated positive integers such as 1,2,4") from None
    else:
        if max_gpus in (None, "", "all"):
            top = present if device_type == "cuda" else min(present, CPU_DEFAULT_MAX_WORKERS)
        else:
            try:
                top = int(max_gpus)
            except ValueError:
                raise UsageError(f"--max-gpus {max_gpus!r}: expected a positive integer or 'all'") from None
        sizes = sorted({2 ** i for i in range(top.bit_length()) if 2 ** i <= top} | ({top} if top > 0 else set()))
    if not sizes or min(sizes) <= 0:
        raise UsageError(f"world sizes must be positive integers, got {gpus or max_gpus!r}")
    if max(sizes) > present:
        raise UsageError(f"--gpus {max(sizes)}: this machine has {present} {unit}")
    return sizes


def parse_backends(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()] if text != "all" else backends.names()
    unknown = [n for n in names if n not in backends.REGISTRY]
    if unknown or not names:
        raise UsageError(f"unknown backend {', '.join(unknown) or repr(text)}; choose from {', '.join(backends.names())}")
    return names


def check_model(name: str) -> None:
    import torchvision

    from bench.core import workloads

    if workloads.kind(name) != "vision":  # gpt-<size> (kind() checked the size) or package.module:factory
        module, _, factory = name.partition(":")
        if ":" in name and not (module and factory):
            raise UsageError(f"--model {name!r}: your own model is package.module:factory")
        return
    valid = torchvision.models.list_models(module=torchvision.models)
    if name not in valid:
        raise UsageError(f"unknown model {name!r}; choose a torchvision classification model ({', '.join(valid)}), "
                         f"a GPT size ({', '.join(workloads.GPT_SIZES)}) or your own (package.module:factory)")


def check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        raise UsageError(f"results directory {str(directory)!r} is not writable: {e.strerror or e}") from None


def plan(args) -> tuple[list[RunConfig], list[str]]:
    """Every configuration to run once, in sweep order (``interleave`` adds the repetitions)."""
    from bench.rank import data, loaders

    check_knobs(args)
    device_type, present = detect_device(args.device)
    per_gpu = getattr(args, "ranks_per_gpu", None) or 1
    if per_gpu > 1 and device_type != "cuda":
        raise UsageError(f"--ranks-per-gpu {per_gpu} shares CUDA devices between ranks; this run is on the CPU, where "
                         "--gpus already counts worker processes")
    present *= per_gpu  # ranks, not devices, are what a world size counts
    nodes, nnodes = _nodes.parse_nodes(args), 1
    if getattr(args, "external", False):
        if nodes is not None:
            raise UsageError("--external takes the world from the engine's environment; drop --nnodes")
        world, nnodes = _nodes.external_world(args)
        sizes = [world]
    elif nodes is not None:
        if args.max_gpus or (args.gpus and "," in args.gpus):
            raise UsageError("with --nnodes, --gpus is the number of processes per node (one value)")
        per_node = world_sizes(args.gpus or str(present if device_type == "cuda" else 1), None, device_type, present,
                               per_gpu)
        nnodes, sizes = nodes.nnodes, [nodes.nnodes * per_node[0]]
    else:
        sizes = world_sizes(args.gpus, args.max_gpus, device_type, present, per_gpu)
    names = parse_backends(args.backends)
    d = DEFAULTS[device_type]
    model = args.model or d["model"]
    check_model(model)
    if args.precision is not None and args.precision not in PRECISIONS:
        raise UsageError(f"unknown precision {args.precision!r}; choose from {', '.join(PRECISIONS)}")
    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat must be a positive integer, got {args.repeat}")
    cudnn = None if args.cudnn_benchmark is None else ON_OFF[args.cudnn_benchmark]
    configs, notes = [], []

    def add(name, n, precision, cudnn_benchmark, note=None):
        backend = backends.create(name)
        cfg = RunConfig(
            backend=name, launcher=backend.launcher, world_size=n, device_type=device_type, model=model,
            data=args.data, data_dir=args.data_dir, workers=args.workers, loader=args.loader, decode=args.decode,
            image_size=_pick(args.image_size, d["image_size"]), batch_size=_pick(args.batch_size, d["batch_size"]),
            warmup=_pick(args.warmup, d["warmup"]), steps=_pick(args.steps, d["steps"]),
            windows=_pick(args.windows, d["windows"]), precision=precision, timeout=args.timeout,
            options=backend_options(name, args), cudnn_benchmark=cudnn_benchmark, eval=args.eval, nnodes=nnodes,
            eval_samples=_pick(args.eval_samples, RunConfig.eval_samples), seq_len=args.seq_len,
            optimizer=args.optimizer,
        ).validate()
        if cfg.data == "imagenet":  # bad loader or decode names: the loader registry says so, in one line
            loaders.check(cfg.loader, cfg.decode, cfg.device_type)
        least, why = backend.min_warmup(cfg)
        if cfg.warmup < least:
            raise UsageError(f"warmup {cfg.warmup} is too short for {name}: use at least {least} ({why})")
        cfg.note = "; ".join(filter(None, [backend.note(cfg), note])) or None
        cfg.flops_per_sample, cfg.peak_tflops = workload_flops(model, cfg.image_size, cfg.seq_len), args.peak_tflops
        if cfg.data == "imagenet" and cfg.workers is None:
            cfg.workers = data.default_workers(n)  # per device, for every backend
        configs.append(cfg)

    # On CPU a sweep (no --gpus) runs the multi-process backends at its largest world size only: CPU figures say
    # nothing about scaling, and it keeps `make bench` on a laptop within minutes. --gpus 1,2 runs every size.
    cpu_top = max(sizes) if device_type == "cpu" and not args.gpus and nnodes == 1 and len(sizes) > 1 else None
    if cpu_top:
        notes.append(f"CPU sweep: backends other than single run at {cpu_top} workers only (--gpus 1,{cpu_top} runs "
                     "every size)")
    for name in names:
        backend = backends.create(name)
        limit = getattr(backend, "max_world_size", None)
        for n in sizes:
            if cpu_top and n != cpu_top and name != "single":
                continue
            if limit and n > limit:
                if nnodes == 1:
                    notes.append(f"{name} runs on {limit} device only (the scaling baseline); not planned at world "
                                 f"size {n}")
                continue
            if nnodes > 1 and name == "horovod":
                if nodes.node_rank != 0:
                    notes.append("horovod runs start on node 0 only (horovodrun -H reaches the other hosts)")
                    continue
                why = _nodes.check_hosts(nodes.hosts, n)
                if why:
                    raise UsageError(why)
            add(name, n, args.precision or backend.default_precision, cudnn)
            if name == "dp" and device_type == "cuda" and n >= 2 and cudnn is None:
                add(name, n, args.precision or backend.default_precision, False, DP_CUDNN_OFF_NOTE)
    # Every efficiency cell needs single@1 at the same precision: plan it at every precision that a run which
    # can happen here uses (on CPU, ddp_amp_syncbn's fp16 is skipped, so no fp16 single is planned for it).
    if "single" in names and 1 in sizes and args.precision is None:
        have = {c.precision for c in configs if c.backend == "single"}
        used = [c.precision for c in configs
                if (loader_unavailable(c) or backends.create(c.backend).unavailable(c)) is None]
        for precision in dict.fromkeys(used):
            if precision not in have:
                add("single", 1, precision, cudnn, f"the {precision} scaling baseline")
                have.add(precision)
    if args.data == "imagenet":
        data.check_imagenet(args.data_dir, max(c.global_batch for c in configs) if configs else 1)
        if args.eval:
            data.check_eval(args.data_dir)
        empty = data.empty_classes(args.data_dir)
        if empty:  # once here, not once per run; the records count them (empty_classes)
            from bench.rank.folders import empty_warning

            print(empty_warning(Path(args.data_dir) / "train", empty), file=sys.stderr)
    elif args.data_dir:
        raise UsageError("--data-dir is for --data imagenet; synthetic data needs no directory")
    return configs, notes


def loader_unavailable(cfg: RunConfig) -> str | None:
    """Why the loader of a real-data run cannot run here (and the fix), asked of the loader registry; None for
    synthetic data or a loader that can run. Checked before the backend's own reasons (Backend.unavailable)."""
    if cfg.data != "imagenet":
        return None
    from bench.rank import loaders

    return loaders.unavailable(cfg.loader or "torchvision")


def workload_flops(model: str, image_size: int | None, seq_len: int | None = None) -> float | None:
    """Training FLOPs per sample (bench.rank.flops), or None (with a warning when a model cannot be counted)."""
    from bench.core import workloads
    from bench.rank import flops

    if workloads.kind(model) == "custom":
        return None  # built in the ranks only: not counted, no MFU (README: Workloads)
    try:
        return flops.flops_per_sample(model, image_size, seq_len)
    except Exception as e:  # noqa: BLE001 - a model the meta device cannot trace: no FLOPs, no MFU, still a run
        print(f"warning: cannot count FLOPs of {model} at {workloads.shape({'image_size': image_size, 'seq_len': seq_len})}"
              f" ({type(e).__name__}: {e}); no MFU", file=sys.stderr)
        return None


DP_CUDNN_OFF_NOTE = ("labelled variant with cudnn.benchmark off: cuDNN's benchmark cache is per thread and "
                     "DataParallel runs its replicas in new threads every step")


def interleave(configs: list[RunConfig], repeats: int) -> list[RunConfig]:
    """Every configuration once, then again, ``repeats`` times: slow drift (clocks, heat, neighbours) then hits
    all configurations alike instead of whichever ran last."""
    import dataclasses

    return [dataclasses.replace(c, repeat_index=r, repeats=repeats) for r in range(1, repeats + 1) for c in configs]


KNOBS = ("ddp_bucket_mb", "ddp_static_graph", "ddp_grad_as_bucket_view", "ddp_find_unused", "ddp_comm_hook",
         "hvd_fusion_mb", "hvd_cycle_ms", "ds_bucket_mb", "channels_last", "compile", "activation_checkpointing",
         "ranks_per_gpu")


def backend_options(name: str, args) -> dict:
    """The knobs a run records in ``options`` (and so in its configuration key): every knob given on the command
    line, whichever backend; a backend that cannot honour one is skipped with the reason, never silently run
    without it. Horovod's compression is always recorded (none or fp16)."""
    options = {"compression": args.hvd_compression} if name == "horovod" else {}
    for knob in KNOBS:
        value = getattr(args, knob, None)
        if value not in (None, False, "none") and not (knob == "ranks_per_gpu" and value == 1):
            options[knob] = value
    return options


def check_knobs(args) -> None:
    for knob, low in (("ddp_bucket_mb", 0), ("hvd_fusion_mb", -1), ("hvd_cycle_ms", 0), ("ds_bucket_mb", 0)):
        value = getattr(args, knob, None)
        if value is not None and not value > low:
            bound = "a non-negative number" if low < 0 else "a positive number"
            raise UsageError(f"--{knob.replace('_', '-')} must be {bound}, got {value:g}")
    if getattr(args, "ranks_per_gpu", None) is not None and args.ranks_per_gpu < 1:
        raise UsageError(f"--ranks-per-gpu must be a positive integer, got {args.ranks_per_gpu}")


def _pick(value, default):
    return default if value is None else value


def horovod_info(configs) -> dict | None:
    if not any(c.backend == "horovod" for c in configs):
        return None
    from backends import horovod

    return horovod.build_info()

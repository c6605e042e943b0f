"""Planning shared by the commands that run things (run, verify, collectives, doctor): bench run's flags, world
sizes, backends, knobs, and the configurations of a sweep, validated before anything is launched. A helper of the
commands, never a command itself: commands import it, it imports no command."""
from __future__ import annotations

import argparse
import sys
from typing import Any
import tempfile
from pathlib import Path

import backends
from bench.plan import nodes as _nodes
from bench.core import knobs, workloads
from bench.core.config import DEFAULTS, ON_OFF, PRECISIONS, RunConfig, default_batch
from bench.core.devices import detect_device, usable_cpus
from bench.core.errors import UsageError
from bench.core.flags import add_renamed

CPU_DEFAULT_MAX_WORKERS = 4
# bench run's defaults on GPUs, where the flags do not say (docs/measuring.md, "The default sweep"): a sweep that can
# name a winner, within 30 minutes on an 8-GPU node by bench/plan/estimate.py. Every one given on the command line
# wins; what it leaves out, and the flag that brings each part back, is in the README.
GPU_SWEEP: dict[str, Any] = {"model": "resnet50,gpt-350m", "workload_batches": {"resnet50": 256}, "repeat": 3,
                              "window_s": 2.0, "windows": 4, "backends": "single,ddp,fsdp2,ds_zero2,ds_zero3",
                              "channels_last": True, "top_only": True, "variants_on": ("gpt-350m",)}
# --quick (make bench QUICK=1): the first look, in 5 minutes on an 8-GPU node: one repetition (so no winner is named
# by the verdict's rule), three backends, shorter windows
QUICK: dict[str, Any] = {"repeat": 1, "window_s": 1.0, "windows": 3, "backends": "single,ddp,fsdp2",
                         "variants_on": ()}
# --model default: the device's one default workload (resnet50 on GPUs, resnet18 on a CPU), not the GPU sweep's two;
# the regression gate's fixed configuration names it (Makefile REGRESS_ARGS), so a GPU baseline is one workload
DEVICE_MODEL = "default"
BF16_FROM = (8, 0)  # the compute capability from which a GPU computes bf16 natively (Ampere)


def add_run_arguments(r) -> None:
    """Every flag of ``bench run`` (docs/command-line.md): the sweep, the workload, the measurement, the knobs (each
    backend declares its own: bench/core/knobs.py), the data, the searches, several nodes."""
    for group, flags in RUN_FLAGS:
        g = r.add_argument_group(group) if group else r
        for flag, kwargs in flags:
            if isinstance(flag, tuple):  # (the name, old names kept as aliases that warn): bench/core/flags.py
                add_renamed(g, *flag, **kwargs)
            else:
                g.add_argument(flag, **kwargs)
        if group is None:
            knobs.add_group(r, backends.knobs(), "knobs (recorded in options; a backend that cannot honour one is "
                                                 "skipped with the reason)")
    _nodes.add_arguments(r)


# (group title or None for the main list, [(flag, argparse keywords)]): the flags no backend owns
RUN_FLAGS: list[tuple[str | None, list[tuple[str, dict]]]] = [
    (None, [
        ("--backends", {"help": f"comma-separated, or 'all' ({', '.join(backends.names())}; default: all on a CPU, "
                                f"bench run's GPU sweep on GPUs: {GPU_SWEEP['backends']})"}),
        ("--gpus", {"help": "comma-separated world sizes, e.g. 1,2,4 (on CPU: worker processes)"}),
        ("--max-gpus", {"help": "sweep powers of two up to N, and N itself; 'all' = every device (default)"}),
        ("--device", {"default": "auto", "help": "auto | cuda | cpu (default auto: cuda when present)"}),
        ("--model", {"help": "torchvision classification model (default on GPUs: resnet50 and gpt-350m, two "
                             "workloads; resnet18 on CPU), gpt-<size> (docs/workloads.md) or your own: "
                             "package.module:factory; several, comma-separated; 'default': the device's one "
                             "(resnet50 on GPUs)"}),
        ("--seq-len", {"type": int, "help": "gpt-<size>: tokens per sequence (default 1024 on GPU, 64 on CPU)"}),
        ("--optimizer", {"help": "sgd | adamw (default: sgd for torchvision models, adamw for the others)"}),
        ("--batch-size", {"type": int, "help": "per-device batch (default 64 on GPU, 8 sequences for gpt-<size>; 8 on "
                                               "CPU)"}),
        ("--image-size", {"type": int, "help": "square input size in px (default 224 on GPU, 64 on CPU)"}),
        ("--warmup", {"type": int, "help": "untimed steps before the first window"}),
        ("--steps", {"type": int, "help": "steps per timed window (windows of a step count; not with --window-s)"}),
        ("--window-s", {"type": float, "metavar": "SECONDS", "help": "windows sized by time: each runs the steps that "
                                                                     "fill SECONDS at the step time warm-up measured "
                                                                     "(default on GPUs: 2; the count is recorded)"}),
        ("--windows", {"type": int, "help": "timed windows (raw times are kept in the record)"}),
        ("--precision", {"help": "fp32 | fp16 | bf16 (default: the backend's own, fp32 for most)"}),
        (("--timeout-s", "--timeout"), {"type": float, "dest": "timeout", "metavar": "SECONDS",
                                        "help": "seconds per run before it is killed (default scales with steps)"}),
        ("--peak-tflops", {"type": float, "help": "the GPU's dense peak TFLOP/s at the run's precision, for MFU "
                                                  "(default: bench/core/mfu.py's table)"}),
        ("--repeat", {"type": int, "help": "runs of every configuration, each its own process tree, in interleaved "
                                           "order (default 3 on GPUs, 1 on a CPU); the run is the statistical unit"}),
        ("--order-seed", {"type": int, "help": "the seed that shuffles the configurations' order within each "
                                               "repetition (default 0; recorded as order_seed)"}),
        ("--variants", {"action": "store_true", "help": "also run each backend's labelled variants beside it: FSDP2 and "
                                                        "DeepSpeed as their libraries recommend (half parameters), the "
                                                        "hand-written all-reduce bucketed (default on GPUs: on "
                                                        "gpt-350m)"}),
        ("--cudnn-benchmark", {"choices": tuple(ON_OFF), "help": "torch.backends.cudnn.benchmark on CUDA (default "
                                                                 "on; DataParallel's sweep also runs it off)"}),
        ("--reference", {"action": "store_true", "help": "also run each configuration's plain twin (bench/twins: the "
                                                         "plainest PyTorch loop of the same workload on one device), "
                                                         "interleaved; world-size-1 records get the harness overhead, "
                                                         "1 - harness / twin, with its interval"}),
        ("--refresh-peak", {"action": "store_true", "help": "measure the device's matmul peak again (it is measured "
                                                            "once, by the first run that finds no cache entry, and "
                                                            "reused: bench peak)"}),
        ("--skip-peak", {"action": "store_true", "help": "neither measure nor read the matmul peak: MFU against the "
                                                         "datasheet only (bench doctor's launches, which share a GPU, "
                                                         "where a measured peak would read low)"}),
    ]),
    ("data", [
        ("--data", {"default": "synthetic", "help": "synthetic (a fixed batch on the device) | imagenet | learnable "
                                                    "(--to-accuracy's synthetic task: class patterns plus noise)"}),
        ("--data-dir", {"help": "ImageNet folder: DIR/train/<class>/*.JPEG (with --data imagenet)"}),
        ("--loader", {"help": "real data: torchvision (DataLoader workers, default) | dali (NVIDIA DALI)"}),
        ("--decode", {"help": "real data: cpu (default) | gpu (nvJPEG: torchvision.io.decode_jpeg on the GPU, or "
                              "DALI's mixed decoder); GPU runs only"}),
        ("--workers", {"type": int, "help": "DataLoader processes per device, for every backend (DataParallel's one "
                                            "process gets N times as many, capped by the cores; default: cores / N - "
                                            "1)"}),
        ("--eval", {"action": "store_true", "help": "after the timed windows, evaluate the distributed way "
                                                    "(DistributedSampler shards, all-reduced sums): eval_loss, "
                                                    "eval_accuracy, eval_throughput"}),
        ("--eval-samples", {"type": int, "help": "size of the synthetic evaluation set (default 300; real data: "
                                                 "val/)"}),
    ]),
    ("searches (instead of timing)", [
        ("--find-max-batch", {"action": "store_true", "help": "find each backend's largest per-device batch that "
                                                              "fits (bounded search of short isolated runs; records "
                                                              "in RESULTS/maxbatch)"}),
        ("--find-max-model", {"action": "store_true", "help": "find each backend's largest model of the GPT ladder "
                                                              "that trains at the per-device batch (short isolated "
                                                              "runs; records in RESULTS/maxmodel)"}),
        ("--ladder", {"help": "--find-max-model: the GPT sizes to walk, smallest first (default gpt-125m to "
                              "gpt-6.7b on GPU, gpt-micro to gpt-medium on CPU)"}),
        ("--max-batch", {"type": int, "help": "--find-max-batch: the search's cap (default 4096 on GPU, 256 on "
                                              "CPU)"}),
        ("--memory-limit-gib", {"type": float, "help": "CPU only: give each rank a heap budget of this many GiB "
                                                       "(the CPU stand-in for GPU memory)"}),
    ]),
    ("time to accuracy (instead of timing; docs/workloads.md)", [
        ("--to-accuracy", {"type": float, "metavar": "A", "help": "train each configuration in epochs until its "
                                                                  "held-out top-1 reaches A (0 < A <= 1) or "
                                                                  "--max-epochs; records in RESULTS/accuracy"}),
        ("--max-epochs", {"type": int, "help": "--to-accuracy: the epochs' budget, and the schedule's length "
                                               "(default 20)"}),
        ("--eval-every", {"type": int, "help": "--to-accuracy: evaluate every N epochs, and after the last (default "
                                               "1)"}),
        ("--base-lr", {"type": float, "help": "--to-accuracy: the learning rate at --base-batch (default: the "
                                              "optimizer's, 0.01 for SGD, 6e-4 for AdamW)"}),
        ("--base-batch", {"type": int, "help": "--to-accuracy: the global batch --base-lr is for (default: the "
                                               "per-device batch, so world size 1 runs at --base-lr)"}),
        ("--lr-scaling", {"help": "--to-accuracy: linear | sqrt | none, or several comma-separated (one run each): "
                                  "the rate at the run's global batch (default linear)"}),
        ("--warmup-epochs", {"type": float, "help": "--to-accuracy: linear warm-up to the scaled rate over these "
                                                    "epochs (default 0)"}),
        ("--lr-decay", {"help": "--to-accuracy: cosine | step (x0.1 at 1/2 and 3/4 of --max-epochs) | none (default "
                                "cosine)"}),
        ("--momentum", {"type": float, "help": "--to-accuracy: SGD's momentum, AdamW's first beta (default: "
                                               "backends/base.py's, 0.9)"}),
        ("--weight-decay", {"type": float, "help": "--to-accuracy: the optimizer's weight decay (default: "
                                                   "backends/base.py's, 1e-4 for SGD, 0.1 for AdamW)"}),
        ("--train-samples", {"type": int, "help": "--to-accuracy with --data learnable: the training set's size "
                                                  "(default 2048; the held-out set: --eval-samples)"}),
    ]),
    ("results", [
        ("--resume", {"action": "store_true", "help": "skip configurations that already have an ok record in the "
                                                      "results directory"}),
        ("--results", {"default": "results/raw", "help": "directory for the records (default results/raw)"}),
    ]),
]


def parse_run(argv: list[str], known: bool = False) -> argparse.Namespace:
    """``bench run``'s arguments parsed from ``argv``, for commands that plan as bench run does (doctor, verify);
    ``known``: the flags only bench run's own parser adds (``--trace``, ``--wait-quiet-s``) are left out."""
    p = argparse.ArgumentParser(prog="python -m bench run", allow_abbrev=False)
    add_run_arguments(p)
    return p.parse_known_args(argv)[0] if known else p.parse_args(argv)


def run_defaults(args, quick: bool = False) -> list[str]:
    """Fill in ``args`` what the user did not give with bench run's defaults for this machine: on GPUs the GPU sweep
    (GPU_SWEEP: two workloads, bf16 where every GPU has it and fp16 otherwise, channels_last for the convolutions, 3
    repetitions, windows of 2 s, the default backends, 1 and N GPUs); with ``quick``, QUICK's on any device. Returns
    what was chosen, one line each (the plan's first lines); ``args.defaulted`` names the flags filled."""
    device_type = detect_device(args.device)[0]
    chosen: dict = {}
    if device_type == "cuda":
        chosen.update(GPU_SWEEP, precision=gpu_precision())
    if quick:
        chosen.update(QUICK if device_type == "cuda" else {"repeat": 1, "backends": QUICK["backends"]})
    if args.steps is not None:  # windows of a step count, asked for: the windows' count is the device's default too
        chosen.pop("window_s", None)
        chosen.pop("windows", None)
    lines, filled = [], []
    for key, value in chosen.items():
        if key in ("workload_batches", "top_only", "variants_on"):
            continue
        if getattr(args, key, None) is None:
            setattr(args, key, value)
            filled.append(key)
            lines.append(f"{FLAG_OF.get(key, '--' + key.replace('_', '-'))} {value if value is not True else ''}".strip())
    if device_type == "cuda":
        args.top_only = not args.gpus
        if "model" in filled:  # the labelled variants (each library's recommended mode) on the workload that needs them
            args.variants_on = chosen.get("variants_on", ())
        if "model" in filled:
            args.workload_batches = {m: b for m, b in GPU_SWEEP["workload_batches"].items() if not args.batch_size}
    args.defaulted = filled
    return lines


FLAG_OF = {"model": "--model", "repeat": "--repeat", "window_s": "--window-s", "windows": "--windows",
           "backends": "--backends", "channels_last": "--channels-last (convolutions)", "precision": "--precision"}


def gpu_precision() -> str:
    """bf16 where every GPU here computes it natively (compute capability 8.0 or newer, read from NVML), else fp16;
    bf16 where NVML cannot say."""
    from bench.core import cuda, nvml

    try:
        with nvml.open() as n:
            caps = [n.compute_capability(cuda.nvml_index(i)) for i in range(cuda.count())]
    except (nvml.Unavailable, RuntimeError):
        return "bf16"
    return "bf16" if all(c >= BF16_FROM for c in caps) else "fp16"


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
        raise UsageError(f"{'--gpus' if gpus else '--max-gpus'} {gpus or max_gpus!r}: world sizes must be positive "
                         "integers")
    if max(sizes) > present:
        raise UsageError(f"--gpus {max(sizes)}: this machine has {present} {unit}")
    return sizes


def parse_backends(text: str | None) -> list[str]:
    import difflib

    text = text or "all"
    names = [x.strip() for x in text.split(",") if x.strip()] if text != "all" else backends.names()
    unknown = [n for n in names if n not in backends.REGISTRY]
    if unknown or not names:
        near = [m for n in unknown for m in difflib.get_close_matches(n, backends.names(), n=3, cutoff=0.6)]
        hint = f" (did you mean {' or '.join(dict.fromkeys(near))}?)" if near else ""
        raise UsageError(f"--backends {text!r}: unknown backend {', '.join(unknown) or repr(text)}{hint}; choose from "
                         f"{', '.join(backends.names())}")
    return names


def kind_of(model: str) -> str:
    return workloads.of(model).kind


def check_model(name: str) -> None:
    if workloads.of(name).kind != "vision":  # gpt-<size> (of() checked the size) or package.module:factory
        module, _, factory = name.partition(":")
        if ":" in name and not (module and factory):
            raise UsageError(f"--model {name!r}: your own model is package.module:factory")
        return
    if name in workloads.SMALL_CNNS:
        return
    import torchvision  # here only: a GPT, a user's model or cnn-tiny does not need its model list

    valid = torchvision.models.list_models(module=torchvision.models) + list(workloads.SMALL_CNNS)
    if name not in valid:
        raise UsageError(f"--model {name!r}: unknown model; choose a torchvision classification model ({', '.join(valid)}), "
                         f"a GPT size ({', '.join(workloads.GPT_SIZES)}) or your own (package.module:factory)")


IMAGE_FLOOR = 32  # px: below it a classifier's stride-32 stages leave a 1x1 map, and no image workload is measured


def check_image_size(model: str, size: int | None) -> None:
    """A torchvision model's images at least as large as it takes (its weights' ``min_size``) and IMAGE_FLOOR; one line
    (exit 2) otherwise: ``--image-size 1`` once ran, "ok", and was given an ImageNet epoch estimate."""
    if workloads.of(model).kind != "vision" or size is None or size <= 0:
        return  # not images (or not positive: RunConfig says so in its own words)
    if model in workloads.SMALL_CNNS:
        if size < workloads.SMALL_CNN_MIN_SIZE:
            raise UsageError(f"--image-size {size}: too small for {model}; use at least {workloads.SMALL_CNN_MIN_SIZE} "
                             "(its two stride-2 stages leave a 2x2 map)")
        return
    import torchvision  # here only, as in check_model: importing it imports torch._dynamo (1.5 s of CPU)

    try:
        least = max(list(torchvision.models.get_model_weights(model))[0].meta["min_size"])
        source = f"{model}'s smallest input ({least} px, torchvision)"
    except (ValueError, IndexError, KeyError):
        least, source = 0, ""
    if least <= IMAGE_FLOOR:
        least, source = IMAGE_FLOOR, (f"{IMAGE_FLOOR} px: below it the network's stride-32 stages leave a 1x1 map, not "
                                      "an image workload")
    if size < least:
        raise UsageError(f"--image-size {size}: too small for {model}; use at least {least} ({source})")


def check_writable(directory: Path, flag: str = "--results") -> None:
    """The directory the records go to (``flag`` names where it came from) exists or is made, and takes a file."""
    directory = Path(directory)
    if directory.is_file():
        raise UsageError(f"{flag} {str(directory)!r} is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {str(directory)!r} is not writable: {e.strerror or e}") from None


def plan(args) -> tuple[list[RunConfig], list[str]]:
    """Every configuration to run once, in sweep order (``interleave`` adds the repetitions): each workload of
    ``--model`` (comma-separated) in turn."""
    models = [m.strip() for m in (args.model or "").split(",") if m.strip()] or [None]
    configs, notes = [], []
    for model in models:
        got, said = _plan_workload(args, model, several=len(models) > 1)
        configs += got
        notes += [n for n in said if n not in notes]
    check_data(args, configs)
    return configs, notes


def _plan_workload(args, model: str | None, several: bool = False) -> tuple[list[RunConfig], list[str]]:
    """The configurations of one workload (``model``; None: the device's default). ``several``: one of several
    workloads, where --seq-len applies to the GPTs only and --image-size to the image models only."""
    from bench.rank import data, loaders

    check_knobs(args)
    device_type, sizes, nodes, nnodes = sweep_sizes(args)
    names = parse_backends(args.backends)
    d = DEFAULTS[device_type]
    model = d["model"] if model in (None, DEVICE_MODEL) else model  # --model default: this device's one workload
    check_model(model)
    check_image_size(model, _pick(args.image_size if kind_of(model) == "vision" or not several else None,
                                  d["image_size"]))
    check_precision(args.precision)
    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat must be a positive integer, got {args.repeat}")
    window_s = getattr(args, "window_s", None)
    if window_s is not None and args.steps is not None:
        raise UsageError(f"--window-s {window_s:g} sizes each window by time and --steps {args.steps} by a step count: "
                         "give one")
    kind = workloads.of(model).kind
    seq_len = args.seq_len if kind == "language" or not several else None
    image_size = args.image_size if kind == "vision" or not several else None
    batches = getattr(args, "workload_batches", None) or {}  # bench run's GPU sweep: a batch per workload
    cudnn = None if args.cudnn_benchmark is None else ON_OFF[args.cudnn_benchmark]
    all_knobs, configs, notes = backends.knobs(), [], []
    # a default made for convolutions (bench run's GPU sweep: channels_last) is not a GPT's option
    defaulted = set(getattr(args, "defaulted", ()) or ())
    drop = {"channels_last"} & defaulted if kind != "vision" else set()

    def add(name, n, precision, cudnn_benchmark, note=None, extra=None, without=()):
        backend = backends.create(name)
        honours = {k.key for k in backend.knobs}
        # nor a backend's that cannot honour it (dp: its replicas' weights are contiguous): it runs as it can, and its
        # record's options say so; a channels_last given on the command line still skips it, with the reason.
        # ``without``: settings a baseline leaves out to compute as the run it is the baseline of
        options = {k: v for k, v in knobs.options(all_knobs, honours, args).items()
                   if k not in drop and not (k in defaulted and k not in honours) and k not in without}
        options.update(extra or {})  # a labelled variant's own (Backend.variants)
        cfg = RunConfig(
            backend=name, launcher=backend.launcher, world_size=n, device_type=device_type, model=model,
            data=args.data, data_dir=args.data_dir, workers=args.workers, loader=args.loader, decode=args.decode,
            image_size=_pick(image_size, d["image_size"]),
            batch_size=_pick(args.batch_size, batches.get(model) or default_batch(device_type, kind)),
            warmup=_pick(args.warmup, d["warmup"]), steps=_pick(args.steps, d["steps"]),
            windows=_pick(args.windows, d["windows"]), precision=precision, timeout=args.timeout,
            options=options, cudnn_benchmark=cudnn_benchmark,
            eval=args.eval, nnodes=nnodes, eval_samples=_pick(args.eval_samples, RunConfig.eval_samples),
            seq_len=seq_len, optimizer=args.optimizer, window_s=window_s,
        ).validate()
        if cfg.data == "imagenet":  # bad loader or decode names: the loader registry says so, in one line
            loaders.check(cfg.loader, cfg.decode, cfg.device_type)
        least, why = backend.min_warmup(cfg)
        if cfg.warmup < least:
            raise UsageError(f"--warmup {cfg.warmup} is too short for {name}: use at least {least} ({why})")
        cfg.note = "; ".join(filter(None, [backend.note(cfg), note])) or None
        cfg.flops_per_sample, cfg.peak_tflops = workload_flops(model, cfg.image_size, cfg.seq_len), args.peak_tflops
        if cfg.data == "imagenet" and cfg.workers is None:
            cfg.workers = data.default_workers(n)  # per device, for every backend
        configs.append(cfg)

    # A sweep with no --gpus runs the multi-process backends at its largest world size only on a CPU, where figures say
    # nothing about scaling and it keeps `make bench` on a laptop within minutes, and in bench run's GPU sweep, whose
    # budget holds 1 and N (scaling efficiency from 1 to N) and not every size between. --gpus 1,2,... runs every size.
    top_only = (device_type == "cpu" or getattr(args, "top_only", False)) and not args.gpus and nnodes == 1
    top = max(sizes) if top_only and len(sizes) > 1 else None
    limits = {name: backends.create(name).world_size_limit(device_type) for name in names}
    if top and any(limits[name][0] != 1 for name in names):  # nothing to say where every backend runs at 1
        ones = [name for name in names if limits[name][0] == 1]
        unit = "worker" if device_type == "cpu" else "GPU"
        notes.append(f"{'CPU' if device_type == 'cpu' else 'GPU'} sweep: "
                     f"{' and '.join(ones) + f' at 1 {unit}, the others' if ones else 'every backend'} at "
                     f"{top} {unit}s only (--gpus 1,{','.join(str(n) for n in sizes[1:])} runs every size)")
    for name in names:
        backend = backends.create(name)
        limit, why = limits[name]
        beyond = [n for n in sizes if limit and n > limit]
        if beyond and nnodes == 1 and not top:
            notes.append(f"{name} not planned at world size {', '.join(map(str, beyond))}: "
                         f"{why or f'it runs at world size {limit} only'}")
        for n in sizes:
            if top and n != top and limit != 1:
                continue
            if limit and n > limit:
                continue
            elsewhere = backend.node_plan(nodes, n) if nnodes > 1 else None
            if elsewhere:
                notes.append(elsewhere)
                continue
            precision = args.precision or backend.default_precision
            for cudnn_benchmark, note in backend.planned_runs(device_type, n, cudnn):
                add(name, n, precision, cudnn_benchmark, note)
            if getattr(args, "variants", False) or model in (getattr(args, "variants_on", None) or ()):
                for extra, what, _ in backend.variants(precision):
                    if all(getattr(args, k, None) in (None, False) for k in extra):  # a knob given: the user's choice
                        add(name, n, precision, cudnn, f"labelled variant: {what}", extra)
    # Every efficiency cell needs the baseline at world size 1 at the same precision: plan it at every precision that a
    # run which can happen here uses (on CPU an fp16 default is skipped, so no fp16 baseline is planned for it).
    if backends.BASELINE in names and 1 in sizes and args.precision is None:
        have = {c.precision for c in configs if c.backend == backends.BASELINE}
        used = [c.precision for c in configs
                if (loader_unavailable(c) or backends.create(c.backend).unavailable(c)) is None]
        for precision in dict.fromkeys(used):
            if precision not in have:
                add(backends.BASELINE, 1, precision, cudnn, f"the {precision} scaling baseline")
                have.add(precision)
    # A labelled variant with a setting of its own (DataParallel's cudnn.benchmark off, planned at N >= 2) divides by
    # baselines of that same setting: single@1 and the backend's own @1. A baseline of the default instead would mix
    # two cuDNN settings in one efficiency.
    # Likewise the workload's shared settings (report/common.py workload_options): dp runs NCHW under the GPU sweep's
    # channels_last default, so its efficiency divides by a single@1 in NCHW, planned here, never by the NHWC one.
    shared = backends.shared_keys()

    def settings(c):
        return frozenset(backends.shared_settings(c.options).items())

    def runs(c):  # a run that will run here (one skipped before launch has nothing to divide)
        return (loader_unavailable(c) or backends.create(c.backend).unavailable(c)) is None

    if 1 in sizes and cudnn is None:
        planned = {(c.backend, c.world_size, c.precision, c.cudnn_benchmark, settings(c)) for c in configs}
        for c in [c for c in configs if c.world_size > 1 and c.cudnn_benchmark is False and runs(c)]:  # on: default
            for name in dict.fromkeys((c.backend, backends.BASELINE)):
                if name in names and (name, 1, c.precision, c.cudnn_benchmark, settings(c)) not in planned:
                    setting = f"cudnn.benchmark {'on' if c.cudnn_benchmark else 'off'}"
                    add(name, 1, c.precision, c.cudnn_benchmark, c.note if name == c.backend else
                        f"the {setting} scaling baseline", without=shared - {k for k, _ in settings(c)})
                    planned.add((name, 1, c.precision, c.cudnn_benchmark, settings(c)))
    baselines = {(c.precision, c.cudnn_benchmark, settings(c)) for c in configs
                 if c.backend == backends.BASELINE and c.world_size == 1}
    for c in [c for c in configs if c.world_size > 1 and runs(c)]:
        want = (c.precision, c.cudnn_benchmark, settings(c))
        # only where single@1 runs at this precision and cuDNN setting in another layout: the sweep's own baseline rules
        # decide whether there is one at all
        if want not in baselines and any(b[:2] == want[:2] for b in baselines):
            left_out = sorted({k for b in baselines if b[:2] == want[:2] for k, _ in b[2]} - {k for k, _ in settings(c)})
            add(backends.BASELINE, 1, c.precision, c.cudnn_benchmark,
                f"the scaling baseline of {c.backend}'s settings (without {', '.join(left_out)})",
                without=shared - {k for k, _ in settings(c)})
            baselines.add(want)
    if device_type == "cpu" and nnodes == 1:  # one share of the cores per rank, the largest world size's
        for cfg in configs:
            cfg.threads = max(1, usable_cpus() // max(sizes))
    return configs, notes


def sweep_sizes(args) -> tuple[str, list[int], object, int]:
    """(device type, world sizes, the nodes or None, nodes per run) of ``bench run``'s arguments."""
    device_type, present = detect_device(args.device)
    per_gpu = getattr(args, "ranks_per_gpu", None) or 1
    if per_gpu > 1 and device_type != "cuda":
        raise UsageError(f"--ranks-per-gpu {per_gpu} shares CUDA devices between ranks; this run is on the CPU, where "
                         "--gpus already counts worker processes")
    present *= per_gpu  # ranks, not devices, are what a world size counts
    nodes = _nodes.parse_nodes(args)
    if getattr(args, "external", False):
        if nodes is not None:
            raise UsageError("--external takes the world from the engine's environment; drop --nnodes")
        world, nnodes = _nodes.external_world(args)
        return device_type, [world], None, nnodes
    if nodes is not None:
        if args.max_gpus or (args.gpus and "," in args.gpus):
            raise UsageError("with --nnodes, --gpus is the number of processes per node (one value)")
        per_node = world_sizes(args.gpus or str(present if device_type == "cuda" else 1), None, device_type, present,
                               per_gpu)
        return device_type, [nodes.nnodes * per_node[0]], nodes, nodes.nnodes
    return device_type, world_sizes(args.gpus, args.max_gpus, device_type, present, per_gpu), None, 1


def check_data(args, configs: list[RunConfig]) -> None:
    """The data the sweep reads, checked once before anything launches."""
    from bench.rank import data

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


def loader_unavailable(cfg: RunConfig) -> str | None:
    """Why the loader of a real-data run cannot run here (and the fix), asked of the loader registry; None for
    synthetic data or a loader that can run. Checked before the backend's own reasons (Backend.unavailable)."""
    if cfg.data != "imagenet":
        return None
    from bench.rank import loaders

    return loaders.unavailable(cfg.loader or "torchvision")


def skip_reason(cfg: RunConfig) -> str | None:
    """Why a planned run would be skipped here, known before anything is launched (its loader, then its backend's own
    ``unavailable``), or None when it can run."""
    return loader_unavailable(cfg) or backends.create(cfg.backend).unavailable(cfg)


def skipped_here(configs: list[RunConfig]) -> dict[str, list[str]] | None:
    """Why every run of ``configs`` would be skipped here, for a reason known before launch: each reason once, with
    the backends it stops; None when one of them can run (or there are none)."""
    why: dict[str, list[str]] = {}
    for cfg in configs:
        reason = skip_reason(cfg)
        if reason is None:
            return None
        why.setdefault(reason, []).append(cfg.backend)
    return why or None


def check_something_runs(configs: list[RunConfig]) -> None:
    """A plan whose every run would be skipped for a reason known before launch is refused, in one line (exit 2), with
    the reasons, each once with the runs it stops: a sweep that measured nothing must not exit 0."""
    why = skipped_here(configs)
    if not why:
        return
    parts = [f"{', '.join(dict.fromkeys(names))}: {reason}" for reason, names in why.items()]
    raise UsageError(f"nothing to run: all {len(configs)} planned run{'s' if len(configs) != 1 else ''} would be "
                     f"skipped here ({'; '.join(parts)})")


def workload_flops(model: str, image_size: int | None, seq_len: int | None = None) -> float | None:
    """Training FLOPs per sample (backends/models/flops.py), or None (with a warning when a model cannot be counted)."""
    from backends.models import flops

    workload = workloads.of(model, image_size, seq_len)
    if workload.kind == "custom":
        return None  # built in the ranks only: not counted, no MFU (docs/workloads.md)
    try:
        return flops.flops_per_sample(model, image_size, seq_len)
    except Exception as e:  # noqa: BLE001 - a model the meta device cannot trace: no FLOPs, no MFU, still a run
        print(f"warning: cannot count FLOPs of {model} at {workload.shape} ({type(e).__name__}: {e}); no MFU",
              file=sys.stderr)
        return None


def interleave(configs: list[RunConfig], repeats: int, seed: int | None = None,
               shuffle: bool = True) -> list[RunConfig]:
    """Every configuration once, then again, ``repeats`` times, each repetition in an order of its own: the first in
    the planned order (the one --plan prints and the user typed), each later one shuffled (``random.Random``, by
    ``seed`` and the repetition: the same seed gives the same sweep), then turned so that it neither starts nor ends
    with the configuration the one before did. Slow drift (clocks, heat, neighbours) then hits all configurations alike
    instead of whichever always ran first or last (``single@1``, the baseline of every efficiency, always ran first).
    Each run records ``order_seed`` and its ``order_index``. ``shuffle=False``: the planned order in every repetition
    (--to-accuracy's runs, which time no windows)."""
    import dataclasses
    import random

    seed = 0 if seed is None else seed
    out, before = [], None
    for r in range(1, repeats + 1):
        order = list(range(len(configs)))
        if shuffle and r > 1:
            random.Random(f"{seed}-{r}").shuffle(order)
        if shuffle and before is not None and len(order) > 1:
            turns = [order[k:] + order[:k] for k in range(len(order))]
            order = next((t for t in turns if t[0] != before[0] and t[-1] != before[-1]),
                         next(t for t in turns if t[0] != before[0]))
        before = order
        out += [dataclasses.replace(configs[i], repeat_index=r, repeats=repeats, order_seed=seed, order_index=j + 1)
                for j, i in enumerate(order)]
    return out


def backend_options(name: str, args) -> dict:
    """The knobs a run of backend ``name`` records in ``options`` (and so in its configuration key), from ``args``
    (bench/core/knobs.py): every knob given on the command line, whichever backend."""
    return knobs.options(backends.knobs(), {k.key for k in backends.backend_class(name).knobs}, args)


def check_knobs(args) -> None:
    """Every knob's bounds, one line each (bench/core/knobs.py)."""
    for knob in backends.knobs():
        knob.check(getattr(args, knob.dest, None))


def check_precision(precision: str | None) -> None:
    if precision is not None and precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: unknown precision; choose from {', '.join(PRECISIONS)}")


def _pick(value, default):
    return default if value is None else value

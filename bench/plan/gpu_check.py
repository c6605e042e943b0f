"""The GPU check's launch plan (``make gpu-check``, docs/gpu-machine.md): every launch the gpu tests read, run once per
check, several at once, each its own ``python -m bench ...`` with its records in a folder of its own.

One GPU or two:

- every registered backend at bf16 and at fp16 at world size 1 (tiny ResNet-18 runs), with the memory probe (256 MiB
  held through the last warm-up step, which the warm-up peak must show and the timed peak must not);
- fp32 through ``bench verify`` (every backend trains the model ``single`` trains), in a few groups;
- 2 ranks of every backend that can share one GPU (``--ranks-per-gpu 2``, over gloo) on one GPU, or every backend
  that runs at 2 on two GPUs (NCCL);
- the single-purpose runs: cuDNN's benchmark off, DDP's PowerSGD and fp16 hooks, a GPT's memory on ddp and fsdp2, the
  nvJPEG and DALI decoders, the energy counter over a span it resolves, a traced run read by HTA; on two GPUs also
  DeepSpeed, FSDP2, Horovod, DataParallel and NCCL's collectives at 2.

Horovod's launches (its own ``verify-horovod`` among them) wait for ``BUILD``: under ``make gpu-check FULL=1`` Horovod
is compiled beside the first launches (``Build``, scripts/build_horovod.sh) and they start when it is built, or fail
with the build's first error; with no build running they start (or are skipped) as any other.

The launches share the GPU (its memory allows: they are small) and divide the CPU cores between them (each gets its own
cores, which its ranks inherit): a functional check, not a measurement. The doctor runs the plan, then ``pytest -m
gpu`` with ``BENCH_GPU_PLAN_DIR`` pointing at it, and the tests only read its records; a plain ``pytest -m gpu`` runs
the plan itself, once for every xdist worker (tests/conftest.py ``gpu_plan``). The launch list is built from the
backend registry, so a new backend joins it with no edit here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import backends
from bench.core.results import REPO_ROOT, write_json_atomic

PLAN_SCHEMA = 1
MANIFEST = "plan.json"
# The tiny run every functional launch makes (the gpu tests' GPU_RUN): resnet18 at 64 px, 3 warm-up steps, 3 x 3 steps.
GPU_RUN = ("--device", "cuda", "--model", "resnet18", "--image-size", "64", "--batch-size", "16", "--warmup", "3",
           "--steps", "3", "--windows", "3")
MEMORY_PROBE = {"BENCH_FAULT": "bloat@rank0:step3"}  # 256 MiB held through the last warm-up step (bench/rank/faults.py)
VERIFY_GROUPS = 3
# one process tree's start to record, 4 launches at once on an H100 of 16 cores: 1351 s for the 54 trees started at
# b7f3632 (a launch of one tree 23-37 s; 13 s alone), docs/gpu-machine.md
SECONDS_PER_TREE = 25.0
MEMORY_SHARE = 0.75  # of the GPU's memory that launches at once may plan to hold
COLUMNS = ("bf16", "fp16", "fp32 (verify)", "2 ranks")
CONCURRENT = "concurrent: a functional check, not a measurement"
NOT_RUN = "not run (budget)"
SKIPPED = "skipped"  # every run of the launch would be skipped here (a backend or loader missing): not started
# The backend compiled beside the plan (make gpu-check FULL=1), and the name of its build: its launches wait for it
BUILT_BESIDE = "horovod"
BUILD = "horovod-build"
# Horovod's build with CUDA and NCCL, by scripts/build_horovod.sh, at BUILD_JOBS = half the cores (niced) beside the
# launches. Not yet measured on a GPU machine: 6 min on the 2-core Xeon VM (CPU build with CUDA parts), 189 s for the
# CPU build on 2 cores (docs/gpu-machine.md); 16 cores at 8 jobs are taken to need 4 min. Replace with the figure
# `make gpu-check FULL=1` prints (the manifest's builds.horovod-build.seconds).
BUILD_SECONDS = 240.0


@dataclasses.dataclass(frozen=True)
class Launch:
    """One ``python -m bench ARGV --results DIR/NAME``: what it checks, the backends and table column it fills, the
    process trees it starts (the time estimate) and the GPU memory it may hold."""
    name: str
    argv: tuple[str, ...]
    what: str
    backends: tuple[str, ...] = ()
    column: str = ""
    trees: int = 1
    gib: float = 2.0
    gpus: int = 1
    env: tuple[tuple[str, str], ...] = ()
    after: str = ""  # a build (Build.name) this launch waits for, where one runs beside the plan


    def command(self, results: Path | str) -> list[str]:
        return [sys.executable, "-m", "bench", *self.argv, "--results", str(results)]

    def shell(self, results: Path | str = "results/doctor/alone") -> str:
        """The command line that runs this launch alone, as a user types it."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return " ".join(filter(None, [env, "python -m bench", shlex.join([*self.argv, "--results", str(results)])]))


def shares_a_gpu(name: str) -> bool:
    """Whether two ranks of this backend can share one GPU (it declares the --ranks-per-gpu knob: over gloo)."""
    return any(k.key == "ranks_per_gpu" for k in backends.backend_class(name).knobs)


def runs_at_two(name: str) -> bool:
    limit = backends.backend_class(name).max_world_size
    return limit is None or limit >= 2


def launches(gpus: int, names: list[str] | None = None, data_dir: str = "{imagenet}") -> list[Launch]:
    """The plan for a machine of ``gpus`` GPUs (1, or 2 and more: the two-GPU launches join), for ``names`` (default:
    every registered backend). ``data_dir``: the image folder of the decode launches (made by ``run``)."""
    names = list(names or backends.names())
    out: list[Launch] = []
    for name in names:
        for precision in ("bf16", "fp16"):
            out.append(Launch(f"{name}-{precision}", ("run", "--backends", name, "--gpus", "1", *GPU_RUN,
                                                      "--precision", precision),
                              f"{name} at {precision} on one GPU, with the memory probe", (name,), precision,
                              env=tuple(MEMORY_PROBE.items())))
    # the backend built beside the plan in a verify launch of its own, so that no other backend waits for its build
    grouped = [n for n in names if n != BUILT_BESIDE]
    size = max(1, math.ceil(len(grouped) / VERIFY_GROUPS))
    groups = [(f"verify-{i // size + 1}", grouped[i:i + size]) for i in range(0, len(grouped), size)]
    for name, group in groups + ([(f"verify-{BUILT_BESIDE}", [BUILT_BESIDE])] if BUILT_BESIDE in names else []):
        out.append(Launch(name, ("verify", "--backends", ",".join(group), "--gpus", "1", "--device", "cuda",
                                 "--steps", "8"),
                          f"fp32: {', '.join(group)} train the model single trains (bench verify)", tuple(group),
                          "fp32 (verify)", trees=1 + len(group)))
    two = [n for n in names if runs_at_two(n) and (gpus >= 2 or shares_a_gpu(n))]
    for name in two:
        shared = () if gpus >= 2 else ("--ranks-per-gpu", "2")
        out.append(Launch(f"{name}-2ranks", ("run", "--backends", name, "--gpus", "2", *shared, *GPU_RUN),
                          f"{name}: 2 ranks, identical replicas, " + (
                              "one GPU each (NCCL)" if gpus >= 2 else "sharing one GPU (gloo)"),
                          (name,), "2 ranks", gib=3.0, gpus=min(gpus, 2)))
    if "single" in names:
        out += [Launch("cudnn-off", ("run", "--backends", "single", "--gpus", "1", *GPU_RUN, "--cudnn-benchmark", "off"),
                       "cudnn.benchmark off is applied and recorded"),
                Launch("energy-span", ("run", "--backends", "single", "--gpus", "1", "--device", "cuda", "--model",
                                       "resnet18", "--image-size", "224", "--batch-size", "64", "--warmup", "3",
                                       "--steps", "40", "--windows", "3"),
                       "NVML's energy counter over a span it resolves", gib=5.0)]
        for loader in ("torchvision", "dali"):
            out.append(Launch(f"decode-{loader}", ("run", "--backends", "single", "--gpus", "1", "--device", "cuda",
                                                   "--model", "resnet18", "--image-size", "32", "--batch-size", "4",
                                                   "--workers", "1", "--warmup", "2", "--steps", "2", "--windows", "2",
                                                   "--data", "imagenet", "--data-dir", data_dir, "--loader", loader,
                                                   "--decode", "gpu"),
                              f"{'nvJPEG through torchvision' if loader == 'torchvision' else 'DALI mixed'} decode"))
    half = [n for n in names if any(k.flag in ("--fsdp-mp", "--ds-mp") for k in backends.backend_class(n).knobs)]
    for name in half:  # the half-parameter mode of the backends that offer one (their default computes as single does)
        knob = next(k.flag for k in backends.backend_class(name).knobs if k.flag in ("--fsdp-mp", "--ds-mp"))
        out.append(Launch(f"{name}-params-fp16", ("run", "--backends", name, "--gpus", "1", *GPU_RUN, "--precision",
                                                  "fp16", knob, "params"),
                          f"{name} with half parameters ({knob} params) and its own loss scaling, fp16"))
    if "ddp" in names:
        for hook in ("powersgd", "fp16"):
            out.append(Launch(f"ddp-hook-{hook}", ("run", "--backends", "ddp", "--gpus", "1", *GPU_RUN, "--warmup",
                                                   "4", "--ddp-comm-hook", hook), f"DDP's {hook} hook on NCCL"))
        out.append(Launch("trace-hta", ("run", "--backends", "ddp", "--gpus", "1", *GPU_RUN, "--trace", "2"),
                          "a traced CUDA run read by Holistic Trace Analysis"))
    gpt = [n for n in ("ddp", "fsdp2") if n in names]
    if gpt:
        out.append(Launch("gpt-memory", ("run", "--backends", ",".join(gpt), "--gpus", "1", "--device", "cuda",
                                         "--model", "gpt-tiny", "--seq-len", "256", "--batch-size", "8", "--warmup",
                                         "3", "--steps", "3", "--windows", "2"),
                          "a GPT's memory broken down (parameters, optimizer state, activations)", trees=len(gpt)))
    if gpus >= 2:
        out += two_gpu_launches(names)
    # launches that share the GPU neither measure its matmul peak (it would read low, and be cached for later sweeps)
    # nor read one: their MFU is against the datasheet
    out = [dataclasses.replace(x, argv=(*x.argv, "--skip-peak")) if x.argv[0] == "run" else x for x in out]
    return [dataclasses.replace(x, after=BUILD) if BUILT_BESIDE in uses(x) else x for x in out]


def uses(x: Launch) -> set[str]:
    """The backends a launch runs: those its row fills, and those its ``--backends`` names."""
    named = x.argv[x.argv.index("--backends") + 1].split(",") if "--backends" in x.argv else []
    return set(x.backends) | set(named)


def two_gpu_launches(names: list[str]) -> list[Launch]:
    out = []
    ds = [n for n in names if n.startswith("ds_zero")]
    if ds:
        for precision in ("fp32", "fp16"):
            out.append(Launch(f"deepspeed-2gpus-{precision}", ("run", "--backends", ",".join(ds), "--gpus", "2",
                                                               *GPU_RUN, "--precision", precision),
                              f"DeepSpeed at 2 GPUs, {precision}", tuple(ds), trees=len(ds), gib=3.0, gpus=2))
        # under torch_autocast at fp16, stages 1-2 are refused at N >= 2 (their ranks' loss scales would differ): the
        # launch above runs ZeRO-3 alone, and DeepSpeed's own fp16 section runs every stage here
        out.append(Launch("deepspeed-2gpus-fp16-params", ("run", "--backends", ",".join(ds), "--gpus", "2", *GPU_RUN,
                                                          "--precision", "fp16", "--ds-mp", "params"),
                          "DeepSpeed at 2 GPUs, fp16 section (half parameters)", tuple(ds), trees=len(ds), gib=3.0,
                          gpus=2))
    if "fsdp2" in names:
        out.append(Launch("fsdp2-2gpus-fp16", ("run", "--backends", "fsdp2", "--gpus", "2", *GPU_RUN, "--precision",
                                               "fp16", "--fsdp-mp", "params"),
                          "FSDP2 at 2 GPUs, fp16 with half parameters, its compute-only reference", gpus=2))
    if "horovod" in names:
        out.append(Launch("horovod-2gpus", ("run", "--backends", "horovod", "--gpus", "2", *GPU_RUN, "--precision",
                                            "fp16"), "Horovod over NCCL at 2 GPUs", gpus=2))
    if "dp" in names:
        out += [Launch("dp-2gpus", ("run", "--backends", "dp", "--gpus", "2", *GPU_RUN),
                       "DataParallel's GPU-0 load, cudnn.benchmark on and off", trees=2, gpus=2),
                Launch("dp-energy", ("run", "--backends", "dp", "--gpus", "2", "--device", "cuda", "--model", "resnet18",
                                     "--image-size", "224", "--batch-size", "64", "--warmup", "3", "--steps", "20",
                                     "--windows", "3", "--cudnn-benchmark", "on"),
                       "DataParallel's energy summed over its GPUs", gib=5.0, gpus=2)]
    out.append(Launch("collectives-2gpus", ("collectives", "--gpus", "2", "--device", "cuda", "--max-bytes", "1M",
                                            "--iters", "3", "--warmup", "1", "--no-horovod"),
                      "NCCL's collectives and their bus-bandwidth formulas", gpus=2))
    return out


def estimate_seconds(plan: list[Launch], jobs: int, build_s: float | None = None) -> float:
    """The plan's time at ``jobs`` launches at once: its process trees at SECONDS_PER_TREE each, shared out; with a
    build of ``build_s`` beside it, the launches that wait for it start no sooner than it ends."""
    def spread(launches):
        trees = sum(x.trees for x in launches)
        longest = max((x.trees for x in launches), default=0)
        return SECONDS_PER_TREE * max(trees / max(1, jobs), longest)

    held = [x for x in plan if x.after] if build_s is not None else []
    return max(spread(plan), build_s + spread(held)) if held else spread(plan)


def default_jobs(cpus: int) -> int:
    """Launches at once: one per 4 cores (a launch's start is CPU work: imports, CUDA and NCCL set-up), 1 to 8."""
    return max(1, min(8, cpus // 4))


def timeout_for(launch: Launch) -> float:
    return 120.0 + 90.0 * launch.trees


# ---------------------------------------------------------------------------------------------------------------
# A build beside the plan

class Build:
    """A command started in a session of its own beside the plan, its output in ``log``. ``state()``: None while it
    runs, "" once it succeeded, else why it failed (its log's ``FAILED:`` line, else its last line): the launches
    that wait for it (``Launch.after``) then fail with that line."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict | None = None, what: str = ""):
        self.name, self.command, self.log, self.env, self.what = name, command, Path(log), env, what
        self.proc: subprocess.Popen | None = None
        self.started = self.ended = None
        self.stopped = False

    def start(self) -> "Build":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()
        return self

    def state(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        if self.ended is None:
            self.ended = time.monotonic()
        if self.stopped:
            return "stopped by the time budget before it finished"
        if self.proc.returncode == 0:
            return ""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        failed = [ln for ln in lines if "FAILED:" in ln]
        return (failed or lines or [f"exit {self.proc.returncode}"])[-1] + f" (exit {self.proc.returncode})"

    def wait(self, deadline: float, clock=time.monotonic) -> str:
        """Until it ends or ``deadline``, where it is stopped; its final state."""
        while self.state() is None and clock() < deadline:
            time.sleep(0.5)
        if self.state() is None:
            self.stop()
        return self.state()

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after: what it would have installed is not there."""
        if self.proc is not None and self.proc.poll() is None:
            self.stopped = True
            _stop(self.proc)

    def summary(self) -> dict:
        state = self.state()
        end = self.ended if self.ended is not None else time.monotonic()
        return {"what": self.what, "command": shlex.join(self.command), "log": str(self.log),
                "status": "running" if state is None else ("built" if state == "" else "failed"), "reason": state or None,
                "rc": None if self.proc is None else self.proc.returncode,
                "seconds": None if self.started is None else round(end - self.started, 1)}


def build_jobs(cpus: int) -> int:
    """Compile jobs beside the plan: half the cores (the launches keep the rest, and the build runs niced)."""
    return max(2, cpus // 2)


def horovod_build(venv: Path, jobs: int, log: Path) -> Build:
    """scripts/build_horovod.sh into ``venv`` with ``jobs`` compile jobs (WHEELS, offline, and the script's other
    variables pass through from the environment: make gpu-check FULL=1 WHEELS=DIR)."""
    return Build(BUILD, ["bash", str(REPO_ROOT / "scripts" / "build_horovod.sh"), str(venv)], log,
                 env={**os.environ, "BUILD_JOBS": str(jobs)},
                 what=f"Horovod with NCCL, {jobs} compile jobs (scripts/build_horovod.sh)")


# ---------------------------------------------------------------------------------------------------------------
# Running it

def image_tree(root: Path) -> Path:
    """A tiny ImageNet-style folder for the decode launches: 4 classes of 8 JPEGs each in ``root/train``."""
    from PIL import Image

    for c in range(4):
        folder = root / "train" / f"n0000000{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(8):
            Image.new("RGB", (48, 40), (40 * c, 20 * i, 90)).save(folder / f"img_{i}.JPEG")
    return root


def skip_reason(argv: list[str]) -> str | None:
    """Why every run of a ``bench run`` or ``bench verify`` launch would be skipped on this machine, known before launch
    as the command itself knows it (its own planner: Horovod not built, DeepSpeed or DALI not installed), which would
    refuse it with "nothing to run"; None when one of its runs can run, when it is another command, or when the
    question cannot be answered here (its arguments refused, a library failing to load: the launch says why itself).
    What the planners print, and what importing a library sets in the environment (``import deepspeed`` sets
    PYTORCH_NVML_BASED_CUDA_CHECK), stay here: the launches, the tests and the measured runs get the environment the
    doctor got."""
    if not argv or argv[0] not in ("run", "verify"):
        return None
    from bench.plan import sweep, verify

    saved = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            if argv[0] == "run":
                why = sweep.skipped_here(sweep.plan(sweep.parse_run(list(argv[1:]), known=True))[0])
            else:
                entries = verify.plan(verify.parse_verify(list(argv[1:]), known=True))[1]
                why = verify.skipped_here(entries)
    except (Exception, SystemExit):  # noqa: BLE001 - a question this machine cannot answer: the launch answers it
        return None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if not why:
        return None
    return "; ".join(reason if len(why) == 1 else f"{', '.join(dict.fromkeys(names))}: {reason}"
                     for reason, names in why.items())


def run(plan: list[Launch], out: Path, jobs: int, deadline: float, gpu_bytes: int | None = None, say=print,
        clock=time.monotonic, cpus: list[int] | None = None, skip=skip_reason, builds: list[Build] | None = None) -> dict:
    """Run ``plan`` into ``out`` (one folder per launch, its log beside it), ``jobs`` at once, each on its share of
    the cores (``slot``, ``cpus``), as GPU memory allows (``gpu_bytes``: the GPU's, None: not gated); a launch not
    started by ``deadline`` is not run, and one whose every run would be skipped here (``skip(argv)``, its reason) is
    not started. A launch whose build (``Launch.after``) is among ``builds``, running beside the plan, waits for it:
    it starts once the build succeeded (what the build installed decides, not the skip known before it), and fails
    with the build's first error otherwise. Writes and returns the manifest (``out/plan.json``, the builds in it),
    rewritten as each launch or build ends."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = image_tree(out / "imagenet")
    cpus = cpus or sorted(os.sched_getaffinity(0))
    jobs = max(1, min(jobs, len(cpus)))
    slices = [cpus[i::jobs] for i in range(jobs)]
    budget = None if gpu_bytes is None else MEMORY_SHARE * gpu_bytes / 2 ** 30
    by_name = {b.name: b for b in builds or []}
    manifest = {"schema": PLAN_SCHEMA, "kind": "gpu-plan", "label": CONCURRENT, "jobs": jobs, "launches": {},
                "builds": {n: b.summary() for n, b in by_name.items()}, "started_at": time.time(), "finished_at": None,
                "complete": False}
    todo = sorted(plan, key=lambda x: -x.trees)  # the longest first: the plan ends sooner
    running: dict[str, tuple[Launch, subprocess.Popen, int, float]] = {}
    free = list(range(jobs))

    def argv_here(x: Launch) -> list[str]:
        return [a.replace("{imagenet}", str(data)) for a in x.argv]

    def entry(x: Launch, **kw) -> dict:
        return {"argv": list(x.argv), "what": x.what, "backends": list(x.backends), "column": x.column,
                "trees": x.trees, "env": dict(x.env), "results": str(out / x.name), "log": str(out / f"{x.name}.log"),
                "command": x.shell(), "reason": None, **kw}

    def save():
        manifest["builds"] = {n: b.summary() for n, b in by_name.items()}
        write_json_atomic(manifest, out / MANIFEST, overwrite=True)

    def building(x: Launch) -> bool:
        return x.after in by_name and by_name[x.after].state() is None

    ended: set[str] = set()

    def builds_ended():
        """Each build that ended since the last look: said once; the launches waiting for a failed one fail."""
        for name, b in by_name.items():
            state = b.state()
            if state is None or name in ended:
                continue
            ended.add(name)
            seconds = b.summary()["seconds"]
            say(f"[plan] {name}: " + ("built" if state == "" else f"failed: {state}") + f" in {seconds:.0f} s "
                f"(log: {b.log})")
            for x in [x for x in todo if x.after == name and state]:
                todo.remove(x)
                manifest["launches"][x.name] = entry(x, status="failed", reason=f"{name} failed: {state}", rc=None,
                                                     seconds=0.0, slot=None, cpus=[])
                say(f"[plan] {x.name}: failed ({name} failed)")
            save()

    for x in list(todo):
        if x.after in by_name:  # what the build installs decides: it is not known yet
            say(f"[plan] {x.name}: waits for {x.after}")
            continue
        why = skip(argv_here(x))
        if why:
            todo.remove(x)
            manifest["launches"][x.name] = entry(x, status=SKIPPED, reason=why, rc=None, seconds=0.0, slot=None,
                                                 cpus=[])
            say(f"[plan] {x.name}: skipped ({why})")
    save()

    try:
        while todo or running:
            builds_ended()
            now = clock()
            for name, (x, proc, k, started) in list(running.items()):
                late = now - started > timeout_for(x) or now > deadline + 60
                if proc.poll() is None and not late:
                    continue
                if proc.poll() is None:
                    _stop(proc)
                rc = proc.returncode
                status = "timed out" if late and rc in (None, -signal.SIGKILL, -signal.SIGTERM, 130) else (
                    "ok" if rc == 0 else "failed")
                manifest["launches"][name] = entry(x, status=status, rc=rc, seconds=round(now - started, 1),
                                                   slot=k, cpus=slices[k])
                free.append(running.pop(name)[2])
                say(f"[plan] {name}: {status} in {now - started:.0f} s" + (f" (exit {rc})" if status != "ok" else ""))
                save()
            held = sum(x.gib for x, *_ in running.values())
            while todo and free and clock() < deadline:
                fits = [x for x in todo if not building(x) and (budget is None or held + x.gib <= budget
                                                                  or not running)]
                if not fits:
                    break
                x = fits[0]
                todo.remove(x)
                k = free.pop(0)
                argv = argv_here(x)
                with open(out / f"{x.name}.log", "w") as log:
                    proc = subprocess.Popen([sys.executable, "-m", "bench", *argv, "--results", str(out / x.name)],
                                            cwd=REPO_ROOT, env={**os.environ, **dict(x.env)}, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=_pin(slices[k]))
                running[x.name] = (x, proc, k, clock())
                held += x.gib
                say(f"[plan] {x.name}: started ({x.what})")
            if todo and clock() >= deadline and not running:
                break
            time.sleep(0.5)
    finally:
        for name, (x, proc, k, started) in running.items():
            _stop(proc)
            manifest["launches"][name] = entry(x, status="interrupted", rc=proc.returncode,
                                               seconds=round(clock() - started, 1), slot=k, cpus=slices[k])
        for x in todo:
            manifest["launches"][x.name] = entry(x, status=NOT_RUN, rc=None, seconds=0.0, slot=None, cpus=[])
        manifest["finished_at"] = time.time()
        manifest["complete"] = True
        save()
    return manifest


def _pin(cpus: list[int]):
    def pin():
        os.sched_setaffinity(0, cpus)
    return pin


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launch's process group (bench turns it into an interrupt and stops its runs), SIGKILL after."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------------------------------------------------------
# Reading it

def load(folder: Path) -> dict | None:
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("schema") == PLAN_SCHEMA else None


def records(folder: Path, name: str) -> list[dict]:
    """The records one launch wrote (bench run's, bench verify's in verify/, bench collectives' in collectives/)."""
    base = Path(folder) / name
    out = []
    for sub in (base, base / "verify", base / "collectives"):
        for p in sorted(sub.glob("*.json")):
            if not p.name.startswith("."):
                try:
                    out.append(json.loads(p.read_text()))
                except (OSError, ValueError):
                    continue
    return out

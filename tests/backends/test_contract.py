"""The contract every registered backend keeps, checked for each name in ``backends.names()``: a backend added to the
registry (backends/__init__.py) is tested here with nothing else to edit (docs/adding-a-backend.md), as
``test_a_backend_added_to_the_registry_alone_is_planned_offered_and_checked`` proves with one that exists in a test.

- It trains 2 gloo ranks on the CPU, launched as a user launches it (``bench run``), or the world size it supports
  here (single and dp: 1), or its run is skipped with the reason its own ``unavailable()`` gives (ddp_amp_syncbn:
  SyncBatchNorm refuses CPU modules; horovod without its build).
- Its ranks end with identical replicas, and its record carries every field: the windows and their throughput,
  ``describe()``'s fields in ``backend_info``, each rank's ``state_bytes``, the compute-only reference or why there is
  none, the distributed evaluation (37 samples, each counted once) and a trace of its phases.
- Every knob it declares refuses a bad value in one line (exit 2), and a knob it does not declare skips its run with
  a reason naming the flag.

One sweep (a module fixture: one ``bench run`` per world size and set of flags) feeds every record check, and the
backends' own checks on those records (``test_<backend>_...`` at the end, here because they need the sweep); their
other tests sit beside this file (test_ddp.py, test_fsdp2.py, ...). tests/README.md says where a test goes."""
import statistics
import sys
from pathlib import Path

import pytest

import backends
from backends.base import CHANNELS_LAST
from backends.models.flops import flops_per_sample, parameter_count
from bench.plan import sweep as _plan
from bench.plan.sweep import parse_run, plan
from bench.core import results, traces
from bench.core.errors import UsageError
from bench.rank import startup, train
from tests.conftest import TINY, TINY_STEPS, TINY_WINDOWS, bench_inproc, cli_error, records, skip_without

# The sweep's flags, every one of them checked on every record. --eval: 37 samples over 2 ranks (DistributedSampler
# pads to 38; FSDP2 all-gathers parameters in every forward, so the padded batch must run masked, or it hangs until
# --timeout); --trace 1: every backend marks its phases for the profiler (tests/test_trace.py has the rest of --trace).
# resnet18, not TINY's cnn-tiny: every backend on a torchvision model, with BatchNorm and residual connections.
CONTRACT_MODEL = "resnet18"
SWEEP = [*TINY, "--model", CONTRACT_MODEL, "--eval", "--eval-samples", "37", "--timeout-s", "240"]
RUN_ONLY = ["--trace", "1"]  # a flag of bench run's own, not of the planner (parse_run)
# Knobs the sweep gives every backend that declares them. --channels-last: FSDP2 and DeepSpeed crashed at set-up on
# channels-last parameters (FSDP2 refuses them, DeepSpeed views each one as bytes to broadcast it); they now keep
# NCHW parameters and feed channels-last inputs, which backend_info.channels_last records from the tensors.
SWEEP_KNOBS = (CHANNELS_LAST,)
# Backend.describe()'s fields (backends/base.py): what actually ran, in every record's backend_info
DESCRIBED = ("process_group", "autocast_dtype", "grad_scaler", "sync_batchnorm_layers", "grad_reduce_dtype", "compile",
             "activation_checkpointing_blocks", "channels_last", "optimizer_impl")
BASE_PHASES = {"data", "forward", "backward", "optimizer", "other"}  # what every step has in a trace
MODEL_BYTES = 4 * parameter_count(CONTRACT_MODEL)  # fp32: 11.7 M parameters
# bench/rank/numerics.py's reading of resnet18 at fp32: what single computes, and so every backend (no attention)
FP32_NUMERICS = "matmul float32, norm float32, loss float32, norm_params float32, residual float32"


def planned(name: str, world_size: int, *extra: str, device: str = "cpu"):
    """The configurations ``bench run --backends name --gpus world_size`` plans, with the sweep's settings."""
    argv = [*SWEEP, *extra] if device == "cpu" else [a if a != "cpu" else device for a in SWEEP] + list(extra)
    return plan(parse_run(["--backends", name, "--gpus", str(world_size), *argv]))[0]


def world_size(name: str) -> int:
    """The world size the contract runs ``name`` at: 2 ranks where it can run them here, else the size it runs at
    (single, and dp on CPU: 1), else 2 (its run is skipped with its reason)."""
    for n in (2, 1):
        configs = planned(name, n)
        if configs and all(backends.create(name).unavailable(c) is None for c in configs):
            return n
    return 2


def sweep_runs() -> list[tuple[list[str], list[str]]]:
    """The sweep: (bench run's arguments, the backends whose records it gives). Every backend runs at its world size
    with every sweep knob it declares; those that run 2 ranks and declare them all share one ``--backends all``."""
    groups = {}
    for name in backends.names():
        declared = {k.key for k in backends.backend_class(name).knobs}
        flags = tuple(k.flag for k in SWEEP_KNOBS if k.key in declared)
        groups.setdefault((world_size(name), flags), []).append(name)
    every = (2, tuple(k.flag for k in SWEEP_KNOBS))
    return [(["--backends", "all" if key == every else ",".join(names), "--gpus", str(key[0]), *SWEEP, *key[1]], names)
            for key, names in groups.items()]


class Ran:
    """One backend's share of the sweep: its record (None if it wrote none), its planned configuration and the output
    of the bench run that ran it."""

    def __init__(self, record, config, proc):
        self.record, self.config, self.output = record, config, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = {}
    for i, (argv, names) in enumerate(sweep_runs()):
        raw = tmp_path_factory.mktemp(f"sweep{i}") / "raw"
        proc = bench_inproc("run", *argv, *RUN_ONLY, "--results", raw)
        configs = {c.backend: c for c in plan(parse_run(argv))[0]}
        recs = {r["backend"]: r for r in records(raw)}
        out.update({name: Ran(recs.get(name), configs.get(name), proc) for name in names})
    return out


def ok_record(sweep, name: str) -> dict:
    """``name``'s record of the sweep, or a skip with the reason it gives here (which the contract test checks)."""
    ran = sweep[name]
    reason = backends.create(name).unavailable(ran.config)
    if reason is not None:
        pytest.skip(f"{name} does not run here: {reason}")
    assert ran.record is not None and ran.record["status"] == "ok", (ran.record or {}).get("reason") or ran.output
    return ran.record


def assert_ok_record(rec: dict, cfg) -> None:
    """Every field of an ok record of a TINY run of ``cfg`` on CPU: what the contract asserts of each backend's record
    (tests/test_faults.py asserts it of a run whose port was retried)."""
    backend = backends.create(cfg.backend)
    assert rec["status"] == "ok", rec["reason"]
    n = cfg.world_size
    assert (rec["backend"], rec["launcher"], rec["world_size"]) == (cfg.backend, backend.launcher, n)
    # identical replicas: checksums over the full (gathered) parameters of every rank
    assert rec["replicas_consistent"] is (True if n > 1 else None)
    assert rec["schema"] == results.SCHEMA and set(results.REQUIRED_KEYS) <= set(rec)
    assert (rec["precision"], rec["data"], rec["model"], rec["image_size"]) == ("fp32", "synthetic", "resnet18", 32)
    assert rec["batch_per_device"] == 2 and rec["global_batch"] == 2 * n
    assert (rec["warmup_steps"], rec["steps_per_window"], rec["settle_steps"]) == (2, TINY_STEPS, 1)
    assert rec["cudnn_benchmark"] is None and (rec["repeat_index"], rec["repeats"]) == (1, 1)  # CPU: no cuDNN
    assert rec["threads_per_rank"] >= 1
    # throughput is global samples per second, the median over windows, inside its own interval
    assert len(rec["window_seconds"]) == TINY_WINDOWS and all(t > 0 for t in rec["window_seconds"])
    per_window = [rec["global_batch"] * TINY_STEPS / t for t in rec["window_seconds"]]
    assert rec["throughput"] == pytest.approx(statistics.median(per_window))
    lo, hi = rec["throughput_ci95"]
    assert lo <= rec["throughput"] <= hi and rec["per_device_throughput"] == pytest.approx(rec["throughput"] / n)
    # host peaks per rank are the timed windows' (after a reset), the warm-up's kept beside them
    assert len(rec["host_peak_rss_bytes"]) == len(rec["warmup_host_peak_rss_bytes"]) == n
    assert all(0 < b for b in rec["host_peak_rss_bytes"] + rec["warmup_host_peak_rss_bytes"])
    assert rec["skipped_steps"] is None and rec["warmup_skipped_steps"] is None  # fp32: no loss scale, no skip
    assert rec["loss_scales"] is None
    # FLOPs are counted for every record; MFU, energy and device memory are GPU figures, empty on CPU with the reason
    assert rec["flops_per_sample"] == pytest.approx(flops_per_sample("resnet18", 32))
    assert rec["mfu"] is None and rec["peak_tflops_source"] == "no GPU: MFU is for GPUs"
    assert rec["joules_per_image"] is None and rec["energy_reason"] == "no GPU"
    assert rec["memory"] == [] and rec["memory_imbalance"] is None
    for key in ("torch", "cuda", "nccl", "cudnn", "gpu_names", "gpu_count", "driver", "cpu_count", "hostname", "python",
                "git_commit", "started_at"):
        assert key in rec["env"], key
    assert rec["env"]["cpu_count"] >= 1 and rec["env"]["torch"]
    # every rank ran in the harness's environment, whichever launcher started it (tests/test_install.py: in a venv)
    assert rec["rank_python_prefixes"] == [rec["env"]["python_prefix"]] * n == [sys.prefix] * n
    # one GC policy for every backend; no CPU binding without a GPU (bench/rank/startup.py, affinity.py)
    assert rec["gc_policy"] == startup.TIMED_POLICY
    assert rec["cpu_binding"] == [{"cpus": None, "reason": "no GPU"}] * n
    # the compute-only reference, measured in the same processes wherever there is a synchronisation to skip
    why = train.compute_only_reason(backend, cfg)
    co = rec["compute_only"]
    assert (co["measured"], co["reason"]) == (why is None, why)
    if why is None:
        assert co["keeps"] == backend.compute_only_keeps and len(rec["compute_only_window_seconds"]) == TINY_WINDOWS
        assert all(t > 0 for t in rec["compute_only_window_seconds"])
    else:
        assert rec["compute_only_window_seconds"] is None
    # fp32 on CPU: no autocast, no scaler, no SyncBatchNorm; gloo where torch.distributed carries the ranks
    info = rec["backend_info"]
    assert info["process_group"] == ("gloo" if backend.launcher in ("torchrun", "spawn") else None)
    assert (info["autocast_dtype"], info["grad_scaler"], info["sync_batchnorm_layers"]) == (None, False, 0)


# ---------------------------------------------------------------------------------------------------
# The contract, for every registered backend

@pytest.mark.slow
@pytest.mark.parametrize("name", backends.names())
def test_it_trains_two_ranks_with_identical_replicas_or_says_why_not(sweep, name):
    ran, backend = sweep[name], backends.create(name)
    rec, cfg = ran.record, ran.config
    reason = backend.unavailable(cfg)
    if reason is not None and rec is None:  # a sweep of nothing else: refused before launch with the reason (exit 2)
        assert "bench: error: nothing to run: " in ran.output and f"{name}: {reason}" in ran.output, ran.output
        return
    assert rec is not None, f"bench run wrote no record of {name}:\n{ran.output}"
    assert (rec["backend"], rec["launcher"], rec["world_size"], rec["device_type"]) == (
        name, backend.launcher, world_size(name), "cpu")
    if reason is not None:  # skipped with the backend's own reason, before anything was launched
        assert (rec["status"], rec["reason"], rec["throughput"]) == ("skipped", reason, None)
        return
    assert_ok_record(rec, cfg)
    # distributed evaluation: every sample once (never the padded 38), sums all-reduced
    assert rec["eval"] is True and rec["eval_samples"] == 37
    assert rec["eval_loss"] > 0 and 0 <= rec["eval_accuracy"] <= 1 and rec["eval_throughput"] > 0
    # --trace: a trace file per rank, each step's phases, and no profiler running in a timed window
    assert rec["profiler_in_windows"] is False and rec["trace"]["steps"] == 1
    assert [Path(f).is_file() for f in rec["trace"]["files"]] == [True] * cfg.world_size
    for phases in rec["trace"]["phase_ms_per_step"]:
        assert BASE_PHASES <= set(phases) <= BASE_PHASES | set(traces.PHASES), phases


@pytest.mark.slow
@pytest.mark.parametrize("name", backends.names())
def test_its_record_says_what_ran(sweep, name):
    """describe()'s fields, read from what ran in the ranks: gradients reduced in fp32 (no knob compresses them),
    nothing compiled or checkpointed, and the sweep's knobs (the process group and the dtypes: assert_ok_record)."""
    rec = ok_record(sweep, name)
    info, cfg = rec["backend_info"], sweep[name].config
    assert set(DESCRIBED) <= set(info), set(DESCRIBED) - set(info)
    assert (info["compile"], info["activation_checkpointing_blocks"]) == (None, 0)
    # the numerics probe after warm-up (bench/rank/train.py), in the record: at fp32 every backend computes what single
    # computes (tests/test_numerics.py reads the probe itself at bf16 and fp16, in one process)
    assert rec["numerics"]["signature"] == FP32_NUMERICS, rec["numerics"]
    # SGD, the torchvision default: fused where torch has the kernel; on FSDP2's DTensors foreach (no _fused_sgd_ rule)
    assert info["optimizer_impl"] == ("foreach" if name == "fsdp2" else "fused"), info["optimizer_impl"]
    if cfg.world_size > 1:
        assert info["grad_reduce_dtype"] == "float32"
    given = {k.key for k in SWEEP_KNOBS} & {k.key for k in backends.backend_class(name).knobs}
    assert {k for k, v in rec["options"].items() if k in {k.key for k in SWEEP_KNOBS} and v} == given
    if "channels_last" in given:  # the inputs, and the parameters' layout read from the tensors
        assert info["channels_last"]["inputs"] is True
        assert info["channels_last"]["parameters"] in ("channels_last", "contiguous", None)
    else:
        assert info["channels_last"] is None


@pytest.mark.slow
@pytest.mark.parametrize("name", backends.names())
def test_each_rank_counts_the_state_it_holds(sweep, name):
    """state_bytes per rank, read from the rank's own tensors: every parameter is held by some rank (a replica on each,
    or one shard each), never more than the whole model; the optimizer holds state; gradients are counted unless the
    backend keeps them in buffers of its own (None)."""
    rec = ok_record(sweep, name)
    state = rec["state_bytes"]
    assert len(state) == rec["world_size"]
    for rank in state:
        assert {"parameters", "gradients", "optimizer_state"} <= set(rank), rank
        assert 0 < rank["parameters"] <= MODEL_BYTES and 0 < rank["optimizer_state"] <= MODEL_BYTES
        assert rank["gradients"] is None or 0 < rank["gradients"] <= MODEL_BYTES
    assert sum(r["parameters"] for r in state) >= MODEL_BYTES * 0.999


def bad_values(knob) -> tuple[list[str], str] | None:
    """Command-line arguments giving ``knob`` a value out of its bounds, and what the one line must say."""
    if knob.type is bool:  # a negatable switch is named with its --no- form (argparse's BooleanOptionalAction)
        named = f"{knob.flag}/--no-{knob.flag[2:]}" if knob.negatable else knob.flag
        return [f"{knob.flag}=yes"], f"argument {named}: ignored explicit argument 'yes'"
    if knob.choices:
        return [knob.flag, "not-a-choice"], f"argument {knob.flag}: invalid choice: 'not-a-choice'"
    if knob.low is not None:
        return [knob.flag, f"{knob.low:g}"], f"{knob.flag} must be a "
    if knob.type in (int, float):
        return [knob.flag, "many"], f"argument {knob.flag}: invalid {knob.type.__name__} value: 'many'"
    return None  # a free string: nothing is out of bounds


def check_bad_knob_values(name: str, capsys, results) -> None:
    n = world_size(name)
    for knob in backends.backend_class(name).knobs:
        bad = bad_values(knob)
        if bad is None:
            continue
        argv, message = bad
        code, err = cli_error(capsys, "run", "--backends", name, "--gpus", n, *TINY, *argv, "--results", results)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (knob.flag, err)
        assert lines[0].startswith("bench: error: ") and message in lines[0], (knob.flag, err)
    assert not records(results)


def knob_value(knob) -> list[str]:
    """Arguments giving ``knob`` a valid value that is on (recorded in ``options``)."""
    if knob.type is bool:
        return [knob.flag]
    if knob.choices:
        return [knob.flag, next(c for c in knob.choices if c not in knob.off)]
    return [knob.flag, f"{(knob.low or 0) + 2:g}"]


def check_undeclared_knob(name: str, monkeypatch) -> None:
    """A knob ``name`` does not declare (the first that plans here), on the device where ``name`` runs without it:
    the planner records it, and the backend's own ``unavailable`` skips the run naming the flag."""
    backend, n = backends.create(name), world_size(name)
    declared = {k.key for k in backend.knobs}
    for device in ("cpu", "cuda"):  # ddp_amp_syncbn runs on CUDA only: the planner is asked as on a 2-GPU machine
        if device == "cuda":
            monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cuda", 2))
        plain, *_ = planned(name, n, device=device)  # the first of its planned runs
        if backend.unavailable(plain) is None:
            break
    else:
        pytest.skip(f"{name} runs neither on CPU nor on CUDA here: {backend.unavailable(plain)}")
    for knob in (k for k in backends.knobs() if k.key not in declared and not k.own):
        try:
            cfg, *_ = planned(name, n, *knob_value(knob), device=device)
        except UsageError:  # a knob this device refuses to plan (--ranks-per-gpu on CPU): the next one
            continue
        assert knob.key in cfg.options, (knob.key, cfg.options)
        reason = backend.unavailable(cfg)
        assert reason is not None and reason.startswith(f"{name} cannot honour {knob.flag} (it honours: "), reason
        assert reason.endswith(f"{', '.join(sorted(k.flag for k in backend.knobs)) or 'none'})"), reason
        return
    pytest.fail(f"no knob that {name} does not declare could be planned")


@pytest.mark.parametrize("name", backends.names())
def test_each_knob_it_declares_refuses_a_bad_value_in_one_line(name, capsys, tmp_path):
    check_bad_knob_values(name, capsys, tmp_path)


@pytest.mark.parametrize("name", backends.names())
def test_a_knob_it_does_not_declare_skips_its_run_naming_the_flag(name, monkeypatch):
    check_undeclared_knob(name, monkeypatch)


@pytest.mark.mutation
@pytest.mark.parametrize("args,message", [
    (["--ddp-bucket-mb", "0"], "bench: error: --ddp-bucket-mb must be a positive number, got 0"),
    (["--ds-bucket-mb", "-2"], "bench: error: --ds-bucket-mb must be a positive number, got -2"),
    (["--hvd-fusion-mb", "-1.5"], "bench: error: --hvd-fusion-mb must be a non-negative number, got -1.5"),
    (["--ranks-per-gpu", "0"], "bench: error: --ranks-per-gpu must be a positive integer, got 0"),
    (["--ddp-comm-hook", "zip"], "bench: error: argument --ddp-comm-hook: invalid choice: 'zip'"),
])
def test_a_refused_knob_value_says_the_bound(results_dir, args, message, capsys):
    """The wording of the one line (bench/core/knobs.py Knob.check), whichever backend runs."""
    code, err = cli_error(capsys, "run", "--backends", "single", "--gpus", 1, *TINY, *args, "--results", results_dir)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(message), err


def test_a_backend_added_to_the_registry_alone_is_planned_offered_and_checked(monkeypatch, capsys, tmp_path):
    """tests/backends/extra_backend.py's DDP subclass with one knob, registered and nothing else: the planner plans
    it in ``--backends all`` with its knob recorded, --help offers the knob, the other backends refuse the knob naming
    it, and this module's checks take the backend: its world size, its place in the sweep, its knobs."""
    extra = {"cls": "tests.backends.extra_backend:Extra", "launcher": "torchrun"}
    monkeypatch.setitem(backends.REGISTRY, "extra", extra)
    configs, _ = plan(parse_run(["--backends", "all", "--gpus", "2", *TINY, "--extra-buckets", "3"]))
    [cfg] = [c for c in configs if c.backend == "extra"]
    assert (cfg.launcher, cfg.world_size, cfg.options) == ("torchrun", 2, {"extra_buckets": 3})
    assert backends.create("extra").unavailable(cfg) is None
    [ddp] = [c for c in configs if c.backend == "ddp"]
    assert backends.create("ddp").unavailable(ddp).startswith("ddp cannot honour --extra-buckets (it honours: ")
    help_text = bench_inproc("run", "--help").stdout
    assert "--extra-buckets EXTRA_BUCKETS" in help_text and "buckets of the extra backend" in help_text
    # the contract's own checks, as for every registered backend
    assert world_size("extra") == 2
    assert [names for argv, names in sweep_runs() if argv[:2] == ["--backends", "all"]][0][-1] == "extra"
    check_bad_knob_values("extra", capsys, tmp_path)  # --extra-buckets 0 among them
    code, err = cli_error(capsys, "run", "--backends", "extra", "--gpus", 2, *TINY, "--extra-buckets", 0)
    assert (code, err) == (2, "bench: error: --extra-buckets must be a positive integer, got 0\n")
    check_undeclared_knob("extra", monkeypatch)


# ---------------------------------------------------------------------------------------------------
# Each backend's own checks on its sweep record (its other tests: test_<backend>.py beside this file)

@pytest.mark.slow
def test_single_and_dp_run_one_process_in_place(sweep):
    single, dp = ok_record(sweep, "single"), ok_record(sweep, "dp")
    assert single["backend_info"]["grad_reduce_dtype"] is None  # one process on one device: nothing is reduced
    assert single["backend_info"]["channels_last"] == {"inputs": True, "parameters": "channels_last"}
    assert dp["note"].startswith("nn.DataParallel on CPU calls the module directly")
    # at 2 ranks on CPU: not planned, with the reason, before anything is launched
    assert planned("dp", 2) == []
    # the scaling baseline runs on one device only, and dp on one CPU process: a sweep says so
    configs, notes = plan(parse_run(["--backends", "single,dp", "--gpus", "1,2", *TINY]))
    assert [(c.backend, c.world_size) for c in configs] == [("single", 1), ("dp", 1)]
    assert notes == ["single not planned at world size 2: the scaling baseline runs on 1 device only",
                     "dp not planned at world size 2: nn.DataParallel cannot parallelise on CPU (it replicates over "
                     "CUDA devices only); run dp on GPUs, or ddp/ddp_spawn for several CPU workers"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "ddp_spawn"])
def test_ddp_keeps_channels_last_parameters(sweep, name):
    rec = ok_record(sweep, name)
    assert rec["backend_info"]["channels_last"] == {"inputs": True, "parameters": "channels_last"}
    assert [s["parameters"] for s in rec["state_bytes"]] == [MODEL_BYTES] * 2  # a full replica on each rank


@pytest.mark.slow
def test_fsdp2_shards_every_parameter_and_keeps_them_nchw(sweep):
    rec = ok_record(sweep, "fsdp2")
    info = rec["backend_info"]
    assert info["sharded_parameters"] == 62 and info["param_dtype"] == "float32"  # every resnet18 parameter a DTensor
    assert info["channels_last"] == {"inputs": True, "parameters": "contiguous"}  # fully_shard refuses NHWC ones
    assert rec["compute_only"]["keeps"].startswith("the per-block parameter all-gathers")
    held = [s["parameters"] for s in rec["state_bytes"]]  # one shard each
    assert sum(held) == pytest.approx(MODEL_BYTES, rel=1e-3) and max(held) < 0.51 * MODEL_BYTES, held
    assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == [BASE_PHASES] * 2


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_ds_zero_records_its_stage_buckets_and_why_no_compute_only_window(sweep, stage):
    skip_without("deepspeed")
    rec = ok_record(sweep, f"ds_zero{stage}")
    info = rec["backend_info"]
    # DDP's 25 MiB, not DeepSpeed's 5e8 elements (a 2 GB bucket allocated on every rank)
    assert info["zero_stage"] == stage and info["bucket_elements"] == 25 * 2 ** 20 // 4
    assert rec["compute_only"] == {"measured": False, "keeps": None, "reason": "DeepSpeed's no_sync forbids "
                                   "engine.step() inside it and is incompatible with ZeRO-2/3's gradient partitioning"}
    # NCHW parameters (DeepSpeed views each as bytes to broadcast it); ZeRO-3 holds flat partitions: no 4-D one
    assert info["channels_last"] == {"inputs": True, "parameters": None if stage == 3 else "contiguous"}
    held = [s["parameters"] for s in rec["state_bytes"]]
    if stage == 3:  # the parameters sharded over the 2 ranks
        assert sum(held) == pytest.approx(MODEL_BYTES, rel=1e-3) and max(held) < 0.51 * MODEL_BYTES, held
    else:
        assert held == [MODEL_BYTES] * 2
    assert [s["gradients"] for s in rec["state_bytes"]] == [None, None]  # in DeepSpeed's own buffers
    assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == [BASE_PHASES] * 2


@pytest.mark.slow
def test_ddp_zero_keeps_its_share_of_the_optimizer_state(sweep):
    rec = ok_record(sweep, "ddp_zero")
    assert rec["compute_only"]["keeps"].startswith("ZeroRedundancyOptimizer's broadcast")
    # ZeroRedundancyOptimizer's parameters_as_bucket_view makes each parameter a view of its flat bucket: NCHW
    assert rec["backend_info"]["channels_last"] == {"inputs": True, "parameters": "contiguous"}
    state = rec["state_bytes"]
    assert [s["parameters"] for s in state] == [MODEL_BYTES] * 2  # full replicas...
    assert max(s["optimizer_state"] for s in state) < 0.6 * MODEL_BYTES  # ...and its share of SGD's momentum
    assert sum(s["optimizer_state"] for s in state) == MODEL_BYTES
    assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == [BASE_PHASES] * 2


@pytest.mark.slow
def test_allreduce_manual_marks_its_all_reduce_and_holds_full_replicas(sweep):
    rec = ok_record(sweep, "allreduce_manual")
    assert [set(p) for p in rec["trace"]["phase_ms_per_step"]] == [BASE_PHASES | {"all-reduce"}] * 2
    assert rec["backend_info"]["channels_last"] == {"inputs": True, "parameters": "channels_last"}
    assert [(s["parameters"], s["gradients"], s["optimizer_state"]) for s in rec["state_bytes"]] == [
        (MODEL_BYTES, MODEL_BYTES, MODEL_BYTES)] * 2  # as DDP does: all of it on every rank


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_records_its_build(sweep):
    skip_without("horovod")
    rec = ok_record(sweep, "horovod")
    info = rec["env"]["horovod"]
    assert info["version"] and "Gloo" in info["controllers"].split(", ")
    assert rec["options"] == {"compression": "none", "channels_last": True}  # its own knob, recorded at its default

"""ds_zero1, ds_zero2 and ds_zero3's own tests: the config DeepSpeed is handed (and read back by DeepSpeed's own
parsers), what the harness reads back from the engine (loss scale, its own count of skipped steps), its half
precision trained, evaluated and refused by bench verify, and fp16 on two GPUs. Their 2-rank runs (the stage, the
bucket size, why no compute-only window, ZeRO-3's sharded state bytes) are in test_contract.py; their settings read
back from 2 real ranks in test_fairness.py."""
import types

import pytest
import torch

import backends
from backends import deepspeed_zero
from backends.base import SGD
from bench.rank import train
from tests.conftest import TINY, bench_inproc, records, skip_without, two_gpus
from tests.fakes import built, cfg_for, fake_init, norm_model


class Handed(Exception):
    pass


def deepspeed_setup(monkeypatch, stage, precision, options=None, engine=None, device_type="cpu"):
    import deepspeed

    model = norm_model()
    seen = {}

    def initialize(model=None, optimizer=None, config=None, dist_init_required=None):
        seen.update(model=model, optimizer=optimizer, config=config, dist_init_required=dist_init_required)
        if engine is None:
            raise Handed()
        return engine(model), "the optimizer", None, None

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(deepspeed_zero, "build_model", built(model, f"ds_zero{stage}"))
    b = backends.create(f"ds_zero{stage}")
    monkeypatch.setattr(b, "init_process_group", fake_init(b, f"ds_zero{stage}"))
    cfg = cfg_for(f"ds_zero{stage}", precision=precision, options=options or {})
    cfg.device_type = device_type
    try:
        b.setup(cfg)
    except Handed:
        pass
    assert model.moved_to == torch.device("cpu")
    return b, seen, model


AUTOCAST_BF16 = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.mutation
def test_deepspeed_gets_the_suites_config(monkeypatch, stage):
    _, seen, model = deepspeed_setup(monkeypatch, stage, "bf16", options={"ds_bucket_mb": 2})
    elements = 2 * 2 ** 20 // 4
    zero = {"stage": stage, "reduce_bucket_size": elements, "allgather_bucket_size": elements, "overlap_comm": True}
    if stage == 1:
        zero["compute_grad_norm"] = False
    assert seen["config"] == {
        "train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1,
        "zero_optimization": zero, "communication_data_type": "fp32",
        "timers": {"throughput": {"enabled": False, "synchronized": False}}, "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0, "fp16": {"enabled": False, "initial_scale_power": 16}, "bf16": {"enabled": False},
        # autocast over fp32 parameters, as single (issue 46); no parameter marked for a bf16 reduction
        "torch_autocast": AUTOCAST_BF16, "steps_per_print": 2 ** 31 - 1, "wall_clock_breakdown": False}
    assert seen["model"] is model and seen["dist_init_required"] is False
    opt = seen["optimizer"]
    assert type(opt) is torch.optim.SGD and {k: opt.defaults[k] for k in SGD} == SGD and opt.defaults["fused"]
    assert [p for g in opt.param_groups for p in g["params"]] == list(model.parameters())


@pytest.mark.mutation
def test_deepspeed_half_parameters_only_with_ds_mp_params(monkeypatch):
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "bf16", options={"ds_mp": "params"})
    assert seen["config"]["bf16"] == {"enabled": True} and seen["config"]["torch_autocast"]["enabled"] is False
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "fp16", options={"ds_mp": "params"})
    assert seen["config"]["fp16"]["enabled"] is True and seen["config"]["torch_autocast"]["enabled"] is False
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "fp16")
    assert seen["config"]["fp16"]["enabled"] is False and seen["config"]["torch_autocast"] == {
        **AUTOCAST_BF16, "dtype": "float16"}
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "fp32")
    assert not any(seen["config"][k]["enabled"] for k in ("fp16", "bf16", "torch_autocast"))


@pytest.mark.mutation
def test_deepspeed_default_buckets_and_what_the_harness_reads_back(monkeypatch):
    class Engine:
        """What deepspeed.initialize returns, with its bf16 cast of the parameters (not the buffers)."""

        def __init__(self, model):
            self.module = torch.nn.Module.to(model, torch.bfloat16)  # not Moved.to: where setup moved it stays
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean, m.running_var = m.running_mean.float(), m.running_var.float()

    b, seen, model = deepspeed_setup(monkeypatch, 2, "bf16", engine=Engine, options={"ds_mp": "params"})
    assert seen["config"]["zero_optimization"]["reduce_bucket_size"] == 25 * 2 ** 20 // 4 == b.bucket_elements
    assert seen["config"]["fp16"]["enabled"] is False
    assert isinstance(b.engine, Engine) and b.model is b.engine and b.module is model and b.optimizer == "the optimizer"
    assert b.buffers_cast == 2 * 5  # running mean and variance of each of the 5 BatchNorms
    assert b.autocast_dtype is None and b.scaler is None and b.device_type == "cpu"
    assert b.feed_batch == 3 and b.data_device == torch.device("cpu") and b.input_dtype == torch.bfloat16
    _, seen, _ = deepspeed_setup(monkeypatch, 2, "fp16", options={"ds_mp": "params"})
    assert seen["config"]["fp16"] == {"enabled": True, "initial_scale_power": 16} and seen["config"]["bf16"] == {
        "enabled": False}
    b, _, _ = deepspeed_setup(monkeypatch, 2, "fp32", engine=lambda model: types.SimpleNamespace(module=model))
    assert b.input_dtype == torch.float32 and b.buffers_cast == 0
    b, _, _ = deepspeed_setup(monkeypatch, 2, "fp16", engine=lambda model: types.SimpleNamespace(module=model),
                              options={"ds_mp": "params"})
    assert b.input_dtype == torch.float16
    b, _, _ = deepspeed_setup(monkeypatch, 2, "fp16", engine=lambda model: types.SimpleNamespace(module=model))
    assert b.input_dtype == torch.float32  # autocast casts inside the forward


@pytest.mark.mutation
def test_deepspeed_is_told_to_use_the_cpu_only_on_cpu(monkeypatch):
    import os

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    deepspeed_setup(monkeypatch, 1, "fp32", device_type="cuda")
    # on a GPU DeepSpeed's own choice stands (1, set by its import: no CUDA context before a fork)
    assert "DS_ACCELERATOR" not in os.environ and os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "0"
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    deepspeed_setup(monkeypatch, 1, "fp32")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    # import deepspeed sets it to 1 when unset: then every torch.cuda.is_available() on a machine without NVML loads
    # libnvidia-ml again (several times a training step), a cost charged to whatever trains in the process
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "0" and not torch.cuda._nvml_based_avail()


@pytest.mark.mutation
def test_deepspeed_loss_scale_only_under_fp16():
    b = backends.create("ds_zero1")
    b.optimizer = types.SimpleNamespace(cur_scale=1024)
    b.engine = types.SimpleNamespace(fp16_enabled=lambda: False, skipped_steps=3)
    assert b.loss_scale() is None and b.skipped_steps() == 3
    b.engine.fp16_enabled = lambda: True
    assert b.loss_scale() == 1024.0 and isinstance(b.loss_scale(), float)
    b.engine = types.SimpleNamespace(skipped_steps=5)  # an engine without fp16 at all
    assert b.loss_scale() is None and b.skipped_steps() == 5
    # torch_autocast at fp16: DeepSpeed's ZeRO optimizer steps through a GradScaler, which halves its scale on every
    # skip: the harness reads the scale ratio (skipped_steps None)
    b.optimizer = types.SimpleNamespace(torch_autocast_gradscaler=torch.amp.GradScaler("cpu", init_scale=512.0))
    b.optimizer.torch_autocast_gradscaler.scale(torch.ones(()))  # its scale exists once it has scaled a loss
    assert b.loss_scale() == 512.0 and b.skipped_steps() is None


def deepspeed_config(monkeypatch, stage: int, precision: str) -> dict:
    """The config ds_zero<stage> hands deepspeed.initialize (stopped there: no process group, no engine)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed

    class Handed(Exception):
        pass

    def initialize(**kwargs):
        raise Handed(kwargs["config"])

    b = backends.create(f"ds_zero{stage}")
    monkeypatch.setattr(deepspeed, "initialize", initialize)
    monkeypatch.setattr(b, "init_process_group", lambda cfg: setattr(b, "device", torch.device("cpu")))
    b.world_size = 2
    with pytest.raises(Handed) as e:
        b.setup(cfg_for(f"ds_zero{stage}", precision=precision))
    return e.value.args[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.mutation
def test_deepspeed_config_parsed_by_deepspeed(monkeypatch, stage):
    """DeepSpeed's own parsers read the generated config (their defaults are what the config must override)."""
    from deepspeed.runtime.config import get_communication_data_type
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.utils.config import get_timers_config

    from deepspeed.runtime.config import get_lower_precision_safe_modules, get_torch_autocast_dtype

    config = deepspeed_config(monkeypatch, stage, "fp16")
    assert get_torch_autocast_dtype(config) == torch.float16 and get_lower_precision_safe_modules(config) == []
    timers = get_timers_config(config)
    assert (timers.enabled, timers.synchronized) == (False, False)
    assert get_communication_data_type(config) == torch.float32
    zero = DeepSpeedZeroConfig(**config["zero_optimization"])
    assert zero.overlap_comm is True
    assert zero.compute_grad_norm is (stage == 3)  # stage 3 has no switch (DeepSpeed refuses it there)
    assert config["wall_clock_breakdown"] is False and config["gradient_clipping"] == 0.0


class HysteresisEngine:
    """DeepSpeed's engine and fp16 optimizer, reduced to what the harness reads: every step overflows, and the loss
    scale halves only on every second overflow (DynamicLossScaler, hysteresis 2)."""

    def __init__(self):
        self.skipped_steps, self.cur_scale, self.overflows = 0, 2.0 ** 16, 0

    def fp16_enabled(self):
        return True

    def overflow_step(self):
        self.skipped_steps += 1
        self.overflows += 1
        if self.overflows % 2 == 0:
            self.cur_scale /= 2


@pytest.mark.mutation
def test_deepspeed_skipped_steps_are_its_own_count_not_the_scale_ratio():
    b = backends.create("ds_zero1")
    engine = HysteresisEngine()
    b.engine, b.optimizer = engine, engine  # loss_scale reads optimizer.cur_scale
    b.train = lambda steps: [engine.overflow_step() for _ in range(steps)]
    b.batches, b.barrier, b.device = None, lambda: None, torch.device("cpu")  # no process group here
    cfg = types.SimpleNamespace(windows=3, steps=4)
    meter = types.SimpleNamespace(read=lambda: None)
    out = train.windows(b, cfg, lambda: None, meter, waited=False)
    assert out["skipped"] == [4, 4, 4]  # the scale ratio says [2, 2, 2]
    assert b.skipped_steps() == 12
    assert backends.create("ddp").skipped_steps() is None  # a GradScaler backend: the harness reads the scale ratio


@pytest.mark.slow
def test_deepspeed_half_parameters_train_evaluate_and_verify_checks_the_autocast_default(results_dir, capsys):
    """--ds-mp params: DeepSpeed 0.19 casts parameters to bf16 but keeps BatchNorm's running statistics fp32, which
    BatchNorm refuses: every fp16/bf16 run failed until the backend gave the statistics their layer's dtype;
    evaluation feeds the model its input dtype. bench verify runs the default (autocast over fp32 parameters), which
    its single reference reproduces."""
    from bench.cli import build_parser
    from bench.commands import verify

    proc = bench_inproc("run", "--backends", "ds_zero3", "--gpus", 2, *TINY, "--precision", "bf16", "--eval",
                        "--eval-samples", 9, "--ds-bucket-mb", 1, "--ds-mp", "params", "--results", results_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = records(results_dir)
    assert rec["status"] == "ok" and rec["replicas_consistent"] is True and rec["eval_samples"] == 9
    # TINY's cnn-tiny: 3 BatchNorm layers, 2 running statistics each
    assert rec["backend_info"]["param_dtype"] == "bfloat16" and rec["backend_info"]["norm_buffers_cast"] == 6
    assert rec["backend_info"]["mixed_precision"].startswith("fp16/bf16 sections")
    assert rec["options"] == {"ds_bucket_mb": 1.0, "ds_mp": "params"} and rec["backend_info"]["bucket_elements"] == \
        2 ** 18
    # on a CPU, DeepSpeed's shared-memory collective (inference only) is neither compiled nor loaded by the ranks
    log = (results_dir / "logs" / f"{rec['run_id']}.log").read_text()
    assert "ds_zero3" in log and deepspeed_zero.SHM_COLLECTIVE not in log, log[-2000:]
    args = build_parser().parse_args(["verify", "--backends", "ds_zero1,ds_zero3", "--gpus", "2", "--device", "cpu",
                                      "--precision", "bf16"])
    _, entries = verify.plan(args)
    assert [(e.backend, e.skipped, e.reference) for e in entries] == [("ds_zero1", None, (2, "local", "bf16")),
                                                                       ("ds_zero3", None, (2, "local", "bf16"))]


@two_gpus("DeepSpeed")
@pytest.mark.gpu
def test_deepspeed_fp16_on_two_gpus_reduces_in_fp32_and_counts_its_skips(gpu_plan):
    """fp16 at 2 GPUs: under torch_autocast ZeRO-3 runs and stages 1-2 are refused with the reason (tests/
    test_loss_scale.py); DeepSpeed's fp16 section runs every stage. Every rank ends at one loss scale."""
    skip_without("deepspeed")
    autocast = {r["backend"]: r for r in gpu_plan.records("deepspeed-2gpus-fp16") if r.get("kind") is None}
    for stage in (1, 2):
        assert autocast[f"ds_zero{stage}"]["status"] == "skipped"
        assert "looks for an overflow in this rank's gradient partition alone" in autocast[f"ds_zero{stage}"]["reason"]
    for launch, stages in (("deepspeed-2gpus-fp16", (3,)), ("deepspeed-2gpus-fp16-params", (1, 2, 3))):
        for stage in stages:
            rec = gpu_plan.record(launch, f"ds_zero{stage}")
            info = rec["backend_info"]
            assert (info["grad_reduce_dtype"], info["overlap_comm"], info["throughput_timer"]) == (
                "float32", True, "off")
            assert info["grad_norm"] == ("computed" if stage == 3 else "skipped")
            assert len(rec["skipped_steps"]) == 3 and all(isinstance(n, int) and n >= 0 for n in rec["skipped_steps"])
            assert rec["replicas_consistent"] is True and len(set(rec["loss_scales"])) == 1, (launch, stage)

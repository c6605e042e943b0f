"""One numerics rule, measured (bench/rank/numerics.py): which dtype each backend's norms, attention, residual stream
and loss ran in, read from a real training step; by default every backend computes what single computes (fsdp2 and
DeepSpeed run autocast over fp32 parameters, issue 46), their half-parameter modes (--fsdp-mp params, --ds-mp params)
compute differently and say so; the verdict names no winner between backends that compute differently at the same
precision flag."""
import json
import os
from pathlib import Path

import pytest
import torch

from tests.conftest import skip_without

AUTOCAST = {"matmul": "bfloat16", "norm": "float32", "attention": "bfloat16", "loss": "float32",
            "norm_params": "float32", "residual": "float32"}
HALF = {**AUTOCAST, "norm": "bfloat16", "norm_params": "bfloat16", "residual": "bfloat16"}


def signature(expected: dict, half: str = "bfloat16") -> str:
    return ", ".join(f"{k} {half if v == 'bfloat16' else v}" for k, v in expected.items())


# -- every case in one rank process: bf16, and fp16 with the half-parameter knobs (fp16 on a CPU: autocast and
# GradScaler("cpu") run there; bench run refuses fp16 without CUDA). The probe is the one bench run's ranks call after
# warm-up (bench/rank/train.py); that its reading reaches the record is the contract's check, on every backend at fp32
# (tests/backends/test_contract.py). -----------------------------------------------------------------------------------

CASES = [("single", {}), ("fsdp2", {}), ("ds_zero2", {}), ("fsdp2", {"fsdp_mp": "params"}),
         ("ds_zero2", {"ds_mp": "params"})]
BF16_ONLY = [("ddp", {})]  # the autocast family's DDP (bench run refuses fp16 on a CPU; the fp16 cases need no DDP)
INFO = ("grad_scaler", "optimizer_impl", "mixed_precision", "param_dtype", "autocast_dtype", "grad_reduce_dtype")


def _probe_every_case(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    import backends
    from backends.models import find_blocks  # noqa: F401 - the numerics probe's import, made before the first case
    from bench.core.config import RunConfig
    from bench.rank import data
    from bench.rank.numerics import probe

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # one group for every case (each backend skips its own when one exists)
    seen = {}
    for precision in ("bf16", "fp16"):
        for name, options in CASES + (BF16_ONLY if precision == "bf16" else []):
            key = f"{name} {json.dumps(options)} {precision}"
            b = backends.create(name)
            cfg = RunConfig(backend=name, launcher=b.launcher, world_size=1, device_type="cpu", model="gpt-micro",
                            image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1,
                            precision=precision, options=options).validate()
            try:
                b.setup(cfg)
                b.batches = data.batches_for(cfg, b)
                calls, loss = [], b.workload.loss

                def watched(outputs, targets, calls=calls, loss=loss):  # how the loss is called: autocast, logits
                    calls.append((torch.is_autocast_enabled("cpu"), str(outputs.dtype).removeprefix("torch.")))
                    return loss(outputs, targets)

                b.workload.loss = watched
                b.train(1)
                got = probe(b)
                info = b.describe()
                seen[key] = {"numerics": got, "signature": got["signature"], "loss_scale": b.loss_scale(),
                             "loss_call": list(calls[-1]), **{k: info.get(k) for k in INFO}}
            except Exception as e:  # noqa: BLE001 - one case failing must not hide the others
                seen[key] = {"crashed": f"{type(e).__name__}: {e}"}
    # DeepSpeed's plain twin (bench/twins/ds_zero.py): its loss called as the backend's (on this process's group)
    from bench.twins import ddp as twin_ddp
    from bench.twins import ds_zero as twin

    twin_ddp.init = lambda device: None

    cfg = RunConfig(backend="ds_zero2", launcher="torchrun", world_size=1, device_type="cpu", model="gpt-micro",
                    image_size=None, seq_len=16, batch_size=2, warmup=2, steps=1, windows=1, precision="bf16").validate()
    c = {"precision": "bf16", "channels_last": False,
         "loop": {"name": "ds_zero", "config": backends.create("ds_zero2").config(cfg, 1)[2]}}
    model = torch.nn.Linear(8, 4)
    _, _, _, step = twin.wrap(c, model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
    calls = []

    def loss_of(net):
        logits = net(torch.randn(2, 8))
        calls.append([torch.is_autocast_enabled("cpu"), str(logits.dtype).removeprefix("torch.")])
        return torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1]))

    step(loss_of)
    seen["twin: ds_zero2 (bf16 loss call)"] = {"loss_call": calls[-1]}
    Path(out).write_text(json.dumps(seen))


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    skip_without("deepspeed")
    out = tmp_path_factory.mktemp("numerics") / "seen.json"
    from bench.launch.run import free_port

    torch.multiprocessing.spawn(_probe_every_case, args=(free_port(), str(out)), nprocs=1, join=True)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_backend_computes_what_single_computes_at_bf16_by_default(probed):
    got = {name: probed[f"{name} {{}} bf16"] for name in ("single", "ddp", "fsdp2", "ds_zero2")}
    crashed = {k: v["crashed"] for k, v in got.items() if "crashed" in v}
    assert not crashed, crashed
    assert probed["twin: ds_zero2 (bf16 loss call)"]["loss_call"] == [True, "bfloat16"]  # its plain twin, as the backend
    for name, seen in got.items():
        assert {k: seen["numerics"][k] for k in AUTOCAST} == AUTOCAST, name
        assert seen["numerics"]["signature"] == signature(AUTOCAST), name
        # the loss under autocast on the half logits, as single computes it: on CUDA its log_softmax then runs in the
        # half dtype (an H100 read DeepSpeed's loss, on .float() logits outside autocast, as float32 where single's
        # was mixed); on a CPU autocast runs it in fp32 either way, so the call itself is what is checked here
        assert seen["loss_call"] == [True, "bfloat16"], name
    assert got["fsdp2"]["mixed_precision"] == "autocast (fp32 parameters, fp32 gradient reduction)"
    assert got["ds_zero2"]["mixed_precision"] == "torch_autocast (fp32 parameters, fp32 gradient reduction)"
    for name in ("fsdp2", "ds_zero2"):
        info = got[name]
        assert (info["param_dtype"], info["autocast_dtype"], info["grad_reduce_dtype"]) == (
            "float32", "bfloat16", "float32"), name


@pytest.mark.slow
@pytest.mark.parametrize("precision,half", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_fsdp2_and_deepspeed_match_singles_numerics_by_default_and_differ_only_when_asked(probed, precision, half):
    got = {k.removesuffix(f" {precision}"): v for k, v in probed.items() if k.endswith(f" {precision}")}
    ds_half = 'ds_zero2 {"ds_mp": "params"}'
    if precision == "fp16" and not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        # DeepSpeed's CPU accelerator offers fp16 only where oneDNN computes it (AVX512-FP16 or AMX-FP16: Sapphire
        # Rapids and later; an AMD EPYC VM here has neither) and its half model refuses it in these words; the
        # autocast modes run fp16 on any CPU. On such a CPU this case is that refusal, and the bf16 case checks the mode.
        assert got.pop(ds_half) == {"crashed": "ValueError: Type fp16 is not supported on your device."}
    crashed = {k: v["crashed"] for k, v in got.items() if "crashed" in v}
    assert not crashed, crashed
    single = got["single {}"]["signature"]
    assert single == signature(AUTOCAST, half)
    assert got["fsdp2 {}"]["signature"] == got["ds_zero2 {}"]["signature"] == single
    assert got['fsdp2 {"fsdp_mp": "params"}']["signature"] == signature(HALF, half)
    if ds_half in got:
        assert got[ds_half]["signature"] == signature(HALF, half)
        assert got[ds_half]["loss_call"] == [False, "float32"]  # DeepSpeed's own half model
    assert got["ds_zero2 {}"]["loss_call"] == got["single {}"]["loss_call"] == [True, half]
    for case, seen in got.items():  # fp16: a loss scaler in every mode; the optimizer fused wherever torch has it
        assert (seen["loss_scale"] is not None) is (precision == "fp16"), case
        assert seen["optimizer_impl"] == "fused", case


def test_the_verdict_compares_only_backends_that_compute_alike(tmp_path):
    from tests.test_report import make, run_report, write

    sig = lambda d: ", ".join(f"{k} {v}" for k, v in d.items())  # noqa: E731
    recs = [make("fsdp2", 2, 300.0, precision="bf16", stamp=f"2026010{i}T000000Z", numerics={"signature": sig(HALF)})
            for i in range(3)]
    recs += [make("ddp", 2, 100.0, precision="bf16", stamp=f"2026010{i}T000000Z",
                  numerics={"signature": sig(AUTOCAST)}) for i in range(3)]
    out = tmp_path / "rep"
    assert run_report(write(tmp_path, *recs), out)[0] == 0
    md = (out / "REPORT.md").read_text()
    assert ("**No like-for-like winner: the fastest, fsdp2, computes norm bfloat16, norm_params bfloat16, residual "
            "bfloat16 where ddp computes norm float32, norm_params float32, residual float32") in md
    assert "- ddp: 67% slower" in md and "; computes norm float32, norm_params float32, residual float32 (not like " \
                                        "with like)" in md
    # the same arithmetic: a winner, as before
    for rec in recs:
        rec["numerics"] = {"signature": sig(AUTOCAST)}
    assert run_report(write(tmp_path / "same", *recs), tmp_path / "rep2")[0] == 0
    assert "**Use fsdp2: faster than every alternative beyond the 95% intervals.**" in (tmp_path / "rep2" /
                                                                                        "REPORT.md").read_text()


def test_a_softmax_asked_for_float32_from_half_logits_reads_float32():
    """On CUDA, log_softmax of fp16 logits at dtype float32 is one _log_softmax(half, half_to_float=True) that computes
    and returns float32: the arithmetic of an upcast before it, read as float32, not as the half input. (Autocast's own
    cross-entropy does not ask for it: on an H100 it ran log_softmax in the half dtype, which the probe reads as such.)
    Read here on fake CUDA tensors (no GPU behind them): the dispatch the probe sees is CUDA's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from bench.rank.numerics import _Probe

    with FakeTensorMode():
        logits = torch.empty(4, 10, device="cuda", dtype=torch.float16)
        upcast, half = _Probe(), _Probe()
        with upcast:
            out = torch.log_softmax(logits, 1, dtype=torch.float32)
        with half:
            torch.log_softmax(logits, 1)
    assert out.dtype == torch.float32 and out.device.type == "cuda"
    assert upcast.seen == {"loss": {"float32"}}
    assert half.seen == {"loss": {"float16"}}

"""Saying why: FLOPs and MFU, energy, collective bandwidth, the communication split and the scaling prediction.
The arithmetic is checked on known values in process; one real collectives sweep runs over gloo."""
import argparse
import json

import pytest
import torch

from backends.models import flops
from bench import cli
from bench.report import scaling as predict
from bench.report import comm
from bench.core import mfu
from bench.rank import energy
from tests.conftest import bench, cli_error

GiB = 2 ** 30


def test_resnet50_flops_match_its_known_forward_cost():
    """ResNet-50 at 224 px: about 4.1 GMAC = 8.2 GFLOP forward; training about 3x (input and weight gradients)."""
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net, x = torchvision.models.resnet50(), torch.empty(1, 3, 224, 224)
    with FlopCounterMode(display=False) as fwd:
        net.eval()(x)
    assert fwd.get_total_flops() == pytest.approx(8.2e9, rel=0.02)
    train = flops.flops_per_sample("resnet50", 224)
    assert train == pytest.approx(3 * fwd.get_total_flops(), rel=0.03)  # the first conv needs no input gradient
    assert flops.parameter_count("resnet50") == 25_557_032


@pytest.mark.parametrize("name,precision,peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "fp16", 756.5), ("NVIDIA H200", "fp32", 494.7),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA L40S", "fp16", 362.05), ("Tesla V100-SXM2-32GB", "fp16", 125.0),
])
def test_peak_table(name, precision, peak):
    value, source = mfu.peak_tflops(name, precision)
    assert value == peak and "datasheet" in source


def test_peak_unknowns_say_why_and_mfu_is_arithmetic():
    assert mfu.peak_tflops("Tesla V100-SXM2-32GB", "bf16") == (
        None, "Tesla V100-SXM2-32GB has no dense bf16 tensor-core rate in NVIDIA V100 datasheet (SXM2); no bf16, no TF32")
    assert mfu.peak_tflops("Some Future GPU", "bf16") == (None, "Some Future GPU is not in the peak table (give "
                                                                   "--peak-tflops)")
    assert mfu.peak_tflops(None, "fp32") == (None, "no GPU: MFU is for GPUs")
    assert mfu.peak_tflops("Anything", "bf16", override=500) == (500.0, "--peak-tflops")
    # 24.3 GFLOP/image x 16,000 img/s over 8 GPUs of 989.4 TFLOP/s
    assert mfu.mfu(24.3e9, 16_000, 989.4, 8) == pytest.approx(24.3e9 * 16_000 / (989.4e12 * 8))
    assert mfu.mfu(None, 1.0, 1.0, 1) is None and mfu.mfu(1.0, 1.0, None, 1) is None


def test_energy_per_window_and_summary():
    assert energy.window_energy([10.0, 20.0], [15.0, 27.5]) == 12.5  # both GPUs of the rank
    assert energy.window_energy(None, [1.0]) is None
    out = energy.summarise([100.0, 120.0, 110.0], [1.0, 1.2, 1.0], samples_per_window=500)
    assert out == {"joules_per_image": pytest.approx(0.22), "mean_watts": pytest.approx(100.0)}
    assert energy.summarise([None, None], [1.0, 1.0], 10) == {"joules_per_image": None, "mean_watts": None}
    assert energy.EnergyMeter([torch.device("cpu")]).reason == "no GPU"


def test_scaling_loss_split_adds_up():
    # ddp at 2: 180 img/s, compute-only 190 img/s, 90 % of 2 x single@1 (100 img/s)
    r = {"global_img_s": 180.0, "compute_only_img_s": 190.0, "eff_vs_single_pct": 90.0, "world_size": 2,
         "batch_per_device": 64}
    s = comm.split(r)
    assert s["comm_loss"] == pytest.approx(0.05) and s["other_loss"] == pytest.approx(0.05)
    assert s["comm_loss"] + s["other_loss"] == pytest.approx(1 - 0.90)
    assert s["exposed_share"] == pytest.approx(1 - 180 / 190)
    assert s["exposed_ms"] == pytest.approx(1000 * (64 / 90 - 64 / 95))  # per-step time, per device
    assert comm.split({**r, "world_size": 1}) is None and comm.split({**r, "compute_only_img_s": None}) is None


def test_allreduce_model_and_bounds():
    curve = [(2 ** 20, 10.0), (2 ** 24, 20.0)]  # busbw GB/s at 1 MiB and 16 MiB
    assert predict.busbw_at(curve, 2 ** 22) == pytest.approx(15.0)  # half-way on a log scale
    assert predict.busbw_at(curve, 1) == 10.0 and predict.busbw_at(curve, 2 ** 30) == 20.0
    # 2 buckets of 16 MiB on 4 ranks: 2 x 16 MiB x 2(3)/4 / 20 GB/s
    t = predict.allreduce_seconds(2 * 2 ** 24, 4, curve, 2 ** 24)
    assert t == pytest.approx(2 * 2 ** 24 * 1.5 / 20e9)
    # 2 nodes of 4 at 100 Gbit/s: intra 2(3)/4 of each bucket at busbw, plus 1/4 of it 2(1)/2 over 12.5 GB/s
    t2 = predict.allreduce_seconds(2 * 2 ** 24, 8, curve, 2 ** 24, gpus_per_node=4, inter_node_gbps=100)
    assert t2 == pytest.approx(2 * (2 ** 24 * 1.5 / 20e9 + 2 ** 24 / 4 * 1.0 / 12.5e9))
    p = predict.predict(0.1, 2 * 2 ** 24, 4, curve, 2 ** 24)
    assert p["step_no_overlap"] == pytest.approx(0.1 + t) and p["step_full_overlap"] == 0.1
    assert p["efficiency_low"] == pytest.approx(0.1 / (0.1 + t)) and p["efficiency_high"] == 1.0
    assert predict.allreduce_seconds(10 ** 6, 1, curve, 2 ** 24) == 0.0


def _collectives_record(directory, busbw=2.0, world_size=2):
    rows = [{"op": "all_reduce", "bytes": b, "seconds": 1.0, "algbw_gbps": busbw, "busbw_gbps": busbw}
            for b in (2 ** 20, 2 ** 24, 2 ** 26)]
    (directory / "collectives").mkdir(parents=True, exist_ok=True)
    (directory / "collectives" / f"c{world_size}.json").write_text(json.dumps({
        "schema": "collectives-1", "kind": "collectives", "run_id": f"c{world_size}", "status": "ok",
        "launcher": "torchrun", "backend": "ddp", "world_size": world_size, "device_type": "cpu",
        "process_group": "gloo", "results": rows}))


def test_predict_against_measured_records(tmp_path, capsys):
    from tests.test_report import make, write

    raw = write(tmp_path, make("single", 1, 100.0, device="cpu", model="resnet18"),
                make("ddp", 2, 150.0, device="cpu", model="resnet18"))
    _collectives_record(raw)
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--results", str(raw), "--world-sizes", "2,8"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    grad = 4 * flops.parameter_count("resnet18")
    t_c = 64 / 100.0
    t_ar = predict.allreduce_seconds(grad, 2, [(2 ** 20, 2.0), (2 ** 24, 2.0), (2 ** 26, 2.0)], 25 * 2 ** 20)
    rows = {cells[1]: cells[2:] for cells in ([c.strip() for c in ln.split("│")] for ln in out.splitlines()
                                              if ln.startswith("│"))}
    assert set(rows) == {"2", "8"}
    assert rows["2"][0] == rows["8"][0] == "2 ranks"  # the one curve measured, for both
    assert rows["2"][3] == f"{100 * t_c / (t_c + t_ar):.1f} % .. 100.0 %"
    assert rows["2"][4] == "75.0 %" and rows["8"][4] == "-"  # measured: 150 / (2 x 100); 8 was not measured


def test_predict_and_the_report_read_a_channels_last_sweep(tmp_path, capsys):
    """The GPU sweep runs ResNet-50 channels_last, single@1 included, and make bench measures the collectives on
    several GPUs: the prediction's inputs are those runs. Before, single@1 was looked for among runs without options,
    none was found, and bench predict and bench report both stopped on a TypeError (an int divided by None)."""
    from tests.test_report import make, write

    cl = {"channels_last": True}
    raw = write(tmp_path, make("single", 1, 100.0, device="cpu", model="resnet18", options=cl),
                make("ddp", 2, 150.0, device="cpu", model="resnet18", options=cl),
                # a cuDNN-off single@1 (dp's variant's baseline) is not mixed into the default's throughput
                make("single", 1, 50.0, device="cpu", model="resnet18", options=cl, cudnn_benchmark=False))
    _collectives_record(raw)
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--results", str(raw), "--world-sizes", "2"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    rows = {cells[1]: cells[2:] for cells in ([c.strip() for c in ln.split("│")] for ln in out.splitlines()
                                              if ln.startswith("│"))}
    assert rows["2"][4] == "75.0 %"  # measured: 150 / (2 x 100)
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--results", str(raw), "--out", str(tmp_path / "rep")])
    assert e.value.code == 0, capsys.readouterr().err
    assert "75.0 %" in (tmp_path / "rep" / "REPORT.md").read_text().split("## Predicted")[1]


def test_predict_uses_the_curve_measured_at_each_n_or_the_nearest_and_says_which(tmp_path, capsys):
    """A bus bandwidth measured at 2 ranks says little about 8 (a longer ring, another topology): each N takes the
    curve measured at N, else the nearest world size measured (log scale, a tie to the larger), and the table names
    it. Before, the largest N's curve served every N."""
    from tests.test_report import make, write

    raw = write(tmp_path, make("single", 1, 100.0, device="cpu", model="resnet18"),
                make("ddp", 2, 150.0, device="cpu", model="resnet18"))
    _collectives_record(raw, busbw=4.0, world_size=2)
    _collectives_record(raw, busbw=1.0, world_size=4)
    assert [predict.nearest_curve({2: [], 4: []}, n) for n in (1, 2, 3, 4, 8, 64)] == [2, 2, 4, 4, 4, 4]
    assert predict.nearest_curve({2: [], 8: []}, 4) == 8  # as far from both: the larger
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--results", str(raw), "--world-sizes", "2,3,8"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    rows = {cells[1]: cells[2:] for cells in ([c.strip() for c in ln.split("│")] for ln in out.splitlines()
                                              if ln.startswith("│"))}
    grad = 4 * flops.parameter_count("resnet18")
    for n, at, busbw in (("2", "2 ranks", 4.0), ("3", "4 ranks", 1.0), ("8", "4 ranks", 1.0)):
        t_ar = predict.allreduce_seconds(grad, int(n), [(2 ** 20, busbw), (2 ** 26, busbw)], 25 * 2 ** 20)
        assert rows[n][:2] == [at, f"{1000 * t_ar:.1f}"], n


def test_predict_without_inputs_is_bad_input(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--results", str(tmp_path / "raw")])
    assert e.value.code == 2 and "needs an ok single@1 record and a `bench collectives`" in capsys.readouterr().err


def test_report_sections_for_communication_hardware_collectives_and_prediction(tmp_path, capsys):
    from bench.commands import report
    from tests.test_report import make, write

    co = lambda thr: [64 * 2 * 10 / thr] * 3  # noqa: E731 - windows at a given global img/s, 2 GPUs
    raw = write(tmp_path, make("single", 1, 100.0, model="resnet18", flops_per_sample=2.0e9,
                               peak_tflops_per_device=989.4, joules_per_image=0.5, mean_watts=600.0),
                make("ddp", 2, 180.0, model="resnet18", compute_only_window_seconds=co(190.0),
                     compute_only={"measured": True, "reason": None, "keeps": None}, flops_per_sample=2.0e9,
                     peak_tflops_per_device=989.4),
                make("ds_zero3", 2, 150.0, model="resnet18",
                     compute_only={"measured": False, "reason": "no way to skip", "keeps": None}))
    _collectives_record(raw)
    code = report.cmd_report(argparse.Namespace(results=str(raw), out=str(tmp_path / "rep")))
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert "| ddp | 2 | fp32 | 180.0 img/s | 190.0 img/s | 37.4 ms | 5.3 % | 5.0 % | 5.0 % |  |" in md
    assert "| ds_zero3 | 2 | fp32 | 150.0 img/s |  |  |  |  |  | not measured: no way to skip |" in md
    mfu = 100 * 2.0e9 * 100.0 / 989.4e12
    assert f"| single | 1 | fp32 | 2.00 GFLOP | 200.0 GFLOP/s | {mfu:.1f} % | 0.500 J | 600 W |" in md
    assert "## Collectives (bench collectives)" in md and "| 1 MiB | 2.000 |" in md
    assert "## Predicted vs measured scaling (bench predict)" not in md  # the collectives are CPU, the runs GPU
    assert len(list((tmp_path / "rep" / "plots").glob("*comm-split.png"))) == 1


def test_horovod_allreduce_is_timed_through_its_async_handles_back_to_back():
    """Like NCCL's loop (nccl-tests: operations queued back to back, one synchronize), Horovod's is timed through its
    async handles: every timed allreduce_async_ is enqueued before the first is waited for. allreduce_, one call and one
    wait at a time, timed a host round trip per operation that NCCL's loop does not pay."""
    import torch

    from bench.rank import collectives

    events = []

    class Hvd:
        Sum = "sum"

        def allreduce_async_(self, x, op=None):
            events.append("enqueue")
            return len(events)

        def synchronize(self, handle):
            events.append("wait")

    class Backend:
        hvd = Hvd()

        def barrier(self):
            events.append("barrier")

    seconds = collectives._time("horovod_allreduce", 4096, 2, torch.device("cpu"), Backend(), warmup=2, iters=3)
    assert seconds > 0
    assert events == ["enqueue"] * 2 + ["wait"] * 2 + ["barrier"] + ["enqueue"] * 3 + ["wait"] * 3
    assert "allreduce_async_ handles enqueued back to back" in collectives.TIMING


@pytest.mark.slow
def test_collectives_over_gloo_and_horovod(tmp_path):
    proc = bench("collectives", "--gpus", 2, "--device", "cpu", "--max-bytes", "64K", "--iters", 2, "--warmup", 1,
                 "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["backend"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "collectives").glob("*.json"))}
    gloo = recs["ddp"]
    assert (gloo["process_group"], gloo["world_size"], gloo["status"]) == ("gloo", 2, "ok")
    assert {(r["op"], r["bytes"]) for r in gloo["results"]} == {
        (op, b) for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast") for b in (4096, 16384, 65536)}
    factor = {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}  # n = 2
    for r in gloo["results"]:
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor[r["op"]])
    if "horovod" in recs:  # built by make install; skipped with its reason otherwise
        assert {r["op"] for r in recs["horovod"]["results"]} == {"horovod_allreduce"}
    assert "busbw GB/s" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--gpus", "1"], "bench: error: nothing to run: collectives need at least 2 ranks; got --gpus 1"),
    (["--ops", "all_to_all"], "bench: error: --ops 'all_to_all': unknown collective all_to_all; choose from all_reduce, "
                              "reduce_scatter"),
    (["--max-bytes", "lots"], "bench: error: message size 'lots': expected bytes or a size such as 4K, 16M, 1G"),
])
def test_collectives_bad_input(tmp_path, args, message, capsys):
    code, err = cli_error(capsys, "collectives", "--device", "cpu", *args, "--results", tmp_path)
    assert code == 2 and err.startswith(message), err


def test_the_communication_sections_use_the_size_each_run_had(tmp_path, capsys):
    """A user's model (``pkg.mod:factory``) crashed the report's communication sections (its size
    was counted by name), and a GPT's gradient was counted at sequence length 64 whatever the run used. The size is
    the run's own now: a one-process run's state_bytes, else counted at the record's seq_len; a model whose size no
    record gives is named, with the reason, instead of a crash."""
    from bench.commands import report
    from bench.core import workloads
    from tests.test_report import make, write

    user, unsized = "tests.user_model:factory", "pkg.models:mine"
    user_bytes = 4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10)  # tests/user_model.py's parameters, fp32
    gpt_bytes = 4 * workloads.gpt_parameters("gpt-small", 256)
    assert gpt_bytes != 4 * workloads.gpt_parameters("gpt-small", 64)  # what the old count used
    state = lambda b: {"parameters": b, "gradients": b, "optimizer_state": 2 * b}  # noqa: E731
    lang = dict(device="cpu", image_size=None)
    recs = [make("single", 1, 100.0, model=user, state_bytes=[state(user_bytes)], **lang),
            make("ddp", 2, 150.0, model=user, state_bytes=[state(user_bytes)] * 2, **lang),
            make("single", 1, 40.0, model="gpt-small", seq_len=256, **lang),  # a record from before state_bytes
            make("ddp", 2, 60.0, model="gpt-small", seq_len=256, **lang),
            make("single", 1, 80.0, model=unsized, **lang)]  # a user's model, no state_bytes: size unknown
    why = (f"{unsized} is a user's model, whose size only a one-process run's record gives (state_bytes), and this "
           "one has none")
    # a run of two ranks gives no size: a sharded backend's ranks hold shares of it
    assert [predict.gradient_bytes(r)[0] for r in recs] == [user_bytes, None, gpt_bytes, gpt_bytes, None]
    assert predict.gradient_bytes(recs[-1]) == (None, why)
    assert predict.gradient_bytes(recs[0])[1] == "the run's parameters (state_bytes)"
    raw = write(tmp_path, *recs)
    _collectives_record(raw)

    warned = []
    kept = {i["model"]: (i["grad_bytes"], i["seq_len"]) for i in predict.inputs(raw, warned.append, unsized=True)}
    assert kept == {user: (user_bytes, None), "gpt-small": (gpt_bytes, 256), unsized: (None, None)} and not warned
    assert {i["model"] for i in predict.inputs(raw, warned.append)} == {user, "gpt-small"}
    assert warned == [f"no prediction for {unsized}: {why}"]

    code = report.cmd_report(argparse.Namespace(results=str(raw), out=str(tmp_path / "rep")))
    assert code == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert (f"**{user} b64/device fp32 on CPU: Xeon**: t_compute 640.0 ms (single@1), gradient "
            f"{user_bytes / 2 ** 20:.1f} MiB (the run's parameters (state_bytes)) in 25 MiB buckets") in md
    assert (f"**gpt-small seq 256 b64/device fp32 on CPU: Xeon**: t_compute 1600.0 ms (single@1), gradient "
            f"{gpt_bytes / 2 ** 20:.1f} MiB (4 bytes x the model's parameters) in 25 MiB buckets") in md
    assert f"**{unsized} b64/device fp32 on CPU: Xeon**: no prediction: {why}" in md
    assert f"- {unsized}: gradient size unknown, not drawn: {why}" in md
    # the collectives plot's dashed lines: one per model, a GPT's at its sequence length
    from bench.report.summary import summarise, usable_records

    rows = summarise(usable_records(raw, warned.append)).to_dict("records")
    assert comm.gradient_sizes(rows) == ({user: user_bytes, "gpt-small seq 256": gpt_bytes}, {unsized: why})

"""fp16 loss scaling agrees across ranks: an inf in one rank's gradients only (BENCH_FAULT's ``overflow@rank1:step3``,
before any reduction) makes every rank skip that step and keep equal scales, for every backend that runs fp16 with a
loss scaler across ranks. ``single`` and ``dp`` are one process; ``ddp_spawn`` is ``ddp``'s class under another
launcher. Where a backend cannot agree (DeepSpeed's torch_autocast section at stages 1-2), its fp16 runs at N >= 2 are
refused with the reason, and the test shows the disagreement that refusal is for.

fp16 on the CPU: autocast and GradScaler("cpu") run there (bench run refuses fp16 without CUDA), so the ranks drive the
backends as the timed loop does (tests/loss_scale_ranks.py), 2 gloo ranks started once by torch.multiprocessing.spawn
for every torch backend, and by horovodrun for Horovod. What this does not cover: CUDA's fp16 kernels and NCCL (the
scaler's logic and the reductions that carry the inf are the same code); an overflow that arises in fp16 activations
rather than one put into a gradient."""
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, skip_without

DISAGREE = ["ds_zero1", "ds_zero2"]  # DeepSpeed's torch_autocast GradScaler checks this rank's partition alone
# ZeRO-3 last, and once: it leaves the process changed (torch.nn.functional.linear replaced, module classes patched), so
# an engine built after it in the same process trains another model and an injected overflow may not reach it. Its
# fp16 section (--ds-mp params) runs the same all-reduced check as its autocast case (stage3.py step(), has_overflow).
AGREE = ["ddp", "ddp_amp_syncbn", "ddp_zero", "allreduce_manual", "fsdp2", "fsdp2:fsdp_mp=params",
         "ds_zero1:ds_mp=params", "ds_zero2:ds_mp=params", "ds_zero3"]
INJECTED = 3  # the step the fault poisons (tests/loss_scale_ranks.py FAULT)


def _key(case: str) -> str:
    name, _, option = case.partition(":")
    key, _, value = option.partition("=")
    return name + (f":{json.dumps({key: value})}" if option else "")


@pytest.fixture(scope="module")
def trails(tmp_path_factory):
    skip_without("deepspeed")
    from bench.launch.run import free_port
    from tests import loss_scale_ranks

    out = tmp_path_factory.mktemp("loss_scale") / "seen.json"
    torch.multiprocessing.spawn(loss_scale_ranks.spawned, args=(free_port(), AGREE[:-1] + DISAGREE + AGREE[-1:], str(out)), nprocs=2,
                                join=True)
    return json.loads(out.read_text())


def _half_params_refused(case: str, ranks: list) -> bool:
    """DeepSpeed's half-parameter model at fp16 needs oneDNN's fp16 on a CPU (tests/test_numerics.py): where it has
    none, that refusal in DeepSpeed's own words is this case's whole result."""
    if "ds_mp" not in case or torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return False
    assert ranks == [{"crashed": "ValueError: Type fp16 is not supported on your device."}], ranks
    return True


def assert_agree(case: str, ranks: list) -> None:
    crashed = [r["crashed"] for r in ranks if "crashed" in r]
    assert not crashed, f"{case}: {crashed}"
    assert len(ranks) == 2
    zero, one = (r["trail"] for r in ranks)
    assert zero == one, f"{case}: the ranks' (loss scale, skipped) per step differ: {zero} vs {one}"
    assert [skipped for _, skipped in zero] == [0] * (INJECTED - 1) + [1] + [0] * (len(zero) - INJECTED), case
    assert ranks[0]["checksum"] == ranks[1]["checksum"], case


@pytest.mark.slow
@pytest.mark.parametrize("case", AGREE)
def test_an_overflow_on_one_rank_is_skipped_by_every_rank_at_equal_scales(trails, case):
    ranks = trails[_key(case)]
    if _half_params_refused(case, ranks):
        return
    assert_agree(case, ranks)
    scales = [scale for scale, _ in ranks[0]["trail"]]
    if not case.startswith("ds_zero"):  # a GradScaler: halved at the skip, on every rank
        assert scales[INJECTED - 1] == scales[INJECTED - 2] / 2, (case, scales)


@pytest.mark.slow
@pytest.mark.parametrize("case", DISAGREE)
def test_deepspeed_autocast_fp16_disagrees_across_ranks_so_it_is_refused_at_two_or_more(trails, case):
    """The disagreement itself (the reason for the refusal): the rank whose partition holds the inf skips and halves
    its scale, the other steps on; the replica checksum still passes, because the parameters are all-gathered. If a
    DeepSpeed release makes them agree, this fails, and the refusal should go."""
    import backends
    from bench.core.config import RunConfig

    zero, one = (r["trail"] for r in trails[case])
    assert zero != one and {zero[INJECTED - 1][1], one[INJECTED - 1][1]} == {0, 1}, (zero, one)
    assert zero[-1][0] != one[-1][0]  # their loss scales differ from then on
    assert trails[case][0]["checksum"] == trails[case][1]["checksum"]

    b = backends.create(case)
    cfg = lambda **kw: RunConfig(**{**dict(backend=case, launcher="torchrun", world_size=2, device_type="cuda",  # noqa: E731
                                           model="gpt-micro", image_size=None, seq_len=16, batch_size=2, warmup=2,
                                           steps=1, windows=1, precision="fp16"), **kw}).validate()
    from importlib.metadata import version

    assert b.unavailable(cfg()) == (
        f"{case} at fp16 under --ds-mp autocast runs at world size 1 only: DeepSpeed {version('deepspeed')}'s "
        "torch_autocast GradScaler looks for an overflow in this rank's gradient partition alone, so one rank skips a "
        "step and halves its loss scale while another steps on; use --ds-mp params (DeepSpeed's fp16 section: one "
        "overflow check over every rank) or --precision bf16")
    for fine in (cfg(world_size=1), cfg(options={"ds_mp": "params"}), cfg(precision="bf16")):
        assert b.unavailable(fine) is None, fine


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_skips_an_overflow_on_one_rank_on_every_rank(tmp_path):
    """Horovod's documented AMP pattern (optimizer.synchronize() before scaler.step): the inf is in the allreduced
    gradient on every rank. Its ranks are Horovod's own, started by horovodrun over gloo."""
    skip_without("horovod")
    out = tmp_path / "seen.json"
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable, "-m", "tests.loss_scale_ranks", str(out), "horovod"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_agree("horovod", json.loads(out.read_text())["horovod"])

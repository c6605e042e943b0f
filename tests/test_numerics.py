"""One numerics rule, measured (bench/rank/numerics.py): which dtype each backend's norms, attention, residual stream
and loss ran in, read from a real training step; the verdict names no winner between backends that compute
differently at the same precision flag."""
import pytest

from tests.conftest import bench_inproc, records

AUTOCAST = {"matmul": "bfloat16", "norm": "float32", "attention": "bfloat16", "loss": "float32",
            "norm_params": "float32", "residual": "float32"}
HALF = {**AUTOCAST, "norm": "bfloat16", "norm_params": "bfloat16", "residual": "bfloat16"}


@pytest.mark.slow
def test_autocast_keeps_norms_and_the_residual_stream_fp32_and_half_parameters_do_not(tmp_path):
    proc = bench_inproc("run", "--backends", "ddp,fsdp2,ds_zero2", "--gpus", 1, "--device", "cpu", "--model",
                        "gpt-micro", "--seq-len", 32, "--batch-size", 2, "--warmup", 2, "--steps", 1, "--windows", 2,
                        "--precision", "bf16", "--results", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = {r["backend"]: r["numerics"] for r in records(tmp_path)}
    for name, expected in (("ddp", AUTOCAST), ("fsdp2", HALF), ("ds_zero2", HALF)):
        assert {k: got[name][k] for k in expected} == expected, name
    assert got["ddp"]["signature"] == ("matmul bfloat16, norm float32, attention bfloat16, loss float32, norm_params "
                                       "float32, residual float32")
    assert got["fsdp2"]["signature"] == got["ds_zero2"]["signature"] != got["ddp"]["signature"]


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

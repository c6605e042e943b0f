"""bench overhead: each backend's fixed host cost per step (a negligible model, one process, interleaved rounds),
and a guard on it: a backend whose cost per step, as a multiple of single's, grows by more than GROWTH over the
reference measured when it was last looked at fails here, so a change that adds per-step host work (a hook, a copy,
a collective, a Python loop over parameters) is noticed. The references are ratios to single in the same process, so
they carry from one CPU to another better than times do; GROWTH leaves room for a loaded machine."""
import json

import pytest

import backends
from tests.conftest import bench_inproc, cli_error

# cpu_us_per_step / single's, measured with `bench overhead` (7 rounds of 100 steps) three times on a 2-core x86-64
# VM beside other work (load average 4-8; torch 2.15 CPU); the median of the three. Issue 46: fused optimizers
# (single's step 1.4x cheaper), and each backend charged its own cost only (DeepSpeed's import and ZeRO-3's
# replacement of F.linear had slowed every backend in the process, single 2.4x), so the ratios rose for all but dp
REFERENCE = {"single": 1.0, "dp": 0.97, "ddp": 1.62, "ddp_spawn": 1.64, "horovod": 1.03, "fsdp2": 5.15,
             "ds_zero1": 3.39, "ds_zero2": 3.34, "ds_zero3": 9.53, "ddp_zero": 2.20, "allreduce_manual": 2.37}
GROWTH = 1.75


@pytest.fixture(scope="module")
def overhead(tmp_path_factory):
    out = tmp_path_factory.mktemp("overhead")
    proc = bench_inproc("overhead", "--steps", 40, "--rounds", 5, "--results", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = (out / "overhead").glob("*.json")
    return json.loads(path.read_text()), proc.stdout


@pytest.mark.slow
def test_every_backend_is_timed_beside_single_in_one_record(overhead):
    rec, out = overhead
    assert rec["schema"] == "overhead-1" and rec["threads"] == 1 and rec["device_type"] == "cpu"
    rows = {r["backend"]: r for r in rec["rows"]}
    assert list(rows) == backends.names()  # single first: the registry's first backend is the baseline
    for name, row in rows.items():
        if row["status"] != "ok":
            assert row["status"] == "skipped" and row["reason"], name  # ddp_amp_syncbn on a CPU; horovod unbuilt
            continue
        assert len(row["cpu_s"]) == len(row["wall_s"]) == 5 and row["cpu_us_per_step"] > 0, name
        assert row["vs_single"] == pytest.approx(row["cpu_us_per_step"] / rows["single"]["cpu_us_per_step"], rel=1e-6)
        assert row["backend_info"]["grad_scaler"] is False, name
    assert rows["single"]["vs_single"] == 1.0
    assert "| backend | host µs / step (CPU) | wall µs / step | vs single | note |" in out
    assert rows["fsdp2"]["backend_info"]["reshard_after_forward"] == "never"  # world size 1
    assert rows["fsdp2"]["backend_info"]["fsdp_groups"] == 4  # three blocks and the root
    # ZeRO-3 replaces torch.nn.functional.linear for the whole process: put back only while ds_zero3 is timed
    assert {name: row["patches"] for name, row in rows.items() if row["status"] == "ok" and row["patches"]} == (
        {"ds_zero3": ["torch.nn.functional.linear"]} if rows["ds_zero3"]["status"] == "ok" else {})
    assert {row["backend_info"]["optimizer_impl"] for row in rows.values() if row["status"] == "ok"} == {"fused"}


def growth(rec: dict) -> dict:
    """Each timed backend's cost per step as a multiple of single's, over its REFERENCE."""
    return {r["backend"]: round(r["vs_single"] / REFERENCE[r["backend"]], 2) for r in rec["rows"]
            if r["status"] == "ok" and r["backend"] in REFERENCE}


@pytest.mark.slow
def test_no_backend_s_host_cost_per_step_grew_by_more_than_the_stated_factor(overhead, tmp_path):
    """A backend over GROWTH is timed again beside single, at most twice, and its lowest growth counts: a busy
    machine inflates some rounds (make test runs this beside another worker's runs: allreduce_manual read 1.77 once,
    1.75 allowed), while work a change added to every step shows in every measurement."""
    rec, _ = overhead
    grew = growth(rec)
    assert set(grew) >= set(REFERENCE) - {"horovod"}, grew  # every backend that runs on a CPU was timed
    seen = {name: [g] for name, g in grew.items()}
    for attempt in range(2):
        over = sorted(name for name, g in seen.items() if min(g) > GROWTH)
        if not over:
            break
        out = tmp_path / f"again{attempt}"
        proc = bench_inproc("overhead", "--backends", ",".join(["single", *over]), "--steps", 40, "--rounds", 5,
                            "--results", out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [path] = (out / "overhead").glob("*.json")
        for name, g in growth(json.loads(path.read_text())).items():
            seen[name].append(g)
    assert {name: g for name, g in seen.items() if min(g) > GROWTH} == {}, seen


@pytest.mark.slow
def test_the_report_shows_the_newest_overhead_record(overhead, tmp_path):
    from tests.test_report import make, run_report, write

    rec, _ = overhead
    raw = write(tmp_path, make("ddp", 2, 100.0, device="cpu"))
    (raw / "overhead").mkdir()
    (raw / "overhead" / "20260101T000000Z-old.json").write_text(json.dumps({**rec, "model": "an older one"}))
    (raw / "overhead" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    assert run_report(raw, tmp_path / "rep")[0] == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    section = md.split("## Host overhead per step (bench overhead)\n", 1)[1]
    assert "backends.models.overhead:factory at batch 4" in section.split("\n\n")[0]
    assert "| backend | host µs / step (CPU) | wall µs / step | vs single | note |" in section
    assert "| single |" in section and "| 1.00 |" in section


def test_every_registered_backend_has_a_reference_or_cannot_run_on_a_cpu():
    # a new backend gets its reference when it is added (bench overhead prints it)
    assert set(backends.names()) - set(REFERENCE) == {"ddp_amp_syncbn"}


def test_bad_input_is_one_line(capsys):
    code, err = cli_error(capsys, "overhead", "--steps", 0)
    assert (code, err) == (2, "bench: error: --steps must be a positive integer, got 0\n")
    code, err = cli_error(capsys, "overhead", "--backends", "nope")
    assert code == 2 and err.startswith("bench: error: --backends 'nope': unknown backend nope; choose from single, dp,")


@pytest.mark.mutation
def test_a_backends_process_wide_patch_is_applied_only_while_it_is_timed():
    """One process times every backend: a function one backend replaces for the whole process (DeepSpeed ZeRO-3's
    torch.nn.functional.linear) must not slow the others' steps."""
    import torch

    from bench.rank import overhead

    pristine = overhead.patch_points()
    mine = lambda *a, **k: None  # noqa: E731 - what a backend puts in place of F.linear
    original = torch.nn.functional.linear
    try:
        torch.nn.functional.linear = mine
        own = overhead.replaced(pristine, overhead.patch_points())
        assert own == {(torch.nn.functional, "linear"): mine}
        assert [overhead.patch_name(k) for k in own] == ["torch.nn.functional.linear"]
        overhead.apply({k: pristine[k] for k in own})  # undone for the other backends
        assert torch.nn.functional.linear is original
        overhead.apply(own)  # its own, while it is timed
        assert torch.nn.functional.linear is mine
    finally:
        torch.nn.functional.linear = original

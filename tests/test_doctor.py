"""bench doctor (make gpu-check): its launch plan (every registered backend, from the registry), the session fixture
that runs the plan once for every xdist worker, the gpu tests' log of every reason and its budget stop, the one table
(failures grouped, what did not run named, the verdict last) and the whole command on a fake GPU machine. The real check
runs on a GPU machine only; everything it decides is checked here."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import backends
from bench.plan import gpu_check as gpu_plan
from bench.commands import doctor
from tests.conftest import REPO, bench_inproc, cli_error
from tests.fake_gpu import FakeGpuMachine

GiB = 2 ** 30


def fake_cuda(monkeypatch, n):
    from bench.plan import sweep as _plan  # the planner bench run and bench doctor share

    monkeypatch.setattr(_plan, "detect_device", lambda requested: ("cuda", n))


# -- the launch plan -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [1, 2])
def test_the_plan_covers_every_registered_backend_at_bf16_fp16_fp32_and_two_ranks(gpus):
    plan = gpu_plan.launches(gpus)
    names = [x.name for x in plan]
    assert len(names) == len(set(names))
    for b in backends.names():
        for precision in ("bf16", "fp16"):
            [x] = [x for x in plan if x.name == f"{b}-{precision}"]
            assert x.backends == (b,) and x.column == precision and dict(x.env) == gpu_plan.MEMORY_PROBE
            assert x.argv[x.argv.index("--precision") + 1] == precision and x.argv[:3] == ("run", "--backends", b)
        [verify] = [x for x in plan if x.column == "fp32 (verify)" and b in x.backends]
        assert verify.argv[0] == "verify" and verify.trees == 1 + len(verify.backends)
        two = [x for x in plan if x.column == "2 ranks" and x.backends == (b,)]
        # one GPU: the backends that can share it; two: every backend that runs at 2
        assert len(two) == (gpu_plan.runs_at_two(b) and (gpus == 2 or gpu_plan.shares_a_gpu(b)))
        if two and gpus == 1:
            assert "--ranks-per-gpu" in two[0].argv
    assert [b for b in backends.names() if gpu_plan.shares_a_gpu(b)] == [
        "ddp", "ddp_spawn", "ddp_amp_syncbn", "ddp_zero", "allreduce_manual"]
    single_purpose = {"cudnn-off", "energy-span", "decode-torchvision", "decode-dali", "ddp-hook-powersgd",
                      "ddp-hook-fp16", "trace-hta", "gpt-memory"}
    assert single_purpose <= set(names)
    two_gpus = {"deepspeed-2gpus-fp32", "deepspeed-2gpus-fp16", "deepspeed-2gpus-fp16-params", "fsdp2-2gpus-fp16",
                "horovod-2gpus", "dp-2gpus", "dp-energy", "collectives-2gpus"}
    assert (two_gpus <= set(names)) is (gpus == 2) and (two_gpus & set(names) == set()) is (gpus == 1)
    assert all(x.gpus <= gpus for x in plan)


def test_a_new_backend_joins_the_plan_with_no_edit(monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, "extra", {"cls": "tests.backends.extra_backend:Extra",
                                                     "launcher": "torchrun"})
    names = {x.name for x in gpu_plan.launches(1)}
    assert {"extra-bf16", "extra-fp16"} <= names
    assert any("extra" in x.backends for x in gpu_plan.launches(1) if x.column == "fp32 (verify)")


def test_the_plan_s_count_and_estimate():
    plan = gpu_plan.launches(1)
    trees = sum(x.trees for x in plan)
    assert gpu_plan.estimate_seconds(plan, 4) == pytest.approx(gpu_plan.SECONDS_PER_TREE * trees / 4)
    assert gpu_plan.estimate_seconds(plan, 1) == pytest.approx(gpu_plan.SECONDS_PER_TREE * trees)
    assert [gpu_plan.default_jobs(c) for c in (1, 2, 4, 8, 16, 32, 64)] == [1, 1, 1, 2, 4, 8, 8]
    x = next(x for x in plan if x.name == "ddp-bf16")
    assert x.shell() == ("BENCH_FAULT=bloat@rank0:step3 python -m bench run --backends ddp --gpus 1 --device cuda "
                         "--model resnet18 --image-size 64 --batch-size 16 --warmup 3 --steps 3 --windows 3 "
                         "--precision bf16 --skip-peak --results results/doctor/alone")
    assert all(x.argv[-1] == "--skip-peak" for x in plan if x.argv[0] == "run")  # they share the GPU


def test_skip_peak_asks_the_ranks_for_no_peak(monkeypatch, tmp_path, capsys):
    from bench import launch

    from bench.core import results

    specs = []

    def run_one(cfg, results_dir, env_meta, backend, extra_spec=None, **kw):
        specs.append(extra_spec)
        return {**results.skeleton(cfg.to_dict(), "x", env_meta), "status": "skipped", "reason": "not run here"}

    monkeypatch.setattr(launch, "run_one", run_one)
    for skip in (True, False):
        bench_inproc("run", "--backends", "single", "--device", "cpu", "--gpus", "1", *(["--skip-peak"] * skip),
                     "--results", tmp_path / str(skip))
    assert specs[0]["peak"] is None and specs[1]["peak"]["cache"]
    code, err = cli_error(capsys, "run", "--skip-peak", "--refresh-peak")
    assert (code, err) == (2, "bench: error: --skip-peak measures no matmul peak and --refresh-peak measures it "
                              "again: give one\n")


@pytest.mark.slow
def test_the_plan_runs_launches_at_once_on_their_own_cores_and_leaves_out_what_the_deadline_cuts(tmp_path):
    """The runner with stand-in launches (a `bench` command that fails in a second, one that sleeps): each launch in its
    own folder with its log, on its slice of the cores, at most `jobs` at once; past the deadline nothing starts."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    quick = gpu_plan.Launch("quick", ("run", "--backends", "nope"), "an unknown backend", ("single",), "bf16")
    bad = gpu_plan.Launch("bad", ("run", "--gpus", "0"), "a bad world size")
    late = gpu_plan.Launch("late", ("run",), "never started")
    missing = gpu_plan.Launch("missing", ("run", "--backends", "horovod"), "a backend this machine lacks", ("horovod",))
    said = []
    why = lambda argv: "horovod is not installed (make horovod)" if "horovod" in argv else None  # noqa: E731
    # the plan's clock passes the deadline (1.0) once two launches have started, however long starting them took
    # (a deadline 0.1 s of real time away once passed before the second had started, on a slow hour)
    clock = lambda: 2.0 if sum(": started (" in line for line in said) >= 2 else 0.0  # noqa: E731
    manifest = gpu_plan.run([quick, bad, missing, late], tmp_path, jobs=2, deadline=1.0, say=said.append,
                            cpus=cpus, skip=why, clock=clock)
    assert manifest["complete"] is True and manifest["jobs"] == min(2, len(cpus))
    got = manifest["launches"]
    assert got["quick"]["status"] == "failed" and got["quick"]["rc"] == 2 and got["bad"]["status"] == "failed"
    assert got["late"]["status"] == gpu_plan.NOT_RUN
    assert "unknown backend" in Path(got["quick"]["log"]).read_text()
    assert got["quick"]["command"].startswith("python -m bench run --backends nope --results")
    jobs = min(2, len(cpus))
    assert sorted(got[n]["slot"] for n in ("quick", "bad")) == list(range(jobs))
    assert all(got[n]["cpus"] == cpus[got[n]["slot"]::jobs] for n in ("quick", "bad"))
    # a launch whose every run would be skipped here is not started, with its reason
    assert {k: got["missing"][k] for k in ("status", "reason", "rc", "slot", "cpus")} == {
        "status": gpu_plan.SKIPPED, "reason": "horovod is not installed (make horovod)", "rc": None, "slot": None,
        "cpus": []}
    assert not Path(got["missing"]["log"]).exists()
    assert "[plan] missing: skipped (horovod is not installed (make horovod))" in said
    assert json.loads((tmp_path / gpu_plan.MANIFEST).read_text()) == manifest
    assert any(line.startswith("[plan] quick: started") for line in said)
    assert (tmp_path / "imagenet" / "train").is_dir()  # the decode launches' folder


def test_a_launch_its_command_would_refuse_as_nothing_to_run_is_known_before_it_starts(monkeypatch, tmp_path, capsys):
    """The H100 at b7f3632 started horovod-bf16, horovod-fp16 and decode-dali on a machine with no Horovod build and no
    DALI: each exited 2 ("nothing to run"), and the table called them failed and their tests failed. The plan now asks
    bench run's and bench verify's own planners first, on the fake GPU machine's device count; what they print, and
    what they set in the environment, stay there; a question they cannot answer starts the launch."""
    from backends import horovod
    from bench.rank import loaders

    FakeGpuMachine([__import__("tests.fake_gpu", fromlist=["FakeGpu"]).FakeGpu()]).install(monkeypatch)
    monkeypatch.setattr(horovod, "problem", lambda: "horovod is not installed (make horovod)")
    monkeypatch.setattr(loaders, "unavailable", lambda name: "NVIDIA DALI is not installed (pip install x)"
                        if name == "dali" else None)
    data = gpu_plan.image_tree(tmp_path / "imagenet")
    plan = {x.name: list(x.argv) for x in gpu_plan.launches(1, ["single", "horovod"], data_dir=str(data))}
    assert gpu_plan.skip_reason(plan["horovod-bf16"]) == "horovod is not installed (make horovod)"
    assert gpu_plan.skip_reason(plan["decode-dali"]) == "NVIDIA DALI is not installed (pip install x)"
    assert gpu_plan.skip_reason(plan["single-bf16"]) is None
    assert gpu_plan.skip_reason(plan["decode-torchvision"]) is None
    assert gpu_plan.skip_reason(plan["verify-1"]) is None  # single
    assert gpu_plan.skip_reason(plan["verify-horovod"]) == "horovod is not installed (make horovod)"  # its own
    assert gpu_plan.skip_reason(["run", "--backends", "nope"]) is None  # refused: the launch says why itself
    assert gpu_plan.skip_reason(["collectives", "--gpus", "2"]) is None  # another command: started
    # bench run's own flags (the trace launch's --trace) are no reason to start it, and no usage text is printed
    traced = ["run", "--backends", "horovod", "--gpus", "1", *gpu_plan.GPU_RUN, "--trace", "2"]
    assert gpu_plan.skip_reason(traced) == "horovod is not installed (make horovod)"
    assert capsys.readouterr() == ("", "")

    def sets_the_environment():
        import os

        os.environ["BENCH_TEST_SET_BY_AN_IMPORT"] = "1"  # as `import deepspeed` sets PYTORCH_NVML_BASED_CUDA_CHECK
        print("a library's import-time line")
        return "horovod is not installed (make horovod)"

    monkeypatch.setattr(horovod, "problem", sets_the_environment)
    assert gpu_plan.skip_reason(plan["horovod-bf16"]) == "horovod is not installed (make horovod)"
    assert "BENCH_TEST_SET_BY_AN_IMPORT" not in __import__("os").environ
    assert capsys.readouterr() == ("", "")
    monkeypatch.setattr(horovod, "problem", lambda: 1 / 0)  # a build that breaks on import: the launch will say so
    assert gpu_plan.skip_reason(plan["horovod-bf16"]) is None
    monkeypatch.setattr(horovod, "problem", lambda: "horovod is not installed (make horovod)")
    from backends import deepspeed_zero

    monkeypatch.setattr(deepspeed_zero, "problem", lambda: "deepspeed is not installed")
    both = ["run", "--backends", "horovod,ds_zero1", "--gpus", "1", *gpu_plan.GPU_RUN]
    assert gpu_plan.skip_reason(both) == ("horovod: horovod is not installed (make horovod); "
                                          "ds_zero1: deepspeed is not installed")


# -- the fixture: the plan once for every xdist worker ------------------------------------------------------------

@pytest.mark.slow
def test_the_gpu_plan_fixture_runs_the_plan_once_for_several_xdist_workers(tmp_path):
    """Two test modules on two xdist workers both ask for the plan: one runs it (a stand-in runner that counts and
    takes a second), the other waits on the folder's lock and reads the same manifest."""
    tests = tmp_path / "t"
    tests.mkdir()
    runner = textwrap.dedent(f"""
        import json, os, time
        from pathlib import Path

        from tests.conftest import shared_gpu_plan


        def runner(folder):
            with open({str(tmp_path / "ran")!r}, "a") as f:
                f.write(os.environ.get("PYTEST_XDIST_WORKER", "?") + "\\n")
            time.sleep(1.0)
            manifest = {{"schema": 1, "complete": True, "launches": {{"x": {{"status": "ok"}}}}, "by": "one"}}
            (Path(folder) / "plan.json").write_text(json.dumps(manifest))
            return manifest


        def check():
            plan = shared_gpu_plan(runner=runner)
            assert plan.manifest["launches"] == {{"x": {{"status": "ok"}}}}
    """)
    for name in ("test_a.py", "test_b.py"):
        (tests / name).write_text(runner + "\n\ndef test_it():\n    check()\n")
    env = {**__import__("os").environ, "BENCH_GPU_PLAN_DIR": str(tmp_path / "plan"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadfile", "--rootdir", str(tests), str(tests)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    ran = (tmp_path / "ran").read_text().split()
    assert len(ran) == 1 and ran[0].startswith("gw"), ran  # one worker ran it; the other read it


# -- the gpu tests' log: every reason kept, a budget stop said --------------------------------------------------

SLOW_SUITE = {
    "test_a.py": """
        def run_gpus():
            raise ImportError("cannot import name '_visible_nvml_indices' from 'bench.core.results'")

        def test_fails_like_the_others():
            run_gpus()

        def test_fails_the_same_way():
            run_gpus()

        def test_passes():
            print("fine")
    """,
    "test_b.py": """
        import time

        def test_fails_its_own_way():
            assert 1 + 1 == 3, "arithmetic broke"

        def test_hangs():
            time.sleep(120)

        def test_never_starts():
            pass

        def test_never_starts_either():
            pass
    """,
}


@pytest.mark.slow
def test_a_run_cut_by_its_budget_keeps_every_reason_and_names_the_running_and_never_started(tmp_path, monkeypatch):
    """pytest stopped at its budget (SIGINT first: it still writes its JUnit XML): the failures' first error lines and
    last output lines, the test still running and those never started, and the identical failures grouped."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in SLOW_SUITE.items():
        (suite / name).write_text(textwrap.dedent(text))
    (suite / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (suite / "pytest.ini").write_text("[pytest]\n")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    t = doctor.run_tests(12, tmp_path / "out", test_timeout=600, jobs=1, paths=(str(suite),), marker="", cwd=suite)
    assert t["timed_out"] is True and t["seconds"] < 12 + doctor.SIGINT_GRACE_S + 30
    assert (t["passed"], t["failed"], t["skipped"]) == (1, 3, 0)
    errors = {f["test"].split("::")[1]: (f["error"], f["where"]) for f in t["failures"]}
    assert errors["test_fails_like_the_others"] == (
        "ImportError: cannot import name '_visible_nvml_indices' from 'bench.core.results'", "test_a.py:3")
    assert errors["test_fails_its_own_way"][0] == "AssertionError: arithmetic broke"
    assert any("raise ImportError" in line for f in t["failures"] for line in f["output"])
    assert [x.split("::")[1] for x in t["running"]] == ["test_hangs"]
    assert [x.split("::")[1] for x in t["never_started"]] == ["test_never_starts", "test_never_starts_either"]
    assert t["junit"] is not None and Path(t["junit"]).is_file()  # SIGINT: pytest still wrote its summary
    text, failed = doctor.report(None, tmp_path, [], t, [], False, True)
    assert failed is True
    lines = text.splitlines()
    i = lines.index("Failures (identical first lines grouped):")
    assert lines[i + 1] == ("1. 2 tests: ImportError: cannot import name '_visible_nvml_indices' from "
                            "'bench.core.results' (test_a.py:3)")
    assert lines[i + 3].startswith("2. 1 tests: AssertionError: arithmetic broke (test_b.py:")
    assert "stopped by the time budget with 1 running (test_b.py::test_hangs) and 2 never started" in text
    assert lines[-1] == "GPU machine NOT OK: 0 backends ran, 0 failed, 3 gpu tests failed"


# -- the table ---------------------------------------------------------------------------------------------------

def plan_folder(tmp_path, launches: dict, recs: dict) -> Path:
    """A plan's folder built by hand: the manifest's launches ((launch, status) or (launch, status, reason)) and each
    launch's records."""
    folder = tmp_path / "plan"
    manifest = {"schema": 1, "complete": True, "launches": {}}
    for name, (launch, status, *why) in launches.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        log = folder / f"{name}.log"
        log.write_text("bench: error: --device cuda: no CUDA device is visible here\n" if status == "failed" else "")
        manifest["launches"][name] = {"argv": list(launch.argv), "what": launch.what, "backends": list(launch.backends),
                                      "column": launch.column, "trees": launch.trees, "env": dict(launch.env),
                                      "results": str(folder / name), "log": str(log), "command": launch.shell(),
                                      "status": status, "reason": why[0] if why else None,
                                      "rc": 0 if status == "ok" else 2, "seconds": 1.0, "slot": 0, "cpus": [0]}
        for i, r in enumerate(recs.get(name, [])):
            (folder / name / f"r{i}.json").write_text(json.dumps(r))
    (folder / "plan.json").write_text(json.dumps(manifest))
    return folder


def ok_record(backend, precision="bf16", **extra):
    mem = {"rank": 0, "device_index": 0, "peak_allocated_bytes": GiB, "peak_reserved_bytes": 2 * GiB,
           "warmup_peak_allocated_bytes": GiB + 300 * 2 ** 20, "nvml_used_bytes": 3 * GiB, "nvml_used_reason": None}
    return {"backend": backend, "precision": precision, "status": "ok", "reason": None, "world_size": 1,
            "replicas_consistent": True, "memory": [mem], "machine": {"nvml": "ok", "gpus": [{"index": 0}]}, **extra}


def test_the_table_has_a_row_per_backend_groups_identical_failures_and_names_what_did_not_run(tmp_path):
    plan = {x.name: x for x in gpu_plan.launches(1, ["single", "ddp", "fsdp2", "horovod"])}
    driver = ("rank 0 exited with code 1; torchrun exit code 1 before rank 0 wrote the run's results; first error: "
              "RuntimeError: Found no NVIDIA driver on your system; last lines: ...; log /x/20261126T235100Z-ddp-w1-2fb81a.log")
    launches = {n: (x, "ok") for n, x in plan.items()}
    launches["fsdp2-fp16"] = (plan["fsdp2-fp16"], "failed")  # its harness stopped before any record
    launches["verify-3"] = (plan["verify-3"], gpu_plan.NOT_RUN)  # fsdp2's group
    launches["verify-horovod"] = (plan["verify-horovod"], gpu_plan.NOT_RUN)
    missing = "horovod is not installed (make horovod)"  # the plan did not start them (bench run would refuse them)
    launches["horovod-bf16"] = (plan["horovod-bf16"], gpu_plan.SKIPPED, missing)
    launches["horovod-fp16"] = (plan["horovod-fp16"], gpu_plan.SKIPPED, missing)
    recs = {"single-bf16": [ok_record("single")], "single-fp16": [ok_record("single", "fp16")],
            "ddp-bf16": [ok_record("ddp")], "ddp-fp16": [{**ok_record("ddp", "fp16"), "status": "failed",
                                                          "reason": driver}],
            "ddp-2ranks": [{**ok_record("ddp"), "status": "failed", "reason": driver.replace("2fb81a", "9c0d1e")}],
            "fsdp2-bf16": [{**ok_record("fsdp2"), "memory": [{**ok_record("x")["memory"][0],
                                                              "warmup_peak_allocated_bytes": GiB}]}],
            "verify-1": [{"kind": "verify", "rows": [{"backend": "single", "verdict": "pass"},
                                                     {"backend": "ddp", "verdict": "pass"}]}],
            "cudnn-off": [ok_record("single", "fp32")]}
    folder = plan_folder(tmp_path, launches, recs)
    manifest = json.loads((folder / "plan.json").read_text())
    text, failed = doctor.report(manifest, folder, ["single", "ddp", "fsdp2", "horovod"], None, [], False, False)
    assert failed is True
    lines = text.splitlines()
    assert lines[0] == "Backends (concurrent: a functional check, not a measurement):"
    assert lines[2] == "| backend | bf16 | fp16 | fp32 (verify) | 2 ranks | memory | NVML | this row alone |"
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in lines if ln.startswith("| ") and " | " in ln}
    assert rows["single"] == "| single | ok | ok | pass | — | ok | ok | python -m bench doctor --backends single |"
    assert rows["ddp"] == "| ddp | ok | failed | pass | failed | ok | ok | python -m bench doctor --backends ddp |"
    assert rows["fsdp2"] == ("| fsdp2 | ok | failed | not run (budget) | — | failed | ok | python -m bench doctor "
                             "--backends fsdp2 |")
    assert rows["horovod"] == ("| horovod | not built | not built | not run (budget) | — | — | — | python -m bench doctor "
                               "--backends horovod |")
    i = lines.index("Failures (identical first lines grouped):")
    assert lines[i + 1] == "1. 2 checks: RuntimeError: Found no NVIDIA driver on your system"
    assert lines[i + 2] == "   ddp fp16, ddp 2 ranks"
    assert lines[i + 3:i + 5] == ["2. 1 checks: bench: error: --device cuda: no CUDA device is visible here",
                                  "   fsdp2 fp16"]
    assert lines[i + 5].startswith("3. 1 checks: the memory probe's block is missing from the warm-up peak")
    assert f"horovod: not built ({doctor.HOROVOD_BUILD})" in lines
    assert lines[-1] == ("GPU machine NOT OK: 1 backend ran, 2 failed (ddp, fsdp2), 1 not built (horovod), "
                         "2 not run in the budget (fsdp2, horovod)")
    single_purpose = [ln for ln in lines if ln.startswith("| cudnn-off |")]
    assert single_purpose == ["| cudnn-off | cudnn.benchmark off is applied and recorded | ok | python -m bench run "
                              "--backends single --gpus 1 --device cuda --model resnet18 --image-size 64 --batch-size 16 "
                              "--warmup 3 --steps 3 --windows 3 --cudnn-benchmark off --skip-peak --results results/doctor/alone |"]


def test_a_machine_without_horovod_or_dali_passes_with_both_named(tmp_path):
    """The quick tier on a machine with no Horovod build and no DALI (the H100 at b7f3632): the launches the plan did
    not start say why, in their cells, and the verdict names them; the machine passes."""
    plan = {x.name: x for x in gpu_plan.launches(1, ["single", "horovod"])}
    missing, dali = "horovod is not installed (make horovod)", "NVIDIA DALI is not installed (pip install x)"
    launches = {n: (x, "ok") for n, x in plan.items()}
    launches.update({"horovod-bf16": (plan["horovod-bf16"], gpu_plan.SKIPPED, missing),
                     "horovod-fp16": (plan["horovod-fp16"], gpu_plan.SKIPPED, missing),
                     "verify-horovod": (plan["verify-horovod"], gpu_plan.SKIPPED, missing),  # its own launch
                     "decode-dali": (plan["decode-dali"], gpu_plan.SKIPPED, dali)})
    assert plan["verify-horovod"].backends == ("horovod",)
    recs = {"single-bf16": [ok_record("single")], "single-fp16": [ok_record("single", "fp16")],
            "verify-1": [{"kind": "verify", "rows": [{"backend": "single", "verdict": "pass"}]}]}
    folder = plan_folder(tmp_path, launches, recs)
    manifest = json.loads((folder / "plan.json").read_text())
    tests = {"passed": 9, "failed": 0, "skipped": 5, "failures": [], "skips": {}, "timed_out": False, "seconds": 26.0,
             "log": "x.log", "running": [], "never_started": []}
    text, failed = doctor.report(manifest, folder, ["single", "horovod"], tests, [], False, False)
    lines = text.splitlines()
    assert failed is False
    assert "| horovod | not built | not built | not built | — | — | — | python -m bench doctor --backends horovod |" in lines
    [row] = [ln for ln in lines if ln.startswith("| decode-dali |")]
    assert row.startswith(f"| decode-dali | DALI mixed decode | skipped: {dali} | python -m bench run ")
    assert "Failures (identical first lines grouped):" not in lines
    assert lines[-1] == ("GPU machine OK: 1 backend ran, 0 failed, 1 not built (horovod), 1 single-purpose launch "
                         "skipped (decode-dali)")


def test_the_verdict_of_a_clean_check_and_the_full_tier_s_baseline_offer(tmp_path):
    plan = {x.name: x for x in gpu_plan.launches(1, ["single"])}
    recs = {"single-bf16": [ok_record("single")], "single-fp16": [ok_record("single", "fp16")],
            "verify-1": [{"kind": "verify", "rows": [{"backend": "single", "verdict": "pass"}]}]}
    folder = plan_folder(tmp_path, {n: (x, "ok") for n, x in plan.items()}, recs)
    manifest = json.loads((folder / "plan.json").read_text())
    tests = {"passed": 20, "failed": 0, "skipped": 3, "failures": [], "skips": {}, "timed_out": False, "seconds": 40.0,
             "log": "x.log", "running": [], "never_started": []}
    text, failed = doctor.report(manifest, folder, ["single"], tests, [], True, True,
                                 "make baseline GPUS=1  (writes results/baselines/NVIDIA-H100-80GB-HBM3-x1.json)")
    assert failed is False
    assert text.splitlines()[-3:] == [
        "gpu tests: 20 passed, 0 failed, 3 skipped in 40 s (log: x.log)",
        "regression baseline for this GPU: make baseline GPUS=1  (writes results/baselines/NVIDIA-H100-80GB-HBM3-x1.json)",
        "GPU machine OK: 1 backend ran, 0 failed"]


@pytest.mark.slow
def test_the_whole_check_on_a_fake_gpu_machine(monkeypatch, tmp_path):
    """bench doctor on a fake machine of one H100, for two backends' rows: the estimate first, the launches really
    started (each a `python -m bench` that, with no GPU behind the fake, stops at its device check), their failures
    grouped under the table, the verdict last and exit 1. Horovod on this machine is a CPU build or none, so on a GPU
    every run of it would be skipped: its bf16 and fp16 launches are not started, and say why."""
    FakeGpuMachine([__import__("tests.fake_gpu", fromlist=["FakeGpu"]).FakeGpu()]).install(monkeypatch)
    proc = bench_inproc("doctor", "--backends", "ddp_zero,horovod", "--skip-tests", "--skip-sweep", "--jobs", "2",
                        "--results", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stderr.splitlines()[0]
    plan = gpu_plan.launches(1, ["ddp_zero", "horovod"])
    assert first == (f"doctor: quick tier on 1 GPU(s) (NVIDIA H100 80GB HBM3): {len(plan)} launches "
                     f"({sum(x.trees for x in plan)} process trees), 2 at once, about "
                     f"{gpu_plan.estimate_seconds(plan, 2):.0f} s; then the gpu tests on their records; budget 420 s")
    out = proc.stdout.splitlines()
    assert "| ddp_zero | failed | failed | failed | failed | — | — | python -m bench doctor --backends ddp_zero |" in out
    manifest = gpu_plan.load(tmp_path / "plan")
    assert set(manifest["launches"]) == {x.name for x in plan} and manifest["complete"] is True
    skipped = {n: x for n, x in manifest["launches"].items() if x["status"] == gpu_plan.SKIPPED}
    assert set(skipped) == {"horovod-bf16", "horovod-fp16", "verify-horovod"}  # horovod's verify: its own launch
    why = skipped["horovod-bf16"]["reason"]
    assert why and not (tmp_path / "plan" / "horovod-bf16.log").exists()
    assert f"doctor: [plan] horovod-bf16: skipped ({why})" in proc.stderr.splitlines()
    hvd = doctor.skipped("horovod", why)  # "not built", or why this build cannot run on a GPU
    assert f"| horovod | {hvd} | {hvd} | {hvd} | — | — | — | python -m bench doctor --backends horovod |" in out
    i = out.index("Failures (identical first lines grouped):")
    assert out[i + 1].startswith("1. 4 checks: bench: error: ")
    assert out[i + 2] == "   ddp_zero bf16, ddp_zero fp16, ddp_zero fp32 (verify), ddp_zero 2 ranks"
    assert out[-1] == ("GPU machine NOT OK: 0 backends ran, 1 failed (ddp_zero), "
                       + ("1 not built (horovod)" if hvd == "not built" else "1 skipped (horovod)"))
    assert (tmp_path / "doctor.md").read_text().splitlines()[-1] == out[-1]


# -- make gpu-check FULL=1: Horovod built beside the plan ---------------------------------------------------------

def test_the_full_tier_on_one_gpu_fits_10_minutes_by_its_printed_estimate():
    """Every backend's launches on one GPU of a 16-core machine (4 at once), Horovod built beside them at 8 compile
    jobs and its launches held until then, the gpu tests and the measured sweep of the default backends and Horovod."""
    launches = gpu_plan.launches(1)
    held = [x.name for x in launches if x.after]
    assert held == ["horovod-bf16", "horovod-fp16", "verify-horovod"] and {x.after for x in launches} == {"", gpu_plan.BUILD}
    assert all("horovod" not in x.backends for x in launches if x.column == "fp32 (verify)" and not x.after)
    measured = len(doctor.sweep_backends(backends.names(), "all", True))
    line = doctor.estimate_line("full", 1, "NVIDIA H200", launches, 4, 600.0, 8, measured, True)
    plan_s = gpu_plan.estimate_seconds(launches, 4, gpu_plan.BUILD_SECONDS)
    total = plan_s + doctor.TESTS_S + measured * doctor.MEASURED_RUN_S
    assert line == (f"doctor: full tier on 1 GPU(s) (NVIDIA H200): {len(launches)} launches "
                    f"({sum(x.trees for x in launches)} process trees), 4 at once, Horovod built beside them (8 compile "
                    f"jobs, about {gpu_plan.BUILD_SECONDS:.0f} s) and its 3 launches held until it ends, about "
                    f"{plan_s:.0f} s; then the gpu tests on their records (about {doctor.TESTS_S:.0f} s) and the "
                    f"measured sweep (6 runs, about {6 * doctor.MEASURED_RUN_S:.0f} s): about {total:.0f} s in all; "
                    "budget 600 s")
    assert total <= 600 and doctor.TIERS["full"]["budget_s"] == 600
    # a build slower than the rest of the plan decides when the plan ends
    assert gpu_plan.estimate_seconds(launches, 4, 1000.0) == 1000.0 + gpu_plan.SECONDS_PER_TREE * 2
    assert "(over it: what the budget leaves out fails)" in doctor.estimate_line(
        "full", 1, "x", launches, 1, 600.0, 8, measured, True)


def _build(tmp_path, script: str) -> gpu_plan.Build:
    """A stand-in build: a shell script in place of scripts/build_horovod.sh."""
    return gpu_plan.Build(gpu_plan.BUILD, ["sh", "-c", script], tmp_path / "horovod-build.log", what="a stand-in build")


@pytest.mark.slow
def test_launches_wait_for_the_build_beside_the_plan_and_fail_with_its_error(tmp_path):
    """The runner with stand-in launches (`bench` commands that fail in a second) and a stand-in build: a launch that
    needs no build starts at once; Horovod's wait; when the build fails they are never started, fail with its FAILED
    line, and the table and the verdict say so."""
    import time

    free = gpu_plan.Launch("free", ("run", "--backends", "nope"), "needs no build")
    held = gpu_plan.Launch("horovod-bf16", ("run", "--backends", "horovod"), "waits", ("horovod",), "bf16",
                           after=gpu_plan.BUILD)
    said = []
    build = _build(tmp_path, "sleep 2; echo 'build_horovod: FAILED: compiling the horovod wheel (full build log: "
                             "/v/horovod-build.log)' >&2; exit 1").start()
    manifest = gpu_plan.run([free, held], tmp_path / "plan", jobs=2, deadline=time.monotonic() + 120,
                            say=said.append,
                            skip=lambda argv: pytest.fail("a held launch's skip was asked") if "horovod" in argv else None,
                            builds=[build])
    got = manifest["launches"]
    why = "build_horovod: FAILED: compiling the horovod wheel (full build log: /v/horovod-build.log) (exit 1)"
    assert got["free"]["status"] == "failed" and got["horovod-bf16"]["status"] == "failed"
    assert got["horovod-bf16"]["reason"] == f"horovod-build failed: {why}" and got["horovod-bf16"]["rc"] is None
    assert not Path(got["horovod-bf16"]["log"]).exists()  # never started
    assert said[0] == "[plan] horovod-bf16: waits for horovod-build"
    assert said.index("[plan] free: started (needs no build)") < next(
        i for i, line in enumerate(said) if line.startswith("[plan] horovod-build: failed: "))
    assert manifest["builds"]["horovod-build"] == {
        "what": "a stand-in build", "command": build.summary()["command"], "log": str(tmp_path / "horovod-build.log"),
        "status": "failed", "reason": why, "rc": 1, "seconds": manifest["builds"]["horovod-build"]["seconds"]}
    text, failed = doctor.report(manifest, tmp_path / "plan", ["horovod"], None, [], True, False,
                                 builds=[build.summary()])
    lines = text.splitlines()
    assert failed is True
    assert lines[4] == "| horovod | failed | — | — | — | — | — | python -m bench doctor --backends horovod |"
    assert f"1. 1 checks: horovod-build failed: {why}" in lines
    assert any(ln.startswith(f"a stand-in build: FAILED: {why} in ") for ln in lines)
    assert lines[-1] == ("GPU machine NOT OK: 0 backends ran, 1 failed (horovod), 1 single-purpose launch failed, "
                         "1 build failed")


@pytest.mark.slow
def test_the_full_check_builds_horovod_beside_the_plan_on_a_fake_gpu_machine(monkeypatch, tmp_path):
    """bench doctor --full on a fake machine of one H100 where Horovod is not built: the estimate first, the build
    started beside the plan (here a stand-in of 2 s), Horovod's three launches held until it is built and then really
    started (each a `python -m bench` that stops at its device check, with no GPU behind the fake)."""
    from backends import horovod

    FakeGpuMachine([__import__("tests.fake_gpu", fromlist=["FakeGpu"]).FakeGpu()]).install(monkeypatch)
    monkeypatch.setattr(horovod, "problem", lambda: "horovod is not installed (make horovod)")
    asked = []

    def horovod_build(venv, jobs, log):
        asked.append((venv, jobs, log))
        return gpu_plan.Build(gpu_plan.BUILD, ["sh", "-c", "sleep 2; echo built"], log, env={"BUILD_JOBS": str(jobs)},
                              what="Horovod with NCCL (a stand-in)")

    monkeypatch.setattr(gpu_plan, "horovod_build", horovod_build)
    monkeypatch.setenv("BUILD_JOBS", "3")
    proc = bench_inproc("doctor", "--full", "--backends", "horovod", "--skip-tests", "--skip-sweep", "--jobs", "2",
                        "--results", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the launches stop at their device check
    assert asked == [(Path(sys.prefix), 3, tmp_path / "horovod-build.log")]
    err = proc.stderr.splitlines()
    assert err[0].startswith("doctor: full tier on 1 GPU(s) (NVIDIA H100 80GB HBM3): 3 launches (4 process trees), 2 "
                             "at once, Horovod built beside them (3 compile jobs, about 240 s) and its 3 launches held "
                             "until it ends")
    built = next(i for i, line in enumerate(err) if line.startswith("doctor: [plan] horovod-build: built in "))
    starts = [i for i, line in enumerate(err) if ": started (" in line]
    assert len(starts) == 3 and built < min(starts), err
    manifest = gpu_plan.load(tmp_path / "plan")
    assert manifest["builds"]["horovod-build"]["status"] == "built"
    assert {n: x["status"] for n, x in manifest["launches"].items()} == {
        "horovod-bf16": "failed", "horovod-fp16": "failed", "verify-horovod": "failed"}
    out = proc.stdout.splitlines()
    assert any(ln.startswith("Horovod with NCCL (a stand-in): built in ") for ln in out)
    assert "horovod: not built" not in proc.stdout


@pytest.mark.slow
def test_the_build_command_compiles_horovod_with_nccl_from_the_wheels_folder(monkeypatch, tmp_path):
    """gpu_check.horovod_build's command, the real scripts/build_horovod.sh, with a stand-in venv Python that answers
    as a CUDA torch seeing one GPU would: it takes the slow path to pip's wheel build with NCCL operations, the compile
    jobs asked for and the wheels folder only (no index); the stand-in refuses to compile, and the build's state is
    the script's FAILED line."""
    import time

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    seen = tmp_path / "pip-wheel.env"
    py = venv / "bin" / "python"
    py.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = -c ]; then echo "2.15.0+cu132 13.2 cp311 none 1"; exit 0; fi
        case "$1" in
          */cuda_toolkit.py) if [ "$2" = ensure ]; then echo /fake/cuda; exit 0; fi; exec {sys.executable} "$@";;
          */lockfile.py) exec {sys.executable} "$@";;
        esac
        if [ "$1 $2 $3" = "-m pip wheel" ]; then
          echo "MAKEFLAGS=$MAKEFLAGS NCCL=$HOROVOD_GPU_OPERATIONS NO_INDEX=$PIP_NO_INDEX" > {seen}
          echo "LINKS=$PIP_FIND_LINKS CC=$HOROVOD_BUILD_CUDA_CC_LIST CUDA_HOME=$CUDA_HOME ARGS=$*" >> {seen}
          exit 97
        fi
        exit 0
        """))
    py.chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "horovod-0.28.1.tar.gz").write_bytes(b"")
    monkeypatch.setenv("WHEELS", str(wheels))
    monkeypatch.setenv("BENCH_WHEEL_CACHE", str(tmp_path / "cache"))
    for name in ("HOROVOD_BUILD_CUDA_CC_LIST", "HOROVOD_VERSION", "CUDA_HOME", "PIP_FIND_LINKS", "PIP_NO_INDEX",
                 "HOROVOD_SDIST"):
        monkeypatch.delenv(name, raising=False)
    build = gpu_plan.horovod_build(venv, 8, tmp_path / "horovod-build.log")
    assert build.command == ["bash", str(REPO / "scripts" / "build_horovod.sh"), str(venv)]
    assert build.env["BUILD_JOBS"] == "8" and build.env["WHEELS"] == str(wheels)
    state = build.start().wait(time.monotonic() + 300)
    assert state == (f"build_horovod: FAILED: compiling the horovod wheel (full build log: {venv}/horovod-build.log) "
                     "(exit 1)"), (tmp_path / "horovod-build.log").read_text()
    got = seen.read_text()
    assert got.startswith(f"MAKEFLAGS=-j8 NCCL=NCCL NO_INDEX=1\nLINKS={wheels} CC=75,80,90 CUDA_HOME=/fake/cuda ")
    assert "--no-build-isolation" in got and "--no-binary horovod" in got


def test_without_cuda_it_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    code, err = cli_error(capsys, "doctor")
    assert code == 2
    assert err == (f"bench: error: no CUDA device visible: torch.cuda.is_available() is False (torch {torch.__version__}, "
                   "built for CUDA 13.0); bench doctor checks a GPU machine (a driver older than torch's CUDA also "
                   "hides the GPUs)\n")


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_measured_sweep_is_resnet50_at_bf16_and_under_full_the_default_backends_and_horovod(monkeypatch, tmp_path,
                                                                                                 gpus):
    fake_cuda(monkeypatch, gpus)
    names = backends.names()
    full = doctor.sweep_backends(names, "all", True)
    assert full == ["single", "ddp", "horovod", "fsdp2", "ds_zero2", "ds_zero3"]
    assert doctor.sweep_backends(["dp", "ddp"], "dp,ddp", True) == ["dp", "ddp"]  # --backends given: those
    assert doctor.sweep_backends(names, "all", False) == names  # the quick tier: every backend, as time allows
    configs = doctor.plan(gpus, ",".join(full), tmp_path, doctor.TIERS["full"]["precisions"])
    assert [(c.backend, c.precision) for c in configs] == [(b, "bf16") for b in full]
    assert {c.model for c in configs} == {"resnet50"} and {c.cudnn_benchmark for c in configs} == {True}
    assert {(c.warmup, c.steps, c.windows) for c in configs} == {(6, 5, 2)}
    assert {c.world_size for c in configs if c.backend != "single"} == {gpus}
    assert [c.world_size for c in configs if c.backend == "single"] == [1]
    configs = doctor.plan(gpus, "all", tmp_path, ("fp32", "bf16", "fp16"))  # several precisions: one after another
    assert len(configs) == 3 * len(names)  # once each (cudnn.benchmark on: no dp cudnn-off variant)
    assert [c.precision for c in configs][:: len(configs) // 3] == ["fp32", "bf16", "fp16"]


def measured(backend, precision, status="ok", n=2, **extra):
    r = {"backend": backend, "world_size": n, "precision": precision, "status": status, "reason": None, "note": None,
         "cudnn_benchmark": True}
    if status == "ok":
        r.update(throughput=2345.67, mfu=0.4321, joules_per_image=0.1234, energy_reason=None, replicas_consistent=True,
                 memory=[{"device_index": i, "peak_reserved_bytes": (10 + i) * GiB} for i in (1, 0)])
    r.update(extra)
    return r


def test_the_measured_table_shows_every_column_and_skips_with_their_reasons():
    rows = [measured("ddp", "bf16"),
            measured("horovod", "fp32", "skipped", reason="Horovod is not installed (make horovod)"),
            measured("fsdp2", "fp16", "failed", reason="RuntimeError: No inf checks were recorded for this optimizer."),
            measured("dp", "fp32", energy_reason=None, note="one process drives 2 GPUs", mfu=None,
                     joules_per_image=None),
            {"backend": "ds_zero3", "world_size": 2, "precision": "fp16", "status": "not run (budget)",
             "reason": "the 1500 s budget was spent"}]
    text, failed = doctor.report(None, Path("."), [], None, rows, True, True)
    lines = text.splitlines()
    assert failed is True  # a failed run, and under --full what the budget left out
    assert lines[0] == "Measured (sequential, alone on the machine):"
    assert lines[2] == ("| backend | GPUs | precision | status | img/s | peak reserved per GPU | MFU | J/image | "
                        "why / note |")
    assert lines[3] == "|---|---:|---|---|---:|---:|---:|---:|---|"
    assert lines[4] == "| ddp | 2 | bf16 | ok | 2,345.7 | 0: 10.00 · 1: 11.00 GiB | 43.2 % | 0.123 |  |"
    assert lines[5] == "| horovod | 2 | fp32 | skipped |  |  |  |  | Horovod is not installed (make horovod) |"
    assert lines[6] == ("| fsdp2 | 2 | fp16 | failed |  |  |  |  | RuntimeError: No inf checks were recorded for this "
                        "optimizer. |")
    assert lines[7] == "| dp | 2 | fp32 | ok | 2,345.7 | 0: 10.00 · 1: 11.00 GiB |  |  | one process drives 2 GPUs |"
    assert lines[8] == "| ds_zero3 | 2 | fp16 | not run (budget) |  |  |  |  | the 1500 s budget was spent |"
    assert lines[-1] == "GPU machine NOT OK: 0 backends ran, 0 failed, 1 measured run failed"
    # diverged replicas fail like a crash; the quick tier lists what its budget left out without failing
    assert doctor.report(None, Path("."), [], None, [measured("ddp", "fp32", replicas_consistent=False)], False,
                         True)[1] is True
    assert doctor.report(None, Path("."), [], None, [rows[0], rows[4]], False, True)[1] is False


def test_the_tests_line_of_a_check_the_budget_stopped():
    t = {"passed": 3, "failed": 0, "skipped": 0, "failures": [], "skips": {}, "timed_out": True, "seconds": 270.4,
         "log": "x.log", "running": ["tests/test_gpu.py::test_a"], "never_started": ["tests/test_gpu.py::test_b"]}
    assert doctor.tests_line(t) == ("gpu tests: 3 passed, 0 failed, 0 skipped in 270 s (log: x.log); stopped by the "
                                    "time budget with 1 running (tests/test_gpu.py::test_a) and 1 never started "
                                    "(tests/test_gpu.py::test_b)")
    assert doctor.report(None, Path("."), [], t, [], True, True)[1] is True  # the full check must finish
    assert doctor.report(None, Path("."), [], t, [], False, True)[1] is False


def test_measured_runs_that_no_longer_fit_the_budget_are_listed_not_launched(monkeypatch, tmp_path, capsys):
    """The measured sweep's loop, with a fake clock, plan and launcher: the budget decides what runs."""
    from backends import horovod
    from bench import cli, launch
    from bench.core import environment

    monkeypatch.setattr(horovod, "problem", lambda: None)  # built: --full starts no build here
    FakeGpuMachine([__import__("tests.fake_gpu", fromlist=["FakeGpu"]).FakeGpu()]).install(monkeypatch)
    monkeypatch.setattr(environment, "collect_env", lambda *a, **kw: {"gpu_names": ["NVIDIA H100 80GB HBM3"]})
    monkeypatch.setattr(gpu_plan, "run", lambda *a, **kw: {"launches": {}, "complete": True})
    monkeypatch.setattr(doctor, "baseline_name", lambda gpus: f"NVIDIA-H100-80GB-HBM3-x{gpus}")
    clock = iter(range(0, 100000, 100))  # every reading 100 s later: start, then one reading per planned run
    monkeypatch.setattr(doctor.time, "monotonic", lambda: next(clock))
    launched = []

    def run_one(cfg, results_dir, env_meta, backend, timeout=None, **kw):
        launched.append((cfg.backend, cfg.precision, timeout))
        return measured(cfg.backend, cfg.precision, n=1)

    monkeypatch.setattr(launch, "run_one", run_one)
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--full", "--skip-tests", "--budget-s", "450", "--run-timeout-s", "150",
                  "--results", str(tmp_path)])
    assert e.value.code == 1  # runs left out of the full check: it did not finish
    # the clock reads 0 at the start, then 100 s more before each planned run: 350, 250, 150 s left get the per-run
    # cap, 50 s left gets 50 s, and from -50 s on (under doctor.MIN_RUN_S) nothing is launched
    full = doctor.sweep_backends(backends.names(), "all", True)
    assert launched == [(b, "bf16", t) for b, t in zip(full[:4], (150, 150, 150, 50))]
    out = capsys.readouterr().out
    assert out.count("| not run (budget) |") == len(full) - 4
    assert (tmp_path / "doctor.md").read_text().strip() == out[out.index("Backends"):].strip()
    # the quick tier: bf16 only, whatever time is left, and what it leaves out is neither listed nor a failure
    launched.clear()
    clock = iter(range(0, 100000, 100))
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--skip-tests", "--results", str(tmp_path / "quick")])
    assert e.value.code == 0
    assert launched == [(b, "bf16", t) for b, t in zip(backends.names()[:3], (150, 150, 120))]
    out = capsys.readouterr().out
    assert "| not run (budget) |" not in out and "bench doctor (quick)" in out


@pytest.mark.slow
def test_the_gpu_tests_really_run_from_the_repository_root(tmp_path, monkeypatch):
    """The real subprocess, not a fake: doctor.py moved into bench/commands/ and ran `pytest ... tests` from bench/,
    where pytest found no `tests` and exited 4 ("failed: pytest exited 4" on every GPU machine). Here, with no GPU,
    every gpu test is collected and skips with its reason, each one logged. Started from another directory with a
    relative results path, as a user may."""
    monkeypatch.chdir(tmp_path)
    t = doctor.run_tests(600, Path("rel") / "doctor", jobs=1)
    assert t["timed_out"] is False and t["failed"] == 0 and t["failures"] == [], Path(t["log"]).read_text()[-3000:]
    assert t["passed"] == 0 and t["skipped"] >= 60 and t["skipped"] == t["collected"]
    assert sum(t["skips"].values()) == t["skipped"] and t["skips"]["needs a CUDA device"] >= 60
    assert all(why == "needs a CUDA device" or why.startswith("needs 2 CUDA devices") for why in t["skips"])
    assert (tmp_path / "rel" / "doctor" / "gpu-tests.xml").is_file()
    events = doctor.read_events(tmp_path / "rel" / "doctor" / "gpu-tests.jsonl")
    assert all(e["test"].startswith("tests/") and "::" in e["test"] for e in events if e["event"] == "done")


def test_junit_summary(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.test_gpu" name="test_a"/>'
                   '<testcase classname="tests.test_gpu" name="test_b"><failure message="x"/></testcase>'
                   '<testcase classname="tests.test_gpu" name="test_c"><skipped message="needs 2 CUDA devices"/>'
                   '</testcase><testcase classname="tests.test_loaders" name="test_d"><error message="y"/></testcase>'
                   '</testsuite></testsuites>')
    assert doctor.parse_junit(xml) == {"passed": 1, "failed": 2, "skipped": 1,
                                       "failures": ["test_gpu::test_b", "test_loaders::test_d"],
                                       "skips": {"needs 2 CUDA devices": 1}}


# --ranks-per-gpu: the 2-rank gpu tests on a one-GPU machine (tests/test_gpu.py two_ranks)

def test_ranks_per_gpu_plans_two_ranks_on_one_gpu_for_the_ddp_family_only(monkeypatch):
    from bench.plan import sweep as _plan

    fake_cuda(monkeypatch, 1)
    args = _plan.parse_run(["--backends", "all", "--gpus", "2", "--ranks-per-gpu", "2", "--device", "cuda"])
    configs, _ = _plan.plan(args)
    runs = {c.backend: c for c in configs}
    assert {c.world_size for c in configs if c.backend != "single"} == {2} and "single" not in runs
    shared = {n for n, c in runs.items() if backends.create(n).unavailable(c) is None}
    # the backends that declare the knob (the DDP family), and no other
    assert shared == {n for n in runs if "ranks_per_gpu" in {k.key for k in backends.backend_class(n).knobs}}
    assert {"ddp", "ddp_spawn", "ddp_amp_syncbn", "ddp_zero", "allreduce_manual"} <= shared
    assert runs["ddp"].options == {"ranks_per_gpu": 2}  # part of the configuration key: never mixed with real runs
    assert backends.create("fsdp2").unavailable(runs["fsdp2"]).startswith("fsdp2 cannot honour --ranks-per-gpu")
    # one rank per GPU is the default, and recorded as nothing
    configs, _ = _plan.plan(_plan.parse_run(["--backends", "ddp", "--gpus", "1", "--ranks-per-gpu", "1"]))
    assert configs[0].options == {}


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "3", "--ranks-per-gpu", "2", "--device", "cuda"],
     "--gpus 3: this machine has 2 rank slots (1 CUDA device(s) x --ranks-per-gpu 2)"),
    (["--gpus", "2", "--device", "cuda"], "--gpus 2: this machine has 1 CUDA device(s)"),
    (["--gpus", "2", "--ranks-per-gpu", "0", "--device", "cuda"], "--ranks-per-gpu must be a positive integer, got 0"),
])
def test_ranks_per_gpu_bad_input_is_one_line(monkeypatch, capsys, argv, message):
    fake_cuda(monkeypatch, 1)
    code, err = cli_error(capsys, "run", "--backends", "ddp", *argv)
    assert (code, err) == (2, f"bench: error: {message}\n")


def test_ranks_per_gpu_is_refused_on_the_cpu(capsys):
    code, err = cli_error(capsys, "run", "--backends", "ddp", "--device", "cpu", "--gpus", "2", "--ranks-per-gpu", "2")
    assert (code, err) == (2, "bench: error: --ranks-per-gpu 2 shares CUDA devices between ranks; this run is on the "
                              "CPU, where --gpus already counts worker processes\n")


def test_ranks_sharing_a_gpu_take_gloo_and_the_shared_device(monkeypatch):
    """What a rank of the DDP family does under --ranks-per-gpu 2 on one GPU, with torch's CUDA and process-group
    calls recorded instead of made (no GPU here): gloo, not NCCL, and device cuda:0 for both local ranks."""
    import torch.distributed as dist

    from backends import ddp
    from bench.core.config import RunConfig

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw.get("device_id"))))
    for local, shared in ((0, 2), (1, 2), (1, 1)):
        monkeypatch.setenv("RANK", str(local))
        monkeypatch.setenv("LOCAL_RANK", str(local))
        monkeypatch.setenv("WORLD_SIZE", "2")
        cfg = RunConfig(backend="ddp", launcher="torchrun", world_size=2, device_type="cuda", model="resnet18",
                        image_size=32, batch_size=2, warmup=2, steps=1, windows=1,
                        options={"ranks_per_gpu": shared} if shared > 1 else {})
        b = ddp.DDP("ddp", "torchrun")
        b.init_process_group(cfg)
        assert b.device == torch.device("cuda", local // shared)
    assert calls == [("set_device", 0), ("gloo", None), ("set_device", 0), ("gloo", None),
                     ("set_device", 1), ("nccl", torch.device("cuda", 1))]


def test_a_test_that_needs_a_missing_dependency_skips_with_the_reason_or_fails_where_it_is_required(monkeypatch):
    """A GPU machine without DALI, DeepSpeed, HTA or NVML skips the tests that need them (the first H200 had none of
    the first three); .ci/run, where make installed every locked package, makes that a failure."""
    import importlib.util

    from tests import conftest

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    assert conftest.optional_problem("deepspeed") == "deepspeed is not installed (make install does)"
    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", False)
    with pytest.raises(pytest.skip.Exception, match=r"^deepspeed is not installed \(make install does\)$"):
        conftest.skip_without("hta", "deepspeed")
    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", True)
    with pytest.raises(pytest.fail.Exception, match="BENCH_REQUIRE_OPTIONAL=1 and deepspeed cannot be used"):
        conftest.skip_without("deepspeed")
    conftest.skip_without("hta")  # installed here: nothing happens
    # Horovod: a skip, but a failure where the CPU gate requires it (BENCH_REQUIRE_HOROVOD=1)
    from backends import horovod

    monkeypatch.setattr(conftest, "REQUIRE_OPTIONAL", False)
    monkeypatch.setattr(horovod, "problem", lambda: "horovod is not installed (make horovod)")
    monkeypatch.delenv("BENCH_REQUIRE_HOROVOD", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^horovod is not installed \(make horovod\)$"):
        conftest.skip_without("horovod")
    monkeypatch.setenv("BENCH_REQUIRE_HOROVOD", "1")
    with pytest.raises(BaseException) as raised:  # a skip here must fail this test, not skip it
        conftest.skip_without("horovod")
    assert raised.type is pytest.fail.Exception, raised
    assert str(raised.value).startswith("BENCH_REQUIRE_HOROVOD=1 and horovod cannot be used: horovod is not installed")
    # a launch the plan did not start (its every run would be skipped here): the tests that read it, the same way
    skipped = {"status": gpu_plan.SKIPPED, "argv": ["run", "--backends", "horovod"], "backends": ["horovod"],
               "reason": "horovod is not installed (make horovod)", "log": "nowhere.log", "rc": None}
    plan = conftest.GpuPlan(Path("plan"), {"launches": {"horovod-bf16": skipped}})
    with pytest.raises(BaseException) as raised:
        plan.record("horovod-bf16", "horovod")
    assert raised.type is pytest.fail.Exception, raised
    monkeypatch.delenv("BENCH_REQUIRE_HOROVOD")
    with pytest.raises(pytest.skip.Exception, match=r"^horovod is not installed \(make horovod\)$"):
        plan.record("horovod-bf16", "horovod")


def test_a_gpt_on_a_gpu_defaults_to_8_sequences_per_device_and_a_resnet_to_64(monkeypatch):
    """GPT models inherited the GPU's 64 per device: ~13 GB of logits alone for gpt-125m at 1024 tokens, so activations,
    not the sharded state, decided every comparison."""
    from bench.plan import sweep as _plan

    fake_cuda(monkeypatch, 1)
    for model, batch, seq in (("gpt-125m", 8, 1024), ("resnet50", 64, None), ("tests.user_model:factory", 64, None)):
        [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--gpus", "1", "--model", model]))
        assert (cfg.batch_size, cfg.seq_len) == (batch, seq), model
    [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--gpus", "1", "--model", "gpt-125m",
                                           "--batch-size", "32"]))
    assert cfg.batch_size == 32  # given: as given
    [cfg], _ = _plan.plan(_plan.parse_run(["--backends", "single", "--device", "cpu", "--gpus", "1", "--model",
                                           "gpt-micro"]))
    assert cfg.batch_size == 8


def test_the_memory_and_nvml_checks_say_what_failed():
    rec = ok_record("ddp")
    assert doctor.memory_check(rec) == ("ok", None) and doctor.nvml_check(rec) == ("ok", None)
    assert doctor.nvml_check({**rec, "machine": {"nvml": "NVML unavailable: NVMLError_LibraryNotFound: x"}}) == (
        "failed", "machine watch: NVML unavailable: NVMLError_LibraryNotFound: x")
    assert doctor.nvml_check({**rec, "machine": {"nvml": "ok", "gpus": []}}) == (
        "failed", "the machine watch found no GPU")
    unread = {**rec["memory"][0], "nvml_used_bytes": None, "nvml_used_reason": "NVML memory info: Not Supported"}
    assert doctor.nvml_check({**rec, "memory": [unread]}) == ("failed", "NVML used memory: NVML memory info: Not Supported")
    assert doctor.memory_check({**rec, "memory": []}) == ("failed", "no memory figures in the record")
    low = {**rec["memory"][0], "peak_reserved_bytes": 1}
    assert doctor.memory_check({**rec, "memory": [low]})[0] == "failed"
    assert doctor.memory_check({"status": "failed"}) == doctor.nvml_check(None) == ("—", None)

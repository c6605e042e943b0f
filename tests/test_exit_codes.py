"""Exit codes as a contract (issue 47, item 1): docs/command-line.md's "Exit codes" table is read here, and each of its
rows is one test: every command the row names (or every command, where it says so) is shown to return that code in
the case the row describes. A case runs in this process, with the launcher replaced where a run would start (nothing
is launched), or it is a test elsewhere that runs it for real and asserts the code (``CITED``: the test must exist and
assert it). A command added to the suite, or to a row, without a case here fails its row's test."""
import ast
import re
from pathlib import Path

import pytest

from bench.commands import COMMANDS
from bench.core import results
from tests.conftest import REPO, TINY, cli_error

DOC = REPO / "docs" / "command-line.md"
# the commands a row can name: `baseline` has two subcommands with codes of their own
ALL = [c for c in COMMANDS if c != "baseline"] + ["baseline save", "baseline name"]


def table() -> dict[int, list[str]]:
    """{exit code: the commands its row names} from the table under "## Exit codes"."""
    text = DOC.read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    out = {}
    for ln in rows:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        code, commands = int(cells[0].strip("`")), cells[-1]
        out[code] = ALL if commands == "every command" else re.findall(r"`([a-z ]+)`", commands)
    return out


CODES = table()


def test_the_table_has_the_five_codes_and_names_only_real_commands():
    assert list(CODES) == [0, 1, 2, 3, 130]
    assert {c for names in CODES.values() for c in names} <= set(ALL)
    assert CODES[0] == CODES[2] == CODES[130] == ALL  # every command measures (or does what it is asked), refuses
    # bad input and can be interrupted


# --- fakes: runs that are not launched ------------------------------------------------------------------------------

def ok_record(cfg) -> dict:
    from tests.test_report import make

    return make(cfg.backend, cfg.world_size, 100.0, device="cpu")


def failed_record(cfg, env_meta=None) -> dict:
    rec = results.skeleton(cfg.to_dict(), results.new_run_id(cfg.backend, cfg.world_size), env_meta or {})
    return {**rec, "status": "failed", "reason": "rank 1 exited with SIGKILL (out of memory?)"}


def launcher(monkeypatch, make):
    """Replace ``launch.run_one`` (every command's way to start a run) with ``make(cfg, spec)``."""
    from bench import launch

    def run_one(cfg, results_dir, env_meta, backend, extra_spec=None, **kw):
        rec = make(cfg, extra_spec or {})
        results.save(rec, results_dir)
        return rec

    monkeypatch.setattr(launch, "run_one", run_one)


def quiet(monkeypatch):
    """The machine judged quiet whatever it is doing (a busy test machine would make a tune inconclusive)."""
    from bench.core import trust

    monkeypatch.setattr(trust, "machine_reasons", lambda machine, device_type, windows=None: [])


def collectives_record(cfg, spec):
    rec = results.skeleton(cfg.to_dict(), results.new_run_id("ddp", cfg.world_size), {})
    return {**rec, "status": "ok", "process_group": "gloo",
            "results": [{"op": "all_reduce", "bytes": 4096, "busbw_gbps": 1.5}]}


def tune_argv(tmp_path):
    return ["tune", "--backends", "single", "--device", "cpu", *TINY[2:], "--budget-s", "600", "--results",
            str(tmp_path / "t")]


def compare_pair(tmp_path, **current):
    from tests.test_compare import record, runs, write

    base = write(tmp_path / "base", *runs(1))
    cur = write(tmp_path / "cur", *(runs(2) if not current else [record([], **current)] if current.get("status")
                                   else runs(2, **current)))
    return ["compare", str(base), str(cur)]


def baseline_dir(tmp_path, *extra):
    from tests.test_compare import record, windows, write

    return str(write(tmp_path / "raw", record(windows(1)), *extra))


# --- the cases: (code, command) -> a function (tmp_path, monkeypatch) -> argv, or a test that runs it for real -------

def run_ok(tmp_path, mp):
    launcher(mp, lambda cfg, spec: ok_record(cfg))
    return ["run", "--backends", "single", "--gpus", "1", *TINY, "--results", str(tmp_path / "r")]


def run_failed(tmp_path, mp):
    launcher(mp, lambda cfg, spec: failed_record(cfg))
    return ["run", "--backends", "single", "--gpus", "1", *TINY, "--results", str(tmp_path / "r")]


def tune_ok(tmp_path, mp):
    quiet(mp)
    launcher(mp, lambda cfg, spec: ok_record(cfg))
    return tune_argv(tmp_path)


def tune_failed(tmp_path, mp):
    quiet(mp)
    launcher(mp, lambda cfg, spec: failed_record(cfg))
    return tune_argv(tmp_path)


def tune_disturbed(tmp_path, mp):
    from bench.core import trust

    mp.setattr(trust, "machine_reasons", lambda machine, device_type, windows=None: ["other processes used 45% of "
                                                                                     "the 2 CPUs"])
    launcher(mp, lambda cfg, spec: {**ok_record(cfg), "windows_wall_span": [1.0, 2.0]})
    return tune_argv(tmp_path)


def collectives(make):
    def case(tmp_path, mp):
        launcher(mp, lambda cfg, spec: make(cfg, spec))
        return ["collectives", "--device", "cpu", "--gpus", "2", "--no-horovod", "--max-bytes", "4K", "--results",
                str(tmp_path / "r")]
    return case


def launched_failed(argv):
    def case(tmp_path, mp):
        launcher(mp, lambda cfg, spec: failed_record(cfg))
        return [*argv, "--results", str(tmp_path / "r")]
    return case


def loader_failed(tmp_path, mp):
    from bench.commands import loader
    from bench.rank import data

    mp.setattr(data, "check_imagenet", lambda *a, **k: None)
    mp.setattr(loader, "measure", lambda *a, **k: {"status": "failed", "reason": "a worker died"})
    return ["loader", "--device", "cpu", "--data-dir", str(tmp_path), "--loaders", "torchvision", "--decodes", "cpu"]


def report_ok(tmp_path, mp):
    from tests.test_report import make

    for rec in (make("single", 1, 50.0, device="cpu"), make("ddp", 2, 90.0, device="cpu")):
        results.save(rec, tmp_path / "raw")
    return ["report", "--results", str(tmp_path / "raw"), "--out", str(tmp_path / "rep")]


def compare_disturbed(tmp_path, mp):
    from tests.test_compare import runs, write

    base = write(tmp_path / "base", *runs(1))
    cur = write(tmp_path / "cur", *runs(2, disturbed=True, disturbed_reasons=["other processes used 45% of the CPUs"]))
    return ["compare", str(base), str(cur)]


def baseline_save(*extra, flags=()):
    def case(tmp_path, mp):
        from tests.test_compare import record

        made = [record([], backend="dp", status="failed", reason="boom") if e == "failed" else
                record([0.1] * 5, disturbed=True, disturbed_reasons=["other processes used 45% of the CPUs"])
                for e in extra]
        return ["baseline", "save", "--from", baseline_dir(tmp_path, *made), "--name", "x", "--out-dir",
                str(tmp_path / "b"), *flags]
    return case


CASES = {
    (0, "run"): run_ok,
    (0, "list"): lambda tmp_path, mp: ["list", "--device", "cpu"],
    (0, "report"): report_ok,
    (0, "compare"): lambda tmp_path, mp: compare_pair(tmp_path),
    (0, "baseline save"): baseline_save(),
    (0, "baseline name"): lambda tmp_path, mp: ["baseline", "name", "--from", baseline_dir(tmp_path)],
    (0, "verify"): "tests/test_verify.py::test_distributed_backends_match_the_reference_bit_for_bit",
    (0, "collectives"): collectives(collectives_record),
    (0, "predict"): "tests/test_comm.py::test_predict_against_measured_records",
    (0, "nodelist"): lambda tmp_path, mp: ["nodelist", "gpu[01-02]"],
    (0, "loader"): "tests/test_loaders.py::test_loader_ceiling_for_every_loader_and_the_input_bound_report",
    (0, "doctor"): "tests/test_doctor.py::test_measured_runs_that_no_longer_fit_the_budget_are_listed_not_launched",
    (0, "trace"): "tests/test_trace.py::test_bench_trace_reads_a_trace_of_another_script_by_its_step_and_phase_names",
    (0, "overhead"): "tests/test_overhead.py::overhead",
    (0, "peak"): "tests/test_peak.py::test_bench_peak_measures_in_a_process_of_its_own_and_prints_the_table",
    (0, "tune"): tune_ok,
    (1, "run"): run_failed,
    (1, "tune"): tune_failed,
    (1, "verify"): "tests/test_verify.py::test_injected_faults_fail_verify_naming_the_backend_and_the_deviation",
    (1, "collectives"): collectives(lambda cfg, spec: failed_record(cfg)),
    (1, "loader"): loader_failed,
    (1, "overhead"): launched_failed(["overhead", "--backends", "single", "--steps", "1", "--rounds", "1"]),
    (1, "peak"): launched_failed(["peak", "--device", "cpu", "--precision", "fp32"]),
    (1, "doctor"): "tests/test_doctor.py::test_measured_runs_that_no_longer_fit_the_budget_are_listed_not_launched",
    (1, "compare"): lambda tmp_path, mp: compare_pair(tmp_path, status="failed", reason="boom"),
    (1, "baseline save"): baseline_save("failed"),
    (3, "compare"): compare_disturbed,
    (3, "baseline save"): baseline_save("disturbed"),
    (3, "tune"): tune_disturbed,
}

# bad input or nothing to run, one per command: (argv, what the one line says)
BAD = {
    "run": (["run", "--device", "cpu", "--precision", "fp16", *TINY[2:]], "nothing to run: all "),
    "list": (["list", "--device", "tpu"], "'tpu'"),
    "report": (["report", "--results", "{tmp}/empty"], "nothing to report: "),
    "compare": (["compare", "{tmp}/a", "{tmp}/b"], "baseline '"),
    "baseline save": (["baseline", "save", "--from", "{tmp}/none"], "--from "),
    "baseline name": (["baseline", "name", "--from", "{tmp}/none"], "--from "),
    "verify": (["verify", "--device", "cpu", "--precision", "fp16", "--backends", "single"], "nothing to run: "),
    "collectives": (["collectives", "--device", "cpu", "--gpus", "1"], "nothing to run: "),
    "predict": (["predict", "--results", "{tmp}/empty"], "{tmp}/empty needs an ok single@1 record"),
    "nodelist": (["nodelist", "gpu[02-01"], "node list "),
    "loader": (["loader", "--device", "cpu", "--data-dir", "{tmp}", "--loaders", "nope"], "--loaders 'nope'"),
    "doctor": (["doctor", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    "trace": (["trace", "{tmp}/missing.json"], "{tmp}/missing.json: no such file"),
    "overhead": (["overhead", "--rounds", "0"], "--rounds must be a positive integer"),
    "peak": (["peak", "--device", "cpu", "--precision", "fp16"], "--precision fp16: "),
    "tune": (["tune", "--device", "cpu", "--precision", "fp16", "--backends", "single,ddp"], "nothing to run: "),
}


def cited(path_and_name: str, code: int) -> None:
    """A test elsewhere that runs the case for real: it exists, and asserts this exit code."""
    path, name = path_and_name.split("::")
    tree = ast.parse((REPO / path).read_text())
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name] or [None]
    assert fn is not None, f"{path_and_name} is gone"
    source = ast.get_source_segment((REPO / path).read_text(), fn)
    assert re.search(rf"(returncode|code)\s*==\s*{code}\b", source), f"{path_and_name} does not assert exit {code}"


def run_case(capsys, tmp_path, monkeypatch, code, command):
    case = CASES.get((code, command))
    assert case is not None, f"the table says `{command}` exits {code}: add its case to CASES"
    if isinstance(case, str):
        cited(case, code)
        return
    got, err = cli_error(capsys, *case(tmp_path / command.replace(" ", "-"), monkeypatch))
    assert got == code, f"{command}: exit {got}, not {code}\n{err}"


@pytest.mark.parametrize("code", [0, 1, 3])
def test_the_row_of_each_outcome(code, capsys, tmp_path, monkeypatch):
    for command in CODES[code]:
        with monkeypatch.context() as mp:
            run_case(capsys, tmp_path, mp, code, command)
    assert {c for c, _ in CASES if c == code} == {code} and {cmd for c, cmd in CASES if c == code} == set(CODES[code]), \
        "a case for a command the table does not name: the table or the cases are out of date"


def test_the_row_of_bad_input_or_nothing_to_run(capsys, tmp_path):
    """2: one `bench: error:` line naming the bad value, or why nothing can run here; nothing is launched."""
    assert set(BAD) == set(CODES[2])
    (tmp_path / "empty").mkdir()
    for command, (argv, says) in BAD.items():
        argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
        code, err = cli_error(capsys, *argv)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (command, err)
        assert lines[0].startswith("bench: error: ") and says.replace("{tmp}", str(tmp_path)) in lines[0], (command,
                                                                                                             err)


def test_the_row_of_an_interrupt(capsys, tmp_path, monkeypatch):
    """130: Ctrl-C in any command is one line, never a traceback; bench run keeps and prints what it finished."""
    import importlib

    from bench.cli import build_parser

    needs = {"baseline save": ["--from", "x"], "nodelist": ["nodes"], "trace": ["f.json"], "compare": ["a", "b"],
             "loader": ["--data-dir", "x"]}
    for command in CODES[130]:
        argv = command.split() + needs.get(command, [])
        func = build_parser().parse_args(argv).func
        with monkeypatch.context() as mp:
            def interrupted(args):
                raise KeyboardInterrupt

            mp.setattr(importlib.import_module(func.__module__), func.__name__, interrupted)
            code, err = cli_error(capsys, *argv)
        assert (code, err) == (130, f"\ninterrupted: python -m bench {command.split()[0]} stopped; what it had finished "
                                    "is kept\n"), command
    # bench run: the interrupt lands in the middle of a sweep; the runs that finished are listed
    done = []

    def second_run_interrupted(cfg, spec):
        if done:
            raise KeyboardInterrupt
        done.append(cfg)
        return ok_record(cfg)

    launcher(monkeypatch, second_run_interrupted)
    code, err = cli_error(capsys, "run", "--backends", "single,dp", "--gpus", "1", *TINY, "--results", tmp_path / "r")
    assert code == 130 and err.startswith(f"\ninterrupted: 1 of 2 runs finished; their records are in {tmp_path / 'r'}")


def test_a_plan_that_would_skip_every_run_is_refused_before_launch_with_its_reasons(capsys, tmp_path, monkeypatch):
    """Issue 47: `bench run --precision fp16` on the CPU skipped all 12 runs and exited 0; a CI script read success."""
    from bench import launch

    monkeypatch.setattr(launch, "run_one", lambda *a, **k: pytest.fail("nothing may be launched"))
    code, err = cli_error(capsys, "run", "--device", "cpu", "--backends", "single,ddp,ddp_amp_syncbn", "--precision",
                          "fp16", "--gpus", "1,2", *TINY[2:], "--results", tmp_path / "r")
    assert (code, err) == (2, "bench: error: nothing to run: all 5 planned runs would be skipped here (single, ddp: "
                              "fp16 training needs CUDA (fp16 kernels and GradScaler); use --precision bf16 on CPU; "
                              "ddp_amp_syncbn: SyncBatchNorm layers only work with GPU modules (torch.nn.SyncBatchNorm "
                              "refuses CPU modules); run this backend on CUDA)\n")
    assert not (tmp_path / "r").exists() or not list(Path(tmp_path / "r").glob("*.json"))
    # skipped at launch (a reason the plan could not know): nothing measured, exit 2 after the sweep
    from bench.commands import run

    assert run.exit_code([{"status": "skipped"}, {"status": "skipped"}]) == 2
    assert run.exit_code([{"status": "skipped"}, {"status": "ok"}]) == 0
    assert run.exit_code([{"status": "failed"}, {"status": "skipped"}]) == 1
    assert run.exit_code([]) == 0  # --resume with everything done

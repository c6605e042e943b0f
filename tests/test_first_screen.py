"""The first screen (issue 38): a verdict a user reads in ten seconds on the console and at the top of REPORT.html,
each warning once, one line per kind; no figure derived from a disturbed or impossible input shown as a result.

Hand-made records (tests/test_report.py's ``make``), no runs: ``busy_sweep`` is the default CPU sweep taken beside
other work (single@1 and dp@1, every other backend at 2 workers, every run marked disturbed by bench/core/trust.py
from the machine state the harness records: others used 36-64% of the 2 CPUs); ``quiet_sweep`` the same backends,
three clean runs each. REPORT.html's first viewport is checked in headless Chromium (tests/chromium.py).
"""
import argparse
import contextlib
import io
import json

import pandas as pd
import pytest

from bench.commands import report
from bench.report import console as _summary
from bench.core import trust
from tests import chromium
from tests.test_report import make, write

AT_2 = {"ddp": 45.0, "ddp_zero": 42.0, "ddp_spawn": 40.0, "horovod": 30.0, "allreduce_manual": 28.0, "ds_zero1": 24.0,
        "ds_zero2": 22.0, "ds_zero3": 20.0}
SHARES = [0.64, 0.36, 0.40, 0.44, 0.48, 0.52, 0.56, 0.60, 0.38, 0.42]  # of the 2 CPUs, one per ok run of busy_sweep


def busy(rec: dict, share: float) -> dict:
    """The record as the harness leaves it after a run beside other work (bench/launch/machine.py ``attach``): the
    machine around its windows, judged by trust."""
    machine = {"cpus": 2, "gpus": [], "windows": {"others_cpu_share": share, "others_cpu_cores": 2 * share}}
    if rec.get("compute_only_window_seconds"):
        machine["compute_only"] = dict(machine["windows"])
    reasons = trust.machine_reasons(machine, rec["device_type"])
    rec.update(machine=machine, disturbed=bool(reasons), disturbed_reasons=reasons)
    return rec


def with_compute_only(rec: dict, faster: float) -> dict:
    rec["compute_only_window_seconds"] = [s / faster for s in rec["window_seconds"]]
    return rec


def busy_sweep() -> list[dict]:
    recs = [make("single", 1, 17.1, device="cpu"), make("dp", 1, 16.0, device="cpu")]
    recs += [with_compute_only(make(b, 2, thr, device="cpu"), 1.1) if b in ("ddp", "horovod")
             else make(b, 2, thr, device="cpu") for b, thr in AT_2.items()]
    recs = [busy(r, share) for r, share in zip(recs, SHARES)]
    return recs + [make("fsdp2", 2, device="cpu", status="failed",
                        reason="rank 1 exited with code 1; torchrun exit code 1 before rank 0 wrote the run's results; "
                               "first error: RuntimeError: gloo connection reset by peer; last lines: ...; log x.log"),
                   make("dp", 2, device="cpu", status="skipped", reason="nn.DataParallel cannot parallelise on CPU")]


def quiet_sweep() -> list[dict]:
    recs = []
    for i, spread in enumerate((0.99, 1.0, 1.01)):
        stamp = f"2026010{i + 1}T000000Z"
        recs += [make("single", 1, 40.0 * spread, device="cpu", stamp=stamp),
                 make("dp", 1, 39.8 * spread, device="cpu", stamp=stamp)]
        # ddp_zero 3 img/s slower than in the busy sweep: ddp's lead over the next (ddp_spawn) is then 7%, beyond the 5% a
        # verdict needs to name a winner (report/verdict.py WINNER_MIN_LEAD)
        recs += [make(b, 2, (thr + 26.0 - (3.0 if b == "ddp_zero" else 0.0)) * spread, device="cpu", stamp=stamp)
                 for b, thr in AT_2.items()]
    return recs


def report_of(tmp_path, recs, name="rep"):
    """REPORT.md, summary.csv and the console of ``bench report`` over these records."""
    raw, out = write(tmp_path / name, *recs), tmp_path / name / "out"
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        assert report.cmd_report(argparse.Namespace(results=str(raw), out=str(out))) == 0
    return (out / "REPORT.md").read_text(), pd.read_csv(out / "summary.csv"), console.getvalue(), out


@pytest.fixture(scope="module")
def busy_report(tmp_path_factory):
    """The busy sweep's report, built once for the tests that only read it (the console's and the page's)."""
    return report_of(tmp_path_factory.mktemp("busy"), busy_sweep())


@pytest.fixture(scope="module")
def quiet_report(tmp_path_factory):
    """The quiet sweep's report, built once for the tests that only read it."""
    return report_of(tmp_path_factory.mktemp("quiet"), quiet_sweep())


def verdict_lines(console: str) -> list[str]:
    return console.split("\n== Verdict\n")[1].rstrip("\n").split("\n")


# ---------------------------------------------------------------------------------------------------------------
# The console: the verdict last, short, in a fixed order; each warning once

def test_the_console_verdict_of_a_busy_machine_is_short_and_in_order(busy_report):
    md, _, console, out = busy_report
    lines = verdict_lines(console)
    assert lines == [
        "On CPU: Xeon:",
        "  resnet50 224px batch 64/device synthetic, fp32, 1 CPU worker: No winner: 2 of 2 runs disturbed; fastest by "
        "the medians single (17.1 img/s), 6% ahead of dp (95% CI 6–6%, within-run only).",
        "  resnet50 224px batch 64/device synthetic, fp32, 2 CPU workers: No winner: 8 of 8 runs disturbed; fastest "
        "by the medians ddp (45.0 img/s), 7% ahead of ddp_zero (95% CI 7–7%, within-run only).",
        "CPU worker processes over gloo: this says which backend is fastest on this CPU, nothing about which to use on "
        "GPUs.",
        "Not measured:",
        "  fsdp2 ×2 (resnet50 224px) failed: RuntimeError: gloo connection reset by peer",
        "  skipped here: dp ×2 (why: REPORT.md, Skipped and failed runs)",
        "Warnings, one line per kind (each configuration's are under its workload's tables in REPORT.md):",
        "  ⚠ disturbed: 10 of 10 runs: other processes used 36-64% of the CPUs; re-run with `--wait-quiet-s`",
        "  ⚠ impossible efficiency: 3 configurations: scaling efficiency 117-132% (limits 0 and 105%), not shown; "
        "re-run the baseline with `--repeat 3 --wait-quiet-s`",
        "  ⚠ negative loss component: 1 configuration: scaling-loss or exposed shares of -45% (limit -5%), not shown; "
        "re-run with `--wait-quiet-s`",
    ]
    assert len(lines) <= 12
    # REPORT.md and REPORT.html point to their own section, as a link (issue 47: "REPORT.md, Skipped and failed runs"
    # on the page itself); the console names the file and the section
    assert "- skipped here: dp ×2 (why: [Skipped and failed runs](#skipped-and-failed-runs))" in md
    page = (out / "REPORT.html").read_text()
    assert '(why: <a href="#skipped-and-failed-runs">Skipped and failed runs</a>)' in page
    assert page.count('<h3 id="skipped-and-failed-runs">Skipped and failed runs</h3>') == 1
    assert "REPORT.md, Skipped" not in page
    # the verdict is the console's last lines, and each warning is printed once: no per-run or per-configuration
    # warning line anywhere on the console (the tables carry the marks), the kind's line once
    assert console.rstrip("\n").endswith(lines[-1])
    assert "what to do" not in console and console.count("other processes used") == 1
    assert console.count("⚠ disturbed") == 1 and console.count("impossible efficiency") == 1
    # the full list stays in REPORT.md, under the workload's tables: every disturbed configuration, once each
    warnings = md.split("**⚠ Warnings**")[1]
    assert warnings.count("run disturbed: other processes used") == 10
    # 'Only X ran here' groups say nothing worth the first screen: none here, and none on the quiet machine's either


def test_the_console_verdict_of_a_quiet_machine_names_the_winner(quiet_report):
    _, _, console, _ = quiet_report
    lines = verdict_lines(console)
    assert lines == [
        "On CPU: Xeon:",
        "  resnet50 224px batch 64/device synthetic, fp32, 1 CPU worker: No winner: single, dp are within noise of "
        "each other; fastest by the medians single (40.0 img/s), 1% ahead of dp (within noise: the 95% intervals "
        "overlap).",
        "  resnet50 224px batch 64/device synthetic, fp32, 2 CPU workers: Use ddp (71.0 img/s), 7% ahead of ddp_spawn "
        "(95% CI 5–9%, 3 runs each).",
        "CPU worker processes over gloo: this says which backend is fastest on this CPU, nothing about which to use on "
        "GPUs.",
    ]
    assert "⚠" not in console


def test_a_group_with_one_backend_is_left_off_the_first_screen(tmp_path):
    recs = quiet_sweep() + [make("ddp", 4, 120.0, device="cpu")]  # alone at 4 workers: nothing to compare
    md, _, console, _ = report_of(tmp_path, recs)
    assert "4 CPU workers" not in "\n".join(verdict_lines(console))
    first, detail = md.split("## Verdict in detail")
    assert "Only ddp ran here" not in first and "**Only ddp ran here: nothing to compare it with.**" in detail


# ---------------------------------------------------------------------------------------------------------------
# One line per kind of warning

def test_one_line_per_kind_with_counts_ranges_and_what_to_do():
    w = trust.warning
    found = [w(trust.DISTURBED, "a", "1 of 2 runs disturbed: x", "throughput", ("a",), figures=[36.0], runs=1),
             w(trust.DISTURBED, "b", "2 of 2 runs disturbed: x", "throughput", ("b",), figures=[64.0, 50.0], runs=2,
               also=["another process on a GPU"]),
             w(trust.EFFICIENCY, "c", "x", "eff_vs_single", ("c",), figures=[117.0]),
             w(trust.EFFICIENCY, "c", "x", "eff_vs_own", ("c",), figures=[259.4]),  # one configuration, two figures
             w(trust.SAME_COMPUTATION, "d", "x", "throughput", ("d",), figures=[0.04]),
             w(trust.SAME_COMPUTATION, "e", "x", "throughput", ("e",), figures=[1.58]),
             w(trust.LOSS, "c", "x", "comm_loss", ("c",), figures=[-184.5]),
             w(trust.LOSS, "c", "x", "other_loss", ("c",), figures=[-198.4]),
             w(trust.UNSTABLE, "a", "x", "cv", ("a",), figures=[35.6])]
    assert trust.by_kind(found, 10) == [
        "⚠ disturbed: 3 of 10 runs: other processes used 36-64% of the CPUs; another process on a GPU; re-run with "
        "`--wait-quiet-s`",
        "⚠ unstable: 1 configuration: run-to-run CV 36% (limit 5% on GPUs, 15% on CPUs); repeat with `--repeat 5`",
        "⚠ impossible efficiency: 1 configuration: scaling efficiency 117-259% (limits 0 and 105%), not shown; re-run "
        "the baseline with `--repeat 3 --wait-quiet-s`",
        "⚠ negative loss component: 1 configuration: scaling-loss or exposed shares of -198 to -184% (limit -5%), not "
        "shown; re-run with `--wait-quiet-s`",
        "⚠ same computation apart: 2 backends at world size 1: 0.04-1.58x single's throughput (limit 1.25x either "
        "way); re-run both with `--repeat 3 --wait-quiet-s`; `--trace` says where the time goes"]
    assert trust.by_kind([], 10) == []


def test_bench_run_names_the_kinds_once_and_keeps_its_progress_lines_short():
    recs = busy_sweep()
    out = io.StringIO()
    _summary.print_warnings(recs, out)
    assert out.getvalue() == ("\n⚠ warnings about these numbers (disturbed): `python -m bench report` tells them with "
                              "its verdict, one line per kind, with what to do\n")
    line = _summary.one_line(recs[0])
    assert line == ("ok: 17.1 img/s global (95% CI 17.1-17.1), 17.1 img/s per device ⚠ disturbed (others used 64% of "
                    "the CPUs)")
    quiet = io.StringIO()
    _summary.print_warnings(quiet_sweep(), quiet)
    assert quiet.getvalue() == ""


# ---------------------------------------------------------------------------------------------------------------
# No derived figure from a disturbed or impossible input shown as a result

def _collectives(raw):
    rows = [{"op": "all_reduce", "bytes": b, "seconds": 1.0, "algbw_gbps": 2.0, "busbw_gbps": 2.0}
            for b in (2 ** 20, 2 ** 24, 2 ** 26)]
    (raw / "collectives").mkdir(parents=True)
    (raw / "collectives" / "c1.json").write_text(json.dumps({
        "schema": "collectives-1", "kind": "collectives", "run_id": "c1", "status": "ok", "launcher": "torchrun",
        "backend": "ddp", "world_size": 2, "device_type": "cpu", "process_group": "gloo", "results": rows}))


def cpu_trace() -> dict:
    """bench run --trace on a CPU: the explicit all-reduce ranges, 10 ms per step (tests/test_trace.py)."""
    from tests.test_trace import traced

    t = traced()
    t["phase_ms_per_step"] = [{**phases, "all-reduce": 10.0} for phases in t["phase_ms_per_step"]]
    return t


def test_figures_built_on_a_disturbed_baseline_or_beyond_the_limits_show_the_reason(tmp_path, monkeypatch):
    """single@1 disturbed; ddp, allreduce_manual and ddp_spawn clean: every efficiency vs single@1 and the scaling
    split over it give the reason instead; allreduce_manual's 180% vs its own @1 is impossible; ddp_spawn's
    compute-only reference ran slower than the run (exposed communication below -5% of the step)."""
    import matplotlib.figure

    drawn = {}
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: (drawn.setdefault(str(path).rsplit("-", 1)[-1].rsplit(".", 1)[0], fig),
                                                 save(fig, path, **kw))[1])
    recs = [busy(make("single", 1, 100.0, device="cpu", model="resnet18"), 0.5),
            make("ddp", 1, 100.0, device="cpu", model="resnet18"),
            with_compute_only(make("ddp", 2, 180.0, device="cpu", model="resnet18"), 190.0 / 180.0),
            make("allreduce_manual", 1, 50.0, device="cpu", model="resnet18"),
            make("allreduce_manual", 2, 180.0, device="cpu", model="resnet18"),
            with_compute_only(make("ddp_spawn", 2, 150.0, device="cpu", model="resnet18", trace=cpu_trace()),
                              140.0 / 150.0)]
    raw = write(tmp_path, *recs)
    _collectives(raw)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()):
        assert report.cmd_report(argparse.Namespace(results=str(raw), out=str(out))) == 0
    md = (out / "REPORT.md").read_text()
    # 2. Scaling efficiency: the reason in place of every figure over the disturbed single@1; own@1 stands where clean
    assert "| single | 1 | fp32 | 100.0 img/s ⚠ | ⚠ run disturbed | ⚠ run disturbed |" in md
    assert "| ddp | 2 | fp32 | 180.0 img/s | ⚠ baseline disturbed | 90.0 % |" in md
    assert "| allreduce_manual | 2 | fp32 | 180.0 img/s | ⚠ baseline disturbed | ⚠ above 105% |" in md
    # 4. Where the scaling goes: exposed communication is the run's own (shown), the split needs single@1 (not shown);
    # a compute-only reference slower than the run gives no exposed communication
    assert ("| ddp | 2 | fp32 | 180.0 img/s | 190.0 img/s | 37.4 ms | 5.3 % | ⚠ baseline disturbed | "
            "⚠ baseline disturbed |  |") in md
    assert ("| ddp_spawn | 2 | fp32 | 150.0 img/s | 140.0 img/s | ⚠ negative: noise | ⚠ negative: noise | "
            "⚠ baseline disturbed | ⚠ baseline disturbed |  |") in md
    assert "exposed communication is -7.1% of the step (below -5%)" in md  # trust's warning for it
    two_ways = md.split("### Exposed communication, two ways")[1].split("\n## ")[0]  # beside a trace: no comparison
    assert "| ddp_spawn | 2 | fp32 | ⚠ negative: noise | 10.0 | 0 % | 10.0 | all-reduce ranges (host) | - |" in two_ways
    # the prediction is built on single@1's compute time: its figures are not shown either
    pred = md.split("## Predicted vs measured scaling")[1]
    assert "(single@1, ⚠ disturbed: the predictions built on it are not shown)" in pred
    assert "| 2 | " in pred and "| ⚠ single@1 disturbed | ⚠ single@1 disturbed |  |" in pred
    assert "| 8 | " in pred and "| ⚠ single@1 disturbed |  |  |" in pred
    from bench import cli  # bench predict says the same

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
        cli.main(["predict", "--results", str(raw), "--world-sizes", "2,8"])
    table = {cells[1]: cells[2:] for cells in ([c.strip() for c in line.split("│")] for line in
                                                printed.getvalue().splitlines() if line.startswith("│"))}
    assert table["2"][2:5] == ["⚠ single@1 disturbed", "⚠ single@1 disturbed", "⚠ single@1 disturbed"]
    assert table["8"][2:5] == ["⚠ single@1 disturbed", "⚠ single@1 disturbed", "-"]
    # the verdict's evidence names the reason, never the figure
    detail = md.split("## Verdict in detail")[1].split("\n## ")[0]
    assert "scaling efficiency vs single@1 not shown (baseline disturbed)" in detail and "% scaling efficiency" not in detail
    # summary.csv keeps the number for a program, and says why the report does not show it
    csv = pd.read_csv(out / "summary.csv")
    ddp2 = csv[(csv.backend == "ddp") & (csv.world_size == 2)].iloc[0]
    assert ddp2.eff_vs_single_pct == pytest.approx(90.0) and ddp2.withheld == (
        "eff_vs_single: baseline disturbed; comm_loss: baseline disturbed; other_loss: baseline disturbed")
    # the plots: no efficiency vs single@1 beyond world size 1, none of the split, each left out with a note
    eff = drawn["efficiency"]
    single_panel, own_panel = eff.axes[:2]
    assert single_panel.get_title() == "vs single@1\n6 not drawn: baseline disturbed, run disturbed"
    assert [tuple(line.get_xdata()) for line in single_panel.get_lines() if line.get_label() != "ideal (100 %)"] == []
    assert own_panel.get_title() == "vs own@1\n2 not drawn: above 105%, run disturbed"  # single@1 is its own @1
    assert {(line.get_label(), tuple(line.get_ydata())) for line in own_panel.get_lines()} >= {("ddp", (100.0, 90.0))}
    # every split is withheld: no bar to draw (the table says why)
    assert "split" not in drawn and "efficiency" in drawn


def test_a_clean_sweep_draws_every_figure(quiet_report):
    md, csv, _, _ = quiet_report
    assert "⚠" not in md and csv.withheld.isna().all()
    assert "| ddp | 2 | fp32 | 71.0 img/s | 88.8 % |  |" in md  # 71 / (2 x 40)


def test_a_language_model_or_a_user_model_gets_no_imagenet_epoch(tmp_path):
    gpt = {"model": "gpt-micro", "image_size": None, "seq_len": 32, "optimizer": "adamw"}
    user = {"model": "tests.user_model:factory", "image_size": None, "optimizer": "adamw"}
    recs = [make("ddp", 2, 100.0, device="cpu", **gpt), make("fsdp2", 2, 50.0, device="cpu", **gpt),
            make("ddp", 2, 900.0, device="cpu", **user), make("single", 1, 500.0, device="cpu", **user),
            make("ddp", 2, 80.0, device="cpu"), make("single", 1, 50.0, device="cpu")]
    md, _, _, _ = report_of(tmp_path, recs)
    detail = md.split("## Verdict in detail")[1].split("\n## ")[0]
    blocks = {b.split("\n")[0]: b for b in detail.split("### ")[1:]}
    [gpt_block] = [b for t, b in blocks.items() if t.startswith("CPU: Xeon, gpt-micro")]
    user_blocks = [b for t, b in blocks.items() if "user_model" in t]
    [vision] = [b for t, b in blocks.items() if t.startswith("CPU: Xeon, resnet50") and "2 CPU workers" in t]
    assert "3,200 tokens/s" in gpt_block and "ImageNet" not in gpt_block
    assert user_blocks and not any("ImageNet" in b for b in user_blocks)
    assert "ImageNet-1k epoch ≈ 4 h 26 min" in vision  # 1,281,167 / 80 s
    user_table = md.split("### tests.user_model:factory")[1].split("**2. Scaling efficiency**")[0]
    assert "ImageNet" not in user_table and "global tokens/s" not in user_table


# ---------------------------------------------------------------------------------------------------------------
# REPORT.html's first screen, in a real browser

FIRST_SCREEN = """JSON.stringify((() => {
  const seen = e => { const r = e.getBoundingClientRect(); return r.height > 0 && r.top < innerHeight; };
  const whole = e => { const r = e.getBoundingClientRect(); return r.height > 0 && r.bottom <= innerHeight; };
  const v = document.querySelector('#verdict');
  return {height: innerHeight, verdict_fits: whole(v),
          items: [...document.querySelectorAll('li')].filter(seen).map(e => [e.closest('section').id, e.innerText]),
          headings: [...document.querySelectorAll('h2')].filter(seen).map(e => e.innerText),
          text: [...document.querySelectorAll('main > *')].filter(seen).map(e => e.innerText).join('\\n')};
})())"""


@pytest.fixture(scope="module")
def viewport():
    b = chromium.browser_or_skip(width=1280, height=800)  # a laptop's browser window
    yield b
    b.close()


def first_screen(browser, out) -> dict:
    got = browser.load((out / "REPORT.html").as_uri(), FIRST_SCREEN)
    assert got["errors"] == []
    return json.loads(got["value"])


def test_report_html_first_screen_on_a_busy_machine(busy_report, viewport):
    md, _, console, out = busy_report
    seen = first_screen(viewport, out)
    # the whole verdict fits the first viewport, first: what was fastest and why no winner, what did not run, then
    # one line per kind of warning; the console's lines, as the page shows them (`code` without its backticks)
    assert seen["verdict_fits"] and seen["headings"][0] == "Verdict"
    items = [text for section, text in seen["items"] if section == "verdict"]
    # (the page links its own section where the console names REPORT.md's)
    lines = [x.strip().replace("`", "").replace("REPORT.md, Skipped", "Skipped") for x in verdict_lines(console)]
    assert items == [x for x in lines if not x.endswith(":") and not x.startswith("CPU worker")]
    assert "skipped here: dp ×2 (why: Skipped and failed runs)" in items
    assert [x for x in items if x.startswith("⚠")] == [
        "⚠ disturbed: 10 of 10 runs: other processes used 36-64% of the CPUs; re-run with --wait-quiet-s",
        "⚠ impossible efficiency: 3 configurations: scaling efficiency 117-132% (limits 0 and 105%), not shown; re-run "
        "the baseline with --repeat 3 --wait-quiet-s",
        "⚠ negative loss component: 1 configuration: scaling-loss or exposed shares of -45% (limit -5%), not shown; "
        "re-run with --wait-quiet-s"]
    not_a_wall(seen, items)


def test_report_html_first_screen_on_a_quiet_machine(quiet_report, viewport):
    _, _, _, out = quiet_report
    seen = first_screen(viewport, out)
    assert seen["verdict_fits"] and seen["headings"][0] == "Verdict"
    items = [text for section, text in seen["items"] if section == "verdict"]
    assert items == [
        "resnet50 224px batch 64/device synthetic, fp32, 1 CPU worker: No winner: single, dp are within noise of each "
        "other; fastest by the medians single (40.0 img/s), 1% ahead of dp (within noise: the 95% intervals overlap).",
        "resnet50 224px batch 64/device synthetic, fp32, 2 CPU workers: Use ddp (71.0 img/s), 7% ahead of ddp_spawn (95% "
        "CI 5–9%, 3 runs each)."]
    assert "⚠" not in seen["text"] and "Warnings" not in seen["text"]
    not_a_wall(seen, items)


def not_a_wall(seen: dict, items: list[str]) -> None:
    """Below the verdict, the first viewport holds at most the start of *Verdict in detail*: no per-configuration
    warning (they say 'what to do'), no banner, a handful of bullets in all."""
    others = [(section, text) for section, text in seen["items"] if section != "verdict"]
    assert {section for section, _ in others} <= {"s-verdict-in-detail"}
    assert len(items) + len(others) <= 12
    assert "what to do" not in seen["text"] and "warnings**" not in seen["text"]

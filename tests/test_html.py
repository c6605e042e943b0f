"""REPORT.html: self-contained, escaped, the verdict on top, every plot inline; and the page in a real browser
(headless Chromium over the DevTools protocol): no console errors, no request leaves the page, the verdict and
every plot are in the DOM, the screenshot is not blank. A control page proves the checks can fail."""
import io
import re
from pathlib import Path

import pytest

from bench.commands import report
from bench.report import html
from tests import chromium
from tests.test_report import HVD, GiB, make, run_report, write
from tests.test_trace import traced

DP_MEM = [20 * GiB, 12 * GiB, 12 * GiB, 12 * GiB]


def sweep(tmp_path):
    """Three runs per configuration at 1, 2 and 4 GPUs; ddp the clear winner at 4, ddp and horovod tied at 2."""
    recs = [make(b, n, t, **kw) for b, n, ts, kw in [
        ("single", 1, (98.0, 100.0, 102.0), {}), ("ddp", 2, (180.0, 190.0, 200.0), {}),
        ("horovod", 2, (185.0, 195.0, 205.0), {"env": {"horovod": HVD}}), ("ddp", 4, (355.0, 360.0, 365.0), {}),
        ("dp", 4, (235.0, 240.0, 245.0), {"reserved": DP_MEM})] for t in ts]
    for r in recs:  # the compute-only reference (exposed communication) of the DDP runs: 10% faster
        if r["backend"] == "ddp":
            r["compute_only_window_seconds"] = [s / 1.1 for s in r["window_seconds"]]
    recs[0]["note"] = "<script>alert('not run')</script> & friends"  # text from a record is escaped, never markup
    recs[5]["trace"] = traced()  # bench run --trace: the report draws its step as a timeline
    recs.append(make("fsdp2", 4, status="skipped", reason="needs <CUDA>"))
    raw = write(tmp_path, *recs)
    (raw / "logs").mkdir()
    (raw / "logs" / f"{recs[3]['run_id']}.log").write_text("$ torchrun ...\n")
    out = tmp_path / "rep"
    code, _ = run_report(raw, out)
    assert code == 0
    return out, recs


def test_report_html_is_self_contained_escaped_and_complete(tmp_path):
    out, recs = sweep(tmp_path)
    page = (out / "REPORT.html").read_text()
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
            'img-src data:">') in page
    assert "<script" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    assert re.findall(r'\ssrc="(?!data:image/svg\+xml;base64,)', page) == []
    assert [h for h in re.findall(r'href="([^"]*)"', page) if "://" in h] == []
    assert "&lt;script&gt;alert('not run')&lt;/script&gt; &amp; friends" in page
    assert "needs &lt;CUDA&gt;" in page and "<CUDA>" not in page
    # the verdict first, then the sections; every plot the Markdown report links comes inline as its SVG
    assert page.index('<section id="verdict">') < page.index("<section id=\"s-nvidia-h100")
    md = (out / "REPORT.md").read_text()
    linked = re.findall(r"^!\[([^\]]*)\]\(plots/([^)]*)\.png\)$", md, re.M)
    assert len(linked) == len(list((out / "plots").glob("*.svg"))) >= 5
    assert re.findall(r'data-plot="([^"]+)"', page) == [kind for kind, _ in linked]
    assert '<p class="winner"><strong>Use ddp: faster than every alternative beyond the 95% intervals.' in page
    assert '<p class="no-winner"><strong>No winner established: the 95% intervals of horovod, ddp overlap' in page
    assert "dp: 33% slower (CI 31–36%), GPU 0 holds 1.7× the peak allocated memory of the others" in page
    assert "exposed communication 64.6 ms/step (9% of the step)" in page  # 64 / 90 - 64 / 99 s per step
    # every table of the Markdown report is there (one <table> per Markdown table, plus the runs and logs)
    assert page.count("<table>") == len(re.findall(r"^\|---", md, re.M)) + 1
    assert '<th class="r">ImageNet-1k epoch</th>' in page and '<td class="r">59 min 19 s</td>' in page
    assert "<strong>Horovod build:</strong> 0.28.1 (controllers: gloo, mpi; tensor_ops: nccl, gloo)" in page
    assert "git abc123" in page
    # each run, with a link to its log where one exists, relative to the page
    link = re.search(r'<a href="([^"]+)">log</a></td></tr>', page)[1]
    assert (out / link).resolve() == (tmp_path / "raw" / "logs" / f"{recs[3]['run_id']}.log").resolve()
    assert page.count("no log (not launched)") == 1 and page.count("no log file") == len(recs) - 2  # fsdp2 skipped
    # long per-run tables come folded (16 runs, 15 of them ok), the runs that did not go well listed first
    assert "<p>16 runs, 1 not ok (listed first).</p><details><summary>16 runs: show the table</summary>" in page
    assert "<details><summary>15 runs: show the table</summary>" in page  # the memory table
    runs = page.split('<section id="runs">')[1]
    assert runs.index("needs &lt;CUDA&gt;") < runs.index("<td>ok</td>")
    assert not list(out.glob(".tmp-*"))  # written through a temporary file, nothing left behind


def test_out_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    raw = write(tmp_path, make("single", 1, 100.0))
    (tmp_path / "taken").write_text("x")
    code, cap = run_report(raw, tmp_path / "taken", capsys)
    assert code == 2 and cap.out == ""
    assert cap.err == f"bench: error: --out {str(tmp_path / 'taken')!r} is a file, not a directory\n"


# --- in a real browser -------------------------------------------------------------------------------------------

DOM = """JSON.stringify({
  verdict: (document.querySelector('#verdict') || {}).innerText || '',
  plots: [...document.querySelectorAll('img[data-plot]')].map(i => [i.dataset.plot, i.complete, i.naturalWidth]),
  tables: document.querySelectorAll('table').length, height: document.body.scrollHeight})"""


@pytest.fixture(scope="module")
def browser():
    b = chromium.browser_or_skip()
    yield b
    b.close()


def colours(png: bytes) -> int:
    from PIL import Image

    return len(Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1 << 20) or [])


def test_report_html_in_headless_chromium(tmp_path, browser):
    import json

    out, _ = sweep(tmp_path)
    got = browser.load((out / "REPORT.html").as_uri(), DOM)
    assert got["errors"] == [] and got["requests"] == [(out / "REPORT.html").as_uri()]
    dom = json.loads(got["value"])
    assert "4 GPUs: Use ddp (360.0 img/s), 33% ahead of dp (95% CI 31–36%, 3 runs each)." in dom["verdict"]
    assert "2 GPUs: No winner: horovod, ddp are within noise of each other" in dom["verdict"]
    svgs = len(list((out / "plots").glob("*.svg")))
    assert len(dom["plots"]) == svgs and all(complete and width > 300 for _, complete, width in dom["plots"])
    assert [alt for alt, _, _ in dom["plots"]].count("timeline") == 1
    tables = len(re.findall(r"^\|---", (out / "REPORT.md").read_text(), re.M)) + 1  # and the runs' table
    assert dom["tables"] == tables >= 5 and dom["height"] > 3000
    assert colours(got["screenshot"]) > 50  # text, tables, the verdict's colours: not a blank page


def test_the_browser_check_fails_on_a_page_with_errors_or_external_loads(tmp_path, browser):
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><p>control</p>'
                       '<img src="http://127.0.0.1:9/x.png"><script>console.error("control error")</script></body>'
                       "</html>")
    got = browser.load(control.as_uri())
    assert "console.error: control error" in got["errors"]
    assert "http://127.0.0.1:9/x.png" in got["requests"]
    # under the report's policy the same image is refused, and the refusal is a console error
    csp = tmp_path / "csp.html"
    csp.write_text(Path(control).read_text().replace(
        "<head>", f'<head><meta http-equiv="Content-Security-Policy" content="{html.CSP}">'))
    got = browser.load(csp.as_uri())
    assert any("Content Security Policy" in e for e in got["errors"]), got["errors"]
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert colours(browser.load(blank.as_uri())["screenshot"]) == 1

"""The reporting room: records in, figures out; it reads records and never imports what plans, launches or runs a
rank. ``write`` (``python -m bench report``) makes REPORT.md, REPORT.html (self-contained, the verdict at the top),
summary.csv and plots from the raw records; the console gets the throughput tables, the paths and the verdict's first
screen, last (verdict.py ``first_screen``: a line per comparison, then a line per kind of warning). Beside it:
console.py (one line per record and the sweep's table, for ``bench run``), scaling.py (the DDP scaling model ``bench
predict`` prints and the report's prediction shows) and compare.py (``bench compare``'s tables).

Runs of one configuration (``results.config_key``) are summarised with the run as the unit
(``stats.summarise_runs``): the median of the run medians, a hierarchical bootstrap interval (runs, then
windows within a run) and the run-to-run CV; a configuration with one run gets the window bootstrap, marked
"within-run only". Different device types or
hardware models never share a table: one section per (device type, hardware), each with its own header.
Inside a section, one block per workload (model, image size, per-device batch, data); precision is a
column there, because AMP against fp32 is one of the comparisons the suite exists for.

Scaling efficiency is computed here, never stored: thr(backend, N) / (N x thr(single, 1)) with the
baseline matched on ``BASELINE_MATCH``. Backend options (Horovod compression) are the backend's own knobs
and are not matched against ``single``; the own-world-size-1 baseline matches everything but N. The cuDNN
knob is matched: a variant with cudnn.benchmark off divides by baselines measured off (on and not given are one).
"""
from __future__ import annotations

import sys
from pathlib import Path

from bench.core.errors import EXIT_BAD_INPUT, EXIT_OK
from bench.report.common import CSV_FIRST, write_atomic


def write(src: Path, out: Path) -> int:
    """Read the records in ``src``, write REPORT.md, REPORT.html, summary.csv and the plots to ``out`` and print the
    console's tables and the verdict's first screen; the exit code (docs/command-line.md, Exit codes)."""
    from bench.core.results import SCHEMA
    from bench.report import html
    from bench.report.markdown import render
    from bench.report.summary import summarise, usable_records
    from bench.report.verdict import console_lines

    src, out = Path(src), Path(out)
    if not src.is_dir():
        what = "is a file, not a directory" if src.exists() else "does not exist"
        print(f"bench: error: --results {str(src)!r} {what}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if out.exists() and not out.is_dir():
        print(f"bench: error: --out {str(out)!r} is a file, not a directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    skipped = []

    def warn(msg):
        skipped.append(msg)
        print(f"warning: {msg}", file=sys.stderr)

    recs = usable_records(src, warn)
    if not recs:
        from bench.report import accuracy, tune

        if accuracy.records(src, lambda m: None):  # bench run --to-accuracy's records alone: their section
            return accuracy.report_alone(src, out, warn)
        if tune.latest(src, lambda m: None):  # bench tune's results alone: the backends at their best
            return tune.report_alone(src, out, warn)
        # nothing to report is "nothing to run" (docs/command-line.md, Exit codes), as a missing folder is bad input
        print(f"bench: error: nothing to report: no readable schema-{SCHEMA} records, to-accuracy records or bench tune "
              f"summary in {src}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = summarise(recs)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"bench: error: cannot create --out {str(out)!r}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    md, console, verdicts = render(summary, out, src, skipped)
    write_atomic(out / "REPORT.md", md)
    page = out / "REPORT.html"
    write_atomic(page, html.page(md, summary.to_dict("records"), src, out))
    csv = summary.drop(columns=[c for c in summary.columns if c.startswith("_")]).infer_objects().round(3)
    csv[CSV_FIRST + [c for c in csv.columns if c not in CSV_FIRST]].to_csv(out / "summary.csv", index=False)
    print("\n".join(console) + f"\n\nreport: {(out / 'REPORT.md').resolve()}\nhtml:   {page.resolve()}")
    print("\n".join(["", "== Verdict"] + console_lines(verdicts, summary.to_dict("records"))))
    return EXIT_OK

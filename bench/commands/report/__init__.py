"""``python -m bench report``: REPORT.md, REPORT.html (self-contained, the verdict at the top), summary.csv and
plots from the raw records; the console gets the throughput tables, the paths and the verdict's first screen, last
(report/verdict.py ``first_screen``: a line per comparison, then a line per kind of warning).

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
knob is matched where such a baseline exists, else the baseline with the default (on) is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from bench.commands.report.common import CSV_FIRST, write_atomic
from bench.core.errors import EXIT_BAD_INPUT, EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("report", help="tables (REPORT.md, REPORT.html, summary.csv), plots and the "
                                                 "verdict from the records")
    p.add_argument("--results", default="results/raw", help="directory of JSON records (default results/raw)")
    p.add_argument("--out", default="results/report", help="output directory (default results/report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from bench.commands.report import html
    from bench.commands.report.markdown import render
    from bench.commands.report.summary import summarise, usable_records
    from bench.commands.report.verdict import console_lines
    from bench.core.results import SCHEMA

    src, out = Path(args.results), Path(args.out)
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
        from bench.commands.report import accuracy, tune

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

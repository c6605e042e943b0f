"""``python -m bench report``: the report (REPORT.md, REPORT.html, summary.csv, plots and the verdict) from a results
directory's records; the reporting room (bench/report) makes it."""
from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("report", help="tables (REPORT.md, REPORT.html, summary.csv), plots and the verdict from the "
                                      "records")
    p.add_argument("--results", default="results/raw", help="directory of JSON records (default results/raw)")
    p.add_argument("--out", default="results/report", help="output directory (default results/report)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from bench.report import write

    return write(Path(args.results), Path(args.out))

"""Progress of a sweep: on a terminal, a rich bar (runs done / total, elapsed, ETA, the current run) with each
finished run's result printed above it; elsewhere (CI logs, pipes) the same facts as plain lines:

    [3/10] ddp x2 on cpu: resnet18 64px batch 8/device fp32 ... (0:01:04 elapsed, ETA 0:02:29)
        ok: 80.4 img/s global (95% CI 78.1-82.0), 40.2 img/s per device

The ETA is the mean time of the runs done so far times the runs left (``eta``): it appears once the first run has
finished. (rich's own estimate needs two updates within its 30 s window, so with runs longer than that it said
"-:--:--" until the last run.)
"""
from __future__ import annotations

import sys

from rich.console import Console
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

KEEP = Column(no_wrap=True)  # the count, elapsed time and ETA: never cut
CUT = {"no_wrap": True, "overflow": "ellipsis", "min_width": 0}  # what a narrow terminal cuts first
UNKNOWN = "-:--:--"


def clock_text(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def eta(elapsed: float | None, done: int, total: int) -> str:
    """Time left: the mean of the runs done so far times the runs left; unknown before the first run has finished."""
    if not elapsed or done < 1:
        return UNKNOWN
    return clock_text(elapsed / done * max(0, total - done))


class EtaColumn(ProgressColumn):
    """The sweep's ETA from the runs done so far (``eta``), shown from the first finished run on."""

    def render(self, task) -> Text:
        return Text(eta(task.elapsed, int(task.completed), int(task.total or 0)), style="progress.remaining")


class Sweep:
    """``with Sweep(total) as p: p.start(text); ...; p.finish(result)`` once per run."""

    def __init__(self, total: int, stream=None, width: int | None = None, clock=time.monotonic):
        self.total, self.i, self.done = total, 0, 0
        self.clock, self.t0 = clock, clock()
        self.stream = stream or sys.stdout
        self.bar = None
        if self.stream.isatty():
            console = Console(file=self.stream, force_terminal=True, width=width)
            # At 80 columns (or fewer) the bar shrinks and the run's description and the last result are cut with an
            # ellipsis; the count, the elapsed time and the ETA always show.
            self.bar = Progress(TextColumn("[bold]sweep", table_column=KEEP),
                                BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=3)),
                                MofNCompleteColumn(table_column=KEEP), TimeElapsedColumn(table_column=KEEP),
                                TextColumn("ETA", table_column=KEEP), EtaColumn(table_column=KEEP),
                                TextColumn("now: {task.description}", table_column=Column(ratio=3, **CUT)),
                                TextColumn("last: {task.fields[last]}", table_column=Column(ratio=2, **CUT)),
                                console=console, transient=True, expand=True)

    def __enter__(self):
        if self.bar:
            self.bar.start()
            self.task = self.bar.add_task("", total=self.total, last="-")
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.stop()
        return False

    def start(self, text: str) -> None:
        self.i += 1
        line = f"[{self.i}/{self.total}] {text} ..."
        if self.done:  # the plain lines carry the same ETA as the bar, once a run has finished
            elapsed = self.clock() - self.t0
            line += f" ({clock_text(elapsed)} elapsed, ETA {eta(elapsed, self.done, self.total)})"
        if self.bar:
            self.bar.console.print(line, markup=False, highlight=False)
            self.bar.update(self.task, description=text)
        else:
            print(line, file=self.stream, flush=True)

    def say(self, text: str) -> None:
        """A line of its own, above the bar (waiting for a quiet machine, for example)."""
        if self.bar:
            self.bar.console.print(f"    {text}", markup=False, highlight=False)
        else:
            print(f"    {text}", file=self.stream, flush=True)

    def finish(self, result: str) -> None:
        self.done += 1
        if self.bar:
            self.bar.console.print(f"    {result}", markup=False, highlight=False)
            self.bar.update(self.task, advance=1, last=result[:60])
        else:
            print(f"    {result}", file=self.stream, flush=True)

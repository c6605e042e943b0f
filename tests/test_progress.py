"""The sweep's progress: plain numbered lines where stdout is not a terminal (CI logs; other tests grep them),
a rich bar with the count, the ETA, the current run and the last result on a terminal."""
import io
import re

import pytest

from bench.plan.progress import Sweep, eta


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_plain_lines_when_not_a_terminal():
    out, clock = io.StringIO(), Clock()
    with Sweep(2, stream=out, clock=clock) as p:
        p.start("single x1 on cpu: resnet18 64px")
        clock.t += 42
        p.finish("ok: 100.0 img/s global")
        p.start("ddp x2 on cpu: resnet18 64px")
        p.finish("failed: rank 1 exited 1")
    assert out.getvalue() == ("[1/2] single x1 on cpu: resnet18 64px ...\n    ok: 100.0 img/s global\n"
                              "[2/2] ddp x2 on cpu: resnet18 64px ... (0:00:42 elapsed, ETA 0:00:42)\n"
                              "    failed: rank 1 exited 1\n")


def test_the_eta_appears_after_the_first_run_on_the_bar_and_in_the_plain_lines():
    """Issue 47: the bar's ETA stayed "-:--:--" until the last run (rich's estimate needs two updates within 30 s, and
    runs are longer). The ETA is the mean of the runs done times the runs left, from the first finished run on."""
    out, clock = io.StringIO(), Clock()
    with Sweep(5, stream=out, clock=clock) as p:
        for _ in range(3):
            p.start("ddp x2 on cpu")
            clock.t += 40
            p.finish("ok")
    starts = [ln for ln in out.getvalue().splitlines() if ln.startswith("[")]
    assert starts == ["[1/5] ddp x2 on cpu ...", "[2/5] ddp x2 on cpu ... (0:00:40 elapsed, ETA 0:02:40)",
                      "[3/5] ddp x2 on cpu ... (0:01:20 elapsed, ETA 0:02:00)"]
    assert eta(None, 0, 5) == eta(40.0, 0, 5) == "-:--:--" and eta(3700.0, 1, 2) == "1:01:40"
    screen = Terminal()
    with Sweep(3, stream=screen, width=120) as p:
        p.start("single x1 on cpu")
        p.finish("ok: 100.0 img/s global")  # runs far longer than rich's 30 s window would look the same
        p.bar.refresh()
        line = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue().rsplit("\x1b[2K", 1)[-1])
    assert re.search(r"ETA \d+:\d\d:\d\d now:", line) and "-:--:--" not in line, line


def test_a_bar_with_eta_current_run_and_last_result_on_a_terminal():
    out = Terminal()
    with Sweep(2, stream=out, width=120) as p:
        p.start("single x1 on cpu")
        p.finish("ok: 100.0 img/s global")
        p.bar.refresh()
        screen = out.getvalue()
        p.start("ddp x2 on cpu")
    assert "\x1b[" in screen  # drawn with terminal control codes, not appended as lines
    assert "[1/2] single x1 on cpu ..." in screen and "    ok: 100.0 img/s global" in screen
    assert "1/2" in screen and "ETA" in screen and "now: single x1 on cpu" in screen
    assert "last: ok: 100.0 img/s global" in screen


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_narrow_terminal_cuts_the_run_s_description_before_the_count_the_elapsed_time_and_the_eta(width):
    """At 80 columns the bar once read `sweep ━ … … ETA -…`: count, elapsed time and ETA gone."""
    out = Terminal()
    with Sweep(10, stream=out, width=width) as p:
        for _ in range(3):
            p.start("ddp x2 on cpu: resnet18 64px batch 8/device fp32 (repeat 1/3)")
            p.finish("ok: 80.4 img/s global (95% CI 78.1-82.0), 40.2 img/s per device")
        p.bar.refresh()
        line = out.getvalue().rsplit("\x1b[2K", 1)[-1]
    assert "3/10" in line and "0:00:0" in line and "ETA" in line, line
    assert line.index("ETA") < line.index("now:")  # what is cut comes after what is kept
    if width < 120:
        assert "…" in line  # the description, not the count, was cut

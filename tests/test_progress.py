"""The sweep's progress: plain numbered lines where stdout is not a terminal (CI logs; other tests grep them),
a rich bar with the count, the ETA, the current run and the last result on a terminal."""
import io

import pytest

from bench.commands._progress import Sweep


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    with Sweep(2, stream=out) as p:
        p.start("single x1 on cpu: resnet18 64px")
        p.finish("ok: 100.0 img/s global")
        p.start("ddp x2 on cpu: resnet18 64px")
        p.finish("failed: rank 1 exited 1")
    assert out.getvalue() == ("[1/2] single x1 on cpu: resnet18 64px ...\n    ok: 100.0 img/s global\n"
                              "[2/2] ddp x2 on cpu: resnet18 64px ...\n    failed: rank 1 exited 1\n")


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

"""How the report draws a backend, the same in every plot: one colour and one marker per registered backend, fixed
(a backend keeps its look from report to report and from plot to plot), and the mark a warning uses, which no backend
uses.

The colours are Paul Tol's colour-blind-safe "muted" scheme (nine) and three of Okabe and Ito's (orange, blue,
vermillion), so twelve backends stay apart for readers with the common colour-vision deficiencies; the marker repeats
the identity in a second channel, for print in grey and for the colours that still sit close. No backend is black or
drawn with a circle: the warning is a black ring around the point it is about (``WARNING``). A variant of a backend (its
knobs, another precision, cuDNN's benchmark off) keeps the backend's colour and marker, hollow and with a dashed line.

Points at one world size are dodged, not stacked (``dodge``): each is moved sideways by a few pixels, in display
space, so eleven backends at world size 2 sit side by side instead of on one vertical line (tests/test_plots.py
measures it on the drawn figure)."""
from __future__ import annotations

# backend -> (colour, marker), in the registry's order
LOOK = {
    "single": ("#332288", "s"),            # indigo, square: the baseline
    "dp": ("#88CCEE", "v"),                # cyan
    "ddp": ("#117733", "^"),               # green
    "ddp_spawn": ("#44AA99", "<"),         # teal
    "ddp_amp_syncbn": ("#999933", ">"),    # olive
    "horovod": ("#DDCC77", "D"),           # sand
    "fsdp2": ("#CC6677", "P"),             # rose
    "ds_zero1": ("#882255", "X"),          # wine
    "ds_zero2": ("#AA4499", "*"),          # purple
    "ds_zero3": ("#E69F00", "h"),          # orange (Okabe-Ito)
    "ddp_zero": ("#0072B2", "p"),          # blue (Okabe-Ito)
    "allreduce_manual": ("#D55E00", "d"),  # vermillion (Okabe-Ito)
}
# a backend registered outside the twelve (your own: docs/adding-a-backend.md): greys, and markers no other uses
EXTRA = [("#777777", "H"), ("#BBBBBB", "8"), ("#4D4D4D", "1"), ("#999999", "2")]
EDGE = "#333333"  # every marker's thin dark edge: the light colours (sand, cyan) stay visible on white
MARKER_SIZE = 6.0  # points
WARNING = {"marker": "o", "color": "black", "size": 180, "linewidth": 1.6}  # a ring: a mark no backend uses


def look(backend: str, extras: dict | None = None) -> tuple[str, str]:
    """(colour, marker) of ``backend``; an unregistered one gets the next of EXTRA (``extras`` keeps the choice)."""
    if backend in LOOK:
        return LOOK[backend]
    extras = {} if extras is None else extras
    if backend not in extras:
        extras[backend] = EXTRA[len(extras) % len(EXTRA)]
    return extras[backend]


def series_styles(series: dict[str, list[dict]]) -> dict[str, dict]:
    """Matplotlib keywords per series (label -> rows): the backend's colour and marker; its second and later variants
    hollow, with a dashed (then dotted) line."""
    seen: dict[str, int] = {}
    extras: dict = {}
    out = {}
    for name, rows in series.items():
        backend = rows[0]["backend"]
        colour, marker = look(backend, extras)
        k = seen[backend] = seen.get(backend, -1) + 1
        out[name] = {"color": colour, "marker": marker, "markersize": MARKER_SIZE, "markeredgecolor": EDGE,
                     "markeredgewidth": 0.6, "linestyle": ("-", "--", ":", "-.")[k % 4],
                     **({"markerfacecolor": "white"} if k else {})}
    return out


def dodge(ax, points: list[tuple[object, float, float]], step_px: float | None = None) -> dict:
    """Positions for points that share an x: ``points`` are (key, x, y) in data coordinates, in drawing order; the
    result maps each key to its x moved sideways in display space, the points of one x centred on it ``step_px`` apart
    (default: the marker's width and a gap). Call it once the axes' scale and limits are set (it draws the figure to
    settle the layout)."""
    import numpy as np

    fig = ax.figure
    fig.draw_without_rendering()  # the layout (constrained or not) decides how many pixels a unit of x is
    step = step_px if step_px is not None else (MARKER_SIZE + 2.5) * fig.dpi / 72
    at: dict[float, list] = {}
    for key, x, y in points:
        at.setdefault(x, []).append((key, y))
    out = {}
    y0 = float(np.mean(ax.get_ylim()))
    for x, keys in at.items():
        px, _ = ax.transData.transform((x, y0))
        for i, (key, _) in enumerate(keys):
            moved = px + (i - (len(keys) - 1) / 2) * step
            out[key] = float(ax.transData.inverted().transform((moved, y0))[0])
    return out

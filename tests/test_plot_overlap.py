"""The report's plots: no legend and no label covers data (issue 38, item 3), measured on the drawn figures.

Every figure a report saves is checked as it is saved (``Figure.savefig`` wrapped): after ``fig.canvas.draw()``, the
legend's and each label's box (``get_window_extent``) must not hold a data point or overlap a bar, in display
coordinates (``ax.transData`` and the artists' own transforms); labels must not overlap each other, and a legend no
title or axis label. A control figure with its legend on a line proves the check can fail. The "vs own@1" panel is
drawn only where it has a point beyond world size 1.
"""
import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.figure  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from tests.test_first_screen import _collectives, busy_sweep, quiet_sweep, report_of  # noqa: E402
from tests.test_report import GiB, make  # noqa: E402

STEPS = 24  # points per line segment: a legend on a line between two markers covers data too


def data_of(ax, renderer):
    """The axes' data in display coordinates, clipped to the axes: points (markers, and points along every line
    segment and errorbar) and boxes (bars). Lines on the axes' own coordinates (axhline: a reference, not data) are
    not data."""
    import numpy as np

    area = ax.get_window_extent(renderer)
    points, boxes = [], []
    for line in ax.get_lines():
        if not line.get_visible() or line.get_transform() is not ax.transData:
            continue
        xy = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
        points += list(xy)
        if line.get_linestyle() not in ("None", "", " "):
            for a, b in zip(xy, xy[1:]):
                points += [a + (b - a) * t for t in np.linspace(0, 1, STEPS)]
    for patch in ax.patches:
        box = patch.get_window_extent(renderer)
        if patch.get_visible() and box.width > 0 and box.height > 0:
            boxes.append(box)
    for c in ax.collections:
        offsets = c.get_offsets()
        if len(offsets) and not isinstance(c, matplotlib.collections.LineCollection):  # scatter: markers at offsets
            points += list(c.get_offset_transform().transform(offsets))
            continue
        for path in c.get_paths():
            verts = c.get_transform().transform(path.vertices)
            if isinstance(c, matplotlib.collections.LineCollection):
                for a, b in zip(verts, verts[1:]):
                    points += [a + (b - a) * t for t in np.linspace(0, 1, STEPS)]
            else:
                boxes.append(matplotlib.transforms.Bbox.from_extents(*verts.min(axis=0), *verts.max(axis=0)))
    inside = [p for p in points if np.all(np.isfinite(p)) and area.contains(*p)]
    return inside, [b for b in boxes if b.overlaps(area)]


def shrink(box, px: float = 1.0):
    return matplotlib.transforms.Bbox.from_extents(box.x0 + px, box.y0 + px, box.x1 - px, box.y1 - px)


def collisions(fig) -> list[str]:
    """What a legend or a label covers in this figure (empty: nothing)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    found = []
    for ax in (a for a in fig.axes if a.get_visible()):
        points, boxes = data_of(ax, r)
        labels = [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        covers = [("legend", shrink(g.get_window_extent(r))) for g in legends]
        covers += [(f"label {t.get_text()!r}", shrink(t.get_window_extent(r))) for t in labels]
        for name, box in covers:
            hit = sum(box.contains(*p) for p in points) + sum(box.overlaps(b) for b in boxes)
            if hit:
                found.append(f"{name} covers {hit} data point(s) or bar(s) in the axes titled {ax.get_title()!r}")
        for a, b in itertools.combinations(labels, 2):
            if shrink(a.get_window_extent(r)).overlaps(shrink(b.get_window_extent(r))):
                found.append(f"labels {a.get_text()!r} and {b.get_text()!r} overlap")
    texts = [t for t in [fig._suptitle] + [t for ax in fig.axes if ax.get_visible() for t in
                                             (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels())]
             if t is not None and t.get_visible() and t.get_text().strip()]
    for g in legends:
        box = shrink(g.get_window_extent(r))
        found += [f"legend covers the text {t.get_text()!r}" for t in texts if box.overlaps(shrink(t.get_window_extent(r)))]
    return found


@pytest.fixture
def checked(monkeypatch):
    """Every figure saved while the fixture is active, checked once: {file stem's kind: (figure, collisions)}."""
    seen, save = {}, matplotlib.figure.Figure.savefig

    def savefig(fig, path, **kw):
        if id(fig) not in {id(f) for f, _ in seen.values()}:
            seen[str(path).rsplit("/", 1)[-1].rsplit(".", 1)[0]] = (fig, collisions(fig))
        return save(fig, path, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return seen


KINDS = ("throughput", "efficiency", "memory", "step-time", "comm-split", "timeline", "collectives")


def assert_clear(checked, kinds):
    """Every figure saved holds no collision, and figures of these kinds were among them."""
    assert {k for stem in checked for k in KINDS if stem.endswith(k) or stem.startswith(k)} >= kinds
    problems = {stem: found for stem, (_, found) in checked.items() if found}
    assert problems == {}


def test_the_check_finds_a_legend_or_a_label_on_the_data():
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([1, 2, 3], [1, 2, 3], label="a line through the middle")
    ax.legend(loc="center")
    ax.annotate("on the point", (1, 1))
    found = collisions(fig)
    assert any(x.startswith("legend covers") for x in found) and any(x.startswith("label 'on the point'") for x in found)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([0, 1], [9, 1], label="bars")
    ax.legend(loc="upper left")  # on the first bar's top
    assert [x for x in collisions(fig) if x.startswith("legend covers")]
    plt.close("all")


def test_a_busy_machine_s_plots_cover_no_data(tmp_path, checked):
    _collectives(tmp_path / "rep" / "raw")  # the bandwidth curve, with the model's gradient size marked
    report_of(tmp_path, busy_sweep())
    assert_clear(checked, {"throughput", "efficiency", "memory", "step-time", "collectives"})


def test_a_quiet_machine_s_plots_cover_no_data_and_vs_own_appears_only_with_something_to_show(tmp_path, checked):
    """The default CPU sweep runs the multi-process backends at 2 workers only: 'vs own@1' would hold dp@1's one
    dot, so the efficiency figure has one panel; with ddp at 1 and 2 it has both."""
    report_of(tmp_path, quiet_sweep())
    assert_clear(checked, {"throughput", "efficiency", "memory", "step-time"})
    [eff] = [fig for stem, (fig, _) in checked.items() if stem.endswith("efficiency")]
    assert [ax.get_title() for ax in eff.axes] == ["vs single@1"]
    checked.clear()
    report_of(tmp_path, quiet_sweep() + [make("ddp", 1, 39.0, device="cpu")], name="with-ddp1")
    [eff] = [fig for stem, (fig, _) in checked.items() if stem.endswith("efficiency")]
    assert [ax.get_title() for ax in eff.axes] == ["vs single@1", "vs own@1"]
    own = eff.axes[1]
    xs = {line.get_label(): tuple(line.get_xdata()) for line in own.get_lines()}["ddp"]  # dodged beside the others
    assert tuple(round(x) for x in xs) == (1, 2) and all(abs(x / n - 1) < 0.1 for x, n in zip(xs, (1, 2)))


def test_gpu_sweep_plots_with_bars_labels_a_split_and_a_timeline_cover_no_data(tmp_path, checked):
    """test_html's sweep (1, 2 and 4 GPUs, DataParallel's GPU 0 imbalance labelled over its bars, a traced step) with
    compute-only references on every backend (the scaling split's bars) and the cudnn.benchmark-off variant."""
    from tests.test_html import sweep

    sweep(tmp_path)
    assert_clear(checked, {"throughput", "efficiency", "memory", "step-time", "comm-split", "timeline"})
    checked.clear()
    recs = [make(b, n, t, **kw) for b, n, t, kw in [
        ("single", 1, 100.0, {}), ("ddp", 1, 98.0, {}), ("ddp", 2, 185.0, {}), ("ddp", 4, 350.0, {}),
        ("horovod", 2, 170.0, {}), ("horovod", 4, 320.0, {}), ("fsdp2", 2, 150.0, {}), ("fsdp2", 4, 280.0, {}),
        ("dp", 2, 120.0, {"reserved": [18 * GiB, 11 * GiB]}),
        ("dp", 2, 150.0, {"reserved": [16 * GiB, 11 * GiB], "cudnn": False}),
        ("dp", 4, 190.0, {"reserved": [20 * GiB, 12 * GiB, 12 * GiB, 12 * GiB]})]]
    for r in recs:
        if r["world_size"] > 1 and r["backend"] != "dp":
            r["compute_only_window_seconds"] = [s / 1.04 for s in r["window_seconds"]]
    report_of(tmp_path, recs, name="gpu")
    assert_clear(checked, {"throughput", "efficiency", "memory", "step-time", "comm-split"})


# ---------------------------------------------------------------------------------------------------
# One look per backend, and no point on top of another (issue 47, item 6)

def series_lines(ax) -> dict:
    """Each series' line with its markers, by label (an errorbar's label is its container's)."""
    named = {id(c.lines[0]): c.get_label() for c in ax.containers if getattr(c, "lines", None) and c.lines[0]}
    caps = {id(cap) for c in ax.containers if getattr(c, "lines", None) for cap in c.lines[1]}  # an interval's ends
    return {named.get(id(line), line.get_label()): line for line in ax.get_lines()
            if line.get_marker() not in (None, "None", "", " ") and line.get_transform() is ax.transData
            and id(line) not in caps}


def marker_positions(ax) -> list[tuple[str, object]]:
    """(series label, display position) of every marker the axes draw for a series."""
    return [(label, xy) for label, line in series_lines(ax).items() for xy in ax.transData.transform(line.get_xydata())]


def test_every_backend_has_its_own_colour_and_marker_and_no_two_points_share_a_place(tmp_path, checked):
    """Issue 47: all 11 world-size-2 points sat on one vertical line (horovod and fsdp2 both at 23.6, one on the
    other), fsdp2 and single shared one blue, and ddp_spawn's red read like the warning rings."""
    import numpy as np
    from matplotlib.colors import to_rgb

    import backends
    from bench.report import style

    names = backends.names()
    assert list(style.LOOK) == names and len(names) == 12  # every registered backend, in the registry's order
    colours = [to_rgb(style.LOOK[n][0]) for n in names]
    markers = [style.LOOK[n][1] for n in names]
    assert len(set(colours)) == len(set(markers)) == 12
    closest = min(np.linalg.norm(np.subtract(a, b)) for a, b in itertools.combinations(colours, 2))
    assert closest > 0.15, closest  # no two colours nearly the same
    warning = (style.WARNING["marker"], to_rgb(style.WARNING["color"]))
    assert warning[0] not in markers and warning[1] not in colours  # a warning's mark is no backend's
    # single and dp at world size 1, every backend at 2: eleven points at one world size, two of them equal
    recs = [make("single", 1, 30.0, device="cpu"), make("dp", 1, 29.0, device="cpu")]
    recs += [make(n, 2, 23.6 if n in ("horovod", "fsdp2") else 20.0 + i, device="cpu") for i, n in enumerate(names)
             if n != "single"]
    recs.append(make("ddp", 2, 21.0, device="cpu", disturbed=True,
                     disturbed_reasons=["other processes used 45% of the 2 CPUs (0.90 cores) during the timed windows"]))
    report_of(tmp_path, recs)
    assert_clear(checked, {"throughput", "efficiency"})
    for kind in ("throughput", "efficiency"):
        [fig] = [fig for stem, (fig, _) in checked.items() if stem.endswith(kind)]
        fig.canvas.draw()
        ax = fig.axes[0]
        points = marker_positions(ax)
        drawn = {label for label, _ in points}
        # efficiency: ddp's (from a disturbed run) is withheld
        assert drawn == set(names) - ({"ddp"} if kind == "efficiency" else set()), (kind, drawn)
        for label, line in series_lines(ax).items():  # each series in its backend's colour and marker
            if label in style.LOOK:
                assert (to_rgb(line.get_color()), line.get_marker()) == (to_rgb(style.LOOK[label][0]),
                                                                         style.LOOK[label][1]), label
        size = style.MARKER_SIZE * fig.dpi / 72  # a marker's width in pixels
        near = [(a, b, float(np.linalg.norm(p - q))) for (a, p), (b, q) in itertools.combinations(points, 2)
                if np.linalg.norm(p - q) < size]
        assert near == [], near  # every marker clear of every other: dodged, not stacked
        rings = [c for c in ax.collections if len(c.get_offsets()) and c.get_label().startswith("⚠")]
        assert kind != "throughput" or (len(rings) == 1 and to_rgb(rings[0].get_edgecolor()[0]) == (0.0, 0.0, 0.0))

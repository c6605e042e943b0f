"""Summary statistics of timed windows: median throughput and a 95% interval."""
from __future__ import annotations

import numpy as np
from scipy import stats


def window_throughputs(window_seconds: list[float], samples_per_window: int) -> np.ndarray:
    return samples_per_window / np.asarray(window_seconds, dtype=float)


def record_throughputs(rec: dict) -> np.ndarray | None:
    """A record's global samples/s, one per timed window; None when it has no valid window times.
    The report and the regression gate both read throughput through this, from the raw windows."""
    t = np.asarray(rec.get("window_seconds") or [], dtype=float)
    if t.size == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        return None
    return window_throughputs(t, rec["global_batch"] * rec["steps_per_window"])


def median_ci95(values) -> tuple[float, list[float]]:
    """Median and a 95% percentile-bootstrap interval of the median (fixed seed: reproducible).

    With one value, or identical values, the interval collapses to that value: there is no spread to
    estimate. Few windows give wide intervals, which is the honest answer.
    """
    x = np.asarray(values, dtype=float)
    med = float(np.median(x))
    if x.size < 2 or np.ptp(x) == 0:
        return med, [med, med]
    res = stats.bootstrap((x,), np.median, confidence_level=0.95, n_resamples=2000, method="percentile",
                          random_state=np.random.default_rng(0))
    return med, [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def imbalance(values) -> float | None:
    """max / mean over devices; 1.0 is perfectly balanced. None when nothing was measured."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size == 0 or x.mean() == 0:
        return None
    return float(x.max() / x.mean())

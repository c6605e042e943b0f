"""Every figure the report, the gate and verify share, defined once.

The run is the statistical unit. Windows of one run share that run's conditions (cuDNN's algorithm picks,
NCCL set-up, clocks, neighbours), so they agree with each other far better than runs do; treating windows as
independent samples makes intervals too narrow and a gate raise false alarms. A configuration's throughput is
therefore the median of its runs' medians, its interval a hierarchical bootstrap (runs, then windows within a
run), and the gate tests run medians. With a single run only the within-run spread is known, and every
figure built from it says "within-run only".
"""
from __future__ import annotations

import warnings

import numpy as np

# scipy.stats is imported only by the significance tests (the gate): it costs ~2 s of CPU per process, and every
# rank imports this module for the record's arithmetic.

N_RESAMPLES = 2000
WITHIN_RUN, ACROSS_RUNS = "within-run only", "across runs"
TESTS = {"welch": "Welch's t-test on log run medians (two-sided)",
         "mwu": "Mann-Whitney U on run medians (two-sided)"}


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
    """Median and a 95% percentile-bootstrap interval of the median (fixed seed: reproducible). This is the
    within-run interval of one record: it knows nothing of run-to-run spread.

    With one value, or identical values, the interval collapses to that value: there is no spread to
    estimate. Few windows give wide intervals, which is the honest answer.
    """
    x = np.asarray(values, dtype=float)
    med = float(np.median(x))
    if x.size < 2 or np.ptp(x) == 0:
        return med, [med, med]
    rng = np.random.default_rng(0)
    theta = np.sort(np.median(x[rng.integers(0, x.size, (N_RESAMPLES, x.size))], axis=-1))
    alpha = (1 - 0.95) / 2
    return med, [_quantile_linear(theta, alpha), _quantile_linear(theta, 1 - alpha)]


def _quantile_linear(ordered: np.ndarray, p: float) -> float:
    """The ``p`` quantile of sorted values, in scipy.stats.quantile's 'linear' arithmetic (Hyndman-Fan 7), so that
    ``median_ci95`` gives scipy.stats.bootstrap(method="percentile")'s interval to the bit without importing
    scipy in every rank (tests/test_compare.py compares the two)."""
    n = ordered.size
    jg = p * n + (1 - p)
    jp1 = jg // 1
    j, g = jp1 - 1, jg % 1
    lo, hi = int(min(max(j, 0), n - 1)), int(min(max(jp1, 0), n - 1))
    return float((1 - g) * ordered[lo] + g * ordered[hi])


def hierarchical_ci95(runs: list[np.ndarray], n_resamples: int = N_RESAMPLES, seed: int = 0) -> list[float]:
    """95% percentile interval of the median of run medians, resampling runs, then windows within each
    chosen run (the two levels of variation a repeated benchmark has)."""
    stat = _hierarchical_medians(runs, n_resamples, seed)
    return [float(np.percentile(stat, 2.5)), float(np.percentile(stat, 97.5))]


def bootstrap_medians(runs: list[np.ndarray | None], n_resamples: int = N_RESAMPLES, seed: int = 0) -> np.ndarray:
    """The bootstrap distribution of a configuration's median, as ``summarise_runs`` builds its interval: with one
    run its windows resampled (within-run), with several the runs, then the windows within each (hierarchical). For
    figures built from two configurations (a ratio: the harness against its plain twin, bench/core/reference.py)."""
    runs = [np.asarray(w, dtype=float) for w in runs if w is not None and len(w)]
    if len(runs) == 1:
        x = runs[0]
        rng = np.random.default_rng(seed)
        return np.median(x[rng.integers(0, x.size, (n_resamples, x.size))], axis=-1)
    return _hierarchical_medians(runs, n_resamples, seed)


def _hierarchical_medians(runs: list[np.ndarray], n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = len(runs)
    picks = rng.integers(0, r, size=(n_resamples, r))  # which run fills each slot of each resample
    run_medians = np.empty((n_resamples, r))
    for i, w in enumerate(runs):  # every slot gets its own resample of windows, whichever run it holds
        boot = rng.integers(0, w.size, size=(n_resamples, r, w.size))
        meds = np.median(w[boot], axis=2)
        run_medians[picks == i] = meds[picks == i]
    return np.median(run_medians, axis=1)


def summarise_runs(runs: list[np.ndarray | None]) -> dict:
    """One configuration's throughput from its runs (each an array of per-window throughputs):

    - ``median``: the median of the run medians (one run: its median);
    - ``ci95``: hierarchical bootstrap across runs, or the window bootstrap with one run;
    - ``interval``: ``ACROSS_RUNS`` or ``WITHIN_RUN``, to be shown next to the interval;
    - ``cv_runs``: run-to-run coefficient of variation of the run medians (None with one run).
    """
    arrays = [np.asarray(w, dtype=float) for w in runs if w is not None and len(w)]
    if not arrays:
        return {"median": None, "ci95": None, "interval": None, "runs": 0, "windows": 0, "cv_runs": None,
                "run_medians": []}
    medians = np.array([np.median(w) for w in arrays])
    if len(arrays) == 1:
        med, ci = median_ci95(arrays[0])
        kind = WITHIN_RUN
    else:
        med, ci, kind = float(np.median(medians)), hierarchical_ci95(arrays), ACROSS_RUNS
    return {"median": med, "ci95": ci, "interval": kind, "runs": len(arrays), "windows": int(sum(w.size for w in arrays)),
            "cv_runs": cv(medians), "run_medians": medians.tolist()}


def significance(base_runs, cur_runs, test: str = "welch") -> tuple[float, float]:
    """(p-value, smallest p-value the test can give for these numbers of runs) for run medians.

    welch: Welch's t-test on the log of run medians (ratios symmetric; reaches any alpha from 2 runs a side).
    mwu: Mann-Whitney U on run medians (no normality assumed; needs 5 runs a side to reach p < 0.01).
    """
    from scipy import stats

    base, cur = np.asarray(base_runs, dtype=float), np.asarray(cur_runs, dtype=float)
    n, m = base.size, cur.size
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if test == "mwu":
            p = stats.mannwhitneyu(cur, base, alternative="two-sided").pvalue
            # fully separated samples give the smallest p the test (and its method for these sizes) can reach
            min_p = stats.mannwhitneyu(np.arange(m), np.arange(m, m + n), alternative="two-sided").pvalue
        elif test == "welch":
            if n < 2 or m < 2:
                return 1.0, 1.0
            lb, lc = np.log(base), np.log(cur)
            p, min_p = stats.ttest_ind(lc, lb, equal_var=False).pvalue, 0.0
            if np.ptp(lb) == 0 and np.ptp(lc) == 0:  # no spread: the difference is exact, or there is none
                p = 1.0 if lb[0] == lc[0] else 0.0
        else:
            raise ValueError(f"unknown test {test!r}; choose from {', '.join(TESTS)}")
    p = 1.0 if not np.isfinite(p) else float(p)
    return p, float(min_p)


def imbalance(values) -> float | None:
    """max / mean over devices; 1.0 is perfectly balanced. None when nothing was measured."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size == 0 or x.mean() == 0:
        return None
    return float(x.max() / x.mean())


def cv(values) -> float | None:
    """Coefficient of variation (sample standard deviation / mean); None with fewer than two values."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size < 2 or x.mean() == 0:
        return None
    return float(np.std(x, ddof=1) / np.mean(x))


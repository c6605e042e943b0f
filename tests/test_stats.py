"""The statistics (bench/core/stats.py): throughputs from window times, the within-run interval (scipy's percentile
bootstrap to the bit, without importing scipy in the ranks), the hierarchical interval over runs, run summaries,
significance on the run medians, imbalance and the coefficient of variation. Values are pinned against numpy and
scipy, not just types."""
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.stats  # noqa: F401 - imported at collection on purpose: see tests/README.md (Mutation testing)

from bench.core import stats
from tests.conftest import REPO

pytestmark = pytest.mark.mutation


def test_throughputs_from_window_times():
    assert stats.window_throughputs([2.0, 4.0], 8).tolist() == [4.0, 2.0]
    rec = {"window_seconds": [2.0, 0.5], "global_batch": 4, "steps_per_window": 3}
    assert stats.record_throughputs(rec).tolist() == [6.0, 24.0]
    for bad in ([], None, [1.0, 0.0], [1.0, -1.0], [1.0, float("nan")], [float("inf")]):
        assert stats.record_throughputs({**rec, "window_seconds": bad}) is None, bad
    assert stats.record_throughputs({"global_batch": 4, "steps_per_window": 3}) is None
    assert stats.record_throughputs({**rec, "window_seconds": [1.0, None]}) is None  # a window never measured


def test_quantiles_interpolate_as_numpy_linear():
    ordered = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    for p in (0.0, 0.025, 0.2, 0.5, 0.7, 0.975, 1.0):
        assert stats._quantile_linear(ordered, p) == pytest.approx(float(np.quantile(ordered, p)), rel=1e-12), p
    assert stats._quantile_linear(np.array([3.0]), 0.5) == 3.0


def test_median_ci95_of_few_or_equal_values_and_its_fixed_seed():
    assert stats.median_ci95([4.0]) == (4.0, [4.0, 4.0]) and stats.median_ci95([2.0, 2.0, 2.0]) == (2.0, [2.0, 2.0])
    x = [8.56, 8.43, 6.9, 10.38, 13.73, 9.73, 10.31, 6.78]  # seed 1 would give another lower bound (6.9)
    med, (lo, hi) = stats.median_ci95(x)
    rng = np.random.default_rng(0)  # fixed: the same records give the same interval
    theta = np.sort(np.median(np.asarray(x)[rng.integers(0, 8, (stats.N_RESAMPLES, 8))], axis=-1))
    assert med == float(np.median(x)) and (lo, hi) == (float(np.quantile(theta, 0.025)), float(np.quantile(theta, 0.975)))
    assert lo == pytest.approx(7.665)
    assert stats.median_ci95(x) == (med, [lo, hi]) and lo < med < hi
    assert stats.median_ci95([3, 1, 2]) == stats.median_ci95([3.0, 1.0, 2.0])


def test_within_run_interval_is_scipy_s_percentile_bootstrap_to_the_bit_and_ranks_need_no_scipy():
    """median_ci95 resamples and interpolates as scipy.stats.bootstrap(method="percentile") does, without importing
    scipy (2 s of CPU in every rank that imports bench.core.stats)."""
    from scipy import stats as sp

    from bench.core.stats import N_RESAMPLES, _quantile_linear, median_ci95

    rng = np.random.default_rng(3)
    samples = [[10.0, 12.0], [5.0, 5.0, 6.0], list(np.round(rng.lognormal(0, 0.3, 7) * 100, 1))]
    samples += [list(rng.lognormal(0, 0.3, n) * 100) for n in (3, 5, 10, 31)]
    for x in samples:
        ref = sp.bootstrap((np.asarray(x),), np.median, confidence_level=0.95, n_resamples=N_RESAMPLES,
                           method="percentile", random_state=np.random.default_rng(0)).confidence_interval
        assert median_ci95(x) == (float(np.median(x)), [float(ref.low), float(ref.high)]), x
    alpha = (1 - 0.95) / 2  # the interpolation alone, on values that are all distinct
    for n in (N_RESAMPLES, 7, 2):
        values = np.sort(rng.normal(size=n))
        for p in (alpha, 1 - alpha, 0.5):
            assert _quantile_linear(values, p) == float(sp.quantile(values, p, method="linear")), (n, p)
    assert median_ci95([7.0]) == (7.0, [7.0, 7.0]) and median_ci95([3.0, 3.0]) == (3.0, [3.0, 3.0])
    probe = subprocess.run([sys.executable, "-c", "import sys, bench.core.stats; print('scipy' in sys.modules)"],
                           cwd=REPO, capture_output=True, text=True)
    assert probe.stdout.strip() == "False", probe.stderr


def reference_hierarchical(runs, n_resamples, seed):
    """The same definition, resample by resample: pick r runs with replacement, resample each picked run's windows,
    take the median of the resampled run medians; then the 2.5th and 97.5th percentiles over the resamples."""
    rng = np.random.default_rng(seed)
    r = len(runs)
    picks = rng.integers(0, r, size=(n_resamples, r))
    boots = [rng.integers(0, w.size, size=(n_resamples, r, w.size)) for w in runs]
    stat = [np.median([np.median(runs[picks[k, j]][boots[picks[k, j]][k, j]]) for j in range(r)])
            for k in range(n_resamples)]
    return [float(np.percentile(stat, 2.5)), float(np.percentile(stat, 97.5))]


def test_hierarchical_interval_resamples_runs_then_windows():
    # no ties in the tails: the 2.5th and 97.5th percentiles differ from their neighbours
    runs = [np.round(np.random.default_rng(405 + i).normal(10 + i, 1, 5), 3) for i in range(4)]
    for seed in (0, 3):
        assert stats.hierarchical_ci95(runs, n_resamples=64, seed=seed) == reference_hierarchical(runs, 64, seed)
    assert stats.hierarchical_ci95(runs, n_resamples=64) == reference_hierarchical(runs, 64, 0)
    assert stats.hierarchical_ci95(runs) == reference_hierarchical(runs, stats.N_RESAMPLES, 0)
    assert stats.hierarchical_ci95([np.array([5.0, 5.0])] * 3) == [5.0, 5.0]


def test_summarise_runs_one_run_several_runs_and_none():
    assert stats.summarise_runs([None, [], np.array([])]) == {
        "median": None, "ci95": None, "interval": None, "runs": 0, "windows": 0, "cv_runs": None, "run_medians": []}
    one = stats.summarise_runs([None, [1.0, 2.0, 6.0]])
    assert one == {"median": 2.0, "ci95": stats.median_ci95([1.0, 2.0, 6.0])[1], "interval": stats.WITHIN_RUN,
                   "runs": 1, "windows": 3, "cv_runs": None, "run_medians": [2.0]}
    runs = [[1.0, 2.0, 3.0], [4.0, 6.0], [5.0, 5.0, 9.0, 10.0]]
    several = stats.summarise_runs(runs)
    assert several == {"median": 5.0, "ci95": stats.hierarchical_ci95([np.asarray(w) for w in runs]),
                       "interval": stats.ACROSS_RUNS, "runs": 3, "windows": 9,
                       "cv_runs": float(np.std([2.0, 5.0, 7.0], ddof=1) / np.mean([2.0, 5.0, 7.0])),
                       "run_medians": [2.0, 5.0, 7.0]}
    assert stats.summarise_runs([[3.0], [5.0]])["median"] == 4.0


def test_significance_is_scipys_on_the_run_medians():
    from scipy import stats as sp

    base, cur = [10.0, 11.0, 10.5], [8.0, 8.5, 8.2, 8.1]
    p, floor = stats.significance(base, cur)
    assert p == float(sp.ttest_ind(np.log(cur), np.log(base), equal_var=False).pvalue) and floor == 0.0
    assert stats.significance(base, cur, "welch") == (p, floor) and p < 0.01
    p, floor = stats.significance(base, cur, "mwu")
    assert p == float(sp.mannwhitneyu(cur, base, alternative="two-sided").pvalue)
    assert floor == float(sp.mannwhitneyu(np.arange(4), np.arange(4, 7), alternative="two-sided").pvalue) > 0.05
    assert stats.significance([10.0], [8.0, 9.0]) == (1.0, 1.0) and stats.significance([10.0, 9.0], [8.0]) == (1.0, 1.0)
    assert stats.significance([5.0, 5.0], [5.0, 5.0]) == (1.0, 0.0)  # no spread and no difference
    assert stats.significance([5.0, 5.0], [4.0, 4.0]) == (0.0, 0.0)  # no spread, a difference: exact
    assert stats.significance([5.0, float("nan")], [4.0, 4.5]) == (1.0, 0.0)  # no p-value counts as none
    # spread on one side only: Welch's test, not the no-spread shortcut
    for b, c in (([10.0, 11.0, 12.0], [8.0, 8.0]), ([8.0, 8.0], [10.0, 11.0, 12.0])):
        with warnings.catch_warnings():  # scipy warns of the constant side's lost precision
            warnings.simplefilter("ignore")
            p = float(sp.ttest_ind(np.log(c), np.log(b), equal_var=False).pvalue)
        assert stats.significance(b, c) == (p, 0.0) and 0.0 < p < 1.0
    with pytest.raises(ValueError, match="unknown test 'ks'; choose from welch, mwu"):
        stats.significance(base, cur, "ks")


def test_imbalance_and_cv_ignore_missing_values():
    assert stats.imbalance([100, None, 300]) == 1.5 and stats.imbalance([]) is None
    assert stats.imbalance([None]) is None and stats.imbalance([0, 0]) is None and stats.imbalance([7]) == 1.0
    assert stats.cv([2.0, None, 4.0]) == float(np.std([2.0, 4.0], ddof=1) / 3.0)
    assert stats.cv([2.0]) is None and stats.cv([1.0, -1.0]) is None and stats.cv([None, 3.0]) is None

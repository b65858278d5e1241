"""The report's significance without per-unit scores (results recorded before them): the two seeds of a fold are
averaged first, folds pair with the baseline's (n = 5), and the decision is the paired t-test over the fold means
(Wilcoxon and Welch beside it). Every p-value here is computed by hand (numpy formulas, the t density
integrated numerically, the signed-rank distribution enumerated), never by the scipy function under test."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from alignlab.platform.fel.protocol import calculations
from alignlab.platform.report.report import _table
from alignlab.platform.report.significance import significant_gain, welch_better

POINTS = calculations()  # ten (fold, seed)
# Baseline accuracies that vary a lot from split to split (some folds are harder than others).
BASE = np.array([0.52, 0.71, 0.60, 0.80, 0.55, 0.66, 0.74, 0.58, 0.69, 0.62])
# A small gain on every split, distinct sizes (no tied ranks): paired tests see it, Welch drowns it in the
# between-split variance.
GAIN = np.array([0.010, 0.025, 0.015, 0.030, 0.005, 0.020, 0.035, 0.012, 0.018, 0.027])
# Mixed signs, distinct sizes, mean about 0.
NOISE = np.array([0.030, -0.020, 0.010, -0.040, 0.025, -0.015, 0.005, -0.035, 0.045, -0.012])


def _cell(values, points=POINTS) -> pd.DataFrame:
    return pd.DataFrame({"ft_fold": [f for f, _ in points], "ft_seed": [s for _, s in points],
                         "accuracy": list(values)})


def _folds(values) -> np.ndarray:
    """The seed-averaged value of each fold (POINTS run fold by fold, two seeds each)."""
    return np.asarray(values).reshape(-1, 2).mean(1)


def _t_two_sided(t: float, df: float) -> float:
    """2 * P(T > |t|) for Student's t with `df` degrees of freedom: the density integrated by Simpson's rule."""
    x = np.linspace(0.0, abs(t), 20001)
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = c * (1 + x ** 2 / df) ** (-(df + 1) / 2)
    h = x[1] - x[0]
    area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 2 * (0.5 - area)


def _paired_t(a, b) -> float:
    d = np.asarray(a) - np.asarray(b)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    return _t_two_sided(t, len(d) - 1)


def _welch(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return _t_two_sided(t, df)


def _wilcoxon_exact(a, b) -> float:
    """Two-sided exact signed-rank p: W+ over all 2^n sign assignments of the ranks of |d| (no ties, no zeros)."""
    d = np.asarray(a) - np.asarray(b)
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    w = ranks[d > 0].sum()
    null = np.array([sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=len(d))])
    return min(1.0, 2 * min((null <= w).mean(), (null >= w).mean()))


def test_a_consistent_gain_is_bold_by_the_paired_test_though_welch_misses_it():
    sub = BASE + GAIN
    cmp = significant_gain(_cell(sub), _cell(BASE))
    assert cmp.n_pairs == 5, "the seeds of a fold are averaged: five observations, not ten"
    assert cmp.p_paired == pytest.approx(_paired_t(_folds(sub), _folds(BASE)), rel=1e-6)
    assert cmp.p_paired < 1e-3
    assert cmp.p_wilcoxon == pytest.approx(_wilcoxon_exact(_folds(sub), _folds(BASE))) == pytest.approx(2 / 2 ** 5)
    assert cmp.p_welch == pytest.approx(_welch(sub, BASE), rel=1e-6)
    assert cmp.p_welch > 0.5, "unpaired, the split-to-split variance hides the gain"
    assert cmp.bold and cmp.mean > cmp.base_mean


def test_noise_around_the_baseline_is_not_bold():
    sub = BASE + NOISE
    cmp = significant_gain(_cell(sub), _cell(BASE))
    assert cmp.p_paired == pytest.approx(_paired_t(_folds(sub), _folds(BASE)), rel=1e-6)
    assert cmp.p_wilcoxon == pytest.approx(_wilcoxon_exact(_folds(sub), _folds(BASE)))
    assert cmp.p_welch == pytest.approx(_welch(sub, BASE), rel=1e-6)
    assert cmp.p_paired > 0.5 and not cmp.bold


def test_a_significant_loss_is_not_bold():
    cmp = significant_gain(_cell(BASE - GAIN), _cell(BASE))
    assert cmp.p_paired == pytest.approx(_paired_t(_folds(BASE - GAIN), _folds(BASE)), rel=1e-6)
    assert cmp.p_paired < 1e-3
    assert not cmp.bold


def test_a_deterministic_tie_is_not_significant():
    """Every paired difference 0 (e.g. two smoke models at chance on every split): the t statistic is 0/0,
    undefined, and the signed-rank test has no non-zero difference to rank (p = 1); not bold."""
    cmp = significant_gain(_cell(BASE), _cell(BASE.copy()))
    assert math.isnan(cmp.p_paired) and cmp.p_wilcoxon == 1.0 and not cmp.bold
    # Constant and equal across splits too: Welch's statistic is 0/0 as well (the old special case said "bold"
    # for any constant difference; a constant tie must never be).
    flat = np.full(10, 0.5)
    cmp = significant_gain(_cell(flat), _cell(flat.copy()))
    assert math.isnan(cmp.p_paired) and math.isnan(cmp.p_welch) and not cmp.bold
    assert welch_better(pd.Series(flat), pd.Series(flat.copy())) == (False, pytest.approx(float("nan"), nan_ok=True))


def test_pairs_are_matched_by_fold_and_seed_not_by_row_order():
    sub = _cell(BASE + GAIN).iloc[::-1]  # the same calculations, finished in another order
    cmp = significant_gain(sub, _cell(BASE))
    assert cmp.p_paired == pytest.approx(_paired_t(_folds(BASE + GAIN), _folds(BASE)), rel=1e-6)
    # Only folds present on both sides pair up.
    cmp = significant_gain(_cell((BASE + GAIN)[:6], POINTS[:6]), _cell(BASE))
    assert cmp.n_pairs == 3
    assert cmp.p_paired == pytest.approx(_paired_t(_folds((BASE + GAIN)[:6]), _folds(BASE[:6])), rel=1e-6)


def test_the_table_bolds_exactly_the_cells_significant_gain_marks():
    rows = []
    for col, values in (("base", BASE), ("gain", BASE + GAIN), ("noise", BASE + NOISE)):
        cell = _cell(values).assign(row="CT", col=col, perplexity=2.0)
        rows.append(cell)
    df = pd.concat(rows, ignore_index=True)
    lines, comparisons = _table(df, {"CT": ("CT", "base")}, "accuracy", "perplexity")
    cells = lines[2].split(" | ")
    assert cells[1].startswith("<u>") and cells[2].startswith("**") and not cells[3].startswith("**")
    assert set(comparisons) == {("CT", "gain"), ("CT", "noise")}
    assert comparisons[("CT", "gain")].bold and not comparisons[("CT", "noise")].bold


def _runs(diffs, jitter) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A cell and its baseline pretrained once per entry of `diffs` (pretraining seeds 0, 1, ...): in run k the
    cell is the baseline + diffs[k] + `jitter` on each (fold, seed)."""
    subs, bases = [], []
    for k, d in enumerate(diffs):
        subs.append(_cell(BASE + d + jitter).assign(pretrain_seed=k))
        bases.append(_cell(BASE).assign(pretrain_seed=k))
    return pd.concat(subs, ignore_index=True), pd.concat(bases, ignore_index=True)


def _one_sample_t(d) -> float:
    d = np.asarray(d)
    return _t_two_sided(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))), len(d) - 1)


def test_with_several_pretraining_runs_bold_needs_the_gain_to_hold_across_runs_not_only_within_them():
    jitter = (GAIN - GAIN.mean()) * 0.5  # zero mean per run: a run's mean difference is its diffs[k]
    # Two runs gain ~1 point, the third loses a little: 30 pairs look convincing, three runs do not.
    sub, base = _runs([0.010, 0.012, -0.001], jitter)
    cmp = significant_gain(sub, base)
    assert cmp.n_pairs == 15 and cmp.n_runs == 3 and cmp.method == "pretraining runs"
    assert cmp.p_paired < 0.01, "within the runs the pairs agree"
    assert cmp.p_runs == pytest.approx(_one_sample_t([0.010, 0.012, -0.001]), rel=1e-4)
    assert cmp.p_runs > 0.2 and not cmp.bold, "the decision is the test over the pretraining runs"
    # Every run gains about the same: bold.
    sub, base = _runs([0.010, 0.012, 0.011], jitter)
    cmp = significant_gain(sub, base)
    assert cmp.p_runs == pytest.approx(_one_sample_t([0.010, 0.012, 0.011]), rel=1e-4)
    assert cmp.p_runs < 0.01 and cmp.bold
    # Runs pair by seed: a run the baseline lacks pairs with nothing.
    cmp = significant_gain(sub, base[base["pretrain_seed"] < 2])
    assert cmp.n_runs == 2 and cmp.n_pairs == 10


def test_one_pretraining_run_per_column_keeps_the_paired_test_as_the_decision():
    sub, base = _runs([0.0], GAIN)
    cmp = significant_gain(sub, base)
    assert cmp.n_runs == 1 and math.isnan(cmp.p_runs)
    assert cmp.p_paired == pytest.approx(_paired_t(_folds(BASE + GAIN), _folds(BASE)), rel=1e-6) and cmp.bold
    assert cmp.method == "folds" and cmp.p == cmp.p_paired

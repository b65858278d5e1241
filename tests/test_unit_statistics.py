"""The report's resampling statistics against hand computations: Holm's correction on a small vector, the paired
bootstrap interval against the same resamples drawn and summarised with numpy, the permutation test against the
enumerated sign flips, seeds averaged within each fold, units shared by folds resampled whole, and the bold rule
deciding on the Holm-corrected p."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from alignlab.platform.report.significance import Comparison, correct_family, significant_gain
from alignlab.platform.report.unit_statistics import (bootstrap_ci, fold_means, holm, paired_units, permutation_p,
                                                      unit_columns, unit_table)


def test_holm_multiplies_the_ith_smallest_by_m_minus_i_and_keeps_the_order():
    # Sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06 (monotone).
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # An undefined test is not in the family: m = 2.
    out = holm([0.02, float("nan"), 0.04])
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0]), "capped at 1"


def test_the_bootstrap_interval_is_the_percentiles_of_the_same_resamples_drawn_with_numpy():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 4, 60).astype(float), rng.integers(0, 4, 60).astype(float)
    n = np.full(60, 4.0)

    def diff(a, b, n, axis=-1):
        return (a - b).sum(axis=axis) / n.sum(axis=axis)

    lo, hi = bootstrap_ci((a, b, n), diff, seed=3, n_resamples=2000)
    idx = np.random.default_rng(3).integers(0, 60, (2000, 60))  # units drawn with replacement, pairs kept
    stats = (a[idx] - b[idx]).sum(-1) / n[idx].sum(-1)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])))
    # And near the normal approximation: mean difference +- 1.96 standard errors (population sd / sqrt(units)).
    d = (a - b) / 4
    se = d.std(ddof=0) / math.sqrt(60)
    assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.02) and hi == pytest.approx(d.mean() + 1.96 * se, abs=0.02)
    assert bootstrap_ci((a[:1], b[:1], n[:1]), diff) == (pytest.approx(float("nan"), nan_ok=True),) * 2


def test_the_permutation_p_is_the_share_of_sign_flips_at_least_as_extreme():
    a, b = np.array([1.0, 2.0, 3.0, 4.0, 0.0]), np.array([0.0, 0.0, 0.0, 1.0, 2.0])
    d = a - b  # 1, 2, 3, 3, -2: observed sum 7
    flips = np.array([sum(s * x for s, x in zip(signs, d)) for signs in itertools.product((1, -1), repeat=5)])
    hand = 2 * min((flips >= d.sum()).mean(), (flips <= d.sum()).mean())
    assert permutation_p(a, b) == pytest.approx(min(1.0, hand))
    assert permutation_p(a, a.copy()) == 1.0, "every difference 0: nothing to tell apart"


def _calc(fold, seed, correct, keys=("u0", "u1", "u2"), count=(2, 2, 2), **extra):
    return {"ft_fold": fold, "ft_seed": seed, "accuracy": sum(correct) / sum(count), "unit_keys": list(keys),
            "unit_count": list(count), "unit_correct": list(correct), **extra}


def test_seeds_are_averaged_within_each_fold_before_any_test():
    df = pd.DataFrame([_calc(0, 0, (2, 0, 1)), _calc(0, 1, (0, 0, 1)), _calc(1, 0, (2, 2, 2)), _calc(1, 1, (2, 2, 0))])
    means = fold_means(df, "accuracy", ["ft_fold"])
    assert means.to_dict() == pytest.approx({0: (3 / 6 + 1 / 6) / 2, 1: (6 / 6 + 4 / 6) / 2})
    t = unit_table(df, "accuracy", ["ft_fold"])
    assert t.loc[(0, "u0"), "correct"] == 1.0 and t.loc[(1, "u2"), "correct"] == 1.0
    assert t.loc[(0, "u0"), "count"] == 2.0 and len(t) == 6


def test_a_unit_tested_in_every_fold_is_one_unit_and_disjoint_folds_pool_their_units():
    shared = pd.DataFrame([_calc(f, s, (2, 1, 0)) for f in range(2) for s in range(2)])
    base = pd.DataFrame([_calc(f, s, (1, 1, 0)) for f in range(2) for s in range(2)])
    a, b, n = paired_units(shared, base, "accuracy", ["ft_fold"])
    assert list(a) == [2, 1, 0] and list(b) == [1, 1, 0] and list(n) == [2, 2, 2], "CT: one test set, 3 units"
    sub = pd.DataFrame([_calc(0, 0, (2, 1), keys=("x", "y"), count=(2, 2)),
                        _calc(1, 0, (0, 2), keys=("z", "w"), count=(2, 2))])
    a, b, n = paired_units(sub, sub.copy(), "accuracy", ["ft_fold"])
    assert len(a) == 4, "AD: each fold tests its own snippets; together they are all the units"


def test_unit_columns_name_each_metrics_per_unit_scores():
    assert unit_columns("accuracy") == ("unit_keys", "unit_count", "unit_correct")
    assert unit_columns("best_accuracy")[2] == "unit_correct_at_best_accuracy"
    assert unit_columns("eval_ood_accuracy") == ("eval_ood_unit_keys", "eval_ood_unit_count", "eval_ood_unit_correct")


def _cell(rng, p_right: float, folds: int = 5, units: int = 120) -> pd.DataFrame:
    keys = [f"t{i}" for i in range(units)]
    rows = []
    for f in range(folds):
        for s in range(2):
            correct = (rng.random(units) < p_right).astype(int) * 2
            rows.append(_calc(f, s, tuple(correct), keys=keys, count=(2,) * units))
    return pd.DataFrame(rows)


def test_with_per_unit_scores_the_decision_resamples_units_and_reports_an_interval():
    rng = np.random.default_rng(0)
    sub, base = _cell(rng, 0.85), _cell(rng, 0.60)
    cmp = significant_gain(sub, base, floor=0.5)
    assert cmp.method == "test units" and cmp.n_units == 120 and cmp.n_pairs == 5
    a, b, n = paired_units(sub, base, "accuracy", ["ft_fold"])
    assert cmp.diff == pytest.approx((a - b).sum() / n.sum())
    assert cmp.ci_low < cmp.diff < cmp.ci_high and cmp.ci_low > 0
    assert cmp.p < 0.001 and cmp.bold
    # The same gain, but the cell's interval does not clear a strong context-free baseline: not bold.
    assert not significant_gain(sub, base, floor=0.84).bold


def test_bold_is_decided_on_the_holm_corrected_p_over_the_whole_family():
    def cmp(p):
        return Comparison(5, 0.8, 0.7, p, p, p, True, method="test units", diff=0.1, ci_low=0.05, ci_high=0.15, p=p,
                          p_holm=p, cell_ci_low=0.75)

    tables = {"accuracy": {("CT", "a"): cmp(0.01), ("CT", "b"): cmp(0.03)}, "ood": {("AD", "a"): cmp(0.04)}}
    out = correct_family(tables)
    assert out["accuracy"][("CT", "a")].p_holm == pytest.approx(0.03) and out["accuracy"][("CT", "a")].bold
    assert out["accuracy"][("CT", "b")].p_holm == pytest.approx(0.06) and not out["accuracy"][("CT", "b")].bold
    assert out["ood"][("AD", "a")].p_holm == pytest.approx(0.06) and not out["ood"][("AD", "a")].bold

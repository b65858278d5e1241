"""The report's decision (`unit_statistics`) against hand computations: the crossed design's two-way ANOVA with
Satterthwaite's degrees of freedom, the nested design as a t-test over the replicates, the pooled (ratio) difference,
Holm's correction, the stated outcomes of degenerate cases, and how result rows become paired cells (seeds averaged
within a fold, shared test units crossed with the folds, each fold's own units nested, pretraining runs as the
replicates). Its error rates are measured by simulation in tests/test_calibration.py."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from alignlab.platform.report.unit_statistics import (Evidence, compare, holm, paired_test, replicate_t, unit_columns,
                                                      unit_table)


def _t_two_sided(t: float, df: float) -> float:
    """2 * P(T > |t|) for Student's t with `df` degrees of freedom: the density integrated by Simpson's rule."""
    x = np.linspace(0.0, abs(t), 20001)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    f = c * (1 + x ** 2 / df) ** (-(df + 1) / 2)
    h = x[1] - x[0]
    area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 2 * (0.5 - area)


def test_holm_multiplies_the_ith_smallest_by_m_minus_i_and_keeps_the_order():
    # Sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06 (monotone).
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # An undefined test is not in the family: m = 2.
    out = holm([0.02, float("nan"), 0.04])
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0]), "capped at 1"


def _crossed(rng, R=5, U=40, fold_sd=0.0, unit_sd=0.0, gain=0.0):
    n = rng.integers(1, 6, U).astype(float)
    fold = rng.normal(0, fold_sd, (R, 1))
    unit = rng.normal(0, unit_sd, (1, U))
    pa = np.clip(0.6 + gain + fold + unit, 0.01, 0.99)
    ca = rng.binomial(np.broadcast_to(n, (R, U)).astype(int), pa).astype(float)
    cb = rng.binomial(np.broadcast_to(n, (R, U)).astype(int), 0.6, (R, U)).astype(float)
    return n, ca, cb


def test_the_crossed_decision_is_the_two_way_anova_of_the_linearised_difference_with_cochran_cox_critical_values():
    from scipy import stats as sps

    rng = np.random.default_rng(3)
    R, U = 5, 40
    n, ca, cb = _crossed(rng, R, U, fold_sd=0.05, unit_sd=0.15, gain=0.03)
    N = np.broadcast_to(n, (R, U))
    ev = paired_test({"folds": np.repeat(np.arange(R), U)}, np.tile(np.arange(U), R), ca.ravel(), N.ravel(),
                     cb.ravel(), N.ravel())
    ra, rb = ca.sum() / N.sum(), cb.sum() / N.sum()
    assert ev.diff == pytest.approx(ra - rb)
    # By hand: z = linearised contribution of each cell; the sums of squares of a two-way layout without replication.
    nbar = N.mean()
    z = [[((ca[r, u] - ra * n[u]) - (cb[r, u] - rb * n[u])) / nbar for u in range(U)] for r in range(R)]
    grand = sum(map(sum, z)) / (R * U)
    row = [sum(z[r]) / U for r in range(R)]
    col = [sum(z[r][u] for r in range(R)) / R for u in range(U)]
    ms_r = U * sum((x - grand) ** 2 for x in row) / (R - 1)
    ms_u = R * sum((x - grand) ** 2 for x in col) / (U - 1)
    ms_e = sum((z[r][u] - row[r] - col[u] + grand) ** 2 for r in range(R) for u in range(U)) / ((R - 1) * (U - 1))
    assert ms_u > ms_e, "this example has a unit component"
    # The units' mean square carries the degrees of freedom its squares show (fewer than U - 1 when uneven).
    sq = [(x - grand) ** 2 for x in col]
    mean_sq = sum(sq) / U
    var_sq = sum((x - mean_sq) ** 2 for x in sq) / U
    df_u = min(U - 1, 2 * (U - 1) * mean_sq ** 2 / var_sq)
    parts = [(ms_r / (R * U), R - 1),
             ((ms_u - ms_e) / (R * U), (ms_u - ms_e) ** 2 / (ms_u ** 2 / df_u + ms_e ** 2 / ((R - 1) * (U - 1))))]
    se = math.sqrt(sum(v for v, _ in parts))

    def critical(alpha):  # Cochran & Cox: the parts' t quantiles weighted by the parts' variances
        return sum(v * sps.t.isf(alpha / 2, d) for v, d in parts) / se ** 2

    assert ev.design == "crossed" and ev.n_replicates == R and ev.n_units == U
    assert ev.se == pytest.approx(se)
    assert ev.ci_high - ev.diff == pytest.approx(critical(0.05) * se) == pytest.approx(ev.diff - ev.ci_low)
    lo, hi = 1e-12, 1.0  # p: the alpha at which the critical value meets |t|, by bisection
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if critical(mid) > abs(ev.diff) / se else (lo, mid)
    assert ev.p == pytest.approx(mid, rel=1e-4)
    assert R - 1 < ev.df < U - 1, "the t whose critical value equals the blend's lies between the parts'"


def test_without_a_unit_component_the_crossed_decision_is_the_t_test_over_the_replicates():
    """Where the units' mean square does not exceed the residual one, the units add nothing: the variance is the
    replicates' mean square alone, with its R - 1 degrees of freedom."""
    rng = np.random.default_rng(0)
    seen = 0
    for _ in range(30):
        n, ca, cb = _crossed(rng, 5, 60)
        N = np.broadcast_to(n, ca.shape)
        ev = paired_test({"folds": np.repeat(np.arange(5), 60)}, np.tile(np.arange(60), 5), ca.ravel(), N.ravel(), cb.ravel(),
                         N.ravel())
        if ev.df == 4:
            seen += 1
            d = (ca - cb).sum(1) / N.sum(1)  # equal counts per replicate: the fold accuracies' differences
            t = d.mean() / (d.std(ddof=1) / math.sqrt(5))
            assert ev.p == pytest.approx(_t_two_sided(t, 4), abs=1e-6)
    assert seen > 0


def test_the_nested_decision_with_equal_folds_is_the_paired_t_test_over_the_fold_means():
    rng = np.random.default_rng(1)
    R, per = 5, 30
    reps, units = np.repeat(np.arange(R), per), np.arange(R * per)
    n = np.full(R * per, 2.0)
    ca, cb = rng.binomial(2, 0.7, R * per).astype(float), rng.binomial(2, 0.6, R * per).astype(float)
    ev = paired_test({"folds": reps}, units, ca, n, cb, n)
    d = np.array([(ca[reps == r] - cb[reps == r]).sum() / (2 * per) for r in range(R)])
    t = d.mean() / (d.std(ddof=1) / math.sqrt(R))
    assert ev.design == "nested" and ev.df == R - 1 and ev.n_units == R * per
    assert ev.diff == pytest.approx(d.mean())
    assert ev.p == pytest.approx(_t_two_sided(t, R - 1), abs=1e-6)


def test_a_ratio_of_pooled_counts_is_the_difference_and_each_side_may_count_its_own_units():
    # A context-free baseline scores every word; a model only the words within its length: other counts per unit.
    reps, units = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    ev = paired_test({"folds": reps}, units, [3, 1, 2, 2], [4, 2, 4, 2], [2, 2, 1, 3], [5, 3, 5, 3])
    assert ev.diff == pytest.approx(8 / 12 - 8 / 16)


def test_degenerate_comparisons_have_a_stated_outcome_and_no_p_value_that_could_make_them_bold():
    none = paired_test({"folds": []}, [], [], [], [], [])
    assert math.isnan(none.p) and "no shared splits" in none.outcome
    one = paired_test({"folds": [0, 0]}, [0, 1], [1, 2], [2, 2], [0, 1], [2, 2])
    assert math.isnan(one.p) and "one fold" in one.outcome
    reps, units, n = np.repeat(np.arange(5), 4), np.arange(20), np.full(20, 2.0)
    constant = paired_test({"folds": reps}, units, np.full(20, 2.0), n, np.full(20, 1.0), n)
    assert constant.diff == pytest.approx(0.5) and math.isnan(constant.p) and "no spread" in constant.outcome
    tie = paired_test({"folds": reps}, units, np.ones(20), n, np.ones(20), n)
    assert tie.p == 1.0 and tie.diff == 0.0 and "no difference" in tie.outcome


def _one_class_null(rng, R=5, U=332, flipping=0.01, flip=0.2):
    """A null in which one side predicts one class on every unit of every fold (its correctness is the label) and the
    other does the same but flips a few units now and then, whatever their label: the population difference is 0,
    and the units' component is barely above the residual, so Satterthwaite gives it a fraction of a degree of
    freedom. AD's out-of-domain set read by a model that never left one class is this case."""
    label = rng.integers(0, 2, U)
    cb = np.tile((label == 0).astype(float), (R, 1))
    flips = rng.random((R, U)) < np.where(rng.random(U) < flipping, flip, 0.0)[None, :]
    ca = np.where(flips, 1 - cb, cb)
    n = np.ones(R * U)
    return paired_test({"folds": np.repeat(np.arange(R), U)}, np.tile(np.arange(U), R), ca.ravel(), n, cb.ravel(), n)


def test_a_variance_part_with_a_fraction_of_a_degree_of_freedom_counts_one_and_keeps_the_interval_finite_and_valid():
    rng = np.random.default_rng(11)
    studies = [_one_class_null(rng) for _ in range(400)]
    tested = [ev for ev in studies if ev.tested]
    assert len(tested) > 300
    widths = np.array([ev.ci_high - ev.ci_low for ev in tested])
    assert widths.max() < 0.1, f"an interval {widths.max():.3g} wide: a fractional-df part blew up the blend"
    assert min(d for ev in tested for _, d in ev.parts) == 1.0, "some part's Satterthwaite df fell below 1 and was floored"
    reject = np.mean([ev.p < 0.05 for ev in tested])
    cover = np.mean([ev.ci_low <= 0 <= ev.ci_high for ev in tested])
    assert reject <= 0.05 + 2.6 * math.sqrt(0.05 * 0.95 / len(tested)), f"false positives {reject:.3f}"
    assert cover >= 0.95 - 2.6 * math.sqrt(0.05 * 0.95 / len(tested)), f"coverage {cover:.3f}"


def test_units_in_some_folds_but_not_all_are_decided_as_partly_crossed():
    rng = np.random.default_rng(2)
    reps = np.array([0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4])
    units = np.array([0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 6, 0])
    n = np.full(12, 3.0)
    ev = paired_test({"folds": reps}, units, rng.binomial(3, 0.7, 12), n, rng.binomial(3, 0.5, 12), n)
    assert ev.design == "partly crossed" and ev.df == 4


def test_a_partly_crossed_difference_carried_by_the_units_alone_counts_their_spread():
    """Each fold holds one unit where A wins and one where B wins, so the folds agree exactly: all of the
    difference's spread is between the test units, and a variance without their part would be zero."""
    reps = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    units = np.array([0, 1, 1, 2, 2, 3, 3, 0])
    n = np.full(8, 3.0)
    a_wins = units % 2 == 0
    ev = paired_test({"folds": reps}, units, np.where(a_wins, 3.0, 0.0), n, np.where(a_wins, 0.0, 2.0), n)
    assert ev.design == "partly crossed" and ev.diff == pytest.approx(1 / 6)
    assert ev.se > 0.3 and ev.p > 0.5 and ev.ci_low < 0 < ev.ci_high


def test_without_per_unit_scores_the_fallback_is_a_paired_t_over_the_replicates_and_says_so():
    x, y = np.array([0.71, 0.74, 0.69, 0.77, 0.72]), np.array([0.70, 0.71, 0.70, 0.73, 0.69])
    ev = replicate_t({"folds": np.arange(5)}, x, y)
    d = x - y
    assert ev.design == "replicates only" and "holds the test units fixed" in ev.outcome
    assert ev.p == pytest.approx(_t_two_sided(d.mean() / (d.std(ddof=1) / math.sqrt(5)), 4), abs=1e-6)


def _calc(fold, seed, correct, keys=("u0", "u1", "u2"), count=(2, 2, 2), **extra):
    return {"ft_fold": fold, "ft_seed": seed, "accuracy": sum(correct) / sum(count), "unit_keys": list(keys),
            "unit_count": list(count), "unit_correct": list(correct), **extra}


def test_seeds_are_averaged_within_each_fold_before_any_test():
    df = pd.DataFrame([_calc(0, 0, (2, 0, 1)), _calc(0, 1, (0, 0, 1)), _calc(1, 0, (2, 2, 2)), _calc(1, 1, (2, 2, 0))])
    t = unit_table(df, unit_columns("accuracy"), ["ft_fold"])
    assert t.loc[(0, "u0"), "correct"] == 1.0 and t.loc[(1, "u2"), "correct"] == 1.0
    assert t.loc[(0, "u0"), "count"] == 2.0 and len(t) == 6


def test_shared_test_units_are_crossed_with_the_folds_and_each_folds_own_units_are_nested():
    rng = np.random.default_rng(4)
    cols = unit_columns("accuracy")
    keys = [f"t{i}" for i in range(30)]
    shared = [pd.DataFrame([_calc(f, s, tuple(rng.binomial(2, p, 30)), keys=keys, count=(2,) * 30)
                            for f in range(5) for s in range(2)]) for p in (0.8, 0.6)]
    ev = compare(shared[0], cols, shared[1], cols, "accuracy", "accuracy", "accuracy")
    assert ev.design == "crossed" and ev.n_units == 30 and ev.n_replicates == 5 and ev.over == "folds"
    own = [pd.DataFrame([_calc(f, s, tuple(rng.binomial(2, p, 6)), keys=[f"s{f}-{i}" for i in range(6)],
                               count=(2,) * 6) for f in range(5) for s in range(2)]) for p in (0.8, 0.6)]
    ev = compare(own[0], cols, own[1], cols, "accuracy", "accuracy", "accuracy")
    assert ev.design == "nested" and ev.n_units == 30 and ev.df == 4


def test_with_several_pretraining_runs_the_runs_are_the_replicates_and_unmatched_seeds_pair_in_order():
    rng = np.random.default_rng(5)
    cols = unit_columns("accuracy")
    keys = [f"t{i}" for i in range(20)]

    def cell(p, seeds):
        return pd.DataFrame([_calc(f, s, tuple(rng.binomial(2, p, 20)), keys=keys, count=(2,) * 20, pretrain_seed=r)
                             for r in seeds for f in range(5) for s in range(2)])

    ev = compare(cell(0.8, (0, 1, 2)), cols, cell(0.6, (0, 1, 2)), cols, "accuracy", "accuracy", "accuracy")
    assert ev.over == "pretraining runs" and ev.n_replicates == 3 and ev.design == "crossed" and not ev.outcome
    assert ev.df == 2, "with so few replicates, their own degrees of freedom"
    ev = compare(cell(0.8, (0, 1, 2)), cols, cell(0.6, (5, 6, 7)), cols, "accuracy", "accuracy", "accuracy")
    assert ev.n_replicates == 3 and "paired in seed order" in ev.outcome
    # One pretraining run each, with other seeds (an untrained control seeded otherwise): the folds pair.
    ev = compare(cell(0.8, (0,)), cols, cell(0.6, (3,)), cols, "accuracy", "accuracy", "accuracy")
    assert ev.over == "folds" and ev.n_replicates == 5 and not ev.outcome


def test_results_without_per_unit_scores_are_compared_over_the_fold_accuracies():
    a = pd.DataFrame([{"ft_fold": f, "ft_seed": s, "accuracy": 0.7 + 0.01 * f + 0.002 * s} for f in range(5)
                      for s in range(2)])
    b = a.assign(accuracy=a["accuracy"] - 0.01 + 0.001 * a["ft_fold"])
    ev = compare(a, unit_columns("accuracy"), b, unit_columns("accuracy"), "accuracy", "accuracy", "accuracy")
    assert isinstance(ev, Evidence) and ev.design == "replicates only" and ev.n_replicates == 5
    assert ev.diff == pytest.approx((0.01 - 0.001 * np.arange(5)).mean())


def test_unit_columns_name_each_metrics_per_unit_scores():
    assert unit_columns("accuracy") == ("unit_keys", "unit_count", "unit_correct")
    assert unit_columns("best_accuracy")[2] == "unit_correct_at_best_accuracy"
    assert unit_columns("eval_ood_accuracy") == ("eval_ood_unit_keys", "eval_ood_unit_count", "eval_ood_unit_correct")

"""The report's decision on results recorded without per-unit scores (older trial files): the two seeds of a fold are
averaged first, folds pair with the baseline's, and the decision is the paired t-test over the fold (or, with
several pretraining runs, the run) means, which says it holds the test units fixed. Every p-value here is computed
by hand (numpy formulas, the t density integrated numerically), never by the scipy function under test."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from alignlab.platform.fel.protocol import calculations
from alignlab.platform.report.report import _table, all_comparisons
from alignlab.platform.report.significance import MODEL, against_model, bold_cells

POINTS = calculations()  # ten (fold, seed)
# Baseline accuracies that vary a lot from split to split (some folds are harder than others).
BASE = np.array([0.52, 0.71, 0.60, 0.80, 0.55, 0.66, 0.74, 0.58, 0.69, 0.62])
# A small gain on every split, distinct sizes: a paired test sees it through the between-split variance.
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
    x = np.linspace(0.0, abs(t), 20001)
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    f = c * (1 + x ** 2 / df) ** (-(df + 1) / 2)
    h = x[1] - x[0]
    area = h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())
    return 2 * (0.5 - area)


def _paired_t(a, b) -> float:
    d = np.asarray(a) - np.asarray(b)
    return _t_two_sided(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))), len(d) - 1)


def test_a_consistent_gain_is_significant_over_the_fold_means():
    ev = against_model(_cell(BASE + GAIN), _cell(BASE), "accuracy")
    assert ev.n_replicates == 5, "the seeds of a fold are averaged: five observations, not ten"
    assert ev.design == "replicates only" and "holds the test units fixed" in ev.outcome
    assert ev.p == pytest.approx(_paired_t(_folds(BASE + GAIN), _folds(BASE)), rel=1e-6)
    assert ev.p < 1e-3 and ev.diff > 0 and ev.ci_low > 0


def test_noise_around_the_baseline_and_a_loss_are_not_significant_gains():
    ev = against_model(_cell(BASE + NOISE), _cell(BASE), "accuracy")
    assert ev.p == pytest.approx(_paired_t(_folds(BASE + NOISE), _folds(BASE)), rel=1e-6) and ev.p > 0.5
    loss = against_model(_cell(BASE - GAIN), _cell(BASE), "accuracy")
    assert loss.p < 1e-3 and loss.diff < 0


def test_a_deterministic_tie_is_not_significant():
    """Every paired difference 0 (e.g. two smoke models at chance on every split): p = 1, stated."""
    ev = against_model(_cell(BASE), _cell(BASE.copy()), "accuracy")
    assert ev.p == 1.0 and ev.diff == 0.0 and "no difference" in ev.outcome
    # A constant non-zero difference has no spread to test it by: no p at all, so it can never be bold.
    ev = against_model(_cell(BASE + 0.01), _cell(BASE), "accuracy")
    assert math.isnan(ev.p) and "no spread" in ev.outcome


def test_pairs_are_matched_by_fold_not_by_row_order():
    ev = against_model(_cell(BASE + GAIN).iloc[::-1], _cell(BASE), "accuracy")
    assert ev.p == pytest.approx(_paired_t(_folds(BASE + GAIN), _folds(BASE)), rel=1e-6)
    ev = against_model(_cell((BASE + GAIN)[:6], POINTS[:6]), _cell(BASE), "accuracy")
    assert ev.n_replicates == 3, "only folds present on both sides pair up"
    assert ev.p == pytest.approx(_paired_t(_folds((BASE + GAIN)[:6]), _folds(BASE[:6])), rel=1e-6)


def test_the_table_bolds_exactly_the_cells_the_decision_marks():
    rows = []
    for col, values in (("base", BASE), ("gain", BASE + GAIN), ("noise", BASE + NOISE)):
        rows.append(_cell(values).assign(row="CT", col=col, perplexity=2.0))
    df = pd.concat(rows, ignore_index=True)
    tests = all_comparisons(df.assign(best_accuracy=df["accuracy"]), {"CT": ("CT", "base")})
    bold = bold_cells(tests)
    assert {(c.col, c.kind) for c in tests if c.metric == "accuracy"} == {("gain", MODEL), ("noise", MODEL)}
    assert bold[("accuracy", "CT", "gain")] and not bold[("accuracy", "CT", "noise")]
    cells = _table(df, {"CT": ("CT", "base")}, "accuracy", "perplexity", bold=bold)[2].split(" | ")
    assert cells[1].startswith("<u>") and cells[2].startswith("**") and not cells[3].startswith("**")


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


def test_with_several_pretraining_runs_a_gain_must_hold_across_runs_not_only_within_them():
    jitter = (GAIN - GAIN.mean()) * 0.5  # zero mean per run: a run's mean difference is its diffs[k]
    # Two runs gain ~1 point, the third loses a little: 30 calculations look convincing, three runs do not.
    sub, base = _runs([0.010, 0.012, -0.001], jitter)
    ev = against_model(sub, base, "accuracy")
    assert ev.over == "pretraining runs" and ev.n_replicates == 3
    assert ev.p == pytest.approx(_one_sample_t([0.010, 0.012, -0.001]), rel=1e-4) and ev.p > 0.2
    # Every run gains about the same: significant.
    sub, base = _runs([0.010, 0.012, 0.011], jitter)
    ev = against_model(sub, base, "accuracy")
    assert ev.p == pytest.approx(_one_sample_t([0.010, 0.012, 0.011]), rel=1e-4) and ev.p < 0.01
    # Runs pair by seed: a run the baseline lacks pairs with nothing.
    ev = against_model(sub, base[base["pretrain_seed"] < 2], "accuracy")
    assert ev.n_replicates == 2 and "without a partner" in ev.outcome


def test_one_pretraining_run_per_column_decides_over_its_folds():
    sub, base = _runs([0.0], GAIN)
    ev = against_model(sub, base, "accuracy")
    assert ev.over == "folds" and ev.n_replicates == 5
    assert ev.p == pytest.approx(_paired_t(_folds(BASE + GAIN), _folds(BASE)), rel=1e-6)

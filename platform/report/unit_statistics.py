"""The resampling statistics of the report: seeds averaged within each fold, a paired bootstrap confidence interval
and a paired permutation test over test units, and Holm's correction over the comparisons of one report.

Why units: every calculation of a cell is scored on test units (`Task.test_unit`: CT texts, AD snippets), and all
CT calculations share one test set, so the spread of ten calculations says nothing about how the result would move
on other texts. Resampling the units (the same unit in every fold together) puts the test set's sampling variance
into the interval. The two seeds of a fold train on one sample and test on one set, so they are averaged before any
test: a fold, not a calculation, is one observation (n = 5 per pretraining run).
All resampling is seeded (`SEED`): the same results give the same report, digit for digit.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats as sps

CONFIDENCE = 0.95
NUM_RESAMPLES = 9999
SEED = 0
FOLD_KEY = "ft_fold"


def unit_columns(metric: str) -> tuple[str, str, str]:
    """The result columns (unit keys, scored counts, correct counts) holding `metric`'s per-test-unit scores:
    "accuracy" -> unit_*, "best_accuracy" -> the same units scored at the best-accuracy epoch, and an extra test
    set's "eval_<name>_accuracy" -> eval_<name>_unit_*."""
    if metric == "best_accuracy":
        return "unit_keys", "unit_count", "unit_correct_at_best_accuracy"
    prefix = metric[: -len("accuracy")] if metric.endswith("accuracy") else f"{metric}_"
    return f"{prefix}unit_keys", f"{prefix}unit_count", f"{prefix}unit_correct"


def fold_means(df: pd.DataFrame, metric: str, blocks: list[str]) -> pd.Series:
    """`metric` averaged over the seeds of each block (a fold, within a pretraining run when `blocks` names it)."""
    return df.dropna(subset=[metric]).groupby(blocks)[metric].mean()


def _has_units(df: pd.DataFrame, metric: str) -> bool:
    cols = unit_columns(metric)
    if df.empty or not all(c in df.columns for c in cols):
        return False
    rows = df.dropna(subset=[metric])
    return len(rows) > 0 and all(isinstance(v, (list, np.ndarray)) for c in cols for v in rows[c])


def unit_table(df: pd.DataFrame, metric: str, blocks: list[str]) -> pd.DataFrame | None:
    """One row per (block, unit): the unit's scored count and its correct count averaged over the block's seeds;
    None where the rows have no per-unit scores (results from before they were recorded)."""
    if not _has_units(df, metric):
        return None
    kcol, ncol, ccol = unit_columns(metric)
    parts = []
    for _, r in df.dropna(subset=[metric]).iterrows():
        keys = list(r[kcol])
        part = pd.DataFrame({"unit": keys, "count": np.asarray(r[ncol], float), "correct": np.asarray(r[ccol], float)})
        for b in blocks:
            part[b] = r[b]
        parts.append(part)
    return pd.concat(parts).groupby([*blocks, "unit"])[["count", "correct"]].mean()


def paired_units(sub: pd.DataFrame, base: pd.DataFrame, metric: str, blocks: list[str]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(cell correct, baseline correct, count) per test unit, over the blocks both sides have: a unit tested in
    several blocks (CT's one test set, in every fold) is one unit, its blocks averaged, so it is resampled whole."""
    a, b = unit_table(sub, metric, blocks), unit_table(base, metric, blocks)
    if a is None or b is None:
        return None
    j = a.join(b, lsuffix="_a", rsuffix="_b", how="inner")
    if j.empty:
        return None
    per_unit = j.groupby(level="unit", sort=False).mean()
    return (per_unit["correct_a"].to_numpy(), per_unit["correct_b"].to_numpy(), per_unit["count_a"].to_numpy())


def _difference(a, b, n, axis=-1):
    return (a - b).sum(axis=axis) / n.sum(axis=axis)


def _accuracy(a, n, axis=-1):
    return a.sum(axis=axis) / n.sum(axis=axis)


def bootstrap_ci(data: tuple[np.ndarray, ...], statistic, *, seed: int = SEED,
                 n_resamples: int = NUM_RESAMPLES) -> tuple[float, float]:
    """95% percentile interval of `statistic` over units resampled with replacement (`scipy.stats.bootstrap`,
    paired: a unit's values move together). A single unit has no spread to resample: (nan, nan)."""
    if len(data[0]) < 2:
        return math.nan, math.nan
    res = sps.bootstrap(data, statistic, paired=True, vectorized=True, n_resamples=n_resamples,
                        confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def permutation_p(a: np.ndarray, b: np.ndarray, *, seed: int = SEED, n_resamples: int = NUM_RESAMPLES) -> float:
    """Two-sided p of the paired difference sum(a - b): each unit's two scores swapped at random (sign flips;
    `scipy.stats.permutation_test`, exact when 2^units <= `n_resamples`). Every difference 0: p = 1; fewer
    than two units: nan."""
    if len(a) < 2:  # one unit: two sign flips, never evidence
        return math.nan
    res = sps.permutation_test((a, b), lambda x, y, axis=-1: (x - y).sum(axis=axis), permutation_type="samples",
                               vectorized=True, n_resamples=n_resamples, rng=np.random.default_rng(seed))
    return float(min(1.0, res.pvalue))


def unit_evidence(a: np.ndarray, b: np.ndarray, n: np.ndarray) -> dict[str, float]:
    """The difference sum(a - b) / sum(n) in accuracy, its bootstrap CI and permutation p, and the cell's own
    accuracy CI (for the context-free floor), over paired test units."""
    lo, hi = bootstrap_ci((a, b, n), _difference)
    cell_lo, _ = bootstrap_ci((a, n), _accuracy)
    return {"diff": float(_difference(a, b, n)), "ci_low": lo, "ci_high": hi, "p": permutation_p(a, b),
            "cell_ci_low": cell_lo, "n_units": len(a)}


def t_evidence(x: np.ndarray, y: np.ndarray | None = None) -> dict[str, float]:
    """The t interval and p of mean(x - y) (or of mean(x) when `y` is None: its interval only), where the
    observations are folds or pretraining runs rather than test units."""
    d = x - y if y is not None else x
    if len(d) < 2:
        return {"diff": float(d.mean()) if len(d) else math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan}
    with warnings.catch_warnings():  # zero-variance or nearly identical samples only lose precision
        warnings.simplefilter("ignore", RuntimeWarning)
        t = sps.ttest_1samp(d, 0.0)
        ci = t.confidence_interval(CONFIDENCE)
    return {"diff": float(d.mean()), "ci_low": float(ci.low), "ci_high": float(ci.high), "p": float(t.pvalue)}


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values: the i-th smallest of m is multiplied by (m - i + 1), kept monotone and
    capped at 1 (scipy has no Holm). nan (an undefined test) stays nan and is not counted in m."""
    p = np.asarray(p_values, float)
    out = np.full_like(p, np.nan)
    defined = np.flatnonzero(~np.isnan(p))
    order = defined[np.argsort(p[defined], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        out[i] = running
    return out

"""Is a study cell above its baseline? The report's significance tests, in one place.

Calculations pair by (fold, seed) with the baseline's: the same (fold, seed) trains, validates and tests on the
same examples, so a paired t-test decides (Wilcoxon signed-rank and Welch's unpaired t-test beside it). That
test holds each pretrained model fixed. When a cell and its baseline were pretrained several times
(`--pretrain-seeds`, `RUN_KEY`), the pairs stay within a run and the decision is a t-test over the runs'
mean differences: the runs, not the splits, are what a pretraining recipe's effect must hold across.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import pandas as pd
from scipy import stats as sps

P_VALUE = 0.05
PAIR_KEYS = ("ft_fold", "ft_seed")
"""What pairs a cell's calculations with its baseline's: the same (fold, seed) means the same splits."""
RUN_KEY = "pretrain_seed"
"""The pretraining run of a calculation's model (its `PretrainConfig.seed`, from study.json). Calculations pair
within a run; the decision is taken across runs when a cell and its baseline share two or more."""


@dataclass(frozen=True)
class Comparison:
    """A cell against its baseline on one metric. p-values are two-sided; nan where a test is undefined."""

    n_pairs: int
    """Calculations of the cell with a baseline calculation of the same (fold, seed)."""
    mean: float
    """Mean of the cell over the paired calculations."""
    base_mean: float
    p_paired: float
    """Paired t-test (`scipy.stats.ttest_rel`) over the pairs: the decision when there is one pretraining run."""
    p_wilcoxon: float
    """Wilcoxon signed-rank test over the pairs (exact for <= 50 pairs without zero differences)."""
    p_welch: float
    """Welch's t-test (`ttest_ind(equal_var=False)`), unpaired, over all calculations of each cell."""
    bold: bool
    n_runs: int = 1
    """Pretraining runs (seeds) that the cell and its baseline share; 1 when each column is one pretrained model."""
    p_runs: float = float("nan")
    """With two or more runs, the decision: one-sample t-test of the per-run mean differences (df = runs - 1)."""


def _quiet(test, *args, **kwargs) -> float:
    """A scipy test's p-value; nan where it is undefined (too few values)."""
    with warnings.catch_warnings():  # zero-variance or nearly identical samples only lose precision
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return float(test(*args, **kwargs).pvalue)
        except ValueError:
            return float("nan")


def significant_gain(sub: pd.DataFrame, base: pd.DataFrame, metric: str = "accuracy",
                     floor: float = float("nan")) -> Comparison:
    """Is `sub`'s `metric` significantly above `base`'s? The one place the report's **bold** is decided.

    Rows pair by (fold, seed) (`PAIR_KEYS`), within a pretraining run (`RUN_KEY`) when the rows say which. Bold =
    paired t-test p < `P_VALUE` (with two or more shared pretraining runs: the t-test over the runs' mean
    differences instead, `p_runs`), the paired mean is higher,
    and (when `floor` is given: the strongest context-free baseline) the cell's mean is above `floor` -- an
    effect that a model-free rule matches is no evidence for the model. No special cases: a deterministic tie (every difference 0) has no t statistic (p = nan) and is not
    significant; a constant non-zero difference is what the t-test says it is."""
    keys = [RUN_KEY, *PAIR_KEYS] if RUN_KEY in sub.columns and RUN_KEY in base.columns else list(PAIR_KEYS)
    a = sub.dropna(subset=[metric]).groupby(keys)[metric].mean()
    b = base.dropna(subset=[metric]).groupby(keys)[metric].mean()
    pairs = pd.concat([a.rename("sub"), b.rename("base")], axis=1, join="inner")
    x, y = pairs["sub"].to_numpy(float), pairs["base"].to_numpy(float)
    n = len(pairs)
    p_paired = _quiet(sps.ttest_rel, x, y) if n >= 2 else float("nan")
    p_wilcoxon = _quiet(sps.wilcoxon, x, y) if n >= 2 else float("nan")
    wa, wb = sub[metric].dropna().to_numpy(float), base[metric].dropna().to_numpy(float)
    p_welch = _quiet(sps.ttest_ind, wa, wb, equal_var=False) if len(wa) >= 2 and len(wb) >= 2 else float("nan")
    mean, base_mean = (float(x.mean()), float(y.mean())) if n else (float("nan"), float("nan"))
    above_floor = math.isnan(floor) or sub[metric].dropna().mean() > floor
    # Across pretraining runs: each run's mean difference over its pairs is one observation. The pairs of one run
    # share one pretrained model, so they are not independent evidence about the recipe.
    per_run = (pairs["sub"] - pairs["base"]).groupby(level=RUN_KEY).mean().to_numpy(float) if RUN_KEY in keys else []
    n_runs = max(1, len(per_run))
    p_runs = _quiet(sps.ttest_1samp, per_run, 0.0) if n_runs >= 2 else float("nan")
    decision = p_runs if n_runs >= 2 else p_paired
    return Comparison(n, mean, base_mean, p_paired, p_wilcoxon, p_welch,
                      bool(decision < P_VALUE and mean > base_mean and above_floor), n_runs, p_runs)


def welch_better(a: pd.Series, b: pd.Series) -> tuple[bool, float]:
    """Is mean(a) greater than mean(b) by two-sided Welch's t-test, p < 0.05? Unpaired; the report's bold is
    `significant_gain` (paired). No special case: two constant, equal samples have p = nan (not significant)."""
    a, b = a.dropna().to_numpy(float), b.dropna().to_numpy(float)
    p = _quiet(sps.ttest_ind, a, b, equal_var=False) if len(a) >= 2 and len(b) >= 2 else float("nan")
    return bool(p < P_VALUE and a.mean() > b.mean()), p


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.3g}"


def significance_section(tables: dict[str, dict[tuple[str, str], Comparison]], baselines: dict[str, tuple[str, str]]) -> list[str]:
    """Every compared cell's p-values: paired t (the bold decision with one pretraining run per column; with
    several, the t-test over the runs), Wilcoxon signed-rank, Welch (unpaired)."""
    runs = max((cmp.n_runs for comparisons in tables.values() for cmp in comparisons.values()), default=1)
    if runs >= 2:
        scope = (f"Each column was pretrained {runs} times (`--pretrain-seeds`); calculations pair by (pretraining "
                 f"seed, fold, seed). **bold** = the t-test over the pretraining runs (each run's mean paired difference "
                 f"is one observation, df = runs − 1) p < {P_VALUE}, a higher mean, and a mean above the row's "
                 "strongest context-free baseline. The paired t, Wilcoxon and Welch tests over the calculations are "
                 "shown beside it; they treat the pretrained models as fixed.")
    else:
        scope = (f"Calculations paired by (fold, seed). **bold** = paired t-test p < {P_VALUE}, a higher mean, and a "
                 "mean above the row's strongest context-free baseline; the Wilcoxon signed-rank test (paired) and "
                 "Welch's t-test (unpaired) are shown beside it. **Scope:** each column is one pretraining run, so "
                 "these tests treat its pretrained model as fixed: they say whether *these models* differ on these "
                 "splits, not whether the pretraining recipes do (another pretraining seed gives another model). "
                 "Rerun the study with `--pretrain-seeds 3` to test across pretraining runs.")
    out = ["## Significance against the baseline", "", scope + " – : undefined (e.g. a deterministic tie: every "
           "paired difference 0).", "",
           "| metric | row | cell | baseline | mean − baseline (points) | pairs | paired t p | Wilcoxon p | Welch p "
           "| pretraining runs | runs t p | bold |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for metric, comparisons in tables.items():
        for (r, c), cmp in comparisons.items():
            br, bc = baselines[r]
            diff = "–" if math.isnan(cmp.mean) else f"{100 * (cmp.mean - cmp.base_mean):+.2f}"
            out.append(f"| {metric} | {r} | {c} | {br} / {bc} | {diff} | {cmp.n_pairs} | {_p(cmp.p_paired)} | "
                       f"{_p(cmp.p_wilcoxon)} | {_p(cmp.p_welch)} | {cmp.n_runs} | {_p(cmp.p_runs)} | "
                       f"{'yes' if cmp.bold else 'no'} |")
    return out

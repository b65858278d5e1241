"""Is a study cell above its baseline? The report's significance tests and its **bold** rule, in one place.

Observations: the two seeds of a fold train on the same sample and test on the same set, so they are averaged
first; a fold is one observation (n = 5 per pretraining run), paired with the baseline's same fold. The decision
(`Comparison.method`):
- "test units" (one pretraining run per column, per-unit scores recorded): a paired permutation test and a paired
  bootstrap 95% interval over the test units (CT texts, AD snippets; `unit_statistics`), so the test set's
  sampling variance is in the interval. It holds the pretrained models fixed.
- "pretraining runs" (`--pretrain-seeds`, `RUN_KEY`: two or more runs shared): a t-test and t interval over the
  runs' mean paired differences; the runs, not the splits, are what a pretraining recipe's effect must hold across.
- "folds" (results recorded before per-unit scores): a paired t-test and t interval over the five fold means.
The paired t and Wilcoxon over the fold means and Welch's unpaired t over the calculations stay beside it.
Holm's correction (`correct_family`) runs over every comparison of one report. Bold = Holm-corrected p < 0.05, a
positive difference, and the lower end of the cell's own 95% interval above the strongest context-free baseline.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from alignlab.platform.report.unit_statistics import FOLD_KEY, NUM_RESAMPLES, fold_means, holm, paired_units, t_evidence, unit_evidence

P_VALUE = 0.05
PAIR_KEYS = (FOLD_KEY, "ft_seed")
"""What pairs a cell's calculations with its baseline's: the same (fold, seed) means the same splits."""
RUN_KEY = "pretrain_seed"
"""The pretraining run of a calculation's model (its `PretrainConfig.seed`, from study.json). Calculations pair
within a run; the decision is taken across runs when a cell and its baseline share two or more."""


@dataclass(frozen=True)
class Comparison:
    """A cell against its baseline on one metric. p-values are two-sided; nan where a test is undefined.
    Differences and intervals are in accuracy (0-1), cell minus baseline."""

    n_pairs: int
    """Folds (seeds averaged) of the cell with the baseline's same fold, over all pretraining runs."""
    mean: float
    """Mean of the cell over the paired folds."""
    base_mean: float
    p_paired: float
    """Paired t-test (`scipy.stats.ttest_rel`) over the fold means."""
    p_wilcoxon: float
    """Wilcoxon signed-rank test over the fold means (exact; with 5 folds its smallest p is 0.0625)."""
    p_welch: float
    """Welch's t-test (`ttest_ind(equal_var=False)`), unpaired, over all calculations of each cell."""
    bold: bool
    n_runs: int = 1
    """Pretraining runs (seeds) that the cell and its baseline share; 1 when each column is one pretrained model."""
    p_runs: float = math.nan
    """With two or more runs: one-sample t-test of the per-run mean differences (df = runs - 1)."""
    method: str = "folds"
    """What the decision resamples or counts: "test units", "pretraining runs" or "folds"."""
    diff: float = math.nan
    """The difference the decision is about (test units: pooled over the units, sum of correct / sum scored)."""
    ci_low: float = math.nan
    ci_high: float = math.nan
    """95% interval of `diff`."""
    p: float = math.nan
    """The decision's p before correction (test units: permutation; runs: `p_runs`; folds: `p_paired`)."""
    p_holm: float = math.nan
    """`p` after Holm's correction over the report's family (`correct_family`); alone, `p` itself."""
    n_units: int = 0
    """Test units paired (0 where the results have no per-unit scores)."""
    cell_ci_low: float = math.nan
    """Lower end of the cell's own 95% accuracy interval (by the decision's method): what must clear `floor`."""
    floor: float = math.nan
    """The strongest context-free baseline's mean accuracy over the cell's calculations (nan: none)."""


def _quiet(test, *args, **kwargs) -> float:
    """A scipy test's p-value; nan where it is undefined (too few values)."""
    with warnings.catch_warnings():  # zero-variance or nearly identical samples only lose precision
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return float(test(*args, **kwargs).pvalue)
        except ValueError:
            return float("nan")


def is_bold(cmp: Comparison, p: float) -> bool:
    """The bold rule: corrected p < `P_VALUE`, a positive difference, and the cell's interval above the floor."""
    above_floor = math.isnan(cmp.floor) or cmp.cell_ci_low > cmp.floor
    return bool(p < P_VALUE and cmp.diff > 0 and above_floor)


def significant_gain(sub: pd.DataFrame, base: pd.DataFrame, metric: str = "accuracy",
                     floor: float = float("nan")) -> Comparison:
    """`sub` against `base` on `metric` (`floor`: the strongest context-free baseline's mean accuracy). `bold` here
    is for a family of one; `correct_family` decides it over a report's comparisons."""
    runs = RUN_KEY in sub.columns and RUN_KEY in base.columns
    blocks = [RUN_KEY, FOLD_KEY] if runs else [FOLD_KEY]
    pairs = pd.concat([fold_means(sub, metric, blocks).rename("sub"), fold_means(base, metric, blocks).rename("base")],
                      axis=1, join="inner")
    x, y = pairs["sub"].to_numpy(float), pairs["base"].to_numpy(float)
    n = len(pairs)
    p_paired = _quiet(sps.ttest_rel, x, y) if n >= 2 else float("nan")
    p_wilcoxon = _quiet(sps.wilcoxon, x, y) if n >= 2 else float("nan")
    wa, wb = sub[metric].dropna().to_numpy(float), base[metric].dropna().to_numpy(float)
    p_welch = _quiet(sps.ttest_ind, wa, wb, equal_var=False) if len(wa) >= 2 and len(wb) >= 2 else float("nan")
    mean, base_mean = (float(x.mean()), float(y.mean())) if n else (float("nan"), float("nan"))
    # Across pretraining runs: each run's mean difference over its folds is one observation. The folds of one run
    # share one pretrained model, so they are not independent evidence about the recipe.
    diffs = pairs["sub"] - pairs["base"]
    per_run = diffs.groupby(level=RUN_KEY).mean().to_numpy(float) if runs else np.array([])
    n_runs = max(1, len(per_run))
    units = paired_units(sub, base, metric, blocks) if n_runs < 2 else None
    if n_runs >= 2:
        method, ev = "pretraining runs", t_evidence(per_run)
        cell_lo = t_evidence(pairs["sub"].groupby(level=RUN_KEY).mean().to_numpy(float))["ci_low"]
    elif units is not None:
        method, ev = "test units", unit_evidence(*units)
        cell_lo = ev["cell_ci_low"]
    else:
        method, ev = "folds", t_evidence(x, y)
        cell_lo = t_evidence(x)["ci_low"]
    cmp = Comparison(n, mean, base_mean, p_paired, p_wilcoxon, p_welch, False, n_runs,
                     ev["p"] if n_runs >= 2 else float("nan"), method, ev["diff"], ev["ci_low"], ev["ci_high"],
                     ev["p"], ev["p"], len(units[0]) if units is not None else 0, cell_lo, floor)
    return dataclasses.replace(cmp, bold=is_bold(cmp, cmp.p))


def correct_family(tables: dict[str, dict]) -> dict[str, dict]:
    """Every comparison of a report (all metrics, rows, cells and test sets: one family) with Holm's corrected p
    and the bold decision on it. Same shape as `tables`."""
    flat = [(m, k, c) for m, comparisons in tables.items() for k, c in comparisons.items()]
    adjusted = holm([c.p for _, _, c in flat])
    out: dict[str, dict] = {m: {} for m in tables}
    for (m, k, c), p in zip(flat, adjusted):
        out[m][k] = dataclasses.replace(c, p_holm=float(p), bold=is_bold(c, float(p)))
    return out


def welch_better(a: pd.Series, b: pd.Series) -> tuple[bool, float]:
    """Is mean(a) greater than mean(b) by two-sided Welch's t-test, p < 0.05? Unpaired; the report's bold is
    `significant_gain` (paired). No special case: two constant, equal samples have p = nan (not significant)."""
    a, b = a.dropna().to_numpy(float), b.dropna().to_numpy(float)
    p = _quiet(sps.ttest_ind, a, b, equal_var=False) if len(a) >= 2 and len(b) >= 2 else float("nan")
    return bool(p < P_VALUE and a.mean() > b.mean()), p


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.3g}"


def _pts(v: float, sign: bool = True) -> str:
    return "–" if math.isnan(v) else (f"{100 * v:+.2f}" if sign else f"{100 * v:.2f}")


def one_run_note(runs: int) -> str:
    """What a table resting on one pretraining run per column can and cannot say (empty with several runs)."""
    if runs >= 2:
        return ""
    return ("**This table rests on one pretraining run per column**: the tests treat its pretrained model as fixed, so "
            "it says whether *these models* differ on these test units, not whether the pretraining recipes do "
            "(another pretraining seed gives another model). Rerun the study with `--pretrain-seeds 3` to test "
            "across pretraining runs.")


def significance_section(tables: dict[str, dict[tuple[str, str], Comparison]], baselines: dict[str, tuple[str, str]],
                         unit_names: str = "test units") -> list[str]:
    """Every compared cell: the difference from its baseline with its 95% interval, the decision's p before and
    after Holm's correction over the whole table (the report's family), and the paired t and Wilcoxon over the
    fold means and Welch over the calculations beside it (`unit_names`: what the tasks' test units are)."""
    flat = [c for comparisons in tables.values() for c in comparisons.values()]
    runs = max((c.n_runs for c in flat), default=1)
    family = (f"**Family for Holm's correction: all {len(flat)} comparisons below** (every compared cell against "
              f"its baseline, on every metric and test set of this report).")
    decision = ("**Decision**: the seeds of each fold are averaged first (a fold is one observation). With one "
                f"pretraining run per column: a paired permutation test and a paired bootstrap 95% interval over the "
                f"test units ({unit_names}; a unit tested in several folds is resampled whole; {NUM_RESAMPLES} "
                "resamples, seeded); results recorded before per-unit scores fall back to a t-test and t interval over "
                "the fold means (decision over: folds). With several pretraining runs (`--pretrain-seeds`): a t-test "
                "and t interval over the runs' mean differences (df = runs − 1).")
    bold = (f"**Bold** = Holm-corrected p < {P_VALUE}, a positive difference, and the lower end of the cell's own 95% "
            "interval (same method) above the row's strongest context-free baseline.")
    out = ["## Significance against the baseline", "", family, "", decision, "", bold, ""]
    if runs >= 2:
        out += [f"Each column was pretrained {runs} times (`--pretrain-seeds`): the decision is taken over the "
                "pretraining runs.", ""]
    else:
        out += [one_run_note(runs), ""]
    out += ["Difference and interval in accuracy points (cell − baseline). – : undefined (e.g. a deterministic tie).",
            "",
            "| metric | row | cell | baseline | difference (points) | 95% CI (points) | decision over | n | p | Holm p "
            "| paired t p (folds) | Wilcoxon p (folds) | Welch p | pretraining runs | bold |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for metric, comparisons in tables.items():
        for (r, c), cmp in comparisons.items():
            br, bc = baselines[r]
            n = {"test units": cmp.n_units, "pretraining runs": cmp.n_runs}.get(cmp.method, cmp.n_pairs)
            ci = "–" if math.isnan(cmp.ci_low) else f"[{_pts(cmp.ci_low)}, {_pts(cmp.ci_high)}]"
            out.append(f"| {metric} | {r} | {c} | {br} / {bc} | {_pts(cmp.diff)} | {ci} | {cmp.method} | {n} | "
                       f"{_p(cmp.p)} | {_p(cmp.p_holm)} | {_p(cmp.p_paired)} | {_p(cmp.p_wilcoxon)} | "
                       f"{_p(cmp.p_welch)} | {cmp.n_runs} | {'yes' if cmp.bold else 'no'} |")
    return out

"""Is a study cell above its baseline? The report's tests, its Holm family and its **bold** rule, in one place.

Every test is the same paired decision (`unit_statistics.paired_test`: finetuning samples and seeds, test units,
and pretraining runs when there are several, all in the interval), and there are three kinds of them:
- **against the baseline model** (`MODEL`): each compared cell against its row's baseline cell, on every metric
  and test set of the report;
- **against the strongest context-free baseline** (`FLOOR`): the same cell against the row's strongest rule
  (a lexicon, a span matcher), paired on the same calculations' test units;
- **against the untrained model** (`UNTRAINED`, a positive control where the study has an untrained column):
  every pretrained cell of a row against that row's untrained cell, at the best-perplexity epoch.
One Holm family holds every test of a report. **Bold** = above the baseline model *and* above the strongest
context-free baseline, each with a Holm-corrected p < 0.05 (an intersection-union rule: both must hold). An effect
that a rule with no model can match is no evidence for the model.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd

from alignlab.platform.report.unit_statistics import (RUN_KEY, Evidence, baseline_accuracy_column,
                                                      baseline_unit_columns, compare, holm, unit_columns)

P_VALUE = 0.05
MODEL, FLOOR, UNTRAINED = "baseline model", "context-free", "untrained"
KINDS = (MODEL, FLOOR, UNTRAINED)


@dataclass(frozen=True)
class Comparison:
    """One test of the report: `col` in `row` against `against` (a cell, or a context-free baseline's name) on
    `metric` (accuracy 0-1, cell minus reference)."""

    metric: str
    row: str
    col: str
    kind: str
    against: str
    ev: Evidence
    p_holm: float = math.nan
    """`ev.p` after Holm's correction over every test of the report (`correct_family`); alone, `ev.p` itself."""

    @property
    def diff(self) -> float:
        return self.ev.diff

    @property
    def significant(self) -> bool:
        """Above its reference: Holm-corrected p < P_VALUE and a positive difference."""
        p = self.ev.p if math.isnan(self.p_holm) else self.p_holm
        return bool(p < P_VALUE and self.ev.diff > 0)


def against_model(sub: pd.DataFrame, base: pd.DataFrame, metric: str) -> Evidence:
    """`sub`'s calculations against `base`'s (another cell) on `metric`, paired on the same splits."""
    cols = unit_columns(metric)
    return compare(sub, cols, base, cols, metric, metric, metric)


def against_floor(sub: pd.DataFrame, metric: str, name: str) -> Evidence:
    """`sub`'s calculations against context-free baseline `name` fitted and scored on the very same calculations
    (same budget, same test units)."""
    acc = baseline_accuracy_column(metric, name)
    if acc not in sub.columns or sub[acc].isna().all():
        return Evidence(math.nan, outcome=f"no scores of the {name} baseline in these results; not compared")
    return compare(sub, unit_columns(metric), sub.dropna(subset=[acc]), baseline_unit_columns(metric, name), metric,
                   metric, acc)


def correct_family(comparisons: list[Comparison]) -> list[Comparison]:
    """Every test of a report (one family) with Holm's corrected p."""
    adjusted = holm([c.ev.p for c in comparisons])
    return [dataclasses.replace(c, p_holm=float(p)) for c, p in zip(comparisons, adjusted)]


def bold_cells(comparisons: list[Comparison]) -> dict[tuple[str, str, str], bool]:
    """(metric, row, col) -> bold: significantly above its baseline model and, where the row has a context-free
    baseline, significantly above that too."""
    tests: dict[tuple[str, str, str], dict[str, Comparison]] = {}
    for c in comparisons:
        tests.setdefault((c.metric, c.row, c.col), {})[c.kind] = c
    out = {}
    for key, kinds in tests.items():
        if MODEL not in kinds:
            continue
        floor = kinds.get(FLOOR)
        out[key] = kinds[MODEL].significant and (floor is None or floor.significant)
    return out


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.3g}"


def _pts(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:+.2f}"


def generalises_over(runs: int) -> str:
    """What the report's verdict is about, in a sentence."""
    if runs >= 2:
        return (f"**The verdict generalises over other pretraining runs of the same recipes** ({runs} runs per column "
                "are the replicates), and over other finetuning samples, seeds and test texts.")
    return ("**This table rests on one pretraining run per column.** Its verdict generalises over other finetuning "
            "samples of the budget (from the same pool), other finetuning seeds and other test texts *of these "
            "pretrained models*; not over other pretraining runs: another pretraining seed gives another model. "
            "Rerun the study with `--pretrain-seeds 3` to test the recipes across pretraining runs.")


DECISION_TEXT = (
    "**Decision** (docs/statistics.md): one paired test for every comparison. The two seeds of a fold are averaged "
    "(each calculation's randomness is its own); the replicates are the folds (with one pretraining run per column) "
    "or the pretraining runs (with several). The variance of the difference is the replicates' part plus, where the "
    "data show one, the test units' own part ({units}): where every fold is scored on the same units (crossed) from "
    "the random-effects ANOVA of replicates × units, where each fold has its own (nested) inside the replicates' "
    "totals. p and the 95% interval use Cochran & Cox's critical value (each part's t quantile weighted by its "
    "variance); `df` is the Student t with the same 95% critical value. Results without per-unit scores fall back "
    "to the replicates alone (design: replicates only).")


def significance_section(comparisons: list[Comparison], unit_names: str = "test units") -> list[str]:
    """Every test of the report: what it compares, its difference and interval, the design it was decided on, its
    p before and after Holm's correction over the whole report, and any stated outcome."""
    runs = max((c.ev.n_replicates for c in comparisons if c.ev.over == "pretraining runs"), default=1)
    counts = {k: sum(c.kind == k for c in comparisons) for k in KINDS}
    parts = [f"{counts[MODEL]} against a baseline model", f"{counts[FLOOR]} against the strongest context-free "
             "baseline"] + ([f"{counts[UNTRAINED]} against the untrained model"] if counts[UNTRAINED] else [])
    out = ["## Significance", "",
           f"**Family for Holm's correction: all {len(comparisons)} tests below** ({', '.join(parts)}).", "",
           DECISION_TEXT.format(units=unit_names), "",
           f"**Bold** = above the row's baseline model **and** above the row's strongest context-free baseline, each "
           f"with a Holm-corrected p < {P_VALUE} (where a row has no context-free baseline, the first alone).", "",
           generalises_over(runs), "",
           "Differences and intervals in accuracy points (cell − reference).", "",
           "| metric | row | cell | against | difference (points) | 95% CI (points) | design | replicates | units | df "
           "| p | Holm p | significant gain | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comparisons:
        ev = c.ev
        ci = "–" if math.isnan(ev.ci_low) else f"[{_pts(ev.ci_low)}, {_pts(ev.ci_high)}]"
        against = {MODEL: f"{c.against} (baseline model)", FLOOR: f"{c.against} (context-free)",
                   UNTRAINED: f"{c.against} (untrained)"}[c.kind]
        reps = f"{ev.n_replicates} {ev.over}" if ev.n_replicates else "–"
        df = "–" if math.isnan(ev.df) else f"{ev.df:.3g}"
        note = ev.outcome.replace("|", "/") if ev.outcome else ""
        out.append(f"| {c.metric} | {c.row} | {c.col} | {against} | {_pts(ev.diff)} | {ci} | {ev.design} | {reps} | "
                   f"{ev.n_units or '–'} | {df} | {_p(ev.p)} | {_p(c.p_holm)} | {'yes' if c.significant else 'no'} | "
                   f"{note} |")
    return out


def control_section(comparisons: list[Comparison], control: str) -> list[str]:
    """The positive control in words: is every pretrained cell above the untrained model, row by row?"""
    tests = [c for c in comparisons if c.kind == UNTRAINED]
    if not tests:
        return []
    out = ["## What pretraining buys (positive control)", "",
           f"Every pretrained column against `{control}`, the same architecture with no pretraining (its weights as "
           "initialised, finetuned by the same protocol), at the best-perplexity epoch, in the report's Holm family. "
           "If pretraining helps at all, every pretrained column should be significantly above it.", ""]
    for row in dict.fromkeys(c.row for c in tests):
        mine = [c for c in tests if c.row == row]
        below = [c for c in mine if not c.significant]
        diffs = ", ".join(f"{c.col} {_pts(c.diff)}" for c in mine)
        if not below:
            out.append(f"- **{row}: every pretrained column is significantly above the untrained model** ({diffs} "
                       "points).")
        else:
            why = "; ".join(f"{c.col}: {_pts(c.diff)} points, Holm p {_p(c.p_holm)}"
                            + (f" ({c.ev.outcome})" if c.ev.outcome else "") for c in below)
            out.append(f"- **{row}: not every pretrained column is above the untrained model** — {why}. On this row "
                       "the study cannot tell pretraining from no pretraining, so differences between pretraining "
                       "objectives here are not evidence about pretraining.")
    return out


def runs_in(df: pd.DataFrame) -> int:
    """The most pretraining runs any column of the results has."""
    if RUN_KEY not in df.columns or df.empty:
        return 1
    return int(df.groupby("col")[RUN_KEY].nunique().max())

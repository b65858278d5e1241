"""Is a study cell above its baseline? The report's tests, its families for Holm's correction and its **bold**
rule, in one place.

Every test is the same paired decision (`unit_statistics.paired_test`: finetuning samples and seeds, test units,
and pretraining runs when there are several, all in the interval), and there are three kinds of them:
- **against the baseline model** (`MODEL`): each compared cell against its row's baseline cell, on every metric
  and test set of the report;
- **against the strongest context-free baseline** (`FLOOR`): the same cell against the row's strongest rule
  (a lexicon, a span matcher), paired on the same calculations' test units;
- **against the untrained model** (`UNTRAINED`, a positive control where the study has an untrained column):
  every pretrained cell of a row against that row's untrained cell, at the best-perplexity epoch.
The tests fall in three families, each corrected by Holm on its own:
- **claims** (`CLAIM`): the comparisons the study exists to make (`Study.claims`, e.g. the objective ablation's
  aligned model against the model without the aligned objective, on each task's primary metric). A claim is one
  directional intersection-union test (Berger 1982): above its baseline model *and* above the strongest context-free
  baseline, its p the larger of the two one-sided p. Holm runs over the claims only; **bold** = a claim with a Holm p < 0.05 and both
  differences positive. An effect that a rule with no model can match is no evidence for the model.
- **controls** (`CONTROL`): the untrained model (a positive control), never bold;
- **secondary and exploratory** (`SECONDARY`): every other test (other columns, best accuracy, extra test sets, the
  claims again on a task's aligned part: `parts`), labelled as such, never bold.
A study that declares no claims claims every compared cell on the primary metric (accuracy at the best-perplexity
epoch), as reports did before claims were declared.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from alignlab.platform.report.unit_statistics import (RUN_KEY, Evidence, baseline_accuracy_column,
                                                      baseline_unit_columns, compare, holm, unit_columns)

P_VALUE = 0.05
POWER = 0.8
"""The power at which a claim's minimum detectable effect is stated."""
PRIMARY = "accuracy"
"""The metric a claim is made on: accuracy at the best-perplexity epoch (the protocol's selection)."""
MODEL, FLOOR, UNTRAINED = "baseline model", "context-free", "untrained"
KINDS = (MODEL, FLOOR, UNTRAINED)
CLAIM, CONTROL, SECONDARY = "claims", "controls", "secondary and exploratory"
FAMILIES = (CLAIM, CONTROL, SECONDARY)


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
    family: str = SECONDARY
    """`CLAIM`, `CONTROL` or `SECONDARY`: the family Holm's correction runs over (`correct_family`)."""
    p_holm: float = math.nan
    """Holm's corrected p in its family (`correct_family`): for a claim's two tests, the claim's (the larger of their
    two p, corrected over the claims); alone, `ev.p` itself."""
    level: float = math.nan
    """For a claim's tests: the level its Holm step must meet when every other claim fails (one-sided P_VALUE over
    the number of claims), as the two-sided level with the same critical value (twice that), at which its detectable
    effect and upper bound are stated."""

    holm_level: float = math.nan
    """The two-sided level of the test's Holm-consistent interval (`correct_family`): the level of the Holm step
    that rejected it, or of the step where Holm stopped. Its lower end clears zero exactly when the test is
    significant; for a claim, every one of its intervals clears zero exactly when it is bold."""

    @property
    def diff(self) -> float:
        return self.ev.diff

    @property
    def interval(self) -> tuple[float, float]:
        """The Holm-consistent interval (at `holm_level`); the 95% interval where there is none."""
        q = self.ev.critical(self.holm_level) if not math.isnan(self.holm_level) else math.nan
        if math.isnan(q):
            return self.ev.ci_low, self.ev.ci_high
        return self.ev.diff - q * self.ev.se, self.ev.diff + q * self.ev.se

    @property
    def significant(self) -> bool:
        """Above its reference: Holm-corrected p < P_VALUE (a claim's: its one-sided intersection-union p) and a
        positive difference."""
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


def one_sided(ev: Evidence) -> float:
    """The one-sided p of a gain (cell above its reference) from the decision's two-sided p: p/2 for a positive
    difference, 1 - p/2 otherwise (the decision's reference distribution is symmetric)."""
    return ev.p / 2 if ev.diff > 0 else 1 - ev.p / 2


def claim_p(tests: list[Comparison]) -> float:
    """One claim's intersection-union p (Berger 1982): the largest of its tests' one-sided p of a gain (against the
    baseline model and, where the row has one, against the strongest context-free baseline); nan when one is
    untested. A claim is directional (the cell above both), so its tests are one-sided."""
    ps = [c.ev.p for c in tests]
    return math.nan if any(math.isnan(p) for p in ps) else max(one_sided(c.ev) for c in tests)


def claims_of(comparisons: list[Comparison]) -> dict[tuple[str, str, str], list[Comparison]]:
    """(metric, row, col) -> the tests of that claim, in the report's order."""
    out: dict[tuple[str, str, str], list[Comparison]] = {}
    for c in comparisons:
        if c.family == CLAIM:
            out.setdefault((c.metric, c.row, c.col), []).append(c)
    return out


def holm_levels(p_values, alpha: float = P_VALUE) -> list[float]:
    """Each p's Holm step level: alpha / (m - i) for the i-th smallest of the rejected, alpha / (m - r) for the rest
    (r rejected): the levels of intervals consistent with Holm's decisions (the step-down confidence bounds of
    Strassburger & Bretz 2008). nan stays nan."""
    p = np.asarray(p_values, float)
    defined = np.flatnonzero(~np.isnan(p))
    order = defined[np.argsort(p[defined], kind="stable")]
    m, out = len(order), [math.nan] * len(p)
    r = 0
    while r < m and p[order[r]] < alpha / (m - r):
        r += 1
    for i, j in enumerate(order):
        out[j] = alpha / (m - i) if i < r else alpha / (m - r)
    return out


def correct_family(comparisons: list[Comparison]) -> list[Comparison]:
    """Every test of a report with Holm's corrected p in its own family: the claims (one intersection-union p each,
    one-sided, Holm over the claims), the controls, and the secondary and exploratory tests; each with the level of
    its Holm-consistent interval."""
    claims = claims_of(comparisons)
    cps = [claim_p(t) for t in claims.values()]
    adjusted = dict(zip(claims, holm(cps)))
    # A one-sided step at alpha is the two-sided interval at 2 alpha: its lower end is the one-sided bound.
    steps = dict(zip(claims, (2 * a for a in holm_levels(cps))))
    level = 2 * P_VALUE / max(1, len(claims))  # two-sided equivalent of Holm's first one-sided step
    p_other, l_other = {}, {}
    for f in (CONTROL, SECONDARY):
        idx = [i for i, c in enumerate(comparisons) if c.family == f]
        ps = [comparisons[i].ev.p for i in idx]
        p_other.update({i: float(p) for i, p in zip(idx, holm(ps))})
        l_other.update(zip(idx, holm_levels(ps)))
    out = []
    for i, c in enumerate(comparisons):
        if c.family == CLAIM:
            key = (c.metric, c.row, c.col)
            out.append(dataclasses.replace(c, p_holm=float(adjusted[key]), level=level, holm_level=steps[key]))
        else:
            out.append(dataclasses.replace(c, p_holm=p_other[i], holm_level=l_other[i]))
    return out


def bold_cells(comparisons: list[Comparison]) -> dict[tuple[str, str, str], bool]:
    """(metric, row, col) -> bold, for the claims only: the claim's Holm p < P_VALUE and every one of its
    differences positive (above its baseline model and, where the row has one, above the strongest context-free
    baseline). Controls and secondary tests are never bold."""
    return {key: bool(any(c.kind == MODEL for c in tests) and all(c.significant for c in tests))
            for key, tests in claims_of(comparisons).items()}


def reading(tests: list[Comparison], control_failed: bool = False) -> str:
    """What a claim's verdict means, in the table's words: bold, or for a claim that is not, "excluded" (the upper
    bound of its difference from the baseline model at the claim's level is below the effect the design could
    detect with POWER) or "inconclusive" (the study is too small to tell), in the spirit of equivalence bounds
    (TOST; Lakens 2017). `control_failed`: the row's positive control (a pretrained column against the untrained
    model) did not pass, so the pipeline showed no effect on this row at all and a small difference is no evidence
    of a small effect: "cannot tell" instead of "excluded"."""
    model = next((c for c in tests if c.kind == MODEL), None)
    if model is None or not model.ev.tested:
        return "not tested"
    if all(c.significant for c in tests):
        return "**bold**: a gain"
    floor = next((c for c in tests if c.kind == FLOOR), None)
    mde, upper = detectable(model), model.ev.upper_bound(model.level)
    if math.isnan(mde):
        return "not significant; no detectable effect without variance parts"
    if (floor is not None and model.diff > 0 and model.ev.p < model.level
            and (floor.diff <= 0 or not floor.ev.p < model.level)):
        return "above the baseline model, not above the strongest context-free baseline"
    below = ("; below the strongest context-free baseline" if floor is not None and floor.ev.tested
             and floor.diff <= 0 else "")
    if control_failed:
        return (f"cannot tell: the row's positive control failed (a pretrained column not above the untrained model), "
                f"so its upper bound ({_pts(upper)} points) is no evidence against a gain{below}")
    if upper < mde:
        return f"excluded: the gain is below {_pts(upper)} points (upper bound){below}"
    return f"inconclusive: smaller than the detectable {_pts(mde)} points{below}"


def detectable(c: Comparison) -> float:
    """A claim's minimum detectable effect against its reference: POWER at the claim's level, from the test's own
    variance components (`Evidence.detectable`)."""
    return c.ev.detectable(c.level, POWER) if not math.isnan(c.level) else math.nan


def _p(p: float) -> str:
    return "–" if math.isnan(p) else f"{p:.3g}"


def _pts(v: float) -> str:
    return "–" if math.isnan(v) else f"{100 * v:+.2f}"


def generalises_over(runs: int) -> str:
    """What the report's verdict is about, in a sentence."""
    if runs >= 2:
        return (f"**The verdict generalises over other pretraining runs of the same recipes** ({runs} runs per column "
                "are the replicates), other finetuning seeds and other test texts; the finetuning samples are the same "
                "in every run and are held fixed.")
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


def claims_section(comparisons: list[Comparison]) -> list[str]:
    """The study's claims, one line each: its difference from the baseline model, its Holm p over the claims, the
    smallest effect the report could show (POWER at the claim's level, from its own variance components) and what
    a cell that is not bold means."""
    claims = claims_of(comparisons)
    if not claims:
        return []
    level = next(iter(claims.values()))[0].level
    out = [f"**The study's claims ({len(claims)}; Holm over these alone):** each above its baseline model and above "
           f"the row's strongest context-free baseline (p = the larger of the two one-sided p of a gain). The detectable "
           f"effect is the true gain over the baseline model this report would find with {POWER:.0%} power at a "
           f"claim's level (one-sided p < {_p(level / 2)}: {P_VALUE} over the number of claims), from its own "
           "variance components; the upper bound is the one-sided bound at that level.", "",
           "| claim | difference (points) | claim p (one-sided) | Holm p | detectable (points) | reading |", "|---|---|---|---|---|---|"]
    failed = {c.row for c in comparisons if c.kind == UNTRAINED and not c.significant}
    for (metric, row, col), tests in claims.items():
        model = next((c for c in tests if c.kind == MODEL), tests[0])
        out.append(f"| {row}: {col} − {model.against} ({metric}) | {_pts(model.diff)} | {_p(claim_p(tests))} | "
                   f"{_p(tests[0].p_holm)} | {_pts(detectable(model)).lstrip('+')} | "
                   f"{reading(tests, control_failed=row in failed)} |")
    return out


def significance_section(comparisons: list[Comparison], unit_names: str = "test units") -> list[str]:
    """Every test of the report: its family, what it compares, its difference and interval, the design it was
    decided on, its p before and after Holm's correction in its family, and any stated outcome; the claims first,
    each with its detectable effect and reading."""
    runs = max((c.ev.n_replicates for c in comparisons if c.ev.over == "pretraining runs"), default=1)
    counts = {f: sum(c.family == f for c in comparisons) for f in FAMILIES}
    n_claims = len(claims_of(comparisons))
    out = ["## Significance", "",
           f"**Families for Holm's correction:** the study's {n_claims} claims ({counts[CLAIM]} tests: each claim "
           f"against its baseline model and the strongest context-free baseline, one p per claim); "
           f"{counts[CONTROL]} controls (against the untrained model); {counts[SECONDARY]} secondary and "
           "exploratory tests (other columns, best accuracy, extra test sets, a claim on its task's aligned part). "
           "Each family is corrected on its own; "
           "only claims can be bold.", "",
           DECISION_TEXT.format(units=unit_names), "",
           f"**Bold** = a claim whose Holm p over the claims is < {P_VALUE}, above the row's baseline model **and** above "
           f"the row's strongest context-free baseline (where a row has no context-free baseline, the first alone).",
           "", generalises_over(runs), ""]
    out += claims_section(comparisons) + ([""] if n_claims else [])
    out += ["Differences and intervals in accuracy points (cell − reference).", "",
            "| family | metric | row | cell | against | difference (points) | 95% CI (points) | design | replicates | "
            "units | df | p | Holm p | significant gain | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted(comparisons, key=lambda c: FAMILIES.index(c.family)):
        ev = c.ev
        ci = "–" if math.isnan(ev.ci_low) else f"[{_pts(ev.ci_low)}, {_pts(ev.ci_high)}]"
        against = {MODEL: f"{c.against} (baseline model)", FLOOR: f"{c.against} (context-free)",
                   UNTRAINED: f"{c.against} (untrained)"}[c.kind]
        reps = f"{ev.n_replicates} {ev.over}" if ev.n_replicates else "–"
        df = "–" if math.isnan(ev.df) else f"{ev.df:.3g}"
        note = ev.outcome.replace("|", "/") if ev.outcome else ""
        out.append(f"| {c.family} | {c.metric} | {c.row} | {c.col} | {against} | {_pts(ev.diff)} | {ci} | {ev.design} | "
                   f"{reps} | {ev.n_units or '–'} | {df} | {_p(ev.p)} | {_p(c.p_holm)} | "
                   f"{'yes' if c.significant else 'no'} | {note} |")
    return out


def control_section(comparisons: list[Comparison], control: str) -> list[str]:
    """The positive control in words: is every pretrained cell above the untrained model, row by row?"""
    tests = [c for c in comparisons if c.kind == UNTRAINED]
    if not tests:
        return []
    out = ["## What pretraining buys (positive control)", "",
           f"Every pretrained column against `{control}`, the same architecture with no pretraining (its weights as "
           "initialised at random, not from the recipes' co-occurrence initialisation; finetuned by the same protocol), at the best-perplexity epoch, Holm-corrected in the controls' "
           "family. "
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

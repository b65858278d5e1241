"""How many pretraining runs and finetuning samples does a study need to show a given gain? (`alignlab plan STUDY
--detect 0.5 --power 0.8 [--from REPORT]`)

A claim's difference (`significance`: cell minus its baseline model, on the primary metric) has three variance
components, all in accuracy (0-1) squared:
- `fold`: one finetuning sample's (fold's) seed-averaged difference around the models' mean difference;
- `units`: the test units' part of the decision's variance (crossed designs: CT's shared test set; it does not
  shrink with more folds or runs, the test set is the same), with its degrees of freedom;
- `run`: one pretraining run's difference around the recipes' (each recipe's run shift, twice).
A design of R runs x F folds is decided as the report decides it (`unit_statistics.paired_test`): with one run the
folds are the replicates (part fold / F, F - 1 degrees of freedom), with several the runs are (part (run + fold / F)
/ R, R - 1 degrees of freedom); the units' part beside it; Cochran-Cox's critical value at the claim's one-sided
level (Holm's first step over the study's claims). With one run the verdict is about the two pretrained models, so
the gain it is asked to show is the recipes' gain plus the two runs' draw (variance `run`): planning for a recipe
effect with one run counts the luck of the draw.

Power is simulated (Card et al. 2020): the difference is drawn around the effect with the design's true variance,
each part's estimate as a scaled chi-square with its degrees of freedom, and the decision applied. The components
come from a report (`components_from`: each claim's own variance parts, `Evidence.parts`) or, without one, from the
mini objective ablation's committed report (each task's `Task.plan_variance`, `defaults`); the run component is read
from a report with several pretraining runs per column, else `plan_variance`'s run_points (CT's measured by the mini
study with three runs per column, AD's assumed), and the plan says which.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as sps

from alignlab.platform.report.significance import P_VALUE

RUNS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
FOLDS = (5, 10, 20)
SIMS = 20_000


@dataclass(frozen=True)
class Components:
    """A claim's variance components (accuracy 0-1, squared), and where each came from."""

    task: str
    fold: float
    units: float
    units_df: float
    run: float
    source: str
    run_source: str

    def __post_init__(self) -> None:
        for k in ("fold", "units", "run"):
            if not getattr(self, k) >= 0:
                raise ValueError(f"variance component {k} of {self.task} must be >= 0, got {getattr(self, k)}")


def _assumed_run(points: float) -> float:
    return 2 * (points / 100) ** 2


def defaults() -> dict[str, Components]:
    """task -> the components `alignlab plan --detect` assumes without a report: each registered task's own
    `Task.plan_variance` (the mini objective ablation's committed report; its run part measured where the task says
    `run_from`, else assumed); a task that
    declares none gets the largest declared (the widest fold part), so the plan errs towards more runs."""
    from alignlab.platform.tasks.task import registered_tasks

    declared = {t.name: t.plan_variance for t in registered_tasks() if t.plan_variance}
    widest = max(declared.values(), key=lambda v: v["fold"]) if declared else None
    out = {}
    for t in registered_tasks():
        v = t.plan_variance or widest
        if v is None:
            continue
        own = "" if t.plan_variance else " (declared by another task: this one declares none)"
        run_source = (f"measured: {v['run_points']} points per run and recipe ({v['run_from']})" if v.get("run_from")
                      else f"assumed: {v['run_points']} points per run and recipe")
        out[t.name] = Components(t.name, fold=v["fold"], units=v["units"], units_df=v["units_df"],
                                 run=_assumed_run(v["run_points"]),
                                 source=f"the committed mini report (objective_ablation_mini_untrained_control){own}",
                                 run_source=run_source + own)
    return out


def design_parts(c: Components, runs: int, folds: int) -> list[tuple[float, float]]:
    """The decision's variance parts (variance, degrees of freedom) of a design of `runs` x `folds`."""
    if runs == 1:
        rep = (c.fold / folds, folds - 1.0)
    else:
        rep = ((c.run + c.fold / folds) / runs, runs - 1.0)
    return [rep] + ([(c.units, c.units_df)] if c.units > 0 else [])


def power(c: Components, effect: float, runs: int, folds: int, alpha: float, sims: int = SIMS, seed: int = 0) -> float:
    """The share of simulated studies of `runs` x `folds` whose decision calls a gain (one-sided, level `alpha`)
    when the recipes differ by `effect` (accuracy 0-1)."""
    rng = np.random.default_rng(seed)
    parts = design_parts(c, runs, folds)
    true_var = sum(v for v, _ in parts) + (c.run if runs == 1 else 0.0)
    d = rng.normal(effect, math.sqrt(true_var), sims)
    est = [v * (rng.chisquare(df, sims) / df if math.isfinite(df) else 1.0) for v, df in parts]
    q = [float(sps.t.isf(alpha, df)) for _, df in parts]  # each part's one-sided critical value
    total = sum(est)
    crit = sum(e * qq for e, qq in zip(est, q)) / total  # Cochran-Cox: the parts' quantiles weighted by variance
    return float(np.mean(d / np.sqrt(total) > crit))


def test_set_limit(c: Components, target: float, alpha: float) -> float:
    """The smallest gain any number of runs and folds can show with `target` power: the units' part alone."""
    if c.units <= 0:
        return 0.0
    df = min(c.units_df, 1e6)
    return float((sps.t.isf(alpha, df) + sps.t.ppf(target, df)) * math.sqrt(c.units))


@dataclass(frozen=True)
class Design:
    runs: int
    folds: int
    power: float
    device_hours: float | None


def plan_designs(c: Components, effect: float, target: float, alpha: float, hours=None) -> list[Design]:
    """For each number of folds, the fewest runs that reach `target` power (None where none of RUNS does), with its
    cost (`hours(runs, folds)`, device-hours, or None)."""
    out = []
    for folds in FOLDS:
        for runs in RUNS:
            p = power(c, effect, runs, folds, alpha)
            if p >= target:
                out.append(Design(runs, folds, p, hours(runs, folds) if hours else None))
                break
    return out


def components_from(report: Path) -> dict[str, Components]:
    """Each claim's components from a study folder (or its report.md / results.parquet): its Evidence's parts from
    the report's own decision. One run: fold = the replicates' part x folds, units = the units' part. Several runs:
    the replicates' part x runs is run + fold / folds, and fold is the default's (a report with several runs holds
    the folds fixed), so the run component is estimated from it."""
    import pandas as pd

    from alignlab.platform.report.report import all_comparisons, baseline_of, claimed_cells
    from alignlab.platform.report.significance import MODEL, claims_of
    from alignlab.platform.storage.root import read_json

    sdir = Path(report)
    if sdir.is_file():
        sdir = sdir.parent
    if not (sdir / "results.parquet").is_file() or not (sdir / "study.json").is_file():
        raise ValueError(f"--from {report}: not a study folder (no results.parquet and study.json in {sdir})")
    study = read_json(sdir / "study.json")
    df = pd.read_parquet(sdir / "results.parquet")
    if "status" in df.columns:
        df = df[df["status"] != "failed"]
    tests = all_comparisons(df, baseline_of(df, study), study.get("control_col", ""), claimed_cells(study))
    out = {}
    for (_, row, _), mine in claims_of(tests).items():
        model = next((t for t in mine if t.kind == MODEL), None)
        if model is None or not model.ev.parts:
            continue
        task = str(df[df["row"] == row]["ft_task"].iloc[0]) if "ft_task" in df.columns else row.lower()
        known = defaults()
        ev, base = model.ev, known.get(task) or max(known.values(), key=lambda k: k.fold)
        rep, rest = ev.parts[0], ev.parts[1:]
        units, units_df = (rest[0] if rest else (0.0, math.inf))
        source = f"{sdir.name}'s claim {row}: {model.col} - {model.against}"
        if ev.over == "pretraining runs":
            folds = int(df[FOLD_COLUMN].nunique()) if FOLD_COLUMN in df.columns else 5
            run = max(0.0, rep[0] * ev.n_replicates - base.fold / folds)
            c = Components(task, base.fold, units, units_df, run, source,
                           f"estimated from its {ev.n_replicates} pretraining runs")
        else:
            c = Components(task, rep[0] * ev.n_replicates, units, units_df, base.run, source, base.run_source)
        out.setdefault(task, c)
    return out


FOLD_COLUMN = "ft_fold"


def report_seconds(report: Path) -> float | None:
    """The mean device-seconds of the report's finished calculations (results.parquet's device_seconds)."""
    import pandas as pd

    sdir = Path(report)
    sdir = sdir.parent if sdir.is_file() else sdir
    df = pd.read_parquet(sdir / "results.parquet")
    if "device_seconds" not in df.columns or df["device_seconds"].dropna().empty:
        return None
    return float(df["device_seconds"].dropna().mean())


def power_plan(study, plan: dict, detect_points: float, target: float, report: Path | None = None) -> list[str]:
    """The plan's lines for `--detect`: for each of the study's claimed tasks, the fewest runs at each number of
    folds that reach `target` power against a gain of `detect_points`, and what that costs (the plan's own cost
    model: its models' pretraining device-hours per run, its FEL calculations' device-seconds)."""
    from alignlab.platform.tasks.task import task as task_named
    from alignlab.platform.tasks.task_data import NUM_FOLDS

    tasks = {}
    claimed = set(study.claims)
    for c in study.calcs:
        if not claimed or (c.row, c.col) in claimed:
            tasks.setdefault(c.finetune.task, c.row)
    comps = defaults()
    if report is not None:
        comps.update(components_from(report))
    n_claims = len(claimed) or len({(c.row, c.col) for c in study.calcs}) or 1
    alpha = P_VALUE / n_claims
    pre = plan["layout"]["pretrain_device_hours"] if plan.get("layout") else None
    pre = sum(m["device_hours"] or 0.0 for m in plan["models"]) if pre is None else pre
    if any(m["exists"] for m in plan["models"]):  # the plan counts only what is to make; a design pays for every run
        pre = None
    each = plan["calculations"]["seconds_each"]
    total_calcs = plan["calculations"]["total"]
    each_note = ""
    if each is None and report is not None:  # no trial at the root on this device: the report's own calculations'
        each = report_seconds(report)
        each_note = "" if each is None else f" (FEL calculations at {each:.0f} s each, the report's own)"

    folds_of: dict[tuple, set] = {}  # the plan's calculations are this many folds' per cell (--folds N: N)
    for c in study.calcs:
        folds_of.setdefault((c.model, c.row, c.col), set()).add(c.finetune.fold)
    ran = max(map(len, folds_of.values()), default=0) or 5

    def hours(runs: int, folds: int):
        if each is None or pre is None:
            return None
        return runs * pre + runs * total_calcs * folds / ran * each / 3600

    lines = [f"Power plan: the runs x finetuning samples to show a gain of {detect_points:g} points with "
             f"{target:.0%} power, at a claim's level (one-sided p < {alpha:.3g}: {P_VALUE} over {n_claims} claims), "
             f"on {plan['device']}{each_note}:"]
    for task, row in tasks.items():
        c = comps.get(task)
        if c is None:
            lines.append(f"  {row}: no variance components for task {task} (give --from a report of this study)")
            continue
        lines.append(f"  {row} (components: {c.source}; run variance {c.run_source}):")
        if set(task_named(task).search_groups(((0, 0), (1, 0)))) != {None}:
            lines.append(f"    {task.upper()}'s test set changes with the fold (cross-validation): samples past its "
                         f"{NUM_FOLDS} folds repeat its test folds with fresh training samples, so the test units' part "
                         "of its fold variance does not shrink with them as this plan assumes; its rows past "
                         f"{NUM_FOLDS} samples are optimistic")
        designs = plan_designs(c, detect_points / 100, target, alpha, hours)
        limit = test_set_limit(c, target, alpha)
        if limit > 0:
            lines.append(f"    the test set's own part alone (the same units in every design) limits the detectable "
                         f"gain to {100 * limit:.2f} points: more runs and samples cannot go below it, a larger test "
                         "set can")
        if not designs:
            lines.append(f"    no design up to {RUNS[-1]} runs x {FOLDS[-1]} folds reaches {target:.0%}")
        for d in designs:
            cost = "cost unknown (no measured rate on this device)" if d.device_hours is None else \
                f"{d.device_hours:.3g} device-hours"
            lines.append(f"    {d.runs} pretraining run{'s' if d.runs > 1 else ''} x {d.folds} finetuning samples: "
                         f"power {d.power:.0%}, {cost}")
    lines.append("  (--pretrain-seeds N pretrains every model N times; --folds N draws N finetuning samples per cell. "
                 "Simulated as the report decides: docs/statistics.md, Planning power.)")
    return lines


def with_run(c: Components, run_points: float, source: str) -> Components:
    """`c` with a run component of `run_points` per recipe (a figure measured elsewhere)."""
    return replace(c, run=2 * (run_points / 100) ** 2, run_source=source)

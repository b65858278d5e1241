"""Is the report's decision calibrated? Its false-positive rate under a true null, the coverage of its 95% interval,
and its power, measured on simulated studies that have the variance components of a real report, side by side with
the decisions it replaces (issue #55).

The simulated study is the FEL protocol: two recipes (A, B), each pretrained `runs` times, each model finetuned on
five samples ("folds") x two seeds and scored per test unit with the real report's units (CT: 260 texts shared by
every fold, with their real word counts; AD: 600 snippets of two pairs, nested in the five folds). A unit's correct
count is Binomial(n_u, sigmoid(logit)) with
    logit = base_u + effect(A) + run shift + model x unit + fold shift + seed shift + fold x unit + seed x unit
(each a normal draw; `Components`), estimated from a real report's per-unit scores (`estimate`: the committed
results of the mini objective ablation by default), and the finetuning shift (the calculation-level sd, in
accuracy points) set by the scenario: 0 to 3 points. With one pretraining run the null is "these two pretrained
models are equally accurate on the population of test units" (no run shift); with three, "the two recipes are"
(a run shift and a fresh model x unit per run). The truth for coverage is computed by Monte Carlo on a large
population of units.

Decisions compared, each at p < 0.05 two-sided:
- `new`: the report's decision (`unit_statistics.paired_test`: replicates x units, Cochran-Cox critical value);
- `old units`: the decision before issue #55: units resampled with their folds averaged (a paired permutation test
  and bootstrap interval over units; 1,999 resamples here, 9,999 in the report) -- over the runs' mean differences
  (t, df = runs - 1) with several runs;
- `fold t`: a paired t-test over the seed-averaged fold means (all runs' folds pooled);
- `two-way boot`: a percentile bootstrap that resamples the replicates and the units (crossed: independently,
  the pigeonhole bootstrap of Owen 2007; nested: units within resampled replicates), considered and not chosen.

    python benchmarks/statistics/calibration.py                     # every scenario: 4,000 simulated studies per null, 1,000 per effect
    python benchmarks/statistics/calibration.py --sims 200 --null-sims 200 --quick  # a few scenarios, for a look
    python benchmarks/statistics/calibration.py --real --storage alignlab-storage --model MODEL_ID   # A/A on real calculations
    python benchmarks/statistics/calibration.py --family --sims 2000   # the claim family: family-wise false positives, power

Figures go to benchmarks/results/calibration.json (one entry per command) and are printed as a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))  # real_aa and the shared pieces, when imported by a test
from rates import ALPHA, RESULTS, clopper_pearson, commit_of

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.report.unit_statistics import holm, paired_test  # noqa: E402
from alignlab.platform.tasks.task import task as task_named  # noqa: E402

_PLAN = {name: task_named(name).plan_variance for name in ("ct", "ad")}
RUN_POINTS = (_PLAN["ct"]["run_points"], _PLAN["ad"]["run_points"])
"""A pretraining run's shift sd in points per recipe, CT and AD: the tasks' own `plan_variance` (CT's measured by the
mini objective ablation with --pretrain-seeds 3; AD's assumed, since there AD is at chance in every run)."""
RUN_POINTS_SOURCE = ", ".join(f"{n.upper()} " + (f"measured ({v['run_from']})" if v.get("run_from") else "assumed")
                              for n, v in _PLAN.items())
DEFAULT_RESULTS = RESULTS / "objective_ablation_mini_results.parquet"
FOLDS, SEEDS = 5, 2


@dataclass(frozen=True)
class Components:
    """The variance components of one task's results, on a latent scale where an item (a scored word or pair) is
    right when its latent value is above 0 and its fixed difficulty has unit spread: a finetuned model is
    deterministic, so every calculation-to-calculation change is a change of the model, not coin flips."""

    task: str
    design: str
    """"crossed" (every fold scores every unit: CT) or "nested" (each fold its own units: AD)."""
    counts: tuple[int, ...]
    """Scored words (CT) or pairs (AD) of each test unit."""
    means: tuple[float, ...]
    """Each unit's accuracy, the real models' mean."""
    fold_of: tuple[int, ...]
    """Nested: the fold each unit is tested in; crossed: all -1."""
    sd_model_item: float
    """A pretrained model's own shift on an item, the same in every calculation (model x item)."""
    sd_fold_item: float
    """A finetuning sample's own shift on an item, the same for both seeds (fold x item)."""
    sd_seed_item: float
    """A seed's own shift on an item in one fold (seed x item)."""
    sd_seed_main_item: float
    """A seed's shift on an item shared by every fold: the seed initialises the head of every fold's model alike
    (crossed designs only; nested ones cannot tell it from the fold's)."""
    fold_share: float
    """Share of the calculation-level shift's variance that is the fold's."""
    seed_main_share: float
    """Share of the calculation-level shift's variance that is the seed's, shared by every fold (the rest: each
    (fold, seed)'s own)."""
    shift_points: float
    """The real calculation-level shift's sd, in accuracy points (the scenarios set their own)."""
    run_points: float
    """A pretraining run's shift sd, in accuracy points (with several runs)."""
    slope: float = 0.0
    """d accuracy / d latent shift of every item at once: converts points to latent units."""

    def scaled(self, points: float) -> float:
        return points / 100 / self.slope

    @property
    def total_sd(self) -> float:
        return math.sqrt(1 + self.sd_model_item ** 2 + self.sd_fold_item ** 2 + self.sd_seed_item ** 2
                         + self.sd_seed_main_item ** 2)


def _cell_arrays(df, task: str):
    """Per cell (column) of `task`'s rows: per-unit accuracy [fold, seed, unit] (nan where a fold does not score
    a unit), with the units' counts and folds."""
    df = df[(df["ft_task"] == task) & df["unit_keys"].notna()]
    keys = list(dict.fromkeys(k for ks in df["unit_keys"] for k in ks))
    idx = {k: i for i, k in enumerate(keys)}
    counts, fold_of = np.zeros(len(keys)), np.full(len(keys), -1)
    cells = {}
    for col, sub in df.groupby("col"):
        Y = np.full((FOLDS, SEEDS, len(keys)), np.nan)
        for _, r in sub.iterrows():
            ii = [idx[k] for k in r["unit_keys"]]
            counts[ii] = r["unit_count"]
            Y[int(r["ft_fold"]), int(r["ft_seed"]), ii] = np.asarray(r["unit_correct"], float) / np.asarray(r["unit_count"])
            fold_of[ii] = int(r["ft_fold"])
        cells[col] = Y
    return cells, counts, fold_of


def statistics(cells: dict, counts: np.ndarray) -> dict:
    """What the components are matched on, the same for real and simulated cells: the per-unit spread between two
    seeds of a fold (`seed`), of a seed's difference shared by the folds (`seed_main`: the variance over units of
    the seed difference averaged over folds; crossed only), between folds (`fold`: the residual mean square of the
    seed-averaged fold x unit table; crossed only), and between models (`model`: the variance over units of two
    cells' difference averaged over their calculations); and the calculation-level accuracy shifts (variances):
    each fold's (`fold_shift`), each (fold, seed)'s (`seed_shift`) and each seed's across the folds
    (`seed_main_shift`)."""
    out = {k: [] for k in ("seed", "seed_main", "fold", "model", "fold_shift", "seed_shift", "seed_main_shift")}
    for Y in cells.values():
        d = Y[:, 0] - Y[:, 1]
        d = d - np.nanmean(d, axis=1, keepdims=True)
        out["seed"].append(np.nanmean(d ** 2) / 2)
        w = np.where(np.isnan(Y), 0.0, counts)
        acc = np.nansum(Y * counts, -1) / w.sum(-1)             # fold x seed
        ds = acc[:, 0] - acc[:, 1]
        out["seed_shift"].append(np.var(ds, ddof=1) / 2)
        out["seed_main_shift"].append(max(0.0, ds.mean() ** 2 - np.var(ds, ddof=1) / len(ds)) / 2)
        out["fold_shift"].append(max(0.0, np.var(acc.mean(1), ddof=1) - out["seed_shift"][-1] / 2))
        if not np.isnan(Y).any():
            m = Y.mean(1)
            resid = m - m.mean(0, keepdims=True) - m.mean(1, keepdims=True) + m.mean()
            out["fold"].append((resid ** 2).sum() / ((m.shape[0] - 1) * (m.shape[1] - 1)))
            out["seed_main"].append(np.var((Y[:, 0] - Y[:, 1]).mean(0), ddof=1))
    Ys = list(cells.values())
    for i in range(len(Ys)):
        for j in range(i + 1, len(Ys)):
            out["model"].append(np.var(np.nanmean(Ys[i] - Ys[j], axis=(0, 1)), ddof=1))
    return {k: float(np.mean(v)) if v else math.nan for k, v in out.items()}


def estimate(results: Path, task: str, run_points: float, replicates: int = 12) -> Components:
    """Components of `task` from a report's results.parquet (per-unit scores of several cells, ten calculations
    each): the item-level spreads (model, fold, seed, and the seed's shared by the folds) are fitted (Nelder-Mead on
    log scale, common random numbers) so that simulated cells show the real cells' `statistics`; the
    calculation-level shifts are read off the real accuracies. A nested design cannot tell fold x item from model x
    item, nor a seed's shared effect on an item from its own: those are 0 there."""
    import pandas as pd
    from scipy.optimize import minimize

    cells, counts, fold_of = _cell_arrays(pd.read_parquet(results), task)
    means = np.clip(np.nanmean(np.stack(list(cells.values())), axis=(0, 1, 2)), 0.005, 0.995)
    nested = bool(all(np.isnan(Y[:, 0]).sum(0).max() == FOLDS - 1 for Y in cells.values()))
    real = statistics(cells, counts)
    shifts = real["fold_shift"] + real["seed_shift"] + real["seed_main_shift"]
    base = Components(task=task, design="nested" if nested else "crossed", counts=tuple(int(c) for c in counts),
                      means=tuple(float(m) for m in means), fold_of=tuple(int(f) if nested else -1 for f in fold_of),
                      sd_model_item=0.3, sd_fold_item=0.0, sd_seed_item=0.3, sd_seed_main_item=0.0,
                      fold_share=real["fold_shift"] / shifts if shifts > 0 else 0.4,
                      seed_main_share=real["seed_main_shift"] / shifts if shifts > 0 else 0.2,
                      shift_points=100 * math.sqrt(shifts), run_points=run_points)
    targets = ["seed", "model"] + ([] if nested else ["fold", "seed_main"])

    def comps(theta) -> Components:
        c = dataclasses.replace(base, sd_seed_item=float(np.exp(theta[0])), sd_model_item=float(np.exp(theta[1])),
                                sd_fold_item=0.0 if nested else float(np.exp(theta[2])),
                                sd_seed_main_item=0.0 if nested else float(np.exp(theta[3])))
        return dataclasses.replace(c, slope=slope_of(c))

    def loss(theta) -> float:
        c = comps(theta)
        sc = Scenario(task, c.shift_points, 1)
        rng = np.random.default_rng(7)
        got = {k: [] for k in targets}
        for _ in range(replicates):
            st = statistics(simulated_cells(c, sc, rng, models=len(cells)), np.asarray(c.counts, float))
            for k in targets:
                got[k].append(st[k])
        return sum((math.log(np.mean(got[k]) + 1e-12) - math.log(real[k] + 1e-12)) ** 2 for k in targets)

    theta0 = np.log([0.2, 0.3] + ([] if nested else [0.3, 0.05]))
    fit = minimize(loss, theta0, method="Nelder-Mead", options={"xatol": 0.01, "fatol": 1e-6, "maxiter": 600})
    return comps(fit.x)


def item_difficulty(c: Components, rng, n_units: int | None = None):
    """One test set's items: (their fixed latent values, the unit of each item, each unit's index into `c`). The
    items of a unit scatter (unit spread) around the level at which the unit's accuracy is its real models' mean.
    With `n_units`, that many units are drawn from the report's units (a population, for the truth)."""
    units = np.arange(len(c.counts)) if n_units is None else rng.integers(0, len(c.counts), n_units)
    n = np.asarray(c.counts)[units]
    level = sps.norm.ppf(np.asarray(c.means)[units]) * c.total_sd
    return np.repeat(level, n) + rng.normal(0, 1, n.sum()), np.repeat(np.arange(len(units)), n), units


def slope_of(c: Components, n_units: int = 20_000, seed: int = 5) -> float:
    """d(accuracy)/d(shift of every item's latent value), at the report's accuracy."""
    rng = np.random.default_rng(seed)
    lam, _, _ = item_difficulty(c, rng, n_units)
    spread = c.total_sd ** 2 - 1
    return float(np.mean(sps.norm.pdf(lam / math.sqrt(spread)) / math.sqrt(spread))) if spread > 0 else 0.4


@dataclass(frozen=True)
class Scenario:
    task: str
    shift_points: float
    runs: int
    effect_points: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.task.upper()} shift {self.shift_points:g} pts, {self.runs} run{'s' if self.runs > 1 else ''}"


def _draw_counts(c: Components, sc: Scenario, rng, deltas, runs: int, seeds_shared: bool = False,
                 rules: tuple[bool, ...] = (), persistent: float = 0.0, tails: float = 0.0):
    """Correct counts [model, run, fold, seed, unit] of one simulated study: models share the test set's items and
    the finetuning samples' common shift; each model (with `deltas[m]` added) has its own run shift, model x item,
    and per calculation its fold and seed shifts and fold x item and seed x item draws. A seed's effect is each
    calculation's own (`finetune.calculation_seed` keys it by seed and fold); with `seeds_shared` (the protocol
    before FINETUNE_CODE_VERSION 2, whose results the components are fitted on) a seed's part is shared by the
    folds. Units outside a nested fold: nan.

    The claim family's scenarios add: `rules` (per model: a context-free rule, the floor: its own item profile and
    each fold's fit, no seed and no pretraining run), `persistent` (the share of a model's item profile that is the
    recipe's, the same in every pretraining run: a recipe x unit effect that more runs do not average away) and
    `tails` (the degrees of freedom of Student t calculation-level shifts, scaled to the same sd: heavy tails; 0:
    normal)."""
    lam, unit_of, _ = item_difficulty(c, rng)
    U, I = len(c.counts), len(lam)
    shift = c.scaled(sc.shift_points)
    sd_fold = shift * math.sqrt(c.fold_share)
    sd_seed_main = shift * math.sqrt(c.seed_main_share)
    sd_seed = shift * math.sqrt(max(0.0, 1 - c.fold_share - c.seed_main_share))

    def shifts(sd, shape):
        if not tails:
            return rng.normal(0, sd, shape)
        return sd * rng.standard_t(tails, shape) / math.sqrt(tails / (tails - 2))

    shared = shifts(sd_fold, (FOLDS, 1, 1))
    out = np.empty((len(deltas), runs, FOLDS, SEEDS, U))
    for m, delta in enumerate(deltas):
        if rules and rules[m]:
            latent = (lam + delta + rng.normal(0, c.sd_model_item, I) + shared + shifts(sd_fold, (FOLDS, 1, 1))
                      + rng.normal(0, c.sd_fold_item, (FOLDS, 1, I)))
            hits = np.broadcast_to(latent > 0, (FOLDS, SEEDS, I)).reshape(FOLDS * SEEDS, I)
            sums = np.stack([np.bincount(unit_of, weights=h, minlength=U) for h in hits])
            out[m] = sums.reshape(FOLDS, SEEDS, U)[None]
            continue
        own_sd = c.sd_model_item * math.sqrt(1 - persistent)
        recipe = rng.normal(0, c.sd_model_item * math.sqrt(persistent), I) if persistent else 0.0
        for r in range(runs):
            run = shifts(c.scaled(c.run_points), None) if runs > 1 else 0.0
            latent = (lam + delta + run + recipe + rng.normal(0, own_sd, I) + shared
                      + shifts(sd_seed_main, (1 if seeds_shared else FOLDS, SEEDS, 1))
                      + rng.normal(0, c.sd_seed_main_item, (1 if seeds_shared else FOLDS, SEEDS, I))
                      + shifts(sd_fold, (FOLDS, 1, 1)) + shifts(sd_seed, (FOLDS, SEEDS, 1))
                      + rng.normal(0, c.sd_fold_item, (FOLDS, 1, I)) + rng.normal(0, c.sd_seed_item, (FOLDS, SEEDS, I)))
            hits = (latent > 0).reshape(FOLDS * SEEDS, I)
            sums = np.stack([np.bincount(unit_of, weights=h, minlength=U) for h in hits])
            out[m, r] = sums.reshape(FOLDS, SEEDS, U)
    if c.design == "nested":
        fold_of = np.asarray(c.fold_of)
        mask = fold_of[None, :] == np.arange(FOLDS)[:, None]
        out = np.where(mask[None, None, :, None, :], out, np.nan)
    return out


def simulated_cells(c: Components, sc: Scenario, rng, models: int) -> dict:
    """`models` cells of one simulated study with one run each, as per-unit accuracies (for `statistics`), under the
    protocol the fitted results were made with (seeds shared by the folds)."""
    counts = _draw_counts(c, sc, rng, [0.0] * models, 1, seeds_shared=True)
    n = np.asarray(c.counts, float)
    return {i: counts[i, 0] / n for i in range(models)}


def true_difference(c: Components, sc: Scenario, delta: float, n_units: int = 100_000, seed: int = 99) -> float:
    """The population difference (count-weighted accuracy of A minus B) at latent effect `delta`: units drawn from the
    report's units, each with fresh items, every other random effect integrated (a normal tail)."""
    if delta == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    lam, unit_of, _ = item_difficulty(c, rng, n_units)
    shift = c.scaled(sc.shift_points)
    own = math.sqrt(c.scaled(c.run_points) ** 2 * (sc.runs > 1) + c.sd_model_item ** 2 + c.sd_fold_item ** 2
                    + c.sd_seed_item ** 2 + c.sd_seed_main_item ** 2 + shift ** 2)
    shared = rng.normal(0, shift * math.sqrt(c.fold_share), len(lam))
    return float(np.mean(sps.norm.cdf((lam + shared + delta) / own) - sps.norm.cdf((lam + shared) / own)))


def effect_logit(c: Components, sc: Scenario) -> tuple[float, float]:
    """(latent effect, its population difference) giving `sc.effect_points` points, by bisection."""
    if not sc.effect_points:
        return 0.0, 0.0
    lo, hi = 0.0, 4.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if 100 * true_difference(c, sc, mid) < sc.effect_points:
            lo = mid
        else:
            hi = mid
    delta = (lo + hi) / 2
    return delta, true_difference(c, sc, delta)


def _draw(c: Components, sc: Scenario, delta: float, rng):
    """One simulated study: correct counts [recipe, run, fold, seed, unit] of recipes A (+delta) and B."""
    return _draw_counts(c, sc, rng, [delta, 0.0], sc.runs), np.asarray(c.counts, float)


def _cells(counts, n, design):
    """Per (replicate, unit) paired arrays, seeds averaged (what the old decisions and the bootstrap read): with
    several runs the runs are the replicates (their folds averaged)."""
    a, b = counts[0].mean(2), counts[1].mean(2)                         # run x fold x unit, seeds averaged
    R = a.shape[0]
    if R > 1:
        a, b = np.nanmean(a, 1), np.nanmean(b, 1)                       # run x unit
        reps = np.repeat(np.arange(R), a.shape[1])
        units = np.tile(np.arange(a.shape[1]), R)
        return reps, units, a.ravel(), b.ravel(), np.tile(n, R)
    a, b = a[0], b[0]                                                   # fold x unit
    ok = ~np.isnan(a)
    reps, units = np.nonzero(ok)
    return reps, units, a[ok], b[ok], n[units]


def _observations(counts, n):
    """The study's paired cells as the report's decision reads them (`unit_statistics.compare`): each fold's seeds
    averaged, per (fold, unit); with several runs each run's folds averaged too, per (run, unit)."""
    if counts.shape[1] > 1:
        a, b = np.nanmean(counts[0].mean(2), 1), np.nanmean(counts[1].mean(2), 1)   # run x unit
        r, u = np.nonzero(~np.isnan(a))
        return {"pretraining runs": r}, u, a[r, u], n[u], b[r, u], n[u]
    a, b = counts[0, 0].mean(1), counts[1, 0].mean(1)                               # fold x unit
    f, u = np.nonzero(~np.isnan(a))
    return {"folds": f}, u, a[f, u], n[u], b[f, u], n[u]


def decide_new(counts, n, design, rng=None) -> tuple[float, float, float]:
    """The report's decision: (p, interval low, interval high)."""
    ev = paired_test(*_observations(counts, n))
    return ev.p, ev.ci_low, ev.ci_high


def _t_over(d: np.ndarray) -> tuple[float, float, float]:
    t = sps.ttest_1samp(d, 0.0)
    ci = t.confidence_interval(0.95)
    return float(t.pvalue), float(ci.low), float(ci.high)


def _accuracies(counts, n):
    w = np.where(np.isnan(counts), 0.0, 1.0) * n
    return np.nansum(counts, axis=-1) / w.sum(-1)                       # recipe x run x fold x seed


def decide_fold_t(counts, n, design, rng=None) -> tuple[float, float, float]:
    """Paired t over the seed-averaged (run, fold) accuracies."""
    acc = _accuracies(counts, n)
    return _t_over((acc[0] - acc[1]).mean(-1).ravel())


def decide_old(counts, n, design, rng, resamples: int = 1999) -> tuple[float, float, float]:
    """Before issue #55: with one run, units resampled with their folds and seeds averaged (permutation p, percentile
    bootstrap); with several, a t-test over the runs' mean fold-level differences."""
    if counts.shape[1] > 1:
        acc = _accuracies(counts, n)
        return _t_over((acc[0] - acc[1]).mean((-1, -2)))
    a, b = np.nanmean(counts[0, 0].mean(1), 0), np.nanmean(counts[1, 0].mean(1), 0)   # per unit, folds averaged
    d = a - b
    total = n.sum()
    obs = d.sum() / total
    null = (rng.choice((-1.0, 1.0), (resamples, len(d))) * d).sum(1) / total
    # scipy's random-permutation p (the observed statistic counts as one of the resamples)
    p = min(1.0, 2 * min(((null >= obs).sum() + 1) / (resamples + 1), ((null <= obs).sum() + 1) / (resamples + 1)))
    idx = rng.integers(0, len(d), (resamples, len(d)))
    lo, hi = np.percentile(d[idx].sum(1) / n[idx].sum(1), [2.5, 97.5])
    return p, lo, hi


def decide_two_way_boot(counts, n, design, rng, resamples: int = 199) -> tuple[float, float, float]:
    """Percentile bootstrap over replicates and units (crossed: independently, Owen's pigeonhole bootstrap; nested:
    units within resampled replicates); p = twice the smaller tail share beyond 0."""
    reps, units, ca, cb, nn = _cells(counts, n, design)
    R, U = reps.max() + 1, units.max() + 1
    if design == "crossed" or counts.shape[1] > 1:
        D = np.zeros((R, U))
        D[reps, units] = ca - cb
        ri, ui = rng.integers(0, R, (resamples, R)), rng.integers(0, U, (resamples, U))
        stats = D[ri[:, :, None], ui[:, None, :]].sum((1, 2)) / (n[ui].sum(1) * R)
    else:
        by_rep = [np.flatnonzero(reps == r) for r in range(R)]
        stats = np.empty(resamples)
        for i in range(resamples):
            j = np.concatenate([by_rep[r][rng.integers(0, len(by_rep[r]), len(by_rep[r]))]
                                for r in rng.integers(0, R, R)])
            stats[i] = (ca[j] - cb[j]).sum() / nn[j].sum()
    lo, hi = np.percentile(stats, [2.5, 97.5])
    p = min(1.0, 2 * min((stats <= 0).mean(), (stats >= 0).mean()))
    return p, lo, hi


ARMS = {"new": decide_new, "fold t": decide_fold_t, "old units": decide_old, "two-way boot": decide_two_way_boot}


def run_scenario(c: Components, sc: Scenario, sims: int, seed: int = 0, arms=tuple(ARMS)) -> dict:
    """Each arm's rejection rate at p < ALPHA (with its Clopper-Pearson interval), interval coverage of the truth,
    and p-values (for size-adjusted power) over `sims` simulated studies of `sc`."""
    delta, truth = effect_logit(c, sc)
    rng = np.random.default_rng(seed)
    ps = {a: [] for a in arms}
    covered = {a: 0 for a in arms}
    for _ in range(sims):
        counts, n = _draw(c, sc, delta, rng)
        for a in arms:
            p, lo, hi = ARMS[a](counts, n, c.design, rng)
            ps[a].append(1.0 if math.isnan(p) else p)
            covered[a] += bool(lo <= truth <= hi)
    out = {"scenario": sc.label, "task": sc.task, "shift_points": sc.shift_points, "runs": sc.runs,
           "effect_points": sc.effect_points, "truth_points": round(100 * truth, 3), "sims": sims, "arms": {}}
    for a in arms:
        k = int(sum(p < ALPHA for p in ps[a]))
        lo, hi = clopper_pearson(k, sims)
        out["arms"][a] = {"rate": round(k / sims, 4), "rate_low": round(lo, 4), "rate_high": round(hi, 4),
                          "coverage": round(covered[a] / sims, 4), "p": ps[a]}
    return out


def size_adjust(entries: list[dict]) -> None:
    """Each alternative's size-adjusted power per arm: the share of its p-values below the arm's own 5% quantile of
    p under the matching null scenario (same task, shift, runs), so that an arm that rejects too often under the
    null gets no credit for it. The p-values are then dropped from the entries."""
    nulls = {(e["task"], e["shift_points"], e["runs"]): e for e in entries if not e["effect_points"]}
    for e in entries:
        null = nulls.get((e["task"], e["shift_points"], e["runs"]))
        if e["effect_points"] and null:
            for a, r in e["arms"].items():
                cut = float(np.quantile(null["arms"][a]["p"], ALPHA))
                r["size_adjusted_power"] = round(float(np.mean(np.asarray(r["p"]) < min(cut, ALPHA))), 4)
    for e in entries:
        for r in e["arms"].values():
            r.pop("p", None)


# ---------------------------------------------------------------- the claim family (issue #66)


@dataclass(frozen=True)
class FamilyScenario:
    """A simulated objective ablation's claims, CT and AD together (one claim per task: the aligned recipe A
    against the ablated recipe B and against the row's context-free floor F, the report's rule): each claim's p is
    the larger of its two tests' one-sided p of a gain (intersection-union), Holm runs over the two claims, and a claim is bold when its
    Holm p < ALPHA with both differences positive (`significance.bold_cells`)."""

    label: str
    effects: tuple[tuple[str, float], ...] = (("ct", 0.0), ("ad", 0.0))
    """Each task's true gain of A over B, in points."""
    shifts: tuple[tuple[str, float], ...] = ()
    """Each task's finetuning shift in points (missing: the task's real one, `Components.shift_points`)."""
    runs: int = 1
    floor_points: float = -10.0
    """The floor's level against B, in points: far below (-10, CT's lexicon at mini is further) or level (0)."""
    persistent: float = 0.0
    tails: float = 0.0
    missing_fold: bool = False
    """One fold missing on every side (a fold that failed): the decision over four."""


def family_scenarios(quick: bool = False) -> list[FamilyScenario]:
    """The family's null scenarios (no claim true: its family-wise false positives), the partial null (CT true,
    AD null) and the power scenario of the goal: +1.5 points on CT with one run at a 0.5-point finetuning shift."""
    out = [FamilyScenario("null, real shifts, 1 run, floor far"),
           FamilyScenario("null, real shifts, 1 run, floor level (a rule as good as B)", floor_points=0.0),
           FamilyScenario("null, 3-point shifts, 1 run, floor far", shifts=(("ct", 3.0), ("ad", 3.0))),
           FamilyScenario("null, real shifts, 3 runs, recipe x unit half persistent", runs=3, persistent=0.5),
           FamilyScenario("null, real shifts, 1 run, heavy tails (t, 3 df)", tails=3.0),
           FamilyScenario("null, real shifts, 1 run, a fold missing", missing_fold=True),
           FamilyScenario("partial null: CT +1.5 at 0.5-point shift, AD null, 1 run", effects=(("ct", 1.5), ("ad", 0.0)),
                          shifts=(("ct", 0.5),))]
    if quick:
        return [out[0], out[3], out[-1]]
    return out


def _pair(counts, n, ref: int):
    """`_observations` of recipe A against model `ref` (B: 1, the floor: 2)."""
    return _observations(counts[[0, ref]], n)


def run_family(comps: dict, fs: FamilyScenario, sims: int, seed: int = 0, decide=None) -> dict:
    """Bold rates of `fs`'s claims over `sims` simulated studies: the family-wise false-positive rate (a study with
    at least one bold claim whose effect is 0), with its Clopper-Pearson interval, and each claim's bold rate (its
    power where its effect is real). `decide`: the paired decision (default `paired_test`)."""
    decide = decide or paired_test
    rng = np.random.default_rng(seed)
    effects, shifts = dict(fs.effects), dict(fs.shifts)
    setup = {}
    for task, c in comps.items():
        sc = Scenario(task, shifts.get(task, c.shift_points), fs.runs, effects.get(task, 0.0))
        delta, truth = effect_logit(c, sc)
        setup[task] = (c, sc, delta, truth)
    false_any, bold_count = 0, {t: 0 for t in comps}
    for _ in range(sims):
        ps, positive = {}, {}
        for task, (c, sc, delta, _) in setup.items():
            counts = _draw_counts(c, sc, rng, [delta, 0.0, c.scaled(fs.floor_points)], fs.runs,
                                  rules=(False, False, True), persistent=fs.persistent, tails=fs.tails)
            if fs.missing_fold:
                counts[:, :, FOLDS - 1] = np.nan
            n = np.asarray(c.counts, float)
            evs = [decide(*_pair(counts, n, ref)) for ref in (1, 2)]
            # One-sided p of a gain, the larger of the two: the claim's intersection-union p (`significance.claim_p`).
            p = [1.0 if math.isnan(e.p) else (e.p / 2 if e.diff > 0 else 1 - e.p / 2) for e in evs]
            ps[task], positive[task] = max(p), all(e.diff > 0 for e in evs)
        adjusted = dict(zip(ps, holm(list(ps.values()))))
        bold = {t: bool(adjusted[t] < ALPHA and positive[t]) for t in ps}
        false_any += any(bold[t] and not effects.get(t, 0.0) for t in bold)
        for t in bold:
            bold_count[t] += bold[t]
    lo, hi = clopper_pearson(false_any, sims)
    out = {"scenario": fs.label, **{k: v for k, v in dataclasses.asdict(fs).items() if k != "label"},
           "sims": sims, "fwer": round(false_any / sims, 4), "fwer_low": round(lo, 4), "fwer_high": round(hi, 4),
           "truth_points": {t: round(100 * s[3], 3) for t, s in setup.items()}, "bold": {}}
    for t, k in bold_count.items():
        blo, bhi = clopper_pearson(k, sims)
        out["bold"][t] = {"rate": round(k / sims, 4), "low": round(blo, 4), "high": round(bhi, 4)}
    return out


def family_table(entries: list[dict]) -> list[str]:
    lines = ["| scenario | family-wise false positives of bold claims [MC 95%] | CT claim bold | AD claim bold |",
             "|---|---|---|---|"]
    for e in entries:
        b = e["bold"]
        lines.append(f"| {e['scenario']} | {100 * e['fwer']:.1f}% [{100 * e['fwer_low']:.1f}, {100 * e['fwer_high']:.1f}] | "
                     f"{100 * b['ct']['rate']:.1f}% | {100 * b['ad']['rate']:.1f}% |")
    return lines


SHIFTS = (0.0, 0.5, 1.0, 2.0, 3.0)
EFFECTS = {"ct": 1.0, "ad": 5.0}


def scenarios(quick: bool = False) -> list[Scenario]:
    shifts = (0.5, 3.0) if quick else SHIFTS
    out = []
    for task in ("ct", "ad"):
        for runs in (1, 3):
            for s in shifts:
                out.append(Scenario(task, s, runs))
                out.append(Scenario(task, s, runs, EFFECTS[task]))
    return out


def table(entries: list[dict], arms) -> list[str]:
    """Null rows: rejection rate [Monte-Carlo 95% interval] / coverage. Alternative rows: power (size-adjusted) /
    coverage."""
    lines = ["| scenario | effect (truth, pts) | " + " | ".join(a for a in arms) + " |", "|---|---|" + "---|" * len(arms)]
    for e in entries:
        cells = []
        for a in arms:
            r = e["arms"][a]
            if e["effect_points"]:
                adj = r.get("size_adjusted_power")
                cells.append(f"power {100 * r['rate']:.1f}%" + (f" ({100 * adj:.1f}%)" if adj is not None else "")
                             + f" / {100 * r['coverage']:.1f}%")
            else:
                cells.append(f"{100 * r['rate']:.1f}% [{100 * r['rate_low']:.1f}, {100 * r['rate_high']:.1f}] / "
                             f"{100 * r['coverage']:.1f}%")
        eff = "null" if not e["effect_points"] else f"+{e['effect_points']:g} ({e['truth_points']:+.2f})"
        lines.append(f"| {e['scenario']} | {eff} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                    help="a report's results.parquet to estimate the variance components from")
    ap.add_argument("--sims", type=int, default=1000, help="simulated studies per alternative scenario (default 1000)")
    ap.add_argument("--null-sims", type=int, default=4000,
                    help="simulated studies per null scenario (default 4000: a rate near 5%% to within +-0.7 points)")
    ap.add_argument("--quick", action="store_true", help="two finetuning shifts only (0.5 and 3 points)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"decisions to compare (default all: {', '.join(ARMS)})")
    ap.add_argument("--run-points", type=float, nargs=2, default=RUN_POINTS, metavar=("CT", "AD"),
                    help="a pretraining run's shift sd in points, CT and AD (default %s and %s: CT's measured by the "
                         "mini study with --pretrain-seeds 3, AD's assumed: AD is at chance in every run there)"
                         % RUN_POINTS)
    ap.add_argument("--seed", type=int, default=0)
    bench_args.add_flags(ap, out=RESULTS / "calibration.json")
    ap.add_argument("--real", action="store_true", help="A/A on real FEL calculations instead (see real_aa.py)")
    ap.add_argument("--family", action="store_true",
                    help="the claim family instead: family-wise false positives of bold claims and the claims' power "
                         "(--sims studies per scenario; figures to calibration_family.json unless --out)")
    ap.add_argument("--only", default=None, metavar="I,J",
                    help="with --family: only these scenarios (their 0-based places in family_scenarios())")
    ap.add_argument("--run-from", type=Path, default=None, metavar="RESULTS",
                    help="a results.parquet with several pretraining runs per column: the run shift sd of each task "
                         "is estimated from it (`run_points_from`) instead of --run-points")
    args, rest = ap.parse_known_args(argv)
    if args.real:
        import real_aa

        return real_aa.main(rest)
    if rest:
        ap.error(f"unrecognised arguments: {' '.join(rest)}")
    arms = tuple(a.strip() for a in args.arms.split(","))
    command = bench_args.command("statistics/calibration.py", argv)
    commit = "%s%s" % commit_of()  # at the start: the code that runs, whatever changes while it does
    run_points = dict(zip(("ct", "ad"), args.run_points))
    if args.run_from:
        run_points.update(run_points_from(args.run_from))
    comps = {t: estimate(args.results, t, run_points[t]) for t in ("ct", "ad")}
    if args.family:
        return family_main(args, comps, command, run_points, commit)
    for c in comps.values():
        print(f"[calibration] {c.task}: {c.design}, {len(c.counts)} units; latent sds (item difficulty 1): model x item "
              f"{c.sd_model_item:.3f}, fold x item {c.sd_fold_item:.3f}, seed x item {c.sd_seed_item:.3f}, seed x item "
              f"shared by the folds {c.sd_seed_main_item:.3f}; slope {c.slope:.4f}/unit; real finetuning shift "
              f"{c.shift_points:.2f} points (shares: fold {c.fold_share:.2f}, seed across folds "
              f"{c.seed_main_share:.2f})", flush=True)
    entries = []
    t0 = time.time()
    for i, sc in enumerate(scenarios(args.quick)):
        sims = args.sims if sc.effect_points else args.null_sims
        entries.append(run_scenario(comps[sc.task], sc, sims, seed=args.seed + i, arms=arms))
        print(table(entries[-1:], arms)[-1], f"({time.time() - t0:.0f}s)", flush=True)
    size_adjust(entries)
    print("Null rows: rejection rate at p < 0.05 [Monte-Carlo 95% interval] / 95% interval coverage. Alternative rows: "
          "power (size-adjusted power) / coverage.")
    print("\n".join(table(entries, arms)))
    entry = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
             "machine": machine_info.machine("numpy", "scipy"), "results": str(args.results.name),
             "components": {t: {k: v for k, v in dataclasses.asdict(c).items() if k not in ("counts", "means", "fold_of")}
                            for t, c in comps.items()},
             "scenarios": entries, "seconds": round(time.time() - t0)}
    machine_info.record(args.out, entry)
    print(f"[calibration] written to {args.out}")
    return 0


def run_points_from(results: Path) -> dict[str, float]:
    """Each task's pretraining-run shift sd in points, from a results.parquet with two or more pretraining runs per
    column (`--pretrain-seeds`): the variance of a column's run means (each run's ten calculations averaged) less
    what their finetuning spread puts in them (the within-run variance over the calculations / their count),
    pooled over the columns; tasks without several runs are left out."""
    import pandas as pd

    df = pd.read_parquet(results)
    if "pretrain_seed" not in df.columns:
        return {}
    out = {}
    for task, sub in df.dropna(subset=["accuracy"]).groupby("ft_task"):
        between, within = [], []
        for _, cell in sub.groupby(["row", "col"]):
            runs = cell.groupby("pretrain_seed")["accuracy"]
            if runs.ngroups < 2:
                continue
            between.append(runs.mean().var(ddof=1))
            within.append((runs.var(ddof=1) / runs.size()).mean())
        if between:
            out[str(task)] = 100 * math.sqrt(max(0.0, float(np.mean(between) - np.mean(within))))
    return out


def family_main(args, comps: dict, command: str, run_points: dict, commit: str) -> int:
    """`--family`: every family scenario at `--sims` simulated studies; figures printed and recorded."""
    out = args.out if args.out != RESULTS / "calibration.json" else RESULTS / "calibration_family.json"
    entries, t0 = [], time.time()
    only = {int(i) for i in args.only.split(",")} if args.only else None
    for i, fs in enumerate(family_scenarios(args.quick)):
        if only is not None and i not in only:
            continue
        entries.append(run_family(comps, fs, args.sims, seed=args.seed + i))
        print(family_table(entries[-1:])[-1], f"({time.time() - t0:.0f}s)", flush=True)
    print("Family-wise false positives: the share of simulated studies with a bold claim whose effect is 0 [Monte-Carlo "
          "95% interval]; a claim's bold rate is its power where its effect is real.")
    print("\n".join(family_table(entries)))
    entry = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "commit": commit, "machine": machine_info.machine("numpy", "scipy"),
             "results": str(args.results.name), "run_points": run_points,
             "run_points_from": str(args.run_from) if args.run_from else (
                 RUN_POINTS_SOURCE if tuple(args.run_points) == RUN_POINTS else "given (--run-points)"),
             "scenarios": entries, "seconds": round(time.time() - t0)}
    machine_info.record(out, entry)
    print(f"[calibration] written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The report's decision: is one set of calculations more accurate than another scored on the same splits, with a
test and an interval that cover every source of variance the FEL protocol samples?

What varies. A cell is ten calculations: five finetuning samples ("folds": CT draws five budgets from its pool, AD
cross-validates over five folds; `--folds N`: N) x two seeds, each scored per test unit (`Task.test_unit`: a CT
text, an AD snippet). Its accuracy moves with (1) the finetuning sample and seed, (2) the test units, and (3) with several
pretraining runs, the run. The paired difference of two cells on the same splits carries all three:
- CT's test units are **crossed** with the folds: every fold is scored on the one shared test set. A unit's
  difference recurs in every fold, so averaging over folds does not average it away, and a test over the five
  fold means alone holds the test texts fixed (Clark 1973, "the language-as-fixed-effect fallacy").
- AD's test units are **nested** in the folds: each fold tests its own snippets, so a fold's mean difference
  already carries its units' sampling variance and the folds are the independent replicates.
- Resampling only the units (the folds averaged first) holds the finetuning samples fixed: its false-positive
  rate grows with the finetuning spread (benchmarks/statistics/calibration.py).

The decision (one function, `paired_test`, for every comparison of a report). The seeds of a fold are averaged
first (a calculation's randomness is keyed by its seed and fold, `finetune.calculation_seed`, so the folds are
independent replicates). The **replicates** are the folds (one pretraining run per column) or the pretraining runs
(two or more per column: each run's folds and seeds averaged, the runs the outer level). The difference is a
difference of two pooled accuracies (sum correct / sum scored on each side); its variance is estimated from the
linearised per-(replicate, unit) values z (Cochran's ratio-estimator linearisation), as a sum of parts, each with
its degrees of freedom (`crossed_variance`):
- crossed (every unit in every replicate): the replicates' mean square MS_rep / (R U), always, with R - 1 degrees
  of freedom, plus the units' own component (MS_unit - MS_resid) / (R U) where it is positive, with Satterthwaite's
  degrees of freedom (the quasi-F of Clark 1973; the crossed random effects of Baayen, Davidson & Bates 2008);
- nested (every unit in one replicate): the replicates' sums of z, R - 1 degrees of freedom (a t-test over the
  replicates, weighted by their units); a cross-validation repeated (AD at `--folds 10`: folds f and f + 5 test on one
  test fold) is nested in its test folds, each with its folds pooled (`_shared_test_sets`);
- partly crossed: two-way cluster-robust variance (Cameron, Gelbach & Miller 2011), replicates + units - cells,
  with min(R, U) - 1 degrees of freedom.
p and the interval use Cochran & Cox's (1950) critical value, each part's t quantile weighted by its variance: a
Satterthwaite blend of a 4-degree-of-freedom part and a many-degree one was liberal (benchmarks/statistics/calibration.py). A t
reference, not a bootstrap: with five folds a percentile bootstrap over folds covers far less than 95%.

Degenerate cases have a stated outcome (`Evidence.outcome`), never a silent gap: no shared splits, one replicate
(the finetuning variance cannot be estimated), and no spread at all. Results recorded before per-unit scores fall
back to a paired t-test over the replicates' accuracies (design "replicates only"), which holds the test units
fixed and says so.
Holm's correction (`holm`) runs inside each family of tests of a report (`significance`: the study's claims, the
controls, the secondary and exploratory tests).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.optimize import brentq

CONFIDENCE = 0.95
P_FLOOR = 1e-12
"""The smallest p a blended (Cochran-Cox) test reports: beyond it the weighted t quantiles are not computed."""
MIN_PART_DF = 1.0
"""The fewest degrees of freedom a variance part counts. Satterthwaite's degrees of freedom of a difference of mean
squares fall below 1 where the difference is small against its terms (a unit component barely above the residual);
a Student t with a fraction of a degree of freedom has no usable quantile (0.12 df: 1e13 at 97.5%), so one such part,
however small, made the blend's interval 1e8 points wide. Counted as 1 (t 12.7), it is still the most cautious part;
`tests/test_unit_statistics.py` simulates the case."""
FOLD_KEY = "ft_fold"
RUN_KEY = "pretrain_seed"
"""The pretraining run of a calculation's model (its `PretrainConfig.seed`, from study.json)."""


def unit_columns(metric: str) -> tuple[str, str, str]:
    """The result columns (unit keys, scored counts, correct counts) holding `metric`'s per-test-unit scores:
    "accuracy" -> unit_*, "best_accuracy" -> the same units scored at the best-accuracy epoch, and an extra test
    set's "eval_<name>_accuracy" -> eval_<name>_unit_*."""
    if metric == "best_accuracy":
        return "unit_keys", "unit_count", "unit_correct_at_best_accuracy"
    prefix = _prefix(metric)
    return f"{prefix}unit_keys", f"{prefix}unit_count", f"{prefix}unit_correct"


def _prefix(metric: str) -> str:
    """"" for the protocol test set's metrics, "eval_<name>_" for an extra test set's."""
    if metric in ("accuracy", "best_accuracy"):
        return ""
    return metric[: -len("accuracy")] if metric.endswith("accuracy") else f"{metric}_"


def baseline_unit_columns(metric: str, name: str) -> tuple[str, str, str]:
    """The per-unit columns of context-free baseline `name` on `metric`'s test set (a baseline has no epochs: the
    same for "accuracy" and "best_accuracy")."""
    prefix = _prefix(metric)
    return f"{prefix}unit_keys", f"{prefix}unit_count_baseline_{name}", f"{prefix}unit_correct_baseline_{name}"


def baseline_accuracy_column(metric: str, name: str) -> str:
    return f"{_prefix(metric)}baseline_{name}"


@dataclass(frozen=True)
class Evidence:
    """A paired difference (cell minus reference, in accuracy 0-1) with its 95% interval and two-sided p."""

    diff: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    p: float = math.nan
    se: float = math.nan
    df: float = math.nan
    design: str = "–"
    """"crossed", "nested", "partly crossed" (units and replicates), or "replicates only" (no per-unit scores)."""
    over: str = "–"
    """What the replicates are: "folds" (one pretraining run per column) or "pretraining runs"."""
    n_replicates: int = 0
    n_units: int = 0
    layout: str = ""
    """The replicate factors and their levels, e.g. "5 folds × 2 seeds"."""
    outcome: str = ""
    """Why there is no test, or what to know about this one (empty when there is nothing to say)."""
    parts: tuple[tuple[float, float], ...] = ()
    """The variance's parts, (variance, degrees of freedom) each, that p and the interval were computed from."""

    @property
    def tested(self) -> bool:
        return not math.isnan(self.p)

    def critical(self, alpha: float) -> float:
        """The decision's two-sided critical value at `alpha` (Cochran-Cox over `parts`); nan without parts."""
        return _critical(alpha, list(self.parts)) if self.parts else math.nan

    def upper_bound(self, alpha: float) -> float:
        """The upper end of the interval at two-sided level `alpha` (the claim's level, not the 95% of `ci_high`)."""
        return self.diff + self.critical(alpha) * self.se

    def detectable(self, alpha: float, power: float = 0.8) -> float:
        """The minimum detectable effect: the true difference that this design, with these variance components,
        calls a significant gain at two-sided `alpha` with probability `power`. The estimate over its standard error
        is a noncentral t (`df`, the Student t matching the decision's critical value); the effect is the
        noncentrality at which it exceeds the decision's critical value at `alpha` with probability `power`, times
        the standard error (for one part, exact)."""
        q = self.critical(alpha)
        if math.isnan(q) or not self.se > 0:
            return math.nan
        df = min(self.df, 1e6)
        ncp = brentq(lambda d: float(sps.nct.sf(q, df, d)) - power, 0.0, q + 50.0)
        return ncp * self.se


def _critical(alpha: float, parts: list[tuple[float, float]]) -> float:
    """Cochran & Cox's (1950) critical value of a difference whose variance is a sum of parts, each (variance,
    degrees of freedom): the parts' t critical values at two-sided `alpha`, weighted by the parts' variances."""
    total = sum(v for v, _ in parts)
    return sum(v * float(sps.t.isf(alpha / 2, df)) for v, df in parts) / total


def _evidence(diff: float, parts: list[tuple[float, float]], **kw) -> Evidence:
    """p and 95% interval of `diff`, whose variance is the sum of `parts` ((variance, degrees of freedom) each), by
    Cochran & Cox's weighted critical value: where one part has a few degrees of freedom (five folds, three runs) and
    another many (the test units), its tails are those of the parts, not of a Satterthwaite blend, which let the
    decision call a difference in 6% of true nulls (benchmarks/statistics/calibration.py). p solves |t| = critical(p); `df` is
    the Student t whose 95% critical value equals the blend's (for reading only)."""
    parts = [(v, df) for v, df in parts if v > 0]
    var = sum(v for v, _ in parts)
    if var <= 0 or not math.isfinite(var):
        if diff == 0:
            return Evidence(0.0, 0.0, 0.0, 1.0, 0.0, outcome="no difference on any unit", **kw)
        return Evidence(diff, se=0.0, outcome="no spread: the difference is the same everywhere, so nothing "
                        "estimates its variance; not tested", **kw)
    se = math.sqrt(var)
    t = abs(diff) / se
    q = _critical(1 - CONFIDENCE, parts)
    if len(parts) == 1:
        p = float(2 * sps.t.sf(t, parts[0][1]))
        df = parts[0][1]
    else:
        gap = lambda log_a: _critical(math.exp(log_a), parts) - t  # noqa: E731 -- decreasing in alpha
        floor = math.log(P_FLOOR)
        p = 1.0 if gap(0.0) >= 0 else (math.exp(brentq(gap, floor, 0.0)) if gap(floor) > 0 else P_FLOOR)
        crit = lambda d: float(sps.t.isf((1 - CONFIDENCE) / 2, d)) - q  # noqa: E731 -- decreasing in d
        df = 1e-3 if crit(1e-3) <= 0 else (math.inf if crit(1e7) >= 0 else brentq(crit, 1e-3, 1e7))
    return Evidence(diff, diff - q * se, diff + q * se, min(1.0, p), se, float(df), parts=tuple(parts), **kw)


def _t_evidence(diff: float, var: float, df: float, **kw) -> Evidence:
    """`_evidence` of a variance with one part."""
    return _evidence(diff, [(var, df)], **kw)


def effective_df(x: np.ndarray) -> float:
    """The degrees of freedom a mean square of the centred values `x` carries, from their own spread: 2 E[ms]^2 /
    Var(ms), Var estimated from the squares (len(x) - 1 for normal values of one variance; fewer when a few units
    carry most of the spread, as where most test units never change between two models)."""
    sq = x ** 2
    v = sq.var()
    if v <= 0:
        return float(len(x) - 1)
    return float(min(len(x) - 1, 2 * (len(x) - 1) * sq.mean() ** 2 / v))


def _effect(X: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The balanced-ANOVA effect of the factors `axes` of the dense array X: its mean over the other axes, centred
    along each of `axes` (inclusion-exclusion of the marginal means)."""
    other = tuple(i for i in range(X.ndim) if i not in axes)
    E = X.mean(axis=other, keepdims=True) if other else X
    for a in axes:
        E = E - E.mean(axis=a, keepdims=True)
    return E


def crossed_variance(X: np.ndarray, primary: int = 0, unit_axis: int | None = None) -> list[tuple[float, float]]:
    """The variance of X's grand mean, as parts (variance, degrees of freedom), for a balanced array whose axes are
    crossed random factors (replicates, units). Every mean square MS_T of a set T of axes is computed; the parts are
    MS_primary / N (the replicates' mean square, always, with its own degrees of freedom) and, for every effect S
    without the primary axis whose ANOVA estimate c_S = sum_{T >= S} (-1)^{|T|-|S|} MS_T is positive, c_S / N with
    Satterthwaite's degrees of freedom over its mean squares (the units' main effect with the degrees of freedom its
    squares carry). Their sum is unbiased where nothing is truncated."""
    k = X.ndim
    sizes = X.shape
    N = X.size
    ms, dfs = {}, {}
    for r in range(1, k + 1):
        for T in itertools.combinations(range(k), r):
            d = math.prod(sizes[i] - 1 for i in T)
            if d == 0:
                continue
            E = _effect(X, T)
            ms[T] = (N / E.size) * float((E ** 2).sum()) / d
            dfs[T] = float(d)
            if unit_axis is not None and T == (unit_axis,):
                dfs[T] = effective_df(E.ravel())
    parts = [(ms[(primary,)] / N, dfs[(primary,)])] if (primary,) in ms else []
    for r in range(1, k + 1):
        for S in itertools.combinations(range(k), r):
            if primary in S or S not in ms:
                continue
            terms = {T: (-1.0) ** (len(T) - len(S)) for T in ms if set(S) <= set(T)}
            c = sum(sign * ms[T] for T, sign in terms.items())
            if c > 0:
                df = c ** 2 / sum((sign * ms[T]) ** 2 / dfs[T] for T, sign in terms.items())
                parts.append((c / N, max(MIN_PART_DF, df)))
    return parts


def paired_test(factors: dict[str, np.ndarray], unit, ca, na, cb, nb) -> Evidence:
    """The decision on paired per-observation scores: the replicate factors of each observation (`factors`, the first
    being the replicates: {"folds": ..., "seeds": ...}, or {"pretraining runs": ..., "folds": ..., "seeds": ...}), its
    test unit, and each side's correct and scored counts. The difference is sum(ca)/sum(na) - sum(cb)/sum(nb)."""
    names = list(factors)
    over = names[0]
    unit = np.asarray(unit)
    ca, na, cb, nb = (np.asarray(x, float) for x in (ca, na, cb, nb))
    if len(ca) == 0 or na.sum() == 0 or nb.sum() == 0:
        return Evidence(math.nan, over=over, outcome="no shared splits: the two sides were not scored on the same "
                        "folds and test units; not compared")
    ra, rb = ca.sum() / na.sum(), cb.sum() / nb.sum()
    diff = float(ra - rb)
    codes = [np.unique(np.asarray(factors[n]), return_inverse=True)[1] for n in names]
    sizes = [int(c.max()) + 1 for c in codes]
    units, u_idx = np.unique(unit, return_inverse=True)
    R, U = sizes[0], len(units)
    layout = " × ".join(f"{s} {n}" for s, n in zip(sizes, names) if s > 1) or f"1 {over[:-1]}"
    kw = dict(over=over, n_replicates=R, n_units=U, layout=layout)
    if R < 2:
        return Evidence(diff, outcome=f"one {over[:-1]}: the spread between {over} cannot be estimated; not tested "
                                      f"(run the protocol's five folds{'' if over == 'folds' else ', or pretrain twice'})",
                        **kw)
    # Linearised contribution of each observation to the difference of the two ratios (mean 0).
    z = (ca - ra * na) / na.mean() - (cb - rb * nb) / nb.mean()
    cell = np.ravel_multi_index(codes, sizes)
    n_cells = math.prod(sizes)
    nested_in = next((i for i, c in enumerate(codes) if _each_unit_in_one_level(u_idx, c, U)), None)
    if len(z) == n_cells * U and np.bincount(u_idx, minlength=U).min() == n_cells:
        X = np.zeros((n_cells, U))
        X[cell, u_idx] = z
        X = X.reshape(*sizes, U).squeeze(axis=tuple(i for i, s in enumerate(sizes) if s == 1))
        return _evidence(diff, crossed_variance(X, 0, unit_axis=X.ndim - 1), design="crossed", **kw)
    if nested_in is not None:
        per_cell = np.bincount(cell, minlength=n_cells)
        if per_cell.min() > 0:
            # Each cell's units summed, on the scale of one observation: the cells' mean is the observations' mean.
            X = (np.bincount(cell, weights=z, minlength=n_cells) / (len(z) / n_cells)).reshape(sizes)
            X = X.squeeze(axis=tuple(i for i, s in enumerate(sizes) if s == 1))
            return _evidence(diff, crossed_variance(X, 0), design="nested", **kw)
    shared = _shared_test_sets(codes[0], u_idx, R)
    if shared is not None and len(codes) == 1:
        # Folds that share one test set (AD's cross-validation repeated, `--folds 10`): each test set is a replicate
        # (its folds pooled inside it), and the units are nested in the test sets.
        group, within = shared
        G, W = int(group.max()) + 1, int(within.max()) + 1
        X = np.bincount(group[codes[0]], weights=z, minlength=G) / (len(z) / G)  # each test fold's sum of z
        return _evidence(diff, crossed_variance(X, 0), design="nested", **{
            **kw, "over": "test folds", "n_replicates": G, "layout": f"{G} test folds × {W} {over} each"})
    # Units in some replicates but not others, or missing cells: two-way cluster-robust over replicates and units.
    r_idx = codes[0]
    N = len(z)
    by_rep = np.bincount(r_idx, weights=z, minlength=R)
    v_rep = R / (R - 1) * (by_rep ** 2).sum() / N ** 2
    by_unit = np.bincount(u_idx, weights=z, minlength=U)
    v_unit = U / (U - 1) * (by_unit ** 2).sum() / N ** 2 if U > 1 else 0.0
    v_cell = N / (N - 1) * (z ** 2).sum() / N ** 2
    var = max(v_rep + v_unit - v_cell, v_rep, v_unit)
    return _t_evidence(diff, var, float(min(R, U) - 1), design="partly crossed", **kw)


def _shared_test_sets(r_idx: np.ndarray, u_idx: np.ndarray, R: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the replicates fall into groups of equal size that each share one test set, disjoint from the others'
    (a cross-validation repeated: fold f tests on test fold f mod 5), each replicate's (group, index within it);
    None otherwise."""
    units = [frozenset(u_idx[r_idx == r].tolist()) for r in range(R)]
    sets = list(dict.fromkeys(units))
    if not 1 < len(sets) < R or sum(len(s) for s in sets) != len(frozenset().union(*sets)):
        return None
    group = np.array([sets.index(s) for s in units])
    sizes = np.bincount(group)
    if sizes.min() != sizes.max():
        return None
    within = np.array([int((group[:r] == group[r]).sum()) for r in range(R)])
    return group, within


def _each_unit_in_one_level(u_idx: np.ndarray, codes: np.ndarray, U: int) -> bool:
    """Does every unit occur with one level of this factor only (units nested in it)?"""
    pairs = np.unique(np.stack([u_idx, codes]), axis=1)
    return pairs.shape[1] == U and np.bincount(codes).size > 1


def replicate_t(factors: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> Evidence:
    """The fallback where the results have no per-unit scores: the same decision over the replicates' (and seeds')
    accuracies, one value per (replicate, seed) cell; it holds the test units fixed."""
    names = list(factors)
    over = names[0]
    d = np.asarray(x, float) - np.asarray(y, float)
    if len(d) == 0:
        return Evidence(math.nan, over=over, outcome="no shared splits: the two sides were not scored on the same "
                        "folds; not compared")
    codes = [np.unique(np.asarray(factors[n]), return_inverse=True)[1] for n in names]
    sizes = [int(c.max()) + 1 for c in codes]
    layout = " × ".join(f"{s} {n}" for s, n in zip(sizes, names) if s > 1) or f"1 {over[:-1]}"
    kw = dict(design="replicates only", over=over, n_replicates=sizes[0], layout=layout)
    note = "no per-unit scores: the test holds the test units fixed"
    if sizes[0] < 2:
        return Evidence(float(d.mean()), outcome=f"one {over[:-1]}: not tested; {note}", **kw)
    n_cells = math.prod(sizes)
    cell = np.ravel_multi_index(codes, sizes)
    if len(d) == n_cells and len(np.unique(cell)) == n_cells:
        X = np.zeros(n_cells)
        X[cell] = d - d.mean()
        X = X.reshape(sizes).squeeze(axis=tuple(i for i, s in enumerate(sizes) if s == 1))
        parts = crossed_variance(X, 0)
    else:  # incomplete cells: the replicates' means alone
        means = np.array([d[codes[0] == r].mean() for r in range(sizes[0])])
        parts = [(float(means.var(ddof=1) / len(means)), float(len(means) - 1))]
    ev = _evidence(float(d.mean()), parts, **kw)
    return dataclasses.replace(ev, outcome="; ".join(x for x in (ev.outcome, note) if x))


# ---------------------------------------------------------------- from result rows to paired cells


def has_unit_scores(df: pd.DataFrame, cols: tuple[str, str, str], metric: str | None = None) -> bool:
    """Do `df`'s rows (those with `metric`, when given) all carry per-unit lists in `cols`?"""
    if df.empty or not all(c in df.columns for c in cols):
        return False
    rows = df.dropna(subset=[metric]) if metric else df
    return len(rows) > 0 and all(isinstance(v, (list, np.ndarray)) for c in cols for v in rows[c])


def unit_table(df: pd.DataFrame, cols: tuple[str, str, str], blocks: list[str]) -> pd.DataFrame:
    """One row per (block..., unit): the unit's scored and correct counts averaged over the rows of the block."""
    kcol, ncol, ccol = cols
    keys = [list(v) for v in df[kcol]]
    lengths = [len(k) for k in keys]
    long = pd.DataFrame({"unit": [u for k in keys for u in k],
                         "count": np.concatenate([np.asarray(v, float) for v in df[ncol]]) if keys else [],
                         "correct": np.concatenate([np.asarray(v, float) for v in df[ccol]]) if keys else []})
    for b in blocks:
        long[b] = np.repeat(df[b].to_numpy(), lengths)
    return long.groupby([*blocks, "unit"], sort=False)[["count", "correct"]].mean()


def runs_of(df: pd.DataFrame) -> list:
    return sorted(df[RUN_KEY].dropna().unique()) if RUN_KEY in df.columns else []


def run_pairing(sub: pd.DataFrame, base: pd.DataFrame) -> tuple[dict, str]:
    """How the two sides' pretraining runs pair: {cell's run: reference's run} with a note. Runs pair by seed; two
    sides with several runs each but other seeds pair in seed order, and the note says so. An empty dict: one run
    on a side (the folds are then the replicates)."""
    ra, rb = runs_of(sub), runs_of(base)
    if len(ra) < 2 or len(rb) < 2:
        note = ""
        if len(ra) != len(rb) and max(len(ra), len(rb)) > 1:
            note = (f"the cell has {len(ra)} pretraining run(s), its reference {len(rb)}: their runs are pooled and "
                    "the models held fixed")
        return {}, note
    shared = [r for r in ra if r in set(rb)]
    if len(shared) >= 2:
        dropped = len(ra) + len(rb) - 2 * len(shared)
        return {r: r for r in shared}, (f"{dropped} run(s) without a partner left out" if dropped else "")
    n = min(len(ra), len(rb))
    return dict(zip(ra[:n], rb[:n])), f"pretraining runs paired in seed order ({ra[:n]} with {rb[:n]})"


def compare(sub: pd.DataFrame, sub_cols: tuple[str, str, str], base: pd.DataFrame, base_cols: tuple[str, str, str],
            metric: str, sub_acc: str, base_acc: str) -> Evidence:
    """The decision for `sub` (its scores in `sub_cols`, accuracy column `sub_acc`) against `base` (`base_cols`,
    `base_acc`), rows of the same splits, paired by fold (and pretraining run), each fold's seeds averaged: per unit
    when both sides have per-unit scores, else over the folds' accuracies. `metric` picks the rows that finished."""
    sub, base = sub.dropna(subset=[metric]), base.dropna(subset=[metric])
    pairing, note = run_pairing(sub, base)
    if pairing:
        sub = sub[sub[RUN_KEY].isin(list(pairing))]
        base = base[base[RUN_KEY].isin(list(pairing.values()))].assign(
            **{RUN_KEY: lambda d: d[RUN_KEY].map({v: k for k, v in pairing.items()})})
    # With several runs each run is one replicate (its folds and seeds averaged): the runs are the outer level.
    blocks = [RUN_KEY] if pairing else [FOLD_KEY]
    names = {RUN_KEY: "pretraining runs", FOLD_KEY: "folds"}
    if not pairing and FOLD_KEY in sub.columns and FOLD_KEY in base.columns:
        alone = set(sub[FOLD_KEY].dropna()) ^ set(base[FOLD_KEY].dropna())
        if alone:  # a fold one side finished and the other did not: the pair is decided without it, and says so
            left = f"fold(s) {', '.join(str(int(f)) for f in sorted(alone))} without a partner left out"
            note = "; ".join(x for x in (note, left) if x)
    if has_unit_scores(sub, sub_cols) and has_unit_scores(base, base_cols):
        j = unit_table(sub, sub_cols, blocks).join(unit_table(base, base_cols, blocks), lsuffix="_a", rsuffix="_b",
                                                     how="inner")
        idx = j.index.to_frame(index=False)
        ev = paired_test({names[b]: idx[b].to_numpy() for b in blocks}, idx["unit"].to_numpy(), j["correct_a"],
                         j["count_a"], j["correct_b"], j["count_b"])
    else:
        x = sub.groupby(blocks)[sub_acc].mean()
        y = base.groupby(blocks)[base_acc].mean()
        xy = pd.concat([x.rename("x"), y.rename("y")], axis=1, join="inner")
        idx = xy.index.to_frame(index=False)
        ev = replicate_t({names[b]: idx[b].to_numpy() for b in blocks}, xy["x"].to_numpy(), xy["y"].to_numpy())
    if note:
        ev = dataclasses.replace(ev, outcome="; ".join(x for x in (ev.outcome, note) if x))
    return ev


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

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
- `new`: the report's decision (`unit_statistics.paired_test`: replicates x units, Satterthwaite t);
- `old units`: the decision before issue #55: units resampled with their folds averaged (a paired permutation test
  and bootstrap interval over units; 1,999 resamples here, 9,999 in the report) -- over the runs' mean differences
  (t, df = runs - 1) with several runs;
- `fold t`: a paired t-test over the seed-averaged fold means (all runs' folds pooled);
- `two-way boot`: a percentile bootstrap that resamples the replicates and the units (crossed: independently,
  the pigeonhole bootstrap of Owen 2007; nested: units within resampled replicates), considered and not chosen.

    python benchmarks/calibration.py                     # every scenario, 1,000 simulated studies each
    python benchmarks/calibration.py --sims 200 --quick  # a few scenarios, for a look
    python benchmarks/calibration.py --real --storage alignlab-storage --model MODEL_ID   # A/A on real calculations

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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # machine_info, when imported by a test
import machine_info  # noqa: E402

from alignlab.platform.report.unit_statistics import paired_test  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_RESULTS = RESULTS / "objective_ablation_mini_results.parquet"
FOLDS, SEEDS = 5, 2
ALPHA = 0.05


@dataclass(frozen=True)
class Components:
    """The variance components of one task's results, on the logit scale unless named in points."""

    task: str
    design: str
    """"crossed" (every fold scores every unit: CT) or "nested" (each fold its own units: AD)."""
    counts: tuple[int, ...]
    """Scored words (CT) or pairs (AD) of each test unit."""
    base: tuple[float, ...]
    """Each unit's logit of being right (the real models' mean)."""
    fold_of: tuple[int, ...]
    """Nested: the fold each unit is tested in; crossed: all -1."""
    sd_model_unit: float
    sd_fold_unit: float
    sd_seed_unit: float
    fold_share: float
    """Share of the calculation-level shift's variance that is the fold's (the rest: the seed's)."""
    shift_points: float
    """The real calculation-level shift's sd, in accuracy points (the scenarios set their own)."""
    run_points: float
    """A pretraining run's shift sd, in accuracy points (with several runs)."""
    slope: float
    """d accuracy / d logit at the task's accuracy: converts points to logits."""

    def scaled(self, points: float) -> float:
        return points / 100 / self.slope


def _logit(p):
    p = np.clip(p, 0.02, 0.98)
    return np.log(p / (1 - p))


def estimate(results: Path, task: str, run_points: float) -> Components:
    """Components of `task` from a report's results.parquet (per-unit scores of several cells, ten calculations
    each), by moments on the accuracy scale, converted to logits at the task's accuracy (delta method)."""
    import pandas as pd

    df = pd.read_parquet(results)
    df = df[(df["ft_task"] == task) & df["unit_keys"].notna()]
    keys = list(dict.fromkeys(k for ks in df["unit_keys"] for k in ks))
    idx = {k: i for i, k in enumerate(keys)}
    U = len(keys)
    counts = np.zeros(U)
    fold_of = np.full(U, -1)
    cells = {}
    for col, sub in df.groupby("col"):
        Y = np.full((FOLDS, SEEDS, U), np.nan)
        for _, r in sub.iterrows():
            ii = [idx[k] for k in r["unit_keys"]]
            n = np.asarray(r["unit_count"], float)
            counts[ii] = n
            Y[int(r["ft_fold"]), int(r["ft_seed"]), ii] = np.asarray(r["unit_correct"], float) / n
            fold_of[ii] = int(r["ft_fold"])
        cells[col] = Y
    nested = all(np.isnan(Y[:, 0]).sum(0).max() == FOLDS - 1 for Y in cells.values())
    p_unit = np.nanmean(np.stack(list(cells.values())), axis=(0, 1, 2))
    slope = float(np.average(p_unit * (1 - p_unit), weights=counts))
    v_bin = float(np.average(p_unit * (1 - p_unit) / counts, weights=counts))
    seed_unit, fold_unit, fold_shift, seed_shift, model_unit = [], [], [], [], []
    for Y in cells.values():
        d = Y[:, 0] - Y[:, 1]                                    # seed difference per fold and unit
        d = d - np.nanmean(d, axis=1, keepdims=True)             # less the fold's seed shift
        seed_unit.append(np.nanmean(d ** 2) / 2 - v_bin)
        acc = np.array([[np.nansum(Y[f, k] * counts) / np.sum(counts[~np.isnan(Y[f, k])]) for k in range(SEEDS)]
                        for f in range(FOLDS)])
        seed_shift.append(np.var(acc[:, 0] - acc[:, 1], ddof=1) / 2)
        fold_shift.append(max(0.0, np.var(acc.mean(1), ddof=1) - seed_shift[-1] / 2))
        if not nested:
            m = Y.mean(1)                                        # F x U, seeds averaged
            resid = m - m.mean(0, keepdims=True) - m.mean(1, keepdims=True) + m.mean()
            fold_unit.append(resid.var() * FOLDS / (FOLDS - 1) - (seed_unit[-1] + v_bin) / 2)
    within = max(0.0, float(np.mean(seed_unit)))
    fu = max(0.0, float(np.mean(fold_unit))) if fold_unit else 0.0
    cols = list(cells)
    for i in range(len(cols)):
        for j in range(i + 1, len(cols)):
            a, b = cells[cols[i]], cells[cols[j]]
            du = np.nanmean(a - b, axis=(0, 1))
            reps = 1 if nested else FOLDS
            noise = 2 * (fu / reps + (within + v_bin) / (SEEDS * reps))
            model_unit.append((np.var(du, ddof=1) - noise) / 2)
    mu = max(0.0, float(np.mean(model_unit)))
    if nested:  # the fold x unit term is not identified apart from model x unit: split evenly
        mu, fu = mu / 2, mu / 2
    total_shift = float(np.mean(fold_shift) + np.mean(seed_shift))
    return Components(task=task, design="nested" if nested else "crossed", counts=tuple(int(c) for c in counts),
                      base=tuple(float(x) for x in _logit(p_unit)), fold_of=tuple(int(f) for f in fold_of),
                      sd_model_unit=math.sqrt(mu) / slope, sd_fold_unit=math.sqrt(fu) / slope,
                      sd_seed_unit=math.sqrt(within) / slope,
                      fold_share=float(np.mean(fold_shift) / total_shift) if total_shift > 0 else 0.5,
                      shift_points=100 * math.sqrt(total_shift), run_points=run_points, slope=slope)


# ---------------------------------------------------------------- simulated studies


@dataclass(frozen=True)
class Scenario:
    task: str
    shift_points: float
    runs: int
    effect_points: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.task.upper()} shift {self.shift_points:g} pts, {self.runs} run{'s' if self.runs > 1 else ''}"


def _logits(c: Components, sc: Scenario, delta: float, rng, units: np.ndarray | None = None) -> np.ndarray:
    """Logits [recipe, run, fold, seed, unit] of one simulated study (`units`: indices of the units drawn)."""
    base = np.asarray(c.base)[units] if units is not None else np.asarray(c.base)
    U, R = len(base), sc.runs
    shift = c.scaled(sc.shift_points)
    sd_fold, sd_seed = shift * math.sqrt(c.fold_share), shift * math.sqrt(1 - c.fold_share)
    out = np.empty((2, R, FOLDS, SEEDS, U))
    shared_fold = rng.normal(0, sd_fold, (1, 1, FOLDS, 1, 1))  # the same sample for both recipes
    for m in range(2):
        run = rng.normal(0, c.scaled(c.run_points), (R, 1, 1, 1)) if R > 1 else np.zeros((R, 1, 1, 1))
        model_unit = rng.normal(0, c.sd_model_unit, (R, 1, 1, U))
        fold = rng.normal(0, sd_fold, (R, FOLDS, 1, 1))
        seed = rng.normal(0, sd_seed, (R, FOLDS, SEEDS, 1))
        fold_unit = rng.normal(0, c.sd_fold_unit, (R, FOLDS, 1, U))
        seed_unit = rng.normal(0, c.sd_seed_unit, (R, FOLDS, SEEDS, U))
        out[m] = base + (delta if m == 0 else 0.0) + run + model_unit + fold + seed + fold_unit + seed_unit
    return out + shared_fold


def true_difference(c: Components, sc: Scenario, delta: float, n_units: int = 400_000, seed: int = 99) -> float:
    """The population difference (count-weighted accuracy of A minus B) at logit effect `delta`: units drawn from the
    report's units, every random effect drawn afresh per unit (its population average)."""
    if delta == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    u = rng.integers(0, len(c.base), n_units)
    shift = c.scaled(sc.shift_points)
    # Each recipe's own effects (`_logits`), and the sample's shift both share.
    sd = math.sqrt(c.scaled(c.run_points) ** 2 * (sc.runs > 1) + c.sd_model_unit ** 2 + shift ** 2
                   + c.sd_fold_unit ** 2 + c.sd_seed_unit ** 2)
    shared = rng.normal(0, shift * math.sqrt(c.fold_share), n_units)
    base = np.asarray(c.base)[u] + shared
    n = np.asarray(c.counts, float)[u]
    z = rng.normal(0, sd, (2, n_units))
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    return float(np.sum(n * (sig(base + delta + z[0]) - sig(base + z[1]))) / np.sum(n))


def effect_logit(c: Components, sc: Scenario) -> tuple[float, float]:
    """(logit effect, its population difference) giving `sc.effect_points` points, by bisection."""
    if not sc.effect_points:
        return 0.0, 0.0
    lo, hi = 0.0, 3.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if 100 * true_difference(c, sc, mid) < sc.effect_points:
            lo = mid
        else:
            hi = mid
    delta = (lo + hi) / 2
    return delta, true_difference(c, sc, delta)


def _draw(c: Components, sc: Scenario, delta: float, rng):
    """One simulated study: correct counts [recipe, run, fold, seed, unit] (units outside a nested fold: nan)."""
    lg = _logits(c, sc, delta, rng)
    n = np.asarray(c.counts, float)
    counts = rng.binomial(np.broadcast_to(n, lg.shape).astype(int), 1 / (1 + np.exp(-lg))).astype(float)
    if c.design == "nested":
        fold_of = np.asarray(c.fold_of)
        mask = fold_of[None, :] == np.arange(FOLDS)[:, None]           # fold x unit
        counts = np.where(mask[None, None, :, None, :], counts, np.nan)
    return counts, n


def _cells(counts, n, design):
    """Per (replicate, unit) paired arrays for the report's decision: seeds averaged, and with several runs the
    runs are the replicates (their folds averaged)."""
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


def decide_new(counts, n, design) -> tuple[bool, float, float]:
    reps, units, ca, cb, nn = _cells(counts, n, design)
    ev = paired_test(reps, units, ca, nn, cb, nn)
    return ev.p < ALPHA, ev.ci_low, ev.ci_high


def decide_fold_t(counts, n, design) -> tuple[bool, float, float]:
    """Paired t over the seed-averaged (run, fold) accuracies."""
    w = np.where(np.isnan(counts), 0.0, 1.0) * n
    acc = np.nansum(counts, axis=-1) / w.sum(-1)                        # recipe x run x fold x seed
    d = (acc[0] - acc[1]).mean(-1).ravel()
    t = sps.ttest_1samp(d, 0.0)
    ci = t.confidence_interval(0.95)
    return t.pvalue < ALPHA, ci.low, ci.high


def decide_old(counts, n, design, rng, resamples: int = 1999) -> tuple[bool, float, float]:
    """Before issue #55: with one run, units resampled with their folds and seeds averaged (permutation p, percentile
    bootstrap); with several, a t-test over the runs' mean fold-level differences."""
    R = counts.shape[1]
    if R > 1:
        w = np.where(np.isnan(counts), 0.0, 1.0) * n
        acc = np.nansum(counts, axis=-1) / w.sum(-1)
        d = (acc[0] - acc[1]).mean((-1, -2))
        t = sps.ttest_1samp(d, 0.0)
        ci = t.confidence_interval(0.95)
        return t.pvalue < ALPHA, ci.low, ci.high
    a, b = np.nanmean(counts[0, 0].mean(1), 0), np.nanmean(counts[1, 0].mean(1), 0)   # per unit, folds averaged
    d = a - b
    total = n.sum()
    obs = d.sum() / total
    signs = rng.choice((-1.0, 1.0), (resamples, len(d)))
    null = (signs * d).sum(1) / total
    # scipy's random-permutation p (the observed statistic counts as one of the resamples)
    p = min(1.0, 2 * min(((null >= obs).sum() + 1) / (resamples + 1), ((null <= obs).sum() + 1) / (resamples + 1)))
    idx = rng.integers(0, len(d), (resamples, len(d)))
    boot = d[idx].sum(1) / n[idx].sum(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return p < ALPHA, lo, hi


def decide_two_way_boot(counts, n, design, rng, resamples: int = 499) -> tuple[bool, float, float]:
    """Percentile bootstrap over replicates and units (crossed: independently; nested: units within replicates)."""
    reps, units, ca, cb, nn = _cells(counts, n, design)
    R, U = reps.max() + 1, units.max() + 1
    if design == "crossed" or counts.shape[1] > 1:
        A = np.zeros((R, U)); B = np.zeros((R, U))
        A[reps, units], B[reps, units] = ca, cb
        ri = rng.integers(0, R, (resamples, R))
        ui = rng.integers(0, U, (resamples, U))
        num = np.array([(A[ri[i]][:, ui[i]] - B[ri[i]][:, ui[i]]).sum() for i in range(resamples)])
        den = n[ui].sum(1) * R
        stats = num / den
    else:
        by_rep = [np.flatnonzero(reps == r) for r in range(R)]
        stats = np.empty(resamples)
        for i in range(resamples):
            picked = [by_rep[r][rng.integers(0, len(by_rep[r]), len(by_rep[r]))] for r in rng.integers(0, R, R)]
            j = np.concatenate(picked)
            stats[i] = (ca[j] - cb[j]).sum() / nn[j].sum()
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return not (lo <= 0 <= hi), lo, hi


ARMS = {"new": decide_new, "fold t": decide_fold_t, "old units": decide_old, "two-way boot": decide_two_way_boot}
NEEDS_RNG = {"old units", "two-way boot"}


def run_scenario(c: Components, sc: Scenario, sims: int, seed: int = 0, arms=tuple(ARMS)) -> dict:
    """Rejection rate and interval coverage of each arm over `sims` simulated studies of `sc`."""
    delta, truth = effect_logit(c, sc)
    rng = np.random.default_rng(seed)
    hits = {a: 0 for a in arms}
    covered = {a: 0 for a in arms}
    for _ in range(sims):
        counts, n = _draw(c, sc, delta, rng)
        for a in arms:
            fn = ARMS[a]
            rejected, lo, hi = fn(counts, n, c.design, rng) if a in NEEDS_RNG else fn(counts, n, c.design)
            hits[a] += bool(rejected)
            covered[a] += bool(lo <= truth <= hi)
    out = {"scenario": sc.label, "task": sc.task, "shift_points": sc.shift_points, "runs": sc.runs,
           "effect_points": sc.effect_points, "truth_points": round(100 * truth, 3), "sims": sims, "arms": {}}
    for a in arms:
        rate = hits[a] / sims
        lo, hi = clopper_pearson(hits[a], sims)
        out["arms"][a] = {"rate": round(rate, 4), "rate_low": round(lo, 4), "rate_high": round(hi, 4),
                          "coverage": round(covered[a] / sims, 4)}
    return out


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval of a binomial rate (its upper end is the "Monte-Carlo upper 95% bound")."""
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(sps.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


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
    lines = ["| scenario | effect (truth, pts) | " + " | ".join(
        f"{a}: rate [95% MC] / coverage" for a in arms) + " |", "|---|---|" + "---|" * len(arms)]
    for e in entries:
        cells = []
        for a in arms:
            r = e["arms"][a]
            cells.append(f"{100 * r['rate']:.1f}% [{100 * r['rate_low']:.1f}, {100 * r['rate_high']:.1f}] / "
                         f"{100 * r['coverage']:.1f}%")
        eff = "null" if not e["effect_points"] else f"+{e['effect_points']:g} ({e['truth_points']:+.2f})"
        lines.append(f"| {e['scenario']} | {eff} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                    help="a report's results.parquet to estimate the variance components from")
    ap.add_argument("--sims", type=int, default=1000, help="simulated studies per scenario (default 1000)")
    ap.add_argument("--quick", action="store_true", help="two finetuning shifts only (0.5 and 3 points)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"decisions to compare (default all: {', '.join(ARMS)})")
    ap.add_argument("--run-points", type=float, nargs=2, default=(0.4, 1.0), metavar=("CT", "AD"),
                    help="a pretraining run's shift sd in points, CT and AD (default 0.4 and 1.0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "calibration.json")
    ap.add_argument("--real", action="store_true", help="A/A on real FEL calculations instead (see real_aa.py)")
    args, rest = ap.parse_known_args(argv)
    if args.real:
        import real_aa

        return real_aa.main(rest)
    if rest:
        ap.error(f"unrecognised arguments: {' '.join(rest)}")
    arms = tuple(a.strip() for a in args.arms.split(","))
    command = "python benchmarks/calibration.py " + " ".join(argv if argv is not None else sys.argv[1:])
    comps = {t: estimate(args.results, t, p) for t, p in zip(("ct", "ad"), args.run_points)}
    for c in comps.values():
        print(f"[calibration] {c.task}: {c.design}, {len(c.counts)} units, slope {c.slope:.3f}; logit sds: model x unit "
              f"{c.sd_model_unit:.3f}, fold x unit {c.sd_fold_unit:.3f}, seed x unit {c.sd_seed_unit:.3f}; real "
              f"finetuning shift {c.shift_points:.2f} points (fold share {c.fold_share:.2f})", flush=True)
    entries = []
    t0 = time.time()
    for i, sc in enumerate(scenarios(args.quick)):
        entries.append(run_scenario(comps[sc.task], sc, args.sims, seed=args.seed + i, arms=arms))
        print(table(entries[-1:], arms)[-1], f"({time.time() - t0:.0f}s)", flush=True)
    print("\n".join(table(entries, arms)))
    entry = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": machine_info.machine("numpy", "scipy"), "results": str(args.results.name),
             "components": {t: {k: v for k, v in dataclasses.asdict(c).items() if k not in ("counts", "base", "fold_of")}
                            for t, c in comps.items()},
             "scenarios": entries, "seconds": round(time.time() - t0)}
    machine_info.record(args.out, entry)
    print(f"[calibration] written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

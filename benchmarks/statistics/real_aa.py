"""The null control on real FEL calculations: how often does the report's decision call a difference between two
columns that are the same pretrained model finetuned with other seeds (A/A)?

It runs `studies/null_control.py` with `--columns` seed columns (column k: finetuning seeds 2k and 2k+1, the
protocol's five folds, every task; real Ray Tune trials, real per-unit scores), then decides every pair of columns
with the report's own decision (`significance.against_model`) on every metric the report tests (accuracy at the
best-perplexity epoch, best accuracy, each extra test set). Disjoint pairs (columns 0-1, 2-3, ...) are independent
A/A studies: the share of them with a rejection (and of their tasks) gets an exact (Clopper-Pearson) interval; their
tests share calculations and are not independent. Every pair (dependent, sharing columns) gives a
steadier point estimate. Beside it, the decisions the report used before (units resampled with folds averaged) and
a paired t over the fold means, on the same pairs.

    python benchmarks/statistics/calibration.py --real --storage alignlab-storage --preset mini --columns 24

The model is the preset's all-objective model: at the storage root of README command 1 it is already trained.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from rates import ALPHA, RESULTS, clopper_pearson, commit_of

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.report.columns import extra_test_sets
from alignlab.platform.report.significance import against_model
from alignlab.platform.report.unit_statistics import unit_columns, unit_table

REPO = Path(__file__).resolve().parents[2]


def old_units_p(a: pd.DataFrame, b: pd.DataFrame, metric: str, rng, resamples: int = 1999) -> float:
    """The decision before issue #55: per unit, folds and seeds averaged; a paired sign-flip permutation test."""
    ta, tb = (unit_table(x, unit_columns(metric), ["ft_fold"]).groupby(level="unit").mean() for x in (a, b))
    j = ta.join(tb, lsuffix="_a", rsuffix="_b", how="inner")
    d = (j["correct_a"] - j["correct_b"]).to_numpy()
    obs = d.sum()
    null = (rng.choice((-1.0, 1.0), (resamples, len(d))) * d).sum(1)
    return min(1.0, 2 * min(((null >= obs).sum() + 1) / (resamples + 1), ((null <= obs).sum() + 1) / (resamples + 1)))


def fold_t_p(a: pd.DataFrame, b: pd.DataFrame, metric: str) -> float:
    x, y = a.groupby("ft_fold")[metric].mean(), b.groupby("ft_fold")[metric].mean()
    d = (x - y).dropna().to_numpy()
    return float(sps.ttest_1samp(d, 0.0).pvalue) if np.ptp(d) > 0 else 1.0


def decide_pairs(df: pd.DataFrame, pairs, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for row in dict.fromkeys(df["row"]):
        rows = df[df["row"] == row]
        metrics = ["accuracy", "best_accuracy"] + [f"eval_{n}_accuracy" for n in extra_test_sets(rows)
                                                   if rows[f"eval_{n}_accuracy"].notna().any()]
        for ca, cb in pairs:
            a, b = rows[rows["col"] == ca], rows[rows["col"] == cb]
            for m in metrics:
                ev = against_model(a, b, m)
                out.append({"row": row, "pair": f"{ca}-{cb}", "metric": m, "diff": ev.diff, "p": ev.p,
                            "design": ev.design, "new": bool(ev.p < ALPHA),
                            "old units": bool(old_units_p(a, b, m, rng) < ALPHA), "fold t": bool(fold_t_p(a, b, m) < ALPHA)})
    return out


def summarise(decisions: list[dict], label: str) -> dict:
    res = {"tests": len(decisions)}
    for arm in ("new", "old units", "fold t"):
        k = sum(d[arm] for d in decisions)
        lo, hi = clopper_pearson(k, len(decisions)) if decisions else (float("nan"),) * 2
        res[arm] = {"rejections": k, "rate": round(k / max(1, len(decisions)), 4), "rate_low": round(lo, 4),
                    "rate_high": round(hi, 4)}
    print(f"[real A/A] {label}: {len(decisions)} tests; " + "; ".join(
        f"{arm} {res[arm]['rejections']} ({100 * res[arm]['rate']:.1f}%, 95% [{100 * res[arm]['rate_low']:.1f}, "
        f"{100 * res[arm]['rate_high']:.1f}])" for arm in ("new", "old units", "fold t")), flush=True)
    return res


def summarise_studies(decisions: list[dict], keys: tuple[str, ...], label: str) -> dict:
    """The rate of independent units (`keys`: ("pair",), a disjoint pair = one A/A study; ("pair", "row"), one of
    its tasks) with at least one rejection among their tests, with an exact interval: a study's tests share its
    calculations, so counting them as independent narrows the interval falsely."""
    groups: dict[tuple, list[dict]] = {}
    for d in decisions:
        groups.setdefault(tuple(d[k] for k in keys), []).append(d)
    res = {"units": len(groups), "per": "+".join(keys)}
    for arm in ("new", "old units", "fold t"):
        k = sum(any(d[arm] for d in g) for g in groups.values())
        lo, hi = clopper_pearson(k, len(groups)) if groups else (float("nan"),) * 2
        res[arm] = {"with_any": k, "rate": round(k / max(1, len(groups)), 4), "rate_low": round(lo, 4),
                    "rate_high": round(hi, 4)}
    print(f"[real A/A] {label}: {len(groups)} independent units; " + "; ".join(
        f"{arm} {res[arm]['with_any']} with a rejection (95% [{100 * res[arm]['rate_low']:.1f}, "
        f"{100 * res[arm]['rate_high']:.1f}])" for arm in ("new", "old units", "fold t")), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", required=True, help="storage root (README command 1's, to reuse its model)")
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--columns", type=int, default=24, help="seed columns (even; 2 seeds each; default 24)")
    ap.add_argument("--max-concurrent", type=int, default=None)
    bench_args.add_flags(ap, out=RESULTS / "calibration_real.json")
    args = ap.parse_args(argv)
    if args.columns < 2 or args.columns % 2:
        ap.error("--columns must be an even number >= 2")
    sys.path.insert(0, str(REPO / "studies"))
    import null_control

    from alignlab.platform.storage.root import resolve_root
    from alignlab.platform.study.run import run_study

    cols = {f"s{k}": (2 * k, 2 * k + 1) for k in range(args.columns)}
    study = null_control.build(args.preset, columns=cols)
    study = dataclasses.replace(study, name=f"{study.name}-{args.columns}columns")
    t0 = time.time()
    report = run_study(study, resolve_root(args.storage), max_concurrent=args.max_concurrent)
    df = pd.read_parquet(report.parent / "results.parquet")
    names = list(cols)
    disjoint = [(names[i], names[i + 1]) for i in range(0, len(names), 2)]
    every = list(itertools.combinations(names, 2))
    d_dis = decide_pairs(df, disjoint)
    d_all = decide_pairs(df, every)
    entry = {"command": "python benchmarks/statistics/calibration.py --real " + " ".join(argv if argv is not None else sys.argv[2:]),
             "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": "%s%s" % commit_of(),
             "machine": machine_info.machine("torch", "ray"),
             "study": study.name, "calculations": len(df), "seconds": round(time.time() - t0),
             "disjoint_pairs": summarise(d_dis, f"{len(disjoint)} disjoint pairs (tests, not independent)"),
             "independent_studies": summarise_studies(d_dis, ("pair",), "disjoint pairs as studies"),
             "independent_tasks": summarise_studies(d_dis, ("pair", "row"), "disjoint pairs' tasks"),
             "all_pairs": summarise(d_all, f"all {len(every)} pairs (dependent)"),
             "by_row_and_metric": {f"{r} {m}": summarise([d for d in d_all if d["row"] == r and d["metric"] == m],
                                                        f"{r} {m}, all pairs")
                                   for r, m in dict.fromkeys((d["row"], d["metric"]) for d in d_all)}}
    machine_info.record(args.out, entry)
    print(f"[real A/A] written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

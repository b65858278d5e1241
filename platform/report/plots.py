"""The PNG plots of a study report (report.py writes the tables; columns.py reads the baselines and test sets): the effect plot the report leads with (each
cell's difference from its baseline with its 95% interval, beside the baselines), accuracy bars per condition,
accuracy against the data budget, and the other kinds a study asks for in `study["plots"]`."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from alignlab.platform.report.columns import extra_test_sets, strongest_baseline


def plots(sdir: Path, df: pd.DataFrame, study: dict) -> list[Path]:
    """The study's PNG plots (`study["plots"]`: bars, budget, ...) under sdir/plots; the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pdir = sdir / "plots"
    pdir.mkdir(exist_ok=True)
    made = []
    kinds = study.get("plots") or ["bars"]
    if "bars" in kinds:
        made.append(_bars(df, "accuracy", "", pdir / "accuracy_by_condition.png"))
    for name in extra_test_sets(df):  # every extra test set gets its bars, with its own baselines
        made.append(_bars(df[df[f"eval_{name}_accuracy"].notna()], f"eval_{name}_accuracy", f"eval_{name}_",
                          pdir / f"accuracy_{name}_by_condition.png", title=f"test set: {name}"))
    groups = list(dict.fromkeys(df["group"] if "group" in df else df["row"]))
    gcol = "group" if "group" in df else "row"
    if "budget" in kinds and "ft_budget" in df:
        # One panel per group (task); a line per column (model), across the group's rows (budgets).
        fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.5), squeeze=False)
        for ax, g in zip(axes[0], groups):
            for c, sub in df[df[gcol] == g].groupby("col", sort=False):
                m = sub.groupby("ft_budget")["accuracy"]
                ax.errorbar(m.mean().index, 100 * m.mean(), yerr=100 * m.std(ddof=1).fillna(0), label=c, capsize=3,
                            marker="o")
            b = df[df[gcol] == g].groupby("ft_budget")["baseline_best"].mean()
            ax.plot(b.index, 100 * b, "k--", label="strongest context-free baseline")
            if df["ft_budget"].max() > 10 * df["ft_budget"].min():
                ax.set_xscale("log")
            ax.set_title(g)
            ax.set_xlabel("finetuning examples (n)")
            ax.set_ylabel("accuracy % (best-perplexity epoch)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(save_figure(fig, pdir / "accuracy_vs_budget.png"))
    if "by_size" in kinds:
        # One panel per group (task): accuracy along the columns (depths, then the heads-discarded column),
        # one line per row (width, and the model pretrained without the aligned objective).
        fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.5), squeeze=False)
        cols = list(dict.fromkeys(df["col"]))
        for ax, g in zip(axes[0], groups):
            sub_g = df[df[gcol] == g]
            for r in dict.fromkeys(sub_g["row"]):
                xs, ms, sds = [], [], []
                for j, c in enumerate(cols):
                    acc = sub_g[(sub_g["row"] == r) & (sub_g["col"] == c)]["accuracy"]
                    if len(acc):
                        xs.append(j)
                        ms.append(100 * acc.mean())
                        sds.append(100 * acc.std(ddof=1) if len(acc) > 1 else 0.0)
                ax.errorbar(xs, ms, yerr=sds, label=r, capsize=3, marker="o")
            ax.axhline(100 * strongest_baseline(sub_g)[1], color="k", ls="--", label="strongest context-free baseline")
            ax.set_xticks(range(len(cols)), cols)
            ax.set_title(g)
            ax.set_xlabel("layers (* = pretrained heads discarded)")
            ax.set_ylabel("accuracy % (best-perplexity epoch)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(save_figure(fig, pdir / "accuracy_by_model_size.png"))
    return made


EFFECT_CAPTION = ("Every test of the report, one panel per row and metric or test set: each compared cell's difference from "
                  "its row's baseline model (circles) and from the row's strongest context-free baseline on the same "
                  "calculations (squares), in accuracy points, with its Holm-consistent interval (the report's decision "
                  "over finetuning samples, seeds and test units, at the level of its Holm step in its family; "
                  "docs/statistics.md); diamonds: a pretrained cell against the untrained model. Filled: significantly "
                  "above its reference, which is where the interval's lower end clears 0; for a claim, both of its "
                  "marks are filled exactly when it is bold, and its lines are labelled (claim). The line at 0 is "
                  "the reference.")


def effect_plot(pdir: Path, comparisons: list) -> Path:
    """`effects.png`: one panel per metric of `comparisons` (`significance.Comparison`), one line per test: its
    difference with its Holm-consistent interval, filled where it is significant, so the bold rule can be read off
    the plot."""
    pdir.mkdir(parents=True, exist_ok=True)
    return save_figure(effect_figure(comparisons), pdir / "effects.png")


def effect_figure(comparisons: list):
    """The effect plot's figure (`effect_plot`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from alignlab.platform.report.significance import CLAIM, FLOOR, MODEL

    panels: dict[str, list] = {}
    for c in comparisons:
        # One panel per metric and row: a row's differences keep their own scale (CT's tenths of a point beside
        # AD's 25 points below a span matcher would vanish on a shared axis).
        title = f"{c.row}: {c.metric}" if c.kind in (MODEL, FLOOR) else f"{c.row}: against the untrained model"
        panels.setdefault(title, []).append(c)
    height = max(len(c) for c in panels.values())
    ncols = min(3, len(panels))  # wrapped, so a report with many extra test sets stays readable
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, (1.6 + 0.4 * height) * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, tests) in zip(axes.flat, panels.items()):
        labels = []
        for y, cmp in enumerate(tests):
            marker, color = {MODEL: ("o", "C0"), FLOOR: ("s", "C1")}.get(cmp.kind, ("D", "C2"))
            labels.append(f"{cmp.col} − {cmp.against}" + (" (claim)" if cmp.family == CLAIM else ""))
            if math.isnan(cmp.diff):
                continue
            diff = 100 * cmp.diff
            lo, hi = cmp.interval
            err = [[diff - 100 * lo], [100 * hi - diff]] if not math.isnan(lo) else None
            ax.errorbar([diff], [y], xerr=err, fmt=marker, color=color, mfc=color if cmp.significant else "white",
                        capsize=3, label=f"{cmp.metric}|{cmp.row}|{cmp.col}|{cmp.kind}")
        ax.axvline(0.0, color="k", lw=1)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("difference (accuracy points)")
        ax.set_title(title)
    fig.tight_layout()
    return fig


def _bars(df: pd.DataFrame, acc: str, prefix: str, path: Path, title: str = "") -> Path:
    """Accuracy per row and column with error bars, and each row's strongest context-free baseline."""
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys(df["row"]))
    cols = list(dict.fromkeys(df["col"]))
    fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(rows) * len(cols) / 2, 3.5))
    w = 0.8 / len(cols)
    for j, c in enumerate(cols):
        means = [100 * df[(df.row == r) & (df.col == c)][acc].mean() for r in rows]
        sds = [100 * df[(df.row == r) & (df.col == c)][acc].std(ddof=1) for r in rows]
        ax.bar(np.arange(len(rows)) + j * w, means, w, yerr=np.nan_to_num(sds), capsize=3, label=c)
    base = [100 * strongest_baseline(df[df.row == r], prefix)[1] for r in rows]
    ax.scatter(np.arange(len(rows)) + 0.4 - w / 2, base, marker="_", s=400, color="k", zorder=3,
               label="strongest context-free baseline")
    ax.set_xticks(np.arange(len(rows)) + 0.4 - w / 2, rows)
    ax.set_ylabel("accuracy % (best-perplexity epoch)")
    if title:
        ax.set_title(title)
    # Below the axes: inside, the legend can hide a baseline marker near the top.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(cols) + 1)
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write a PNG under a temporary name and rename it: a crash never leaves half a plot."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path

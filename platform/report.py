"""Study reports: results.parquet (one row per calculation), report.md (paper-style tables with
significance against the study's baseline), PNG plots, and pointers to the TensorBoard runs.

Cells read "acc ± std / ppl ± std" (accuracy in %, mean ± one standard deviation over the ten
calculations). A cell is **bold** when its accuracy is significantly higher than the baseline
column's in the same row (Welch's t-test, p < 0.05); the baseline is underlined.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from alignlab.platform.storage import read_json, write_text

P_VALUE = 0.05


def collect_results(sdir: Path) -> pd.DataFrame:
    """Gather the study's finished trial files into results.parquet (temp name, renamed)."""
    study = read_json(sdir / "study.json")
    rows = []
    for cid in study["calculations"]:
        f = sdir / "trials" / f"{cid}.json"
        if f.exists():
            rows.append(read_json(f))
    df = pd.DataFrame(rows)
    tmp = sdir / "results.parquet.tmp"
    df.to_parquet(tmp, index=False)
    os.replace(tmp, sdir / "results.parquet")
    return df


def _fmt(values: pd.Series, scale: float = 1.0, digits: int = 1) -> str:
    v = values.dropna().to_numpy() * scale
    if len(v) == 0:
        return "–"
    sd = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{v.mean():.{digits}f} ± {sd:.{digits}f}"


def welch_better(a: pd.Series, b: pd.Series) -> tuple[bool, float]:
    """Is mean(a) significantly greater than mean(b)? (two-sided Welch's t-test, p < 0.05, and a > b)."""
    a, b = a.dropna().to_numpy(), b.dropna().to_numpy()
    if len(a) < 2 or len(b) < 2 or (a.std() == 0 and b.std() == 0):
        return (len(a) > 0 and len(b) > 0 and a.mean() > b.mean() and a.std() == 0 and b.std() == 0
                and len(a) > 1 and len(b) > 1), float("nan")
    t, p = sps.ttest_ind(a, b, equal_var=False)
    return bool(p < P_VALUE and a.mean() > b.mean()), float(p)


def _table(df: pd.DataFrame, baseline_col: str, acc: str, ppl: str) -> tuple[list[str], dict]:
    cols = list(dict.fromkeys(df["col"]))
    rows = list(dict.fromkeys(df["row"]))
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    pvals = {}
    for r in rows:
        cells = []
        base = df[(df["row"] == r) & (df["col"] == baseline_col)]
        for c in cols:
            sub = df[(df["row"] == r) & (df["col"] == c)]
            if sub.empty:
                cells.append("/")
                continue
            text = f"{_fmt(sub[acc], 100)} / {_fmt(sub[ppl], 1, 2)} (n={len(sub)})"
            if c == baseline_col:
                text = f"<u>{text}</u>"
            elif not base.empty:
                better, p = welch_better(sub[acc], base[acc])
                pvals[(r, c)] = p
                if better:
                    text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return lines, pvals


def write_report(sdir: Path) -> Path:
    sdir = Path(sdir)
    study = read_json(sdir / "study.json")
    df = pd.read_parquet(sdir / "results.parquet")
    base = study["baseline_col"]
    modes = sorted(df["selection"].unique()) if not df.empty else []
    out = [f"# {study['title']}", "", f"Study `{study['name']}` — {len(df)} of {len(study['calculations'])} "
           f"calculations finished.", "",
           f"**Selection mode: {', '.join(modes) or '–'}** "
           "(`honest`: epochs selected on a validation split carved from the training budget, test set touched "
           "once per selected epoch; `paper`: epochs selected on the test set, as in the paper — for reproduction only).",
           "", f"Cells: accuracy % ± std / perplexity ± std over the calculations (n). Baseline: <u>{base}</u>. "
           f"**Bold**: accuracy significantly above the baseline in the same row (Welch's t-test, p < {P_VALUE}).", ""]
    if study.get("notes"):
        out += [study["notes"], ""]
    if df.empty:
        out.append("No finished calculations yet.")
    else:
        out += ["## Accuracy at the best-perplexity epoch", ""]
        lines, pvals = _table(df, base, "accuracy", "perplexity")
        out += lines + [""]
        out += ["## Best accuracy (and its perplexity)", ""]
        out += _table(df, base, "best_accuracy", "perplexity_at_best_accuracy")[0] + [""]
        out += ["## Epochs to convergence (epoch of the best selection perplexity)", "",
                "| | " + " | ".join(dict.fromkeys(df["col"])) + " |", "|---|" + "---|" * df["col"].nunique()]
        for r in dict.fromkeys(df["row"]):
            cells = [_fmt(df[(df["row"] == r) & (df["col"] == c)]["epochs"].astype(float), 1, 1)
                     for c in dict.fromkeys(df["col"])]
            out.append(f"| {r} | " + " | ".join(cells) + " |")
        out += ["", "## Context-free baselines on the same splits", "",
                "An effect only counts when it beats these: majority class, and a model that never sees the context "
                "(AD: logistic regression on the acronym's letters; CT: each word's most frequent training tag).", "",
                "| | majority | context-free |", "|---|---|---|"]
        for r in dict.fromkeys(df["row"]):
            sub = df[df["row"] == r]
            out.append(f"| {r} | {_fmt(sub['baseline_majority'], 100)} | {_fmt(sub['baseline_context_free'], 100)} |")
        if pvals:
            out += ["", "Welch p-values against the baseline: " + ", ".join(
                f"{r}/{c}: {p:.3g}" for (r, c), p in pvals.items() if not math.isnan(p))]
    out += ["", "## Pretrained models", "", "Held-out evaluation of each pretrained model (accuracy % / perplexity).", ""]
    out += _pretrain_table(study)
    plots = _plots(sdir, df, study) if not df.empty else []
    if plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    out += ["", "## Files", "", "- `results.parquet`: one row per calculation (config, metrics, baselines, timings, node).",
            f"- TensorBoard: `tensorboard --logdir {sdir}` (one run per calculation with hparams, plus the "
            "pretraining runs under each model's folder).", ""]
    path = sdir / "report.md"
    write_text(path, "\n".join(out))
    return path


def _pretrain_table(study: dict) -> list[str]:
    models = study.get("models", {})
    root_models = Path(study["corpus_dir"]).parent.parent / "models"
    metrics = ["mlm", "nsp", "whp", "pad"]
    lines = ["| model | objectives | steps | " + " | ".join(m.upper() for m in metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for key, info in models.items():
        ev_file = root_models / info["model_id"] / "final" / "eval.json"
        ev = read_json(ev_file) if ev_file.exists() else {}
        objs = "+".join(o["name"] for o in info["pretrain"]["objectives"])
        cells = []
        for m in metrics:
            a, p = ev.get(f"eval/{m}/accuracy"), ev.get(f"eval/{m}/perplexity")
            cells.append(f"{100 * a:.1f} / {p:.2f}" if a is not None and not math.isnan(a) else "/")
        lines.append(f"| {key} | {objs} | {ev.get('step', '?')} | " + " | ".join(cells) + " |")
    return lines


def _plots(sdir: Path, df: pd.DataFrame, study: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pdir = sdir / "plots"
    pdir.mkdir(exist_ok=True)
    made = []
    kinds = study.get("plots") or ["bars"]
    if "bars" in kinds:
        rows = list(dict.fromkeys(df["row"]))
        cols = list(dict.fromkeys(df["col"]))
        fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(rows) * len(cols) / 2, 3.5))
        w = 0.8 / len(cols)
        for j, c in enumerate(cols):
            means = [100 * df[(df.row == r) & (df.col == c)]["accuracy"].mean() for r in rows]
            sds = [100 * df[(df.row == r) & (df.col == c)]["accuracy"].std(ddof=1) for r in rows]
            ax.bar(np.arange(len(rows)) + j * w, means, w, yerr=np.nan_to_num(sds), capsize=3, label=c)
        base = [100 * df[df.row == r]["baseline_context_free"].mean() for r in rows]
        ax.scatter(np.arange(len(rows)) + 0.4 - w / 2, base, marker="_", s=400, color="k", label="context-free baseline")
        ax.set_xticks(np.arange(len(rows)) + 0.4 - w / 2, rows)
        ax.set_ylabel("accuracy % (best-perplexity epoch)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, pdir / "accuracy_by_condition.png"))
    if "budget" in kinds and "ft_budget" in df:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for (r, c), sub in df.groupby(["row", "col"], sort=False):
            g = sub.groupby("ft_budget")["accuracy"]
            ax.errorbar(g.mean().index, 100 * g.mean(), yerr=100 * g.std(ddof=1).fillna(0), label=f"{r} {c}", capsize=3)
        ax.set_xlabel("finetuning examples (n)")
        ax.set_ylabel("accuracy %")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, pdir / "accuracy_vs_budget.png"))
    return made


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path

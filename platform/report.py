"""Study reports: results.parquet (one row per calculation), report.md (paper-style tables with
significance against the study's baseline), PNG plots, and pointers to the TensorBoard runs.

Cells read "acc ± std / ppl ± std" (accuracy in %, mean ± one standard deviation over the ten
calculations). A cell is **bold** when its accuracy is significantly higher than its baseline's
(Welch's t-test, p < 0.05); the baseline is underlined. The baseline is the study's baseline column
in the same row, or -- when the study names baseline cells (the paper's Tables 1-2) -- the one
baseline cell of the row's group (e.g. its task). Searches (Optuna) get a section of their own.
"""
from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from alignlab.platform.storage import read_json, write_text

P_VALUE = 0.05


def collect_results(sdir: Path) -> pd.DataFrame:
    """Gather the study's finished trial files into results.parquet (temp name, renamed)."""
    study = read_json(sdir / "study.json")
    cells = study.get("cells", {})
    rows = []
    for cid in study["calculations"]:
        f = sdir / "trials" / f"{cid}.json"
        if f.exists():
            row = read_json(f)
            # The study's current labels win over those a trial file was written with.
            row.update(cells.get(cid, {}))
            row.setdefault("group", row["row"])
            rows.append(row)
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
    with warnings.catch_warnings():  # nearly identical samples (tiny smoke models) only lose precision
        warnings.simplefilter("ignore", RuntimeWarning)
        t, p = sps.ttest_ind(a, b, equal_var=False)
    return bool(p < P_VALUE and a.mean() > b.mean()), float(p)


def baseline_of(df: pd.DataFrame, study: dict) -> dict[str, tuple[str, str]]:
    """Each row's baseline cell (row, col): its group's baseline cell, or the baseline column in the same row."""
    group = dict(zip(df["row"], df["group"] if "group" in df else df["row"]))
    cells = [tuple(c) for c in study.get("baseline_cells") or []]
    out = {}
    for r in dict.fromkeys(df["row"]):
        mine = [c for c in cells if group.get(c[0], c[0]) == group[r]]
        out[r] = mine[0] if mine else (r, study["baseline_col"])
    return out


def _table(df: pd.DataFrame, baselines: dict[str, tuple[str, str]], acc: str, ppl: str) -> tuple[list[str], dict]:
    cols = list(dict.fromkeys(df["col"]))
    rows = list(dict.fromkeys(df["row"]))
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    pvals = {}
    base_cells = set(baselines.values())
    for r in rows:
        cells = []
        br, bc = baselines[r]
        base = df[(df["row"] == br) & (df["col"] == bc)]
        for c in cols:
            sub = df[(df["row"] == r) & (df["col"] == c)]
            if sub.empty:
                cells.append("/")
                continue
            text = f"{_fmt(sub[acc], 100)} / {_fmt(sub[ppl], 1, 2)} (n={len(sub)})"
            if (r, c) in base_cells:
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
    baselines = baseline_of(df, study) if not df.empty else {}
    if study.get("baseline_cells"):
        base = ", ".join(f"{c} in row {r}" for r, c in study["baseline_cells"]) + " (each for the rows of its group)"
    else:
        base = f"column {study['baseline_col']}, row by row"
    modes = sorted(df["selection"].unique()) if not df.empty else []
    out = [f"# {study['title']}", "", f"Study `{study['name']}` — {len(df)} of {len(study['calculations'])} "
           f"calculations finished.", "",
           f"**Selection mode: {', '.join(modes) or '–'}** "
           "(`honest`: epochs selected on a validation split carved from the training budget, test set touched "
           "once per selected epoch; `paper`: epochs selected on the test set, as in the paper — for reproduction only).",
           "", f"Cells: accuracy % ± std / perplexity ± std over the calculations (n). Baseline: <u>{base}</u>. "
           f"**Bold**: accuracy significantly above the row's baseline (Welch's t-test, p < {P_VALUE}).", ""]
    if study.get("notes"):
        out += [study["notes"], ""]
    if df.empty:
        out.append("No finished calculations yet.")
    else:
        out += ["## Accuracy at the best-perplexity epoch", ""]
        lines, pvals = _table(df, baselines, "accuracy", "perplexity")
        out += lines + [""]
        out += ["## Best accuracy (and its perplexity)", ""]
        out += _table(df, baselines, "best_accuracy", "perplexity_at_best_accuracy")[0] + [""]
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
    if study.get("searches"):
        out += [""] + _search_section(study["searches"])
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


def _search_section(searches: list[dict]) -> list[str]:
    """Each Optuna search: what it maximized, how its trials ended, the best setting and the top trials."""
    out = ["## Hyperparameter searches (Optuna TPE on Ray Tune)", "",
           "Every search selects in `honest` mode: trials train on one sampled budget and are scored on its "
           "validation split (the test set is never loaded); the objective is validation accuracy at the "
           "best-validation-perplexity epoch. Trials a scheduler stopped early count as *pruned* (Optuna "
           "PRUNED, never COMPLETE), and the best setting is chosen among the trials that ran to their own end. "
           "The best setting was then run as the calculations of its cell in the tables above. Selection is "
           "nested: a search samples only from what the calculations reporting its setting may train on (AD: "
           "one search per test fold, inside the other four folds; CT: the pool, never the test set).", ""]
    for s in searches:
        name = s["name"]
        statuses = [t["status"] for t in s["trials"]]
        counts = ", ".join(f"{statuses.count(k)} {k}" for k in ("complete", "pruned", "error") if k in statuses)
        out += [f"### {name} → cell {s['row']} / {s['col']}", "",
                f"Model `{s['model']}`; {s['num_samples']} trials ({counts}); {s['sampler']}; pruning: "
                f"{s['scheduler']} (grace period {s['grace_period']} epochs); trials sample only from the training "
                f"data of fold {s['search_fold']}, seed {s['search_seed']}; its setting is reported on (fold, seed) "
                f"{', '.join(f'({f}, {sd})' for f, sd in s.get('final_points', []))}.", "",
                "Best: " + ", ".join(f"`{k}={_short(v)}`" for k, v in s["best_params"].items())
                + f" — validation accuracy {100 * s['best_value']:.1f} %.", ""]
        keys = [p["name"] for p in s["space"]]
        ranked = sorted((t for t in s["trials"] if t["status"] != "error"),
                        key=lambda t: (t["status"] == "complete", t.get(s["objective"]) or -1), reverse=True)
        out += ["| " + " | ".join(keys) + " | status | epochs | val acc % |", "|" + "---|" * (len(keys) + 3)]
        for t in ranked[:10]:
            v = t.get(s["objective"])
            out.append("| " + " | ".join(_short(t["params"].get(k)) for k in keys)
                       + f" | {t['status']} | {t.get('epoch', '?')} | {'–' if v is None else f'{100 * v:.1f}'} |")
        out.append("")
    return out


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


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
            if df["ft_budget"].max() > 10 * df["ft_budget"].min():
                ax.set_xscale("log")
            ax.set_title(g)
            ax.set_xlabel("finetuning examples (n)")
            ax.set_ylabel("accuracy % (best-perplexity epoch)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, pdir / "accuracy_vs_budget.png"))
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
            ax.set_xticks(range(len(cols)), cols)
            ax.set_title(g)
            ax.set_xlabel("layers (* = pretrained heads discarded)")
            ax.set_ylabel("accuracy % (best-perplexity epoch)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(_save(fig, pdir / "accuracy_by_model_size.png"))
    return made


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path

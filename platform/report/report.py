"""Study reports: results.parquet (one row per calculation), report.md (paper-style tables with
significance against the study's baseline), PNG plots, and pointers to the TensorBoard runs.

Cells read "acc ± std / ppl ± std" (accuracy in %, mean ± one standard deviation over the ten calculations). Every
compared cell is tested against its row's baseline model and against the row's strongest context-free baseline on
the same test units, and every pretrained cell against the row's untrained cell where the study has one, by one
paired decision over the folds (or pretraining runs) and test units (`unit_statistics`), Holm-corrected in its
family (`significance`: the study's claims, the controls, the secondary and exploratory tests). A cell is **bold**
when it is one of the study's claims and, as one intersection-union test over the claims, above both; the baseline
is underlined. The report opens with its provenance and the effect plot (every test's difference with its interval).
The baseline is the study's baseline column in the same row, or -- when the study names baseline cells (the paper's
Tables 1-2) -- the one baseline cell of the row's group (e.g. its task). Searches (Optuna) get a section of their own.
A task whose test units fall in parts (AD's pair kinds) gets each table again by part, under it (`parts`).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from alignlab.platform.fel.trial_files import read_trial
from alignlab.platform.fel.zero_shot import read_zero_shot
from alignlab.platform.report.columns import baseline_names, extra_test_sets, extra_test_text, strongest_baseline
from alignlab.platform.report.parts import part_comparisons, part_tables
from alignlab.platform.report.plots import EFFECT_CAPTION, effect_plot, plots as make_plots
from alignlab.platform.report.search_importance import importance_lines
from alignlab.platform.report.significance import (CLAIM, CONTROL, FLOOR, MODEL, P_VALUE, PRIMARY, SECONDARY,
                                                   UNTRAINED, Comparison, against_floor, against_model, bold_cells,
                                                   control_section, correct_family, generalises_over, runs_in,
                                                   significance_section)
from alignlab.platform.report.unit_statistics import RUN_KEY, Evidence
from alignlab.platform.runtime.provenance import code_commit, describe_commit
from alignlab.platform.storage.root import read_json, write_text
from alignlab.platform.tasks.task import registered_tasks, task as task_named


def collect_results(sdir: Path) -> pd.DataFrame:
    """Gather the study's finished trial files into results.parquet (temp name, renamed)."""
    study = read_json(sdir / "study.json")
    cells = study.get("cells", {})
    rows = []
    for cid in study["calculations"]:
        f = sdir / "trials" / f"{cid}.json"
        if f.exists():
            row = read_trial(f)
            # The study's current labels win over those a trial file was written with.
            row.update(cells.get(cid, {}))
            row.setdefault("group", row["row"])
            model = study.get("models", {}).get(row.get("model_key"))
            if model is not None:
                row[RUN_KEY] = int(model["pretrain"].get("seed", 0))
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


def baseline_of(df: pd.DataFrame, study: dict) -> dict[str, tuple[str, str]]:
    """Each row's baseline cell (row, col): its group's baseline cell, or the baseline column in the same row."""
    group = dict(zip(df["row"], df["group"] if "group" in df else df["row"]))
    cells = [tuple(c) for c in study.get("baseline_cells") or []]
    out = {}
    for r in dict.fromkeys(df["row"]):
        mine = [c for c in cells if group.get(c[0], c[0]) == group[r]]
        out[r] = mine[0] if mine else (r, study["baseline_col"])
    return out


def _cell(df: pd.DataFrame, r: str, c: str) -> pd.DataFrame:
    return df[(df["row"] == r) & (df["col"] == c)]


def compare_cells(df: pd.DataFrame, baselines: dict[str, tuple[str, str]], metric: str, prefix: str = "",
                  control: str = "", claims: set[tuple[str, str]] | None = None) -> list[Comparison]:
    """Every compared cell (not a baseline cell, not the untrained `control` column) against its row's baseline
    model and against the row's strongest context-free baseline, on `metric` (not yet Holm-corrected). The tests of
    a claimed (row, col) on the primary metric are the claims' family (`claims`; None: every compared cell is
    claimed), the others secondary."""
    out = []
    base_cells = set(baselines.values())
    for r in dict.fromkeys(df["row"]):
        br, bc = baselines[r]
        base = _cell(df, br, bc)
        floor_name, _ = strongest_baseline(df[df["row"] == r], prefix)
        for c in dict.fromkeys(df["col"]):
            sub = _cell(df, r, c)
            if sub.empty or (r, c) in base_cells or c == control:
                continue
            if base.empty:
                ev = Evidence(math.nan, outcome=f"the baseline cell {br} / {bc} has no finished calculation; not compared")
            else:
                ev = against_model(sub, base, metric)
            fam = CLAIM if metric == PRIMARY and (claims is None or (r, c) in claims) else SECONDARY
            out.append(Comparison(metric, r, c, MODEL, bc if br == r else f"{br} / {bc}", ev, family=fam))
            if floor_name != "–":
                out.append(Comparison(metric, r, c, FLOOR, floor_name, against_floor(sub, metric, floor_name),
                                      family=fam))
    return out


def control_comparisons(df: pd.DataFrame, control: str) -> list[Comparison]:
    """Every pretrained cell of a row against that row's untrained (`control`) cell, at the best-perplexity epoch."""
    out = []
    for r in dict.fromkeys(df["row"]):
        ref = _cell(df, r, control)
        if ref.empty:
            continue
        for c in dict.fromkeys(df["col"]):
            sub = _cell(df, r, c)
            if c != control and not sub.empty:
                out.append(Comparison("accuracy", r, c, UNTRAINED, control, against_model(sub, ref, "accuracy"),
                                      family=CONTROL))
    return out


def _table(df: pd.DataFrame, baselines: dict[str, tuple[str, str]], acc: str, ppl: str, prefix: str = "",
           bold: dict | None = None, control: str = "") -> list[str]:
    """The table of `acc` / `ppl`, bold by `bold` ((metric, row, col) -> bool: `significance.bold_cells`; without
    it, decided over this table's tests alone)."""
    if bold is None:
        bold = bold_cells(correct_family(compare_cells(df, baselines, acc, prefix, control)))
    cols = list(dict.fromkeys(df["col"]))
    lines = ["| | " + " | ".join(cols) + " | strongest context-free |", "|---|" + "---|" * (len(cols) + 1)]
    base_cells = set(baselines.values())
    for r in dict.fromkeys(df["row"]):
        cells = []
        for c in cols:
            sub = _cell(df, r, c)
            if sub.empty:
                cells.append("/")
                continue
            text = f"{_fmt(sub[acc], 100)} / {_fmt(sub[ppl], 1, 2)} (n={len(sub)})"
            if (r, c) in base_cells:
                text = f"<u>{text}</u>"
            elif bold.get((acc, r, c)):
                text = f"**{text}**"
            cells.append(text)
        name, mean = strongest_baseline(df[df["row"] == r], prefix)
        cells.append(f"{100 * mean:.1f} ({name})" if name != "–" else "–")
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return lines


def metrics_of(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(metric, prefix) of every table of the report: both epochs on the protocol test set, then each extra set."""
    return [("accuracy", ""), ("best_accuracy", "")] + [(f"eval_{n}_accuracy", f"eval_{n}_") for n in extra_test_sets(df)]


def claimed_cells(study: dict) -> set[tuple[str, str]] | None:
    """The (row, col) cells the study declares as its claims (`Study.claims`, study.json's "claims"); None where it
    declares none (every compared cell is then claimed on the primary metric)."""
    claims = study.get("claims")
    return {(str(r), str(c)) for r, c in claims} if claims else None


def all_comparisons(df: pd.DataFrame, baselines: dict[str, tuple[str, str]], control: str = "",
                    claims: set[tuple[str, str]] | None = None) -> list[Comparison]:
    """Every test of the report, each Holm-corrected in its family (`significance.correct_family`): each table's
    comparisons (the claimed cells on the primary metric: the claims), then the positive control."""
    tests = []
    for metric, prefix in metrics_of(df):
        rows = df[df[metric].notna()] if metric in df.columns else df.iloc[:0]
        tests += compare_cells(rows, baselines, metric, prefix, control, claims)
    tests += part_comparisons(df, baselines, control, claims)  # the claims again on a task's aligned part: secondary
    if control:
        tests += control_comparisons(df, control)
    return correct_family(tests)


def provenance_line(study: dict, df: pd.DataFrame) -> str:
    """Who made these numbers: the driver's commit, date, machine and versions (study.json's provenance, recorded
    when the study ran), the pretraining precision of its models, and the commits its calculations ran at."""
    prov = study.get("provenance") or {}
    if not prov:
        return "**Provenance:** not recorded (a study written before provenance was)."
    precisions = sorted({p for p in (_model_precision(study, info) for info in study.get("models", {}).values()
                                     if info.get("pretrain", {}).get("max_steps") != 0) if p})
    commits = df["commit"].fillna("unrecorded").value_counts() if "commit" in df.columns and not df.empty else None
    calc = ("; FEL calculations at " + ", ".join(f"{c} ({n})" for c, n in commits.items())
            if commits is not None and (len(commits) > 1 or commits.index[0] != prov.get("commit")) else "")
    commit, dirty = code_commit()
    return (f"**Provenance:** commit {describe_commit(prov)}{calc}; run on {prov.get('date', '?')}; driver machine "
            f"{prov.get('machine', '?')}; pretraining precision {', '.join(precisions) or '–'}; torch "
            f"{prov.get('torch', '?')}, Ray {prov.get('ray', '?')}, Python {prov.get('python', '?')}. This report "
            f"(its verdicts) written by commit {describe_commit({'commit': commit, 'dirty': dirty})}.")


def _model_precision(study: dict, info: dict) -> str:
    ev_file = Path(study["corpus_dir"]).parent.parent / "models" / info["model_id"] / "final" / "eval.json"
    if ev_file.exists():
        return str(read_json(ev_file).get("precision", ""))
    return str(info.get("pretrain", {}).get("precision", ""))


def overlap_notes(study: dict) -> list[str]:
    """A warning for each task whose finetuning samples overlap heavily (study.json's "sample_overlap", recorded
    when the study ran): its folds are nearly one sample, so its verdict does not generalise over other samples."""
    out = []
    for task, o in (study.get("sample_overlap") or {}).items():
        out += [f"**{task.upper()}'s finetuning samples overlap heavily:** each draws {o['budget']} of the pool's "
                f"{o['pool']} examples, so two samples share about {o['overlap']:.0%} of theirs. Its folds are nearly "
                "one finetuning sample: its verdict does not generalise over other samples of the budget, and its "
                "replicates' spread understates theirs.", ""]
    return out


def _unit_names(df: pd.DataFrame) -> str:
    """What the test units of the report's tasks are ("texts for ct, snippets for ad")."""
    tasks = list(dict.fromkeys(df["ft_task"].dropna())) if "ft_task" in df.columns else []
    return ", ".join(f"{task_named(t).test_units} for {t.upper()}" for t in tasks) or "test units"


def write_report(sdir: Path) -> Path:
    sdir = Path(sdir)
    study = read_json(sdir / "study.json")
    df = pd.read_parquet(sdir / "results.parquet")
    # Calculations recorded as failed (a diverged model: no finite selection number) have no metrics; they are
    # listed in a section of their own and left out of every table.
    failed = df[df["status"] == "failed"] if "status" in df.columns else df.iloc[:0]
    df = df.drop(index=failed.index)
    baselines = baseline_of(df, study) if not df.empty else {}
    if study.get("baseline_cells"):
        base = ", ".join(f"{c} in row {r}" for r, c in study["baseline_cells"]) + " (each for the rows of its group)"
    else:
        base = f"column {study['baseline_col']}, row by row"
    modes = sorted(df["selection"].unique()) if not df.empty else []
    if "refit" in df.columns and not df.empty:  # rows from before the field have no refit: NaN, i.e. off
        refit = df["refit"].fillna(False).astype(bool)
        modes = [m if m != "honest" else ("honest, refit" if refit[df["selection"] == m].all() else
                                          "honest" if not refit[df["selection"] == m].any() else "honest (some refit)")
                 for m in modes]
    # Rows from before the head-input fields have no column: they read the last layer at a word's first piece.
    inputs = sorted(df["head_input"].fillna("last:first").unique()) if "head_input" in df.columns else ["last:first"]
    failed_note = f"; {len(failed)} failed (see Failed calculations)" if len(failed) else ""
    out = [f"# {study['title']}", "", f"Study `{study['name']}` — {len(df)} of {len(study['calculations'])} "
           f"calculations finished{failed_note}.", "", provenance_line(study, df), "",
           f"**Selection mode: {', '.join(modes) or '–'}** "
           "(`honest`: epochs selected on a validation split carved from the training budget, test set touched "
           "once per selected epoch; `refit`: then trained again to those epochs on the whole budget, training and "
           "validation examples, as the context-free baselines are fitted; `paper`: epochs selected on the test set, as "
           "in the paper — for reproduction only).",
           "", f"**Head input: {', '.join(inputs) if not df.empty else '–'}** (`FinetuneConfig.feature_layers:word_pooling`"
           "; `last:first`, the paper's: the last layer at each word's first piece; `all`: the embedding output and "
           "every layer's side by side; `mean`: a word's pieces averaged; AD reads [CLS] either way).",
           "", f"Cells: accuracy % ± std / perplexity ± std over the calculations (n). Baseline: <u>{base}</u>. "
           f"**Bold**: one of the study's claims, above the row's baseline model **and** above the row's strongest "
           f"context-free baseline (last column), each by a paired test over the finetuning samples, seeds and test "
           f"units, with a Holm-corrected p < {P_VALUE} over the claims; other cells are secondary or exploratory and "
           "never bold. Claims, detectable effects, differences and intervals in the significance section "
           "(docs/statistics.md).", ""]
    control = study.get("control_col", "")
    if control and not df.empty and control in set(df["col"]):
        out[-1:-1] = ["", f"`{control}`: the same architecture with no pretraining, its weights as initialised at "
                      "random (BERT's N(0, 0.02) embeddings, even where the recipes start theirs from the corpus's "
                      "co-occurrence statistics): not a pretrained run's step 0 (a positive control; see What "
                      "pretraining buys)."]
    if study.get("notes"):
        out += [study["notes"], ""]
    tests: list[Comparison] = []
    if df.empty:
        out.append("No finished calculations yet.")
    else:
        tests = all_comparisons(df, baselines, control, claimed_cells(study))
        bold = bold_cells(tests)
        out += [generalises_over(runs_in(df)), ""] + overlap_notes(study)
        out += ["## Accuracy at the best-perplexity epoch", ""]
        zero_shot = read_zero_shot(sdir)
        out += _table(df, baselines, "accuracy", "perplexity", bold=bold) + [""]
        out += part_tables(df, "accuracy", zero_shot, study)
        out += _side_by_side(df)
        out += ["## Best accuracy (and its perplexity)", ""]
        out += _table(df, baselines, "best_accuracy", "perplexity_at_best_accuracy", bold=bold) + [""]
        out += part_tables(df, "best_accuracy")
        out += ["## Epochs to convergence (epoch of the best selection perplexity)", "",
                "| | " + " | ".join(dict.fromkeys(df["col"])) + " |", "|---|" + "---|" * df["col"].nunique()]
        for r in dict.fromkeys(df["row"]):
            cells = [_fmt(df[(df["row"] == r) & (df["col"] == c)]["epochs"].astype(float), 1, 1)
                     for c in dict.fromkeys(df["col"])]
            out.append(f"| {r} | " + " | ".join(cells) + " |")
        out += ["", "## Context-free baselines on the same splits", ""] + _baseline_section(df, "")
        for name in extra_test_sets(df):
            out += ["", f"## Test set `{name}`", "", extra_test_text().get(name, "A user's own test file "
                    "(--eval-file); the models are those selected above, scored once more."), "",
                    "### Accuracy at the best-perplexity epoch", ""]
            out += _table(df[df[f"eval_{name}_accuracy"].notna()], baselines, f"eval_{name}_accuracy",
                          f"eval_{name}_perplexity", prefix=f"eval_{name}_", bold=bold)
            by_part = part_tables(df, f"eval_{name}_accuracy", zero_shot, study)
            out += [""] + by_part[:-1] if by_part else []
            out += ["", f"### Context-free baselines on `{name}`", ""] + _baseline_section(df, f"eval_{name}_")[2:]
        if tests:
            out += [""] + control_section(tests, control)
            out += [""] + significance_section(tests, _unit_names(df))
    if len(failed):
        out += ["", "## Failed calculations", "",
                "Recorded as failed, with no result: they are left out of every table above. A rerun does not repeat "
                "them, except those that ran out of memory; delete a calculation's `trials/<calc-id>.json` to run it "
                "again.", "",
                "| row | column | fold | seed | calculation | reason |", "|---|---|---|---|---|---|"]
        for _, r in failed.iterrows():
            reason = str(r.get("error", "")).replace("|", "/").replace("\n", " ")
            out.append(f"| {r['row']} | {r['col']} | {r.get('ft_fold', '?')} | {r.get('ft_seed', '?')} | "
                       f"{r['calc_id']} | {reason} |")
    if study.get("searches"):
        out += [""] + _search_section(study["searches"], sdir)
    out += ["", "## Pretrained models", "", "Held-out evaluation of each pretrained model (accuracy % / perplexity).", ""]
    out += pretrain_table(study)
    out += ["", "What each model's pretraining cost (docs/throughput.md: real tokens, MFU against the device's peak; "
            "– where unknown or recorded before throughput was).", ""] + cost_table(study, df)
    # matplotlib only when there are results (plots.py imports it in its functions)
    plots = make_plots(sdir, df, study) if not df.empty else []
    if plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    if tests:  # the report leads with the effects: differences with intervals, drawn by the bold rule
        effects = effect_plot(sdir / "plots", tests)
        out[6:6] = ["## Effects", "", f"![effects](plots/{effects.name})", "", EFFECT_CAPTION, ""]
    out += ["", "## Files", "", "- `results.parquet`: one row per calculation (config, metrics, baselines, timings, node).",
            f"- TensorBoard: `tensorboard --logdir {sdir}` (one run per calculation with hparams, plus the "
            "pretraining runs under each model's folder).", ""]
    path = sdir / "report.md"
    write_text(path, "\n".join(out))
    return path


def _side_by_side(df: pd.DataFrame) -> list[str]:
    """For each row scored on extra test sets (AD: out of domain), its protocol test set and every extra set
    side by side, per model, each with its strongest context-free baseline."""
    out = []
    for r in dict.fromkeys(df["row"]):
        sub_r = df[df["row"] == r]
        names = [n for n in extra_test_sets(df) if sub_r[f"eval_{n}_accuracy"].notna().any()]
        if not names:
            continue
        sets = [("", "test"), *((f"eval_{n}_", n) for n in names)]
        out += [f"{r} on each of its test sets (accuracy % at the best-perplexity epoch, mean ± std):", "",
                "| model | " + " | ".join(label for _, label in sets) + " |", "|---|" + "---|" * len(sets)]
        for c in dict.fromkeys(sub_r["col"]):
            sub = sub_r[sub_r["col"] == c]
            out.append(f"| {c} | " + " | ".join(_fmt(sub[f"{p}accuracy"], 100) for p, _ in sets) + " |")
        floors = [strongest_baseline(sub_r, p) for p, _ in sets]
        out.append("| strongest context-free | " + " | ".join(f"{100 * m:.1f} ({n})" for n, m in floors) + " |")
        out.append("")
    return out


def _baseline_notes(tasks=None) -> list[str]:
    """The description of its own context-free baselines (`Task.baseline_notes`) of each task of `tasks` (the
    report's; None: every registered task), in task order: a study of one task is not told about the others'."""
    return [t.baseline_notes for t in registered_tasks()
            if t.baseline_notes and (tasks is None or t.name in set(tasks))]


def _baseline_section(df: pd.DataFrame, prefix: str) -> list[str]:
    """Each row's context-free baselines (mean ± std over its calculations) and the strongest one, named."""
    sub_df = df[df[f"{prefix}baseline_best"].notna()] if f"{prefix}baseline_best" in df else df.iloc[0:0]
    names = baseline_names(sub_df, prefix)
    if sub_df.empty or not names:
        return ["No context-free baselines in these results."]
    out = ["An effect only counts when it beats these; a cell is bold only when it is significantly above its "
           "baseline model **and** above the strongest of them. Majority: the most frequent training label. "
           + " ".join(_baseline_notes(sub_df["ft_task"] if "ft_task" in sub_df else None)), "",
           "| | " + " | ".join(names) + " | strongest |", "|---|" + "---|" * (len(names) + 1)]
    for r in dict.fromkeys(sub_df["row"]):
        sub = sub_df[sub_df["row"] == r]
        cells = [_fmt(sub[f"{prefix}baseline_{n}"], 100) if sub[f"{prefix}baseline_{n}"].notna().any() else "/"
                 for n in names]
        best, mean = strongest_baseline(sub, prefix)
        out.append(f"| {r} | " + " | ".join(cells) + f" | {best} ({100 * mean:.1f}) |")
    return out


def _search_section(searches: list[dict], sdir: Path) -> list[str]:
    """Each Optuna search: what it maximized, how its trials ended, the best setting, the top trials and the
    parameter importances (`search_importance`)."""
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
        counts = ", ".join(f"{statuses.count(k)} {k}" for k in ("complete", "pruned", "failed", "error") if k in statuses)
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
        out += [""] + importance_lines(sdir, s.get("optuna"), name, [s["objective"]])
    return out


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def pretrain_table(study: dict) -> list[str]:
    """Held-out accuracy / perplexity of every objective that some model of the study was pretrained with, one
    column per objective: in the order of the model with the most objectives, then any others as they come."""
    models = study.get("models", {})
    root_models = Path(study["corpus_dir"]).parent.parent / "models"
    richest_first = sorted(models.values(), key=lambda info: -len(info["pretrain"]["objectives"]))
    metrics = list(dict.fromkeys(o["name"] for info in richest_first for o in info["pretrain"]["objectives"]))
    lines = ["| model | objectives | steps | " + " | ".join(m.upper() for m in metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for key, info in models.items():
        ev_file = root_models / info["model_id"] / "final" / "eval.json"
        ev = read_json(ev_file) if ev_file.exists() else {}
        # An untrained model (zero steps) was pretrained with nothing; its config's objectives are the defaults.
        objs = "none (untrained)" if info["pretrain"].get("max_steps") == 0 else \
            "+".join(o["name"] for o in info["pretrain"]["objectives"])
        cells = []
        for m in metrics:
            a, p = ev.get(f"eval/{m}/accuracy"), ev.get(f"eval/{m}/perplexity")
            cells.append(f"{100 * a:.1f} / {p:.2f}" if a is not None and not math.isnan(a) else "/")
        lines.append(f"| {key} | {objs} | {ev.get('step', '?')} | " + " | ".join(cells) + " |")
    return lines


def cost_table(study: dict, df: pd.DataFrame) -> list[str]:
    """Each pretrained model's throughput record (its eval.json's "throughput"), and the FEL trials' device time."""
    root_models = Path(study["corpus_dir"]).parent.parent / "models"
    lines = ["| model | device | precision | tokens/s | samples/s | MFU | training s | device-hours |",
             "|---|---|---|---|---|---|---|---|"]
    for key, info in study.get("models", {}).items():
        ev_file = root_models / info["model_id"] / "final" / "eval.json"
        tp = (read_json(ev_file) if ev_file.exists() else {}).get("throughput") or {}

        def cell(k, fmt):
            return "–" if tp.get(k) is None else format(tp[k], fmt)

        lines.append(f"| {key} | {tp.get('num_devices', '–')} x {tp.get('device', '–')} | {tp.get('precision', '–')} | "
                     f"{cell('tokens_per_s', ',.0f')} | {cell('samples_per_s', ',.1f')} | {cell('mfu', '.1%')} | "
                     f"{cell('train_seconds', ',.0f')} | {cell('device_hours', '.4f')} |")
    if "device_seconds" in df:
        secs = df["device_seconds"].dropna()
        lines += ["", f"FEL calculations: {len(secs)} with a recorded device time, {secs.sum() / 3600:.3f} "
                      f"device-hours in all ({secs.mean():.1f} s each on average)." if len(secs) else ""]
    return lines

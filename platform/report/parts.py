"""Tables read by part: a task whose test units fall in parts (`Task.parts`; AD: a snippet is in the part of its
negative's kind, a mutated acronym or a pseudo acronym) gets, under each of its tables, every cell's accuracy on
each part beside its accuracy on the whole, with the strongest context-free baseline on each part and, where the
study recorded it, the pretrained aligned head read zero-shot (`fel.zero_shot`: PAD's head on AD's pairs).

Every calculation records each test unit's part (`unit_parts`, in its `unit_keys` order;
`task_scoring.parts_per_test_unit`), so a part is a subset of the test units: its accuracy is its units' correct
over their scored pairs, and the report's paired decision (`unit_statistics`) runs on it unchanged. The study's
claims are tested again on the task's `aligned_part` (AD: positives vs mutated negatives, the part a perfect PAD
solver gets right), against the same baseline model, as secondary tests: labelled, Holm-corrected with the other
secondary tests, never bold; the claims' family is left as it is.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from alignlab.platform.report.columns import strongest_baseline
from alignlab.platform.report.significance import MODEL, SECONDARY, Comparison, against_model
from alignlab.platform.report.unit_statistics import Evidence
from alignlab.platform.tasks.task import task as task_named

PARTS = "unit_parts"


def _prefix(metric: str) -> str:
    """"" for the protocol test set's metrics ("accuracy", "best_accuracy"), "eval_<name>_" for an extra set's."""
    return "" if metric in ("accuracy", "best_accuracy") else metric[: -len("accuracy")]


def _task_of(df: pd.DataFrame):
    """The task object of a row's calculations (None where the rows name no single registered task)."""
    names = set(df["ft_task"].dropna()) if "ft_task" in df.columns else set()
    if len(names) != 1:
        return None
    try:
        return task_named(names.pop())
    except ValueError:
        return None


def part_names(df: pd.DataFrame, metric: str) -> list[str]:
    """The parts `df`'s rows recorded for `metric`'s test set, in their task's declared order."""
    col = _prefix(metric) + PARTS
    t = _task_of(df)
    if col not in df.columns or t is None or not t.parts:
        return []
    seen = {p for v in df[col] if isinstance(v, (list, np.ndarray)) for p in v if p is not None}
    return [p for p in t.parts if p in seen]


def part_rows(df: pd.DataFrame, metric: str, part: str) -> pd.DataFrame:
    """`df`'s rows that recorded parts for `metric`'s test set, restricted to the test units of `part`: every per-unit
    list of that set keeps those units only, and the accuracies read from them (`metric`, the best-accuracy column of
    the protocol set, each context-free baseline's) are recomputed from what is kept."""
    p = _prefix(metric)
    col = p + PARTS
    if col not in df.columns:
        return df.iloc[:0]
    keep = [isinstance(v, (list, np.ndarray)) for v in df[col]]
    out = df[keep].copy()
    if out.empty:
        return out
    masks = [np.array([x == part for x in v], dtype=bool) for v in out[col]]
    listed = [c for c in out.columns if c.startswith(p + "unit_") and c != col]
    for c in listed:
        out[c] = [np.asarray(v)[m] if isinstance(v, (list, np.ndarray)) and len(v) == len(m) else v
                  for v, m in zip(out[c], masks)]

    def ratio(correct: str, count: str) -> list[float]:
        # A row without the lists (another task's baseline, an older result) has no accuracy on the part.
        return [float(np.sum(a)) / float(np.sum(n))
                if isinstance(a, (list, np.ndarray)) and isinstance(n, (list, np.ndarray)) and np.sum(n) > 0
                else math.nan for a, n in zip(out[correct], out[count])]

    count = p + "unit_count"
    out[p + "accuracy"] = ratio(p + "unit_correct", count)
    if not p and "unit_correct_at_best_accuracy" in out.columns:
        out["best_accuracy"] = ratio("unit_correct_at_best_accuracy", count)
    for c in [c for c in out.columns if c.startswith(p + "unit_correct_baseline_")]:
        name = c[len(p + "unit_correct_baseline_"):]
        if p + f"unit_count_baseline_{name}" in out.columns:
            out[p + f"baseline_{name}"] = ratio(c, p + f"unit_count_baseline_{name}")
    # The whole set's strongest baseline is not the part's: strongest_baseline recomputes it from the columns.
    return out.drop(columns=[c for c in (p + "baseline_best", p + "baseline_best_name") if c in out.columns])


def _fmt(values: pd.Series) -> str:
    v = values.dropna().to_numpy(dtype=float) * 100
    if len(v) == 0:
        return "–"
    return f"{v.mean():.1f} ± {(v.std(ddof=1) if len(v) > 1 else 0.0):.1f}"


def part_tables(df: pd.DataFrame, metric: str, zero_shot: dict | None = None, study: dict | None = None) -> list[str]:
    """For each row whose task has parts, a table of each model's `metric` (accuracy % mean ± std over its
    calculations) on the whole test set and on each part, the strongest context-free baseline on each, and, with
    `zero_shot` (`fel.zero_shot`'s file) and the study's models, each model's pretrained aligned head read zero-shot.
    Never bold: the claims are decided in the main table."""
    out = []
    for r in dict.fromkeys(df["row"]):
        sub_r = df[(df["row"] == r) & df[metric].notna()] if metric in df.columns else df.iloc[:0]
        parts = part_names(sub_r, metric)
        t, p = _task_of(sub_r), _prefix(metric)
        heads = _zero_shot_heads(sub_r, zero_shot, study, t, p)
        if not parts:  # a task without parts: its zero-shot numbers in one line
            if heads:
                out += [f"{r}: zero-shot {heads[0].upper()} head ({_zero_shot_where(t, p)}): " + ", ".join(
                    f"{c} {_zero_shot_cell(sub_r[sub_r['col'] == c], zero_shot, study, t, p, [])}"
                    for c in dict.fromkeys(sub_r["col"])) + ".", ""]
            continue
        by_part = {p: part_rows(sub_r, metric, p) for p in parts}
        head = (f" | zero-shot {heads[0].upper()} head ({' / '.join(['all', *parts])})" if heads else "")
        out += [f"{r} by part ({_what(metric)}; accuracy % mean ± std over the calculations; a part holds whole "
                f"test units, {t.test_units}):", "",
                "| model | all | " + " | ".join(f"{q}: {t.parts[q]}" for q in parts) + head + " |",
                "|---|---|" + "---|" * len(parts) + ("---|" if heads else "")]
        for c in dict.fromkeys(sub_r["col"]):
            cells = [_fmt(sub_r[sub_r["col"] == c][metric])]
            cells += [_fmt(by_part[q][by_part[q]["col"] == c][metric]) for q in parts]
            if heads:
                cells.append(_zero_shot_cell(sub_r[sub_r["col"] == c], zero_shot, study, t, p, parts))
            out.append(f"| {c} | " + " | ".join(cells) + " |")
        floors = [strongest_baseline(sub_r, p)] + [strongest_baseline(by_part[q], p) for q in parts]
        out.append("| strongest context-free | " + " | ".join(
            f"{100 * m:.1f} ({n})" if n != "–" else "–" for n, m in floors) + (" | " if heads else "") + " |")
        if heads:
            out.append("")
            runs = max((sub_r[sub_r["col"] == c]["model_key"].nunique() for c in dict.fromkeys(sub_r["col"])),
                       default=1)
            out.append(f"Zero-shot {heads[0].upper()} head: {_zero_shot_where(t, p)}; – where the model has no "
                       f"{heads[0].upper()} head" + (f"; a column's figure is the mean of its {runs} pretraining "
                                                     "runs' models" if runs > 1 else "") + ".")
        out.append("")
    return out


def _what(metric: str) -> str:
    if metric == "best_accuracy":
        return "best accuracy"
    return "at the best-perplexity epoch" + (f", test set `{_prefix(metric)[len('eval_'):-1]}`"
                                             if _prefix(metric) else "")


def _zero_shot_where(t, prefix: str) -> str:
    return (f"each model's pretrained aligned head as pretraining left it, no finetuning, on "
            + ("every fold's test set" if not prefix else f"test set `{prefix[len('eval_'):-1]}`")
            + f" in {t.name.upper()}'s input form, once per model")


def _zero_shot_heads(sub_r: pd.DataFrame, zero_shot: dict | None, study: dict | None, t, prefix: str) -> list[str]:
    """The aligned head named in `zero_shot` for this row's task and test set, if any model of the row has one."""
    if not zero_shot or not study or t is None or "model_key" not in sub_r.columns:
        return []
    heads = []
    for key in dict.fromkeys(sub_r["model_key"].dropna()):
        rec = _zero_shot_record(zero_shot, study, key, t.name, prefix)
        if rec:
            heads.append(rec["head"])
    return list(dict.fromkeys(heads))


def _zero_shot_record(zero_shot: dict, study: dict, key: str, task: str, prefix: str) -> dict | None:
    mid = (study.get("models", {}).get(key) or {}).get("model_id")
    entry = (zero_shot.get("models", {}).get(mid) or {}).get(task)
    if not entry:
        return None
    sets = entry.get("sets", {})
    rec = sets.get("test" if not prefix else prefix[len("eval_"):-1])
    return {**rec, "head": entry["head"]} if rec else None


def _zero_shot_cell(sub: pd.DataFrame, zero_shot: dict, study: dict, t, prefix: str, parts: list[str]) -> str:
    """The column's zero-shot figures; a column of several pretraining runs (one model each) shows their mean, and
    "–" unless every run's model has a record."""
    keys = list(dict.fromkeys(sub["model_key"].dropna())) if "model_key" in sub.columns else []
    recs = [_zero_shot_record(zero_shot, study, k, t.name, prefix) for k in keys]
    if not recs or not all(recs):
        return "–"

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        return sum(values) / len(values) if len(values) == len(recs) else None

    vals = [mean([r.get("accuracy") for r in recs])] + [mean([r.get("parts", {}).get(q) for r in recs])
                                                          for q in parts]
    return " / ".join("–" if v is None else f"{100 * v:.1f}" for v in vals)


def part_comparisons(df: pd.DataFrame, baselines: dict[str, tuple[str, str]], control: str = "",
                     claims: set[tuple[str, str]] | None = None) -> list[Comparison]:
    """Each claimed cell (every compared cell where the study declares no claims) of a row whose task has an
    `aligned_part`, against its row's baseline model on that part only, on the claims' metric of the protocol test
    set and on each extra test set that recorded parts: secondary tests (never bold, not in the claims' family)."""
    out = []
    metrics = ["accuracy"] + [c[: -len(PARTS)] + "accuracy" for c in df.columns
                              if c.startswith("eval_") and c.endswith("_" + PARTS)]
    for r in dict.fromkeys(df["row"]):
        t = _task_of(df[df["row"] == r])
        if t is None or not t.aligned_part or r not in baselines:
            continue
        br, bc = baselines[r]
        base_all = df[(df["row"] == br) & (df["col"] == bc)]
        for metric in metrics:
            if metric not in df.columns or t.aligned_part not in part_names(df[df["row"] == r], metric):
                continue
            base = part_rows(base_all.dropna(subset=[metric]), metric, t.aligned_part)
            for c in dict.fromkeys(df[df["row"] == r]["col"]):
                if (r, c) == (br, bc) or c == control or (claims is not None and (r, c) not in claims):
                    continue
                sub = part_rows(df[(df["row"] == r) & (df["col"] == c)].dropna(subset=[metric]), metric,
                                t.aligned_part)
                if sub.empty:
                    continue
                ev = (Evidence(math.nan, outcome=f"the baseline cell {br} / {bc} has no parts recorded; not compared")
                      if base.empty else against_model(sub, base, metric))
                out.append(Comparison(f"{metric} ({t.aligned_part} part)", r, c, MODEL,
                                      bc if br == r else f"{br} / {bc}", ev, family=SECONDARY))
    return out

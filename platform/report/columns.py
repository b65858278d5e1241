"""What a study's results table holds besides its cells' scores: the tasks' context-free baselines (and the
strongest of them over a row) and the extra test sets the calculations were scored on. Read by the report's
tables (report.py) and its plots (plots.py)."""
from __future__ import annotations

import pandas as pd

from alignlab.platform.fel.protocol import baseline_names as task_baseline_names
from alignlab.platform.tasks.task import registered_tasks


def baseline_names(df: pd.DataFrame, prefix: str = "") -> list[str]:
    """The context-free baselines present in the results (of the protocol test set, or of `prefix`'s set)."""
    head = f"{prefix}baseline_"
    found = [c[len(head):] for c in df.columns
             if c.startswith(head) and c not in (f"{head}best", f"{head}best_name") and df[c].notna().any()]
    order = list(task_baseline_names())  # the tasks' order, then any others
    return sorted(found, key=lambda n: (order.index(n) if n in order else len(order), n))


def strongest_baseline(sub: pd.DataFrame, prefix: str = "") -> tuple[str, float]:
    """(name, mean accuracy) of the strongest context-free baseline over a row's calculations."""
    names = baseline_names(sub, prefix)
    if not names:
        return "–", float("nan")
    means = {n: sub[f"{prefix}baseline_{n}"].mean() for n in names}
    best = max(means, key=means.get)
    return best, float(means[best])


def extra_test_sets(df: pd.DataFrame) -> list[str]:
    """Names of the extra test sets the calculations were scored on (out-of-domain AD, --eval-file)."""
    names = [c[len("eval_"): -len("_accuracy")] for c in df.columns
             if c.startswith("eval_") and c.endswith("_accuracy") and "_baseline_" not in c]
    return sorted(names, key=lambda n: (n not in extra_test_text(), n))  # built-in sets first


def extra_test_text() -> dict[str, str]:
    """The tasks' descriptions of their built-in extra test sets (`Task.extra_test_notes`), by set name."""
    return {k: v for t in registered_tasks() for k, v in t.extra_test_notes.items()}

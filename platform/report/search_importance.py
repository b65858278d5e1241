"""Optuna's parameter importances of a finished search, for its report: which searched settings mattered.

Read from the search's persistent Optuna study (`optuna_study`) and computed by Optuna's default evaluator,
PED-ANOVA (deterministic; fANOVA would need scikit-learn), over the COMPLETE trials only -- pruned, failed and
interrupted ones have no final value: how much each parameter's distribution among the top 10 % of trials
differs from its distribution among all of them. One list and one bar plot
(`plots/importance-<search>[-<metric>].png`) per objective. Importances need at least two completed trials and
a parameter that took more than one value among them, and say nothing when every completed trial scored the
same (Optuna then makes them all equal); in each of these cases the report says why in one line.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from alignlab.platform.report.plots import save_figure


def importance_lines(sdir: Path, recorded: dict | None, search: str, metrics: list[str]) -> list[str]:
    """Markdown lines for the report of search `search` (`recorded`: its summary's "optuna" entry): per metric, the
    importances and their plot under `sdir/plots`, or one line saying why there are none."""
    # Optuna (which optuna_study imports too) only when a report has a search.
    import optuna
    from optuna.trial import TrialState

    from alignlab.platform.storage.optuna_place import load_recorded_study

    if not recorded:
        return ["Parameter importance: none (this search ran before searches kept a persistent Optuna study).", ""]
    try:
        study = load_recorded_study(Path(sdir), recorded)
    except Exception as e:  # noqa: BLE001 -- a report is still written without it
        return [f"Parameter importance: none (the Optuna study {recorded['study']} at {recorded.get('storage')} "
                f"could not be opened: {type(e).__name__}: {e})."[:400], ""]
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return [f"Parameter importance: none (Optuna needs at least 2 completed trials; this search has "
                f"{len(complete)}).", ""]
    varying = [p for p in complete[0].params if len({repr(t.params.get(p)) for t in complete}) > 1]
    if not varying:
        return [f"Parameter importance: none (no parameter took more than one value among the {len(complete)} "
                "completed trials).", ""]
    out = []
    for i, metric in enumerate(metrics):
        if len({t.values[i] for t in complete}) == 1:
            out += [f"Parameter importance for {metric}: none (all {len(complete)} completed trials scored "
                    f"{complete[0].values[i]:.4g}).", ""]
            continue
        target = None
        if len(metrics) > 1:  # PED-ANOVA ranks a given target low-is-better: a maximized metric is negated
            sign = -1.0 if study.directions[i] == optuna.study.StudyDirection.MAXIMIZE else 1.0
            target = lambda t, i=i, sign=sign: sign * t.values[i]  # noqa: E731
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            imp = optuna.importance.get_param_importances(
                study, params=varying, target=target, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        equal = [str(w.message) for w in said if "will be equal" in str(w.message)]
        if equal:
            out += [f"Parameter importance for {metric}: none (Optuna: {equal[0]})", ""]
            continue
        name = f"importance-{search}" + (f"-{metric}" if len(metrics) > 1 else "") + ".png"
        plot = importance_plot(imp, Path(sdir) / "plots" / name, f"{search}: {metric}")
        out += [f"Parameter importance for {metric} (Optuna PED-ANOVA over {len(complete)} completed trials; "
                "they sum to 1): " + ", ".join(f"`{k}` {v:.2f}" for k, v in imp.items()) + ".", "",
                f"![{plot.stem}](plots/{plot.name})", ""]
    return out


def importance_plot(imp: dict[str, float], path: Path, title: str) -> Path:
    """A horizontal bar per parameter, the most important on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(imp)[::-1]
    fig, ax = plt.subplots(figsize=(5, 0.6 + 0.35 * len(names)))
    ax.barh(names, [imp[n] for n in names], color="tab:blue")
    ax.set_xlabel("importance (PED-ANOVA)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)

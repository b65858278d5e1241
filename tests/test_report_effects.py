"""A report written from results with per-unit scores leads with the effect plot (every test's difference with its
interval), decides over the folds and the test units (CT's shared texts crossed with the folds, AD's snippets nested
in them), tests each cell against its baseline model and against the strongest context-free baseline on the same
units, corrects over the report's family, and says what a table resting on one pretraining run generalises over."""
from __future__ import annotations

import numpy as np
from toy_study import write_toy_study


def _study(tmp_path) -> tuple[str, object]:
    rng = np.random.default_rng(1)
    ct_keys = [f"text{i}" for i in range(60)]  # CT: one test set, every fold
    trials = []
    for col, right in (("all*", 0.9), ("-whp*", 0.6), ("same*", 0.6)):
        for fold in range(5):
            ad_keys = [f"snip{fold}-{i}" for i in range(30)]  # AD: each fold its own snippets
            for seed in range(2):
                for row, keys, per in (("CT", ct_keys, 3), ("AD", ad_keys, 2)):
                    correct = [int(x) for x in rng.binomial(per, right, len(keys))]
                    acc = sum(correct) / (per * len(keys))
                    trials.append({
                        "calc_id": f"{row}-{col}-{fold}-{seed}", "row": row, "col": col, "ft_task": row.lower(),
                        "model_key": col, "model_id": col, "node": "local", "ft_fold": fold, "ft_seed": seed,
                        "ft_budget": 200, "selection": "honest", "accuracy": acc, "perplexity": 2.0,
                        "best_accuracy": acc, "perplexity_at_best_accuracy": 2.0, "epochs": 3,
                        "baseline_majority": 0.5, "baseline_best": 0.5, "baseline_best_name": "majority",
                        "unit_keys": keys, "unit_count": [per] * len(keys), "unit_correct": correct,
                        "unit_correct_at_best_accuracy": correct,
                        "unit_count_baseline_majority": [per] * len(keys),
                        "unit_correct_baseline_majority": [int(x) for x in rng.binomial(per, 0.5, len(keys))]})
    return write_toy_study(tmp_path, "fx", "Effects", trials, claims=[["CT", "all*"], ["AD", "all*"]])


def _sig_rows(text: str) -> tuple[list[str], dict]:
    sig = text[text.index("## Significance"):]
    header = next(x for x in sig.splitlines() if x.startswith("| family |")).split(" | ")
    rows = {}
    for x in sig.splitlines():
        cells = x.split(" | ")
        if len(cells) == len(header) and cells[1] in ("accuracy", "best_accuracy"):
            rows[(cells[1], cells[2], cells[3], cells[4])] = cells
    return header, rows


def test_the_report_leads_with_the_effect_plot_and_decides_over_folds_and_test_units_with_holm(tmp_path):
    text, sdir = _study(tmp_path)
    png = sdir / "plots" / "effects.png"
    assert png.exists() and png.stat().st_size > 1000
    assert text.index("![effects](plots/effects.png)") < text.index("## Accuracy at the best-perplexity epoch")
    sig = text[text.index("## Significance"):]
    # 2 rows x 2 compared cells x 2 metrics, each against its baseline model and against the majority baseline: the
    # two declared claims (all* on accuracy, 4 tests) and 12 secondary tests.
    assert "the study's 2 claims (4 tests" in sig and "12 secondary and exploratory tests" in sig
    assert "texts for CT, snippets for AD" in sig
    assert "rests on one pretraining run per column" in text and "*of these pretrained models*" in text
    header, rows = _sig_rows(text)
    gain = rows[("accuracy", "CT", "all*", "-whp* (baseline model)")]
    tie = rows[("accuracy", "CT", "same*", "-whp* (baseline model)")]
    assert gain[header.index("design")] == "crossed" and gain[header.index("units")] == "60"
    assert gain[header.index("replicates")] == "5 folds"
    ad = rows[("accuracy", "AD", "all*", "-whp* (baseline model)")]
    assert ad[header.index("design")] == "nested" and ad[header.index("units")] == "150", "five folds of 30 snippets"
    assert ad[header.index("df")] == "4"
    assert gain[header.index("95% CI (points)")].startswith("[+") and gain[header.index("significant gain")] == "yes"
    assert tie[header.index("significant gain")] == "no"
    floor = rows[("accuracy", "CT", "all*", "majority (context-free)")]
    assert floor[header.index("design")] == "crossed" and floor[header.index("significant gain")] == "yes"
    holm_p, p = float(gain[header.index("Holm p")]), float(gain[header.index("p")])
    assert holm_p >= p
    ct = next(x for x in text.splitlines() if x.startswith("| CT |"))
    assert ct.split(" | ")[1].startswith("**"), "above its baseline model and the majority baseline: bold"


def test_a_gain_that_does_not_clear_the_context_free_baseline_on_the_same_units_is_not_bold(tmp_path):
    text, sdir = _study(tmp_path)
    import json

    for f in (sdir / "trials").glob("*.json"):  # a rule right on every unit the all* models get right, and more
        t = json.loads(f.read_text())
        t["unit_correct_baseline_majority"] = list(t["unit_count_baseline_majority"])
        t["baseline_majority"] = t["baseline_best"] = 1.0
        f.write_text(json.dumps(t))
    from alignlab.platform.report.report import collect_results, write_report

    collect_results(sdir)
    text = write_report(sdir).read_text()
    header, rows = _sig_rows(text)
    # The claim is one intersection-union test: its p is the larger of the two, so neither of its tests is a gain.
    model = rows[("accuracy", "CT", "all*", "-whp* (baseline model)")]
    assert float(model[header.index("p")]) < 0.01 and model[header.index("significant gain")] == "no"
    assert rows[("accuracy", "CT", "all*", "majority (context-free)")][header.index("significant gain")] == "no"
    claim = next(x for x in text.splitlines() if x.startswith("| CT: all* − -whp* (accuracy) |"))
    assert claim.endswith("above the baseline model, not above the strongest context-free baseline |")
    ct = next(x for x in text.splitlines() if x.startswith("| CT |"))
    assert not ct.split(" | ")[1].startswith("**")


def test_the_effect_plots_fills_and_intervals_agree_with_the_bold_cells(tmp_path):
    """Every mark of the effect plot is filled exactly where its test is significant, which is where its
    Holm-consistent interval's lower end clears 0; a claim's two marks are both filled exactly when its cell is bold."""
    import matplotlib.colors as mcolors
    from alignlab.platform.report.plots import effect_figure
    from alignlab.platform.report.report import all_comparisons, baseline_of, claimed_cells
    from alignlab.platform.report.significance import CLAIM, bold_cells

    import json
    import pandas as pd

    _, sdir = _study(tmp_path)
    study = json.loads((sdir / "study.json").read_text())
    df = pd.read_parquet(sdir / "results.parquet")
    tests = all_comparisons(df, baseline_of(df, study), claims=claimed_cells(study))
    bold = bold_cells(tests)
    assert bold[("accuracy", "CT", "all*")]
    fig = effect_figure(tests)
    marks = {}
    for ax in fig.axes:
        for cont in ax.containers:
            filled = mcolors.to_rgba(cont.lines[0].get_markerfacecolor()) != mcolors.to_rgba("white")
            low = min(x for seg in cont.lines[2][0].get_segments() for x, _ in seg)
            marks[tuple(cont.get_label().split("|"))] = (filled, low)
    assert len(marks) == sum(1 for c in tests if c.ev.tested)
    for c in tests:
        if not c.ev.tested:
            continue
        filled, low = marks[(c.metric, c.row, c.col, c.kind)]
        assert filled == c.significant, c
        if c.family != CLAIM:
            assert filled == (low > 0), c
    for key, is_bold in bold.items():
        mine = [marks[(*key, c.kind)] for c in tests if c.family == CLAIM and (c.metric, c.row, c.col) == key]
        assert all(f for f, _ in mine) == is_bold == all(low > 0 for _, low in mine), key
    assert any(bold.values()) and not all(c.significant for c in tests), "both kinds of mark are drawn"
    import matplotlib.pyplot as plt

    plt.close(fig)

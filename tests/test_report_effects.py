"""A report written from results with per-unit scores leads with the effect plot (each cell's difference from its
baseline with its interval), decides on test units resampled, corrects over the report's family, and says that a
table resting on one pretraining run holds its models fixed."""
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
                        "unit_correct_at_best_accuracy": correct})
    return write_toy_study(tmp_path, "fx", "Effects", trials)


def test_the_report_leads_with_the_effect_plot_and_decides_over_test_units_with_holm(tmp_path):
    text, sdir = _study(tmp_path)
    png = sdir / "plots" / "effects.png"
    assert png.exists() and png.stat().st_size > 1000
    assert text.index("![effects](plots/effects.png)") < text.index("## Accuracy at the best-perplexity epoch")
    sig = text[text.index("## Significance against the baseline"):]
    # 2 rows x 2 compared cells x 2 metrics (accuracy, best accuracy): one family of 8.
    assert "Family for Holm's correction: all 8 comparisons" in sig
    assert "texts for CT, snippets for AD" in sig
    assert "rests on one pretraining run per column" in sig
    header = next(x for x in sig.splitlines() if x.startswith("| metric |")).split(" | ")
    rows = {(x.split(" | ")[1], x.split(" | ")[2], x.split(" | ")[0]): x.split(" | ")
            for x in sig.splitlines() if x.startswith("| accuracy |") or x.startswith("| best_accuracy |")}
    gain, tie = rows[("CT", "all*", "| accuracy")], rows[("CT", "same*", "| accuracy")]
    assert gain[header.index("decision over")] == "test units" and gain[header.index("n")] == "60"
    assert rows[("AD", "all*", "| accuracy")][header.index("n")] == "150", "five folds of 30 snippets"
    assert gain[header.index("95% CI (points)")].startswith("[+") and gain[-1].startswith("yes")
    assert tie[-1].startswith("no")
    holm_p, p = float(gain[header.index("Holm p")]), float(gain[header.index("p")])
    assert holm_p >= p
    ct = next(x for x in text.splitlines() if x.startswith("| CT |"))
    assert ct.split(" | ")[1].startswith("**"), "the gain is bold in the table"

"""The report shows every context-free baseline and the strongest by name, scores extra test sets in their
own sections, and bolds a cell only when it also beats the strongest context-free baseline."""
from __future__ import annotations

import json

from toy_study import write_toy_study

from alignlab.platform.report.report import collect_results, write_report


def _study(tmp_path, ct_floor: float, ad_floor: float):
    trials = []
    for row, floor in (("CT", ct_floor), ("AD", ad_floor)):
        for col, acc in (("all*", 0.80), ("-whp*", 0.70)):
            for fold in range(5):
                for seed in range(2):
                    # other jitter per column: the paired differences vary from fold to fold
                    jitter = (0.002 * (fold - 2) + 0.001 * seed) * (1.0 if col == "all*" else -0.5)
                    r = {"calc_id": f"{row}-{col}-{fold}-{seed}", "row": row, "col": col, "model_key": col,
                         "model_id": col, "node": "local",
                         "ft_fold": fold, "ft_seed": seed, "ft_budget": 200, "selection": "honest",
                         "accuracy": acc + jitter, "perplexity": 2.0, "best_accuracy": acc + jitter,
                         "perplexity_at_best_accuracy": 2.0, "epochs": 3, "baseline_majority": 0.5,
                         "baseline_best": floor, "baseline_best_name": "strong"}
                    if row == "CT":
                        r.update({"baseline_lexicon": floor, "baseline_run_rule": 0.6})
                    else:
                        r.update({"baseline_letters": 0.5, "baseline_span_matcher": floor,
                                  "eval_ood_accuracy": 0.6, "eval_ood_perplexity": 2.0, "eval_ood_num_test": 8,
                                  "eval_ood_baseline_span_matcher": 0.9, "eval_ood_baseline_majority": 0.5,
                                  "eval_ood_baseline_best": 0.9, "eval_ood_baseline_best_name": "span_matcher"})
                    trials.append(r)
    return write_toy_study(tmp_path, "toy", "Toy", trials)


def _row(text: str, section: str, row: str) -> str:
    part = text[text.index(section):]
    return next(line for line in part.splitlines() if line.startswith(f"| {row} |"))


def test_a_significant_gain_is_bold_only_above_the_strongest_context_free_baseline(tmp_path):
    text, _ = _study(tmp_path, ct_floor=0.85, ad_floor=0.75)
    ct = _row(text, "## Accuracy at the best-perplexity epoch", "CT")
    ad = _row(text, "## Accuracy at the best-perplexity epoch", "AD")
    assert "**80.0" not in ct and "85.0 (lexicon)" in ct      # 80% is below the lexicon's 85%: not an effect
    assert "**80.0" in ad and "75.0 (span_matcher)" in ad     # 80% beats both -whp* and the span matcher


def test_every_baseline_and_every_extra_test_set_gets_a_place_in_the_report(tmp_path):
    text, sdir = _study(tmp_path, ct_floor=0.85, ad_floor=0.75)
    base = text[text.index("## Context-free baselines"):]
    assert "| | majority | lexicon | run_rule | letters | span_matcher | strongest |" in base
    assert "lexicon (85.0)" in base and "span_matcher (75.0)" in base
    ood = _row(text, "## Test set `ood`", "AD")
    assert "60.0" in ood and "90.0 (span_matcher)" in ood and "**" not in ood
    assert (sdir / "plots" / "accuracy_ood_by_condition.png").stat().st_size > 1000


def test_a_report_names_the_pretraining_runs_its_test_generalises_over(tmp_path):
    """With one pretrained model per column the report says its tests hold those models fixed; a study pretrained
    with several seeds per column (study.json's models say which) is tested across the runs."""
    text, sdir = _study(tmp_path, ct_floor=0.5, ad_floor=0.5)
    assert "rests on one pretraining run per column" in text and "--pretrain-seeds 3" in text
    study = json.loads((sdir / "study.json").read_text())
    # The same calculations, now as two pretraining runs per column: half of the (fold, seed) points each.
    models, cells = {}, study["cells"]
    for cid in study["calculations"]:
        trial = json.loads((sdir / "trials" / f"{cid}.json").read_text())
        run = trial["ft_fold"] % 2
        trial["model_key"] = f"{trial['col']}@{run}"
        models[trial["model_key"]] = {"model_id": trial["model_key"], "pretrain": {"seed": run, "objectives": []}}
        (sdir / "trials" / f"{cid}.json").write_text(json.dumps(trial))
    study["models"] = models
    (sdir / "study.json").write_text(json.dumps(study))
    df = collect_results(sdir)
    assert sorted(df["pretrain_seed"].unique()) == [0, 1]
    text = write_report(sdir).read_text()
    sig = text[text.index("## Significance"):]
    header = next(x for x in sig.splitlines() if x.startswith("| family |")).split(" | ")
    line = next(x for x in sig.splitlines() if x.startswith("| claims | accuracy | AD | all* |")).split(" | ")
    assert line[header.index("replicates")] == "2 pretraining runs", "the runs the decision is taken over"
    assert "generalises over other pretraining runs" in text
    assert "the finetuning samples are the same in every run and are held fixed" in text


def test_the_selection_mode_says_when_the_calculations_were_refit_on_the_whole_budget(tmp_path):
    text, sdir = _study(tmp_path, ct_floor=0.5, ad_floor=0.5)
    assert "**Selection mode: honest**" in text  # rows from before the field: no refit column
    for f in (sdir / "trials").glob("*.json"):
        trial = json.loads(f.read_text())
        (f).write_text(json.dumps({**trial, "refit": True}))
    collect_results(sdir)
    assert "**Selection mode: honest, refit**" in write_report(sdir).read_text()


def test_the_report_says_what_the_heads_read_and_rows_from_before_the_field_read_the_last_layer(tmp_path):
    text, sdir = _study(tmp_path, ct_floor=0.5, ad_floor=0.5)
    assert "**Head input: last:first**" in text  # rows from before the field: no head_input column
    for f in (sdir / "trials").glob("*.json"):
        trial = json.loads(f.read_text())
        (f).write_text(json.dumps({**trial, "head_input": "all:mean"}))
    collect_results(sdir)
    assert "**Head input: all:mean**" in write_report(sdir).read_text()


def test_the_baselines_paragraph_describes_only_the_tasks_of_the_report(tmp_path):
    trials = [{"calc_id": f"CT-{col}-{fold}", "row": "CT", "col": col, "model_key": col, "model_id": col,
               "node": "local", "ft_task": "ct", "ft_fold": fold, "ft_seed": 0, "ft_budget": 200,
               "selection": "honest", "accuracy": acc, "perplexity": 2.0, "best_accuracy": acc,
               "perplexity_at_best_accuracy": 2.0, "epochs": 3, "baseline_majority": 0.5, "baseline_lexicon": 0.7,
               "baseline_best": 0.7, "baseline_best_name": "lexicon"}
              for col, acc in (("all*", 0.8), ("-whp*", 0.75)) for fold in range(5)]
    text, _ = write_toy_study(tmp_path, "ct-only", "CT only", trials)
    para = text[text.index("## Context-free baselines"):].split("\n\n")[1]
    assert "CT: lexicon" in para and "AD:" not in para and "span matcher" not in para

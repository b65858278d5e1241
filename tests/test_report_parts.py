"""AD read by pair kind in the report (issue #65): every AD table gets, under it, each model's accuracy on the whole
test set, on positives vs mutated negatives (the PAD-aligned part) and on positives vs pseudo-acronym negatives, read
from the per-unit parts every calculation records; the claim is tested again on the PAD-aligned part as a secondary
test, never bold, and the claims' family is left as it was. From hand-made results, no Ray, no model."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from toy_study import write_toy_study

from alignlab.platform.fel.zero_shot import ZERO_SHOT_FILE, ZERO_SHOT_VERSION
from alignlab.platform.report.parts import part_rows, part_tables
from alignlab.platform.report.report import all_comparisons, baseline_of, claimed_cells, collect_results, write_report
from alignlab.platform.report.significance import CLAIM, SECONDARY, bold_cells

SNIPPETS = 40  # per fold; even snippets have a mutated negative, odd ones a pseudo acronym


def _trials(with_parts: bool = True) -> list[dict]:
    """AD, five folds x two seeds: `all*` gets every mutated snippet right and half of the pseudo ones (a PAD solver's
    pattern), `-pad*` and `same*` are at chance everywhere; the span matcher is right on every mutated snippet and on
    one pair of every pseudo one. The out-of-domain set (`ood`) has the same layout."""
    rng = np.random.default_rng(3)
    trials = []
    for col in ("all*", "-pad*", "same*"):
        for fold in range(5):
            for seed in range(2):
                row = {"calc_id": f"AD-{col}-{fold}-{seed}", "row": "AD", "col": col, "ft_task": "ad", "model_key": col,
                       "model_id": f"m-{col}", "node": "local", "ft_fold": fold, "ft_seed": seed, "ft_budget": 200,
                       "selection": "honest", "perplexity": 2.0, "perplexity_at_best_accuracy": 2.0, "epochs": 3}
                for prefix in ("", "eval_ood_"):
                    keys = [f"{prefix}snip{fold}-{i}" for i in range(SNIPPETS)]
                    parts = ["mutate" if i % 2 == 0 else "pseudo" for i in range(SNIPPETS)]
                    if col == "all*":
                        correct = [2 if p == "mutate" else int(rng.integers(0, 3)) for p in parts]
                    else:
                        correct = [int(x) for x in rng.binomial(2, 0.5, SNIPPETS)]
                    span = [2 if p == "mutate" else 1 for p in parts]
                    acc = sum(correct) / (2 * SNIPPETS)
                    row.update({f"{prefix}accuracy": acc, f"{prefix}perplexity": 2.0,
                                f"{prefix}unit_keys": keys, f"{prefix}unit_count": [2] * SNIPPETS,
                                f"{prefix}unit_correct": correct,
                                f"{prefix}baseline_majority": 0.5, f"{prefix}baseline_span_matcher": sum(span) / 80,
                                f"{prefix}baseline_best": sum(span) / 80, f"{prefix}baseline_best_name": "span_matcher",
                                f"{prefix}unit_count_baseline_majority": [2] * SNIPPETS,
                                f"{prefix}unit_correct_baseline_majority": [1] * SNIPPETS,
                                f"{prefix}unit_count_baseline_span_matcher": [2] * SNIPPETS,
                                f"{prefix}unit_correct_baseline_span_matcher": span})
                    if with_parts:
                        row[f"{prefix}unit_parts"] = parts
                row.update(best_accuracy=row["accuracy"], unit_correct_at_best_accuracy=row["unit_correct"])
                trials.append(row)
    return trials


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(report text, study dir) of the toy AD study, written once for the tests that only read it."""
    return write_toy_study(tmp_path_factory.mktemp("parts"), "parts", "Parts", _trials(), baseline_col="-pad*",
                           claims=[["AD", "all*"]])


def _part_table(text: str, after: str) -> list[list[str]]:
    """The rows of the first by-part table after the heading `after`, split into cells."""
    tail = text[text.index(after):]
    table = []
    for x in tail[tail.index("AD by part"):].splitlines()[2:]:
        if not x.startswith("|"):
            break
        table.append([c.strip() for c in x.strip().strip("|").split("|")])
    return table


def test_every_ad_table_shows_accuracy_on_each_pair_kind_beside_the_whole(study):
    text, sdir = study
    df = pd.read_parquet(sdir / "results.parquet")
    for heading, metric in (("## Accuracy at the best-perplexity epoch", "accuracy"),
                            ("## Best accuracy", "best_accuracy"), ("## Test set `ood`", "eval_ood_accuracy")):
        table = _part_table(text, heading)
        header, rows = table[0], {r[0]: r for r in table[2:]}
        assert header[1] == "all" and header[2].startswith("mutate: positives vs mutated negatives (PAD-aligned)")
        assert header[3].startswith("pseudo: positives vs pseudo-acronym negatives")
        aligned = df[df["col"] == "all*"]
        mutate = part_rows(aligned, metric, "mutate")[metric] * 100
        pseudo = part_rows(aligned, metric, "pseudo")[metric] * 100
        assert rows["all*"][1] == f"{aligned[metric].mean() * 100:.1f} ± {aligned[metric].std() * 100:.1f}"
        assert rows["all*"][2] == "100.0 ± 0.0" and mutate.mean() == 100.0
        assert rows["all*"][3] == f"{pseudo.mean():.1f} ± {pseudo.std():.1f}"
        # The strongest rule on each part is picked on that part: the span matcher is perfect on the mutated one.
        assert rows["strongest context-free"][2] == "100.0 (span_matcher)"
        assert rows["strongest context-free"][3] == "50.0 (majority)" or rows["strongest context-free"][3] == \
            "50.0 (span_matcher)"
        assert not any("**" in c for r in table for c in r), "a by-part table is never bold"


def test_a_part_keeps_its_own_units_and_recomputes_every_accuracy_from_them():
    df = pd.DataFrame(_trials())
    one = df.iloc[[0]]
    part = part_rows(one, "accuracy", "pseudo")
    parts = one["unit_parts"].iloc[0]
    want = [c for c, p in zip(one["unit_correct"].iloc[0], parts) if p == "pseudo"]
    assert list(part["unit_correct"].iloc[0]) == want
    assert list(part["unit_keys"].iloc[0]) == [k for k, p in zip(one["unit_keys"].iloc[0], parts) if p == "pseudo"]
    assert part["accuracy"].iloc[0] == pytest.approx(sum(want) / (2 * len(want)))
    assert part["baseline_span_matcher"].iloc[0] == 0.5 and "baseline_best" not in part.columns
    # Another test set's lists are left whole.
    assert len(part["eval_ood_unit_keys"].iloc[0]) == SNIPPETS


def test_the_claim_is_tested_again_on_the_pad_aligned_part_as_a_secondary_test_never_bold(study):
    text, sdir = study
    declared = json.loads((sdir / "study.json").read_text())
    df = pd.read_parquet(sdir / "results.parquet")
    tests = all_comparisons(df, baseline_of(df, declared), claims=claimed_cells(declared))
    on_part = [c for c in tests if c.metric.endswith("(mutate part)")]
    assert {(c.metric, c.row, c.col) for c in on_part} == {("accuracy (mutate part)", "AD", "all*"),
                                                          ("eval_ood_accuracy (mutate part)", "AD", "all*")}
    assert all(c.family == SECONDARY and c.against == "-pad*" for c in on_part)
    assert all(c.significant and c.ev.design == "nested" for c in on_part), "all* is right on every mutated snippet"
    assert all(key[0] in ("accuracy",) for key in bold_cells(tests)), "only the claim's own metric can be bold"
    sig = text[text.index("## Significance"):]
    line = next(x for x in sig.splitlines() if x.startswith("| secondary and exploratory | accuracy (mutate part) |"))
    assert "| AD | all* | -pad* (baseline model) |" in line
    # The claims' family is what it was without parts: the same tests, the same Holm p.
    plain = pd.DataFrame(_trials(with_parts=False))
    before = [c for c in all_comparisons(plain, baseline_of(plain, declared), claims=claimed_cells(declared))
              if c.family == CLAIM]
    after = [c for c in tests if c.family == CLAIM]
    assert [(c.metric, c.col, c.kind, c.p_holm) for c in before] == [(c.metric, c.col, c.kind, c.p_holm) for c in after]
    assert part_tables(plain, "accuracy") == [], "results without parts get no by-part table"


def test_the_zero_shot_pad_head_is_one_number_per_model_in_the_ad_tables(study, tmp_path):
    text, sdir = study
    assert "zero-shot" not in text.lower(), "no zero-shot file: no column"
    sdir = Path(shutil.copytree(sdir, tmp_path / "parts"))
    declared = json.loads((sdir / "study.json").read_text())
    declared["models"] = {k: {"model_id": f"m-{k}", "pretrain": {"objectives": []}} for k in ("all*", "-pad*", "same*")}
    (sdir / "study.json").write_text(json.dumps(declared))
    rec = {"accuracy": 0.608, "count": 1200, "parts": {"mutate": 0.99, "pseudo": 0.226}}
    zero_shot = {"version": ZERO_SHOT_VERSION, "task_id": "t", "models": {
        "m-all*": {"ad": {"head": "pad", "sets": {"test": rec, "ood": {**rec, "accuracy": 0.74}}}},
        "m--pad*": {"ad": {}}}}
    (sdir / ZERO_SHOT_FILE).write_text(json.dumps(zero_shot))
    collect_results(sdir)
    text = write_report(sdir).read_text()
    table = _part_table(text, "## Accuracy at the best-perplexity epoch")
    assert table[0][-1] == "zero-shot PAD head (all / mutate / pseudo)"
    rows = {r[0]: r for r in table[2:]}
    assert rows["all*"][-1] == "60.8 / 99.0 / 22.6" and rows["-pad*"][-1] == "–" and rows["same*"][-1] == "–"
    assert _part_table(text, "## Test set `ood`")[2][-1].startswith("74.0 / ")
    assert "zero-shot" not in _part_table(text, "## Best accuracy")[0][-1], "once per test set, not per epoch rule"
    # Results without parts (older trials, or a task without them) still show the number, in one line.
    line = part_tables(pd.DataFrame(_trials(with_parts=False)), "accuracy", zero_shot, declared)[0]
    assert line.startswith("AD: zero-shot PAD head (") and line.endswith("): all* 60.8, -pad* –, same* –.")


def test_a_column_of_several_pretraining_runs_shows_the_mean_of_its_models_zero_shot_pad_heads():
    trials = _trials()
    for row in trials:  # all*'s first folds come from one pretraining run, its last from another
        if row["col"] == "all*" and row["ft_fold"] >= 3:
            row.update(model_key="all*@seed1", model_id="m-all*@seed1", pretrain_seed=1)
    declared = {"models": {k: {"model_id": f"m-{k}", "pretrain": {"objectives": []}}
                           for k in ("all*", "all*@seed1", "-pad*", "same*")}}
    sets = lambda acc, mutate: {"test": {"accuracy": acc, "count": 80, "parts": {"mutate": mutate, "pseudo": 0.5}}}
    zero_shot = {"version": ZERO_SHOT_VERSION, "task_id": "t", "models": {
        "m-all*": {"ad": {"head": "pad", "sets": sets(0.6, 0.7)}},
        "m-all*@seed1": {"ad": {"head": "pad", "sets": sets(0.8, 0.9)}}}}
    lines = part_tables(pd.DataFrame(trials), "accuracy", zero_shot, declared)
    rows = {ln.split(" | ")[0].strip("| "): ln.rstrip(" |").split(" | ")[-1] for ln in lines if ln.startswith("| ")}
    assert rows["all*"] == "70.0 / 80.0 / 50.0" and rows["-pad*"] == "–"
    assert any("the mean of its 2 pretraining runs' models" in ln for ln in lines)
    del zero_shot["models"]["m-all*@seed1"]
    rows = {ln.split(" | ")[0].strip("| "): ln.rstrip(" |").split(" | ")[-1]
            for ln in part_tables(pd.DataFrame(trials), "accuracy", zero_shot, declared) if ln.startswith("| ")}
    assert rows["all*"] == "–", "a run without a record leaves no mean that could hide it"

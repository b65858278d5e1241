"""The FEL protocol hears a moderate signal: an oracle feature of known Bayes accuracy injected into the AD head's
input (benchmarks/statistics/fel_sensitivity.py) comes back through the real `finetune_calculation`, with the mini preset's
settings and the logistic head, at close to its level; and a logistic head is refused where it cannot work, and
a saved one serves the scores it was tested with."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "statistics"))  # as when the script is run
import fel_sensitivity  # noqa: E402

from alignlab.platform.config import to_dict
from alignlab.platform.fel.finetune import finetune_calculation, load_finetuned, load_pretrained, save_finetuned
from alignlab.platform.fel.finetune_config import FinetuneConfig
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.fel.task_scoring import evaluate_examples
from alignlab.platform.tasks.task import task as task_named

POINTS = calculations()[:4]  # folds 0 and 1, both seeds: the benchmark runs all ten


@pytest.fixture(scope="module")
def untrained_mini(tmp_path_factory):
    torch.set_num_threads(1)
    return load_pretrained(fel_sensitivity.untrained_mini(tmp_path_factory.mktemp("sensitivity")))


@pytest.fixture(scope="module")
def data():
    return fel_sensitivity.shipped_ad()


def sensitive() -> FinetuneConfig:
    return fel_sensitivity.settings("mini", ["head=logistic"])


def test_the_oracle_feature_is_exactly_as_good_as_its_level_on_every_fold(data):
    for level in (0.61, 0.75):
        noisy = fel_sensitivity.noisy_labels(data, level)
        for idx in fel_sensitivity.snippet_folds(data.ad):
            hits = [noisy[(data.ad[i].acronym, data.ad[i].snippet)] == data.ad[i].label for i in idx]
            assert abs(sum(hits) / len(hits) - level) <= 1 / len(hits)


@pytest.fixture(scope="module")
def recovered(untrained_mini, data):
    return fel_sensitivity.run(untrained_mini, data, sensitive(), (0.75, 0.61), POINTS, standardise=False)


def test_a_75_percent_feature_comes_back_at_70_or_more_in_every_calculation(recovered):
    assert min(recovered[0.75]["accuracy"]) >= 70.0, recovered[0.75]


# The goal of issue #65. On the out-of-domain pairs filtered to PAD's word rule (332 snippets) the 61% feature comes
# back at 61.2-61.4 in every one of the ten calculations (docs/fel.md); on the 446 snippets before, with the mini
# architecture's [CLS] exempt from the distance bias, it came back at 54.8 on folds 0-1 (50.0 in two calculations).
def test_a_61_percent_feature_comes_back_at_57_or_more_on_average(recovered):
    assert statistics.mean(recovered[0.61]["accuracy"]) >= 57.0, recovered[0.61]


def test_a_logistic_head_needs_frozen_features_and_honest_selection():
    with pytest.raises(ValueError, match="scheme 'pred' and honest selection"):
        FinetuneConfig(task="ad", head="logistic", scheme="pred+trm")
    with pytest.raises(ValueError, match="scheme 'pred' and honest selection"):
        FinetuneConfig(task="ad", head="logistic", selection="paper")
    assert "head" not in to_dict(FinetuneConfig(task="ad")), "the default head leaves every existing id as it was"
    assert to_dict(FinetuneConfig(task="ad", head="logistic"))["head"] == "logistic"


def test_a_saved_logistic_head_scores_its_test_set_as_the_calculation_did(untrained_mini, data, tmp_path):
    ad, cfg = task_named("ad"), sensitive()
    train, val, test = fel_split(data, ad, cfg)
    calc = finetune_calculation(untrained_mini, cfg, train, test, val=val)
    assert calc.row["epochs"] == 0 and calc.row["num_train"] == len(train) + len(val)
    fin = load_finetuned(save_finetuned(tmp_path, untrained_mini, cfg, calc))
    again = evaluate_examples(fin.model, ad, test, fin.tok)
    assert again["accuracy"] == pytest.approx(calc.row["accuracy"])
    assert again["perplexity"] == pytest.approx(calc.row["perplexity"], rel=1e-4)

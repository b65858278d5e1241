"""The study's claims are a Holm family of their own: a claim is one intersection-union test (above its baseline
model and above the strongest context-free baseline, p = the larger of the two), Holm runs over the claims alone,
and only a claim can be bold; every other test is a labelled family of its own. A claim that is not bold says
whether its gain is excluded (the upper bound is below what the design could detect) or the study is too small to
tell, with the effect it could detect at 80% power computed from its own variance parts."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from alignlab.platform.fel.protocol import calculations
from alignlab.platform.report.report import all_comparisons
from alignlab.platform.report.significance import (CLAIM, FLOOR, MODEL, SECONDARY, Comparison, bold_cells,
                                                   correct_family, reading)
from alignlab.platform.report.unit_statistics import Evidence, holm

POINTS = calculations()
BASE = np.array([0.52, 0.71, 0.60, 0.80, 0.55, 0.66, 0.74, 0.58, 0.69, 0.62])
GAIN = np.array([0.010, 0.025, 0.015, 0.030, 0.005, 0.020, 0.035, 0.012, 0.018, 0.027])


def _cell(values) -> pd.DataFrame:
    return pd.DataFrame({"ft_fold": [f for f, _ in POINTS], "ft_seed": [s for _, s in POINTS],
                         "accuracy": list(values)})


def _ev(diff: float, p: float, se: float = 0.004, df: float = 4.0) -> Evidence:
    return Evidence(diff, p=p, se=se, df=df, parts=((se ** 2, df),))


def test_holm_runs_over_the_claims_alone_and_only_a_claim_is_bold():
    df = pd.concat([_cell(v).assign(row="CT", col=c, perplexity=2.0)
                    for c, v in (("base", BASE), ("claimed", BASE + GAIN), ("other", BASE + GAIN * 1.1),
                                 ("third", BASE + GAIN[::-1]))], ignore_index=True)
    tests = all_comparisons(df.assign(best_accuracy=df["accuracy"]), {"CT": ("CT", "base")}, claims={("CT", "claimed")})
    claim = [c for c in tests if c.family == CLAIM]
    assert [(c.metric, c.col, c.kind) for c in claim] == [("accuracy", "claimed", MODEL)]
    assert claim[0].p_holm == claim[0].ev.p / 2, "one claim: its one-sided p, which Holm leaves as it is"
    others = [c for c in tests if c.family == SECONDARY]
    assert len(others) == 5  # other and third on accuracy; all three on best accuracy
    assert [c.p_holm for c in others] == pytest.approx(list(holm([c.ev.p for c in others])))
    assert all(c.significant for c in others[:2]), "significant, and still not bold: not a claim"
    bold = bold_cells(tests)
    assert bold == {("accuracy", "CT", "claimed"): True}


def test_a_claims_p_is_the_larger_of_its_two_tests_and_holm_runs_over_claims():
    tests = [Comparison("accuracy", "CT", "all*", MODEL, "-whp*", _ev(0.01, 0.001), family=CLAIM),
             Comparison("accuracy", "CT", "all*", FLOOR, "lexicon", _ev(0.05, 0.06), family=CLAIM),
             Comparison("accuracy", "AD", "all*", MODEL, "-pad*", _ev(0.01, 0.2), family=CLAIM),
             Comparison("accuracy", "AD", "all*", FLOOR, "span", _ev(0.05, 0.001), family=CLAIM),
             Comparison("best_accuracy", "CT", "all*", MODEL, "-whp*", _ev(0.01, 0.0001))]
    out = correct_family(tests)
    # One-sided: CT's claim p is 0.03 (its floor's), AD's 0.1 (its baseline model's): Holm gives 0.06 and 0.1 --
    # neither bold, although CT's test against its baseline model alone (p 0.0005) would have been.
    assert [c.p_holm for c in out[:4]] == pytest.approx([0.06, 0.06, 0.1, 0.1])
    assert all(c.level == 0.05 for c in out[:4]), "one-sided 0.025: the two-sided level of the same critical value"
    assert bold_cells(out) == {("accuracy", "CT", "all*"): False, ("accuracy", "AD", "all*"): False}
    assert out[4].p_holm == pytest.approx(0.0001) and out[4].significant, "a family of its own (one test)"
    assert reading(out[:2]) == "above the baseline model, not above the strongest context-free baseline"
    # A loss is no gain, whatever its p.
    loss = [Comparison("accuracy", "CT", "all*", MODEL, "-whp*", _ev(-0.02, 0.0001), family=CLAIM)]
    assert correct_family(loss)[0].p_holm == pytest.approx(1 - 0.00005) and not bold_cells(correct_family(loss))[
        ("accuracy", "CT", "all*")]
    # With the floor's p below the baseline model's, both claims pass Holm: bold.
    tests[1] = Comparison("accuracy", "CT", "all*", FLOOR, "lexicon", _ev(0.05, 0.0005), family=CLAIM)
    tests[2] = Comparison("accuracy", "AD", "all*", MODEL, "-pad*", _ev(0.01, 0.02), family=CLAIM)
    assert bold_cells(correct_family(tests)) == {("accuracy", "CT", "all*"): True, ("accuracy", "AD", "all*"): True}


def test_the_detectable_effect_has_the_stated_power_at_the_claims_level():
    for df in (2.0, 4.0, 30.0):
        ev = _ev(0.0, 0.5, se=0.004, df=df)
        mde = ev.detectable(0.025, 0.8)
        # The estimate's t under a true gain of mde is a noncentral t: it clears the 0.025 critical value 80% of the
        # time (Monte Carlo over the estimate and its standard error, not the formula under test).
        rng = np.random.default_rng(int(df))
        est = rng.normal(mde, 0.004, 200_000)
        se = 0.004 * np.sqrt(rng.chisquare(df, 200_000) / df)
        power = np.mean(est / se > sps.t.isf(0.0125, df))
        assert power == pytest.approx(0.8, abs=0.01), (df, power)


def test_a_claim_that_is_not_bold_reads_excluded_or_inconclusive():
    def claim(diff, p, se):
        return correct_family([Comparison("accuracy", "CT", "all*", MODEL, "-whp*", _ev(diff, p, se, 30.0),
                                          family=CLAIM)])

    # A TOST-like reading at the claim's level: excluded when even the upper bound is below the detectable effect
    # (the difference below about 0.85 standard errors), inconclusive when the interval reaches past it.
    tight = claim(0.001, 0.6, 0.002)     # upper bound +0.4 points, detectable about 0.5: excluded
    assert reading(tight).startswith("excluded: the gain is below +0.")
    wide = claim(0.010, 0.11, 0.006)     # upper bound +2.0 points, detectable about 1.5: inconclusive
    text = reading(wide)
    assert text.startswith("inconclusive: smaller than the detectable +")
    mde = float(text.split("+")[1].split(" ")[0])
    assert mde == pytest.approx(100 * wide[0].ev.detectable(0.1), abs=0.01), "one claim: one-sided 0.05"
    assert reading(claim(0.02, 0.001, 0.004)) == "**bold**: a gain"
    assert not math.isnan(wide[0].level)


def test_a_claim_on_a_row_whose_positive_control_failed_reads_cannot_tell_not_excluded():
    from alignlab.platform.report.significance import CONTROL, UNTRAINED, claims_section

    claim = correct_family([Comparison("accuracy", "AD", "all*", MODEL, "-pad*", _ev(0.001, 0.6, 0.002, 30.0),
                                       family=CLAIM)])
    assert reading(claim).startswith("excluded: the gain is below +0.")
    assert reading(claim, control_failed=True).startswith("cannot tell: the row's positive control failed")

    def control(diff, p):
        return Comparison("accuracy", "AD", "all*", UNTRAINED, "untrained", _ev(diff, p, 0.002, 30.0), family=CONTROL)

    failed = claims_section(claim + correct_family([control(0.001, 0.6)]))
    assert "cannot tell: the row's positive control failed" in failed[-1] and "excluded" not in failed[-1]
    passed = claims_section(claim + correct_family([control(0.05, 1e-6)]))
    assert "excluded: the gain is below" in passed[-1]


def test_a_fold_without_a_partner_is_left_out_and_the_note_says_so():
    from alignlab.platform.report.significance import against_model

    sub = _cell(BASE + GAIN)
    base = _cell(BASE)
    base = base[base["ft_fold"] != 4]
    ev = against_model(sub, base, "accuracy")
    assert ev.n_replicates == 4 and "fold(s) 4 without a partner left out" in ev.outcome
    assert "without a partner" not in against_model(sub, _cell(BASE), "accuracy").outcome


def test_a_report_warns_when_its_finetuning_samples_overlap_heavily(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report_effects import _study

    from alignlab.platform.report.report import write_report

    text, sdir = _study(tmp_path)
    assert "overlap heavily" not in text
    study = json.loads((sdir / "study.json").read_text())
    study["sample_overlap"] = {"ct": {"budget": 150, "pool": 155, "overlap": 0.968}}
    (sdir / "study.json").write_text(json.dumps(study))
    text = write_report(sdir).read_text()
    assert "**CT's finetuning samples overlap heavily:** each draws 150 of the pool's 155 examples" in text
    assert "about 97% of theirs" in text and "does not generalise over other samples" in text

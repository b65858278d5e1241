"""`alignlab plan STUDY --detect POINTS --power P [--from REPORT]`: the pretraining runs x finetuning samples each
claim needs to show a gain with the given power, simulated as the report decides, from a report's own variance
components or the committed mini report's; the test set's own part is a floor no design goes below."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from alignlab.platform.report import power as plan_power


def test_power_grows_with_the_effect_and_the_runs_and_a_null_is_rarely_called():
    c = plan_power.defaults()["ct"]
    assert plan_power.power(dataclasses.replace(c, run=0.0), 0.0, 1, 5, 0.025) < 0.035
    # One run decides about two pretrained models: equal recipes whose runs drew apart are called a gain often;
    # across three runs they are not.
    assert plan_power.power(c, 0.0, 1, 5, 0.025) > 0.1 and plan_power.power(c, 0.0, 3, 5, 0.025) < 0.035
    assert plan_power.power(c, 0.005, 1, 5, 0.025) < plan_power.power(c, 0.015, 1, 5, 0.025)
    ad = plan_power.defaults()["ad"]
    assert plan_power.power(ad, 0.02, 3, 5, 0.025) < plan_power.power(ad, 0.02, 10, 5, 0.025)


def test_with_one_part_the_simulated_power_is_the_noncentral_t():
    from scipy import stats as sps

    c = plan_power.Components("ad", fold=4e-4, units=0.0, units_df=math.inf, run=0.0, source="x", run_source="x")
    se = math.sqrt(4e-4 / 5)
    p = plan_power.power(c, 3 * se, 1, 5, 0.025, sims=200_000)
    assert p == pytest.approx(float(sps.nct.sf(sps.t.isf(0.025, 4), 4, 3.0)), abs=0.01)


def test_the_test_sets_part_limits_what_any_design_can_show():
    c = plan_power.defaults()["ct"]
    limit = plan_power.test_set_limit(c, 0.8, 0.025)
    assert 0.004 < limit < 0.008
    assert plan_power.power(c, 0.9 * limit, 20, 20, 0.025) < 0.8


def test_a_plan_from_a_report_reads_its_claims_components(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report_effects import _study

    _, sdir = _study(tmp_path)
    comps = plan_power.components_from(sdir)
    assert set(comps) == {"ct", "ad"}
    # The toy scores are independent coin flips: no units part of their own, the folds carry the variance.
    assert comps["ct"].fold > 0 and comps["ct"].units == 0 and comps["ad"].units == 0
    # One run: the run part is not the report's own but the default's (CT's measured by the 3-run mini study).
    assert comps["ct"].run_source == plan_power.defaults()["ct"].run_source and sdir.name in comps["ct"].source
    assert "assumed" in comps["ad"].run_source
    with pytest.raises(ValueError, match="not a study folder"):
        plan_power.components_from(tmp_path)


def test_alignlab_plan_prints_the_designs_a_claim_needs(tmp_path, capsys):
    from alignlab.platform.cli import main

    main(["plan", "objective_ablation", "--preset", "mini", "--storage", str(tmp_path), "--detect", "1.5"])
    out = capsys.readouterr().out
    assert "Power plan: the runs x finetuning samples to show a gain of 1.5 points with 80% power" in out
    assert "one-sided p < 0.025: 0.05 over 2 claims" in out
    ct = out[out.index("  CT (components"):out.index("  AD (components")]
    assert "run variance measured: 0.29 points per run and recipe (objective_ablation_mini_3pretrain_seeds" in ct
    assert "1 pretraining run x 5 finetuning samples" in ct
    assert "run variance assumed: 1.0 points" in out[out.index("  AD (components"):]
    assert "limits the detectable gain to" in ct
    try:  # a study run is refused --detect, with a one-line error and a non-zero exit
        code = main(["study", "objective_ablation", "--preset", "mini", "--storage", str(tmp_path), "--detect", "1"])
    except SystemExit as e:
        code = e.code
    assert code not in (0, None)
    assert "--detect plans a study: use it with --dry-run" in capsys.readouterr().err

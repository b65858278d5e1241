"""The null control end to end on a real local Ray: one smoke model as two columns that differ only in their
finetuning seeds (`studies/null_control.py`), all five folds; the report decides every comparison over the folds
and the test units and calls nothing significant, so nothing is bold."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from alignlab.platform.study.run import run_study
from alignlab.studies import null_control


# -m slow (~35 s): the study's 40 calculations. The default run checks the decision's false positives under a null
# with the design's variance by simulation (test_calibration.py, test_unit_statistics.py).
@pytest.mark.slow
@pytest.mark.ray
def test_an_a_a_study_of_one_model_and_other_seeds_has_nothing_bold(ray_session, storage_root):
    study = null_control.build("smoke")
    report = run_study(study, storage_root, progress=False)  # the session's root: its corpus, maybe its model
    df = pd.read_parquet(report.parent / "results.parquet")
    assert len(df) == 40 and set(df["col"]) == {"A", "A'"} and df["model_id"].nunique() == 1
    text = report.read_text()
    assert "**" not in next(x for x in text.splitlines() if x.startswith("| CT |"))
    sig = text[text.index("## Significance"):]
    header = next(x for x in sig.splitlines() if x.startswith("| family |")).split(" | ")
    rows = [x.split(" | ") for x in sig.splitlines() if x.startswith("| ") and len(x.split(" | ")) == len(header)
            and x.split(" | ")[1].endswith("accuracy")]
    models = [r for r in rows if r[header.index("against")].endswith("(baseline model)")]
    assert models, "every column is compared with the baseline model"
    for r in models:
        assert r[header.index("significant gain")] == "no", r
        assert r[header.index("replicates")] in ("5 folds", "–"), r
        p = r[header.index("p")]
        assert p == "–" or float(p) >= 0.05 or math.isnan(float(p)), r
    designs = {(r[header.index("row")], r[header.index("design")]) for r in models}
    assert ("CT", "crossed") in designs or ("CT", "–") in designs

"""Every report says which code, machine and versions produced its numbers: the study records its provenance when it
runs (commit, whether the tree had uncommitted changes, date, machine, torch, Ray, Python), each calculation its
commit, and the report's header names them."""
from __future__ import annotations

import json
import re

from toy_study import write_toy_study

from alignlab.platform.report.report import collect_results, write_report
from alignlab.platform.runtime.provenance import code_commit, describe_commit, provenance


def test_the_provenance_names_this_checkouts_commit_the_machine_and_the_versions():
    import ray
    import torch

    prov = provenance()
    commit, dirty = code_commit()
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and isinstance(dirty, bool), "the tests run from a git checkout"
    assert prov["commit"] == commit and prov["torch"] == torch.__version__ and prov["ray"] == ray.__version__
    assert prov["machine"] and re.fullmatch(r"\d{4}-\d\d-\d\d", prov["date"])
    assert describe_commit({"commit": "a" * 40, "dirty": True}) == "aaaaaaa (with uncommitted changes)"
    assert describe_commit({"commit": "unknown", "dirty": None}) == "unknown"


def _trials(commit: str) -> list[dict]:
    return [{"calc_id": f"CT-{col}-{fold}", "row": "CT", "col": col, "model_key": col, "model_id": col, "node": "local",
             "ft_fold": fold, "ft_seed": 0, "ft_budget": 200, "selection": "honest", "accuracy": acc + 0.01 * fold,
             "perplexity": 2.0, "best_accuracy": acc, "perplexity_at_best_accuracy": 2.0, "epochs": 3,
             "commit": commit} for col, acc in (("all*", 0.8), ("-whp*", 0.7)) for fold in range(5)]


def test_the_report_header_names_the_commit_the_machine_the_versions_and_other_commits_of_its_calculations(tmp_path):
    text, sdir = write_toy_study(tmp_path, "prov", "Provenance", _trials("b" * 40))
    assert "**Provenance:** not recorded" in text
    study = json.loads((sdir / "study.json").read_text())
    study["provenance"] = {"commit": "c" * 40, "dirty": False, "date": "2026-11-28", "machine": "2-core AMD EPYC",
                           "torch": "2.13.0+cpu", "ray": "2.60.0", "python": "3.11.7"}
    (sdir / "study.json").write_text(json.dumps(study))
    collect_results(sdir)
    header = next(x for x in write_report(sdir).read_text().splitlines() if x.startswith("**Provenance:**"))
    assert "commit ccccccc (clean)" in header and "FEL calculations at " + "b" * 40 + " (10)" in header
    assert "2-core AMD EPYC" in header and "torch 2.13.0+cpu" in header and "Ray 2.60.0" in header
    assert "run on 2026-11-28" in header
    from alignlab.platform.runtime.provenance import code_commit

    writer = code_commit()[0]  # a re-rendered report names the code that wrote its verdicts, not only the study's
    assert f"This report (its verdicts) written by commit {writer[:7] if len(writer) == 40 else writer}" in header

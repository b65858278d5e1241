"""A study folder written from hand-made trial rows (no Ray, no model): study.json, trials/, then the report, for
tests of what the report makes of given results."""
from __future__ import annotations

import json
from pathlib import Path

from alignlab.platform.report.report import collect_results, write_report


def write_toy_study(tmp_path: Path, name: str, title: str, trials: list[dict],
                    baseline_col: str = "-whp*", claims: list | None = None) -> tuple[str, Path]:
    """Write `trials` (each with calc_id, row, col) as a finished study and its report; (report text, study dir).
    `claims`: the study's declared (row, col) claims (None: none declared, every compared cell is claimed)."""
    sdir = tmp_path / "studies" / name
    (sdir / "trials").mkdir(parents=True)
    for r in trials:
        (sdir / "trials" / f"{r['calc_id']}.json").write_text(json.dumps(r))
    (sdir / "study.json").write_text(json.dumps({
        "name": name, "title": title, "baseline_col": baseline_col, "baseline_cells": [], "plots": ["bars"],
        "notes": "", "claims": claims or [], "corpus_dir": str(tmp_path / "corpus" / "c"), "task_dir": "", "models": {},
        "calculations": [r["calc_id"] for r in trials],
        "cells": {r["calc_id"]: {"row": r["row"], "col": r["col"], "group": r["row"]} for r in trials},
        "searches": []}))
    collect_results(sdir)
    return write_report(sdir).read_text(), sdir

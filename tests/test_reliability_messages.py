"""Issue #46, the unclear messages and an FEL calculation's out-of-memory: a budget that honest selection's
validation split takes whole, a registry entry whose config.json is damaged, a zero-length trial file, and a
calculation that runs out of memory. Through the real command line where a user meets them; no Ray needed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_faults_runtime import _ft, tiny_root  # noqa: E402,F401 -- the same tiny model and task data
from alignlab.platform.tasks.task import task as task_named

ALIGNLAB = [sys.executable, "-m", "alignlab.platform.cli"]


def _run(cmd: list[str], cwd: Path, timeout: float = 180) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ALIGNLAB_DEBUG", "RAY_ADDRESS")}
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr


# ---------------------------------------------------------------- a budget the validation split takes whole


def test_a_budget_that_the_validation_split_takes_whole_is_refused_naming_the_budget_that_works(tiny_root, tmp_path):
    root, mdir, tdir = tiny_root
    code, out = _run(ALIGNLAB + ["finetune", "--model", mdir.name, "--task", "ct", "--budget", "2", "--preset", "smoke",
                                 "--storage", str(root), "--tasks-dir", str(tdir)], tmp_path)
    assert code == 2 and "Traceback" not in out, out
    assert "no CT examples to encode" not in out, out
    (line,) = [l for l in out.splitlines() if l.startswith("alignlab: ")]
    assert "CT budget 2 in honest selection" in line and "validation split" in line, line
    assert "takes the whole budget" in line and "--budget 3 or more" in line and "--selection paper" in line, line


def test_the_smallest_budget_the_message_names_does_train_and_the_one_below_does_not(tiny_root):
    from alignlab.platform.fel.protocol import fel_split
    from alignlab.platform.tasks.task_data import TaskData

    _, _, tdir = tiny_root
    data = TaskData.load(tdir)
    with pytest.raises(ValueError, match="use --budget 3 or more"):
        fel_split(data, task_named("ct"), _ft(budget=2))
    train, val, _ = fel_split(data, task_named("ct"), _ft(budget=3))
    assert len(train) == 1 and len(val) == 2
    assert len(fel_split(data, task_named("ct"), _ft(budget=2, selection="paper"))[0]) == 2  # paper selection has no split


# ---------------------------------------------------------------- a registry entry with a damaged config.json


@pytest.mark.parametrize("text", ["{}", "", '{"model_id": "x", "pretrain": {"model": {}}}'])
def test_a_registry_entry_whose_config_is_damaged_is_listed_as_broken_naming_the_file_and_the_others_still_listed(
        tiny_root, tmp_path, text):
    import shutil

    root, mdir, _ = tiny_root
    reg = tmp_path / "reg"
    shutil.copytree(mdir, reg / "models" / mdir.name)
    bad = reg / "models" / "zz-damaged"
    bad.mkdir(parents=True)
    (bad / "config.json").write_text(text)
    code, out = _run(ALIGNLAB + ["models", "--storage", str(reg)], tmp_path)
    assert code == 0 and "internal error" not in out and "Traceback" not in out, out
    rows = {r["model_id"]: r for r in map(json.loads, out.splitlines())}
    assert rows[mdir.name]["finished"] is True and rows[mdir.name]["size"]
    assert str(bad / "config.json") in rows["zz-damaged"]["broken"], rows


# ---------------------------------------------------------------- a zero-length trial file


def _study_with_trial(tmp_path: Path, text: str) -> tuple[Path, str]:
    from alignlab.platform.storage.root import write_json

    sdir = tmp_path / "root" / "studies" / "cut"
    cid = "ct-0123456789ab"
    write_json(sdir / "study.json", {"name": "cut", "title": "Cut", "baseline_col": "a", "baseline_cells": [],
                                     "plots": [], "notes": "", "models": {}, "calculations": [cid],
                                     "cells": {cid: {"row": "r", "col": "a", "group": "r"}}, "searches": []})
    (sdir / "trials").mkdir()
    (sdir / "trials" / f"{cid}.json").write_text(text)
    return sdir, cid


@pytest.mark.parametrize("text", ["", '{"calc_id": "ct-01'])
def test_a_zero_length_trial_file_is_named_by_the_report_and_a_rerun_runs_its_calculation_again(tmp_path, text):
    from alignlab.platform.fel.trial_files import finished_calculations
    from alignlab.platform.storage.root import as_storage

    sdir, cid = _study_with_trial(tmp_path, text)
    code, out = _run(ALIGNLAB + ["report", str(sdir)], tmp_path)
    assert code == 2 and "Traceback" not in out and "Expecting value" not in out.split("(")[0], out
    (line,) = [l for l in out.splitlines() if l.startswith("alignlab: ")]
    assert str(sdir / "trials" / f"{cid}.json") in line and "rerun of the study runs that calculation again" in line
    assert "is empty" in line if not text else "not whole JSON" in line
    # What `run_study` asks before running the pending calculations: this one is not finished.
    assert finished_calculations(as_storage(tmp_path / "root"), "studies/cut") == set()
    (sdir / "trials" / f"{cid}.json").write_text(json.dumps({"calc_id": cid, "status": "ok"}))
    assert finished_calculations(as_storage(tmp_path / "root"), "studies/cut") == {cid}


# ---------------------------------------------------------------- an FEL calculation that runs out of memory


def test_a_calculation_that_runs_out_of_memory_fails_alone_is_reported_and_a_rerun_runs_it_again(
        tiny_root, monkeypatch):
    """The allocation failure is raised where a calculation's training allocates (`finetune_calculation`); the
    trial writes its file as a failure with the reason, the report lists it, and it does not count as finished."""
    import torch

    from alignlab.platform.config import to_dict
    from alignlab.platform.fel import finetune
    from alignlab.platform.fel.trial_files import finished_calculations
    from alignlab.platform.report.report import collect_results, write_report
    from alignlab.platform.storage.root import as_storage, read_json, Storage, write_json
    from alignlab.platform.study.grid import run_one
    from alignlab.platform.study.spec import calc_id

    root, mdir, tdir = tiny_root
    st, sdir = as_storage(root), root / Storage.study("oom")
    cells = [("bs", "8", _ft()), ("bs", "8", _ft(seed=1))]
    calcs = [{"calc_id": calc_id(mdir.name, ft), "model_key": "m", "model_id": mdir.name, "model_dir": str(mdir),
              "task_dir": str(tdir), "row": r, "col": c, "group": r, "finetune": to_dict(ft), "study_dir": str(sdir),
              "storage": st.uri, "task_id": tdir.name, "study_name": "oom", "eval_sets": {}} for r, c, ft in cells]
    write_json(sdir / "study.json", {
        "name": "oom", "title": "OOM", "baseline_col": "8", "baseline_cells": [], "plots": [], "notes": "",
        "corpus_dir": "", "task_dir": str(tdir), "models": {}, "calculations": [c["calc_id"] for c in calcs],
        "cells": {c["calc_id"]: {"row": c["row"], "col": c["col"], "group": c["group"]} for c in calcs},
        "searches": []})
    real = finetune.finetune_calculation

    def seed_one_runs_out_of_memory(pre, ft, *a, **kw):
        if ft.seed == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by a test)")
        return real(pre, ft, *a, **kw)

    monkeypatch.setattr(finetune, "finetune_calculation", seed_one_runs_out_of_memory)
    for c in calcs:
        run_one(c)  # neither raises: the out-of-memory fails its own calculation only
    ok, oom = (read_json(sdir / "trials" / f"{c['calc_id']}.json") for c in calcs)
    assert ok["status"] == "ok" and oom["status"] == "failed" and oom["retry_on_rerun"] is True
    assert oom["error"].startswith("out of memory on cpu (CPU, ") and "batch 8" in oom["error"], oom
    assert "lower FinetuneConfig.batch_size" in oom["error"] and "rerun of the study runs it again" in oom["error"]
    assert finished_calculations(st, "studies/oom") == {calcs[0]["calc_id"]}
    collect_results(sdir)
    report = write_report(sdir).read_text()
    assert "1 of 2 calculations finished; 1 failed" in report
    failed = report.split("## Failed calculations", 1)[1]
    assert calcs[1]["calc_id"] in failed and "out of memory on cpu" in failed
    monkeypatch.setattr(finetune, "finetune_calculation", real)
    run_one(calcs[1])  # the rerun's turn: with the memory there, it finishes
    assert read_json(sdir / "trials" / f"{calcs[1]['calc_id']}.json")["status"] == "ok"
    assert finished_calculations(st, "studies/oom") == {c["calc_id"] for c in calcs}

"""A plugin package's objective and task in the objective-ablation study at the smoke preset, on a real local Ray,
with no file of alignlab changed; and bad task files stopping a study before any work. A token-tagging task declared
on the study's command line (examples/software_ner) runs end to end in tests/test_e2e.py's study."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.test_plugins import _env, _install

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"


_PLUGIN_IN_RAY = r'''
import dataclasses, json, sys
from pathlib import Path

import ray

from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.driver import pretrain

args = json.loads(sys.argv[1])
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=2**30)


@ray.remote(num_cpus=0.25)
def registered_in_a_worker():
    from alignlab.platform.encoder.registry import registered
    from alignlab.platform.tasks.task import task, task_names

    return {"objectives": list(registered()), "tasks": list(task_names()), "kind": type(task("toytag")).__name__}


seen = ray.get(registered_in_a_worker.remote())
# The plugin's objective is known here (its entry point), not in the test process: the config is made here.
cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,par", max_steps=2, log_every=1,
                          eval_batches=1)
mdir = pretrain(args["corpus"], cfg, args["root"])
print("RESULT=" + json.dumps({"worker": seen, "eval": json.loads((Path(mdir) / "final" / "eval.json").read_text())}))
'''
"""A driver with an installed plugin on its PYTHONPATH and a Ray of its own (whose workers inherit that path, as a
cluster's nodes get it from the job's environment): what a Ray worker sees registered, and a Train run of the
plugin's objective; prints RESULT=<json>."""


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_plugins_objective_pretrains_in_a_ray_train_worker_and_its_task_is_registered_in_a_ray_worker(
        smoke_corpus, tmp_path):
    """The default run's form of the study below: a Ray worker process loads the plugin's entry point (its objective
    and its file-declared task), and a Ray Train worker pretrains the plugin's objective beside MLM for 2 steps and
    scores it on the held-out rows."""
    site = _install(tmp_path, "toyplugin", "par", "toytag")
    args = {"corpus": str(smoke_corpus), "root": str(tmp_path / "root")}
    run = subprocess.run([sys.executable, "-c", _PLUGIN_IN_RAY, json.dumps(args)], cwd=tmp_path, env=_env(site),
                         capture_output=True, text=True, timeout=540)
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT=")]
    assert run.returncode == 0 and line, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(line[0][len("RESULT="):])
    assert "par" in result["worker"]["objectives"] and "toytag" in result["worker"]["tasks"], result["worker"]
    assert result["worker"]["kind"] == "TaggingTask"
    assert any("par" in k.split("/") for k in result["eval"]), result["eval"]


# -m slow (~180 s): its parts run in the default suite -- an installed plugin registers its objective and task
# (test_plugins.py), Ray workers know both and a Train worker pretrains its objective (the test above), a new
# objective is pretrained under Ray Train and reaches the report (test_new_objective.py), a task that is not bundled
# runs in this study (test_e2e.py).
@pytest.mark.slow
@pytest.mark.ray
def test_a_plugins_objective_and_task_run_in_the_smoke_ablation_study_and_reach_the_report(tmp_path):
    site = _install(tmp_path, "toyplugin", "par", "toytag")
    storage = tmp_path / "storage"
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(storage), "--objectives", "mlm,nsp,whp,pad,par", "--only-tasks", "toytag"]
    run = subprocess.run(cmd, cwd=REPO, env=_env(site), capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [sdir] = [p for p in (storage / "studies").iterdir() if p.name.startswith("objective_ablation-smoke+par-tasks-")]
    text = (sdir / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| model | objectives | steps |"))
    assert "| PAR |" in header
    row = next(line for line in text.splitlines() if "| mlm+nsp+whp+pad+par |" in line)
    assert row.split("|")[-2].strip() != "/"  # the plugin objective's held-out accuracy / perplexity
    assert "TOYTAG" in text
    assert set(pd.read_parquet(sdir / "results.parquet")["ft_task"]) == {"toytag"}


def test_bad_task_files_stop_the_study_before_any_work_naming_file_and_line(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"tokens": ["a", "b"], "tags": ["O", "B-X"]}\n{"tokens": ["a"], "tags": ["O", "O"]}\n')
    cmd = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke",
           "--storage", str(tmp_path / "storage"), "--task",
           f"name=bad,kind=tagging,pool={pool},test={EXAMPLE / 'test.jsonl'}"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert f"{pool}:2: 2 tags for 1 tokens" in run.stderr
    assert not (tmp_path / "storage" / "studies").exists()

"""End to end, as a user runs it: the README's main job (the objective-ablation study) at the smoke
preset, on a real local Ray, with a task of the user's own declared on its command line, killed mid-way and run
again -- finished trials are not rerun, and the report has one row per calculation; and an Optuna search killed
mid-way goes on from the finished trials of its Optuna study."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "software_ner"
CMD = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke"]


def _kill_when(cmd: list[str], pattern: str, at_least: int, env: dict | None = None) -> str:
    """Run a study driver and SIGKILL it, with every process of the Ray instance it started (some leave its
    process group), the moment a line of its output matches `pattern` with a count >= `at_least`. Returns
    the output it printed until then."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=REPO,
                            start_new_session=True, env=env)
    log = []
    for line in proc.stdout:
        log.append(line)
        m = re.match(pattern, line)
        if m and int(m.group(1)) >= at_least:
            break
    assert proc.poll() is None, "".join(log)[-3000:]
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGKILL)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(procs, timeout=30)
    return "".join(log)


@pytest.mark.ray
def test_the_smoke_ablation_study_with_a_declared_task_survives_a_killed_driver_and_reports_every_calculation(
        tmp_path):
    storage = tmp_path / "storage"
    # A user's own test files: every calculation of their task is also scored on them.
    (tmp_path / "my_ct.jsonl").write_text(
        '{"tokens": ["a", "react", "wrapper", "for", "leaflet"], "tags": ["N", "SE", "N", "N", "SE"]}\n'
        '{"tokens": ["node", "js", "streams"], "tags": ["S", "E", "N"]}\n')
    (tmp_path / "my_ad.jsonl").write_text(
        '{"acronym": "ecs", "snippet": "the elastic container service runs docker", "label": 1}\n'
        '{"acronym": "ecr", "snippet": "the elastic container service runs docker", "label": 0}\n')
    # A task of the user's own, declared on the command line with no file of alignlab changed: the worked example's
    # token tagging (examples/software_ner, PyPI summaries tagged B-/I-LANG and B-/I-TECH), beside CT and AD.
    swner = f"name=swner,kind=tagging,pool={EXAMPLE / 'pool.jsonl'},test={EXAMPLE / 'test.jsonl'},aligned=whp"
    cmd = CMD + ["--storage", str(storage), "--task", swner, "--eval-file", f"ct={tmp_path / 'my_ct.jsonl'}",
                 "--eval-file", f"ad={tmp_path / 'my_ad.jsonl'}"]
    # One trial at a time, and the driver is killed the moment it reports its second finished trial: smoke
    # trials take a fraction of a second, so polling the trial files would often find all of them done.
    first = _kill_when(cmd + ["--max-concurrent", "1"], r"\[trials\] (\d+)/24 done", 2)
    # Pretraining ran inside Ray Train workers, whose output Ray does not forward: their progress still shows.
    assert re.search(r"\[pretrain 32x1-mlm\+nsp\+whp\+pad-\w+\] step 12/12 \(100%\), loss ", first), first[-3000:]
    # A declared task names the study after the task set (its corpus holds out the task's texts too).
    [sdir] = [p for p in (storage / "studies").iterdir() if p.name.startswith("objective_ablation-smoke-tasks-")]
    trials = sdir / "trials"
    done_before = {p.name: p.stat().st_mtime_ns for p in trials.glob("*.json")}
    assert 2 <= len(done_before) < 24

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    report = sdir / "report.md"
    assert f"Report: {report}" in second.stdout
    assert f"{len(done_before)} of 24 calculations already done" in second.stdout
    for name, mtime in done_before.items():
        assert (trials / name).stat().st_mtime_ns == mtime, f"finished trial {name} was rerun"

    results = pd.read_parquet(sdir / "results.parquet")
    assert len(results) == 24 and results["calc_id"].is_unique
    assert set(results["selection"]) == {"honest"}
    assert set(results["col"]) == {"all*", "-whp*", "-pad*", "untrained"}
    assert set(results["row"]) == {"CT", "AD", "SWNER"}
    text = report.read_text()
    assert "Selection mode: honest" in text and "<u>" in text and "## Significance" in text
    assert "## What pretraining buys (positive control)" in text and "**Provenance:** commit " in text
    assert "| untrained | none (untrained) | 0 |" in text  # the pretrained-models table: nothing was pretrained
    assert (sdir / "plots" / "accuracy_by_condition.png").stat().st_size > 1000
    # CT is the hand-labelled real-text set; AD is also scored out of domain; the user's files have columns of
    # their own; every context-free baseline is computed on the same splits and the strongest is named.
    ct, ad = results[results["row"] == "CT"], results[results["row"] == "AD"]
    assert set(ct["num_test"]) == {260} and ct["eval_my_ct_accuracy"].between(0, 1).all()
    assert ad["eval_ood_accuracy"].between(0, 1).all() and set(ad["eval_ood_num_test"]) == {664}
    assert ad["eval_my_ad_accuracy"].between(0, 1).all() and ct["eval_ood_accuracy"].isna().all()
    assert set(ct["baseline_best_name"]) <= {"majority", "lexicon", "run_rule", "gazetteer"}
    assert ct["baseline_gazetteer"].notna().all() and ad["baseline_span_matcher"].notna().all()
    # ... and scored per test unit, so the report compares a model with it on the same units.
    for _, r in ct.iterrows():
        assert len(r["unit_correct_baseline_lexicon"]) == len(r["unit_keys"]) == 260
        assert sum(r["unit_correct_baseline_lexicon"]) / sum(r["unit_count_baseline_lexicon"]) == \
            pytest.approx(r["baseline_lexicon"])
    assert ad["eval_ood_baseline_span_matcher"].notna().all()
    # AD read by pair kind (issue #65): every AD calculation records each snippet's part beside its scores, the report
    # reads every AD table by part, and each pretrained model's PAD head was read zero-shot once, for the study.
    for _, r in ad.iterrows():
        assert len(r["unit_parts"]) == len(r["unit_keys"]) and set(r["unit_parts"]) == {"mutate", "pseudo"}
        assert len(r["eval_ood_unit_parts"]) == 332
    assert ct["unit_parts"].isna().all()
    assert text.count("AD by part (") == 4, "best-perplexity, best accuracy, ood, my_ad; none for CT or SWNER"
    zero_shot = json.loads((sdir / "zero_shot.json").read_text())["models"]
    assert len(zero_shot) == 3 and "untrained" not in " ".join(zero_shot), "the pretrained models, once each"
    with_pad = [m for m in zero_shot if "pad" in m.split("-")[1]]
    assert len(with_pad) == 2 and all(zero_shot[m]["ad"]["head"] == "pad" for m in with_pad)
    assert all(0 <= zero_shot[m]["ad"]["sets"]["ood"]["parts"]["mutate"] <= 1 for m in with_pad)
    assert "zero-shot PAD head (all / mutate / pseudo)" in text
    assert all(set(v) == {"ad"} for v in zero_shot.values()) and "zero-shot WHP" not in text, \
        "SWNER shares WHP's head shape, not its tags: no zero-shot read"
    # The declared task: rows of its own, its test file's 100 summaries, span F1, and its baselines, of which the
    # lexicon of the pool's tagged spans beats tagging nothing.
    sw = results[results["row"] == "SWNER"]
    assert len(sw) == 8 and set(sw["ft_task"]) == {"swner"} and set(sw["num_test"]) == {100}
    assert sw["span_f1"].between(0, 1).all() and sw["eval_my_ct_accuracy"].isna().all()
    assert sw["baseline_lexicon"].gt(sw["baseline_majority"]).all()
    for section in ("## Test set `ood`", "## Test set `my_ct`", "## Test set `my_ad`", "| span_matcher |", "strongest",
                    "SWNER"):
        assert section in text, section
    assert (sdir / "plots" / "accuracy_ood_by_condition.png").stat().st_size > 1000
    assert len(list((sdir / "tensorboard").rglob("events.out.tfevents.*"))) >= 24
    assert len(list((storage / "models").glob("*/final/model.pt"))) == 4, "three pretrained, one untrained"


def _study_trials(journal: Path) -> list:
    """The trials of the one Optuna study in a search's journal file, read with Optuna's own API."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(journal)))
    [name] = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage).trials


# -m slow (~85 s): the resume of a killed search driver through its Optuna journal runs in the default suite on a
# toy search whose trials last long enough to be cut (test_optuna_storage.py), and the smoke search itself end
# to end (test_optuna_storage.py, test_studies.py).
@pytest.mark.slow
@pytest.mark.ray
def test_a_search_killed_mid_way_resumes_from_its_finished_trials(tmp_path):
    from optuna.trial import TrialState

    from alignlab.platform.study.optuna_study import DRIVER, INTERRUPTED, RETRY_OF, counted

    storage = tmp_path / "storage"
    cmd = [sys.executable, str(REPO / "studies" / "finetune_search.py"), "--preset", "smoke", "--storage", str(storage),
           "--max-concurrent", "1"]
    # The driver is killed as soon as it reports the second finished trial: Optuna was told before that line.
    _kill_when(cmd, r"\[search ct\] (\d+)/4 done", 2)
    sdir = storage / "studies" / "finetune_search-smoke"
    assert not (sdir / "searches" / "ct.json").exists()
    journal = sdir / "searches" / "ct.optuna.journal"
    before = _study_trials(journal)
    kept = [t for t in before if counted(t)]
    assert len(kept) >= 2 and all(t.state != TrialState.FAIL for t in kept), [t.state for t in before]

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    # The resumed search counts the trials its study holds and runs only the rest, up to the 4 it asked for.
    assert f"[search ct] {len(kept)} of 4 trials already done" in second.stdout, second.stdout[-3000:]
    assert re.search(rf"\[search ct\] {len(kept) + 1}/4 done", second.stdout), second.stdout[-3000:]
    after = _study_trials(journal)
    assert sum(counted(t) for t in after) == 4
    for t in kept:  # not lost, not changed
        assert (after[t.number].state, after[t.number].params, after[t.number].user_attrs) == \
            (t.state, t.params, t.user_attrs)
    # The second driver ran exactly the missing trials (and none of the finished points again).
    rerun = after[len(before):]
    assert sum(counted(t) for t in rerun) == 4 - len(kept)
    assert not [t for t in rerun if t.params in [k.params for k in kept]]
    assert before[0].user_attrs[DRIVER] not in {t.user_attrs[DRIVER] for t in rerun}
    for cut in (t for t in before if t.state == TrialState.RUNNING):  # killed inside a trial: that point again
        assert after[cut.number].user_attrs[INTERRUPTED]
        [retry] = [t for t in after if t.user_attrs.get(RETRY_OF) == cut.number]
        # A kill while Optuna was still drawing the point leaves only its first parameters in the journal: the
        # retry keeps every one drawn and draws the rest (a whole point, like every other trial's).
        assert cut.params.items() <= retry.params.items() and retry.params.keys() == kept[0].params.keys()
    summary = json.loads((sdir / "searches" / "ct.json").read_text())
    assert len(summary["trials"]) == 4
    assert all(t["status"] != "error" for t in summary["trials"]), summary["trials"]
    assert (sdir / "report.md").exists()

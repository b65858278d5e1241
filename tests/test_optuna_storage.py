"""Every search keeps a persistent Optuna study (issue #18): a journal file beside its outputs by default, or an
RDB URL; `optuna.load_study` opens what a finished search leaves; a killed search resumes through it; and the
report plots and lists Optuna's parameter importances, or says in one line why it cannot."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from test_studies import load_script

from alignlab.platform.report.search_importance import importance_lines
from alignlab.platform.storage.optuna_place import OPTUNA_STORAGE_ENV, study_place
from alignlab.platform.study.optuna_study import DRIVER, INTERRUPTED, RETRY_OF, TUNE_TRIAL, open_study, trial_counts

OBJECTIVE = "val_accuracy_at_best_ppl"
SPACE = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "dropout": FloatDistribution(0.0, 0.3),
         "batch_size": CategoricalDistribution([8, 16])}
STATUS = {"COMPLETE": "complete", "PRUNED": "pruned"}


def _journal(path):
    return JournalStorage(JournalFileBackend(str(path)))


# ------------------------------------------------------------------ where the study lives


def test_the_study_is_a_journal_file_unless_an_rdb_url_comes_from_the_flag_or_the_environment(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.delenv(OPTUNA_STORAGE_ENV, raising=False)
    journal = tmp_path / "searches" / "ct.optuna.journal"
    assert study_place("x", journal).url is None and study_place("x", journal).shown == str(journal)
    monkeypatch.setenv(OPTUNA_STORAGE_ENV, f"sqlite:///{tmp_path}/env.db")
    assert study_place("x", journal).url.endswith("/env.db")
    assert study_place("x", journal, url=f"sqlite:///{tmp_path}/flag.db").url.endswith("/flag.db"), "the flag wins"
    monkeypatch.setenv(OPTUNA_STORAGE_ENV, "optuna.db")
    with pytest.raises(ValueError, match=f"{OPTUNA_STORAGE_ENV} 'optuna.db': not an RDB URL"):
        study_place("x", journal)
    place = study_place("x", journal, url="postgresql://me:secret@db.example/optuna")
    assert "secret" not in place.shown and "secret" not in str(place.summary())
    with pytest.raises(ValueError, match="--optuna-storage sqlite:////no/such/dir/o.db: cannot open it"):
        study_place("x", journal, url="sqlite:////no/such/dir/o.db").storage()


def test_a_study_script_refuses_a_storage_that_is_not_a_url_in_one_line(capsys):
    from alignlab.platform.study.run import study_main

    with pytest.raises(SystemExit) as e:
        study_main(load_script("finetune_search").build, ["--preset", "smoke", "--optuna-storage", "optuna.db"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert "--optuna-storage" in err and "not an RDB URL" in err and "Traceback" not in err


def test_a_journal_at_a_remote_root_is_uploaded_after_each_trial_and_pulled_by_a_rerun_on_another_node(tmp_path):
    from test_storage import _remote_pair

    from alignlab.platform.study.optuna_study import DriverSession
    from alignlab.platform.study.search_tune import OptunaStudySearch

    one, two = _remote_pair(tmp_path)
    rel = "studies/s/searches/ct.optuna.journal"
    place = study_place("x", one.local / rel, root=one, journal_rel=rel)
    study = open_study(place, ["maximize"], 0)
    session = DriverSession(study, place)
    s = OptunaStudySearch(study, session, SPACE, metrics=["acc"], num_samples=3, max_concurrent=1,
                          on_told=place.push)
    for tid in "ab":
        assert isinstance(s.suggest(tid), dict)
        s.on_trial_complete(tid, {"acc": 0.5, "training_iteration": 1})
        assert one.sizes("studies/s/searches")["ct.optuna.journal"] == place.journal.stat().st_size, \
            "the root has every trial told so far"
    # The driver dies mid-trial on node one; node two resumes from the root's copy.
    assert isinstance(s.suggest("c"), dict)
    place.push()
    there = study_place("x", two.local / rel, root=two, journal_rel=rel)
    there.pull()
    resumed = open_study(there, ["maximize"], 0)
    assert trial_counts(resumed) == (2, 1)
    t = resumed.ask(SPACE)
    resumed.tell(t, 0.7)
    there.pull()  # this node's copy is now the longer one: it is kept, not replaced by the root's older copy
    assert trial_counts(open_study(there, ["maximize"], 0))[0] == 3
    session.close(say=lambda *a, **k: None)


# ------------------------------------------------------------------ importances in the report


def _toy_study(sdir, n: int, *, metrics: int = 1, score=None, same_params: bool = False) -> dict:
    """A finished search's study in sdir/searches/ct.optuna.journal; returns its summary's "optuna" entry."""
    place = study_place("search-ct-0", sdir / "searches" / "ct.optuna.journal")
    study = open_study(place, ["maximize"] * metrics, 0)
    for i in range(n):
        if same_params:
            study.enqueue_trial({"lr": 1e-3, "dropout": 0.1, "batch_size": 8})
        t = study.ask(SPACE)
        p = t.params
        values = score(p) if score else [-abs(math.log10(p["lr"]) + 2.5), -abs(p["dropout"] - 0.15)][:metrics]
        study.tell(t, values)
    return place.summary()


def test_the_report_plots_and_lists_the_importances_of_each_objective(tmp_path):
    recorded = _toy_study(tmp_path, 30)
    lines = importance_lines(tmp_path, recorded, "ct", [OBJECTIVE])
    plot = tmp_path / "plots" / "importance-ct.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 2000
    listed = next(line for line in lines if line.startswith(f"Parameter importance for {OBJECTIVE}"))
    assert "30 completed trials" in listed and listed.index("`lr`") < listed.index("`dropout`"), listed
    assert "![importance-ct](plots/importance-ct.png)" in lines
    # Multi-objective: one plot per objective, each with its own ranking.
    sdir = tmp_path / "multi"
    lines = importance_lines(sdir, _toy_study(sdir, 30, metrics=2), "mix", ["ct_acc", "ad_acc"])
    for metric, first in (("ct_acc", "`lr`"), ("ad_acc", "`dropout`")):
        assert (sdir / "plots" / f"importance-mix-{metric}.png").read_bytes()[:4] == b"\x89PNG"
        listed = next(line for line in lines if line.startswith(f"Parameter importance for {metric}"))
        assert listed.split(": ", 1)[1].startswith(first), listed


@pytest.mark.parametrize("case, expected", [
    ("one trial", "needs at least 2 completed trials; this search has 1"),
    ("same params", "no parameter took more than one value among the 4 completed trials"),
    ("same score", "all 4 completed trials scored 0.5"),
    ("no study", "ran before searches kept a persistent Optuna study"),
    ("journal gone", "could not be opened"),
])
def test_a_search_without_usable_importances_gets_one_line_saying_why(tmp_path, case, expected):
    recorded = {"one trial": lambda: _toy_study(tmp_path, 1),
                "same params": lambda: _toy_study(tmp_path, 4, same_params=True),
                "same score": lambda: _toy_study(tmp_path, 4, score=lambda p: [0.5]),
                "no study": lambda: None,
                "journal gone": lambda: {"study": "s", "storage": "x", "journal": "gone.optuna.journal"}}[case]()
    lines = [line for line in importance_lines(tmp_path, recorded, "ct", [OBJECTIVE]) if line]
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "plots").exists()


# ------------------------------------------------------------------ real searches on Ray


def _smoke_ct_search(name: str, num_samples: int = 3):
    """The smoke finetuning study cut to its CT search (num_samples trials) and CT's calculations."""
    study = load_script("finetune_search").build("smoke")
    search = dataclasses.replace(study.searches[0], num_samples=num_samples)
    assert search.name == "ct"
    return dataclasses.replace(study, name=name, searches=(search,),
                               calcs=tuple(c for c in study.calcs if c.row == search.row)), search


def _check_against_summary(loaded: optuna.Study, summary: dict, search) -> None:
    assert len(loaded.trials) == search.num_samples == len(summary["trials"])
    assert [STATUS.get(t.state.name, "failed") for t in loaded.trials] == [t["status"] for t in summary["trials"]]
    assert loaded.trials[0].params["lr"] == pytest.approx(search.base.lr), "the first trial is the default"
    best = [t for t in loaded.trials if t.state == TrialState.COMPLETE and t.params == summary["best_params"]]
    assert best and best[0].value == pytest.approx(summary["best_value"])
    assert all(t.user_attrs[DRIVER] and t.user_attrs[TUNE_TRIAL] for t in loaded.trials)


@pytest.mark.ray
def test_a_smoke_search_leaves_a_journal_that_optuna_load_study_opens(ray_session, storage_root):
    from alignlab.platform.storage.root import read_json
    from alignlab.platform.study.run import run_study

    study, search = _smoke_ct_search("optuna_journal-smoke")
    report = run_study(study, storage_root, progress=False, max_concurrent=1)
    sdir = report.parent
    summary = read_json(sdir / "searches" / "ct.json")
    journal = sdir / "searches" / "ct.optuna.journal"
    assert summary["optuna"] == {"study": summary["optuna"]["study"], "storage": str(journal),
                                 "journal": "ct.optuna.journal"}
    assert summary["optuna"]["study"].startswith("search-ct-")
    loaded = optuna.load_study(study_name=summary["optuna"]["study"], storage=_journal(journal))
    _check_against_summary(loaded, summary, search)
    for t in loaded.trials:  # each trial's Tune folder is named in the study
        assert (sdir / "tune" / summary["tune_dir"].rsplit("/", 1)[1] / f"ct-{t.user_attrs[TUNE_TRIAL]}").is_dir()
    text = report.read_text()
    [line] = [x for x in text.splitlines() if x.startswith("Parameter importance")]
    if "plots/importance-ct.png" in text:
        assert (sdir / "plots" / "importance-ct.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert "none (" in line
    # The report is rewritten from the files alone (`alignlab report`), importances included.
    from alignlab.platform.report.report import write_report

    (sdir / "report.md").unlink()
    assert line in write_report(sdir).read_text()


@pytest.mark.ray
def test_an_rdb_url_holds_the_study_instead_of_a_journal(ray_session, storage_root, tmp_path):
    from alignlab.platform.storage.root import read_json
    from alignlab.platform.study.run import run_study

    study, search = _smoke_ct_search("optuna_rdb-smoke")
    url = f"sqlite:///{tmp_path}/optuna.db"
    report = run_study(study, storage_root, progress=False, max_concurrent=1, optuna_storage=url)
    summary = read_json(report.parent / "searches" / "ct.json")
    assert summary["optuna"]["storage"] == url and summary["optuna"]["journal"] is None
    assert not list(report.parent.rglob("*.optuna.journal"))
    _check_against_summary(optuna.load_study(study_name=summary["optuna"]["study"], storage=url), summary, search)
    assert "Parameter importance" in report.read_text()


TOY_DRIVER = '''
"""A search driver with a toy trainable (each trial sleeps, so a kill lands inside one)."""
import sys
import time
from pathlib import Path

import ray
from optuna.distributions import FloatDistribution
from ray import tune

from alignlab.platform.storage.optuna_place import study_place
from alignlab.platform.study.optuna_study import open_study
from alignlab.platform.study.search_tune import OptunaStudySearch, TellTuneErrors, run_rounds

root, num_samples = Path(sys.argv[1]), int(sys.argv[2])
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)


def trial(config):
    time.sleep(1)
    tune.report({"score": config["x"]})


place = study_place("toy", root / "toy.optuna.journal")
study = open_study(place, ["maximize"], 0)


class Say(tune.Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        print(f"[toy] started trial {len(trials)} of this session", flush=True)


def fit_round(session, left):
    searcher = OptunaStudySearch(study, session, {"x": FloatDistribution(0, 1)}, metrics=["score"],
                                 num_samples=num_samples, max_concurrent=1, keep=("score",))
    tune.Tuner(trial, tune_config=tune.TuneConfig(search_alg=searcher, num_samples=left,
                                                  trial_dirname_creator=lambda t: t.trial_id),
               run_config=tune.RunConfig(name="toy", storage_path=str(root / "tune"), verbose=0,
                                         callbacks=[Say(), TellTuneErrors(searcher)])).fit()


run_rounds(study, place, num_samples, fit_round, label="[toy]")
print("[toy] finished", flush=True)
'''


@pytest.mark.slow
@pytest.mark.ray
def test_a_search_driver_killed_inside_a_trial_resumes_through_its_journal(tmp_path):
    """test_e2e kills the real finetuning search between trials (its smoke trials last a fraction of a second);
    here a toy trial lasts 1 s, so the kill (as soon as the driver says the trial started) lands inside one and the
    RUNNING trial it leaves is exercised."""
    from test_e2e import REPO, _kill_when

    script = tmp_path / "toy_driver.py"
    script.write_text(TOY_DRIVER)
    cmd = [sys.executable, str(script), str(tmp_path), "4"]
    _kill_when(cmd, r"\[toy\] started trial (\d+) of this session", 3)
    storage = _journal(tmp_path / "toy.optuna.journal")
    before = optuna.load_study(study_name="toy", storage=storage).trials
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.RUNNING]

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "[toy] finished" in second.stdout, second.stdout[-3000:] + second.stderr[-3000:]
    assert "1 trial(s) of a driver that stopped before finishing them will run again" in second.stdout
    assert "[toy] 2 of 4 trials already done" in second.stdout
    after = optuna.load_study(study_name="toy", storage=_journal(tmp_path / "toy.optuna.journal")).trials
    for old, new in zip(before[:2], after[:2]):  # the finished trials are kept as they were
        assert (new.state, new.params, new.user_attrs) == (old.state, old.params, old.user_attrs)
    cut = after[2]
    assert cut.state == TrialState.FAIL and cut.user_attrs[INTERRUPTED]
    # The second driver ran exactly what was missing: the interrupted point again, then one new trial.
    rerun = after[3:]
    assert len(rerun) == 2 and all(t.state == TrialState.COMPLETE for t in rerun)
    assert rerun[0].user_attrs[RETRY_OF] == cut.number and rerun[0].params == cut.params
    assert rerun[1].params not in [t.params for t in before], "a finished point is not run again"
    assert len({t.user_attrs[DRIVER] for t in rerun} | {before[0].user_attrs[DRIVER]}) == 2

"""Whether an interrupted Tune search can be resumed as a whole is decided from the files of its snapshot
(issue #17): Tune itself restores whatever it finds, and without the search generator's state it silently
ends a restored search after the trials it restored."""
from __future__ import annotations

import json
import pickle

import pytest
import ray.cloudpickle as cloudpickle

from alignlab.platform.study_search_tune import set_aside, snapshot_problem

SESSION = "2026-11-23_10-00-00"


def _snapshot(exp, session=SESSION, searcher=b"ok"):
    exp.mkdir(parents=True, exist_ok=True)
    (exp / "tuner.pkl").write_bytes(pickle.dumps({}))
    (exp / f"experiment_state-{session}.json").write_text(json.dumps({"trial_data": [], "runner_data": {}}))
    (exp / f"search_gen_state-{session}.json").write_bytes(cloudpickle.dumps({"counter": 2}))
    (exp / f"searcher-state-{session}.pkl").write_bytes(pickle.dumps({"x": 1}) if searcher == b"ok" else searcher)


def test_a_snapshot_with_all_three_state_files_of_one_session_can_be_resumed(tmp_path):
    _snapshot(tmp_path / "exp")
    assert snapshot_problem(str(tmp_path / "exp")) is None


def test_an_empty_searcher_pickle_left_by_an_interrupted_upload_makes_the_snapshot_incomplete(tmp_path):
    _snapshot(tmp_path / "exp", searcher=b"")
    problem = snapshot_problem(str(tmp_path / "exp"))
    assert problem and "searcher state" in problem and f"searcher-state-{SESSION}.pkl" in problem


def test_a_driver_killed_before_its_first_snapshot_leaves_nothing_to_resume(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "tuner.pkl").write_bytes(pickle.dumps({}))
    assert snapshot_problem(str(tmp_path / "exp")) == "no experiment state file"


def test_a_missing_search_generator_state_makes_the_snapshot_incomplete(tmp_path):
    _snapshot(tmp_path / "exp")
    (tmp_path / "exp" / f"search_gen_state-{SESSION}.json").unlink()
    assert snapshot_problem(str(tmp_path / "exp")) == "no search generator state file"


def test_state_files_of_two_driver_sessions_are_not_mixed(tmp_path):
    _snapshot(tmp_path / "exp")
    (tmp_path / "exp" / "experiment_state-2026-11-23_11-00-00.json").write_text(json.dumps({"trial_data": []}))
    assert "different driver sessions" in snapshot_problem(str(tmp_path / "exp"))


def test_an_incomplete_experiment_is_set_aside_with_its_files_not_deleted(tmp_path):
    _snapshot(tmp_path / "exp", searcher=b"")
    moved = set_aside(str(tmp_path / "exp"))
    assert not (tmp_path / "exp").exists()
    assert moved.startswith(str(tmp_path / "exp.incomplete-"))
    assert sorted(p.name for p in (tmp_path / moved).iterdir()) == sorted(
        ["tuner.pkl", f"experiment_state-{SESSION}.json", f"search_gen_state-{SESSION}.json",
         f"searcher-state-{SESSION}.pkl"])


def test_a_restored_searcher_does_not_wait_for_a_trial_that_was_live_when_it_was_saved(tmp_path):
    from ray import tune

    from alignlab.platform.study_search_tune import PruneAwareOptunaSearch

    def searcher():
        s = PruneAwareOptunaSearch(space=PruneAwareOptunaSearch.convert_search_space({"lr": tune.uniform(0, 1)}),
                                   metric="acc", mode="max", seed=0)
        assert s.set_max_concurrency(1)  # Tune's ConcurrencyLimiter then passes calls through
        return s

    first = searcher()
    assert isinstance(first.suggest("a"), dict)
    assert first.suggest("b") is None, "one trial live: the limit is 1"
    first.on_trial_complete("a", {"acc": 0.5, "search_complete": 1})
    assert isinstance(first.suggest("c"), dict)
    first.save(str(tmp_path / "searcher.pkl"))  # "c" is live in this snapshot, and never comes back

    again = searcher()
    again.restore(str(tmp_path / "searcher.pkl"))
    assert isinstance(again.suggest("d"), dict), "the restored search waits for ever for trial c"
    assert again.suggest("e") is None


def test_a_restored_searcher_still_counts_the_trials_tune_runs_again_so_resumes_do_not_add_trials(tmp_path):
    """Tune restarts the unfinished trials of the experiment state; the searcher counts exactly those as live
    (not the snapshot's others, not none), so a resumed search keeps its concurrency limit."""
    from ray import tune

    from alignlab.platform.study_search_tune import ResumableOptunaSearch

    def searcher():
        s = ResumableOptunaSearch(space=ResumableOptunaSearch.convert_search_space({"lr": tune.uniform(0, 1)}),
                                  metric="acc", mode="max", seed=0)
        assert s.set_max_concurrency(1)
        return s

    first = searcher()
    assert isinstance(first.suggest("a"), dict)
    first.on_trial_complete("a", {"acc": 0.5})
    assert isinstance(first.suggest("c"), dict)
    first.save(str(tmp_path / f"searcher-state-{SESSION}.pkl"))
    (tmp_path / f"experiment_state-{SESSION}.json").write_text(json.dumps({"trial_data": [
        [json.dumps({"trial_id": "a", "status": "TERMINATED"}), "{}"],
        [json.dumps({"trial_id": "c", "status": "RUNNING"}), "{}"]], "runner_data": {}, "stats": {}}))

    again = searcher()
    again.restore(str(tmp_path / f"searcher-state-{SESSION}.pkl"))
    assert again.suggest("d") is None, "trial c runs again after the restore: with a limit of 1, nothing new yet"
    again.on_trial_complete("c", {"acc": 0.6})
    assert isinstance(again.suggest("d"), dict)


def _one(config):
    from ray import tune

    tune.report({"score": config["a"]})


@pytest.mark.ray
def test_a_search_interrupted_under_another_param_space_is_set_aside_and_started_again(ray_session, tmp_path):
    """Tune refuses `Tuner.restore` when the param space has other keys than the snapshot's (found when a new
    alignlab version added a key): that search starts again instead of failing; the same keys restore."""
    from ray import tune

    from alignlab.platform.study_search_tune import restore_tuner

    exp = tmp_path / "tune" / "exp"
    tune.Tuner(_one, param_space={"ctx": {"a": 1}}, tune_config=tune.TuneConfig(num_samples=1),
               run_config=tune.RunConfig(name="exp", storage_path=str(tmp_path / "tune"), verbose=0)).fit()
    said = []
    assert restore_tuner(str(exp), _one, param_space={"ctx": {"a": 1}}, label="[t]", say=said.append) is not None
    assert restore_tuner(str(exp), _one, param_space={"ctx": {"a": 1, "new": 2}}, label="[t]",
                         say=lambda m, **k: said.append(m)) is None
    assert "another parameter space" in said[-1] and not exp.exists()
    assert [p.name for p in (tmp_path / "tune").iterdir() if p.name.startswith("exp.incomplete-")]

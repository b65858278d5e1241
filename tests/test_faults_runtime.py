"""Faults at run time (issue #17, the rest after test_faults.py): impossible resource requests, non-finite
numbers, and what a local Ray instance listens on. Through the real command line and study scripts, on a real
Ray instance; no mocks of Ray or the model."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alignlab.platform.tasks.task import task as task_named

REPO = Path(__file__).resolve().parents[1]
ALIGNLAB = [sys.executable, "-m", "alignlab.platform.cli"]
STUDY = [sys.executable, str(REPO / "studies" / "objective_ablation.py"), "--preset", "smoke"]


def _run(cmd: list[str], cwd: Path, timeout: float = 120, env: dict | None = None) -> tuple[int, str, float]:
    env = {**{k: v for k, v in os.environ.items() if k not in ("ALIGNLAB_DEBUG", "RAY_ADDRESS")}, **(env or {})}
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def _one_error_line(out: str) -> str:
    lines = [l for l in out.splitlines() if l.startswith("alignlab: ")]
    assert len(lines) == 1, out
    assert "Traceback" not in out, out
    return lines[0]


# ---------------------------------------------------------------- 1. impossible resource requests


# -m slow (~15 s, a Ray instance of its own): the same refusal from `pretrain` on the session's Ray runs by default
# (`test_pretrain_itself_refuses_an_impossible_request_before_writing_the_model_folder`), and the command line's
# one-line refusal of an impossible request with the FEL trial's below.
@pytest.mark.slow
def test_pretraining_that_asks_for_gpus_and_more_cpus_than_this_machine_has_is_refused_before_the_corpus_is_built(
        tmp_path):
    # The paper preset: a Train worker of {CPU: 8, GPU: 1}. On a CPU-only machine this used to wait forever.
    code, out, took = _run(ALIGNLAB + ["pretrain", "--preset", "paper", "--storage", str(tmp_path / "st")], tmp_path)
    assert code == 2, out
    line = _one_error_line(out)
    for words in ("pretraining", "{CPU: 8, GPU: 1}", f"CPU: {os.cpu_count()}", "wait forever"):
        assert words in line, (words, line)
    assert took < 90, f"took {took:.0f}s"
    assert not (tmp_path / "st" / "corpus").exists() and not (tmp_path / "st" / "models").exists()


def test_an_fel_trial_asking_for_a_gpu_and_a_custom_resource_no_node_offers_is_refused_before_any_work(tmp_path):
    """A CPU-only machine without an autoscaler: neither the GPU nor the custom resource can ever appear (one
    command for both, each a study process that starts Ray of its own)."""
    code, out, took = _run(STUDY + ["--storage", str(tmp_path / "st"), "--gpus-per-trial", "1",
                                    "--trial-resources", '{"fel_node": 1}'], tmp_path)
    assert code == 2, out
    line = _one_error_line(out)
    for words in ("an FEL trial", "{CPU: 1, GPU: 1, fel_node: 1}", "no autoscaler", "--gpus-per-trial",
                  "--trial-resources"):
        assert words in line, (words, line)
    assert took < 90, f"took {took:.0f}s"
    assert not (tmp_path / "st" / "studies").exists() and not (tmp_path / "st" / "tasks").exists()


@pytest.mark.ray
def test_a_request_that_fits_passes_and_one_that_does_not_names_what_was_asked_and_what_exists(ray_session):
    from alignlab.platform.runtime.resources import ResourceRequestError, check_request

    check_request("an FEL trial", {"cpu": 1})
    check_request("pretraining", {"CPU": 0.5}, 2, spare_cpus=1)
    with pytest.raises(ResourceRequestError, match=r"an FEL trial asks for \{CPU: 3\}, but the cluster has \{CPU: 2\}"):
        check_request("an FEL trial", {"cpu": 3})
    with pytest.raises(ResourceRequestError, match=r"3 x \{CPU: 1\}.*only 2 fit"):
        check_request("pretraining", {"CPU": 1}, 3)
    with pytest.raises(ResourceRequestError, match=r"plus 1 CPU left free for Ray Data"):
        check_request("pretraining", {"CPU": 1}, 2, spare_cpus=1)


@pytest.mark.ray
def test_pretrain_itself_refuses_an_impossible_request_before_writing_the_model_folder(ray_session, smoke_corpus,
                                                                                      tmp_path):
    import dataclasses

    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.runtime.resources import ResourceRequestError

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, use_gpu=True)
    with pytest.raises(ResourceRequestError, match="GPU: 1"):
        pretrain(smoke_corpus, cfg, tmp_path / "root")
    assert not (tmp_path / "root" / "models").exists()


# ---------------------------------------------------------------- 5. what a local Ray instance listens on

_LISTENERS = """
import json, psutil
from alignlab.platform.runtime.ray_env import ensure_ray
ensure_ray()
import ray
me = psutil.Process()
procs = [me] + me.children(recursive=True)
out = []
for p in procs:
    try:
        conns = p.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        continue
    out += [[p.name(), c.laddr.ip, c.laddr.port] for c in conns if c.status == psutil.CONN_LISTEN]
print("LISTEN " + json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "sockets": out}))
"""


def _listeners(tmp_path: Path, env: dict | None = None) -> dict:
    code, out, _ = _run([sys.executable, "-c", _LISTENERS], tmp_path, env=env)
    assert code == 0, out
    return json.loads(next(l for l in out.splitlines() if l.startswith("LISTEN "))[len("LISTEN "):])


def _loopback(ip: str) -> bool:
    ip = ip.removeprefix("::ffff:")
    return ipaddress.ip_address(ip).is_loopback


def test_a_local_ray_instance_started_by_alignlab_listens_on_the_loopback_address_only(tmp_path):
    seen = _listeners(tmp_path)
    assert seen["nodes"] == ["127.0.0.1"], seen
    names = {name for name, _, _ in seen["sockets"]}
    assert {"gcs_server", "raylet"} <= names, seen  # the instance's own servers were found
    outside = [s for s in seen["sockets"] if not _loopback(s[1])]
    assert not outside, f"listening beyond loopback: {outside}"


# ---------------------------------------------------------------- 2. non-finite numbers


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """A storage root with one tiny pretrained model and small task data (seconds, no Ray)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_model import tiny_pretrained

    from alignlab.platform.tasks.task_data import build_tasks

    root = tmp_path_factory.mktemp("faults-root")
    mdir = tiny_pretrained(root)
    tdir = build_tasks(root, langs=("en",), max_docs_per_lang=300, target_snippets=60)
    return root, mdir, tdir


def _ft(**kw):
    from alignlab.platform.fel.finetune_config import FinetuneConfig

    return FinetuneConfig(**{**dict(task="ct", budget=10, max_epochs=3, patience=1, batch_size=8, lr=1e-3,
                                    selection="honest"), **kw})


def test_a_calculation_whose_validation_numbers_are_never_finite_fails_with_its_reason(tiny_root):
    from alignlab.platform.fel.finetune import NonFiniteError, finetune_calculation, load_pretrained
    from alignlab.platform.fel.protocol import fel_split
    from alignlab.platform.tasks.task_data import TaskData

    _, mdir, tdir = tiny_root
    ft = _ft(lr=1e30)  # the first update makes every weight huge: the validation perplexity is inf or nan
    train, val, test = fel_split(TaskData.load(tdir), task_named("ct"), ft)
    with pytest.raises(NonFiniteError, match=r"CT calculation \(fold 0, seed 0, lr 1e\+30\): the validation numbers "
                                             r"were never finite in \d epochs .*diverged"):
        finetune_calculation(load_pretrained(mdir), ft, train, test, val=val)


@pytest.mark.ray
def test_a_study_records_a_diverged_calculation_as_failed_finishes_the_others_and_reports_it(ray_session, tiny_root):
    import dataclasses

    from alignlab.platform.config import to_dict
    from alignlab.platform.report.report import collect_results, write_report
    from alignlab.platform.storage.root import as_storage, read_json, Storage, write_json
    from alignlab.platform.study.grid import run_trials
    from alignlab.platform.study.spec import calc_id

    root, mdir, tdir = tiny_root
    st = as_storage(root)
    sdir = root / Storage.study("diverging")
    cells = [("lr", "1e-3", _ft()), ("lr", "1e-3", _ft(seed=1)), ("lr", "1e30", _ft(lr=1e30))]
    calcs = [{"calc_id": calc_id(mdir.name, ft), "model_key": "m", "model_id": mdir.name, "model_dir": str(mdir),
              "task_dir": str(tdir), "row": r, "col": c, "group": r, "finetune": to_dict(ft), "study_dir": str(sdir),
              "storage": st.uri, "task_id": tdir.name, "study_name": "diverging", "eval_sets": {}}
             for r, c, ft in cells]
    write_json(sdir / "study.json", {
        "name": "diverging", "title": "Diverging", "baseline_col": "1e-3", "baseline_cells": [], "plots": [],
        "notes": "", "corpus_dir": str(root / "corpus" / "none"), "task_dir": str(tdir), "models": {},
        "calculations": [c["calc_id"] for c in calcs],
        "cells": {c["calc_id"]: {"row": c["row"], "col": c["col"], "group": c["group"]} for c in calcs}, "searches": []})
    run_trials(calcs, sdir, max_concurrent=2, progress=False, storage=st)  # does not raise: the study goes on
    rows = {c["col"] + str(c["finetune"]["seed"]): read_json(sdir / "trials" / f"{c['calc_id']}.json") for c in calcs}
    assert rows["1e300"]["status"] == "failed" and "never finite" in rows["1e300"]["error"]
    assert "accuracy" not in rows["1e300"]
    assert rows["1e-30"]["status"] == rows["1e-31"]["status"] == "ok"
    df = collect_results(sdir)
    assert len(df) == 3
    report = write_report(sdir).read_text()
    assert "2 of 3 calculations finished; 1 failed" in report
    failed = report.split("## Failed calculations", 1)[1]
    assert calcs[2]["calc_id"] in failed and "never finite" in failed
    table = report.split("## Accuracy at the best-perplexity epoch", 1)[1].split("##", 1)[0]
    assert "(n=2)" in table and "1e30" not in table
    # A rerun with another pending calculation reuses the study's one Tune experiment folder.
    more = dict(calcs[0], calc_id=calc_id(mdir.name, _ft(seed=2)), finetune=to_dict(_ft(seed=2)))
    run_trials([more], sdir, max_concurrent=1, progress=False, storage=st)
    (exp,) = [p for p in (sdir / "tune").iterdir() if p.is_dir()]
    assert exp.name == "fel"
    assert {c["calc_id"] for c in calcs + [more]} <= {p.name for p in exp.iterdir() if p.is_dir()}


@pytest.mark.ray
def test_a_ctrl_c_after_a_tune_run_of_calculations_stops_the_driver_with_keyboard_interrupt(
        ray_session, tiny_root, interactive_sigint):
    from fault_hooks import assert_ctrl_c_raises_keyboard_interrupt

    from alignlab.platform.config import to_dict
    from alignlab.platform.storage.root import as_storage, read_json, Storage
    from alignlab.platform.study.grid import run_trials
    from alignlab.platform.study.spec import calc_id

    root, mdir, tdir = tiny_root
    st, sdir, ft = as_storage(root), root / Storage.study("ctrl-c"), _ft()
    calc = {"calc_id": calc_id(mdir.name, ft), "model_key": "m", "model_id": mdir.name, "model_dir": str(mdir),
            "task_dir": str(tdir), "row": "lr", "col": "1e-3", "group": "lr", "finetune": to_dict(ft),
            "study_dir": str(sdir), "storage": st.uri, "task_id": tdir.name, "study_name": "ctrl-c", "eval_sets": {}}
    run_trials([calc], sdir, max_concurrent=1, progress=False, storage=st)
    assert read_json(sdir / "trials" / f"{calc['calc_id']}.json")["status"] == "ok"
    assert_ctrl_c_raises_keyboard_interrupt()


@pytest.mark.ray
def test_a_search_records_a_diverged_trial_as_failed_and_picks_its_best_among_the_others(ray_session, tiny_root):
    from alignlab.platform.config import to_dict
    from alignlab.platform.storage.root import as_storage, Storage
    from alignlab.platform.study.search import run_search
    from alignlab.platform.study.spec import calc_id
    from alignlab.platform.study.spec import SearchParam, SearchSpec

    root, mdir, tdir = tiny_root
    st = as_storage(root)
    sdir = root / Storage.study("diverging-search")
    # The base setting (evaluated first) diverges; the sampler then draws from both values.
    spec = SearchSpec(name="lr", model="m", base=_ft(lr=1e30), space=(SearchParam(name="lr", kind="choice", values=(1e-3, 1e30)),),
                      num_samples=4, row="lr", col="searched", scheduler="fifo", search_fold=0)
    ft = spec.search_finetune()
    base = {"calc_id": calc_id(mdir.name, ft, "search"), "model_key": "m", "model_id": mdir.name,
            "model_dir": str(mdir), "task_dir": str(tdir), "row": "lr", "col": "searched", "group": "lr",
            "finetune": to_dict(ft), "study_dir": str(sdir), "storage": st.uri, "task_id": tdir.name,
            "study_name": "diverging-search", "eval_sets": {}}
    summary = run_search(spec, base, sdir, max_concurrent=1, progress=False, storage=st)  # does not raise
    statuses = {t["params"]["lr"]: t["status"] for t in summary["trials"]}
    failed = [t for t in summary["trials"] if t["status"] == "failed"]
    assert failed and all(t["params"]["lr"] == 1e30 and "never finite" in t["error"] for t in failed), summary
    assert statuses.get(1e-3) == "complete" and summary["best_params"] == {"lr": 1e-3}
    assert not [t for t in summary["trials"] if t["status"] == "error"], summary["trials"]


def test_a_pretraining_loop_stops_at_the_first_non_finite_loss_before_reporting_it(tmp_path):
    import dataclasses
    import math

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_model import batches, tiny_tokenizer

    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.loop import NonFiniteLossError, train_loop
    from alignlab.platform.pretrain.pretrain import Pretrainer

    tok = tiny_tokenizer(tmp_path / "tok")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, lr=1e30, max_steps=8, precision="fp32")
    trainer, reported = Pretrainer(cfg, tok), []
    with pytest.raises(NonFiniteLossError, match=r"non-finite at step \d.*train/loss = nan"):
        train_loop(trainer, lambda epoch: iter(batches(tok)), report=lambda m, ck: reported.append(m), log_every=1)
    assert reported and all(math.isfinite(m["train/loss"]) for m in reported)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_diverging_data_parallel_run_stops_with_one_clear_error_its_ranks_together_and_is_never_finished(
        ray_session, smoke_corpus, tmp_path):
    """With unlimited Train retries (`max_failures=-1`): a diverged run must end by itself, not by retrying its
    worker group (where it would diverge again, or fail at once, for ever). DDP (gloo): the ranks agree on each
    step's finiteness (an all-reduce), so they leave the loop at the same step; a rank that stopped alone would leave
    the other waiting in the next gradient all-reduce for ever. (A lone worker's loop stopping at the first
    non-finite loss is the test above; the rest of its path is the same.)"""
    import dataclasses

    from alignlab.platform.presets import Preset
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.loop import NonFiniteLossError
    from alignlab.platform.pretrain.models import is_finished, list_models

    cfg = dataclasses.replace(Preset.named("smoke").pretrain, lr=1e30, max_steps=6, checkpoint_every=2, log_every=1,
                              num_workers=2, cpus_per_worker=0.5)
    root = tmp_path / "root"
    with pytest.raises(NonFiniteLossError, match=r"pretraining of .* stopped: the training loss became non-finite"):
        pretrain(smoke_corpus, cfg, root, max_failures=-1)
    (mdir,) = (root / "models").iterdir()
    assert not is_finished(mdir) and not (mdir / "final").exists()
    assert (mdir / "diverged.json").exists()
    (row,) = list_models(root)
    assert row["finished"] is False and "non-finite" in row["diverged"]
    t0 = time.monotonic()
    with pytest.raises(NonFiniteLossError, match="diverged before.*delete"):  # a rerun is refused at once
        pretrain(smoke_corpus, cfg, root)
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- 4. credentials in storage URIs

SECRET_URIS = [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", "s3://***@bucket/prefix"),
    ("s3://bucket/p?region=eu-west-1&access_key=AKIAEXAMPLE&secret_key=wJalrXUtnFEMI&session_token=FwoGZX",
     "s3://bucket/p?region=eu-west-1&access_key=***&secret_key=***&session_token=***"),
    ("gs://bucket/p", "gs://bucket/p"),
    ("/plain/local/path", "/plain/local/path"),
]


@pytest.mark.parametrize("uri, shown", SECRET_URIS)
def test_credentials_in_a_storage_uri_are_redacted_and_the_rest_is_kept(uri, shown):
    from alignlab.platform.storage.root import Storage, redact

    assert redact(uri) == shown
    assert redact(f"could not open {uri} (denied)") == f"could not open {shown} (denied)"
    if "://" in uri:
        st = Storage(uri, Path("/tmp/cache"))
        for text in (repr(st), str(st), st.url("models/m"), st.shown):
            assert "wJalrXUtnFEMI" not in text and "AKIAEXAMPLE" not in text and "FwoGZX" not in text


def test_a_storage_uri_with_credentials_never_shows_them_in_a_refusal(tmp_path):
    code, out, _ = _run(ALIGNLAB + ["models", "--storage", "nosuchfs://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/x"], tmp_path)
    assert code == 2, out
    line = _one_error_line(out)
    assert "nosuchfs://***@bucket/x" in line and "wJalrXUtnFEMI" not in out and "AKIAEXAMPLE" not in out


def test_a_tune_param_space_gets_the_root_without_credentials_and_the_trial_gets_the_real_one():
    from alignlab.platform.study.grid import trial_calc, tune_safe

    real = "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix"
    calc = {"calc_id": "ct-1", "storage": real, "finetune": {"lr": 1e-3}}
    safe = tune_safe(calc)
    assert safe["storage"] == "s3://***@bucket/prefix" and "wJalrXUtnFEMI" not in json.dumps(safe)
    assert trial_calc(safe, real) == calc
    assert tune_safe({"calc_id": "ct-2"}) == {"calc_id": "ct-2"} and trial_calc({"calc_id": "x"}, None) == {"calc_id": "x"}


def test_the_train_workers_get_the_real_root_inside_their_function_not_in_the_recorded_train_loop_config():
    import inspect

    from alignlab.platform.pretrain.driver import worker_fn
    from alignlab.platform.storage.root import redact

    real = "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix"
    fn = worker_fn(real)
    # One parameter (what Train V2 accepts); the root is a closure variable, pickled with the function.
    assert list(inspect.signature(fn).parameters) == ["config"]
    assert inspect.getclosurevars(fn).nonlocals["storage_uri"] == real
    assert "wJalrXUtnFEMI" not in redact(real)  # what `Storage.shown` puts in train_loop_config


"""The Tune grid of a study's FEL calculations: one Ray Tune trial per pending calculation (no scheduler, no
pruning), each writing `trials/<calc-id>.json` atomically; plus the trial helpers the Optuna search shares
(resources, concurrency, where Tune keeps its state, a calc dict on this node).
"""
from __future__ import annotations

import time
from pathlib import Path

from alignlab.platform.fel.finetune_config import FinetuneConfig, finetune_from_dict
from alignlab.platform.fel.trial_files import RETRY
from alignlab.platform.runtime.ray_env import own_sigint
from alignlab.platform.runtime.resources import check_request
from alignlab.platform.storage.root import Storage, as_storage, redact, write_json
from alignlab.platform.study.spec import DEFAULT_TRIAL_RESOURCES

# The FEL stack and the model store (torch, pyarrow) are imported inside the trial functions that run on Ray
# workers: the driver expands and submits the grid without loading them.


class Progress:
    """Trials done / total and an ETA, printed as trials finish.

    `already`: trials a previous session finished (a resumed search). They count as done, but not in the rate:
    the ETA is this session's seconds per trial it finished, times the trials left."""

    def __init__(self, total: int, enabled: bool, what: str = "trials", already: int = 0):
        self.total, self.done, self.already, self.t0, self.enabled, self.what = \
            total, already, already, time.time(), enabled, what

    def tick(self, extra: str = "", done: int | None = None) -> None:
        self.done = self.done + 1 if done is None else done
        if not self.enabled:
            return
        el, mine = time.time() - self.t0, self.done - self.already
        eta = f"{el / mine * (self.total - self.done):.0f}s" if mine > 0 else "?"
        print(f"[{self.what}] {self.done}/{self.total} done, {el:.0f}s elapsed, ETA {eta}{extra}", flush=True)


def check_trial_resources(resources: dict) -> None:
    """Refuse an FEL trial's resources that no node of the cluster (now or after autoscaling) can hold."""
    check_request("an FEL trial", resources,
                  hint="lower --cpus-per-trial / --gpus-per-trial, or drop --trial-resources")


def concurrency(resources: dict, max_concurrent: int | None) -> int | None:
    """Tune's `max_concurrent_trials`: the user's cap (`--max-concurrent`), or None for no cap.

    Without a cap Tune asks for every pending trial's `resources` at once, runs as many as the cluster holds,
    and an autoscaler sees the rest waiting and adds nodes for them. A cap computed from the cluster's current
    resources (this function's first version) kept a cluster whose head has no CPUs and whose GPU workers
    start at 0 to about one trial at a time: the nodes the trials were waiting for were never asked for."""
    return max_concurrent or None


def threads_per_trial(resources: dict) -> int:
    return max(1, int(resources.get("cpu", 1)))


def trial_device() -> str:
    """Where this trial's calculation runs: the GPU Ray gave the trial (`--gpus-per-trial`), made the current CUDA
    device, when this node's torch can use it; else "cpu", as Train workers without GPUs do. Ray normally sets a
    trial's CUDA_VISIBLE_DEVICES to its own GPU ("cuda:0"); where the node shows the trial more GPUs than its
    own, `devices.device_for_worker` finds its one (shared when the request is a fraction). The trial's row
    records it."""
    import ray

    from alignlab.platform.runtime.devices import ray_worker_device

    return str(ray_worker_device(ray.get_gpu_ids()))


def tune_storage(st: Storage | None, sdir: Path) -> dict:
    """Where Tune keeps its experiment state: under the study at the root (shared by every node)."""
    if st is None or not st.remote:
        return {"storage_path": str(sdir / "tune")}
    return {"storage_path": st.ray_path(st.study(sdir.name, "tune")), "storage_filesystem": st.ray_filesystem()}


FEL_EXPERIMENT = "fel"
"""The Tune experiment folder of a study's FEL calculations: `<study>/tune/fel/<calc-id>/`."""


def run_trials(calcs: list[dict], sdir: Path, *, max_concurrent: int | None = None, progress: bool = True,
               resources: dict | None = None, storage: Storage | None = None) -> None:
    from ray import tune

    resources = dict(resources or DEFAULT_TRIAL_RESOURCES)
    check_trial_resources(resources)
    prog = Progress(len(calcs), progress)

    class _ProgressCallback(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            prog.tick()

    uri = next((c["storage"] for c in calcs if c.get("storage")), None)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(fel_trial, storage_uri=uri), resources),
        param_space={"calc": tune.grid_search([tune_safe(c) for c in calcs]), "threads": threads_per_trial(resources)},
        # Reusing trial actors saves each calculation a fresh worker process (torch import, ~seconds on a small
        # box); a calculation sets its own seeds and builds everything it uses, so its result is unchanged.
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency(resources, max_concurrent), reuse_actors=True,
                                    trial_dirname_creator=lambda t: t.config["calc"]["calc_id"],
                                    trial_name_creator=lambda t: t.config["calc"]["calc_id"]),
        # One experiment folder per study, reused by every rerun: each trial's folder is its calculation id, so a
        # resumed study adds the calculations it had not finished beside the others (not a new fel-<hash> each time).
        run_config=tune.RunConfig(name=FEL_EXPERIMENT,
                                  **tune_storage(storage, sdir), verbose=0, callbacks=[_ProgressCallback()],
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    with own_sigint():
        results = tuner.fit()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} FEL calculation(s) failed; first error: {errors[0]}")


def tune_safe(calc: dict) -> dict:
    """A calc dict as it goes into a Tune param space, which Tune writes to params.json, result.json, its
    experiment state and TensorBoard: the storage URI without credentials (`storage.redact`). The trial gets
    the real URI beside it (`tune.with_parameters`, through the object store; `trial_calc`)."""
    return {**calc, "storage": redact(calc["storage"])} if calc.get("storage") else calc


def trial_calc(calc: dict, storage_uri: str | None) -> dict:
    return {**calc, "storage": storage_uri} if storage_uri and calc.get("storage") else calc


def fel_trial(config: dict, storage_uri: str | None = None) -> None:
    """A Ray Tune function trainable: one FEL calculation, plain PyTorch (no TorchTrainer start-up cost)."""
    import torch
    from ray import tune

    calc = trial_calc(config["calc"], storage_uri)
    torch.set_num_threads(config.get("threads", 1))
    result = run_one(calc, device=trial_device())
    tune.report({**{k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
                 "failed": int(result.get("status") == "failed")})


def run_one(calc: dict, device: str = "cpu") -> dict:
    """Run a calculation described by a study's calc dict on `device` and write its trial file (atomically). A
    calculation whose selection numbers are never finite is written as `status: failed` with the reason (`error`).
    The row records when the trial started and finished (`started_at`, `finished_at`: Unix seconds), so that
    how many trials ran at once can be read from the results."""
    from torch.utils.tensorboard import SummaryWriter

    import torch

    from alignlab.platform.fel.finetune import NonFiniteError, finetune_calculation, load_pretrained
    from alignlab.platform.fel.protocol import context_free_baselines, extra_test_scores, fel_split, test_unit_metrics
    from alignlab.platform.runtime import out_of_memory
    from alignlab.platform.runtime.provenance import code_commit
    from alignlab.platform.tasks.task import task
    from alignlab.platform.tasks.task_data import TaskData
    from alignlab.platform.tasks.task_kinds import declare_all

    started = time.time()
    declare_all(calc.get("declared_tasks"))
    ft = finetune_from_dict(calc["finetune"])
    t = task(ft.task)  # the trial's task object, resolved once and passed to everything below
    calc = localize(calc)
    sdir = Path(calc["study_dir"])
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, test = fel_split(data, t, ft)
    other = other_task_train(data, ft, t)
    pre = load_pretrained(calc["model_dir"])
    tb_dir = sdir / "tensorboard" / f"{calc['row']}|{calc['col']}|{calc['calc_id']}".replace("/", "_").replace(" ", "_")
    writer = SummaryWriter(str(tb_dir))
    try:
        try:
            done = finetune_calculation(pre, ft, train, test, val=val, other_task_train=other, device=device, task=t,
                                        on_epoch=lambda e, m: [writer.add_scalar(f"select/{k}", v, e) for k, v in m.items()])
        except NonFiniteError as e:
            # Recorded as failed, with its reason: the study goes on, the report lists it, a rerun keeps it.
            return _write_trial(calc, sdir, tb_dir, {"status": "failed", "error": str(e)}, started)
        except out_of_memory.ERRORS:
            # Failed too, but not for good: the GPU may have been shared by other trials, or the user lowers the
            # batch; a rerun of the study runs it again (`trial_files.RETRY`).
            if device.startswith("cuda"):
                torch.cuda.empty_cache()  # the actor is reused for the next calculation (reuse_actors)
            line = out_of_memory.finetune_message(ft, pre.model_cfg.label, device)
            return _write_trial(calc, sdir, tb_dir, {"status": "failed", "error": line, RETRY: True}, started)
        tests = {**data.extra_tests(t), **{name: t.load_examples(sdir / "eval" / f)
                                           for name, f in calc.get("eval_sets", {}).items()}}
        res = dict(done.row)
        res["commit"] = code_commit()[0]  # the report says which code produced each number
        res.update(test_unit_metrics(done.model, pre.tok, ft, test, task=t))
        res.update(extra_test_scores(done.model, pre.tok, ft, tests, train + val, data=data, task=t))
        # Baselines learn from the whole budget the model had (its training and validation examples).
        res.update(context_free_baselines(t, train + val, test, data=data))
        hp = {f"ft/{k}": v for k, v in calc["finetune"].items()}
        hp.update({"model": calc["model_key"], "model_id": calc["model_id"], "row": calc["row"], "col": calc["col"]})
        writer.add_hparams(hp, {f"result/{k}": res[k] for k in ("accuracy", "perplexity", "best_accuracy", "epochs")},
                           run_name=".")
    finally:
        writer.close()
    return _write_trial(calc, sdir, tb_dir, {"status": "ok", **res}, started)


def _write_trial(calc: dict, sdir: Path, tb_dir: Path, res: dict, started: float) -> dict:
    import ray

    try:
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001 -- outside a Ray worker the node is simply "local"
        node = "local"
    row = {"calc_id": calc["calc_id"], "model_key": calc["model_key"], "model_id": calc["model_id"],
           "row": calc["row"], "col": calc["col"], "group": calc.get("group", calc["row"]), "node": node,
           **{f"ft_{k}": v for k, v in calc["finetune"].items()}, **res,
           "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
    # What the trial cost on its device, loading and scoring included (a fractional GPU counts whole).
    row["device_seconds"] = round(row["finished_at"] - row["started_at"], 3)
    if "device" in res:
        from alignlab.platform.runtime.devices import device_name

        row["device_name"] = device_name(res["device"])
    write_json(sdir / "trials" / f"{calc['calc_id']}.json", row)
    if calc.get("storage"):
        st = as_storage(calc["storage"])
        if tb_dir.exists():
            st.push(st.study(calc["study_name"], f"tensorboard/{tb_dir.name}"))
        st.push_file(st.study(calc["study_name"], f"trials/{calc['calc_id']}.json"))  # last: marks it finished
    return row


def localize(calc: dict) -> dict:
    """A calc dict with this node's folders: with a remote root, its model and tasks are pulled here first."""
    if not calc.get("storage"):
        return calc
    st = as_storage(calc["storage"])
    if not st.remote:
        return calc
    from alignlab.platform.pretrain.models import fetch_model

    st.pull(st.tasks(calc["task_id"]), marker="stats.json")
    for f in calc.get("eval_sets", {}).values():
        st.pull_file(st.study(calc["study_name"], f"eval/{f}"))
    return {**calc, "model_dir": str(fetch_model(st, calc["model_id"])), "task_dir": str(st.here(st.tasks(calc["task_id"]))),
            "study_dir": str(st.here(st.study(calc["study_name"])))}


def other_task_train(data, ft: FinetuneConfig, task):
    """The multitask partner's training sample for the multitask scheme (`mt:pred+trm`), else None (`task`: the
    object of `ft.task`)."""
    from alignlab.platform.fel.protocol import multitask_train

    return multitask_train(data, ft, task) if ft.scheme == "mt:pred+trm" else None

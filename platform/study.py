"""Studies: a declared set of pretrained models and FEL calculations, run on Ray, answered by a report.

Running a study: (1) build the bundled task datasets and the corpus (task documents held out);
(2) make sure every pretrained model exists -- the registry deduplicates them across studies;
(3) run every pending FEL calculation as a Ray Tune trial; (4) aggregate and report.
Resumable at the calculation level: each finished calculation is written to
`trials/<calc-id>.json` (temp name, renamed), and a rerun -- after a crash, a kill of the driver,
or on purpose -- runs only the calculations without one. The table is the same either way.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from alignlab.platform.config import (CorpusConfig, FinetuneConfig, PretrainConfig, config_hash,
                                      finetune_from_dict, to_dict)
from alignlab.platform.storage import read_json, study_dir, write_json


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    key: str
    """Name of the model inside the study, e.g. "all", "-whp", "768x3"."""
    pretrain: PretrainConfig


@dataclass(frozen=True, kw_only=True)
class CalcSpec:
    """One FEL calculation; `row`/`col` place its result in the report's table."""

    model: str
    finetune: FinetuneConfig
    row: str
    col: str


@dataclass(frozen=True, kw_only=True)
class Study:
    name: str
    title: str
    corpus: CorpusConfig
    models: tuple[ModelSpec, ...]
    calcs: tuple[CalcSpec, ...]
    baseline_col: str
    """Column of the table that significance is tested against (Welch's t-test, p < 0.05), row by row."""
    task_langs: tuple[str, ...] = ("en", "es", "fr")
    task_max_docs_per_lang: int | None = None
    task_snippets: int = 600
    plots: tuple[str, ...] = ()
    """Which plots the report draws: "bars" (accuracy per column with error bars), "budget" (accuracy vs n)."""
    notes: str = ""

    def __post_init__(self) -> None:
        keys = [m.key for m in self.models]
        if len(set(keys)) != len(keys):
            raise ValueError(f"study {self.name}: model keys repeat: {keys}")
        unknown = {c.model for c in self.calcs} - set(keys)
        if unknown:
            raise ValueError(f"study {self.name}: calculations use undeclared models {sorted(unknown)}")
        if self.baseline_col not in {c.col for c in self.calcs}:
            raise ValueError(f"study {self.name}: baseline column {self.baseline_col!r} has no calculations")


def calc_id(model_id: str, ft: FinetuneConfig) -> str:
    return f"{ft.task}-{config_hash(model_id, ft)}"


def run_study(study: Study, root: Path, *, max_concurrent: int | None = None, progress: bool = True) -> Path:
    from alignlab.platform.corpus import build_corpus
    from alignlab.platform.pretrain_ray import pretrain
    from alignlab.platform.protocol import build_tasks
    from alignlab.platform.ray_env import ensure_ray
    from alignlab.platform.report import collect_results, write_report

    t0 = time.time()
    sdir = study_dir(root, study.name)
    sdir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    ensure_ray()
    say(f"[study {study.name}] building task datasets")
    tdir = build_tasks(root, langs=study.task_langs, max_docs_per_lang=study.task_max_docs_per_lang,
                       target_snippets=study.task_snippets, seed=study.corpus.seed)
    corpus_cfg = dataclasses.replace(study.corpus, holdout_ids_file=str(tdir / "heldout_doc_ids.txt"))
    say(f"[study {study.name}] building corpus ({corpus_cfg.source})")
    cdir = build_corpus(corpus_cfg, root, progress=progress)
    mdirs = {}
    for m in study.models:
        say(f"[study {study.name}] pretraining model {m.key!r} ({m.pretrain.model.label}, "
            f"{'+'.join(m.pretrain.objective_names)}, {m.pretrain.max_steps} steps)")
        mdirs[m.key] = pretrain(cdir, m.pretrain, root)
    calcs = []
    for c in study.calcs:
        mid = mdirs[c.model].name
        calcs.append({"calc_id": calc_id(mid, c.finetune), "model_key": c.model, "model_id": mid,
                      "model_dir": str(mdirs[c.model]), "task_dir": str(tdir), "row": c.row, "col": c.col,
                      "finetune": to_dict(c.finetune), "study_dir": str(sdir)})
    write_json(sdir / "study.json", {
        "name": study.name, "title": study.title, "baseline_col": study.baseline_col, "plots": list(study.plots),
        "notes": study.notes, "corpus_dir": str(cdir), "task_dir": str(tdir),
        "models": {m.key: {"model_id": mdirs[m.key].name, "pretrain": to_dict(m.pretrain)} for m in study.models},
        "calculations": [c["calc_id"] for c in calcs],
    })
    pending = [c for c in calcs if not (sdir / "trials" / f"{c['calc_id']}.json").exists()]
    say(f"[study {study.name}] {len(calcs) - len(pending)} of {len(calcs)} calculations already done; "
        f"running {len(pending)}")
    if pending:
        run_trials(pending, sdir, max_concurrent=max_concurrent, progress=progress)
    collect_results(sdir)
    report = write_report(sdir)
    say(f"[study {study.name}] done in {time.time() - t0:.0f}s")
    return report


class _Progress:
    """Trials done / total and an ETA, printed as trials finish."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.t0, self.enabled = total, 0, time.time(), enabled

    def tick(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        el = time.time() - self.t0
        eta = el / self.done * (self.total - self.done)
        print(f"[trials] {self.done}/{self.total} done, {el:.0f}s elapsed, ETA {eta:.0f}s", flush=True)


def run_trials(calcs: list[dict], sdir: Path, *, max_concurrent: int | None = None, progress: bool = True) -> None:
    import ray
    from ray import tune

    prog = _Progress(len(calcs), progress)

    class _ProgressCallback(tune.Callback):
        def on_trial_complete(self, iteration, trials, trial, **info):
            prog.tick()

    cpus = ray.cluster_resources().get("CPU", 1)
    tuner = tune.Tuner(
        tune.with_resources(fel_trial, {"cpu": 1}),
        param_space={"calc": tune.grid_search(calcs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent or max(1, int(cpus)),
                                    trial_dirname_creator=lambda t: t.config["calc"]["calc_id"],
                                    trial_name_creator=lambda t: t.config["calc"]["calc_id"]),
        run_config=tune.RunConfig(name=f"fel-{config_hash(sorted(c['calc_id'] for c in calcs))}",
                                  storage_path=str(sdir / "tune"), verbose=0, callbacks=[_ProgressCallback()],
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    results = tuner.fit()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} FEL calculation(s) failed; first error: {errors[0]}")


def fel_trial(config: dict) -> None:
    """A Ray Tune function trainable: one FEL calculation, plain PyTorch (no TorchTrainer start-up cost)."""
    import torch
    from ray import tune

    calc = config["calc"]
    torch.set_num_threads(1)
    result = run_one(calc)
    tune.report({k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})


def run_one(calc: dict) -> dict:
    """Run a calculation described by a study's calc dict and write its trial file (atomically)."""
    import ray
    from torch.utils.tensorboard import SummaryWriter

    from alignlab.platform.finetune import load_pretrained, run_calculation
    from alignlab.platform.protocol import TaskData, context_free_baselines, fel_split

    ft = finetune_from_dict(calc["finetune"])
    sdir = Path(calc["study_dir"])
    data = TaskData.load(Path(calc["task_dir"]))
    train, val, test = fel_split(data, ft.task, ft)
    other = None
    if ft.scheme == "mt:pred+trm":
        other_cfg = dataclasses.replace(ft, task="ct" if ft.task == "ad" else "ad")
        other, _, _ = fel_split(data, other_cfg.task, other_cfg)
    pre = load_pretrained(calc["model_dir"])
    tb_dir = sdir / "tensorboard" / f"{calc['row']}|{calc['col']}|{calc['calc_id']}".replace("/", "_").replace(" ", "_")
    writer = SummaryWriter(str(tb_dir))
    try:
        res = run_calculation(pre, ft, train, test, val=val, other_task_train=other,
                              on_epoch=lambda e, m: [writer.add_scalar(f"select/{k}", v, e) for k, v in m.items()])
        res.pop("_model")
        res.update(context_free_baselines(ft.task, train, test))
        hp = {f"ft/{k}": v for k, v in calc["finetune"].items()}
        hp.update({"model": calc["model_key"], "model_id": calc["model_id"], "row": calc["row"], "col": calc["col"]})
        writer.add_hparams(hp, {f"result/{k}": res[k] for k in ("accuracy", "perplexity", "best_accuracy", "epochs")},
                           run_name=".")
    finally:
        writer.close()
    try:
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:  # noqa: BLE001 -- outside a Ray worker the node is simply "local"
        node = "local"
    row = {"calc_id": calc["calc_id"], "model_key": calc["model_key"], "model_id": calc["model_id"],
           "row": calc["row"], "col": calc["col"], "node": node,
           **{f"ft_{k}": v for k, v in calc["finetune"].items()}, **res}
    write_json(sdir / "trials" / f"{calc['calc_id']}.json", row)
    return row


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def study_main(build, argv: list[str] | None = None) -> Path:
    """The whole command line of a study script: `--preset`, `--storage`, `--max-concurrent`."""
    import argparse

    from alignlab.platform.config import check_preset
    from alignlab.platform.storage import resolve_root

    ap = argparse.ArgumentParser(description=build.__doc__)
    ap.add_argument("--preset", default="mini", help="smoke | mini | paper (default mini)")
    ap.add_argument("--storage", default=None, help="storage root: a local path or file:// URI (default ./alignlab-storage)")
    ap.add_argument("--max-concurrent", type=int, default=None, help="FEL trials at once (default: one per CPU)")
    args = ap.parse_args(argv)
    study = build(check_preset(args.preset))
    report = run_study(study, resolve_root(args.storage), max_concurrent=args.max_concurrent)
    print(f"Report: {report}")
    return report

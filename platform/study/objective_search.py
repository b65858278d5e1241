"""A search over the pretraining objective mixture: Ray Tune + Optuna, each trial a pretrained model scored by FEL.

A trial's setting is one on/off switch and one loss weight per candidate objective. The trial builds the
preset's `PretrainConfig` with the objectives that are on (at their weights), pretrains it through the model
registry (`pretrain.driver.pretrain`: an identical config is trained once and then found, across trials and
studies; weights are choices from a short grid so that equal settings do occur), then finetunes each of the
search's tasks (the registered ones, or a user's declared ones: `study.tasks.search_with_tasks`) at the
protocol's (fold, seed) points of the preset and reports the mean **validation** accuracy (and the task's own
metrics, e.g. span F1) of each (honest mode: the test set is never loaded by a search, as in `study.run_search`).

Multi-objective, not a scalarisation: OptunaSearch gets `metric=[ct, ad]`, `mode=["max", "max"]` (Optuna
`directions`; its TPE sampler handles several objectives), and the answer is the Pareto front of the
trials: the mixtures no other trial beats on both tasks. Why: the two tasks pull toward different aligned
objectives (CT toward WHP, AD toward PAD, the paper's Table 5), so the interesting result is the trade-off
itself; a fixed weighted sum would hide it behind an arbitrary exchange rate between CT and AD points.

Trials run one at a time by default (`max_concurrent=1`): each starts a TorchTrainer whose Ray Data pipeline
needs a free CPU (docs/cluster.md#ray-data-needs-a-whole-cpu), so side-by-side trials on a small box starve each
other. No scheduler and no pruning: a pretraining run is only comparable at its full budget. The trial is a Tune
function trainable that drives its own TorchTrainer (the Train-V2 pattern of
docs/cluster.md#a-torchtrainer-inside-a-tune-trial-or-a-task; `Tuner(trainer)` is gone).

Its state is a persistent Optuna study (`optuna_study`: a journal file by default), so a search killed mid-way
resumes through Optuna, and the report adds Optuna's parameter importances, one plot per task.

    <root>/studies/<name>/{search.json, search.optuna.journal, report.md, plots/, tune/}
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from alignlab.platform.config import PretrainConfig, config_hash, pretrain_from_dict, to_dict
from alignlab.platform.corpus.corpus_config import CorpusConfig
from alignlab.platform.encoder.registry import objective_config, resolve_objectives
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.finetune_config import FinetuneConfig, finetune_from_dict
from alignlab.platform.fel.protocol import fel_split, test_unit_metrics
from alignlab.platform.runtime.ray_env import own_sigint, quiet_ray_data, ensure_ray
from alignlab.platform.runtime.resources import RAY_DATA_CPUS
from alignlab.platform.storage.root import as_storage, read_json, resolve_root, Storage, write_json, write_text
from alignlab.platform.study.grid import trial_device
from alignlab.platform.tasks.holdout import require_holdout
from alignlab.platform.tasks.task import task, task_names
from alignlab.platform.tasks.task_data import TaskData, build_tasks
from alignlab.platform.tasks.task_kinds import declarations, declare_all

# Optuna, the Tune searcher (Ray Tune), the corpus and the model store (pyarrow) are imported inside the
# functions that run the search or a trial; declaring one loads none of them.


def val_metric(task: str, metric: str = "accuracy") -> str:
    """The key a trial reports for a task's metric: its mean over the points, on the validation splits."""
    return f"{task}_val_{metric}"


@dataclass(frozen=True, kw_only=True)
class MixSearchSpec:
    name: str
    title: str
    corpus: CorpusConfig
    pretrain: PretrainConfig
    """The preset's pretraining run; its objectives are replaced by each trial's mixture."""
    finetune: FinetuneConfig
    """The preset's FEL settings (honest selection); task, fold and seed are set per calculation."""
    candidates: tuple[str, ...]
    """Objectives a trial may switch on."""
    weights: tuple[float, ...] = (0.3, 1.0, 3.0)
    """The weight grid of every objective."""
    points: tuple[tuple[int, int], ...] = ((0, 0), (1, 1))
    """(fold, seed) of each task's calculations in a trial."""
    num_samples: int = 8
    seed: int = 0
    task_max_docs_per_lang: int | None = None
    tasks: tuple[str, ...] = ()
    """The tasks each trial scores (empty: every registered task, the built-in ones unless others are declared)."""
    maximize: tuple[str, ...] = ()
    """What the search maximizes, trial keys such as `ner_val_span_f1` (empty: each scored task's validation
    accuracy, one objective per task)."""
    declared: tuple[dict, ...] = ()
    """Portable declarations of the declared tasks the search uses (`task_kinds.declarations`: name, kind,
    labels and a digest of the files): in the search's name and id, and re-declared in every trial."""

    def __post_init__(self) -> None:
        resolve_objectives(self.candidates)  # unknown names fail here
        if self.finetune.selection != "honest":
            raise ValueError(f"{self.name}: an objective search selects on validation data only (selection='honest')")
        if self.num_samples < 1 or not self.weights or min(self.weights) <= 0 or not self.points:
            raise ValueError(f"{self.name}: num_samples >= 1, positive weights and at least one point are needed")

    def scored_tasks(self) -> tuple[str, ...]:
        return self.tasks or task_names()

    def metrics(self) -> tuple[str, ...]:
        """What each trial's Optuna trial gets as its values (all maximized)."""
        return self.maximize or tuple(val_metric(t) for t in self.scored_tasks())

    def space(self) -> dict:
        """Flat Optuna space (same keys in every trial): `on_<obj>` and `w_<obj>` per candidate."""
        from optuna.distributions import CategoricalDistribution

        out = {}
        for n in self.candidates:
            out[f"on_{n}"] = CategoricalDistribution([True, False])
            out[f"w_{n}"] = CategoricalDistribution(list(self.weights))
        return out

    def mixture(self, params: dict) -> tuple[tuple[str, float], ...]:
        return mixture(self.candidates, params)

    def pretrain_for(self, params: dict) -> PretrainConfig:
        return pretrain_for(self.pretrain, self.mixture(params))


def mixture(candidates, params: dict) -> tuple[tuple[str, float], ...]:
    """(objective, weight) of the switched-on objectives; all off means the first candidate alone (weight 1)."""
    on = tuple((n, float(params[f"w_{n}"])) for n in candidates if params[f"on_{n}"])
    return on or ((candidates[0], 1.0),)


def pretrain_for(base: PretrainConfig, mix) -> PretrainConfig:
    return dataclasses.replace(base, objectives=tuple(objective_config(n, weight=w) for n, w in mix))


def pareto_front(rows: list[dict], keys) -> list[int]:
    """Indices of the rows no other row dominates (>= on every key, > on one); NaN rows never make the front."""
    ok = [i for i, r in enumerate(rows) if all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) for k in keys)]
    front = []
    for i in ok:
        a = [rows[i][k] for k in keys]
        dominated = any(all(rows[j][k] >= x for k, x in zip(keys, a)) and any(rows[j][k] > x for k, x in zip(keys, a))
                        for j in ok if j != i)
        if not dominated:
            front.append(i)
    return front


KEPT = ("model_id", "objectives", "pretrain_s", "val_scores")
"""What a trial reports besides the maximized values, kept by Optuna (`val_scores`: every task's metrics, JSON)."""

TRIAL_CPUS = 0.1
"""A trial's own CPUs: it is a driver (its TorchTrainer asks for the workers' CPUs) that then runs FEL."""


def beside_trials(cfg: PretrainConfig, total_cpus: float, concurrent: int) -> PretrainConfig:
    """`cfg` with each Train worker's logical CPUs cut so that `concurrent` trials, each a driver of `TRIAL_CPUS`
    plus its pretraining run, still leave Ray Data its whole CPU
    (docs/cluster.md#ray-data-starves-beside-a-01-cpu-trial-on-2-cpus) on `total_cpus`.

    Found running the mini search on 2 CPUs: trial 0.1 + worker 1.0 left 0.9, and the run's parquet reads waited
    for ever. `cpus_per_worker` is a runtime field (not in the model id) and torch's thread count is kept, so the
    model and its speed are unchanged; only Ray's bookkeeping is. A request that fits is returned as it is."""
    workers = cfg.num_workers * concurrent
    free = total_cpus - TRIAL_CPUS * concurrent - RAY_DATA_CPUS
    if cfg.cpus_per_worker * workers <= free + 1e-9 or free <= 0:
        return cfg  # it fits, or nothing would (the resource check then says so)
    threads = cfg.threads_per_worker or max(1, int(cfg.cpus_per_worker))
    return dataclasses.replace(cfg, cpus_per_worker=math.floor(100 * free / workers) / 100, threads_per_worker=threads)


def search_id(spec: MixSearchSpec, task_id: str) -> str:
    """The search's Tune experiment and Optuna study name. Its tasks, objectives and declarations enter only
    when set, so a search of the built-in tasks keeps the id it had before tasks could be declared."""
    own = [{"tasks": list(spec.tasks), "maximize": list(spec.maximize), "declared": list(spec.declared)}] \
        if (spec.tasks or spec.maximize or spec.declared) else []
    return "objective-search-" + config_hash(spec.name, spec.pretrain, spec.finetune, list(spec.candidates),
                                             list(spec.weights), [list(p) for p in spec.points], spec.seed, task_id,
                                             *own)


def check_declared(spec: MixSearchSpec) -> None:
    """The driver builds the declared tasks' data from their files: each must be declared here, from the same
    files as in the spec (`task_kinds.declare_task`, or `--task` of the script)."""
    here = {d["name"]: d for d in declarations()}
    for d in spec.declared:
        if here.get(d["name"]) != d:
            raise ValueError(f"search {spec.name}: task {d['name']!r} is not declared in this process "
                             f"{'from the same files' if d['name'] in here else ''} (declare_task it first)")
    unknown = sorted(set(spec.scored_tasks()) - set(task_names()))
    if unknown:
        raise ValueError(f"search {spec.name}: no task named {', '.join(unknown)} (known: {', '.join(task_names())})")


def mix_trial(config: dict, storage_uri: str | None = None, concurrent: int = 1) -> None:
    """Ray Tune function trainable: pretrain this trial's mixture (or find it), then FEL on the search's tasks (validation)."""
    import numpy as np
    import ray
    import torch
    from ray import tune

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import fetch_model

    ctx = config["ctx"]
    declare_all(ctx.get("declared"))  # the search's declared tasks, in this worker process too
    torch.set_num_threads(ctx.get("threads", 1))
    quiet_ray_data()  # the DataContext is per process: the same row order as from the driver
    params = {k: v for k, v in config.items() if k != "ctx"}
    pre_cfg = pretrain_for(pretrain_from_dict(ctx["pretrain"]), mixture(ctx["candidates"], params))
    # Here, where the trial runs, not only in the driver: the fit depends on the cluster the trial sees.
    pre_cfg = beside_trials(pre_cfg, ray.cluster_resources().get("CPU", 0.0), concurrent)
    st = resolve_root(storage_uri or ctx["storage"])
    t0 = time.time()
    mdir = pretrain(Path(ctx["corpus_dir"]), pre_cfg, st)
    pre = load_pretrained(fetch_model(st, mdir.name))
    pretrain_s = time.time() - t0
    data = TaskData.load(Path(ctx["task_dir"]))
    base = finetune_from_dict(ctx["finetune"])
    out = {"model_id": mdir.name, "objectives": "+".join(pre_cfg.objective_names), "pretrain_s": pretrain_s}
    device = trial_device()  # "cuda" only when the trial itself was given a GPU
    scores = {}
    for name in ctx.get("tasks") or task_names():
        t = task(name)  # resolved once, passed to every calculation of the task
        per_point = []
        for fold, seed in ctx["points"]:
            ft = dataclasses.replace(base, task=name, fold=fold, seed=seed, refit=False)  # scored on val: no refit
            train, val, _ = fel_split(data, t, ft)  # the test split is not used by a search
            calc = finetune_calculation(pre, ft, train, val, val=val, device=device, task=t)
            per_point.append({"accuracy": calc.row["accuracy"],
                              **test_unit_metrics(calc.model, pre.tok, ft, val, task=t)})
        for metric in per_point[0]:  # accuracy, and the task's own metrics (a tagging task's span F1)
            scores[val_metric(name, metric)] = float(np.mean([p[metric] for p in per_point]))
    tune.report({**out, **scores, "val_scores": json.dumps(scores)})


def run_objective_search(spec: MixSearchSpec, root: Path | Storage, *, max_concurrent: int = 1,
                         progress: bool = True, optuna_storage: str | None = None) -> Path:
    """Run (or find, or resume) the search; writes search.json and report.md and returns the report's path.

    Its state is a persistent Optuna study (`optuna_study`): the journal `search.optuna.journal` beside
    search.json, or the RDB URL `optuna_storage` (else `$ALIGNLAB_OPTUNA_STORAGE`). A rerun of an interrupted
    search runs only the trials the study lacks; a point its dead driver was pretraining is tried again and
    its pretraining resumes from the run's last Train checkpoint (the model registry)."""
    from ray import tune

    from alignlab.platform.corpus.corpus import build_corpus, load_manifest
    from alignlab.platform.storage.optuna_place import JOURNAL_SUFFIX, study_place
    from alignlab.platform.study.optuna_study import finished_trials, open_study, trial_counts
    from alignlab.platform.study.search_tune import OptunaStudySearch, TellTuneErrors, run_rounds

    t0 = time.time()
    st = as_storage(root)
    sdir = st.here(st.study(spec.name))
    sdir.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)
    check_declared(spec)
    ensure_ray()
    tdir = build_tasks(st, max_docs_per_lang=spec.task_max_docs_per_lang, seed=spec.corpus.seed)
    cdir = build_corpus(dataclasses.replace(spec.corpus, holdout_ids_file=str(tdir / "heldout_doc_ids.txt")), st,
                        progress=progress, task_dir=tdir)
    require_holdout(load_manifest(cdir), tdir.name)
    name = search_id(spec, tdir.name)
    out_file = sdir / "search.json"
    if out_file.exists() and read_json(out_file).get("tune_name") == name and \
            len(read_json(out_file)["trials"]) >= spec.num_samples:
        say(f"[search {spec.name}] already done: {out_file}")
        return write_objective_report(sdir)
    import ray

    fitted = beside_trials(spec.pretrain, ray.cluster_resources().get("CPU", 0.0), max_concurrent)  # what mix_trial does
    if fitted != spec.pretrain:
        say(f"[search {spec.name}] each Train worker gets {fitted.cpus_per_worker:g} logical CPUs (not "
            f"{spec.pretrain.cpus_per_worker:g}) so that Ray Data keeps a whole CPU beside the trial; same model id")
    ctx = {"pretrain": to_dict(spec.pretrain), "finetune": to_dict(spec.finetune), "candidates": list(spec.candidates),
           "points": [list(p) for p in spec.points], "corpus_dir": str(cdir), "task_dir": str(tdir), "storage": st.shown,
           "threads": 1, "tasks": list(spec.scored_tasks()), "declared": list(spec.declared)}
    metrics, tasks = list(spec.metrics()), ", ".join(t.upper() for t in spec.scored_tasks())
    say(f"[search {spec.name}] {spec.num_samples} Optuna trials over {', '.join(spec.candidates)} "
        f"(on/off x weights {list(spec.weights)}), each pretraining a model and scoring {tasks}; maximizing {', '.join(metrics)}")
    place = study_place(name, sdir / f"search{JOURNAL_SUFFIX}", url=optuna_storage, root=st,
                        journal_rel=st.study(spec.name, f"search{JOURNAL_SUFFIX}"))
    place.pull()
    study = open_study(place, ["maximize"] * len(metrics), spec.seed)
    # The param space (written by Tune to disk) holds the root without credentials; the trial gets the real URI.
    trainable = tune.with_resources(tune.with_parameters(mix_trial, storage_uri=st.uri, concurrent=max_concurrent),
                                    {"cpu": TRIAL_CPUS})

    def fit_round(session, left: int) -> None:
        done0 = trial_counts(study)[0]

        class _Progress(tune.Callback):
            def on_trial_complete(self, iteration, trials, trial, **info):
                r = trial.last_result or {}
                done = done0 + sum(t.status == "TERMINATED" and t is not trial for t in trials) + 1  # not yet marked
                accs = " ".join(f"{m} {r.get(m, float('nan')):.3f}" for m in metrics)
                say(f"[search {spec.name}] {done}/{spec.num_samples} trials, {time.time() - t0:.0f}s: "
                    f"{r.get('objectives')} {accs}", flush=True)

        searcher = OptunaStudySearch(study, session, spec.space(), metrics=metrics, num_samples=spec.num_samples,
                                     max_concurrent=max_concurrent, keep=KEPT,
                                     on_told=place.push)
        # A fresh experiment under the same name each driver session: the Optuna study is what resumes.
        tuner = tune.Tuner(
            trainable, param_space={"ctx": ctx},
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=left,
                                        trial_dirname_creator=lambda t: f"mix-{t.trial_id}",
                                        trial_name_creator=lambda t: f"mix-{t.trial_id}"),
            run_config=tune.RunConfig(name=name, storage_path=str(sdir / "tune"), verbose=0,
                                      callbacks=[_Progress(), TellTuneErrors(searcher)],
                                      failure_config=tune.FailureConfig(max_failures=1)))
        with own_sigint():
            tuner.fit()

    run_rounds(study, place, spec.num_samples, fit_round, label=f"[search {spec.name}]", say=say)
    trials = [mix_row(spec, t) for t in finished_trials(study)]
    trials.sort(key=lambda t: (t.get("model_id", ""), str(t["params"])))
    front = pareto_front(trials, metrics)
    for i, t in enumerate(trials):
        t["pareto"] = i in front
    if not front:
        raise RuntimeError(f"search {spec.name}: no trial finished ({[t.get('error') for t in trials]})")
    write_json(out_file, {"name": spec.name, "title": spec.title, "tune_name": name, "metrics": metrics,
                          "modes": ["max"] * len(metrics), "tasks": list(spec.scored_tasks()),
                          "declared": list(spec.declared),
                          "sampler": f"optuna TPE, {'multi' if len(metrics) > 1 else 'single'}-objective "
                                     f"(seed {spec.seed})",
                          "candidates": list(spec.candidates), "weights": list(spec.weights),
                          "points": [list(p) for p in spec.points], "finetune": to_dict(spec.finetune),
                          "pretrain": to_dict(spec.pretrain), "trials": trials,
                          "pareto_front": [trials[i]["model_id"] for i in front],
                          "tune_dir": str(sdir / "tune" / name), "optuna": place.summary()})
    report = write_objective_report(sdir)
    if st.remote:
        st.push(st.study(spec.name), exclude=("tune/",))
    say(f"[search {spec.name}] done in {time.time() - t0:.0f}s")
    return report


def mix_row(spec: MixSearchSpec, t) -> dict:
    """A finished trial of the study as a row of search.json: complete (its accuracies, model) or error."""
    from optuna.trial import TrialState

    if t.state != TrialState.COMPLETE:
        return {"status": "error", "error": t.user_attrs.get("error") or t.user_attrs.get("failed", "no result"),
                "params": t.params}
    return {"status": "complete", "params": t.params, "mixture": [list(x) for x in spec.mixture(t.params)],
            **json.loads(t.user_attrs.get("val_scores") or "{}"), **dict(zip(spec.metrics(), t.values)),
            **{k: t.user_attrs.get(k) for k in ("model_id", "objectives", "pretrain_s")}}


def metric_label(key: str) -> str:
    """`ner_val_span_f1` -> `NER val span_f1` (a report column)."""
    task, sep, metric = key.partition("_val_")
    return f"{task.upper()} val {metric.replace('accuracy', 'acc')}" if sep else key


def write_objective_report(sdir: Path) -> Path:
    s = read_json(sdir / "search.json")
    done = [t for t in s["trials"] if t["status"] == "complete"]
    metrics = s["metrics"]
    tasks = s.get("tasks") or [m.partition("_val_")[0] for m in metrics]
    declared = [d["name"].upper() for d in s.get("declared", [])]
    front_note = ("**Pareto front** (no other trial is at least as good on every maximized metric and better on one)"
                  if len(metrics) > 1 else "**Best trial** (the maximized metric's highest value)")
    lines = [f"# {s['title']}", "",
             f"Optuna search ({s['sampler']}) over the pretraining objective mixture: each objective of "
             f"{', '.join(s['candidates'])} on or off, with a weight from {s['weights']}. Each trial pretrains its mixture "
             f"(one registry entry per distinct mixture) and is scored by FEL on {', '.join(t.upper() for t in tasks)}"
             f"{' (declared from files: ' + ', '.join(declared) + ')' if declared else ''}: mean **validation** scores "
             f"over {len(s['points'])} (fold, seed) points per task, honest selection; the test sets are not used. "
             f"Maximized: {', '.join(metric_label(m) for m in metrics)}.", "",
             f"{len(done)} of {len(s['trials'])} trials finished, {len({t['model_id'] for t in done})} distinct models. "
             f"{front_note} in bold.", "",
             "| mixture (objective × weight) | model | "
             + "".join(f"{metric_label(m)} | " for m in metrics) + "Pareto |",
             "|---|---|" + "---|" * len(metrics) + "---|"]
    for t in sorted(done, key=lambda t: (not t["pareto"], -sum(t[m] for m in metrics))):
        mix = ", ".join(f"{n}×{w:g}" for n, w in t["mixture"])
        accs = [f"{100 * t[m]:.1f}" for m in metrics]
        if t["pareto"]:
            mix, accs = f"**{mix}**", [f"**{a}**" for a in accs]
        lines.append(f"| {mix} | `{t['model_id']}` | {' | '.join(accs)} | {'yes' if t['pareto'] else ''} |")
    errors = [t for t in s["trials"] if t["status"] != "complete"]
    if errors:
        lines += ["", f"{len(errors)} trial(s) failed; first error: {errors[0].get('error')}"]
    from alignlab.platform.report.search_importance import importance_lines

    lines += ["", "## Parameter importance", ""] + importance_lines(sdir, s.get("optuna"), s["name"], metrics)
    out = sdir / "report.md"
    write_text(out, "\n".join(lines) + "\n")
    return out

"""What a study needs before anything runs: which models and calculations exist at the storage root, which must
be made, and an estimate of the device-hours they cost (`alignlab plan`, and `--dry-run` on every study script).

Read only: nothing is built, locked or written, and Ray is not started. The ids are the ones `run_study` would
use, which hash the corpus id, which hashes the held-out task documents; so they are exact only once the task
folder exists at the root. Before that every model and calculation counts as to be made. Estimates come from
measured throughput (`throughput.measured_rates`: the models at the root, else `throughput.MEASURED`).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from alignlab.platform.corpus.corpus_repeats import MAX_CORPUS_REPEATS, corpus_repeats, estimated_train_rows, train_rows
from alignlab.platform.runtime.precision import resolve_precision
from alignlab.platform.runtime.throughput import estimate_device_hours, measured_rates, peak_flops
from alignlab.platform.storage.root import MODELS, STUDIES, as_storage, Storage
from alignlab.platform.study.layout import side_by_side, wall_hours
from alignlab.platform.study.spec import calc_id

# The corpus and model ids, the protocol and the registry (torch, pyarrow) are imported inside `study_plan`:
# importing the plan's formatting loads none of them.


def study_plan(study, root: Path | Storage, *, device: str = "cpu", gpus: float | None = None,
               parallel: int | None = None, trial_gpus: float = 0.0) -> dict:
    """The plan of `study` at `root` on `device` ("cpu" or a GPU name such as "H100", matched against the device
    names runs recorded): {"models": [...], "calculations": {...}, "searches": [...], "device_hours": ...,
    "layout": {...}}. The layout lays the models out on `gpus` GPUs (default: this machine's; on "cpu", none), `parallel`
    side by side when given (else as a study would, `layout.side_by_side`), and FEL trials of `trial_gpus` each."""
    from alignlab.platform.corpus.corpus_identity import HELDOUT_FILE, _read_ids, content_holdout, corpus_id
    from alignlab.platform.encoder.registry import corpus_labellers
    from alignlab.platform.pretrain.cost import expected_run_flops
    from alignlab.platform.pretrain.models import model_finished, model_id
    from alignlab.platform.tasks.task_data import tasks_rel

    st = as_storage(root)
    rel, _ = tasks_rel(langs=study.task_langs, max_docs_per_lang=study.task_max_docs_per_lang,
                       seed=study.corpus.seed, **dict(study.task_options))
    tdir = st.local / rel
    cid = None
    if st.finished(rel, legacy="stats.json") and (tdir / HELDOUT_FILE).is_file():
        # As build_corpus names it: the held-out ids, and the content holdout of the task folders it checks.
        ccfg = dataclasses.replace(study.corpus, holdout_ids_file=str(tdir / HELDOUT_FILE))
        ids, tdirs = _read_ids(tdir / HELDOUT_FILE), {tdir}
        if ccfg.hold_out_tasks:  # the corpus's own task folder (heldout_doc_ids), when it exists already
            own, _ = tasks_rel(max_docs_per_lang=ccfg.task_max_docs_per_lang, seed=ccfg.seed)
            if not (st.local / own / HELDOUT_FILE).is_file():
                ids = None
            else:
                ids |= _read_ids(st.local / own / HELDOUT_FILE)
                tdirs.add(st.local / own)
        if ids is not None:
            cid = corpus_id(ccfg, sorted(ids), labellers=corpus_labellers(), content=content_holdout(sorted(tdirs)))
    corpus_built = cid is not None and st.finished(st.corpus(cid), legacy="manifest.json")
    # The rows each model's examples are drawn from: exact once the corpus is built, else estimated from the
    # packaged sources' words (None for a dump or web text, which only a build reads).
    rows = train_rows(st.read_json(st.corpus(cid, "manifest.json"))) if corpus_built else estimated_train_rows(
        study.corpus)
    rates = measured_rates(st.here(MODELS))
    gpu = device.lower() != "cpu"
    models, mids = [], {}
    for m in study.models:
        cfg = m.pretrain
        precision = resolve_precision(cfg.precision, gpu=gpu)
        mid = model_id(cid, dataclasses.replace(cfg, precision=precision)) if cid else None
        mids[m.key] = mid
        done = bool(mid) and model_finished(st, mid)
        size = f"{cfg.model.hidden}x{cfg.model.num_layers}"
        if done or cfg.max_steps == 0:  # an untrained model is written in seconds, with no device time
            hours, source = 0.0, "exists" if done else "untrained: no pretraining"
        else:
            hours, source = estimate_device_hours(size, device, precision, cfg.max_steps * cfg.batch_size, rates)
        # A run packed onto 1/K of a GPU (layout.pack) holds the GPU for 1/K of the hours it takes alone.
        share = cfg.gpus_per_worker if gpu and cfg.use_gpu else 1.0
        hours = None if hours is None else hours * share
        # The one FLOP count (throughput.batch_flops) of the whole run, with full rows; with the estimate's hours and
        # the device's peak, the MFU that estimate assumes.
        flops = expected_run_flops(cfg, study.corpus.vocab_size)
        peak = peak_flops(device, precision)
        mfu = flops / (hours * 3600 * peak) if hours and peak else None
        models.append({"key": m.key, "model_id": mid, "size": size, "precision": precision, "steps": cfg.max_steps,
                       "global_batch": cfg.batch_size, "workers": cfg.num_workers, "exists": done,
                       "gpus_per_worker": share,
                       "device_hours": hours, "source": source, "flops": flops, "mfu": mfu,
                       "corpus_repeats": corpus_repeats(cfg, rows) if rows and cfg.max_steps else None,
                       # Data-parallel: the global batch split evenly over the workers (docs/cluster.md).
                       "per_device_batch": cfg.batch_size // cfg.num_workers})
    finished = {f[: -len(".json")] for f in st.list(st.study(study.name, "trials")) if f.endswith(".json")}
    pending = len(study.calcs)
    if cid and not study.eval_files:  # with extra test files the ids also hash the staged files' names
        ids = [calc_id(mids[c.model], c.finetune, "", tdir.name) for c in study.calcs]
        pending = sum(i not in finished for i in ids)
    searched = {f for f in st.list(st.study(study.name, "searches")) if f.endswith(".json")}
    searches = [{"name": s.name, "trials": s.num_samples, "done": f"{s.name}.json" in searched}
                for declared in study.searches for s in declared.nested()]
    search_trials = sum(s["trials"] for s in searches if not s["done"])
    per_calc = fel_seconds(st.here(STUDIES), device)
    fel_hours = None if per_calc is None else (pending + search_trials) * per_calc / 3600
    model_hours = [m["device_hours"] for m in models]
    total = None if None in model_hours or fel_hours is None else sum(model_hours) + fel_hours
    if gpus is None:  # this machine's GPUs; planned on a laptop for a GPU, one model's workers (one at a time)
        gpus = 0.0 if not gpu else float(_local_gpus() or max(m.pretrain.num_workers for m in study.models))
    side = parallel or (side_by_side({"GPU": gpus, "CPU": float("inf")}, [m.pretrain for m in study.models])
                        if gpu else 1)  # a plan for a cluster assumes its nodes have the CPUs (cluster.yaml's do)
    trials = max(1, int(gpus // trial_gpus)) if gpu and trial_gpus and gpus else None
    layout = {"gpus": gpus, "side_by_side": side, "trials_at_once": trials,
              "pretrain_device_hours": None if None in model_hours else sum(model_hours),
              "pretrain_wall_hours": wall_hours(model_hours, [m["workers"] * m["gpus_per_worker"] for m in models],
                                                  side),
              "fel_device_hours": fel_hours,
              "fel_wall_hours": None if fel_hours is None or trials is None else fel_hours / trials}
    return {"study": study.name, "device": device, "tasks_built": cid is not None, "corpus_id": cid,
            "corpus_built": corpus_built, "corpus_rows": rows, "corpus_rows_exact": corpus_built, "models": models,
            "calculations": {"total": len(study.calcs), "pending": pending, "seconds_each": per_calc,
                             "device_hours": fel_hours},
            "searches": searches, "device_hours": total, "layout": layout}


def default_device(study) -> str:
    """The device kind a plan estimates for when none is named: this machine's first GPU when the study's models
    train on GPUs and one is here, "cpu" otherwise (a GPU study planned on a laptop needs `--device NAME`)."""
    import torch

    if any(m.pretrain.use_gpu for m in study.models) and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0




def fel_seconds(studies_root: Path, device: str) -> float | None:
    """The mean device-seconds of a finished FEL calculation on `device` over the trial files under
    `studies_root` (all studies), or None when none ran there."""
    secs = []
    for f in Path(studies_root).glob("*/trials/*.json"):
        try:
            row = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        name = str(row.get("device_name") or row.get("device") or "")
        on = name == "cpu" if device.lower() == "cpu" else device.lower() in name.lower()
        s = row.get("device_seconds", row.get("seconds"))
        if on and isinstance(s, (int, float)):
            secs.append(float(s))
    return sum(secs) / len(secs) if secs else None


def format_plan(p: dict) -> str:
    """The plan as a person reads it: one line per model, the calculations, the total."""
    def hours(h):
        return "unknown" if h is None else f"{h:.3g} device-h"

    lines = [f"Plan of study {p['study']} on {p['device']} (nothing has run):",
             "  task data and corpus: " + ("corpus " + p["corpus_id"] + (" built" if p["corpus_built"] else
                                                                          " to build")
                                           if p["tasks_built"] else "not built yet (model ids not known yet)"),
             "  corpus training rows: " + (
                 "unknown until the corpus is built (its sources are files only a build reads)" if p["corpus_rows"] is None
                 else f"{p['corpus_rows']:,} " + ("(its manifest)" if p["corpus_rows_exact"] else
                                                  "(estimated from its sources' words)")
                 + f"; a model that repeats them more than {MAX_CORPUS_REPEATS} times is refused"),
             "  models:"]
    for m in p["models"]:
        state = "exists" if m["exists"] else ("to write" if m["steps"] == 0 else "to train")
        mfu = "" if m.get("mfu") is None else f" at {m['mfu']:.1%} MFU"
        r = m.get("corpus_repeats")
        repeats = "" if r is None else f"  {r:,.0f}" if r >= 10 else f"  {r:.2g}"
        repeats = repeats and repeats + " passes over the corpus" + (
            f" (refused: over {MAX_CORPUS_REPEATS})" if r > MAX_CORPUS_REPEATS else "")
        split = f", {m['per_device_batch']} per device" if m["workers"] > 1 else ""
        g = m.get("gpus_per_worker", 1.0)
        split += f", {round(1 / g)} models per GPU" if g < 1 else ""
        lines.append(f"    {m['key']:<24} {m['size']:>7} {m['precision']:<5} {m['steps']} steps x {m['global_batch']} "
                     f"({m['workers']} worker{'s' if m['workers'] != 1 else ''}{split}){repeats}  {m['flops']:.2g} FLOP  {state:<8}  "
                     f"{hours(m['device_hours'])}{mfu}  [{m['source']}]  {m['model_id'] or ''}")
    c = p["calculations"]
    each = "no measured FEL calculation on this device" if c["seconds_each"] is None else \
        f"{c['seconds_each']:.1f} device-s each, mean of the trial files at the root"
    lines.append(f"  FEL calculations: {c['total']}, of which {c['pending']} to run  {hours(c['device_hours'])}  "
                 f"[{each}]")
    for s in p["searches"]:
        lines.append(f"  search {s['name']}: {s['trials']} trials, {'done' if s['done'] else 'to run'}")
    lay = p.get("layout")
    if lay:
        def wall(h):
            return "unknown" if h is None else f"{h:.3g} h wall"

        on = f"{lay['gpus']:g} GPU{'s' if lay['gpus'] != 1 else ''}" if lay["gpus"] else "CPUs"
        lines.append(f"  layout on {on}: pretraining {lay['side_by_side']} model{'s' if lay['side_by_side'] != 1 else ''}"
                     f" side by side, {hours(lay['pretrain_device_hours'])}, {wall(lay['pretrain_wall_hours'])}; FEL "
                     + (f"{lay['trials_at_once']} trials at once, {hours(lay['fel_device_hours'])}, "
                        f"{wall(lay['fel_wall_hours'])}" if lay["trials_at_once"] else
                        f"{hours(lay['fel_device_hours'])} (trials on CPUs: as many at once as the cluster holds)"))
    lines.append(f"  estimated total: {hours(p['device_hours'])}")
    return "\n".join(lines)

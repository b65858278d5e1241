"""The `alignlab` command: one subcommand per stage, each with `--preset` and `--storage`.

    alignlab corpus build [--source bundled|wikidump|web [--path P ...] [--lang L] ...] [--tokenizer-sources web]
                          [--allow-smaller-vocab] [--preset P] [--storage ROOT]     (corpus flags: corpus_flags.py)
    alignlab pretrain [--objectives mlm,nsp,whp,pad] [--size 768x3] [--corpus DIR | corpus flags] [--preset P] [...]
    alignlab models [--storage ROOT]
    alignlab data build-tasks | data validate --task {ct,ad} FILE [TEST_FILE]
    alignlab finetune --model ID --task {ct,ad} [--budget N --scheme S --seed S --fold F ...]
    alignlab fel --model ID --task {ct,ad} [...]      the protocol's ten calculations, mean ± std
    alignlab finetune ... --save                      keep the model under <storage>/finetuned/<id>/
    alignlab evaluate --model FINETUNED_ID --task {ct,ad} FILE [--json OUT]
    alignlab predict --model FINETUNED_ID "a query"  |  --acronym ACR --snippet TEXT
    alignlab study NAME [flags]                       run studies/NAME.py's study with its flags (`--help`: the list)
    alignlab report STUDY_DIR
    alignlab export --model ID OUT_DIR                a transformers BertModel folder, RobertaPreLayerNormModel if
                                                      pre-LN, custom code (trust_remote_code) with a distance
                                                      bias (+ tokenizer, aligned heads)
Bad input prints one line `alignlab: error: ...` naming the file and problem, and exits 2 (argparse's own
errors too); `--debug` or ALIGNLAB_DEBUG=1 shows the traceback (platform/runtime/errors.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from alignlab.platform.config import (FEATURE_LAYERS, LOSS_SCALINGS, MODEL_SIZES, SCHEMES, SELECTION_MODES,
                                      WORD_POOLINGS, check_preset, untrained)
from alignlab.platform.corpus.corpus_flags import (add_corpus_arguments, corpus_flags_given, corpus_from_args,
                                                 fit_domain_phase)
from alignlab.platform.corpus.corpus_repeats import MAX_CORPUS_REPEATS
from alignlab.platform.encoder.registry import objective_names, default_set, objectives_like
from alignlab.platform.fel.finetune import (load_pretrained, save_finetuned, finetune_calculation, finetuned_dir,
                                            load_finetuned)
from alignlab.platform.fel.finetune_schemes import MULTITASK
from alignlab.platform.fel.inference import Predictor
from alignlab.platform.fel.protocol import (calculations, context_free_baselines, extra_test_scores, fel_split,
                                            multitask_train, test_unit_metrics)
from alignlab.platform.fel.task_scoring import evaluate_examples
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.export import export_model
from alignlab.platform.runtime.errors import (Parser, int_below, name_list, nonneg_float, nonneg_int, positive_float,
                                      positive_int, run_guarded)
from alignlab.platform.runtime.ray_env import ensure_ray
from alignlab.platform.storage.root import MARKER, folder_finished, resolve_root, write_json
from alignlab.platform.study.command import plan_command, study_command
from alignlab.platform.study.flags import add_debug_flag, add_precision_flag, add_preset_flag, add_storage_flag
from alignlab.platform.study.tasks import add_declare_argument, declare_specs, specs_in
from alignlab.platform.tasks.task import finetune_options, registered_tasks, task, task_names, check_disjoint, validate_file
from alignlab.platform.tasks.task_data import NUM_FOLDS, TaskData, build_tasks
from alignlab.platform.tasks.task_kinds import add_kind_predict_arguments

# Each command imports what only it needs inside its branch (the corpus and the model store bring pyarrow, the
# report pandas and scipy): `alignlab --help` and the light commands do not load them.


def _common(p: argparse.ArgumentParser) -> None:
    add_preset_flag(p)
    add_storage_flag(p)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if (code := study_command(argv)) is not None:  # `alignlab [--debug] study NAME ...`: the script's own parser
        return code
    # Declared before the parser is built: `--task NAME` of fel/finetune/evaluate/validate accepts their names.
    code = run_guarded(lambda: declare_specs(specs_in(argv)), argv)
    if code:
        return code
    ap = Parser(prog="alignlab", description="Objective-aligned pretraining and FEL studies on Ray.")
    add_debug_flag(ap)
    sub = ap.add_subparsers(dest="cmd", required=True)

    corpus = sub.add_parser("corpus", help="build corpus shards").add_subparsers(dest="action", required=True)
    cb = corpus.add_parser("build", help="documents -> tokenizer -> labelled parquet shards (Ray Data)")
    _common(cb)
    add_corpus_arguments(cb)
    cb.add_argument("--workers", type=positive_int, default=1, help="Ray Data labelling actors")
    cb.add_argument("--holdout", default=None, help="file of document ids to keep out of the corpus, on top of the "
                    "documents behind the root's task data (always held out; built first if missing)")

    pt = sub.add_parser("pretrain", help="pretrain a model on a corpus (Ray Train TorchTrainer)")
    _common(pt)
    pt.add_argument("--objectives", default=None, type=_objectives_or_none,
                    help="comma-separated objectives (default: the objectives' declared default set), or `none`: the "
                         "untrained model of this size and seed (its initial weights; no training, a positive control)")
    pt.add_argument("--size", default=None, help=f"model size: {', '.join(MODEL_SIZES)}")
    pt.add_argument("--corpus", default=None, help="corpus folder (default: build the corpus of the corpus flags, "
                    "or the preset's corpus)")
    add_corpus_arguments(pt)
    pt.add_argument("--max-steps", type=positive_int, default=None)
    pt.add_argument("--checkpoint-every-minutes", type=nonneg_float, default=None, metavar="M",
                    help="also checkpoint every M minutes of training (PretrainConfig.checkpoint_every_minutes; not "
                    "part of the model id); default: the preset's, by steps only")
    pt.add_argument("--loss-scaling", choices=LOSS_SCALINGS, default=None,
                    help="divide each objective's loss by log(number of classes) (MUPPET §3.2); default none")
    add_precision_flag(pt, default=None, help="matmul precision (default: the preset's, auto: bf16 on a GPU or a "
                       "CPU where it trains faster, fp32 elsewhere); part of the model id")
    pt.add_argument("--allow-corpus-repeats", action="store_true",
                    help=f"train even when the run would go over its corpus more than {MAX_CORPUS_REPEATS} times (refused otherwise, "
                         "before the corpus is built: give it more text with --source/--path instead)")

    md = sub.add_parser("models", help="list pretrained models")
    add_storage_flag(md)

    data = sub.add_parser("data", help="FEL task data").add_subparsers(dest="action", required=True)
    bt = data.add_parser("build-tasks", help="build the CT and AD datasets (hand-labelled CT, bundled + npm AD)")
    _common(bt)
    for t in registered_tasks():  # each task's own build options
        t.add_build_arguments(bt)
    for t in registered_tasks():  # commands a task brings for its own file formats (`run_data_command`)
        t.add_data_commands(data)
    dv = data.add_parser("validate", help="check a CT/AD JSONL file (and a test file for overlap)")
    dv.add_argument("--task", required=True, choices=task_names())
    dv.add_argument("files", nargs="+")
    add_declare_argument(dv)

    for name in ("finetune", "fel"):
        f = sub.add_parser(name, help="one FEL calculation" if name == "finetune" else "the ten FEL calculations")
        _common(f)
        f.add_argument("--model", required=True, help="pretrained model id (see `alignlab models`)")
        f.add_argument("--task", required=True, choices=task_names())
        add_declare_argument(f)
        f.add_argument("--budget", type=positive_int)
        f.add_argument("--scheme", choices=SCHEMES)
        f.add_argument("--lr", type=positive_float)
        seen: set = set()
        for t in registered_tasks():
            t.add_finetune_arguments(f, seen)  # the tasks' own options (AD's --acronym-form)
        f.add_argument("--selection", choices=SELECTION_MODES)
        f.add_argument("--feature-layers", choices=FEATURE_LAYERS,
                       help="what the task head reads: the last layer (the paper's) or every layer side by side")
        f.add_argument("--word-pooling", choices=WORD_POOLINGS,
                       help="a CT word's vector: its first piece's (the paper's) or the mean of its pieces'")
        f.add_argument("--discard-head", action="store_true", help="start a fresh head (the paper's * models)")
        f.add_argument("--tasks-dir", default=None, help="task data folder (default: build the bundled tasks)")
        if name == "finetune":
            f.add_argument("--seed", type=nonneg_int, default=0)
            f.add_argument("--fold", type=int_below(NUM_FOLDS), default=0, help=f"0..{NUM_FOLDS - 1}")
            f.add_argument("--save", action="store_true",
                           help="keep the best-perplexity model under <storage>/finetuned/<id>/ and print its id")

    ev = sub.add_parser("evaluate", help="score a saved finetuned model on a CT/AD JSONL file")
    ev.add_argument("--model", required=True, help="finetuned model id (printed by `alignlab finetune --save`)")
    ev.add_argument("--task", required=True, choices=task_names())
    add_declare_argument(ev)
    ev.add_argument("file")
    ev.add_argument("--json", default=None, help="also write the metrics to this JSON file")
    add_storage_flag(ev)
    pr = sub.add_parser("predict", help="tag a query (CT) or score an acronym against a snippet (AD)")
    pr.add_argument("--model", required=True, help="finetuned model id (printed by `alignlab finetune --save`)")
    for t in registered_tasks():  # each task's own inputs
        t.add_predict_arguments(pr)
    add_kind_predict_arguments(pr)  # a declared task's (the finetuned model's folder declares it)
    add_storage_flag(pr)

    sub.add_parser("study", help="alignlab study NAME [flags]: studies/NAME.py's study with its flags (--help: list)")
    rp = sub.add_parser("report", help="(re)write a study's report from its results")
    rp.add_argument("study_dir")
    pl = sub.add_parser("plan", help="a study script's models, calculations and estimated device-hours, before "
                        "anything runs (the script's --dry-run)")
    pl.add_argument("script", help="a study script or a study's name, e.g. studies/objective_ablation.py or model_size")
    pl.add_argument("script_args", nargs=argparse.REMAINDER, help="its own flags: --preset, --storage, --device ...")

    ex = sub.add_parser("export", help="write a pretrained model as a Hugging Face transformers folder "
                        "(BertModel; RobertaPreLayerNormModel for a pre-LN encoder; custom code, AlignlabEncoderModel, for a "
                        "distance bias)")
    ex.add_argument("--model", required=True, help="pretrained model id (see `alignlab models`)")
    ex.add_argument("out_dir", help="folder to write (new or empty); AutoModel.from_pretrained(OUT_DIR) loads it "
                    "(with trust_remote_code=True for a distance-biased model)")
    add_storage_flag(ex)

    args = ap.parse_args(argv)
    return run_guarded(lambda: _dispatch(args), argv)


def _objectives_or_none(text: str) -> str:
    """`--objectives`: a list of known objectives, or "none" (an untrained model)."""
    return "none" if text.strip() == "none" else name_list(objective_names, "objective")(text)


def _dispatch(args) -> int:
    if getattr(args, "preset", None):
        check_preset(args.preset)
    root = resolve_root(getattr(args, "storage", None))
    if args.cmd == "corpus":
        from alignlab.platform.corpus.corpus import build_corpus

        cfg = dataclasses.replace(corpus_from_args(Preset.named(args.preset).corpus, args), holdout_ids_file=args.holdout)
        cdir = build_corpus(cfg, root, num_workers=args.workers)
        print(json.dumps(json.loads((cdir / "stats.json").read_text()), indent=2))
        print(f"Corpus: {cdir}")
        return 0
    if args.cmd == "pretrain":
        from alignlab.platform.corpus.corpus import build_corpus
        from alignlab.platform.pretrain.driver import pretrain

        base = Preset.named(args.preset).pretrain
        untrained_only = args.objectives == "none"
        objs = default_set() if untrained_only or not args.objectives else args.objectives
        cfg = dataclasses.replace(base, objectives=objectives_like(objs, base.objectives))
        if args.size:
            if args.size not in MODEL_SIZES:
                raise ValueError(f"unknown size {args.size!r}: choose one of {', '.join(MODEL_SIZES)}")
            cfg = dataclasses.replace(cfg, model=MODEL_SIZES[args.size])
        if args.max_steps:
            cfg = dataclasses.replace(cfg, max_steps=args.max_steps)
        if args.checkpoint_every_minutes is not None:
            cfg = dataclasses.replace(cfg, checkpoint_every_minutes=args.checkpoint_every_minutes)
        if args.loss_scaling:
            cfg = dataclasses.replace(cfg, loss_scaling=args.loss_scaling)
        if args.precision:
            cfg = dataclasses.replace(cfg, precision=args.precision)
        if untrained_only:
            cfg = untrained(cfg)
        if args.corpus and corpus_flags_given(args):
            raise ValueError("--corpus names a built corpus; the corpus flags (--source, --path, ...) describe one "
                             "to build: give one or the other")
        ccfg = corpus_from_args(Preset.named(args.preset).corpus, args)  # refuses bad corpus flags before any work
        if not args.corpus:  # refuse an impossible request before building the preset's corpus (issue #17)
            from alignlab.platform.pretrain.driver import check_pretrain_resources
            from alignlab.platform.runtime.resources import check_root_on_every_node

            ensure_ray()
            check_pretrain_resources(cfg)
            check_root_on_every_node(root)  # the corpus's shards are written by tasks on every node
        if cfg.max_steps and not args.allow_corpus_repeats:  # before building a corpus that cannot feed the run
            from alignlab.platform.corpus.corpus_repeats import check_corpus_repeats, estimated_train_rows, train_rows

            if args.corpus:  # a built corpus: its exact count
                from alignlab.platform.corpus.corpus import load_manifest

                manifest = load_manifest(Path(args.corpus))
                check_corpus_repeats({"pretrain": cfg}, train_rows(manifest), manifest["corpus_id"], estimated=False)
            elif (rows := estimated_train_rows(ccfg)) is not None:  # packaged sources; files are counted by a build
                check_corpus_repeats({"pretrain": cfg}, rows, ccfg.source, estimated=True)
        cdir = Path(args.corpus) if args.corpus else build_corpus(ccfg, root)
        if args.corpus or ccfg != Preset.named(args.preset).corpus:  # not the preset's corpus: fit its domain phase
            from alignlab.platform.corpus.corpus import corpus_sources, load_manifest

            cfg = fit_domain_phase(cfg, corpus_sources(load_manifest(cdir)) or ())
        mdir = pretrain(cdir, cfg, root)
        ev = json.loads((mdir / "final" / "eval.json").read_text())
        ev.pop("marker", None)
        print(json.dumps(ev, indent=2))
        if root.remote:
            print(f"Stored at: {root.url(root.model(mdir.name))}")
        print(f"Model: {mdir.name}\nFolder: {mdir}")
        return 0
    if args.cmd == "models":
        from alignlab.platform.pretrain.models import list_models

        rows = list_models(root)
        if not rows:
            print(f"no models under {root.url('models')}")
        for r in rows:
            print(json.dumps(r))
        return 0
    if args.cmd == "data":
        return _data(args, root)
    if args.cmd in ("finetune", "fel"):
        return _finetune(args, root)
    if args.cmd in ("evaluate", "predict"):
        return _evaluate(args, root) if args.cmd == "evaluate" else _predict(args, root)
    if args.cmd == "export":
        from alignlab.platform.pretrain.models import fetch_model

        out = export_model(fetch_model(root, args.model), Path(args.out_dir))
        print(f"Exported: {out}")
        return 0
    if args.cmd == "plan":
        return plan_command(args.script, args.script_args)
    if args.cmd == "report":
        from alignlab.platform.report.report import collect_results, write_report

        sdir = Path(args.study_dir)
        if "://" in args.study_dir and not args.study_dir.startswith("file://"):
            # A study at a remote root: bring its files here, report, and put the report back.
            if "/studies/" not in args.study_dir.rstrip("/"):
                raise ValueError(f"{args.study_dir}: not a study folder (expected ROOT/studies/NAME)")
            uri, name = args.study_dir.rstrip("/").rsplit("/studies/", 1)
            st = resolve_root(uri)
            for f in st.list(st.study(name)):
                if not f.startswith(("tune/", "tensorboard/")):
                    st.pull_file(st.study(name, f))
            sdir = st.here(st.study(name))
            collect_results(sdir)
            print(f"Report: {write_report(sdir)}")
            st.push(st.study(name), exclude=("trials/", "tensorboard/", "tune/", "searches/"))
            print(f"Stored at: {st.url(st.study(name, 'report.md'))}")
            return 0
        if args.study_dir.startswith("file://"):
            sdir = Path(args.study_dir[len("file://"):])
        if not (sdir / "study.json").exists():
            raise ValueError(f"{sdir}: not a study folder (no study.json)")
        collect_results(sdir)
        print(f"Report: {write_report(sdir)}")
        return 0
    raise AssertionError(args.cmd)


def _data(args, root: Path) -> int:
    if args.action == "build-tasks":
        c = Preset.named(args.preset).corpus  # the task data the preset's corpus holds out (CorpusConfig.hold_out_tasks)
        options = {k: getattr(args, k) for t in registered_tasks() for k in t.build_options
                   if getattr(args, k, None) is not None}
        tdir = build_tasks(root, max_docs_per_lang=c.task_max_docs_per_lang, seed=c.seed, **options)
        print((tdir / "stats.json").read_text())
        print(f"Tasks: {tdir}")
        return 0
    if getattr(args, "task_command", None) is not None:
        return args.task_command(args)
    problems = validate_file(args.task, args.files[0])
    if len(args.files) > 1:
        problems += validate_file(args.task, args.files[1]) + check_disjoint(args.files[0], args.files[1])
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"ok: {', '.join(args.files)}")
    return 0


def _finetune(args, root: Path) -> int:
    import numpy as np

    from alignlab.platform.pretrain.models import fetch_model

    pre = load_pretrained(fetch_model(root, args.model))
    cfg = dataclasses.replace(Preset.named(args.preset).finetune, task=args.task)
    for k in ("budget", "scheme", "lr", "selection", "feature_layers", "word_pooling"):
        if getattr(args, k) is not None:
            cfg = dataclasses.replace(cfg, **{k: getattr(args, k)})
    given = {k: getattr(args, k) for k in finetune_options() if getattr(args, k, None) is not None}
    cfg = dataclasses.replace(cfg, task_options=(*cfg.task_options, *given.items()))
    cfg = dataclasses.replace(cfg, keep_head=not args.discard_head)
    tdir = Path(args.tasks_dir) if args.tasks_dir else build_tasks(
        root, max_docs_per_lang=Preset.named(args.preset).task_max_docs_per_lang)
    data = TaskData.load(tdir)
    points = [(args.fold, args.seed)] if args.cmd == "finetune" else calculations()
    t = task(cfg.task)  # resolved once, passed to every calculation
    rows = []
    for fold, seed in points:
        c = dataclasses.replace(cfg, fold=fold, seed=seed)
        train, val, test = fel_split(data, t, c)
        # The partner task's training sample of the same calculation, as in a study.
        other = multitask_train(data, c, task=t) if c.scheme == MULTITASK else None
        calc = finetune_calculation(pre, c, train, test, val=val, other_task_train=other, task=t)
        res = calc.row
        res.update(test_unit_metrics(calc.model, pre.tok, c, test, task=t))
        res.update(context_free_baselines(t, train + val, test, data=data))
        res.update(extra_test_scores(calc.model, pre.tok, c, data.extra_tests(t), train + val, data=data, task=t))
        saved = save_finetuned(root.local, pre, c, calc) if getattr(args, "save", False) else None
        if saved is not None:
            root.push(f"finetuned/{saved.name}", last=(MARKER,))
        rows.append(res)
        print(json.dumps({"fold": fold, "seed": seed, **{k: (round(v, 4) if isinstance(v, float) else v)
                                                          for k, v in res.items() if not isinstance(v, list)}}))
        if saved:
            print(f"Finetuned model: {saved.name}\nFolder: {saved}")
    if args.cmd == "fel":
        keys = ["accuracy", "perplexity", "best_accuracy", "epochs"] + sorted(
            k for k, v in rows[0].items() if k.startswith(("baseline_", "eval_")) and not k.endswith("_name")
            and not isinstance(v, list))  # per-unit scores are for a study's report, not this summary
        for k in keys:
            v = np.array([r[k] for r in rows], dtype=float)
            print(f"{k}: {v.mean():.4f} ± {v.std(ddof=1):.4f}  ({cfg.selection} selection, n={len(v)})")
    return 0


def _finetuned_folder(root: Path, fid: str) -> Path:
    fdir = finetuned_dir(root.local, fid)
    if root.remote and not folder_finished(fdir, legacy="model.pt", announce="finetune.json") and \
            root.finished(f"finetuned/{fid}", legacy="model.pt", announce="finetune.json"):
        root.pull(f"finetuned/{fid}")
    if not folder_finished(fdir, legacy="model.pt", announce="finetune.json"):
        raise ValueError(f"no finetuned model {fid!r} under {fdir.parent} "
                         "(save one with `alignlab finetune ... --save`)")
    return fdir


def _evaluate(args, root: Path) -> int:
    ft = load_finetuned(_finetuned_folder(root, args.model))
    if args.task not in ft.task_heads:
        raise ValueError(f"finetuned model {args.model} was trained for {', '.join(ft.task_heads)}, not {args.task}")
    t = task(args.task)  # resolved once
    examples = t.load_examples(args.file)  # TaskDataError (a ValueError) names every file:line
    m = evaluate_examples(ft.model, t, examples, ft.tok, options=ft.cfg.task_options)
    unit = t.unit
    print(f"{args.file}: {args.task.upper()} accuracy {m['accuracy']:.4f}  perplexity {m['perplexity']:.4f}  "
          f"({m['count']} {unit}, {m['num_examples']} examples, model {args.model})")
    if args.json:
        write_json(Path(args.json), {"model": args.model, "task": args.task, "file": str(args.file), **m})
    return 0


def _predict(args, root: Path) -> int:
    pred = Predictor.load(_finetuned_folder(root, args.model))  # declares the model's declared task, if any
    asked = [t for t in registered_tasks() if t.predict_requested(args)]  # raises on a half-given input
    if len(asked) > 1:  # several declared tasks take --text: the model's own
        asked = [t for t in asked if t.name in pred.ft.task_heads] or asked
    if len(asked) != 1:
        raise ValueError(f"give either {' or '.join(t.predict_usage() for t in registered_tasks())}")
    print(asked[0].predict_line(pred, args))
    return 0

if __name__ == "__main__":
    sys.exit(main())

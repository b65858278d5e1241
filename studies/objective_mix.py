"""Beyond the paper: which mixture of pretraining objectives is best for CT and for AD? A multi-objective search.

Ray Tune runs `OptunaSearch` (TPE, seeded) with `metric=["ct_val_accuracy", "ad_val_accuracy"]` and
`mode=["max", "max"]`. Its search space is one on/off switch and one loss weight (from a short grid) per
objective -- MLM, NSP, WHP, PAD and ELECTRA's RTD. Each trial pretrains its mixture at the preset's budget
through the model registry (identical mixtures are trained once and shared, also with other studies), then
runs FEL on CT and AD at the preset's protocol points and reports each task's mean validation accuracy
(honest selection; the search never loads a test set). The report lists every trial and marks the Pareto
front.

Why multi-objective rather than one scalar: CT and AD are aligned to different objectives (WHP and PAD), so
a mixture good for one may cost the other; the Pareto front shows that trade-off, where any weighted sum of
the two accuracies would fix an exchange rate between CT and AD points that nothing justifies.
(`alignlab.platform.study.objective_search` has the details: no pruning, one trial at a time on a small box.)

Your own task (`--task`, as every study script): the search scores it too, or only it with `--only-tasks`, and
maximizes its validation accuracy (or the metric `--maximize TASK:METRIC` names, e.g. `ner:span_f1`).

    python studies/objective_mix.py --preset mini [--storage DIR] [--num-samples N] [--budget N] [--optuna-storage URL]
    python studies/objective_mix.py --preset smoke --task name=ner,kind=tagging,pool=P,test=T --only-tasks ner
"""
import dataclasses

from alignlab.platform.config import check_preset
from alignlab.platform.presets import Preset
from alignlab.platform.study.objective_search import MixSearchSpec, run_objective_search
from alignlab.platform.study.presets import protocol_points

CANDIDATES = ("mlm", "nsp", "whp", "pad", "rtd")
def build(preset: str) -> MixSearchSpec:
    """Multi-objective Optuna search of the pretraining objective mixture, scored by FEL on CT and AD."""
    return MixSearchSpec(
        name=f"objective_mix-{preset}", title=f"Objective mixture search ({preset} preset)",
        corpus=Preset.named(preset).corpus, pretrain=Preset.named(preset).pretrain,
        finetune=dataclasses.replace(Preset.named(preset).finetune, keep_head=True, selection="honest"),
        candidates=CANDIDATES, weights=(0.3, 1.0, 3.0), points=tuple(protocol_points(preset)),
        num_samples=Preset.named(preset).search_samples, seed=0,
        task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang)


def main(argv=None, prog=None):
    """The script's command line (`python studies/objective_mix.py` and `alignlab study objective_mix`)."""
    from alignlab.platform.runtime.errors import Parser, run_guarded
    from alignlab.platform.storage.root import resolve_root
    from alignlab.platform.study.flags import (add_max_concurrent_flag, add_optuna_storage_flag, add_precision_flag,
                                         add_preset_flag, add_storage_flag)
    from alignlab.platform.study.tasks import add_task_arguments, declare_specs, search_with_tasks

    ap = Parser(prog=prog, description=build.__doc__)
    add_preset_flag(ap)
    add_storage_flag(ap)
    ap.add_argument("--num-samples", type=int, default=None, help="Optuna trials (default: the preset's)")
    add_max_concurrent_flag(ap, default=1, help="trials at once (default 1: each trains a model; >1 is for clusters)")
    add_optuna_storage_flag(ap, help="RDB URL of the search's Optuna study, e.g. sqlite:///optuna.db (default: "
                            "$ALIGNLAB_OPTUNA_STORAGE, else the journal file search.optuna.journal beside search.json)")
    add_precision_flag(ap, help="matmul precision of pretraining (default auto); fp32 or bf16 trains the same models "
                       "on every machine (the search then gets its own name and report)")
    add_task_arguments(ap)
    ap.add_argument("--maximize", action="append", default=[], metavar="TASK[:METRIC]",
                    help="what the search maximizes, e.g. ner or ner:span_f1 (repeatable: a Pareto search; default: "
                         "each task's validation accuracy, or the first --task's when tasks are declared)")
    ap.add_argument("--budget", type=int, default=None, metavar="N",
                    help="finetuning examples of every task's calculations, instead of the preset's (the search then "
                         "gets its own name and report)")
    args = ap.parse_args(argv)
    from alignlab.platform.study.tasks import declared_budgets

    per_task = declared_budgets(args.declare_tasks)
    if per_task:  # the search finetunes every task at one budget: a declaration's own would be dropped silently
        ap.error(f"a declared task's budget= ({', '.join(f'{k}={v}' for k, v in per_task.items())}) is not "
                 "supported by the objective search, which finetunes every task at one budget: use --budget N")
    if args.budget is not None and args.budget < 1:
        ap.error(f"--budget must be >= 1, got {args.budget}")
    spec = build(check_preset(args.preset))
    if args.budget is not None and args.budget != spec.finetune.budget:
        spec = dataclasses.replace(spec, name=f"{spec.name}-budget{args.budget}",
                                   finetune=dataclasses.replace(spec.finetune, budget=args.budget))
    if args.num_samples:
        spec = dataclasses.replace(spec, num_samples=args.num_samples)
    if args.precision != "auto":  # as the study scripts' --precision (study.spec.with_precision)
        spec = dataclasses.replace(spec, name=f"{spec.name}-{args.precision}",
                                   pretrain=dataclasses.replace(spec.pretrain, precision=args.precision))

    def with_tasks():  # a bad task file is one line per FILE:LINE problem and exit code 2, as in the study scripts
        only = args.only_tasks.split(",") if args.only_tasks else None
        return search_with_tasks(spec, declare_specs(args.declare_tasks), only, tuple(args.maximize))

    done = []  # bad input (e.g. a database that cannot be opened) is one line and exit code 2 (errors.run_guarded)
    code = run_guarded(lambda: done.append(run_objective_search(
        with_tasks(), resolve_root(args.storage), max_concurrent=args.max_concurrent, optuna_storage=args.optuna_storage)),
        argv)
    if code:
        raise SystemExit(code)
    print(f"Report: {done[0]}")
    return done[0]


if __name__ == "__main__":
    main()

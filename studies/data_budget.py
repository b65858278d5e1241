"""Table 2 of the paper: CT and AD accuracy/perplexity by finetuning data size n.

Columns (the paper's labels; the sizes are the preset's stand-ins, see studies/model_size.py):
768-x3* (the largest model pretrained without the objective aligned to the task -- CT: without WHP,
AD: without PAD -- heads discarded), 512x3* (the second-largest width, deepest, all objectives,
heads discarded), 768x3* and 768x3 (the largest, all objectives, heads discarded / kept).
Rows: task x n. Baseline (underlined, one per task): 768-x3* at n=200.

Budgets: n in {50, 100, 150, 200} for both tasks and n=1000 for AD only, as in the paper:
- CT samples its training sets from the 275-query pool, so n=1000 cannot exist for CT (skipped).
- AD samples from the four folds left after holding out the test fold: 480 snippets x 2 pairs x 4/5
  = 768 pairs, so the paper's n=1000 runs as n=768 (all of it; the ten calculations then differ
  only in their test fold, seed and validation split).
At smoke: n in {20, 40} (the smoke budget 40 stands in for 200).
`--budgets 25,50,100` compares other budgets (each task keeps those its pool holds), `--budget N` moves the
reference (baseline) row; a declared task (`--task ...`) keeps the rows its pool holds, its baseline at the largest.

    python studies/data_budget.py --preset mini [--storage DIR] [--budgets N,N,...] [--budget N]
"""
import dataclasses

from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, protocol_points, sized_pretrain, without_aligned
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study
from alignlab.platform.tasks.task import task
from alignlab.platform.tasks.task_data import NUM_FOLDS

TASK_SNIPPETS = task("ad").build_options["target_snippets"]  # AD's own default, which this study keeps (480)
AD_POOL = 2 * TASK_SNIPPETS * (NUM_FOLDS - 1) // NUM_FOLDS  # 768
CT_POOL = 275  # the shipped hand-labelled pool (tasks/task_data/npm)


def budgets(preset: str, chosen: tuple[int, ...] | None = None, reference: int | None = None
            ) -> tuple[dict[str, tuple[int, ...]], int]:
    """Budgets per task, and the reference budget (the paper's 200; `reference`, when given, joins the budgets).
    `chosen` (`--budgets`) replaces the paper's for every task, each keeping those its pool holds (CT's 275-query
    pool, AD's 768 pairs): a budget no task can hold is refused."""
    own = Preset.named(preset).data_budgets
    if chosen is None:
        if own is not None:
            ns, ref = {"ct": own[0], "ad": own[0]}, own[1]
        else:
            ns, ref = {"ct": (50, 100, 150, 200), "ad": (50, 100, 150, 200, min(1000, AD_POOL))}, 200
    else:
        pools = {"ct": CT_POOL, "ad": AD_POOL}
        too_big = [n for n in chosen if n > max(pools.values())]
        if too_big:
            raise ValueError(f"--budgets {','.join(map(str, chosen))}: {too_big} exceed every task's pool (CT {CT_POOL}, "
                             f"AD {AD_POOL} examples)")
        ns = {t: tuple(sorted(n for n in chosen if n <= pools[t])) for t in pools}
        ref = 200 if 200 in chosen else max(chosen)
    if reference is not None:
        ref = reference
        ns = {t: tuple(sorted({*v, reference})) for t, v in ns.items()}
    return ns, ref


_budgets = budgets  # `build`'s keyword `budgets` shadows the function's name inside it


def build(preset: str, *, budgets: tuple[int, ...] | None = None, budget: int | None = None) -> Study:
    """Accuracy by finetuning data size (paper Table 2)."""
    widths, _ = Preset.named(preset).size_grid
    big_w, big_d = largest_size(preset)
    mid_w = sorted(widths)[-2]
    models = [ModelSpec(key=f"{big_w}x{big_d}", pretrain=sized_pretrain(preset, big_w, big_d)),
              ModelSpec(key=f"{mid_w}x{big_d}", pretrain=sized_pretrain(preset, mid_w, big_d))]
    models += [ModelSpec(key=key, pretrain=sized_pretrain(preset, big_w, big_d, objs))
               for key, objs in without_aligned().values()]
    cols = {  # column label -> (model key per task, keep the pretrained heads)
        f"{big_w}-×{big_d}*": ({t: without_aligned()[t][0] for t in ("ct", "ad")}, False),
        f"{mid_w}×{big_d}*": ({t: f"{mid_w}x{big_d}" for t in ("ct", "ad")}, False),
        f"{big_w}×{big_d}*": ({t: f"{big_w}x{big_d}" for t in ("ct", "ad")}, False),
        f"{big_w}×{big_d}": ({t: f"{big_w}x{big_d}" for t in ("ct", "ad")}, True),
    }
    ns, ref_n = _budgets(preset, budgets, budget)
    calcs = tuple(
        CalcSpec(model=keys[task], row=f"{task.upper()} {n}", col=col, group=task.upper(),
                 finetune=dataclasses.replace(Preset.named(preset).finetune, task=task, budget=n, keep_head=keep,
                                              fold=fold, seed=seed))
        for task in ("ct", "ad") for n in ns[task] for col, (keys, keep) in cols.items()
        for fold, seed in protocol_points(preset))
    base_col = next(iter(cols))
    if Preset.named(preset).data_budgets is not None:
        notes = (f"{preset.capitalize()} budgets {ns['ct']} stand in for the paper's 50-1000; n={ref_n} stands in "
                 "for 200.")
    else:
        notes = ("CT's budgets stop at 200: its training sets are sampled from the 275-query pool, so the paper's "
                 f"n=1000 row does not exist for CT. AD's n=1000 runs as n={AD_POOL}: all the pairs left after "
                 f"holding out the test fold ({TASK_SNIPPETS} snippets × 2 × {NUM_FOLDS - 1}/{NUM_FOLDS}).")
    suffix = ""
    if budgets is not None or budget is not None:  # other budgets: another study with its own report
        suffix = f"-budgets{'_'.join(map(str, sorted({n for v in ns.values() for n in v})))}-ref{ref_n}"
    return Study(name=f"data_budget-{preset}{suffix}", title=f"Accuracy by finetuning data size ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=tuple(models), calcs=calcs, baseline_col=base_col,
                 # The reference row of each task, or its largest budget where its pool cannot hold the reference.
                 baseline_cells=tuple((f"{t.upper()} {ref_n if ref_n in ns[t] else max(ns[t])}", base_col)
                                      for t in ("ct", "ad") if ns[t]),
                 plots=("budget",),
                 task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang, notes=notes)


def main(argv=None, prog=None):
    """The script's command line (`python studies/data_budget.py` and `alignlab study data_budget`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

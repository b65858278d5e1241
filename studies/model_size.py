"""Table 1 of the paper: CT and AD accuracy/perplexity by model size, pretrained heads kept vs. discarded.

Eleven pretrained models: nine sizes (widths x depths) pretrained with all four objectives, and two
of the largest size pretrained without WHP (used in the CT rows) and without PAD (the AD rows) --
the paper's "768-". Rows are task x width plus the task's "-" row; columns are the depths with the
pretrained heads kept (CT's head initialised from WHP's, AD's from PAD's) and "<deepest>*", the
deepest models with their heads discarded. Baseline (underlined, one per task): the largest model
pretrained without the aligned objective, heads discarded -- the paper's 768-x3*.

Sizes per preset (the largest stands in for 768x3):

    paper   256/512/768 x 1/2/3   64-dim heads, FFN 3072 (the paper's models)
    mini    64/128 x 1/2          the mini preset's shape (64-dim heads, FFN 512); 128x2 is the mini model
    smoke   16/32 x 1/2           the tiny shape (16-dim heads, FFN 64)

so at mini the columns read 1, 2, 2* and the rows 64, 128, 128-.

    python studies/model_size.py --preset mini [--storage DIR]
"""
import dataclasses

from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, protocol_points, sized_pretrain, without_aligned
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study


def build(preset: str) -> Study:
    """Accuracy by model size (paper Table 1)."""
    widths, depths = Preset.named(preset).size_grid
    big_w, big_d = largest_size(preset)
    models = [ModelSpec(key=f"{w}x{d}", pretrain=sized_pretrain(preset, w, d)) for w in widths for d in depths]
    models += [ModelSpec(key=key, pretrain=sized_pretrain(preset, big_w, big_d, objs))
               for key, objs in without_aligned().values()]
    star = f"{big_d}*"

    def calc(task, model, row, col, keep_head, fold, seed):
        ft = dataclasses.replace(Preset.named(preset).finetune, task=task, fold=fold, seed=seed, keep_head=keep_head)
        return CalcSpec(model=model, row=f"{task.upper()} {row}", col=col, group=task.upper(), finetune=ft)

    calcs = []
    for task in ("ct", "ad"):
        for fold, seed in protocol_points(preset):
            for w in widths:
                calcs += [calc(task, f"{w}x{d}", w, str(d), True, fold, seed) for d in depths]
                calcs.append(calc(task, f"{w}x{big_d}", w, star, False, fold, seed))
            calcs.append(calc(task, without_aligned()[task][0], f"{big_w}-", star, False, fold, seed))
    return Study(name=f"model_size-{preset}", title=f"Accuracy by model size ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=tuple(models), calcs=tuple(calcs), baseline_col=star,
                 baseline_cells=tuple((f"{t.upper()} {big_w}-", star) for t in ("ct", "ad")),
                 plots=("by_size", "bars"), task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang,
                 notes=f"Rows: task and model width (hidden size); columns: layers, heads kept; `{star}`: the "
                       f"{big_d}-layer models with their pretrained heads discarded. `{big_w}-` is the "
                       f"{big_w}×{big_d} model pretrained without the objective aligned to the row's task "
                       "(CT: without WHP; AD: without PAD). Sizes at this preset: widths "
                       f"{'/'.join(map(str, widths))} × depths {'/'.join(map(str, depths))} "
                       "(the paper: 256/512/768 × 1/2/3).")


def main(argv=None, prog=None):
    """The script's command line (`python studies/model_size.py` and `alignlab study model_size`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

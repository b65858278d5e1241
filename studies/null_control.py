"""The null control (A/A): one pretrained model as two columns that differ only in their finetuning seeds.

The preset's model pretrained with all four objectives, finetuned on every task by the protocol's five samples x two
seeds in column `A` (seeds 0 and 1) and again in column `A'` (seeds 2 and 3), heads discarded; `A` is the baseline.
Nothing differs between the columns but the seeds, so a report of this study that calls a difference significant, or
bolds a cell, has caught the decision inventing an effect. All five folds run at every preset (at smoke too): with
one fold the decision has no replicates to estimate the finetuning spread from. `benchmarks/statistics/calibration.py --real`
repeats this over many seed pairs for a false-positive rate with its interval.

    python studies/null_control.py --preset mini [--storage DIR]
"""
import dataclasses

from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, sized_pretrain
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study
from alignlab.platform.tasks.task_data import NUM_FOLDS

COLUMNS = {"A": (0, 1), "A'": (2, 3)}


def build(preset: str, columns: dict[str, tuple[int, ...]] = COLUMNS) -> Study:
    """The null control: one model, columns of other finetuning seeds (A/A)."""
    w, d = largest_size(preset)
    key = f"{w}x{d}"
    calcs = tuple(
        CalcSpec(model=key, row=task.upper(), col=col,
                 finetune=dataclasses.replace(Preset.named(preset).finetune, task=task, keep_head=False, fold=fold,
                                              seed=seed))
        for task in ("ct", "ad") for col, seeds in columns.items() for fold in range(NUM_FOLDS) for seed in seeds)
    first = next(iter(columns))
    return Study(name=f"null_control-{preset}", title=f"Null control: one model, other finetuning seeds ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=(ModelSpec(key=key, pretrain=sized_pretrain(preset, w, d)),),
                 calcs=calcs, baseline_col=first, plots=("bars",),
                 task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang,
                 notes=f"A/A: every column is model {w}×{d} (all four objectives, heads discarded), finetuned with other "
                       f"seeds ({'; '.join(f'{c}: {s}' for c, s in columns.items())}). No difference is real: any "
                       "significant one is a false positive of the decision.")


def main(argv=None, prog=None):
    """The script's command line (`python studies/null_control.py` and `alignlab study null_control`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

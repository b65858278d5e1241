"""Table 4 of the paper: FEL learning rate.

The largest model (the paper's 768x3; stand-ins in studies/model_size.py), all four objectives,
heads kept, prediction layers only, finetuned at lr 1e-3, 1e-4 and 1e-5: accuracy and perplexity
at the best-perplexity epoch, and the epochs it took (the report's epochs table). Baseline: 1e-4,
the paper's choice. Small learning rates need many epochs (the paper: ~900 for AD at 1e-5), so
`max_epochs` is raised to 2000 (paper) / 1000 (mini) -- patience still ends a run once the
validation perplexity stops improving.

    python studies/learning_rate.py --preset mini [--storage DIR]
"""
import dataclasses

from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, protocol_points, sized_pretrain
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study

LEARNING_RATES = {"1e-3": 1e-3, "1e-4": 1e-4, "1e-5": 1e-5}
MAX_EPOCHS = {"smoke": None, "mini": 1000, "paper": 2000}


def build(preset: str) -> Study:
    """Finetuning learning rate (paper Table 4)."""
    w, d = largest_size(preset)
    key = f"{w}x{d}"
    base = Preset.named(preset).finetune
    if MAX_EPOCHS[preset]:
        base = dataclasses.replace(base, max_epochs=MAX_EPOCHS[preset])
    calcs = tuple(
        CalcSpec(model=key, row=task.upper(), col=col,
                 finetune=dataclasses.replace(base, task=task, lr=lr, scheme="pred", keep_head=True, fold=fold,
                                              seed=seed))
        for task in ("ct", "ad") for col, lr in LEARNING_RATES.items() for fold, seed in protocol_points(preset))
    return Study(name=f"learning_rate-{preset}", title=f"FEL learning rate ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=(ModelSpec(key=key, pretrain=sized_pretrain(preset, w, d)),),
                 calcs=calcs, baseline_col="1e-4", plots=("bars",),
                 task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang,
                 notes=f"Model {w}×{d} (all four objectives, heads kept), scheme PRED, up to {base.max_epochs} epochs "
                       f"with patience {base.patience}.")


def main(argv=None, prog=None):
    """The script's command line (`python studies/learning_rate.py` and `alignlab study learning_rate`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

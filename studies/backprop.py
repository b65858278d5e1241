"""Table 3 of the paper: FEL backpropagation schemes.

The largest model (the paper's 768x3; see studies/model_size.py for the stand-ins) pretrained with
all four objectives, heads kept, finetuned by backpropagating through the prediction layers only
(PRED), prediction + Transformer layers (PRED+TRM), the same while multitasking CT and AD
(MT PRED+TRM), or every layer (PRED+TRM+EMB). The report's first table is the paper's
ACC/BEST-PPL column (accuracy at the best-perplexity epoch), its second the BEST-ACC/PPL column
(best accuracy and the perplexity there). Baseline: PRED, the paper's default.

    python studies/backprop.py --preset mini [--storage DIR]
"""
import dataclasses

from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, protocol_points, sized_pretrain
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study

SCHEMES = {"PRED": "pred", "MT PRED+TRM": "mt:pred+trm", "PRED+TRM": "pred+trm", "PRED+TRM+EMB": "pred+trm+emb"}


def build(preset: str) -> Study:
    """Backpropagation schemes (paper Table 3)."""
    w, d = largest_size(preset)
    key = f"{w}x{d}"
    calcs = tuple(
        CalcSpec(model=key, row=task.upper(), col=col,
                 finetune=dataclasses.replace(Preset.named(preset).finetune, task=task, scheme=scheme, keep_head=True,
                                              fold=fold, seed=seed))
        for task in ("ct", "ad") for col, scheme in SCHEMES.items() for fold, seed in protocol_points(preset))
    return Study(name=f"backprop-{preset}", title=f"FEL backpropagation schemes ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=(ModelSpec(key=key, pretrain=sized_pretrain(preset, w, d)),),
                 calcs=calcs, baseline_col="PRED", plots=("bars",),
                 task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang,
                 notes=f"Model {w}×{d} (all four objectives, pretrained heads kept). The paper's ACC/BEST-PPL is the "
                       "first table, BEST-ACC/PPL the second.")


def main(argv=None, prog=None):
    """The script's command line (`python studies/backprop.py` and `alignlab study backprop`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

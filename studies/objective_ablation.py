"""Tables 5 and 6 of the paper: all four objectives vs. without WHP vs. without PAD.

CT and AD accuracy/perplexity of each pretrained model with its prediction layers discarded (the
paper's `*`), ten calculations per cell, each task against the model pretrained without its aligned
objective (CT: without WHP, AD: without PAD); plus each
model's held-out MLM/NSP/WHP/PAD accuracy and perplexity. The README's main job at `--preset mini`.

    python studies/objective_ablation.py --preset mini [--storage DIR]
"""
import dataclasses

from alignlab.platform.config import CORPUS_PRESETS, FINETUNE_PRESETS, PRETRAIN_PRESETS
from alignlab.platform.protocol import calculations
from alignlab.platform.study import CalcSpec, ModelSpec, Study, study_main

OBJECTIVE_SETS = {"all": "mlm,nsp,whp,pad", "-whp": "mlm,nsp,pad", "-pad": "mlm,nsp,whp"}


def build(preset: str) -> Study:
    """Objective ablation (paper Tables 5 and 6)."""
    base = PRETRAIN_PRESETS[preset]
    models = tuple(ModelSpec(key=k, pretrain=dataclasses.replace(base, objectives=objs))
                   for k, objs in OBJECTIVE_SETS.items())
    points = calculations()[:2] if preset == "smoke" else calculations()
    calcs = tuple(
        CalcSpec(model=k, row=task.upper(), col=f"{k}*",
                 finetune=dataclasses.replace(FINETUNE_PRESETS[preset], task=task, fold=fold, seed=seed, keep_head=False))
        for task in ("ct", "ad") for k in OBJECTIVE_SETS for fold, seed in points)
    # Each task against the model pretrained without *its* aligned objective, as in the paper's Table 5:
    # CT against -WHP, AD against -PAD.
    return Study(name=f"objective_ablation-{preset}", title=f"Objective ablation ({preset} preset)",
                 corpus=CORPUS_PRESETS[preset], models=models, calcs=calcs, baseline_col="-pad*",
                 baseline_cells=(("CT", "-whp*"), ("AD", "-pad*")), plots=("bars",),
                 task_max_docs_per_lang=3000 if preset == "smoke" else None)


if __name__ == "__main__":
    study_main(build)

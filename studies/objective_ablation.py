"""Tables 5 and 6 of the paper: all four objectives vs. without WHP vs. without PAD.

CT and AD accuracy/perplexity of each pretrained model with its prediction layers discarded (the
paper's `*`), ten calculations per cell, each task against the model pretrained without its aligned
objective (CT: without WHP, AD: without PAD), and every pretrained column against an untrained one (the same
architecture with no pretraining: the positive control); plus each
model's held-out MLM/NSP/WHP/PAD accuracy and perplexity. The README's main job at `--preset mini`.

Beyond the paper, `--objectives` adds a model per extra objective set as another column, e.g. ELECTRA's
replaced-token detection on top of the four (`+rtd`) or in MLM's place (`-mlm+rtd`). A column is named by
how its set differs from all four. With extra columns the study is another study (its name gets the columns),
so the paper's table keeps its own report.

    python studies/objective_ablation.py --preset mini [--storage DIR] [--objectives mlm,nsp,whp,pad,rtd]
"""
import dataclasses

from alignlab.platform.encoder.registry import objectives_like
from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import protocol_points
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study, with_untrained

OBJECTIVE_SETS = {"all": "mlm,nsp,whp,pad", "-whp": "mlm,nsp,pad", "-pad": "mlm,nsp,whp"}


def column_key(objectives: str) -> str:
    """An extra set's column: its difference from all four, e.g. `+rtd` or `-mlm+rtd`."""
    names, base = objectives.split(","), OBJECTIVE_SETS["all"].split(",")
    return "".join(f"-{n}" for n in base if n not in names) + "".join(f"+{n}" for n in names if n not in base)


def build(preset: str, extra: tuple[str, ...] = ()) -> Study:
    """Objective ablation (paper Tables 5 and 6)."""
    base = Preset.named(preset).pretrain
    sets = dict(OBJECTIVE_SETS)
    for objs in extra:
        key = column_key(objs)
        if key in sets or not key:
            raise ValueError(f"--objectives {objs}: that set is already a column ({key or 'all'})")
        sets[key] = objs
    models = tuple(ModelSpec(key=k, pretrain=dataclasses.replace(base, objectives=objectives_like(objs, base.objectives)))
                   for k, objs in sets.items())
    points = protocol_points(preset)
    calcs = tuple(
        CalcSpec(model=k, row=task.upper(), col=f"{k}*",
                 finetune=dataclasses.replace(Preset.named(preset).finetune, task=task, fold=fold, seed=seed, keep_head=False))
        for task in ("ct", "ad") for k in sets for fold, seed in points)
    # Each task against the model pretrained without *its* aligned objective, as in the paper's Table 5:
    # CT against -WHP, AD against -PAD.
    suffix = "".join(k for k in sets if k not in OBJECTIVE_SETS)
    # The claims the study exists to make: the aligned model above the one without the aligned objective on each
    # task's primary metric. Extra columns and the other metrics are exploratory and secondary.
    # The untrained column (the same architecture, no pretraining) is the positive control: every pretrained
    # column should be above it before a difference between objectives means anything. It costs no pretraining.
    return with_untrained(Study(
        name=f"objective_ablation-{preset}{suffix}", title=f"Objective ablation ({preset} preset)",
        corpus=Preset.named(preset).corpus, models=models, calcs=calcs, baseline_col="-pad*",
        baseline_cells=(("CT", "-whp*"), ("AD", "-pad*")), claims=(("CT", "all*"), ("AD", "all*")), plots=("bars",),
        task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang))


def main(argv=None, prog=None):
    """The script's command line (`python studies/objective_ablation.py` and `alignlab study objective_ablation`)."""
    return study_main(build, argv, extra_objective_sets=True, prog=prog)


if __name__ == "__main__":
    main()

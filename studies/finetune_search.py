"""An Optuna search of the finetuning settings, one search per task, against the paper's defaults.

For the largest model (the paper's 768x3; stand-ins in studies/model_size.py; all four objectives,
heads kept) and each task, Ray Tune runs `OptunaSearch` (TPE, seeded) over the learning rate, batch
size, max epochs, dropout and backpropagation scheme, maximizing validation accuracy at the
best-validation-perplexity epoch in `honest` mode: trials are scored on the validation split of
their sample and never load a test set. Every trial reports its validation metrics each epoch, and
ASHA prunes the poor ones (pruning is for searches only: the protocol's grids always run to their
own stopping rule). The first trial is the default setting. The best setting is then run over the
protocol's calculations as an ordinary grid (column "searched"), next to the defaults (column
"default", the baseline), on the same (fold, seed) points, so the two columns pair up.

Selection is nested, so no searched example is ever tested by a calculation that reports the
search's choice (`SearchSpec.nested`, `protocol.search_groups`, `protocol.search_split`):
- AD: every snippet is in the test fold of some calculation, so one search cannot serve all five
  folds. Fold f gets its own search, whose trials sample only from f's four training folds, and its
  best setting is reported on fold f's two calculations only (searches `ad-fold0` ... `ad-fold4`; the
  "searched" cell may hold up to five settings). This costs five searches per AD cell; the estimate is
  that of the search procedure, as in nested cross-validation.
- CT: every calculation tests on the separate 200-query set, so one search (`ct`), sampling from the
  275-query pool, serves all ten.

Pitfall (docs/cluster.md#asha-stopped-trials-reach-optuna-as-complete): Ray's OptunaSearch tells Optuna that an
ASHA-stopped trial
COMPLETED with its early value, which biases TPE toward settings that look good early. The runner
(`alignlab.platform.study.search.run_search`) tells Optuna PRUNED instead, with the per-epoch values as
intermediate values, and picks the best setting among trials that ran to their own end only, so
settings are compared at the end of their runs, never at an early epoch. ASHA's max_t lies one past
the longest run so that no trial is cut for merely reaching its own end. With 2+ trials at once,
completion order (and so TPE's suggestions) depends on timing: the seed fixes the sampler, not the
exact sequence.

Each search keeps its Optuna study in `searches/<search>.optuna.journal` (or in the database of
`--optuna-storage URL`); a run killed mid-search resumes through it, and the report adds each search's
parameter importances.

    python studies/finetune_search.py --preset mini [--storage DIR] [--optuna-storage URL]
"""
import dataclasses

from alignlab.platform.config import SCHEMES
from alignlab.platform.presets import Preset
from alignlab.platform.study.presets import largest_size, protocol_points, sized_pretrain
from alignlab.platform.study.run import study_main
from alignlab.platform.study.spec import CalcSpec, ModelSpec, SearchParam, SearchSpec, Study

# (trials per search, batch sizes, max-epochs choices, ASHA grace period in epochs)
SEARCH = {"smoke": (4, (8, 16), (2, 3), 1), "mini": (20, (16, 32, 64), (25, 50, 100), 5),
          "paper": (40, (16, 32, 64), (50, 100, 200), 10)}


def space(preset: str) -> tuple[SearchParam, ...]:
    _, batch_sizes, max_epochs, _ = SEARCH[preset]
    return (SearchParam(name="lr", kind="loguniform", values=(1e-5, 1e-2)),
            SearchParam(name="batch_size", kind="choice", values=batch_sizes),
            SearchParam(name="max_epochs", kind="choice", values=max_epochs),
            SearchParam(name="dropout", kind="uniform", values=(0.0, 0.3)),
            SearchParam(name="scheme", kind="choice", values=SCHEMES))


def build(preset: str) -> Study:
    """Optuna search of finetuning settings per task, and the best setting over the ten calculations."""
    w, d = largest_size(preset)
    key = f"{w}x{d}"
    num_samples, _, _, grace = SEARCH[preset]
    base = {t: dataclasses.replace(Preset.named(preset).finetune, task=t, keep_head=True, selection="honest")
            for t in ("ct", "ad")}
    defaults = tuple(CalcSpec(model=key, row=t.upper(), col="default",
                              finetune=dataclasses.replace(base[t], fold=fold, seed=seed))
                     for t in ("ct", "ad") for fold, seed in protocol_points(preset))
    searches = tuple(SearchSpec(name=t, model=key, base=base[t], space=space(preset), num_samples=num_samples,
                                row=t.upper(), col="searched", scheduler="asha", grace_period=grace, seed=0,
                                final_points=tuple(protocol_points(preset)))
                     for t in ("ct", "ad"))
    return Study(name=f"finetune_search-{preset}", title=f"Finetuning settings found by Optuna ({preset} preset)",
                 corpus=Preset.named(preset).corpus, models=(ModelSpec(key=key, pretrain=sized_pretrain(preset, w, d)),),
                 calcs=defaults, searches=searches, baseline_col="default", plots=("bars",),
                 task_max_docs_per_lang=Preset.named(preset).task_max_docs_per_lang,
                 notes=f"Model {w}×{d} (all four objectives, heads kept). `default`: the preset's finetuning defaults; "
                       f"`searched`: the best setting of the task's search ({num_samples} Optuna TPE trials, ASHA "
                       f"pruning with a {grace}-epoch grace period), run over the same calculations. Nested "
                       f"selection: AD runs one search per test fold, inside its four training folds, and "
                       f"reports it on that fold only; CT's one search samples from the pool, never the test set.")


def main(argv=None, prog=None):
    """The script's command line (`python studies/finetune_search.py` and `alignlab study finetune_search`)."""
    return study_main(build, argv, prog=prog)


if __name__ == "__main__":
    main()

"""Studies: a declared set of pretrained models and FEL calculations, run on Ray, answered by a report.

The public face of the study modules, so that a study script needs one import line:

- `study_spec`: declaring a study (`Study`, `ModelSpec`, `CalcSpec`, `SearchSpec`, `SearchParam`), plain data;
- `study_presets`: the paper's presets study scripts build their grids from (sizes, objective sets, points);
- `study_run`: running a study on Ray (`run_study`) and the command line of a study script (`study_main`);
- `study_grid`: the Tune grid of FEL calculations, one trial each (`run_trials`, `run_one`);
- `study_search`: the Optuna search of finetuning settings (`run_search`), with its Tune objects in
  `study_search_tune`.

Importing this module does not import Ray.
"""
from __future__ import annotations

from alignlab.platform.study_grid import FEL_EXPERIMENT, check_trial_resources, fel_trial, localize, run_one, run_trials
from alignlab.platform.study_presets import (ALIGNED_OBJECTIVES, SIZE_GRID, SMOKE_TASK_DOCS, WITHOUT_ALIGNED,
                                             largest_size, protocol_points, sized_model, sized_pretrain)
from alignlab.platform.study_run import (check_budgets, pool_size, pretrain_models, run_study, stage_eval_files,
                                         study_main)
from alignlab.platform.study_search import run_search, search_examples, search_trial
from alignlab.platform.study_spec import (DEFAULT_TRIAL_RESOURCES, SEARCH_OBJECTIVE, CalcSpec, ModelSpec, SearchParam,
                                          SearchSpec, Study, calc_id, planned_calc_ids, with_precision,
                                          with_pretrain_seeds)

__all__ = [
    # declaring a study
    "Study", "ModelSpec", "CalcSpec", "SearchSpec", "SearchParam", "calc_id", "planned_calc_ids", "with_pretrain_seeds",
    "with_precision",
    "DEFAULT_TRIAL_RESOURCES", "SEARCH_OBJECTIVE",
    # the paper's presets
    "SIZE_GRID", "ALIGNED_OBJECTIVES", "WITHOUT_ALIGNED", "SMOKE_TASK_DOCS", "sized_model", "largest_size",
    "sized_pretrain", "protocol_points",
    # running it
    "run_study", "study_main", "pretrain_models", "check_budgets", "pool_size", "stage_eval_files",
    # the Tune grid
    "run_trials", "run_one", "fel_trial", "localize", "check_trial_resources", "FEL_EXPERIMENT",
    # the Optuna search
    "run_search", "search_trial", "search_examples",
]

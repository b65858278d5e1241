"""What the study scripts build their grids from, at a preset: model sizes standing in for 256/512/768 x 1/2/3
(`Preset.size_grid`), the models pretrained without a task's aligned objective, and the protocol's points.

Plain data and pure functions (no Ray).
"""
from __future__ import annotations

import dataclasses

from alignlab.platform.config import PretrainConfig
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.presets import Preset

# The objective and task registries (torch) are imported inside the functions that read them: a study script
# builds its grid from these presets without loading torch.


def sized_model(preset: str, hidden: int, num_layers: int) -> ModelConfig:
    """The model of a given width and depth at a preset: the preset's shape (head size, FFN, length), resized. At
    the paper preset these are the paper's sizes (`config.MODEL_SIZES`, tested)."""
    base = Preset.named(preset).pretrain.model  # its recipe too (norm, dropout), not only its shape
    return dataclasses.replace(base, hidden=hidden, num_layers=num_layers, head_dim=min(base.head_dim, hidden))


def largest_size(preset: str) -> tuple[int, int]:
    """(width, depth) of the preset's stand-in for the paper's 768x3."""
    widths, depths = Preset.named(preset).size_grid
    return max(widths), max(depths)


def without_aligned() -> dict[str, tuple[str, str]]:
    """Per task, the model pretrained without the objective aligned to it (the paper's "768-"): its key
    ("-" + the objective) and objectives (the default set, `registry.default_set`, less that one), in the tasks'
    order. One model per objective: a task aligned with an objective an earlier task has (a declared task;
    `study/tasks.with_tasks` gives it that task's cells), or with none of the default set, gets no entry."""
    from alignlab.platform.encoder.registry import default_set
    from alignlab.platform.tasks.task import registered_tasks

    out, objectives = {}, default_set().split(",")
    for t in registered_tasks():
        key = f"-{t.aligned_objective}"
        if t.aligned_objective not in objectives or any(k == key for k, _ in out.values()):
            continue
        out[t.name] = (key, ",".join(o for o in objectives if o != t.aligned_objective))
    return out


def sized_pretrain(preset: str, hidden: int, num_layers: int, objectives: str | None = None) -> PretrainConfig:
    """The preset's pretraining run for a model of this size and objective set (default: the objectives' declared
    default set, `registry.default_set`)."""
    from alignlab.platform.encoder.registry import default_set, objectives_like

    objectives = objectives or default_set()

    base = Preset.named(preset).pretrain
    return dataclasses.replace(base, model=sized_model(preset, hidden, num_layers),
                               objectives=objectives_like(objectives, base.objectives))


def protocol_points(preset: str) -> list[tuple[int, int]]:
    """(fold, seed) of a data point's calculations at a preset (`Preset.points_per_cell`): the protocol's ten, or its
    first few."""
    from alignlab.platform.fel.protocol import calculations

    return calculations()[:Preset.named(preset).points_per_cell]


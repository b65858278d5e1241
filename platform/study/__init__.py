"""Studies: declaring a study (spec), the paper's presets, the plan, and running it on Ray: the pretraining,
the Tune grid of FEL calculations and the Optuna searches (of finetuning settings and of objective mixes)."""

"""Is the mini study's FEL probe held back by its own training settings? Compared on VALIDATION data only (issue #15).

The mini study's CT `all*` cell (the `pred` scheme: a linear head on the frozen encoder) sits under the per-word
lexicon. Before blaming the encoder, this asks whether the head had finished learning: the mini FEL preset stops
at 100 epochs, and several calculations select their last epoch. For one pretrained model it runs the protocol's
ten (fold, seed) calculations of a task under each setting of a grid (changes to the mini FEL preset), and prints
the validation accuracy at the selected (best validation perplexity) epoch, the validation perplexity, how many
calculations selected the epoch cap, and the context-free baselines fitted on the same training samples and
scored on the same validation samples. The test set is never scored: every "test" here is the validation split
carved from the budget, so a setting can be chosen from this table without touching the test set.

    python benchmarks/probes/fel_settings.py --storage alignlab-storage --model 128x2-mlm+nsp+whp+pad-<hash>

Results go to benchmarks/results/fel_settings.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.protocol import fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData

GRID = (
    {},  # the mini FEL preset: pred, lr 1e-3, at most 100 epochs, patience 10
    {"max_epochs": 1000, "patience": 30},
    {"lr": 3e-3, "max_epochs": 1000, "patience": 30},
    {"lr": 1e-2, "max_epochs": 1000, "patience": 30},
    {"lr": 1e-2, "max_epochs": 1000, "patience": 30, "dropout": 0.0},
    {"scheme": "pred+trm", "lr": 3e-4},
    {"scheme": "pred+trm+emb", "lr": 3e-4},
)


def main(argv=None) -> list[dict]:
    """Prints and records the table; returns its rows (`mini_seeds.py` reads them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--model", required=True, help="a finished model id under <storage>/models")
    p.add_argument("--tasks", type=Path, help="a task folder (default: the only one under --storage)")
    p.add_argument("--task", default="ct")
    bench_args.add_flags(p, threads=1)
    p.add_argument("--settings", help="comma-separated indices into GRID (default: all; 0 is the mini FEL preset)")
    bench_args.add_flags(p, out="fel_settings.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    tasks = a.tasks or only_folder(a.storage, "tasks")
    data = TaskData.load(tasks)
    pre = load_pretrained(a.storage / "models" / a.model)
    command = bench_args.command("probes/fel_settings.py", argv)
    # refit off: these calculations are scored on the validation split, which refit would train on.
    base = dataclasses.replace(Preset.named("mini").finetune, task=a.task, keep_head=False, refit=False)
    points = list(itertools.product(range(5), range(2)))
    print(f"# {command}\n# model {a.model}, tasks {tasks.name}, task {a.task}, heads discarded (the * column), "
          f"{len(points)} calculations per setting, validation only", flush=True)
    baselines: dict[str, list[float]] = {}
    for fold in range(5):  # the baselines do not depend on the seed
        train, val, _ = fel_split(data, task_named(a.task), dataclasses.replace(base, fold=fold))
        for name, score in task_named(a.task).baseline_scores(train, val).items():
            if isinstance(score, float):
                baselines.setdefault(name, []).append(score)
    base_row = {k: round(100 * statistics.mean(v), 2) for k, v in baselines.items()}
    print("validation baselines (mean of 5 samples): " + ", ".join(f"{k} {v}" for k, v in base_row.items()))
    print("| setting | val accuracy % | sd | val perplexity | selected epoch (mean) | at the cap | seconds |\n"
          "|---|---|---|---|---|---|---|", flush=True)
    rows = []
    grid = [GRID[int(i)] for i in a.settings.split(",")] if a.settings else GRID
    for change in grid:
        accs, ppls, epochs, capped, t0 = [], [], [], 0, time.time()
        for fold, seed in points:
            ft = dataclasses.replace(base, fold=fold, seed=seed, **change)
            train, val, _ = fel_split(data, task_named(a.task), ft)
            row = finetune_calculation(pre, ft, train, val, val=val).row  # scored on val: the test set stays unseen
            accs.append(100 * row["accuracy"])
            ppls.append(row["perplexity"])
            epochs.append(row["epochs"])
            capped += row["epochs"] == ft.max_epochs
        out = {"setting": change or "mini preset", "val_accuracy": round(statistics.mean(accs), 2),
               "sd": round(statistics.stdev(accs), 2), "val_perplexity": round(statistics.mean(ppls), 4),
               "selected_epoch": round(statistics.mean(epochs), 1), "at_cap": capped,
               "seconds": round(time.time() - t0, 1)}
        rows.append(out)
        label = "mini preset" if not change else ", ".join(f"{k} {v}" for k, v in change.items())
        print(f"| {label} | {out['val_accuracy']} | {out['sd']} | {out['val_perplexity']} | {out['selected_epoch']} | "
              f"{capped}/{len(points)} | {out['seconds']} |", flush=True)
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "model": a.model, "task": a.task,
                                "validation_baselines": base_row, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

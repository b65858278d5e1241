"""Does refitting on the whole budget help an FEL calculation? Nested inside the budget, never touching the test set.

Honest selection carves a validation split (20%) from the 200-example budget, trains on the other 160 and selects
the epochs on the 40. The context-free baselines are fitted on all 200. `FinetuneConfig.refit` trains again on
all 200 to the selected epochs. Whether that helps is measured one level down, so that the choice needs no test
score: for each of the protocol's ten (fold, seed) calculations, the budget's validation split plays the test set,
and the 160 training examples are split again (128 to train, 32 to select, keyed by the fold). Without refit the
model learns from 128 examples; with it from 160; the strongest context-free baseline (CT: the lexicon) is fitted on
128 and on 160, so the table shows what the extra examples give a lookup. One row per model, and their mean.

    python benchmarks/probes/fel_refit.py --storage alignlab-storage --models <id>,<id>,<id>

Results go to benchmarks/results/fel_refit.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.protocol import fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData


def inner_split(train: list, fold: int, fraction: float) -> tuple[list, list]:
    """(inner train, inner validation) of a calculation's training examples, keyed by the fold (as the budget is)."""
    idx = list(range(len(train)))
    random.Random(f"fel-refit-inner-{fold}").shuffle(idx)
    k = max(1, round(fraction * len(train)))
    return [train[i] for i in idx[k:]], [train[i] for i in idx[:k]]


def strongest_baseline(task: str, train: list, test: list) -> float:
    """The best context-free baseline of `task` fitted on `train`, scored on `test` (CT's is the lexicon)."""
    return max(v for v in task_named(task).baseline_scores(train, test).values() if isinstance(v, float))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_args.add_storage_flags(p, models=True, task="ct")
    bench_args.add_flags(p, threads=1, out="fel_refit.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = TaskData.load(a.tasks or only_folder(a.storage, "tasks"))
    command = bench_args.command("probes/fel_refit.py", argv)
    base = dataclasses.replace(Preset.named("mini").finetune, task=a.task, keep_head=False, refit=False)
    points = list(itertools.product(range(5), range(2)))
    print(f"# {command}\n# task {a.task}, heads discarded (the * column), {len(points)} calculations per model; "
          "the budget's validation split is the test set here", flush=True)
    print("| model | no refit % | refit % | gain | best baseline, inner train % | best baseline, training examples % | "
          "baseline gain | refit better / equal / worse | seconds |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for mid in a.models.split(","):
        pre, t0 = load_pretrained(a.storage / "models" / mid), time.time()
        got: dict[str, list[float]] = {"plain": [], "refit": [], "lex_inner": [], "lex_train": []}
        for fold, seed in points:
            ft = dataclasses.replace(base, fold=fold, seed=seed)
            train, outer_val, _ = fel_split(data, task_named(a.task), ft)
            itrain, ival = inner_split(train, fold, ft.val_fraction)
            for key, refit in (("plain", False), ("refit", True)):
                calc = finetune_calculation(pre, dataclasses.replace(ft, refit=refit), itrain, outer_val, val=ival)
                got[key].append(100 * calc.row["accuracy"])
            got["lex_inner"].append(100 * strongest_baseline(a.task, itrain, outer_val))
            got["lex_train"].append(100 * strongest_baseline(a.task, train, outer_val))
        mean = {k: round(statistics.mean(v), 2) for k, v in got.items()}
        diffs = [r - q for q, r in zip(got["plain"], got["refit"])]
        row = {"model": mid, **mean, "gain": round(mean["refit"] - mean["plain"], 2),
               "baseline_gain": round(mean["lex_train"] - mean["lex_inner"], 2),
               "better_equal_worse": [sum(d > 1e-9 for d in diffs), sum(abs(d) <= 1e-9 for d in diffs),
                                      sum(d < -1e-9 for d in diffs)],
               "seconds": round(time.time() - t0, 1), "per_calculation": got}
        rows.append(row)
        print(f"| {mid} | {mean['plain']} | {mean['refit']} | {row['gain']:+.2f} | {mean['lex_inner']} | "
              f"{mean['lex_train']} | {row['baseline_gain']:+.2f} | {'/'.join(map(str, row['better_equal_worse']))} | "
              f"{row['seconds']} |", flush=True)
    if len(rows) > 1:
        m = {k: round(statistics.mean(r[k] for r in rows), 2) for k in ("plain", "refit", "lex_inner", "lex_train")}
        bew = [sum(r["better_equal_worse"][i] for r in rows) for i in range(3)]
        print(f"| mean of {len(rows)} | {m['plain']} | {m['refit']} | {m['refit'] - m['plain']:+.2f} | "
              f"{m['lex_inner']} | {m['lex_train']} | {m['lex_train'] - m['lex_inner']:+.2f} | "
              f"{'/'.join(map(str, bew))} | |")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "task": a.task, "rows": rows})


if __name__ == "__main__":
    main()

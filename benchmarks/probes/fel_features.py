"""What should an FEL head read from a frozen mini encoder? Nested inside the budget, never touching the test set.

The paper's `pred` head reads the encoder's last layer at each word's first piece (BERT's tagging recipe). Two
other readings are standard for frozen features: every layer side by side (BERT's feature-based NER, Devlin et al.
2019 §5.3; ELMo), and a word's pieces averaged rather than its first piece alone. `FinetuneConfig.feature_layers`
("last", "all") and `word_pooling` ("first", "mean") choose them. Each head input here runs the mini FEL preset
(refit on) in the same nesting as `fel_refit.py`: for each of the protocol's ten (fold, seed) calculations, the
budget's validation split plays the test set, and the 160 training examples are split again (128 to train, 32 to
select). The strongest context-free baseline (CT: the lexicon) is fitted on the 160, as refit's model learns from
them. `random:<id>` is the model's shape untrained (seed 0): what the head input gives without pretraining.

    python benchmarks/probes/fel_features.py --storage alignlab-storage --models <id>,<id>,random:<id> --inputs last:first,all:mean

Results go to benchmarks/results/fel_features.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from ct_words import load_model
from fel_refit import inner_split, strongest_baseline
from alignlab.platform.fel.finetune import finetune_calculation
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--models", required=True, help="comma-separated model ids under <storage>/models (random:<id> too)")
    p.add_argument("--inputs", default="last:first,all:mean",
                   help="comma-separated head inputs, feature_layers:word_pooling; the first is the reference")
    p.add_argument("--tasks", type=Path, help="a task folder (default: the only one under --storage)")
    p.add_argument("--task", default="ct")
    bench_args.add_flags(p, threads=1, out="fel_features.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = TaskData.load(a.tasks or only_folder(a.storage, "tasks"))
    command = bench_args.command("probes/fel_features.py", argv)
    inputs = [tuple(i.split(":")) for i in a.inputs.split(",")]
    base = dataclasses.replace(Preset.named("mini").finetune, task=a.task, keep_head=False)
    names = [f"{layers}:{pooling}" for layers, pooling in inputs]
    print(f"# {command}\n# task {a.task}, the mini FEL preset (refit {base.refit}), heads discarded, "
          f"{len(calculations())} calculations per model; the budget's validation split is the test set here", flush=True)
    print(f"| model | {' | '.join(names)} | best baseline | {names[-1]} vs {names[0]}: better / equal / worse | seconds |\n"
          f"|---|{'---|' * len(names)}---|---|---|", flush=True)
    rows = []
    for mid in a.models.split(","):
        pre, t0 = load_model(a.storage, mid), time.time()
        got: dict[str, list[float]] = {n: [] for n in [*names, "baseline"]}
        for fold, seed in calculations():
            ft = dataclasses.replace(base, fold=fold, seed=seed)
            train, outer_val, _ = fel_split(data, task_named(a.task), ft)
            itrain, ival = inner_split(train, fold, ft.val_fraction)
            for name, (layers, pooling) in zip(names, inputs):
                cfg = dataclasses.replace(ft, feature_layers=layers, word_pooling=pooling)
                got[name].append(100 * finetune_calculation(pre, cfg, itrain, outer_val, val=ival).row["accuracy"])
            got["baseline"].append(100 * strongest_baseline(a.task, train, outer_val))
        mean = {k: round(statistics.mean(v), 2) for k, v in got.items()}
        diffs = [r - q for q, r in zip(got[names[0]], got[names[-1]])]
        row = {"model": mid, **mean, "better_equal_worse": [sum(d > 1e-9 for d in diffs), sum(abs(d) <= 1e-9 for d in diffs),
                                                         sum(d < -1e-9 for d in diffs)],
               "seconds": round(time.time() - t0, 1), "per_calculation": got}
        rows.append(row)
        print(f"| {mid} | {' | '.join(str(mean[n]) for n in names)} | {mean['baseline']} | "
              f"{'/'.join(map(str, row['better_equal_worse']))} | {row['seconds']} |", flush=True)
    trained = [r for r in rows if not r["model"].startswith("random:")]
    if len(trained) > 1:
        m = {k: round(statistics.mean(r[k] for r in trained), 2) for k in [*names, "baseline"]}
        bew = [sum(r["better_equal_worse"][i] for r in trained) for i in range(3)]
        print(f"| mean of {len(trained)} pretrained | {' | '.join(str(m[n]) for n in names)} | {m['baseline']} | "
              f"{'/'.join(map(str, bew))} | |")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "task": a.task, "inputs": names, "rows": rows})


if __name__ == "__main__":
    main()

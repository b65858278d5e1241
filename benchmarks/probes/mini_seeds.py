"""Changes to the mini recipe, compared across pretraining seeds on held-out and VALIDATION figures (issue #15).

`laptop_budget.py` compares recipes at one wall-clock budget, one run each, with 2 FEL calculations: it cannot tell
a 1-point CT difference from the swing between runs. This benchmark asks the mini study's own question of a recipe
change. For each arm (a named change to the mini preset, with the four objectives: the study's `all` model) and each
pretraining seed it pretrains the model with the engine (`pretrain()`, real Ray Train; a model already in the
registry is reused), reads its held-out pretraining figures (`final/eval.json`, what the study's report shows), and
runs the mini FEL preset's ten CT calculations scored on their validation splits (`fel_settings.py --settings 0`:
the test set is never scored, so an arm can be chosen from this table).

    python benchmarks/probes/mini_seeds.py --storage alignlab-storage --arms steps2000,acr25,steps3000 --seeds 0,1,2

Results go to benchmarks/results/mini_seeds.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import fel_settings
from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.presets import Preset

# Absolute settings, not changes to whatever the preset is now, so that an arm names the same model ids later.
ARMS = {
    "steps2000": {"max_steps": 2000, "corpus_embeddings": 0.0},  # the mini preset before Round 12
    "acr25": {"max_steps": 2000, "layout_fraction": 0.25, "corpus_embeddings": 0.0},  # PAD on a quarter of the linked rows, not half
    "steps3000": {"max_steps": 3000, "corpus_embeddings": 0.0},  # the mini preset of Rounds 12-13
    # PAD's acronym examples keep their chunk's WHP tags (`pad.chunk_labels`): WHP trains on every linked row
    "pad_chunk_labels": {"max_steps": 3000, "corpus_embeddings": 0.0,
                         "objectives": ["mlm", "nsp", "whp", {"name": "pad", "chunk_labels": True}]},
    # Round 14: word embeddings that start from the corpus's co-occurrence statistics (PPMI + SVD), std 0.1
    "corpus_emb": {"max_steps": 3000, "corpus_embeddings": 0.1},
}
HELD_OUT = {"mlm": "eval/mlm/accuracy", "mlm_at_mask": "eval/mlm/masked_accuracy", "nsp": "eval/nsp/accuracy",
            "whp": "eval/whp/accuracy", "pad": "eval/pad/accuracy"}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--arms", default="steps2000,steps3000", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0,1,2")
    bench_args.add_flags(p, out="mini_seeds.json")
    a = p.parse_args(argv)
    arms, seeds = a.arms.split(","), [int(s) for s in a.seeds.split(",")]
    if unknown := [x for x in arms if x not in ARMS]:
        sys.exit(f"mini_seeds.py: unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    import ray

    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.runtime.ray_env import ensure_ray

    command = bench_args.command("probes/mini_seeds.py", argv)
    corpus = only_folder(a.storage, "corpus")
    base = dataclasses.replace(Preset.named("mini").pretrain, objectives=resolve_objectives("mlm,nsp,whp,pad"))
    ensure_ray(2)  # alignlab's Ray: the deterministic row order a model id stands for
    rows = []
    for seed in seeds:  # seed by seed: a run cut short leaves whole pairs to compare
        for arm in arms:
            t0 = time.time()
            mdir = pretrain(corpus, dataclasses.replace(base, seed=seed, **ARMS[arm]), a.storage)
            seconds = round(time.time() - t0)  # ~0 when the registry already held the model
            ev = json.loads((mdir / "final" / "eval.json").read_text())
            fel = fel_settings.main(["--storage", str(a.storage), "--model", mdir.name, "--settings", "0",
                                     "--out", str(a.out.with_name("fel_settings_mini_seeds.json"))])[0]
            rows.append({"arm": arm, "seed": seed, "model": mdir.name, "pretrain_seconds": seconds,
                         "precision": ev.get("precision"), "step": ev.get("step"),
                         **{k: round(100 * ev[v], 2) for k, v in HELD_OUT.items() if v in ev},
                         "ct_val": fel["val_accuracy"]})
            print(f"[mini_seeds] {json.dumps(rows[-1])}", flush=True)
    ray.shutdown()
    cols = [*HELD_OUT, "ct_val"]
    print(f"\n# {command}\n| arm | seed | model | steps | precision | pretrain s | "
          + " | ".join(cols) + " |\n|" + "---|" * (6 + len(cols)))
    for r in sorted(rows, key=lambda r: arms.index(r["arm"])):
        print(f"| {r['arm']} | {r['seed']} | {r['model']} | {r['step']} | {r['precision']} | {r['pretrain_seconds']} | "
              + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        print(f"| {arm} | mean | | | | | " + " | ".join(
            str(round(statistics.mean(r[c] for r in mine), 2)) if all(c in r for r in mine) else "" for c in cols) + " |")
    print("(held-out figures as the engine scores them, %; ct_val: mean of the 10 CT calculations on their validation "
          "splits, the mini FEL preset with refit off; pretrain s is 0-ish for a model the registry already held)")
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "corpus": corpus.name, "rows": rows})


if __name__ == "__main__":
    main()

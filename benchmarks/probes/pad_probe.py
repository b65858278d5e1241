"""PAD learnability probe: pretrain in-process for N steps, print held-out accuracy per objective as it goes,
then run a few FEL calculations (AD and CT, scheme pred, heads discarded, honest selection).

This answers "after how many steps does PAD leave chance for this model, corpus and learning rate?"
without a study around it: the same `Pretrainer` and `Collator` as `alignlab pretrain`, but a plain loop on
rows read into memory (no Ray), so a probe of tens of thousands of steps costs only its steps. Rows are
drawn in a fixed random order; held-out accuracy comes from the corpus's eval shards.

    alignlab data build-tasks --preset mini && alignlab corpus build --preset mini   # or a study built them
    python benchmarks/probes/pad_probe.py --corpus alignlab-storage/corpus/<id> --tasks alignlab-storage/tasks/<id> \\
        --steps 9000 --lr 2e-4 --decay constant --eval-every 1000
    # on a GPU, the mini recipe's blocks without the distance bias, stopped after ~250 s (benchmarks/README.md,
    # "Round 13"; --keep-head adds the FEL calculations that keep the pretrained heads):
    python benchmarks/probes/pad_probe.py --corpus ... --tasks ... --norm pre --dropout 0 --steps 30000 --batch-size 64 \
        --eval-every 2000 --calculations 2 --keep-head --budget-s 250 --device cuda

Prints one JSON line per evaluation and a final RESULT line (mean accuracy % over the calculations, their
standard deviation, and the context-free baseline on the same splits). FEL is scored on each calculation's
validation split by default (refit off, as `fel_settings.py`), so that a probe used to choose anything never
reads the test set; `--score-on test` scores the test splits (the probes before 2026-11-26 did, as a diagnostic).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from alignlab.platform.bench import bench_args
from alignlab.platform.config import MODEL_SIZES, PRECISIONS
from alignlab.platform.encoder.model_config import NORMS
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.encoder.registry import objective_config
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.fel.finetune import Pretrained, finetune_calculation
from alignlab.platform.fel.protocol import calculations, context_free_baselines, fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="a finished corpus folder")
    p.add_argument("--tasks", type=Path, required=True, help="a task folder (alignlab data build-tasks)")
    p.add_argument("--objectives", default="mlm,nsp,whp,pad")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--decay", choices=("constant", "linear"), default="linear")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--init", choices=("bert", "fan_in"), default="bert")
    p.add_argument("--norm", choices=NORMS, default="post", help="pre: the mini recipe's blocks")
    p.add_argument("--dropout", type=float, default=0.1, help="0: the mini recipe's")
    p.add_argument("--acronym-fraction", type=float, default=0.5)
    p.add_argument("--pad-subword-alpha", type=float, default=0.0)
    p.add_argument("--precision", choices=PRECISIONS, default="auto")
    p.add_argument("--score-on", choices=("validation", "test"), default="validation",
                   help="FEL's scoring split (default validation: the test set stays unseen)")
    bench_args.add_flags(p, threads=2)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=30)
    p.add_argument("--calculations", type=int, default=4, help="FEL calculations per task at the end (<= 10)")
    p.add_argument("--device", default="cpu", help="cuda: pretrain and finetune on the GPU (rows collate on the CPU)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="> 0: stop pretraining after this many seconds even before --steps (the schedule stays "
                        "that of --steps), then finetune")
    p.add_argument("--keep-head", action="store_true",
                   help="also the calculations that keep the pretrained heads (PAD's for AD, WHP's for CT)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    manifest = json.loads((a.corpus / "manifest.json").read_text())
    max_len = manifest["config"]["max_len"]
    model = dataclasses.replace(MODEL_SIZES["128x2"], hidden=a.hidden, num_layers=a.layers, head_dim=a.head_dim,
                                ffn=a.ffn, max_len=max_len, init=a.init, norm=a.norm, dropout=a.dropout)
    objectives = tuple(objective_config(o, subword_alpha=a.pad_subword_alpha) if o == "pad" else objective_config(o)
                       for o in a.objectives.split(","))
    cfg = dataclasses.replace(Preset.named("mini").pretrain, model=model, objectives=objectives, lr=a.lr,
                              warmup_steps=a.warmup, decay=a.decay, max_steps=a.steps, batch_size=a.batch_size,
                              layout_fraction=a.acronym_fraction, precision=a.precision)
    tok = Tokenizer(a.corpus / "tokenizer.model")
    trainer = Pretrainer(cfg, tok, device=a.device, word_embeddings=for_corpus(a.corpus, cfg, tok.vocab_size))

    def shards(split):
        return pa.concat_tables([pq.read_table(a.corpus / "shards" / n) for n in manifest["shards"][split]])

    train, held_out = shards("train"), to_numpy_rows(shards("eval"))
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs, t0, seen = a.batch_size, time.time(), []

    def held_out_batches():
        for s in range(0, len(held_out["doc_id"]) - bs + 1, bs):
            yield {k: v[s: s + bs] for k, v in held_out.items()}

    print(json.dumps({"config": {k: str(v) for k, v in vars(a).items()}}), flush=True)
    done = a.steps
    for step in range(a.steps):
        start = (step * bs) % (len(order) - bs)
        m = trainer.train_step(trainer.collate(to_numpy_rows(train.take(order[start: start + bs])), step=step))
        seen.append(m.get("train/pad/accuracy", float("nan")))
        over = a.budget_s > 0 and time.time() - t0 > a.budget_s
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps or over:
            ev = trainer.evaluate(held_out_batches(), max_batches=a.eval_batches)
            print(json.dumps({"step": step + 1, "seconds": round(time.time() - t0),
                              "train_pad_accuracy_recent": round(float(np.nanmean(seen[-a.eval_every:])), 3),
                              **{k: round(v, 3) for k, v in ev.items() if not k.endswith("count")}}), flush=True)
        if over:
            done = step + 1
            break
    pretrain_seconds = round(time.time() - t0)
    state = {k: v.cpu() for k, v in trainer.model.state_dict().items()}
    pre = Pretrained(Path("."), model, tok.vocab_size, state, list(trainer.model.heads), tok)
    data = TaskData.load(a.tasks)
    result = {}
    for task, keep in [(t, k) for t in ("ad", "ct") for k in ((False, True) if a.keep_head else (False,))]:
        accs, base = [], []
        for fold, seed in calculations()[: a.calculations]:
            ft = dataclasses.replace(Preset.named("mini").finetune, task=task, fold=fold, seed=seed, keep_head=keep)
            tr, va, te = fel_split(data, task_named(task), ft)
            if a.score_on == "validation":  # refit would train on the split that is scored
                ft, te = dataclasses.replace(ft, refit=False), va
            accs.append(finetune_calculation(pre, ft, tr, te, val=va, device=a.device).row["accuracy"])
            cf = context_free_baselines(task_named(task), tr, te)
            base.append(cf["baseline_best"])
            best_name = cf["baseline_best_name"]
        result[task + ("" if not keep else " (heads kept)")] = {"accuracy_pct": round(100 * float(np.mean(accs)), 1),
                        "std_pct": round(100 * float(np.std(accs, ddof=1)), 1) if len(accs) > 1 else 0.0,
                        "context_free_pct": round(100 * float(np.mean(base)), 1), "context_free": best_name,
                        "calculations": len(accs),
                        "selection": "honest", "scored_on": a.score_on}
    print("RESULT " + json.dumps({"steps": done, "pretrain_seconds": pretrain_seconds, "device": a.device, **result}),
          flush=True)


if __name__ == "__main__":
    main()

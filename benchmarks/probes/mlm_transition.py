"""When does the mini encoder start to predict masked tokens from their context? (issue #15)

`laptop_budget.py` found every recipe's held-out MLM accuracy stuck at ~10% within the mini budget. That ~10% is the
*copy* of the predicted positions whose input shows the token itself (10% of them: BERT's 80/10/10 rule); at the
[MASK] positions the models score below 1%, what predicting the corpus's frequent tokens everywhere scores. This
benchmark trains one recipe for many steps in a plain loop (no Ray, 2 threads) and scores, every `--every` steps,
the accuracy at the [MASK] positions alone, under rare-weighted masks (the paper's `alpha` 0.5, what the studies
report) and under uniform masks (BERT's), on the same held-out examples each time. The step where it leaves the
frequency prior is the learning "transition" a laptop budget has to reach.

    python benchmarks/probes/mlm_transition.py --storage alignlab-storage --steps 10000 --every 1000
    python benchmarks/probes/mlm_transition.py --steps 8000 --every 1000 --objectives mlm --mlm-alpha 0 --no-short-seq

Results go to benchmarks/results/mlm_transition.json, one entry per command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import load_corpus
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, with_resolved_precision, to_numpy_rows


def mlm_accuracies(trainer: Pretrainer, held: dict, collate: Collator, batches: int) -> tuple[float, float]:
    """% of the held-out predicted positions whose token the model predicts (`eval/mlm/accuracy`, the aggregate
    issue #15's goal names: [MASK], kept and random positions alike), and of the [MASK] positions alone
    (`eval/mlm/masked_accuracy`), under `collate`'s masks: the same examples and masks at every point."""
    rows = ({k: v[i:i + 32] for k, v in held.items()} for i in range(0, 32 * batches, 32))
    m = trainer.evaluate(rows, max_batches=batches, collate=collate)
    return round(100 * m["eval/mlm/accuracy"], 2), round(100 * m["eval/mlm/masked_accuracy"], 2)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--corpus", type=Path, help="a finished corpus folder (default: the only one under --storage)")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--every", type=int, default=1000)
    p.add_argument("--objectives", default="mlm,nsp,whp,pad")
    p.add_argument("--mlm-alpha", type=float, default=None, help="train with this masking exponent (eval uses both)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--alibi", type=float, default=None, help="ModelConfig.alibi (the distance bias) to train with")
    p.add_argument("--no-short-seq", action="store_true", help="128 tokens throughout (the mini preset: 64 first)")
    p.add_argument("--eval-batches", type=int, default=25)
    bench_args.add_flags(p, threads=2, out="mlm_transition.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    corpus, tok, train, held = load_corpus(a.storage, a.corpus)
    held = to_numpy_rows(held)
    mini = Preset.named("mini").pretrain
    objectives = resolve_objectives(a.objectives)
    if a.mlm_alpha is not None:
        objectives = tuple(dataclasses.replace(o, alpha=a.mlm_alpha) if o.name == "mlm" else o for o in objectives)
    changes = {"objectives": objectives, "max_steps": a.steps}
    if a.lr:
        changes["lr"] = a.lr
    if a.alibi is not None:
        changes["model"] = dataclasses.replace(mini.model, alibi=a.alibi)
    if a.no_short_seq:
        changes.update(short_seq_len=0, short_seq_fraction=0.0)
    cfg = with_resolved_precision(dataclasses.replace(mini, **changes))
    trainer = Pretrainer(cfg, tok, word_embeddings=for_corpus(corpus, cfg, tok.vocab_size))
    evals = {}
    for alpha in (0.5, 0.0):  # rare-weighted (the paper's) and uniform held-out masks
        objs = [(dataclasses.replace(o, alpha=alpha, mask_prob=0.15, mask_token_prob=0.8, random_token_prob=0.1)
                 if o.name == "mlm" else o).build(tok) for o in cfg.objectives]
        evals[alpha] = Collator(objs, tok, max_len=cfg.model.max_len, layout_fraction=mini.layout_fraction, seed=0)
    command = bench_args.command("probes/mlm_transition.py", argv)
    print(f"# {command}\n# corpus {corpus.name}, precision {cfg.precision}, {a.threads} threads, objectives "
          f"{'+'.join(cfg.objective_names)}, lr {cfg.lr} ({cfg.decay} decay to 0 at step {cfg.max_steps})", flush=True)
    order = np.random.default_rng(0).permutation(train.num_rows)
    bs, points, t0, eval_s = cfg.batch_size, [], time.time(), 0.0
    for step in range(cfg.max_steps):
        start = (step * bs) % (len(order) - bs)
        rows = to_numpy_rows(train.take(order[start:start + bs]))
        m = trainer.train_step(trainer.collator_at(step)(rows, step=step, max_len=cfg.seq_len_at(step)))
        if (step + 1) % a.every == 0:
            e0 = time.time()
            rare, uniform = (mlm_accuracies(trainer, held, evals[alpha], a.eval_batches) for alpha in (0.5, 0.0))
            # train_seconds leaves out the evaluations, as laptop_budget.py's budget does.
            point = {"step": step + 1, "train_seconds": round(e0 - t0 - eval_s, 1),
                     "mlm_loss": round(m["train/mlm/loss"], 3),
                     "accuracy_rare_weighted": rare[0], "masked_accuracy_rare_weighted": rare[1],
                     "accuracy_uniform": uniform[0], "masked_accuracy_uniform": uniform[1]}
            points.append(point)
            trainer.model.train()
            eval_s += time.time() - e0
            print(json.dumps(point), flush=True)
    print(f"# total {time.time() - t0:.0f}s\n# {command}")
    entry = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "precision": cfg.precision, "objectives": list(cfg.objective_names), "points": points}
    machine_info.record(a.out, entry)


if __name__ == "__main__":
    main()

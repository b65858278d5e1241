"""Held-out PAD accuracy by kind of pair: what does a pretrained PAD head get right? (issue #15, Round 13)

PAD's held-out accuracy (`eval/pad/accuracy`) mixes three kinds of pairs (`make_pad_pairs`): positives (the initials
of a span of the chunk), "mutate" negatives (such initials with letters replaced) and "other" negatives (the
initials of a span of another chunk of the batch). How a head does on each kind says more about what it learnt
than the mixed figure, and the engine's held-out sample (~170 PAD rows for a mini model, +-3.8 points) is small;
this draws thousands.

For each model it draws fresh pairs among the linked chunks of the corpus's held-out shards (`--draws` times, each
with its own generator), collates them as the engine does (PAD's objective alone, every linked row an acronym
example, the model's own sequence length), and scores the model's PAD head per kind. Rows whose chunk had to be cut
(the collator then draws their pairs anew, kind unknown) are left out and counted. CPU, no Ray.

    python benchmarks/probes/pad_kinds.py --storage alignlab-storage --models 128x2-mlm+nsp+pad-<hash>,...

Results go to benchmarks/results/pad_kinds.json (one entry per command).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.objectives.pseudo_acronym import make_pad_pairs
from alignlab.platform.config import pretrain_from_dict
from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.pretrain.pretrain import Pretrainer, to_numpy_rows

KINDS = ("pos", "mutate", "other")


def held_out_linked_rows(corpus: Path) -> dict:
    manifest = json.loads((corpus / "manifest.json").read_text())
    table = pa.concat_tables([pq.read_table(corpus / "shards" / n) for n in manifest["shards"]["eval"]])
    rows = to_numpy_rows(table)
    keep = np.flatnonzero(np.asarray([str(k) == "wiki" for k in rows["kind"]]))
    return {k: v[keep] for k, v in rows.items()}


@torch.no_grad()
def score(mdir: Path, rows: dict, draws: int, batch_size: int) -> dict:
    info = json.loads((mdir / "config.json").read_text())
    cfg = pretrain_from_dict(info["pretrain"])
    tok = Tokenizer(mdir / "final" / "tokenizer.model")
    trainer = Pretrainer(cfg, tok)
    trainer.model.load_state_dict(torch.load(mdir / "final" / "model.pt", map_location="cpu", weights_only=True))
    trainer.model.eval()
    pad = trainer.objectives["pad"]
    collate = Collator([pad], tok, max_len=cfg.seq_len or cfg.model.max_len, layout_fraction=1.0)
    right, seen, cut = Counter(), Counter(), 0
    n = len(rows["doc_id"])
    for d in range(draws):
        rng = np.random.default_rng([1234, d])
        for s in range(0, n - batch_size + 1, batch_size):
            b = {k: v[s:s + batch_size].copy() for k, v in rows.items()}
            pairs = make_pad_pairs([str(t).split() for t in b["a_text"]], rng, pad.letter_probs)
            b["pad_acronym"] = np.asarray([p[0] for p in pairs], dtype=object)
            b["pad_label"] = np.asarray([p[1] for p in pairs])
            batch = collate(b, step=s)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer.autocast):
                hidden = trainer.model.encoder(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
                pred = trainer.model.heads["pad"](hidden[:, 0]).argmax(-1)
            for i, (_, label, kind) in enumerate(pairs):
                if label < 0:
                    continue
                if int(batch["pad"][i]) != label:  # cut to fit: drawn anew by the collator, kind unknown
                    cut += 1
                    continue
                seen[kind] += 1
                right[kind] += int(pred[i]) == label
    acc = {k: round(100 * right[k] / seen[k], 1) if seen[k] else None for k in KINDS}
    total = sum(seen.values())
    return {"model": mdir.name, "precision": trainer.precision, "pairs": dict(seen), "left_out_cut": cut,
            "accuracy_by_kind": acc, "accuracy": round(100 * sum(right.values()) / total, 1) if total else None,
            "held_out_pad_at_the_end": round(100 * json.loads((mdir / "final" / "eval.json").read_text())
                                             .get("eval/pad/accuracy", float("nan")), 1)}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--models", required=True, help="comma-separated model ids under <storage>/models (with PAD)")
    p.add_argument("--draws", type=int, default=4, help="pair draws over the held-out linked chunks")
    p.add_argument("--batch-size", type=int, default=32, help="chunks per draw of pairs (\"other\" comes from these)")
    bench_args.add_flags(p, threads=2, out="pad_kinds.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    command = bench_args.command("probes/pad_kinds.py", argv)
    out, rows_by_corpus = [], {}
    print(f"# {command}\n| model | pairs | positives % | mutate % | other % | all % | held-out PAD at the end % |\n"
          "|---|---|---|---|---|---|---|", flush=True)
    for mid in a.models.split(","):
        mdir = a.storage / "models" / mid
        corpus = Path(json.loads((mdir / "config.json").read_text())["corpus_dir"])
        if not corpus.exists():
            corpus = a.storage / "corpus" / corpus.name
        if corpus not in rows_by_corpus:
            rows_by_corpus[corpus] = held_out_linked_rows(corpus)
        r = score(mdir, rows_by_corpus[corpus], a.draws, a.batch_size)
        out.append(r)
        k = r["accuracy_by_kind"]
        print(f"| {mid} | {sum(r['pairs'].values())} | {k['pos']} | {k['mutate']} | {k['other']} | {r['accuracy']} | "
              f"{r['held_out_pad_at_the_end']} |", flush=True)
    print("(% of each kind's pairs the PAD head labels right; pairs drawn afresh among the held-out linked chunks by "
          "make_pad_pairs, --draws times)")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "rows": out})
    return out


if __name__ == "__main__":
    main()

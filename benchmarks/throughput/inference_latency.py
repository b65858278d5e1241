"""Serving latency at batch 1 on CPU: alignlab's CT tagger and AD scorer vs. Hugging Face `BertModel`.

For each of the paper's nine sizes (256/512/768 hidden x 1/2/3 layers, 64-dim heads, FFN 3072) this
times, interleaved round by round so that load from other processes hits every contender alike:
- `ct`: alignlab's whole CT prediction path for a 10-word query, `Predictor.bracket(query)`:
  sentencepiece tokenization, encoder, CT head, tags -> "[ ]" string;
- `ct_all_mean`: the same with a CT head that reads every layer and averages each word's pieces (the mini FEL
  preset's head input, `FinetuneConfig.feature_layers="all"`, `word_pooling="mean"`);
- `ad`: alignlab's AD score of one (acronym, snippet) pair, `Predictor.acronym_score`;
- `enc`: alignlab's training-time encoder module (`model.Encoder`, eval mode) on the CT query's ids,
  for reference: what the fast inference forward saves;
- `hf`: Hugging Face `transformers.BertModel` of the same size, encoder only, on a 10-token input.
Weights are random (latency does not depend on their values); vocabulary: a sentencepiece model
trained here on bundled English summaries. fp32, `torch.inference_mode()`, eval mode, no padding.

    python benchmarks/throughput/inference_latency.py [--runs 300] [--threads 2] [--sizes 256x1,768x3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform as _stdlib_platform
import shlex
import sys
import tempfile
import time
from pathlib import Path


import numpy as np
import torch
from alignlab.platform.bench import bench_args, machine_info

QUERY = "when was the first super mario game released in japan"
ACRONYM = "wow"
SNIPPET = ("much of world of warcraft's gameplay involves the completion of quests. "
           "these quests are usually available from npcs.")
PAPER_SIZES = [f"{h}x{n}" for h in (256, 512, 768) for n in (1, 2, 3)]
CONTENDERS = ("ct", "ct_all_mean", "ad", "enc", "hf")


def _tokenizer(workdir: Path, vocab_size: int):
    from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
    from alignlab.platform.sources.sources import read_bundled

    path = workdir / "tokenizer.model"
    train_tokenizer([d.text for d in read_bundled(("en",), max_docs_per_lang=3000)], path, vocab_size=vocab_size)
    return Tokenizer(path)


def _predictor(size: str, tok, feature_layers: str = "last", word_pooling: str = "first"):
    from alignlab.platform.config import MODEL_SIZES
    from alignlab.platform.encoder.model import AlignModel
    from alignlab.platform.fel.finetune import Finetuned
    from alignlab.platform.fel.finetune_config import FinetuneConfig
    from alignlab.platform.fel.head_input import reads_of, task_head
    from alignlab.platform.fel.inference import Predictor
    from alignlab.platform.tasks.task import task

    torch.manual_seed(0)
    cfg = MODEL_SIZES[size]
    model = AlignModel(cfg, tok.vocab_size)
    ft_cfg = FinetuneConfig(task="ct", feature_layers=feature_layers, word_pooling=word_pooling)
    for h in ("ct", "ad"):
        model.heads[h] = task_head(task(h), cfg, cfg.dropout, reads_of(ft_cfg))
    model.eval()
    ft = Finetuned(Path(f"random-{size}"), model, tok, ft_cfg, ("ct", "ad"), (), {}, {})
    return Predictor(ft), model


def _hf_bert(size: str, vocab_size: int):
    from transformers import BertConfig, BertModel

    from alignlab.platform.config import MODEL_SIZES

    cfg = MODEL_SIZES[size]
    torch.manual_seed(0)
    hf = BertModel(BertConfig(vocab_size=vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.num_layers,
                              num_attention_heads=cfg.num_heads, intermediate_size=cfg.ffn,
                              max_position_embeddings=cfg.max_len), add_pooling_layer=False)
    return hf.eval()


def _stats(ns: list[int]) -> dict[str, float]:
    ms = np.array(ns, dtype=float) / 1e6
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3), "min_ms": round(float(ms.min()), 3)}


def bench_size(size: str, tok, runs: int, warmup: int) -> dict:
    pred, model = _predictor(size, tok)
    pred_all_mean, _ = _predictor(size, tok, "all", "mean")
    hf = _hf_bert(size, tok.vocab_size)
    from alignlab.tasks.acronym_detection import pair_input as ad_input
    from alignlab.platform.tasks.task_kinds import query_input as ct_input

    ct_ids, _ = ct_input(tok, QUERY.split(), model.cfg.max_len)
    ad_ids, _ = ad_input(tok, ACRONYM, SNIPPET, model.cfg.max_len, "letters")
    enc_ids = torch.tensor([ct_ids])
    enc_seg = torch.zeros_like(enc_ids)
    hf_ids = torch.randint(5, tok.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))

    def run_enc():
        with torch.inference_mode():
            model.encoder(enc_ids, enc_seg)

    def run_hf():
        with torch.inference_mode():
            hf(input_ids=hf_ids)

    fns = {"ct": lambda: pred.bracket(QUERY), "ct_all_mean": lambda: pred_all_mean.bracket(QUERY),
           "ad": lambda: pred.acronym_score(ACRONYM, SNIPPET),
           "enc": run_enc, "hf": run_hf}
    times = {k: [] for k in fns}
    for i in range(warmup + runs):
        for k, f in fns.items():  # interleaved: a burst of outside load hits every contender alike
            t0 = time.perf_counter_ns()
            f()
            dt = time.perf_counter_ns() - t0
            if i >= warmup:
                times[k].append(dt)
    return {"size": size, "ct_input_tokens": len(ct_ids), "ad_input_tokens": len(ad_ids), "hf_input_tokens": 10,
            "ct_output": pred.bracket(QUERY),
            "hf_attn_implementation": getattr(hf.config, "_attn_implementation", None),
            **{k: _stats(v) for k, v in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300, help="timed runs per contender and size (>= 200)")
    ap.add_argument("--warmup", type=int, default=20)
    bench_args.add_flags(ap, threads=2)
    ap.add_argument("--sizes", default=",".join(PAPER_SIZES))
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "inference_latency.json"))
    args = ap.parse_args(argv)
    if args.runs < 200:
        ap.error("--runs must be >= 200 for a meaningful p99")
    import transformers

    torch.set_num_threads(args.threads)
    command = " ".join(shlex.quote(a) for a in [sys.executable.split("/")[-1], *sys.argv])
    print(f"command: {command}")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as wd:
        tok = _tokenizer(Path(wd), args.vocab_size)
        rows = []
        for size in args.sizes.split(","):
            row = bench_size(size, tok, args.runs, args.warmup)
            rows.append(row)
            print(f"{size:>6}  " + "  ".join(f"{k} p50 {row[k]['p50_ms']:6.2f} p99 {row[k]['p99_ms']:6.2f}"
                                            for k in CONTENDERS), flush=True)
    load_after = os.getloadavg()
    result = {
        "command": command, "runs": args.runs, "warmup": args.warmup, "threads": args.threads, "dtype": "float32",
        "batch_size": 1, "weights": "random (latency does not depend on their values)", "vocab_size": tok.vocab_size,
        "query": QUERY, "acronym": ACRONYM, "snippet": SNIPPET,
        "cpu": machine_info.cpu_model(), "cpu_count": os.cpu_count(), "machine": _stdlib_platform.machine(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
        "contenders": {"ct": "alignlab Predictor.bracket(query): tokenize + encode + CT head + tags to brackets",
                       "ct_all_mean": "the same, the CT head reading every layer with each word's pieces averaged",
                       "ad": "alignlab Predictor.acronym_score(acronym, snippet)",
                       "enc": "alignlab model.Encoder module forward on the CT query ids (reference)",
                       "hf": "transformers BertModel (no pooler), 10-token input"},
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average before {load_before}, after {load_after}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

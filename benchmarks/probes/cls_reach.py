"""How far does [CLS] read? Its attention past position 16 and on the snippet, per layer and head (issue #65, item 4).

PAD, NSP and every sentence-level FEL head (AD among them) read [CLS]. Under the mini preset's distance bias
(`ModelConfig.alibi`, slopes 4 and 1/4) a biased [CLS] keeps almost all its attention on the first few positions,
so an AD snippet's entity (word 8 at the median, word 15 or later in 38% of snippets) barely reaches it;
`ModelConfig.alibi_exempt_cls` lifts the bias from [CLS]'s row and column.

Inputs: the shipped out-of-domain AD pairs (tasks/task_data/npm/ad_ood.jsonl) as AD feeds them,
`[CLS] a c r o n y m [SEP] snippet [SEP]`. Two kinds of rows:
- fresh mini-architecture models (the mini preset's `ModelConfig`, exempt and not), one random token id a word
  (no tokenizer needed; at init the logits are near 0, so the bias alone decides where [CLS] looks);
- trained models (`--models`, under `--storage`), on their own tokenizer's pieces (acronym_detection.pair_input).
Each figure is a mean of [CLS]'s attention mass (query row 0, eval mode, fp32): "past 16" over the inputs longer
than 16 positions, "snippet" (segment 1: the snippet and its closing [SEP]) over all.

    python benchmarks/probes/cls_reach.py
    python benchmarks/probes/cls_reach.py --storage alignlab-storage --models 128x2-mlm+nsp+whp+pad-<hash>

Results go to benchmarks/results/cls_reach.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.encoder.model import Encoder, query_attention
from alignlab.platform.presets import Preset

AD_OOD = Path(__file__).parents[2] / "tasks" / "task_data" / "npm" / "ad_ood.jsonl"
FAR = 16


def pairs(limit: int) -> list[dict]:
    return [json.loads(line) for line in AD_OOD.read_text().splitlines() if line.strip()][:limit]


def word_inputs(examples: list[dict], max_len: int, vocab: int) -> list[tuple[list[int], list[int]]]:
    """One random id a letter of the acronym and a word of the snippet, in AD's layout (ids 0-4 left to specials)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for ex in examples:
        acr = len(ex["acronym"])
        snip = min(len(ex["snippet"].split()), max_len - 3 - acr)
        ids = [1, *torch.randint(5, vocab, (acr,), generator=gen).tolist(), 2,
               *torch.randint(5, vocab, (snip,), generator=gen).tolist(), 2]
        out.append((ids, [0] * (acr + 2) + [1] * (snip + 1)))
    return out


def reach(enc: Encoder, inputs: list[tuple[list[int], list[int]]], batch_size: int = 64) -> dict:
    """Mean [CLS] attention past position FAR and on segment 1, as [layer][head] lists, and how many inputs."""
    far, snip = [], []
    for s in range(0, len(inputs), batch_size):
        chunk = inputs[s:s + batch_size]
        T = max(len(i) for i, _ in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        seg = torch.zeros_like(ids)
        mask = torch.zeros(len(chunk), T, dtype=torch.bool)
        for r, (i, g) in enumerate(chunk):
            ids[r, :len(i)], seg[r, :len(g)], mask[r, :len(i)] = torch.tensor(i), torch.tensor(g), True
        attn = query_attention(enc, ids, seg, mask)  # [layers, B, heads, T]
        far.append(attn[:, mask.sum(1) > FAR, :, FAR:].sum(-1))  # inputs that reach past FAR only
        snip.append((attn * (seg == 1)[None, :, None, :]).sum(-1))
    mean = lambda xs: [[round(float(v), 4) for v in layer] for layer in torch.cat(xs, 1).mean(1)]  # noqa: E731
    return {"past_16": mean(far), "on_snippet": mean(snip), "inputs": len(inputs),
            "longer_than_16": sum(len(i) > FAR for i, _ in inputs)}


def trained(mdir: Path, examples: list[dict]) -> tuple[Encoder, list]:
    from alignlab.tasks.acronym_detection import pair_input
    from alignlab.platform.config import pretrain_from_dict
    from alignlab.platform.encoder.tokenizer import Tokenizer
    from alignlab.platform.pretrain.pretrain import Pretrainer

    cfg = pretrain_from_dict(json.loads((mdir / "config.json").read_text())["pretrain"])
    tok = Tokenizer(mdir / "final" / "tokenizer.model")
    trainer = Pretrainer(cfg, tok)
    trainer.model.load_state_dict(torch.load(mdir / "final" / "model.pt", map_location="cpu", weights_only=True))
    inputs = [pair_input(tok, ex["acronym"], ex["snippet"], cfg.model.max_len, "letters") for ex in examples]
    return trainer.model.encoder.float().eval(), inputs


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--models", default="", help="comma-separated trained model ids under <storage>/models")
    p.add_argument("--pairs", type=int, default=400, help="AD pairs read (the first of ad_ood.jsonl)")
    bench_args.add_flags(p, threads=2, out="cls_reach.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    command = bench_args.command("probes/cls_reach.py", argv)
    examples = pairs(a.pairs)
    mini = Preset.named("mini").pretrain.model
    rows = []
    for exempt in (True, False):
        torch.manual_seed(0)
        cfg = dataclasses.replace(mini, alibi_exempt_cls=exempt)
        rows.append({"model": f"fresh mini architecture, alibi {cfg.alibi}, [CLS] {'exempt' if exempt else 'biased'}",
                     **reach(Encoder(cfg, 8000).eval(), word_inputs(examples, cfg.max_len, 8000))})
    for mid in filter(None, a.models.split(",")):
        enc, inputs = trained(a.storage / "models" / mid, examples)
        rows.append({"model": mid, "alibi_exempt_cls": enc.cfg.alibi_exempt_cls, **reach(enc, inputs)})
    print(f"# {command}\n| model | layer | past position 16, per head | on the snippet, per head |\n|---|---|---|---|")
    for r in rows:
        for layer, (f, s) in enumerate(zip(r["past_16"], r["on_snippet"]), 1):
            print(f"| {r['model']} | {layer} | {' / '.join(map(str, f))} | {' / '.join(map(str, s))} |")
    print(f"(mean [CLS] attention mass: on the snippet over {rows[0]['inputs']} AD pairs of ad_ood.jsonl, past 16 over "
          f"the {rows[0]['longer_than_16']} of them longer than 16 positions (one position a word); fp32, eval mode)")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "rows": rows})
    return rows


if __name__ == "__main__":
    main()

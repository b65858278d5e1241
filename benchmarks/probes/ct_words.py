"""Where does a mini model lose to the per-word lexicon on CT? Accuracy split by seen and unseen words (issue #15).

The mini study's CT cells (the `pred` scheme: a linear head on the frozen encoder, heads discarded) sit under the
per-word lexicon. The lexicon tags a word it saw in the calculation's budget (its 200 examples: the model trains
on 160 of them and selects its epoch on the other 40, then, with the mini preset's refit, trains on all 200) with that word's most frequent tag, and any other word N.
So its errors split cleanly:

- on **seen** words, it is as good as memorising the training sample gets;
- on **unseen** words, it answers N, so it scores the share of N among them.

A model can only beat it by memorising the seen words as well and then using context to tag some unseen words
better than "N". For each model this runs the protocol's ten (fold, seed) calculations of CT (the mini FEL
preset, honest selection), and scores the selected model on the test split word by word, split by whether the
word occurs in that calculation's budget. `random:<model id>` scores the same shape untrained (fresh
weights, seed 0): what the tokenizer and a random encoder give with no pretraining at all.

This is a diagnosis of the reported test figure, not a selection: nothing here chooses a setting.

    python benchmarks/probes/ct_words.py --storage alignlab-storage --models random:<all id>,<all id>,<-whp id>,<-pad id>

Results go to benchmarks/results/ct_words.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from alignlab.tasks.ct_data import TAGS, ct_lexicon
from alignlab.platform.encoder.model import AlignModel
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.fel.task_scoring import encode_examples, logits_and_labels
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData

RANDOM = "random:"


def load_model(storage: Path, name: str):
    """A pretrained model by id; `random:<id>` is its shape with fresh weights (seed 0)."""
    pre = load_pretrained(storage / "models" / name.removeprefix(RANDOM))
    if name.startswith(RANDOM):
        torch.manual_seed(0)
        pre.state = AlignModel(pre.model_cfg, pre.vocab_size).state_dict()
    return pre


CT = task_named("ct")


def score(storage: Path, data: TaskData, name: str) -> dict:
    pre = load_model(storage, name)
    n = Counter()
    for fold, seed in calculations():
        ft = dataclasses.replace(Preset.named("mini").finetune, task="ct", fold=fold, seed=seed, keep_head=False)
        train, val, test = fel_split(data, CT, ft)
        model = finetune_calculation(pre, ft, train, test, val=val).model.eval()
        with torch.no_grad():
            logits, labels = logits_and_labels(model, CT, encode_examples(CT, test, pre.tok, pre.model_cfg.max_len))
        words = [(w, t) for ex in test for w, t in zip(ex.tokens, ex.tags)]
        if len(words) != len(labels):
            raise RuntimeError(f"{name}: {len(labels)} scored units for {len(words)} test words (truncated texts?)")
        seen = ct_lexicon(train + val)  # the whole budget, as the study's lexicon baseline is fitted
        for (word, tag), p, y in zip(words, logits.argmax(-1).tolist(), labels.tolist()):
            assert TAGS[y] == tag
            k = "seen" if word in seen else "unseen"
            n[k] += 1
            n[k, "model"] += TAGS[p] == tag
            n[k, "lexicon"] += seen.get(word, "N") == tag
            n[k, "N"] += tag == "N"
    total = n["seen"] + n["unseen"]
    pct = lambda a, b: round(100 * a / b, 1)  # noqa: E731
    out = {"model": name, "words": total, "model_all": pct(n["seen", "model"] + n["unseen", "model"], total),
           "lexicon_all": pct(n["seen", "lexicon"] + n["unseen", "lexicon"], total)}
    for k in ("seen", "unseen"):
        out[k] = {"share": pct(n[k], total), "model": pct(n[k, "model"], n[k]), "lexicon": pct(n[k, "lexicon"], n[k]),
                  "tagged_N": pct(n[k, "N"], n[k])}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--storage", type=Path, default=Path("alignlab-storage"))
    p.add_argument("--models", required=True, help="comma-separated model ids under <storage>/models; "
                   f"'{RANDOM}<id>' for that model's shape untrained")
    p.add_argument("--tasks", type=Path, help="a task folder (default: the only one under --storage)")
    bench_args.add_flags(p, threads=2, out="ct_words.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    data = TaskData.load(a.tasks or only_folder(a.storage, "tasks"))
    command = bench_args.command("probes/ct_words.py", argv)
    print(f"# {command}\n# CT test split, 10 calculations per model (mini FEL preset, pred, heads discarded, honest)")
    print("| model | all words: model / lexicon | seen words (share): model / lexicon | "
          "unseen words (share): model / lexicon (= their share of N) |\n|---|---|---|---|", flush=True)
    rows = []
    for name in a.models.split(","):
        r = score(a.storage, data, name)
        rows.append(r)
        s, u = r["seen"], r["unseen"]
        print(f"| {name} | {r['model_all']} / {r['lexicon_all']} | ({s['share']}%) {s['model']} / {s['lexicon']} | "
              f"({u['share']}%) {u['model']} / {u['lexicon']} ({u['tagged_N']}) |", flush=True)
    print(f"# {command}")
    machine_info.record(a.out, {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "rows": rows})


if __name__ == "__main__":
    main()

"""How sensitive is an FEL calculation? An oracle feature of known Bayes accuracy, run through the real protocol.

One coordinate of the vector the AD head reads ([CLS], every layer side by side at mini) is replaced by a label
feature with flips: +1 where the noisy label is 1, -1 where it is 0, the label flipped in exactly `1 - level` of
every fold's examples, so that no rule reading that feature scores above `level` on any fold's test set. The other
coordinates are the model's own (nuisance, on an untrained model). Each (fold, seed) calculation then runs through
`finetune_calculation` with a preset's FEL settings (default: mini's honest selection and refit) on the protocol's
splits (`protocol.fel_split`), and the recovered test accuracy (at the best-perplexity epoch, the reported column)
is printed per level and per calculation. A protocol that is not deaf brings each level back close to itself.

The model is, by default, the mini preset's architecture at its initial weights, with a vocabulary trained on the
shipped npm texts: the question is the protocol's, not the model's. The data is the shipped out-of-domain AD set
(tasks/task_data/npm/ad_ood.jsonl, 332 snippets), so nothing needs building. `--model-dir` runs a finished
pretrained model instead; `--set field=value` changes the FEL settings (e.g. `--set lr=1e-4 --set patience=30`).

    python benchmarks/statistics/fel_sensitivity.py                         # the mini settings (the trained head)
    python benchmarks/statistics/fel_sensitivity.py --set head=logistic     # the logistic head
    python benchmarks/statistics/fel_sensitivity.py --nuisance standardised --points 4 --levels 0.61,0.75 --set head=logistic

Results go to benchmarks/results/fel_sensitivity.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.tasks.acronym_detection import snippet_folds
from alignlab.platform.fel.finetune import build_task_model, finetune_calculation, load_pretrained
from alignlab.platform.fel.finetune_config import FinetuneConfig, finetune_from_dict
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.fel.head_input import reads_of
from alignlab.platform.fel.task_scoring import encode_examples, unit_vectors
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA, TaskData

LEVELS = (0.55, 0.60, 0.65, 0.75)


def shipped_ad() -> TaskData:
    """The shipped out-of-domain AD pairs as a task folder's AD file (the protocol's folds are made from it)."""
    ad = task_named("ad")
    return TaskData(SHIPPED_TASK_DATA, {"ad": ad.load_examples(SHIPPED_TASK_DATA / "ad_ood.jsonl")})


def untrained_mini(root: Path, **model) -> Path:
    """A finished model folder of the mini preset's architecture at its initial weights (MLM head only), with a
    sentencepiece vocabulary trained on the shipped npm texts: seconds, no Ray, no corpus."""
    from alignlab.platform.config import config_hash, to_dict
    from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
    from alignlab.platform.pretrain.models import export_final
    from alignlab.platform.pretrain.pretrain import Pretrainer
    from alignlab.platform.storage.root import write_json

    texts = [ln.strip() for ln in (SHIPPED_TASK_DATA / "ct_texts.txt").read_text().splitlines() if ln.strip()]
    texts += [json.loads(ln)["snippet"] for ln in (SHIPPED_TASK_DATA / "ad_ood.jsonl").read_text().splitlines()]
    (root / "tok").mkdir(parents=True, exist_ok=True)
    train_tokenizer(texts, root / "tok" / "tokenizer.model", vocab_size=1000)
    tok = Tokenizer(root / "tok" / "tokenizer.model")
    mini = Preset.named("mini").pretrain
    cfg = dataclasses.replace(mini, model=dataclasses.replace(mini.model, **model), objectives="mlm", precision="fp32", num_workers=1,
                              corpus_embeddings=0.0)  # no corpus here: the embeddings start at random
    torch.manual_seed(cfg.seed)
    trainer = Pretrainer(cfg, tok)
    mid = f"128x2-untrained-sensitivity-{config_hash(cfg)}"
    mdir = root / "models" / mid
    mdir.mkdir(parents=True, exist_ok=True)
    write_json(mdir / "config.json", {"model_id": mid, "corpus_id": "npm-texts", "pretrain": to_dict(cfg)})
    export_final(trainer, tok, mdir, {})
    return mdir


def noisy_labels(data: TaskData, level: float) -> dict:
    """example -> the oracle's label: the true label, flipped in exactly round((1 - level) * n) of each fold's n
    examples (which ones: by a hash of the example, so that every level flips a nested set)."""
    out = {}
    for idx in snippet_folds(data.ad):
        exs = sorted((data.ad[i] for i in idx), key=lambda ex: hashlib.blake2b(
            f"{ex.acronym}|{ex.snippet}".encode(), digest_size=8).hexdigest())
        flips = round((1.0 - level) * len(exs))
        for k, ex in enumerate(exs):
            out[(ex.acronym, ex.snippet)] = ex.label ^ (k < flips)
    return out


class OracleTask:
    """A task that reads as `task` but whose units carry the oracle in their last coordinate (the encoder's last
    layer, the block a kept head reads): the real task in every other respect, so `finetune_calculation` runs as it
    does in a study. An example is known by its encoded input, which is all `Task.units` sees.

    `standardise`: every other coordinate is centred and scaled to unit spread over the task's examples. An
    untrained model's [CLS] hardly varies between inputs (it attends to itself), so as it is its 383 other
    coordinates are no nuisance at all; standardised, each is a random function of the input as large as the
    oracle, the harder case of a pretrained model's features that vary and say nothing about the label."""

    def __init__(self, task, pre, cfg: FinetuneConfig, data: TaskData, level: float, standardise: bool):
        self._task, self.level = task, level
        labels = noisy_labels(data, level)
        enc = encode_examples(task, data.ad, pre.tok, pre.model_cfg.max_len, cfg.task_options)
        self._value = {}
        for i, ex in enumerate(data.ad):
            self._value[self._key(enc.input_ids[i], enc.attention_mask[i])] = 2.0 * labels[(ex.acronym, ex.snippet)] - 1
        self._shift = self._scale = None
        if standardise:  # every coordinate centred and scaled to unit spread over the task's examples
            model = build_task_model(pre, task.name, keep_head=False, dropout=0.0, seed=0, reads=reads_of(cfg)).eval()
            with torch.no_grad():
                x, _ = unit_vectors(model, task, enc)
            self._shift, self._scale = x.mean(0), x.std(0).clamp(min=1e-6)

    @staticmethod
    def _key(ids: torch.Tensor, mask: torch.Tensor) -> bytes:
        return ids[mask.bool()].cpu().numpy().tobytes()

    def __getattr__(self, name):
        return getattr(self._task, name)

    def units(self, hidden, enc, pooling="first"):
        x, y = self._task.units(hidden, enc, pooling)
        if self._shift is not None:
            x = (x - self._shift.to(x.device)) / self._scale.to(x.device)
        x = x.clone()
        x[:, -1] = torch.tensor([self._value[self._key(enc.input_ids[i], enc.attention_mask[i])]
                                 for i in range(len(enc))], dtype=x.dtype, device=x.device)
        return x, y


def settings(preset: str, changes: list[str]) -> FinetuneConfig:
    """The preset's AD finetuning config (heads discarded: an untrained model has none), with `field=value` changes."""
    base = dataclasses.replace(Preset.named(preset).finetune, task="ad", keep_head=False)
    d = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    for c in changes:
        k, _, v = c.partition("=")
        d[k] = type(d[k])(v) if not isinstance(d[k], bool) else v.lower() in ("1", "true", "yes")
    return finetune_from_dict(d)


def run(pre, data: TaskData, cfg: FinetuneConfig, levels, points, standardise: bool = False) -> dict:
    """level -> the recovered test accuracies (best-perplexity epoch) and the best-accuracy column, per point."""
    ad, out = task_named("ad"), {}
    for level in levels:
        oracle = OracleTask(ad, pre, cfg, data, level, standardise)
        got = {"accuracy": [], "best_accuracy": [], "epochs": [], "seconds": []}
        for fold, seed in points:
            c = dataclasses.replace(cfg, fold=fold, seed=seed)
            train, val, test = fel_split(data, ad, c)
            row = finetune_calculation(pre, c, train, test, val=val, task=oracle).row
            for k in got:
                got[k].append(round(100 * row[k], 1) if "accuracy" in k else row[k])
        out[level] = got
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, help="a finished model folder (default: the mini architecture untrained)")
    p.add_argument("--preset", default="mini", help="whose FEL settings (default mini)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="change a FinetuneConfig field")
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), help="Bayes accuracies of the oracle feature")
    p.add_argument("--nuisance", choices=("model", "standardised"), default="model",
                   help="the other coordinates: the model's as they are (default), or each scaled to unit spread")
    p.add_argument("--points", type=int, default=10, help="the protocol's first N (fold, seed) calculations")
    bench_args.add_flags(p, threads=1, out="fel_sensitivity.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    command = bench_args.command("statistics/fel_sensitivity.py", argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cfg, levels, points = settings(a.preset, a.set), [float(x) for x in a.levels.split(",")], calculations()[:a.points]
    data = shipped_ad()
    with tempfile.TemporaryDirectory() as tmp:
        pre = load_pretrained(a.model_dir or untrained_mini(Path(tmp)))
        cpu = machine_info.cpu_model()
        print(f"# {command}\n# model {pre.mdir.name}; AD (shipped out-of-domain pairs), {len(points)} calculations per "
              f"level; nuisance {a.nuisance}; fp32, {cpu}, commit {commit}\n# FEL: {cfg}", flush=True)
        t0 = time.time()
        res = run(pre, data, cfg, levels, points, a.nuisance == "standardised")
    print("| Bayes accuracy % | recovered mean % | min | per calculation | best-accuracy column mean % | epochs | "
          "seconds per calculation |\n|---|---|---|---|---|---|---|")
    for level, got in res.items():
        print(f"| {100 * level:g} | {statistics.mean(got['accuracy']):.1f} | {min(got['accuracy']):.1f} | "
              f"{' '.join(f'{x:.1f}' for x in got['accuracy'])} | {statistics.mean(got['best_accuracy']):.1f} | "
              f"{' '.join(map(str, got['epochs']))} | {statistics.mean(got['seconds']):.2f} |")
    print(f"# {command}  ({time.time() - t0:.0f} s)")
    machine_info.record(a.out, {"command": command, "commit": commit, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch"), "precision": "fp32", "model": pre.mdir.name,
                                "nuisance": a.nuisance,
                                "finetune": dataclasses.asdict(cfg), "selection": f"{cfg.selection}, refit {cfg.refit}",
                                "levels": {str(k): v for k, v in res.items()}})


if __name__ == "__main__":
    main()

"""Laptop cramming: pretraining recipes compared at one fixed wall-clock budget, side by side in one run.

Each recipe is a `PretrainConfig` (the mini preset with some fields changed). All of them train in the same
process, with the same threads, interleaved in time slices (`--slice-s`), so a load spike on a shared machine
costs every recipe alike. A recipe's clock counts only its own training steps (collation included); the
held-out evaluations in between are not charged. Each recipe's schedule (warmup, decay to zero, short-then-long
sequences) runs on its clock and ends exactly at the budget (cramming's budget schedule; see `Run`); warmup is
the recipe's `warmup_steps / max_steps` share of the budget.

Reported per recipe, at a few points of its budget: held-out MLM, NSP, WHP and PAD accuracy on the corpus's
eval shards (fixed masks and pairs: the same examples for every recipe and point, made with the mini preset's
example mix and MLM masking whatever the recipe trains with: `eval_collator`); at the end, the `pred`
FEL accuracy of CT (the hand-labelled real-text test set) and AD, heads discarded (the study's `*` models),
honest selection, with the strongest context-free baseline on the same splits; and CT's FEL accuracy on the
calculations' validation splits, the one CT figure a choice between recipes may look at.

    alignlab data build-tasks --preset mini && alignlab corpus build --preset mini   # or a study built them
    python benchmarks/probes/laptop_budget.py --budget-s 300 --recipes current,candidate

Recipes are named in RECIPES below; `--recipes` picks and orders them. Results go to
benchmarks/results/laptop_budget.json (one entry per run, keyed by the command).

A recipe may bring its own objectives (`rtd_for_mlm`: ELECTRA's replaced-token detection in MLM's place;
`plus_rtd`: RTD on top of the four). An MLM-free model has no MLM accuracy to compare, and its RTD accuracy
alone says little: most tokens are original, so answering "original" everywhere already scores high. So RTD is
reported as accuracy beside that all-original rate and the recall of replaced tokens, the generator's own MLM
accuracy is kept apart (`rtd_generator_mlm`: a model a quarter of the encoder's width, not the encoder), and the
fair comparison across objective sets is the FEL accuracy at the end, which every recipe gets alike.

    python benchmarks/probes/laptop_budget.py --budget-s 300 --recipes candidate,rtd_for_mlm
"""
from __future__ import annotations

import os

# Several models train in this one process, each with its own shapes (widths, 64 and 128 tokens, evaluation
# batches). oneDNN keeps the kernels it built in a cache of 1,024 by default; these recipes need more, and past
# it every step rebuilds kernels: 15-22% fewer steps for a mini recipe when four recipes run side by side, and
# not the same share for each (docs/journal/round-06.md). It is read when oneDNN starts, so before torch.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

import argparse
import dataclasses
import json
import platform as _platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import load_corpus, only_folder
from alignlab.platform.config import to_dict
from alignlab.platform.encoder.model_config import ModelConfig
from alignlab.platform.corpus.corpus_embeddings import for_corpus
from alignlab.platform.encoder.batching import Collator
from alignlab.platform.encoder.registry import resolve_objectives
from alignlab.platform.fel.finetune import Pretrained, finetune_calculation
from alignlab.platform.fel.protocol import calculations, context_free_baselines, fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer, lr_lambda, with_resolved_precision, to_numpy_rows
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData

MINI = Preset.named("mini").pretrain
_OLD_MINI = dict(model=dataclasses.replace(MINI.model, norm="post", dropout=0.1, alibi=0.0), lr=1e-3, warmup_steps=100,
                 decay="linear", batch_size=32, seq_len=0, short_seq_len=0, short_seq_fraction=0.0,
                 weight_decay=0.0, adam_betas=(0.9, 0.999), corpus_embeddings=0.0)
"""The mini recipe before issue #15 (post-LN BERT, dropout 0.1, lr 1e-3 with 100 warmup steps, linear decay)."""


@dataclasses.dataclass(frozen=True)
class _LastHeadGlobal(ModelConfig):
    """Round 11: the preset's distance bias on every head but the last, which attends anywhere (slope 0). A
    benchmark-only variant (not a ModelConfig field): the bias stops PAD from leaving chance, and a head without
    it may let PAD match an acronym against far words while the biased head keeps MLM's local context."""

    def alibi_slopes(self) -> list[float]:
        return [*super().alibi_slopes()[:-1], 0.0]


def _recipe(base: dict, model: dict | None = None, **changes) -> dict:
    out = {**base, **changes}
    if model:
        out["model"] = dataclasses.replace(out["model"], **model)
    return out


RECIPES: dict[str, dict] = {
    "current": _OLD_MINI,
    # one choice at a time on top of the current recipe (the ablation table's lines)
    "pre_ln": _recipe(_OLD_MINI, model={"norm": "pre"}),
    "no_dropout": _recipe(_OLD_MINI, model={"dropout": 0.0}),
    "pre_ln_no_dropout": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}),
    # on top of pre-LN without dropout
    "pnd_lr2e-3": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, lr=2e-3),
    "pnd_cosine": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, decay="cosine"),
    "pnd_short64": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, short_seq_len=64,
                           short_seq_fraction=0.5),
    "pnd_batch64": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, batch_size=64),
    "pnd_wd": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, weight_decay=0.01, adam_betas=(0.9, 0.98)),
    "pnd_mask25": _recipe(_OLD_MINI, model={"norm": "pre", "dropout": 0.0}, mask_prob=0.25),
    # the mini preset as it is now in platform/presets.py
    "candidate": {},
    "mini_round13": {"corpus_embeddings": 0.0},  # the mini preset before Round 14: random word embeddings
    # one choice at a time on top of the candidate (issue #15, second round)
    "cand_acr25": {"layout_fraction": 0.25},
    "cand_b64_lr2e-3": {"batch_size": 64, "lr": 2e-3},
    "cand_lr2e-3": {"lr": 2e-3},
    "cand_w256": {"model": dataclasses.replace(MINI.model, hidden=256, ffn=1024)},
    "cand_mask30": {"mask_prob": 0.3},
    "cand_short90": {"short_seq_fraction": 0.9},
    "cand_b16": {"batch_size": 16},
    "cand_sin": {"model": dataclasses.replace(MINI.model, position="sinusoidal")},
    "cand_fanin": {"model": dataclasses.replace(MINI.model, init="fan_in")},
    "cand_sin_fanin": {"model": dataclasses.replace(MINI.model, position="sinusoidal", init="fan_in")},
    # issue #15, third round: a distance bias on attention (ModelConfig.alibi), on and off whatever the preset has
    "cand_alibi": {"model": dataclasses.replace(MINI.model, alibi=1.0)},
    "cand_no_alibi": {"model": dataclasses.replace(MINI.model, alibi=0.0)},
    "cand_alibi2": {"model": dataclasses.replace(MINI.model, alibi=2.0)},
    "cand_alibi4": {"model": dataclasses.replace(MINI.model, alibi=4.0)},
    "cand_alibi8": {"model": dataclasses.replace(MINI.model, alibi=8.0)},
    "cand_alibi_h4": {"model": dataclasses.replace(MINI.model, alibi=1.0, head_dim=32)},  # 4 heads, 4 ranges
    "cand_alibi_lr2e-3": {"model": dataclasses.replace(MINI.model, alibi=1.0), "lr": 2e-3},
    # Round 11: the bias on the first head only (slopes 4 and 0 for the mini model's 2 heads)
    "cand_alibi_last_global": {"model": _LastHeadGlobal(**dataclasses.asdict(MINI.model))},
    # Round 4: the masking curriculum (uniform masks first), uniform masks throughout, MLM's share of the loss
    "cand_uniform50": {"curriculum_fraction": 0.5},
    "cand_uniform_all": {"mlm_alpha": 0.0},
    "cand_mlm_w2": {"weights": {"mlm": 2.0}},
    # Round 6: wider encoders in the same seconds (a 64-token mini step is mostly per-operation overhead on CPU, so
    # width costs less than its FLOPs); with the preset's bias, 64-wide heads (3 and 4 heads: more slopes)
    "cand_w192": {"model": dataclasses.replace(MINI.model, hidden=192, ffn=768)},
    "cand_w384": {"model": dataclasses.replace(MINI.model, hidden=384, ffn=1536)},
    "cand_w512": {"model": dataclasses.replace(MINI.model, hidden=512, ffn=2048)},
    "cand_w256_short90": {"model": dataclasses.replace(MINI.model, hidden=256, ffn=1024), "short_seq_fraction": 0.9},
    # Round 7: the loss weight of WHP, the objective aligned with CT (with cand_mask30 above: more MLM labels a step)
    "cand_whp_w3": {"weights": {"whp": 3.0}},
    # Round 14: the word embeddings start from the corpus's co-occurrence statistics (PPMI + SVD, seconds)
    "cand_corpus_emb0.02": {"corpus_embeddings": 0.02},
    "cand_corpus_emb0.1": {"corpus_embeddings": 0.1},
    "cand_corpus_emb0.3": {"corpus_embeddings": 0.3},
    "cand_corpus_emb1": {"corpus_embeddings": 1.0},
    # the same recipe with other objectives (issue #19): RTD instead of MLM, and RTD added to the four
    "rtd_for_mlm": {"objectives": "rtd,nsp,whp,pad"},
    "plus_rtd": {"objectives": "mlm,nsp,whp,pad,rtd"},
}
METRICS = ("mlm", "nsp", "whp", "pad")
RTD_METRICS = ("rtd", "rtd_all_original", "rtd_replaced_recall", "rtd_generator_mlm")
"""RTD's held-out figures (%): accuracy over every labelled token, what answering "original" everywhere scores,
the recall of replaced tokens, and the generator's MLM accuracy."""


def build_config(name: str, objectives) -> "PretrainConfig":  # noqa: F821
    changes = dict(RECIPES[name])
    if "objectives" in changes:
        objectives = resolve_objectives(changes.pop("objectives"))
    # recipe keys that change the MLM objective's config, not the PretrainConfig
    mlm = {field: changes.pop(key) for key, field in (("mask_prob", "mask_prob"), ("mlm_alpha", "alpha")) if key in changes}
    weights = changes.pop("weights", {})  # objective name -> loss weight, any objective
    cfg = dataclasses.replace(MINI, **changes)
    objectives = tuple(dataclasses.replace(o, weight=weights[o.name]) if o.name in weights else o for o in objectives)
    if mlm:
        objectives = tuple(dataclasses.replace(o, **mlm) if o.name == "mlm" else o for o in objectives)
    return dataclasses.replace(cfg, objectives=objectives)


class Run:
    """One recipe's trainer, its data position and its own clock.

    The schedule runs on the clock, not on the step count (cramming's budget schedule): before each step, the
    fraction of the budget used so far places the step in the recipe's schedule (warmup, decay, short-then-long),
    as if its `max_steps` were exactly the number of steps that fit the budget. So no recipe needs its step time
    guessed in advance, and a load spike on a shared machine shortens every schedule instead of cutting one."""

    def __init__(self, name: str, cfg, tok, train, order: np.ndarray, budget_s: float, corpus: Path):
        self.name, self.cfg, self.train, self.order, self.budget_s = name, cfg, train, order, budget_s
        t0 = time.perf_counter()
        table = for_corpus(corpus, cfg, tok.vocab_size)  # made as the engine makes it, charged to the recipe's clock
        self.trainer = Pretrainer(cfg, tok, word_embeddings=table)
        self.eval_collate = eval_collator(cfg, tok)
        self.lr_at = lr_lambda(cfg)
        self.step, self.seconds, self.points, self.done = 0, 0.0, [], False
        if table is not None:
            self.seconds = time.perf_counter() - t0
            print(f"[{name}] word embeddings from the corpus in {self.seconds:.1f}s (charged)", flush=True)

    def one_step(self) -> float:
        bs, n, cfg = self.cfg.batch_size, len(self.order), self.cfg
        t0 = time.perf_counter()
        virtual = min(cfg.max_steps - 1, int(self.seconds / self.budget_s * cfg.max_steps))
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = cfg.lr * self.lr_at(virtual)  # the scheduler's own step after this one is overridden
        start = (self.step * bs) % (n - bs)
        rows = to_numpy_rows(self.train.take(self.order[start: start + bs]))
        collate = self.trainer.collator_at(virtual)  # the masking curriculum, on the clock like the rest
        self.trainer.train_step(collate(rows, step=self.step, max_len=cfg.seq_len_at(virtual)))
        self.step += 1
        dt = time.perf_counter() - t0
        self.seconds += dt
        return dt


def eval_collator(cfg, tok) -> Collator:
    """The held-out examples every recipe is scored on: the mini preset's example mix (`layout_fraction`) and MLM
    masking (`mask_prob`, `alpha`), whatever the recipe trains with, so that a recipe that masks more or gives
    PAD fewer rows is measured on the same examples and the same masks as the others."""
    ref = {o.name: o for o in MINI.objectives}
    objs = []
    for o in cfg.objectives:
        if o.name in ref and hasattr(o, "mask_prob"):
            o = dataclasses.replace(o, mask_prob=ref[o.name].mask_prob, alpha=ref[o.name].alpha)
        objs.append(o.build(tok))
    return Collator(objs, tok, max_len=cfg.model.max_len, layout_fraction=MINI.layout_fraction,
                    subword_alpha=cfg.subword_regularization_alpha, seed=cfg.seed)


def held_out(held, bs):
    for s in range(0, len(held["doc_id"]) - bs + 1, bs):
        yield {k: v[s: s + bs] for k, v in held.items()}


def evaluate(run: Run, held, eval_batches: int) -> dict:
    ev = run.trainer.evaluate(held_out(held, 32), max_batches=eval_batches, collate=run.eval_collate)
    point = {"seconds": round(run.seconds, 1), "step": run.step}
    for m in METRICS:
        if f"eval/{m}/accuracy" in ev:
            point[m] = round(100 * ev[f"eval/{m}/accuracy"], 2)
    if "eval/mlm/masked_accuracy" in ev:  # MLM at the [MASK] positions alone: what the model gets from context
        point["mlm_masked"] = round(100 * ev["eval/mlm/masked_accuracy"], 2)
    if "eval/rtd/accuracy" in ev:
        point.update(rtd_figures(ev))
    run.points.append(point)
    print(f"[{run.name}] {json.dumps(point)}", flush=True)
    return point


def rtd_figures(ev: dict) -> dict:
    """RTD's held-out figures, each beside what makes it fair (see RTD_METRICS)."""
    pct = lambda v: round(100 * float(v), 2)  # noqa: E731
    return {"rtd": pct(ev["eval/rtd/accuracy"]), "rtd_all_original": pct(1 - ev["eval/rtd/replaced_fraction"]),
            "rtd_replaced_recall": pct(ev["eval/rtd/replaced_recall"]),
            "rtd_generator_mlm": pct(ev["eval/rtd/generator_accuracy"])}


def table(results: list[dict]) -> list[str]:
    """The side-by-side table; MLM as a ratio to the first recipe's, RTD columns when some recipe has RTD."""
    base = results[0]["final"]
    rtd = any("rtd" in r["final"] for r in results)
    head = [f"{m} %" for m in METRICS[:1]] + ["MLM at [MASK] %"] + [f"{m} %" for m in METRICS[1:]] \
        + (["RTD % (all-original %)", "replaced recall %", "generator MLM %"] if rtd else [])
    lines = ["| recipe | objectives | steps | s | " + " | ".join(head) + " | CT pred val | CT pred | AD pred |",
             "|---|---|---|---|" + "---|" * (len(head) + 3)]
    for res in results:
        f = res["final"]
        cells = []
        for m in (METRICS[0], "mlm_masked", *METRICS[1:]):
            if m not in f:
                cells.append("-")
            else:
                ratio = f" ({f[m] / base[m]:.2f}x)" if m in ("mlm", "mlm_masked") and base.get(m) else ""
                cells.append(f"{f[m]:.1f}{ratio}")
        if rtd:
            cells += ([f"{f['rtd']:.1f} ({f['rtd_all_original']:.1f})", f"{f['rtd_replaced_recall']:.1f}",
                       f"{f['rtd_generator_mlm']:.1f}"] if "rtd" in f else ["-", "-", "-"])
        objs = "+".join(o["name"] for o in res["config"]["objectives"])
        lines.append(f"| {res['recipe']} | {objs} | {res['steps']} | {res['train_seconds']:.0f} | " + " | ".join(cells)
                     + f" | {res['fel']['ct']['val_accuracy']:.1f} | {res['fel']['ct']['accuracy']:.1f} "
                     f"| {res['fel']['ad']['accuracy']:.1f} |")
    return lines


def fel(run: Run, tok, data: TaskData, n_calcs: int) -> dict:
    pre = Pretrained(Path("."), run.cfg.model, tok.vocab_size, run.trainer.model.state_dict(),
                     list(run.trainer.model.heads), tok)
    out = {}
    for task in ("ct", "ad"):
        accs, val_accs, base, val_base, base_name = [], [], [], [], None
        for fold, seed in calculations()[:n_calcs]:
            ft = dataclasses.replace(Preset.named("mini").finetune, task=task, fold=fold, seed=seed, keep_head=False)
            tr, va, te = fel_split(data, task_named(task), ft)
            on_val: dict[int, dict] = {}  # epoch -> the validation figures the selection saw
            row = finetune_calculation(pre, ft, tr, te, val=va, on_epoch=lambda e, m: on_val.__setitem__(e, m)).row
            accs.append(row["accuracy"])
            # the validation accuracy at the selected epoch: the figure a choice between recipes may use (the test
            # figure beside it is shown, never selected on)
            val_accs.append(on_val[row["epochs"]]["accuracy"])
            b = context_free_baselines(task_named(task), tr, te, data=data)
            base.append(b["baseline_best"])
            base_name = b["baseline_best_name"]
            val_base.append(context_free_baselines(task_named(task), tr, va, data=data)["baseline_best"])
        pct = lambda v: round(100 * float(np.mean(v)), 2)  # noqa: E731
        out[task] = {"accuracy": pct(accs), "val_accuracy": pct(val_accs), "calculations": len(accs),
                     "strongest_baseline": pct(base), "strongest_baseline_val": pct(val_base), "baseline_name": base_name,
                     "selection": "honest", "scheme": "pred", "heads": "discarded"}
        print(f"[{run.name}] FEL {task}: {json.dumps(out[task])}", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_args.add_storage_flags(p, corpus=True)
    p.add_argument("--recipes", default="current,candidate", help=f"comma list of: {', '.join(RECIPES)}")
    p.add_argument("--budget-s", type=float, default=300.0, help="training seconds per recipe")
    p.add_argument("--slice-s", type=float, default=10.0, help="interleaving slice")
    p.add_argument("--points", type=int, default=4, help="held-out evaluations per recipe, evenly over the budget")
    p.add_argument("--eval-batches", type=int, default=30)
    p.add_argument("--fel-calculations", type=int, default=2, help="FEL calculations per task at the end (<= 10)")
    p.add_argument("--objectives", default="mlm,nsp,whp,pad", help="the mini study's all* model by default")
    bench_args.add_flags(p, threads=2, out="laptop_budget.json")
    a = p.parse_args(argv)
    names = [n for n in a.recipes.split(",") if n]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        sys.exit(f"laptop_budget: unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    torch.set_num_threads(a.threads)
    corpus, tok, train, held = load_corpus(a.storage, a.corpus)
    tasks = a.tasks or only_folder(a.storage, "tasks")
    held = to_numpy_rows(held)
    order = np.random.default_rng(0).permutation(train.num_rows)
    objectives = resolve_objectives(tuple(a.objectives.split(",")))
    command = bench_args.command("probes/laptop_budget.py", argv)
    print(f"# {command}\n# corpus {corpus.name}, tasks {tasks.name}, torch {torch.__version__}, "
          f"{a.threads} threads, budget {a.budget_s:.0f}s per recipe", flush=True)

    runs = []
    for name in names:
        cfg = with_resolved_precision(build_config(name, objectives))
        print(f"[{name}] precision {cfg.precision}, warmup {cfg.warmup_steps / cfg.max_steps:.1%} of the budget, "
              f"decay {cfg.decay}, seq {cfg.seq_len_at(cfg.max_steps)}"
              + (f" ({cfg.short_seq_len} for the first {cfg.short_seq_fraction:.0%})" if cfg.short_seq_len else ""),
              flush=True)
        runs.append(Run(name, cfg, tok, train, order, a.budget_s, corpus))

    marks = [a.budget_s * (i + 1) / a.points for i in range(a.points)]
    t_all = time.time()
    while not all(r.done for r in runs):
        for r in runs:
            if r.done:
                continue
            end = time.perf_counter() + a.slice_s
            while time.perf_counter() < end and not r.done:
                r.one_step()
                due = len(r.points) < len(marks) and r.seconds >= marks[len(r.points)]
                r.done = r.seconds >= a.budget_s
                if due or r.done:
                    evaluate(r, held, a.eval_batches)
    data = TaskData.load(tasks)
    results = []
    for r in runs:
        results.append({"recipe": r.name, "config": to_dict(r.cfg), "steps": r.step, "train_seconds": round(r.seconds, 1),
                        "points": r.points, "final": r.points[-1], "fel": fel(r, tok, data, a.fel_calculations)})
    print("\n" + "\n".join(table(results)))
    ct = results[0]["fel"]["ct"]
    print(f"(CT strongest context-free baseline on the same splits: {ct['strongest_baseline']:.1f} "
          f"({ct['baseline_name']}), {ct['strongest_baseline_val']:.1f} on the validation splits; AD: {results[0]['fel']['ad']['strongest_baseline']:.1f} "
          f"({results[0]['fel']['ad']['baseline_name']}); FEL selection honest, {a.fel_calculations} calculations)")
    print(f"# total {time.time() - t_all:.0f}s\n# {command}")
    entry = {"command": command, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": _platform.processor() or _platform.machine(), "torch": torch.__version__,
             "threads": a.threads, "budget_s": a.budget_s, "results": results}
    machine_info.record(a.out, entry)


if __name__ == "__main__":
    main()

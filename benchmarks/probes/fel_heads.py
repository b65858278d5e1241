"""Which FEL head at mini: the trained head (the paper's) or the logistic head? Scored on the pool, never the test set.

Each (fold, seed) calculation runs as the mini objective ablation runs it (`finetune_calculation`, the mini preset's
FinetuneConfig, heads discarded: the study's `*` columns), once per head: `trained` (Adam, epochs selected on the
budget's validation split, then refit on the whole budget: the mini preset's) and `logistic` (the same with
`head="logistic"`: L2 logistic regression on the frozen features, its penalty cross-validated inside the budget).
Both learn from the same 200 examples. Neither is scored on the task's test set (CT's 260 test texts, AD's test
fold, AD's out-of-domain pairs): each is scored on the calculation's own pool remainder, every example of the task's
pool (`Task.pool_and_test`) whose test unit (a CT text, an AD snippet) has no example in the budget. CT: the ~100
pool texts the budget of 200 leaves; AD: the snippets of the four training folds that the budget touches nowhere.

The logistic head is deterministic (the seed only draws a fresh head that the fit overwrites), so it runs once per
fold and its figure stands for both seeds. Printed: every calculation's accuracy and seconds, each model's means,
the paired difference logistic − trained (per model: its folds' differences, each against the fold's two trained
seeds averaged; a t interval over the pretrained models, which are the independent replicates), and, where the
models include several recipes of the objective ablation, each head's `all − <recipe>` difference paired by
pretraining seed (CT's claim is all* − −WHP*).

    python benchmarks/probes/fel_heads.py --storage /work/s3/alignlab-storage --task ct --models <id>,<id>,...

Results go to benchmarks/results/fel_heads.json (one entry per command).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import time
import warnings
from pathlib import Path

import torch

from alignlab.platform.bench import bench_args, machine_info
from alignlab.platform.bench.bench_corpus import only_folder
from alignlab.platform.fel.finetune import finetune_calculation, load_pretrained
from alignlab.platform.fel.protocol import calculations, fel_split
from alignlab.platform.presets import Preset
from alignlab.platform.tasks.task import task as task_named
from alignlab.platform.tasks.task_data import TaskData

HEADS = ("trained", "logistic")
ALL = "mlm+nsp+whp+pad"


def pool_remainder(data: TaskData, task, train: list, val: list, fold: int) -> list:
    """The pool's examples whose test unit has no example in the budget (`train` + `val`): held out from the
    calculation, and not the task's test set."""
    pool, _ = task.pool_and_test(data, fold)
    used = {task.test_unit(ex) for ex in [*train, *val]}
    return [ex for ex in pool if task.test_unit(ex) not in used]


def strongest_baseline(task, data: TaskData, train: list, test: list) -> float:
    """The best context-free baseline fitted on `train` (the whole budget, as a study fits it), scored on `test`."""
    scores = task.baseline_scores(train, test, **task.baseline_context(data))
    return max(v for v in scores.values() if isinstance(v, float))


def recipe(mdir: Path) -> tuple[str, int]:
    """(objectives joined by +, or "untrained"; pretraining seed) of a model folder."""
    d = json.loads((mdir / "config.json").read_text())
    p = d["pretrain"]
    what = "untrained" if p["max_steps"] == 0 else "+".join(o["name"] for o in p["objectives"])
    return what, int(p["seed"])


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, 95% t interval low, high) of `xs` (scipy); the interval is nan for fewer than two values."""
    from scipy import stats

    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    lo, hi = stats.ttest_1samp(xs, 0.0).confidence_interval(0.95)
    return m, float(lo), float(hi)


def run_model(pre, data: TaskData, task, points, heads) -> list[dict]:
    """One row per (fold, seed, head): held-out accuracy %, seconds, the baseline, the held-out size."""
    base = dataclasses.replace(Preset.named("mini").finetune, task=task.name, keep_head=False)
    rows, logistic_of_fold = [], {}
    for fold, seed in points:
        cfg = dataclasses.replace(base, fold=fold, seed=seed)
        train, val, _ = fel_split(data, task, cfg)
        held = pool_remainder(data, task, train, val, fold)
        common = {"fold": fold, "seed": seed, "held_out_examples": len(held),
                  "held_out_units": len({task.test_unit(ex) for ex in held}),
                  "baseline": round(100 * strongest_baseline(task, data, [*train, *val], held), 2)}
        for head in heads:
            if head == "logistic" and fold in logistic_of_fold:  # deterministic: the seed does not change it
                rows.append({**logistic_of_fold[fold], "seed": seed, "reused": True})
                continue
            c = dataclasses.replace(cfg, head=head)
            r = finetune_calculation(pre, c, train, held, val=val).row
            row = {**common, "head": head, "accuracy": round(100 * r["accuracy"], 3), "seconds": r["seconds"],
                   "epochs": r["epochs"], "logistic_c": r.get("logistic_c"), "scored_units": sum(r["unit_count"])}
            rows.append(row)
            if head == "logistic":
                logistic_of_fold[fold] = row
            print(f"{pre.mdir.name} fold {fold} seed {seed} {head:8s} held-out {row['accuracy']:6.2f}% "
                  f"({row['scored_units']} {task.unit} of {len(held)} examples)  baseline {common['baseline']:.2f}%  "
                  f"{row['seconds']:.2f} s" + (f"  C {row['logistic_c']:g}" if head == "logistic" else
                                               f"  epochs {row['epochs']}"), flush=True)
    return rows


def paired_by_fold(rows: list[dict]) -> list[float]:
    """logistic − trained per fold, the trained head's seeds averaged first."""
    out = []
    for fold in sorted({r["fold"] for r in rows}):
        acc = {h: [r["accuracy"] for r in rows if r["fold"] == fold and r["head"] == h] for h in HEADS}
        if all(acc.values()):
            out.append(statistics.mean(acc["logistic"]) - statistics.mean(acc["trained"]))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_args.add_storage_flags(p, models=True, task="ct")
    p.add_argument("--points", type=int, default=10, help="the protocol's first N (fold, seed) calculations")
    p.add_argument("--heads", default=",".join(HEADS))
    bench_args.add_flags(p, threads=1, out="fel_heads.json")
    a = p.parse_args(argv)
    from threadpoolctl import threadpool_limits  # scikit-learn's BLAS threads, as torch's

    torch.set_num_threads(a.threads)
    threadpool_limits(a.threads)
    # scikit-learn 1.9 announces a change of LogisticRegressionCV's attributes on every fit; the head reads C_, coef_
    # and intercept_ only, which keep their meaning.
    warnings.filterwarnings("ignore", category=FutureWarning, message="The fitted attributes of LogisticRegressionCV")
    warnings.filterwarnings("ignore", category=FutureWarning, message="The default value for l1_ratios")
    task, data = task_named(a.task), TaskData.load(a.tasks or only_folder(a.storage, "tasks"))
    heads, points = a.heads.split(","), calculations()[:a.points]
    command = bench_args.command("probes/fel_heads.py", argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cpu, t0 = machine_info.cpu_model(), time.time()
    print(f"# {command}\n# task {a.task}, the mini FEL preset with heads discarded (the study's * columns), "
          f"{len(points)} (fold, seed) calculations per model and head; scored on the pool remainder (never the test "
          f"set); fp32, {a.threads} thread(s), {cpu}, commit {commit}\n"
          f"# FEL: {dataclasses.replace(Preset.named('mini').finetune, task=a.task, keep_head=False)}", flush=True)
    models = []
    for mid in a.models.split(","):
        pre = load_pretrained(a.storage / "models" / mid)
        what, seed = recipe(pre.mdir)
        rows = run_model(pre, data, task, points, heads)
        mean = {h: round(statistics.mean(r["accuracy"] for r in rows if r["head"] == h), 3) for h in heads}
        secs = {h: round(statistics.mean(r["seconds"] for r in rows if r["head"] == h and not r.get("reused")), 3)
                for h in heads}
        models.append({"model": mid, "recipe": what, "pretrain_seed": seed, "mean": mean, "seconds": secs,
                       "baseline": round(statistics.mean(r["baseline"] for r in rows), 3),
                       "diff_by_fold": [round(d, 3) for d in paired_by_fold(rows)], "rows": rows})

    print(f"\n| model | recipe | seed | {' | '.join(f'{h} %' for h in heads)} | logistic − trained | "
          f"better / equal / worse folds | best baseline % | s / calc ({', '.join(heads)}) |\n"
          f"|---|---|---|{'---|' * len(heads)}---|---|---|---|")
    for m in models:
        d = m["diff_by_fold"]
        bew = f"{sum(x > 1e-9 for x in d)}/{sum(abs(x) <= 1e-9 for x in d)}/{sum(x < -1e-9 for x in d)}" if d else "–"
        accs = " | ".join(f"{m['mean'][h]:.2f}" for h in heads)
        secs = " / ".join(f"{m['seconds'][h]:.2f}" for h in heads)
        print(f"| {m['model']} | {m['recipe']} | {m['pretrain_seed']} | {accs} | "
              f"{statistics.mean(d) if d else float('nan'):+.2f} | {bew} | {m['baseline']:.2f} | {secs} |")
    summary: dict = {}
    pretrained = [m for m in models if m["recipe"] != "untrained"]
    if pretrained and len(heads) == 2:
        per_model = [statistics.mean(m["diff_by_fold"]) for m in pretrained]
        mean, lo, hi = t_interval(per_model)
        all_folds = [x for m in pretrained for x in m["diff_by_fold"]]
        summary["pretrained"] = {h: round(statistics.mean(m["mean"][h] for m in pretrained), 3) for h in heads}
        summary["logistic_minus_trained"] = {"mean": round(mean, 3), "ci95": [round(lo, 3), round(hi, 3)],
                                             "df": len(per_model) - 1, "over": "pretrained models",
                                             "folds_better_equal_worse": [sum(x > 1e-9 for x in all_folds),
                                                                          sum(abs(x) <= 1e-9 for x in all_folds),
                                                                          sum(x < -1e-9 for x in all_folds)]}
        print(f"\nmean of {len(pretrained)} pretrained models: "
              + ", ".join(f"{h} {summary['pretrained'][h]:.2f}%" for h in heads)
              + f"; logistic − trained {mean:+.2f} points, 95% t interval over the models [{lo:+.2f}, {hi:+.2f}] "
                f"(df {len(per_model) - 1}); folds better/equal/worse "
                f"{'/'.join(map(str, summary['logistic_minus_trained']['folds_better_equal_worse']))}")
    # The objective ablation's differences, per head, paired by pretraining seed: all − each other recipe.
    by = {(m["recipe"], m["pretrain_seed"]): m for m in pretrained}
    effects = {}
    for other in sorted({r for r, _ in by} - {ALL}):
        seeds = sorted(s for r, s in by if r == other and (ALL, s) in by)
        if not seeds:
            continue
        eff = {h: [by[ALL, s]["mean"][h] - by[other, s]["mean"][h] for s in seeds] for h in heads}
        name = "all − " + "−" + "".join(x for x in ALL.split("+") if x not in other.split("+")).upper()
        effects[name] = {"seeds": seeds, **{h: {"per_seed": [round(x, 3) for x in eff[h]],
                                                "ci95": [round(v, 3) for v in t_interval(eff[h])]} for h in heads}}
        line = "; ".join(f"{h} {t_interval(eff[h])[0]:+.2f} [{t_interval(eff[h])[1]:+.2f}, {t_interval(eff[h])[2]:+.2f}]"
                         f" (per seed {', '.join(f'{x:+.2f}' for x in eff[h])})" for h in heads)
        if len(heads) == 2:
            dd = [x - y for x, y in zip(eff["logistic"], eff["trained"])]
            effects[name]["logistic_minus_trained"] = [round(v, 3) for v in t_interval(dd)]
            line += f"; logistic − trained {t_interval(dd)[0]:+.2f} [{t_interval(dd)[1]:+.2f}, {t_interval(dd)[2]:+.2f}]"
        print(f"{name} ({a.task}, paired by pretraining seed {seeds}, 95% t interval df {len(seeds) - 1}): {line}")
    print(f"# {command}  ({time.time() - t0:.0f} s)")
    machine_info.record(a.out, {"command": command, "commit": commit,
                                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine_info.machine("torch", "sklearn"), "precision": "fp32",
                                "threads": a.threads, "task": a.task,
                                "held_out": "the pool remainder: pool examples whose test unit has no example in "
                                            "the calculation's budget (never the test set)",
                                "finetune": "mini preset, keep_head False; logistic: head='logistic'",
                                "summary": summary, "effects": effects, "models": models,
                                "seconds": round(time.time() - t0, 1)})


if __name__ == "__main__":
    main()

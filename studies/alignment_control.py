"""The alignment positive control (issue #65): a synthetic corpus and a synthetic PAD-shaped task, where the aligned
objective must help, through the real path (corpus build -> Ray Train pretraining -> FEL -> report).

The corpus is the synthetic source (platform/sources/synthetic.py: documents over a 66-word lexicon, each word one
sentencepiece piece). The task, SYNAD, is PAD's question asked of unseen documents: `text_a` is an acronym spelled
"a b c" (which the corpus's tokenizer encodes exactly as PAD's acronyms, one word-initial letter piece each),
`text_b` a document of another namespace than the corpus's; label 1 iff the letters are the initials of 2-4
contiguous words. Each snippet has one positive and one negative, the negative a "mutate" (the positive with letters
replaced) or an "other" (another snippet's positive), never an accidental match; the test set is also scored by
kind (extra tests `mutate` and `other`: its positives with one kind of negative).

Two reports:
- `alignment_control-<preset>` (the control): a model pretrained with MLM and PAD (`aligned*`) against the same
  model without PAD (`-pad*`, the baseline), heads discarded, ten calculations a cell. `aligned*` must be bold.
- `alignment_control_aa-<preset>` (the A/A): the aligned model finetuned with seeds 0, 1 (`A`) and 2, 3 (`A'`). It
  must stay quiet.

    python studies/alignment_control.py --storage DIR [--steps N] [--budget N]

The task files are written under DIR/alignment_control/ (made again, identically, on every run).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from pathlib import Path

from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.sources.synthetic import synthetic_documents

TASK = "synad"
SPANS = (2, 4)
"""Acronym lengths (words of the matched span), inclusive."""
POOL_SNIPPETS, TEST_SNIPPETS = 400, 300
CORPUS = CorpusConfig(sources=(SourceSpec(name="synthetic"),), langs=("en",), vocab_size=128,
                      allow_smaller_vocab=True, tokenizer_sample_docs=6000, max_len=64, docs_per_shard=2000,
                      eval_fraction=0.1)
"""Every word of the lexicon is one piece; the text fills only ~95 pieces (words, letters, specials), accepted. A tenth
of the documents is held out, so that held-out PAD is scored on ~300 pairs rather than ~50."""
OBJECTIVES = {"aligned": "mlm,pad", "-pad": "mlm"}


def _has_span(initials: str, acronym: str) -> bool:
    return any(initials[s:s + len(acronym)] == acronym for s in range(len(initials) - len(acronym) + 1))


def synthetic_pairs(snippets: int, namespace: str, seed: int = 0) -> list[dict]:
    """One positive and one negative pair per document of `namespace` ("pool" or "test"), kinds labelled."""
    rng = random.Random(f"synad:{namespace}:{seed}")
    # Four-letter words only: a one-letter word equal to an acronym letter would hand a context-free word-overlap
    # classifier the answer (it scored 63.9% with them).
    docs = [d.text for d in synthetic_documents(snippets, namespace=f"synad-{namespace}", letters=False)]
    initials = ["".join(w[0] for w in text.split()) for text in docs]
    positives = []
    for ini in initials:
        k = rng.randint(SPANS[0], min(SPANS[1], len(ini)))
        s = rng.randrange(len(ini) - k + 1)
        positives.append(ini[s:s + k])
    letters = "".join(initials)  # negatives' letters follow the initials' distribution, as PAD's do
    out = []
    for i, (text, ini, pos) in enumerate(zip(docs, initials, positives)):
        out.append({"text_a": " ".join(pos), "text_b": text, "label": 1, "kind": "pos"})
        kind = "mutate" if i % 2 == 0 else "other"
        for _ in range(1000):
            if kind == "mutate":
                neg = list(pos)
                for j in rng.sample(range(len(pos)), rng.randint(1, len(pos))):
                    while neg[j] == pos[j]:
                        neg[j] = rng.choice(letters)
                neg = "".join(neg)
            else:
                neg = positives[rng.randrange(len(positives))]
            if not _has_span(ini, neg):
                break
        out.append({"text_a": " ".join(neg), "text_b": text, "label": 0, "kind": kind})
    return out


def write_task_files(folder: Path) -> dict[str, Path]:
    """pool.jsonl, test.jsonl and the test set by negative kind; the paths by name."""
    folder.mkdir(parents=True, exist_ok=True)
    pool, test = synthetic_pairs(POOL_SNIPPETS, "pool"), synthetic_pairs(TEST_SNIPPETS, "test")
    files = {"pool": pool, "test": test, **{k: [r for r in test if r["kind"] in ("pos", k)] for k in ("mutate", "other")}}
    paths = {}
    for name, rows in files.items():
        paths[name] = folder / f"{name}.jsonl"
        tmp = paths[name].with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(paths[name])
    return paths


def task_spec(paths: dict[str, Path]) -> str:
    return (f"name={TASK},kind=pair,pool={paths['pool']},test={paths['test']},aligned=pad,"
            f"extra.mutate={paths['mutate']},extra.other={paths['other']}")


def pretrain(objectives: str, steps: int):
    """The control's pretraining: a 64x2 pre-LN encoder on 64-token chunks, the mini recipe otherwise. Three in four
    documents are PAD examples (mini: half): PAD alone reached 86% held out after 64k pairs in
    benchmarks/probes/synthetic_world_pad_probe.py, and MLM learns what little this text holds from the rest."""
    from alignlab.platform.encoder.model_config import ModelConfig
    from alignlab.platform.encoder.registry import objectives_like
    from alignlab.platform.presets import Preset

    base = Preset.named("mini").pretrain
    # fan-in init: with BERT's std 0.02 at width 64 the attention logits start near 0 and PAD's matching never
    # leaves chance at this budget (benchmarks/probes/synthetic_world_pad_probe.py; benchmarks/probes/match_probe.py).
    model = ModelConfig(hidden=64, num_layers=2, head_dim=32, ffn=256, max_len=CORPUS.max_len, norm="pre", dropout=0.0,
                        init="fan_in")
    return dataclasses.replace(base, model=model, objectives=objectives_like(objectives, base.objectives),
                               max_steps=steps, short_seq_len=0, short_seq_fraction=0.0, checkpoint_every=steps,
                               corpus_embeddings=0.0, layout_fraction=0.75)


def build(preset: str, steps: int = 4000):
    """Aligned (MLM + PAD) against ablated (MLM) on the synthetic task (via AD's cells, renamed to it)."""
    from alignlab.platform.presets import Preset
    from alignlab.platform.study.presets import protocol_points
    from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study

    models = tuple(ModelSpec(key=k, pretrain=pretrain(o, steps)) for k, o in OBJECTIVES.items())
    calcs = tuple(CalcSpec(model=k, row="AD", col=f"{k}*", finetune=dataclasses.replace(
        Preset.named(preset).finetune, task="ad", fold=fold, seed=seed, keep_head=False))
        for k in OBJECTIVES for fold, seed in protocol_points(preset))
    return Study(name=f"alignment_control-{preset}-{steps}", title=f"Alignment control ({preset} finetuning, "
                 f"{steps} pretraining steps)", corpus=CORPUS, models=models, calcs=calcs, baseline_col="-pad*",
                 task_langs=("en",), task_max_docs_per_lang=3000, plots=("bars",),
                 notes="A positive control: the synthetic task is PAD's question on unseen documents, so the model "
                       "pretrained with PAD must beat the one without it (studies/alignment_control.py).")


def build_aa(preset: str, steps: int = 4000):
    """The A/A: the aligned model, finetuning seeds 0-1 against 2-3."""
    from alignlab.platform.presets import Preset
    from alignlab.platform.study.spec import CalcSpec, ModelSpec, Study
    from alignlab.platform.tasks.task_data import NUM_FOLDS

    columns = {"A": (0, 1), "A'": (2, 3)}
    calcs = tuple(CalcSpec(model="aligned", row="AD", col=col, finetune=dataclasses.replace(
        Preset.named(preset).finetune, task="ad", fold=fold, seed=seed, keep_head=False))
        for col, seeds in columns.items() for fold in range(NUM_FOLDS) for seed in seeds)
    return Study(name=f"alignment_control_aa-{preset}-{steps}", title=f"Alignment control, A/A ({preset} finetuning)",
                 corpus=CORPUS, models=(ModelSpec(key="aligned", pretrain=pretrain(OBJECTIVES["aligned"], steps)),),
                 calcs=calcs, baseline_col="A", task_langs=("en",), task_max_docs_per_lang=3000, plots=("bars",),
                 notes="A/A: one model, other finetuning seeds; any significant difference is a false positive.")


def main(argv=None, prog=None):
    """Write the task files, then run the control and its A/A through the study command line."""
    from alignlab.platform.study.run import study_main

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--storage", default="alignlab-storage")
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--skip-aa", action="store_true")
    known, rest = ap.parse_known_args(argv)
    paths = write_task_files(Path(known.storage) / "alignment_control")
    extra = ["--storage", known.storage, "--task", task_spec(paths), "--only-tasks", TASK]
    if "--preset" not in rest:
        extra += ["--preset", "mini"]
    out = [study_main(lambda preset: build(preset, known.steps), rest + extra, prog=prog)]
    if not known.skip_aa:
        out.append(study_main(lambda preset: build_aa(preset, known.steps), rest + extra, prog=prog))
    return out


if __name__ == "__main__":
    main()

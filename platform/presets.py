"""The named presets: `smoke` (seconds, for tests), `mini` (the README demo: minutes on a 2-core laptop CPU) and
`paper` (the paper's settings). One `Preset` per name holds every stage's settings, from the corpus to the size of a
study's grid; `Preset.named(name)` is the one way to read them."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from alignlab.platform.config import MODEL_SIZES, PretrainConfig, check_preset
from alignlab.platform.corpus.corpus_config import CorpusConfig, SourceSpec
from alignlab.platform.fel.finetune_config import FinetuneConfig

_CORPUS: dict[str, CorpusConfig] = {
    "smoke": CorpusConfig(langs=("en",), max_docs_per_lang=300, vocab_size=1000, tokenizer_sample_docs=300,
                          max_len=64, docs_per_shard=100, task_max_docs_per_lang=3000),
    # The bundled Wikipedia summaries plus 40k PyPI package summaries (platform/sources/corpus_data/): the mini study's CT
    # test set is npm package summaries, and software-domain text lowered CT's perplexity on the FEL validation
    # splits over three pretraining seeds, at the same accuracy (docs/journal/round-08.md). WHP and PAD
    # still learn from the Wikipedia part.
    "mini": CorpusConfig(sources=(SourceSpec(name="bundled"), SourceSpec(name="software")), vocab_size=8000,
                         tokenizer_sample_docs=12000, max_len=128, docs_per_shard=2000),
    "paper": CorpusConfig(vocab_size=111000, tokenizer_sample_docs=2_000_000, max_len=128, docs_per_shard=20000),
}

def _pretrain_presets() -> dict[str, PretrainConfig]:
    return {
        "smoke": PretrainConfig(model=MODEL_SIZES["tiny"], batch_size=16, lr=1e-3, max_steps=12, checkpoint_every=5,
                                eval_batches=2, num_workers=1, cpus_per_worker=0.5, threads_per_worker=1),
        # The laptop-cramming recipe (issue #15, benchmarks/probes/laptop_budget.py; docs/journal/mini-study.md):
        # pre-LN blocks, no dropout, the first half of the steps on 64-token examples, linear decay to zero at the
        # last step, and a distance bias on attention (ALiBi slopes 4 and 1/4): without it the 128x2 encoder never
        # starts to predict a masked token from its context within this budget (docs/journal/round-03.md); it
        # exports as transformers custom code. 3,000 steps, not 2,000: held-out MLM and CT on validation were higher
        # in each of 3 pretraining seeds, NSP, WHP and PAD level (docs/journal/round-12.md); the study
        # still fits the README's laptop budget from a fresh install. PAD gets half of the linked rows because
        # it is the slowest objective to leave chance; at this budget it does in some runs only (docs/results.md).
        # The word embeddings start from the corpus's co-occurrence statistics (std 0.1): MLM at [MASK] and CT on
        # validation higher in each of 3 pretraining seeds, for seconds a model (docs/journal/round-14.md).
        # [CLS] is exempt from the bias: PAD, NSP and FEL's sentence heads read it, and with the bias it saw only the
        # first few words (issue #65; benchmarks/probes/cls_reach.py).
        "mini": PretrainConfig(model=dataclasses.replace(MODEL_SIZES["128x2"], norm="pre", dropout=0.0, alibi=4.0,
                                                         alibi_exempt_cls=True),
                               batch_size=32, lr=1e-3, warmup_steps=100, decay="linear", max_steps=3000, short_seq_len=64,
                               short_seq_fraction=0.5, checkpoint_every=500, eval_batches=20, num_workers=1,
                               cpus_per_worker=1.0, threads_per_worker=2, layout_fraction=0.5, corpus_embeddings=0.1),
        # 500M examples at batch 256 (§3.3), on one GPU: a study trains its models one per GPU side by side
        # (study/layout.py), which keeps every GPU busier than data parallelism, whose 32-64 rows a GPU at this batch
        # leave each step under its launch floor and add an all-reduce (docs/cluster.md#one-model-per-gpu);
        # `--train-workers N` asks for data parallelism (another model id). The GPU worker collates in 3 processes
        # of its own, so that its training thread has the interpreter lock to itself (docs/input_path.md): on one
        # H100 the input path, not the GPU, set the pace (a third of the loop waiting for data, docs/throughput.md).
        # 8 CPUs a GPU: the step, 3 collating processes, the reading, and Ray Data's read tasks beside them; the
        # 8-GPU nodes of cluster.yaml have 12 (p4d.24xlarge) or 24 (p5.48xlarge). Both are runtime fields
        # (models.RUNTIME_FIELDS): the model id is the same.
        "paper": PretrainConfig(model=MODEL_SIZES["768x3"], batch_size=256, lr=1e-4, warmup_steps=10000,
                                max_steps=500_000_000 // 256, checkpoint_every=5000, eval_batches=200, num_workers=1,
                                cpus_per_worker=8.0, use_gpu=True, collate_workers=3),
    }



def _finetune_presets() -> dict[str, FinetuneConfig]:
    return {
        "smoke": FinetuneConfig(budget=40, max_epochs=3, patience=2, batch_size=16, lr=1e-3),
        # refit: the model learns from the whole budget, as the context-free baselines do (benchmarks/probes/fel_refit.py).
        # The heads read every layer, a word's pieces averaged: chosen nested in the budget (benchmarks/probes/fel_features.py).
        "mini": FinetuneConfig(budget=200, max_epochs=100, patience=10, lr=1e-3, refit=True, feature_layers="all",
                               word_pooling="mean"),
        "paper": FinetuneConfig(),
    }


@dataclass(frozen=True, kw_only=True)
class Preset:
    """Every stage's settings at one named scale."""

    name: str
    corpus: CorpusConfig
    pretrain: PretrainConfig
    finetune: FinetuneConfig
    size_grid: tuple[tuple[int, ...], tuple[int, ...]]
    """(widths, depths) standing in for the paper's 256/512/768 x 1/2/3. The largest stands in for 768x3; at mini it
    is the mini preset's own model (128x2), so a study's 768x3 analogue is the objective ablation's model."""
    task_max_docs_per_lang: int | None
    """Documents per language the studies build their task datasets from (None: all; `Study.task_max_docs_per_lang`)."""
    points_per_cell: int | None
    """The (fold, seed) calculations of a data point a study runs: the protocol's first few, or None for all ten."""
    search_samples: int
    """Trials of a search of the pretraining objective mixture (`studies/objective_mix.py`)."""
    data_budgets: tuple[tuple[int, ...], int] | None
    """(budgets, reference budget) of every task in the data-budget study (`studies/data_budget.py`), standing in
    for the paper's 50-1000 and 200; None: the paper's own."""

    @staticmethod
    def named(name: str) -> Preset:
        """The preset `name` (one of `config.PRESETS`); built on first use, since a PretrainConfig resolves its
        objectives through the registry (torch)."""
        return _presets()[check_preset(name)]


@functools.cache
def _presets() -> dict[str, Preset]:
    pretrain, finetune = _pretrain_presets(), _finetune_presets()
    grid = {"smoke": ((16, 32), (1, 2)), "mini": ((64, 128), (1, 2)), "paper": ((256, 512, 768), (1, 2, 3))}
    task_docs = {"smoke": 3000, "mini": None, "paper": None}
    points = {"smoke": 2, "mini": None, "paper": None}
    samples = {"smoke": 3, "mini": 12, "paper": 40}
    data_budgets = {"smoke": ((20, 40), 40), "mini": None, "paper": None}
    return {n: Preset(name=n, corpus=_CORPUS[n], pretrain=pretrain[n], finetune=finetune[n], size_grid=grid[n],
                      task_max_docs_per_lang=task_docs[n], points_per_cell=points[n], search_samples=samples[n],
                      data_budgets=data_budgets[n])
            for n in _CORPUS}

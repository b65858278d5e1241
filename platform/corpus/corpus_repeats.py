"""How many times a pretraining run would go over its corpus, known before anything trains: from the corpus's
manifest when it is built, else estimated from its sources (`alignlab plan`, and the refusal of `run_study` and
`alignlab pretrain`).

Plain arithmetic over documents; no Ray, torch or pyarrow.
"""
from __future__ import annotations

import math

from alignlab.platform.config import PACKAGED_SOURCES, PretrainConfig
from alignlab.platform.corpus.corpus_config import CorpusConfig

MAX_CORPUS_REPEATS = 20
"""Passes over a corpus's training rows beyond which a study or `alignlab pretrain` is refused (unless
`--allow-corpus-repeats`). Not 4, the warning's threshold (`corpus.MAX_CORPUS_EPOCHS`): the paper's own run made
about 10 passes over its Wikipedia, so the `paper` preset on a real dump must pass; 20 leaves it a margin of two.
The bundled presets are far below it (`tests/test_corpus_repeats.py`): `smoke` about 0.15 passes of its 300
documents and `mini` about 1 of the bundled plus software summaries, a margin of 20 or more, while `paper` on the
bundled corpus would be about 8,000."""

TOKENS_PER_WORD = 1.67
"""Tokenizer pieces per word of the estimate: the bundled corpus at vocabulary 8,000 had 2,959,122 tokens in
1,771,484 words (benchmarks/results/corpus_throughput.json), and the estimate below then gives 60,397 rows for its
60,681. A larger vocabulary cuts words into fewer pieces, so for the paper's 111K it overestimates the rows and
underestimates the repeats: the refusal errs towards letting a run through."""

ALLOW_FLAG = "--allow-corpus-repeats"


def train_rows(manifest: dict) -> int:
    """The training rows (examples) of a built corpus, from its manifest."""
    return int(manifest["stats"]["chunks"].get("train", 0))


def estimated_train_rows(cfg: CorpusConfig) -> int | None:
    """The training rows a build of `cfg` would make, estimated from its documents' words; None when a source
    reads files (a dump or web text: reading them is most of a build, so the count waits for the manifest).

    A row is one chunk of at most `chunk_len` tokens (`corpus.chunk_document`: a document gives its words' pieces
    cut into chunks), so a document of w words gives about ceil(w * TOKENS_PER_WORD / chunk_len) rows; the eval
    fraction is taken off. Documents held out for the tasks are not: a few hundred of tens of thousands."""
    if any(s.name not in PACKAGED_SOURCES for s in cfg.source_specs):
        return None
    from alignlab.platform.corpus.corpus_sources import iter_sources
    from alignlab.platform.sources.text import split_words

    rows = 0
    for _, doc in iter_sources(cfg):
        words = len(split_words(doc.text))
        if words:
            rows += math.ceil(words * TOKENS_PER_WORD / cfg.chunk_len)
    return int(rows * (1 - cfg.eval_fraction))


def corpus_repeats(cfg: PretrainConfig, rows: int) -> float:
    """Passes over `rows` training rows that `cfg` makes: max_steps steps of the global batch, one row an example."""
    return cfg.max_steps * cfg.batch_size / max(rows, 1)


def check_corpus_repeats(models: dict[str, PretrainConfig], rows: int, corpus: str, *, estimated: bool) -> None:
    """Refuse, in one line naming the ways out, models (key: config) that would go over `rows` training rows of
    `corpus` more than MAX_CORPUS_REPEATS times: they would memorise the corpus, and the run would take days
    to show it."""
    over = {k: corpus_repeats(c, rows) for k, c in models.items() if corpus_repeats(c, rows) > MAX_CORPUS_REPEATS}
    if not over:
        return
    worst = max(over, key=over.get)
    cfg = models[worst]
    about = "about " if estimated else ""
    raise ValueError(
        f"{len(over)} model{'s' if len(over) != 1 else ''} would repeat corpus {corpus} more than "
        f"{MAX_CORPUS_REPEATS} times ({worst!r}: {cfg.max_steps:,} steps x batch {cfg.batch_size} = "
        f"{cfg.max_steps * cfg.batch_size:,} examples over {about}{rows:,} training rows, {over[worst]:,.0f} passes); "
        "give it more text (--source wikidump --path DUMP.xml.bz2, see docs/data.md#sources), use a smaller preset "
        f"(--preset mini), or pass {ALLOW_FLAG}")

"""The alignment positive control's parts (studies/alignment_control.py): the synthetic source and the synthetic
task's pairs. The end-to-end control (corpus -> Ray Train -> FEL -> report) is the study itself."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from alignlab.objectives.pseudo_acronym import make_pad_pairs
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.sources.sources import iter_documents
from alignlab.platform.sources.synthetic import LEXICON, synthetic_documents
from alignlab.platform.sources.text import letter_distribution
from alignlab.studies import alignment_control


REPO = Path(__file__).resolve().parents[1]


def _initials(text: str) -> str:
    return "".join(w[0] for w in text.split())


def test_the_synthetic_source_yields_the_same_linked_documents_on_every_read():
    first = list(iter_documents("synthetic", max_docs_per_lang=200))
    assert first == list(iter_documents("synthetic", max_docs_per_lang=200))
    assert len(first) == 200 and all(d.kind == "wiki" and d.lang == "en" for d in first)
    assert all(set(d.text.split()) <= set(LEXICON) for d in first)
    assert sum(len(d.links) for d in first) > 50  # WHP has entities to learn from
    # Task snippets come from another namespace: never corpus text.
    assert not {d.text for d in first} & {d.text for d in synthetic_documents(200, namespace="synad-test")}


def test_every_lexicon_word_is_one_piece_and_an_acronym_written_letter_by_letter_enters_as_pads(tmp_path):
    train_tokenizer((d.text for d in synthetic_documents(3000)), tmp_path / "t.model",
                    vocab_size=alignment_control.CORPUS.vocab_size)
    tok = Tokenizer(tmp_path / "t.model")
    assert all(len(tok.sp.encode(w)) == 1 for w in LEXICON)
    # The task's text_a "k c i" is what PAD's acronym "kci" is: one word-initial letter piece each.
    assert tok.sp.encode("k c i") == tok.encode_spelled("kci") and tok.unk_id not in tok.encode_spelled("kci")


def test_the_synthetic_tasks_pairs_are_balanced_labelled_by_kind_and_a_perfect_pad_solver_gets_each_right():
    rows = alignment_control.synthetic_pairs(300, "test")
    assert Counter((r["kind"], r["label"]) for r in rows) == {("pos", 1): 300, ("mutate", 0): 150, ("other", 0): 150}
    for r in rows:
        acronym, initials = r["text_a"].replace(" ", ""), _initials(r["text_b"])
        assert alignment_control._has_span(initials, acronym) == bool(r["label"]), r
    # Negatives' letters follow the positives' (no letters-only shortcut beyond sampling noise).
    letters = {k: Counter("".join(r["text_a"].split()) for r in rows if r["label"] == k) for k in (0, 1)}
    share = {k: letters[k]["a"] / sum(letters[k].values()) for k in (0, 1)}
    assert abs(share[0] - share[1]) < 0.03
    assert rows == alignment_control.synthetic_pairs(300, "test")  # the same files on every run


def test_most_letters_of_a_pad_negative_are_no_initial_of_its_chunk_which_gives_pad_its_first_foothold():
    # At 10-18 words a document held half of the initials, a negative's letter was in its chunk 56% of the time,
    # and PAD never left chance; at 3-6 words, 31%, and it learns (docs/journal/issue-65-cls-and-control.md).
    chunks = [d.text.split() for d in synthetic_documents(2000)]
    pairs = make_pad_pairs(chunks, np.random.default_rng(0), letter_distribution([" ".join(c) for c in chunks]))
    present = [c in _initials(" ".join(words)) for words, (acr, label, _) in zip(chunks, pairs) if label == 0
               for c in acr]
    assert len(present) > 1000 and np.mean(present) < 0.4


def test_the_task_files_split_the_test_set_by_negative_kind(tmp_path):
    paths = alignment_control.write_task_files(tmp_path)
    lines = {k: p.read_text().splitlines() for k, p in paths.items()}
    assert len(lines["pool"]) == 2 * alignment_control.POOL_SNIPPETS
    assert len(lines["test"]) == 2 * alignment_control.TEST_SNIPPETS
    assert len(lines["mutate"]) + len(lines["other"]) == len(lines["test"]) + alignment_control.TEST_SNIPPETS
    assert "extra.mutate=" in alignment_control.task_spec(paths) and "aligned=pad" in alignment_control.task_spec(paths)


# -m slow (the whole control without its A/A: a synthetic corpus, two models under Ray Train, 20 FEL calculations;
# minutes on two cores): `python -m pytest -m slow tests/test_alignment_control.py`. Its measured figures are in
# benchmarks/results/alignment_control_mini_4000.md.
@pytest.mark.slow
@pytest.mark.ray
def test_the_model_pretrained_with_pad_learns_pad_and_is_bold_over_the_one_without_on_the_synthetic_pad_task(tmp_path):
    storage = tmp_path / "storage"
    cmd = [sys.executable, str(REPO / "studies" / "alignment_control.py"), "--preset", "mini", "--storage",
           str(storage), "--skip-aa"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    evals = [json.loads(p.read_text()) for p in (storage / "models").glob("*/final/eval.json")]
    [pad] = [e for e in evals if "eval/pad/accuracy" in e]
    assert pad["eval/pad/accuracy"] >= 0.85 and pad["eval/pad/count"] > 200, pad
    [sdir] = [p for p in (storage / "studies").iterdir() if p.name.startswith("alignment_control-mini-")]
    text = (sdir / "report.md").read_text()
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("| SYNAD |"))  # the first table: accuracy
    header = next(lines[j] for j in range(i, -1, -1) if lines[j].startswith("| | "))
    cells = dict(zip((c.strip() for c in header.split("|")), lines[i].split("|")))
    assert cells["aligned*"].strip().startswith("**"), lines[i]  # bold: significant over the baseline
    df = pd.read_parquet(sdir / "results.parquet")
    means = df.groupby("col")["accuracy"].mean()
    assert means["aligned*"] > means["-pad*"]

"""Word embeddings that start from the corpus's co-occurrence statistics (`PretrainConfig.corpus_embeddings`):
the table itself and the Pretrainer that starts from it (the real Ray Train run that makes and uses it is
test_recipe.py's, with the crammed recipe)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from alignlab.platform.config import to_dict
from alignlab.platform.corpus.corpus_embeddings import cooccurrence, training_sequences, word_embeddings
from alignlab.platform.encoder.tokenizer import Tokenizer
from alignlab.platform.presets import Preset
from alignlab.platform.pretrain.pretrain import Pretrainer

SMOKE = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp,whp,pad", precision="fp32")


def _two_topics(n=400, seed=0):
    """Sequences that each draw their pieces from one of two disjoint sets: 10-19 or 20-29 (0-9 never occur)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(10, 20, size=12) if i % 2 else rng.integers(20, 30, size=12) for i in range(n)]


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_pieces_that_occur_together_start_closer_than_pieces_that_never_do():
    table = word_embeddings(_two_topics(), vocab_size=40, dim=8, std=0.1)
    same = np.mean([_cos(table[i], table[j]) for i in range(10, 20) for j in range(10, 20) if i != j])
    other = np.mean([_cos(table[i], table[j]) for i in range(10, 20) for j in range(20, 30)])
    assert same > 0.5 and other < 0.1, (same, other)


def test_the_table_has_the_configured_scale_and_uncounted_pieces_get_berts_random_rows():
    table = word_embeddings(_two_topics(), vocab_size=40, dim=8, std=0.1, seed=3)
    assert table.shape == (40, 8) and table.dtype == np.float32
    assert table[10:30].std() == pytest.approx(0.1, rel=1e-4)
    unseen = table[list(range(10)) + list(range(30, 40))]
    assert np.all(unseen != 0) and unseen.std() == pytest.approx(0.02, rel=0.3)
    assert np.array_equal(table, word_embeddings(_two_topics(), vocab_size=40, dim=8, std=0.1, seed=3))


def test_the_table_is_the_same_whatever_the_callers_torch_threads():
    # Big enough that float32 sums on 1 and 2 threads gave two tables here (the first version's bug; 400 pieces did not)
    seqs = [np.random.default_rng(i).integers(5, 2000, size=60) for i in range(2000)]
    threads = torch.get_num_threads()
    try:
        tables = []
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            tables.append(word_embeddings(seqs, vocab_size=2000, dim=64, std=0.1))
    finally:
        torch.set_num_threads(threads)
    assert torch.get_num_threads() == threads
    assert all(np.array_equal(tables[0], t) for t in tables[1:])


def test_only_pieces_within_the_window_of_one_sequence_count_as_co_occurring():
    counts = cooccurrence([np.array([1, 2, 3, 4]), np.array([5, 6])], vocab_size=8, window=2).toarray()
    assert counts[1, 2] == counts[2, 1] == 1 and counts[1, 3] == 1 and counts[1, 4] == 0  # 3 apart: out
    assert counts[4, 5] == 0  # across the boundary of two sequences
    with pytest.raises(ValueError, match="outside the vocabulary of 8 pieces"):
        cooccurrence([np.array([1, 9])], vocab_size=8)


def test_a_shard_with_a_token_id_outside_the_vocabulary_is_refused_naming_the_shard_its_row_and_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train-00000.parquet"
    pq.write_table(pa.table({"a_ids": [[1, 2], [3, 4]], "b_ids": [[5, 6], [7, 12]]}), path)
    assert len(list(training_sequences([str(path)], vocab_size=13))) == 4
    with pytest.raises(ValueError, match=r"train-00000\.parquet: row 1, column 'b_ids': token id 12 is outside the "
                                         r"vocabulary of 8 pieces"):
        list(training_sequences([str(path)], vocab_size=8))


@pytest.mark.ray
def test_a_pretrainer_starts_its_word_embeddings_and_mlms_tied_decoder_from_the_table(smoke_corpus):
    tok = Tokenizer(smoke_corpus / "tokenizer.model")
    cfg = dataclasses.replace(SMOKE, corpus_embeddings=0.1)
    table = np.random.default_rng(0).normal(0, 0.1, size=(tok.vocab_size, cfg.model.hidden)).astype(np.float32)
    tr = Pretrainer(cfg, tok, word_embeddings=table)
    assert torch.equal(tr.model.encoder.tok.weight.detach(), torch.from_numpy(table))
    assert tr.model.heads["mlm"].tok_embedding.weight is tr.model.encoder.tok.weight  # MLM decodes with the table
    # The rest of the model is the one random init of its seed.
    plain = Pretrainer(SMOKE, tok)
    assert torch.equal(plain.model.encoder.layers[0].qkv.weight, tr.model.encoder.layers[0].qkv.weight)

    with pytest.raises(ValueError, match="needs the corpus's word_embeddings table"):
        Pretrainer(cfg, tok)
    with pytest.raises(ValueError, match="is off, but a word_embeddings table was given"):
        Pretrainer(SMOKE, tok, word_embeddings=table)
    with pytest.raises(ValueError, match=r"this model.s embeddings are \(\d+, 32\)"):
        Pretrainer(cfg, tok, word_embeddings=table[:, :10])
    with pytest.raises(ValueError, match="corpus_embeddings.* must be >= 0"):
        dataclasses.replace(cfg, corpus_embeddings=-1.0)


def test_corpus_embeddings_are_in_the_model_id_only_when_on():
    from alignlab.platform.pretrain.models import model_id

    assert "corpus_embeddings" not in to_dict(SMOKE)  # every model from before the field keeps its id
    on = dataclasses.replace(SMOKE, corpus_embeddings=0.1)
    assert to_dict(on)["corpus_embeddings"] == 0.1
    assert len({model_id("c", SMOKE), model_id("c", on), model_id("c", dataclasses.replace(on, corpus_embeddings=0.3))}) == 3


# Under Ray Train (the driver writes the table once, the workers start from it): one run with the crammed recipe,
# tests/test_recipe.py::test_a_crammed_recipe_from_corpus_embeddings_pretrains_under_ray_train_and_its_id_names_both.

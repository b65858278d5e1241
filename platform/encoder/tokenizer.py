"""The sentencepiece unigram vocabulary: training on a corpus sample, special tokens, word-wise encoding.

Words are encoded one by one (sentencepiece never merges across whitespace by default, so this
equals encoding the whole text) because every word-level label (WHP tags, CT tags) is predicted
at its word's first subword. Acronyms have two input forms: "letters" (one piece per letter, so
the model sees the spelling that PAD/AD are about) and "text" (whatever pieces sentencepiece picks).
"""
from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

PAD, UNK, CLS, SEP, MASK = "<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"


def train_tokenizer(texts: Iterable[str], out_path: str | Path, *, vocab_size: int, seed: int = 0,
                    num_threads: int = 2, lowercase: bool = True) -> int:
    """Train a unigram model on `texts` and write it to `out_path` (via a temp name, renamed last); returns
    the vocabulary size reached, which is below `vocab_size` when the text cannot fill it (`check_vocab_size`).

    `lowercase` bakes case folding into the model's own normalizer (sentencepiece's `nmt_nfkc_cf`), so
    every later encode -- corpus chunks, FEL examples, a user's query at predict time -- is folded the
    same way without any caller remembering to lowercase."""
    out_path = Path(out_path)
    # sentencepiece's trainer has no seed option; its sampling is deterministic for a given input order,
    # and the sample it gets is drawn with `seed` upstream.
    del seed
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        model_type="unigram",
        vocab_size=vocab_size,
        # Small corpora cannot always fill the requested size: sentencepiece 0.2 then raises ("Vocabulary size
        # too high (N). Please set it to a value <= M.") with the hard limit, and stops at M without it. Take
        # what the text gives and let the caller decide (`check_vocab_size`): one training, not two.
        hard_vocab_limit=False,
        character_coverage=0.9995,
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece=PAD, unk_piece=UNK,
        # Control symbols are never produced from raw text, unlike user-defined ones.
        control_symbols=[CLS, SEP, MASK],
        max_sentence_length=1 << 16,
        num_threads=num_threads,
        minloglevel=2,
    )
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(out_path)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue()).get_piece_size()


def check_vocab_size(requested: int, reached: int, *, allow_smaller: bool, sample_docs: int) -> None:
    """Refuse a vocabulary that fell short of the requested size unless `allow_smaller` says to take it: a
    model sized for N pieces on a text that supports M < N pieces is rarely what was meant (issue #18)."""
    if reached < requested and not allow_smaller:
        raise ValueError(f"vocab_size {requested}: sentencepiece reached only {reached} pieces on the tokenizer "
                         f"sample ({sample_docs} documents); use more text, a vocab_size <= {reached}, or "
                         f"--allow-smaller-vocab (CorpusConfig.allow_smaller_vocab) to accept {reached}")


def check_model_vocabulary(folder: Path, tok: "Tokenizer", vocab_size: int, state: dict) -> None:
    """Refuse a model folder whose `tokenizer.model` is not the vocabulary its weights were trained with (a file
    copied in from another model, say): every id would index the wrong embedding row, and nothing else would say
    so. `vocab_size` is what the folder's model_config.json records; `state` holds the weights."""
    rows = next((v.shape[0] for k, v in state.items() if k.endswith("encoder.tok.weight")), vocab_size)
    if not tok.vocab_size == vocab_size == rows:
        raise ValueError(f"{folder}: tokenizer.model has {tok.vocab_size} pieces but the model was trained with "
                         f"{vocab_size} (model_config.json) and its embedding has {rows} rows: the tokenizer is not "
                         "this model's")


class Tokenizer:
    """A loaded sentencepiece model plus the ids every stage needs."""

    def __init__(self, model_path: str | Path):
        self.model_path = str(model_path)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_path)
        self.vocab_size = self.sp.get_piece_size()
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        self.cls_id, self.sep_id, self.mask_id = (self.sp.piece_to_id(p) for p in (CLS, SEP, MASK))
        assert len({self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id}) == 5, "special ids collide"
        self.special_ids = np.array([self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id])
        counts_path = Path(self.model_path).with_name("token_counts.npy")
        # Corpus frequency of every piece (MLM masks rarer ones more often); ones when not built yet.
        self.counts = np.load(counts_path) if counts_path.exists() else np.ones(self.vocab_size, dtype=np.int64)
        self._letter_ids = {c: self._letter_piece(c) for c in "abcdefghijklmnopqrstuvwxyz"}
        self.word_start = np.array([self.sp.id_to_piece(i).startswith("\u2581") for i in range(self.vocab_size)])

    def _letter_piece(self, c: str) -> int:
        # The word-initial piece first: an acronym letter stands for the start of a word, and "▁c" is also
        # what a word starting with c begins with whenever sentencepiece splits off its first letter
        # (always possible under subword regularization), so the two can meet as the same token.
        for piece in ("\u2581" + c, c):
            i = self.sp.piece_to_id(piece)
            if i != self.unk_id:
                return i
        return self.unk_id

    def encode_words(self, words: Sequence[str], *, alpha: float = 0.0, seed: int | None = None) -> list[list[int]]:
        """Pieces of each word; alpha > 0 samples a segmentation (subword regularization, Kudo 2018).

        Sampling draws from sentencepiece's own generator; `seed` reseeds it first, so that the same
        (seed, rank, step) makes the same pieces again when a run resumes."""
        if not words:
            return []
        if alpha > 0:
            if seed is not None:
                spm.set_random_generator_seed(int(seed))
            # One string (not a list): a list starts sentencepiece's thread pool, whose workers draw from
            # their own generators in no fixed order.
            ids = self.sp.encode(" ".join(words), enable_sampling=True, alpha=alpha, nbest_size=-1)
            return _split_at_word_starts(self, ids, len(words)) or [
                self.sp.encode(w, enable_sampling=True, alpha=alpha, nbest_size=-1) for w in words]
        return self.sp.encode(list(words))

    def encode_spelled(self, word: str, form: str = "letters") -> list[int]:
        """A short word, lowercased, as one word-initial token per letter ("letters": spelled out, as PAD's and AD's
        acronyms enter) or as its sentencepiece pieces ("text")."""
        if form == "letters":
            return [self._letter_ids.get(c, self.unk_id) for c in word.lower()]
        if form == "text":
            return self.sp.encode(word.lower())
        raise ValueError(f"unknown spelling form {form!r}: use 'letters' or 'text'")

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids])


def _split_at_word_starts(tok: Tokenizer, ids: list[int], num_words: int) -> list[list[int]] | None:
    """Cut one encoded text into its words' pieces at the pieces that start with "▁"; None when that
    does not give exactly `num_words` words (a word normalised away)."""
    starts = [i for i, p in enumerate(ids) if tok.word_start[p]]
    if len(starts) != num_words or (ids and starts[0] != 0):
        return None
    return [ids[a:b] for a, b in zip(starts, starts[1:] + [len(ids)])]

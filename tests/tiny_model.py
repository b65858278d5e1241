"""A tiny pretrained model without Ray or a corpus build: a sentencepiece model trained on the shipped real
npm texts, corpus-shaped rows made from those texts, a few plain `Pretrainer` steps, and the same `final/`
folder the Ray Train driver writes (`models.export_final`). Seconds on one CPU; used where a test needs a
finished model in the registry but not the Ray pipeline that makes one (that is tested in test_pretrain.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from alignlab.platform.config import config_hash
from alignlab.platform.encoder.tokenizer import Tokenizer, train_tokenizer
from alignlab.platform.presets import Preset

NPM_TEXTS = Path(__file__).resolve().parents[1] / "tasks" / "task_data" / "npm" / "ct_texts.txt"


def real_texts() -> list[str]:
    return [ln.strip() for ln in NPM_TEXTS.read_text().splitlines() if ln.strip()]


def tiny_tokenizer(d: Path, vocab_size: int = 600) -> Tokenizer:
    d.mkdir(parents=True, exist_ok=True)
    path = d / "tokenizer.model"
    if not path.exists():
        train_tokenizer(real_texts() * 2, path, vocab_size=vocab_size)
    return Tokenizer(path)


def rows(tok: Tokenizer, texts: list[str], seed: int = 0) -> dict:
    """Corpus-shaped rows: each text is a chunk whose next chunk is the following text; WHP tags at word
    starts; a PAD pair per row (the initials of its first three words, or a mutation)."""
    rng = np.random.default_rng(seed)
    cols = {k: [] for k in ("doc_id", "kind", "a_ids", "b_ids", "has_next", "a_text", "b_text", "whp_a", "whp_b",
                            "pad_acronym", "pad_label")}

    def ids_tags(text):
        ids, tags = [], []
        for w in tok.encode_words(text.split()[:12]):
            ids += w
            tags += [int(rng.integers(4))] + [-100] * (len(w) - 1)
        return ids, tags

    for i, t in enumerate(texts):
        nxt = texts[(i + 1) % len(texts)]
        a, ta = ids_tags(t)
        b, tb = ids_tags(nxt)
        initials = "".join(w[0] for w in t.split()[:3] if w[0].isalpha()) or "ab"
        positive = i % 2 == 0
        cols["doc_id"].append(f"d{i // 2}")
        cols["kind"].append("wiki")
        cols["a_ids"].append(a)
        cols["b_ids"].append(b)
        cols["has_next"].append(True)
        cols["a_text"].append(" ".join(t.split()[:12]))
        cols["b_text"].append(" ".join(nxt.split()[:12]))
        cols["whp_a"].append(ta)
        cols["whp_b"].append(tb)
        cols["pad_acronym"].append(initials if positive else "q" * len(initials))
        cols["pad_label"].append(1 if positive else 0)
    return {k: np.asarray(v, dtype=object) for k, v in cols.items()}


def batches(tok: Tokenizer, batch_size: int = 16, num: int = 4) -> list[dict]:
    texts = real_texts()[: batch_size * num]
    r = rows(tok, texts)
    return [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in r.items()} for i in range(num)]


def tiny_pretrained(root: Path, objectives: str = "mlm,nsp,whp,pad", steps: int = 3, **overrides) -> Path:
    """A finished model folder `<root>/models/<id>/` (final/model.pt, model_config.json, tokenizer.model)."""
    from alignlab.platform.pretrain.models import export_final
    from alignlab.platform.pretrain.pretrain import Pretrainer
    from alignlab.platform.storage.root import write_json

    from alignlab.platform.config import to_dict

    tok = tiny_tokenizer(root / "tok")
    cfg = dataclasses.replace(Preset.named("smoke").pretrain, objectives=objectives, max_steps=steps, precision="fp32",
                              **overrides)
    tr = Pretrainer(cfg, tok)
    for step, b in enumerate(batches(tok)[:steps]):
        tr.train_step(tr.collate(b, step=step))
    mid = f"tiny-{'+'.join(cfg.objective_names)}-{config_hash(cfg)}"
    mdir = root / "models" / mid
    mdir.mkdir(parents=True, exist_ok=True)
    write_json(mdir / "config.json", {"model_id": mid, "corpus_id": "tiny", "pretrain": to_dict(cfg)})
    export_final(tr, tok, mdir, {})
    return mdir

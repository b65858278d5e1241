"""The examples, JSONL line formats and context-free baselines of the task kinds declared from files
(`task_kinds`): what each kind's lines must hold, and the baselines a model's effect must beat.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from alignlab.platform.tasks.task_files import TaskFormat

SPAN_PREFIXES = ("B-", "I-", "E-", "S-")


# ---------------------------------------------------------------- examples and line formats


@dataclass(frozen=True)
class TaggedExample:
    tokens: tuple[str, ...]
    tags: tuple[str, ...]

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "tags": list(self.tags)}


@dataclass(frozen=True)
class TextExample:
    text: str
    label: str

    def to_json(self) -> dict:
        return {"text": self.text, "label": self.label}


@dataclass(frozen=True)
class PairExample:
    text_a: str
    text_b: str
    label: str

    def to_json(self) -> dict:
        return {"text_a": self.text_a, "text_b": self.text_b, "label": self.label}


def _text_problem(obj: dict, key: str) -> list[str]:
    v = obj.get(key)
    if not isinstance(v, str) or not v.split():
        return [f'"{key}" must be a non-empty string, got {json.dumps(v)[:60]}']
    return []


def _label_problem(obj: dict) -> list[str]:
    v = obj.get("label")
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        return [f'"label" must be a non-empty string or an integer, got {json.dumps(v)[:60]}']
    return []


def _tagging_problems(obj: dict) -> list[str]:
    tokens, tags = obj.get("tokens"), obj.get("tags")
    if not isinstance(tokens, list) or not tokens:
        return ['"tokens" must be a non-empty list of words']
    if not isinstance(tags, list):
        return ['"tags" must be a list of tags, one per token']
    out = []
    bad = [i for i, t in enumerate(tokens) if not isinstance(t, str) or not t or t.split() != [t]]
    if bad:
        out.append(f'"tokens"[{bad[0]}] is not a word (a non-empty string without whitespace)')
    bad = [i for i, t in enumerate(tags) if not isinstance(t, str) or not t.strip()]
    if bad:
        out.append(f'"tags"[{bad[0]}] is not a non-empty string')
    if len(tags) != len(tokens):
        out.append(f"{len(tags)} tags for {len(tokens)} tokens")
    return out


FORMATS = {
    "tagging": TaskFormat(problems=_tagging_problems,
                          parse=lambda o: TaggedExample(tuple(o["tokens"]), tuple(o["tags"])),
                          key=lambda o: tuple(o["tokens"]) if isinstance(o.get("tokens"), list) and "tags" in o else None),
    "sequence": TaskFormat(problems=lambda o: _text_problem(o, "text") + _label_problem(o),
                           parse=lambda o: TextExample(o["text"], str(o["label"])),
                           key=lambda o: o["text"] if isinstance(o.get("text"), str) and "label" in o else None),
    "pair": TaskFormat(problems=lambda o: _text_problem(o, "text_a") + _text_problem(o, "text_b") + _label_problem(o),
                       parse=lambda o: PairExample(o["text_a"], o["text_b"], str(o["label"])),
                       key=lambda o: ((o["text_a"], o["text_b"]) if isinstance(o.get("text_a"), str)
                                      and isinstance(o.get("text_b"), str) else None)),
}


def texts_of(ex) -> tuple[str, ...]:
    """The texts of one example of any kind (a tagged example's words joined by spaces)."""
    if isinstance(ex, TaggedExample):
        return (" ".join(ex.tokens),)
    return (ex.text,) if isinstance(ex, TextExample) else (ex.text_a, ex.text_b)


def labels_of(kind: str, examples) -> list[str]:
    """Every label (tagging: tag) of the examples, with repeats, in order."""
    return [t for ex in examples for t in ex.tags] if kind == "tagging" else [ex.label for ex in examples]


# ---------------------------------------------------------------- context-free baselines


def label_lists(kind: str, examples) -> list[list[str]]:
    """Each example's scored labels: a tagging example's tags, another kind's one label."""
    return [list(ex.tags) for ex in examples] if kind == "tagging" else [[ex.label] for ex in examples]


def lexicon_hits(train, test) -> list[list[bool]]:
    """Per test example, whether each word's most frequent train tag (unknown words: the majority tag) is its tag."""
    counts: dict[str, Counter] = {}
    for ex in train:
        for w, t in zip(ex.tokens, ex.tags):
            counts.setdefault(w.lower(), Counter())[t] += 1
    overall = Counter(t for ex in train for t in ex.tags)
    default = min(overall, key=lambda t: (-overall[t], t))
    lexicon = {w: min(c, key=lambda t: (-c[t], t)) for w, c in counts.items()}
    return [[lexicon.get(w.lower(), default) == t for w, t in zip(ex.tokens, ex.tags)] for ex in test]


def _logistic_hits(x_train, y_train, x_test, y_test) -> list[list[bool]]:
    """Per test example, whether a logistic regression fitted on train is right (a one-class train predicts that
    class)."""
    from sklearn.linear_model import LogisticRegression

    if len(set(y_train)) < 2:
        pred = [y_train[0]] * len(y_test)
    else:
        pred = LogisticRegression(max_iter=1000).fit(x_train, y_train).predict(x_test)
    return [[bool(p == y)] for p, y in zip(pred, y_test)]


def bag_of_words_hits(train, test) -> list[list[bool]]:
    """A logistic regression on lowercased word counts of the text."""
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer

    vec = CountVectorizer(lowercase=True, token_pattern=r"\S+")
    x_train = vec.fit_transform([ex.text for ex in train])
    return _logistic_hits(x_train, np.array([ex.label for ex in train]), vec.transform([ex.text for ex in test]),
                          np.array([ex.label for ex in test]))


def _overlap_features(ex: PairExample) -> list[float]:
    a, b = set(ex.text_a.lower().split()), set(ex.text_b.lower().split())
    shared = len(a & b)
    return [shared / max(1, len(a | b)), shared / max(1, len(a)), shared / max(1, len(b)), float(shared),
            float(len(a)), float(len(b))]


def overlap_hits(train, test) -> list[list[bool]]:
    """A logistic regression on word-overlap features of the two texts (Jaccard, shares, counts)."""
    import numpy as np

    return _logistic_hits(np.array([_overlap_features(e) for e in train]), np.array([e.label for e in train]),
                          np.array([_overlap_features(e) for e in test]), np.array([e.label for e in test]))


def is_span_scheme(tags) -> bool:
    """Whether every tag is `O` or a BIO/BIOES tag with a type (`B-PER`): then entity span F1 is meaningful."""
    tags = set(tags)
    return bool(tags - {"O"}) and all(t == "O" or (t[:2] in SPAN_PREFIXES and len(t) > 2) for t in tags)

"""The content holdout rule: no corpus, whatever it is built from, holds task text or a task answer's definition.

Document ids only name the bundled corpus's documents; a Wikipedia dump, web text or a user's files hold the
same sentences under other ids. So every source's documents are also checked by content, against what the
finetuning tasks give (`Task.heldout_text`: their test and pool texts, and the short forms their positives
define). A document is held out when

- its normalised words (NFKC, casefolded, letter/digit runs: case, whitespace and punctuation do not count)
  share any NGRAM-word sequence with a task text; a task text shorter than NGRAM words (but at least
  MIN_TEXT_WORDS) counts as one sequence of its own length, matched whole; or
- it defines a task's short form: a long form's words followed by the short form in parentheses,
  "World Health Organization (WHO)", in any case and spacing.

Why 8 words: the AD snippets are sentences cut from corpus documents and the CT texts are package summaries
of 3 to 30 words; an 8-word run is long enough that ordinary text shares one with them only when it
quotes them (a 4-gram such as "one of the most" would hold out much of any corpus), and short enough that a
lightly edited copy (a changed word every ~8) is still caught. The whole document goes, not just the chunk:
the sentences around a snippet give its answer away as well.

The check is a set lookup per word position (tuples of words, grouped by first word), so it adds a
fraction of the staging time (docs/holdout.md has the figure). Plain Python: no Ray.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field

HOLDOUT_RULE_VERSION = 1
"""Bump when the rule (normalisation, NGRAM, MIN_TEXT_WORDS, the definition pattern) changes what it holds out:
it is in every corpus id, so corpora built under an older rule are rebuilt."""
NGRAM = 8
MIN_TEXT_WORDS = 3
"""Task texts shorter than this are not matched (a two-word text is an ordinary phrase); counted in the record."""
DEFINITION_WINDOW = 400
"""Characters before "(SHORT)" searched for the long form (longer than any long form the tasks have)."""

_WORD = re.compile(r"[^\W_]+")
_PAREN = re.compile(r"\(\s*([^\W_]+)\s*\)")


def normal_words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


@dataclass(frozen=True)
class HeldOutText:
    """What a task keeps out of every corpus (`Task.heldout_text`)."""

    texts: tuple[str, ...] = ()
    """Test and pool texts: a document sharing an NGRAM-word run with one is held out."""
    definitions: tuple[tuple[str, str], ...] = ()
    """(short form, long form) pairs: a document writing "long form (short form)" is held out."""

    def __add__(self, other: "HeldOutText") -> "HeldOutText":
        return HeldOutText(self.texts + other.texts, self.definitions + other.definitions)


@dataclass
class ContentHoldout:
    """The rule applied to one `HeldOutText`; `reason(text)` says why a document is held out (None: kept)."""

    held: HeldOutText
    grams: dict[str, dict[int, set[tuple[str, ...]]]] = field(init=False, default_factory=dict)
    defs: dict[str, set[tuple[str, ...]]] = field(init=False, default_factory=dict)
    num_short_texts: int = field(init=False, default=0)

    def __post_init__(self):
        for text in self.held.texts:
            words = normal_words(text)
            if len(words) < MIN_TEXT_WORDS:
                self.num_short_texts += 1
                continue
            n = min(NGRAM, len(words))
            for i in range(len(words) - n + 1):
                self.grams.setdefault(words[i], {}).setdefault(n, set()).add(tuple(words[i:i + n]))
        for short, long in self.held.definitions:
            lf = tuple(normal_words(long))
            if lf and normal_words(short):
                self.defs.setdefault("".join(normal_words(short)), set()).add(lf)

    def __bool__(self) -> bool:
        return bool(self.grams or self.defs)

    def digest(self) -> str:
        """What the rule was applied against, by content: the corpus id and the manifest record it."""
        texts = sorted({" ".join(normal_words(t)) for t in self.held.texts})
        defs = sorted({f"{s.casefold()}\t{' '.join(normal_words(lf))}" for s, lf in self.held.definitions})
        return hashlib.sha256("\n".join(texts + ["--"] + defs).encode()).hexdigest()[:16]

    def shares_text(self, words: list[str]) -> bool:
        grams = self.grams
        for i, w in enumerate(words):
            by_len = grams.get(w)
            if by_len:
                for n, seqs in by_len.items():
                    if tuple(words[i:i + n]) in seqs:
                        return True
        return False

    def defines(self, text: str) -> bool:
        if not self.defs:
            return False
        for m in _PAREN.finditer(text):
            long_forms = self.defs.get(m.group(1).casefold())
            if long_forms:
                before = normal_words(text[max(0, m.start() - DEFINITION_WINDOW):m.start()])
                if any(len(before) >= len(lf) and tuple(before[-len(lf):]) == lf for lf in long_forms):
                    return True
        return False

    def reason(self, text: str) -> str | None:
        if self.grams and self.shares_text(normal_words(text)):
            return "task_text"
        if self.defines(text):
            return "definition"
        return None


REASONS = ("doc_id", "task_text", "definition")
"""Why a document was held out, in the order checked: its id is listed, it shares task text, it defines."""


def holdout_record(rule: ContentHoldout | None, task_dirs: list[str], per_source: list[dict]) -> dict | None:
    """The manifest's record of the rule (None: no task text was held out): the rule, what it was applied
    against, and the documents it removed per source and reason (`stage_documents`' "held_out" counts)."""
    if rule is None or not rule:
        return None
    return {"rule_version": HOLDOUT_RULE_VERSION, "ngram": NGRAM, "min_text_words": MIN_TEXT_WORDS,
            "task_dirs": sorted(task_dirs), "task_data": rule.digest(), "texts": len(rule.held.texts),
            "texts_too_short": rule.num_short_texts, "definitions": len(rule.held.definitions),
            "removed_per_source": [{"source": s["source"], **s["held_out"]} for s in per_source]}


def require_holdout(manifest: dict, task_dir: str) -> None:
    """Refuse, for a study, a corpus that did not hold out the task folder `task_dir` under this rule."""
    rec = manifest.get("holdout")
    cid = manifest.get("corpus_id", "?")
    if not rec:
        raise ValueError(f"corpus {cid} has no content-holdout record (built before the rule, or with "
                         "hold_out_tasks off): a study refuses it, since its shards may hold task test text. Rebuild "
                         "it: `alignlab corpus build` (see docs/holdout.md)")
    if rec.get("rule_version") != HOLDOUT_RULE_VERSION or task_dir not in rec.get("task_dirs", ()):
        raise ValueError(f"corpus {cid} held out task folder(s) {rec.get('task_dirs')} under holdout rule "
                         f"{rec.get('rule_version')}; this study needs {task_dir} under rule {HOLDOUT_RULE_VERSION}. "
                         "Rebuild the corpus for this study (see docs/holdout.md)")

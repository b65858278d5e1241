"""AD read by pair kind: a positive, a mutated negative (the PAD-aligned part: a perfect PAD solver rejects every
one) or a pseudo-acronym negative (the initials of a non-entity span: PAD positives by design). A negative's kind
is read back from the pair itself: it is a pseudo acronym iff it spells a span of its snippet under PAD's rule, AD's
own (`ad_mining.matches_a_span`, i.e. `text.spells_a_span`), which the builder never lets a mutated negative do.

`accuracy_by_kind` gives, from per-pair hits, the accuracy on all pairs, on positives + mutated negatives and on
positives + pseudo negatives.

The report reads AD by part a snippet at a time (`snippet_part`, the task's `unit_part`): a snippet is one test unit
(its positive and its negative), and it falls in the part of its negative's kind, so its positive counts where its
negative does. Each part is then balanced (one positive per negative) and the paired decision can run on it. Over
pairs (`accuracy_by_kind`) every positive counts in both parts; the builder draws the negative's kind by a fair coin
per snippet (a pseudo acronym where one exists), so the two agree in expectation up to that fallback.
"""
from __future__ import annotations

from collections.abc import Sequence

from alignlab.tasks.ad_mining import matches_a_span

KINDS = ("pos", "mutate", "pseudo")
PARTS = {"all": KINDS, "pos_vs_mutate": ("pos", "mutate"), "pos_vs_pseudo": ("pos", "pseudo")}


def pair_kind(ex) -> str:
    """"pos", "mutate" or "pseudo" for an AD example (`ADExample`)."""
    if ex.label == 1:
        return "pos"
    return "pseudo" if matches_a_span(ex.acronym, ex.snippet) else "mutate"


def snippet_part(examples: Sequence) -> str | None:
    """The part of one AD snippet (a test unit: its pairs): the kind of its negatives, "mutate" or "pseudo", when
    they share one; None for a snippet without a negative or with negatives of both kinds."""
    kinds = {pair_kind(e) for e in examples} - {"pos"}
    return kinds.pop() if len(kinds) == 1 else None


def accuracy_by_kind(examples: Sequence, hits: Sequence[bool]) -> dict[str, float]:
    """{part: accuracy} over PARTS; NaN for a part with no pair. `hits[i]` says whether examples[i] was right."""
    if len(examples) != len(hits):
        raise ValueError(f"accuracy_by_kind: {len(examples)} examples but {len(hits)} hits")
    kinds = [pair_kind(e) for e in examples]
    out = {}
    for part, wanted in PARTS.items():
        sel = [bool(h) for k, h in zip(kinds, hits) if k in wanted]
        out[part] = sum(sel) / len(sel) if sel else float("nan")
    return out

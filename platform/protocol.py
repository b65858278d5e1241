"""The FEL protocol (paper §3.4): the task datasets a study uses, and the ten calculations per data point.

- AD: 5-fold cross-validation over snippets (a snippet's positive and negative share a fold) x 2
  seeds; the training set of budget n is sampled from the four training folds, the fifth is the test set.
- CT: 5 random samples of n from the 275-query pool ("fold" numbers the sample), tested on the
  200-query set, x 2 seeds.
The examples of a calculation depend on (task, budget, fold) only: the two seeds of a fold train on
the same sample, validate on the same split and test on the same set; the seed changes the
initialisation (fresh heads, dropout) and the batch order only (`finetune.run_calculation`).
In "honest" selection a validation split (`val_fraction` of n) is carved from the sampled budget,
so the model trains on the rest and the test set only scores the selected epochs.
Searches (`search_split`, `search_groups`) are nested: a search whose setting is reported on AD's
fold f samples only from fold f's four training folds; CT's searches sample from the pool.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

from alignlab.platform import tasks as T
from alignlab.platform.config import FinetuneConfig, config_hash
from alignlab.platform.storage import as_storage, read_json, write_json, write_text

NUM_FOLDS = 5
NUM_SEEDS = 2


def calculations() -> list[tuple[int, int]]:
    """(fold, seed) of the ten calculations of one data point."""
    return [(fold, seed) for fold in range(NUM_FOLDS) for seed in range(NUM_SEEDS)]


@dataclass
class TaskData:
    tdir: Path
    ad: list
    ct_pool: list
    ct_test: list

    @classmethod
    def load(cls, tdir: Path) -> "TaskData":
        tdir = Path(tdir)
        return cls(tdir, T.load_examples("ad", tdir / "ad.jsonl"), T.load_examples("ct", tdir / "ct_pool.jsonl"),
                   T.load_examples("ct", tdir / "ct_test.jsonl"))


def build_tasks(root: Path, *, langs=("en", "es", "fr"), max_docs_per_lang: int | None = None,
                target_snippets: int = 600, seed: int = 0) -> Path:
    """Build (or find) the bundled CT and AD datasets; their source documents are listed for holdout."""
    from alignlab.platform.sources import read_bundled

    st = as_storage(root)
    key = config_hash({"langs": list(langs), "max_docs": max_docs_per_lang, "snippets": target_snippets, "seed": seed,
                       "ad_builder": T.AD_BUILDER_VERSION})
    rel = f"tasks/bundled-{key}"
    tdir = st.local / rel
    if st.pull(rel, marker="stats.json"):
        return tdir
    docs = list(read_bundled(langs, max_docs_per_lang=max_docs_per_lang))
    ad, ad_stats = T.build_ad_dataset(docs, seed=seed, target_snippets=target_snippets)
    pool, test, ct_stats = T.build_ct_dataset(T.concepts_from_documents(d for d in docs if d.lang == "en"), seed=seed)
    tdir.mkdir(parents=True, exist_ok=True)
    T.write_jsonl(tdir / "ad.jsonl", ad)
    T.write_jsonl(tdir / "ct_pool.jsonl", pool)
    T.write_jsonl(tdir / "ct_test.jsonl", test)
    # CT concepts are article titles: the sentences of those articles are not held out (the paper's CT
    # queries are not Wikipedia text either); AD snippets are corpus text, so their documents are.
    doc_ids = sorted(ad_stats.pop("doc_ids", []))
    write_text(tdir / "heldout_doc_ids.txt", "".join(d + "\n" for d in doc_ids))
    write_json(tdir / "stats.json", {"ad": ad_stats, "ct": ct_stats, "heldout_documents": len(doc_ids)})
    st.push(rel, last=("stats.json",))
    return tdir


def _ad_folds(examples: list) -> list[list[int]]:
    """Example indices per fold; both pairs of a snippet land in the same fold (fixed, seed-independent)."""
    snippets = sorted({ex.snippet for ex in examples})
    random.Random(12345).shuffle(snippets)
    fold_of = {s: i % NUM_FOLDS for i, s in enumerate(snippets)}
    folds: list[list[int]] = [[] for _ in range(NUM_FOLDS)]
    for i, ex in enumerate(examples):
        folds[fold_of[ex.snippet]].append(i)
    return folds


def _pool_and_test(data: TaskData, task: str, fold: int) -> tuple[list, list]:
    """The examples a calculation of this fold may sample its budget from, and its test set."""
    if task == "ad":
        folds = _ad_folds(data.ad)
        test = [data.ad[i] for i in folds[fold % NUM_FOLDS]]
        pool = [data.ad[i] for f, idx in enumerate(folds) if f != fold % NUM_FOLDS for i in idx]
        return pool, test
    return list(data.ct_pool), list(data.ct_test)


def _sample(pool: list, task: str, cfg: FinetuneConfig, key: str) -> tuple[list, list]:
    """(train, val) of a budget drawn from `pool` by `key`; val is empty in "paper" selection."""
    if cfg.budget > len(pool):
        raise ValueError(f"budget {cfg.budget} exceeds the {len(pool)} {task.upper()} training examples available")
    sample = random.Random(key).sample(pool, cfg.budget)
    if cfg.selection == "paper":
        return sample, []
    n_val = max(2, round(cfg.val_fraction * cfg.budget))
    return sample[n_val:], sample[:n_val]


def fel_split(data: TaskData, task: str, cfg: FinetuneConfig) -> tuple[list, list, list]:
    """(train, val, test) of one calculation; val is empty in "paper" selection.

    Keyed by (task, budget, fold), never by the seed: the paper's "two random seeds" train the same
    sample twice with a different initialisation and batch order (§3.4: five samples x two seeds)."""
    pool, test = _pool_and_test(data, task, cfg.fold)
    train, val = _sample(pool, task, cfg, f"{task}-{cfg.budget}-{cfg.fold}")
    return train, val, test


def search_groups(task: str, points) -> dict[int | None, tuple[tuple[int, int], ...]]:
    """The searches a searched cell needs (nested selection): outer fold -> the (fold, seed) points that
    report that search's best setting.

    AD's test fold changes with the fold, and every snippet is in some fold's test set, so one search
    cannot serve all folds: fold f gets its own search, inside f's four training folds (nested
    cross-validation). CT's test set is the same separate 200-query set for every calculation, so one
    search on the pool serves every sample (key None)."""
    points = tuple((int(f), int(s)) for f, s in points)
    if task != "ad":
        return {None: points}
    groups: dict[int | None, tuple[tuple[int, int], ...]] = {}
    for f, s in points:
        groups[f % NUM_FOLDS] = groups.get(f % NUM_FOLDS, ()) + ((f, s),)
    return groups


def search_split(data: TaskData, task: str, cfg: FinetuneConfig) -> tuple[list, list]:
    """(train, val) of a search trial whose setting is reported on the calculations of outer fold `cfg.fold`.

    Drawn from that fold's training pool only (AD: the four other folds; CT: the pool), by a key of its
    own, so the search never sees the test set of a calculation that reports its setting. Searches
    select in honest mode: val is carved from the budget as in a calculation."""
    pool, _ = _pool_and_test(data, task, cfg.fold)
    key = f"search-{task}-{cfg.budget}-{cfg.fold % NUM_FOLDS if task == 'ad' else 'pool'}"
    return _sample(pool, task, dataclasses.replace(cfg, selection="honest"), key)


def context_free_baselines(task: str, train: list, test: list) -> dict[str, float]:
    """Baselines that never see the context: majority class, and letters-only (AD) / per-word lexicon (CT)."""
    if task == "ad":
        return {"baseline_majority": T.majority_baseline([e.label for e in train], [e.label for e in test]),
                "baseline_context_free": T.letters_only_ad_baseline(train, test)}
    train_tags = [t for e in train for t in e.tags]
    test_tags = [t for e in test for t in e.tags]
    return {"baseline_majority": T.majority_baseline(train_tags, test_tags),
            "baseline_context_free": T.lexicon_ct_baseline(train, test)}

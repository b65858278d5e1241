"""CT, concept tagging (paper §3.3): tag each word of a short query S, E, SE or N (a concept is S..E or SE).

Input: `[CLS] pieces of the query [SEP]`, scored at each word's first piece (WHP's head shape, 4 tags).
Protocol data: a pool the budget is sampled from and a fixed test set, the same for every fold.
Context-free baselines: majority tag; per-word lexicon; the run rule (a word tagged N in train is N, each
run of other words one concept); the title gazetteer (longest article-title match), when titles are given.
Serving: `Predictor.tag(words)`, `Predictor.bracket(query)` (paper §4.1's brackets).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from alignlab.objectives.hyperlink import TAGS as WHP_TAGS
from alignlab.platform.tasks.holdout import HeldOutText
from alignlab.platform.tasks.task import BuiltData, Task, register_task
from alignlab.platform.tasks.task_kinds import TaggingTask, query_input

from alignlab.tasks.ct_data import (CT_FORMAT, build_ct_dataset, concepts_from_documents, gazetteer_ct_hits,
                                         lexicon_ct_hits, run_rule_ct_hits, tag_fractions, title_words)
from alignlab.platform.tasks.task_files import majority_hits


CT_BASELINE_NOTES = ("CT: lexicon (each word's most frequent training tag), run rule (a word tagged N in training is "
                     "N; each run of other words is one concept), gazetteer (longest match of a bundled-corpus article "
                     "title is a concept).")
CT_DATA = ("npm", "templated")
"""CT datasets a study can use (`ct_data`): "npm" (default), the hand-labelled npm package summaries shipped in
tasks/task_data/npm/ (real text, guideline and agreement beside it); "templated", titles of the
bundled corpus placed in templates (gold tags by construction: fast, but a context-free rule solves it)."""


def tags_to_brackets(words: Sequence[str], tags: Sequence[str]) -> str:
    """`when was the first [super mario] released` from words and their S/E/SE/N tags (paper §4.1).

    Each word's tag is printed as predicted, so an ill-formed sequence (S S E) shows as nested brackets."""
    if len(words) != len(tags):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    out = []
    for w, t in zip(words, tags):
        if t == "S":
            out.append("[" + w)
        elif t == "E":
            out.append(w + "]")
        elif t == "SE":
            out.append("[" + w + "]")
        elif t == "N":
            out.append(w)
        else:
            raise ValueError(f"unknown tag {t!r} (expected one of {', '.join(WHP_TAGS)})")
    return " ".join(out)


@register_task
class ConceptTagging(TaggingTask):
    """CT is an instance of the generic tagging kind (`task_kinds.TaggingTask`): its input, labels and head come from
    the kind's code over its four tags (in WHP's order, so WHP's head initialises it), and so do its protocol (one
    pool, one test set: `pool_and_test`, `search_groups`, `search_pool_key`) and its extra tests (none). Its own, as
    before: the data builder (`ct_data`), the line format (CT_FORMAT: S/E/SE/N and their rules), the baselines
    (run rule, gazetteer), what a test unit is and what it holds out, and serving (`tag`, `bracket`)."""
    builtin = True

    def __init__(self) -> None:
        self._setup({"name": "ct", "kind": "tagging", "labels": list(WHP_TAGS), "aligned_objective": "whp",
                     "extra_tests": []}, None)
        self.format, self.multitask_partner = CT_FORMAT, "ad"
        self.baseline_notes, self.extra_test_notes = CT_BASELINE_NOTES, {}

    unit_metrics = Task.unit_metrics  # its tags are no span scheme: no span F1, and no extra scoring pass for it

    def add_data_commands(self, data_subparsers) -> None:
        cc = data_subparsers.add_parser("convert-ct", help="bracketed CT text ('a [spatial graph] library') -> CT JSONL")
        cc.add_argument("src", help="bracketed file, one text per line")
        cc.add_argument("dst", help="JSONL file to write")
        cc.add_argument("--texts", default=None, help="plain texts the lines must match word for word")
        cc.set_defaults(task_command=_convert_bracketed)
    name = "ct"
    aligned_objective = "whp"
    multitask_partner = "ad"
    head_rank = 0
    unit = "words"
    test_units = "texts"
    baselines = ("majority", "lexicon", "run_rule", "gazetteer")
    # The claim all* - -WHP* of the mini objective ablation's committed report (README command 1, commit 8d77a73,
    # benchmarks/results/objective_ablation_mini_untrained_control_results.parquet): parts (1.82e-6, 4 df) x 5 folds
    # and (4.43e-6, 75 df). A pretraining run's shift, 0.29 points per run and recipe, is measured by the mini study
    # with --pretrain-seeds 3 (benchmarks/statistics/calibration.py's `run_points_from` over its three CT columns; the claim's
    # own parts give 0.30): benchmarks/results/objective_ablation_mini_3pretrain_seeds_ad_by_part_results.parquet.
    plan_variance = {"fold": 9.08e-6, "units": 4.43e-6, "units_df": 75.0, "run_points": 0.29,
                     "run_from": "objective_ablation_mini_3pretrain_seeds_ad_by_part"}
    build_options = {"ct_data": "npm"}
    serving_verbs = ("tag", "bracket")

    def test_unit(self, ex):
        return " ".join(ex.tokens)  # one query text; its words are tagged together, so they are one unit

    # ---- data: one pool, one test set for every fold
    def add_build_arguments(self, parser):
        parser.add_argument("--ct-data", choices=list(CT_DATA), default=None,
                            help="CT data: the shipped hand-labelled npm set (default) or templated bundled titles")

    def build_key(self, options):
        if options["ct_data"] not in CT_DATA:
            raise ValueError(f"unknown CT data {options['ct_data']!r}: choose one of {', '.join(CT_DATA)}")
        return {"ct_data": options["ct_data"]}

    def folder_tag(self, options):
        return options["ct_data"]

    def build_data(self, docs, *, seed, options):
        from alignlab.platform.tasks.task_data import SHIPPED_TASK_DATA

        en_docs = [d for d in docs if d.lang == "en"]
        if options["ct_data"] == "templated":
            pool, test, stats = build_ct_dataset(concepts_from_documents(en_docs), seed=seed)
        else:
            pool = self.load_examples(SHIPPED_TASK_DATA / "ct_pool.jsonl")
            test = self.load_examples(SHIPPED_TASK_DATA / "ct_test.jsonl")
            stats = {"source": "npm package summaries, hand-labelled (objectives/task_data/npm)",
                     "pool_size": len(pool), "test_size": len(test),
                     "tag_fractions_pool": tag_fractions(pool), "tag_fractions_test": tag_fractions(test)}
        # Article titles of the bundled corpus, for the gazetteer baseline.
        titles = sorted({t for t in (title_words(d.title) for d in en_docs if d.title) if t})
        files = {self.data_files["ct_pool"][0]: pool, self.data_files["ct_test"][0]: test,
                 "titles.txt": "".join(" ".join(t) + "\n" for t in titles)}
        # CT is not corpus text (npm summaries, or templates around titles), so nothing of it is held out.
        return BuiltData(files, {"ct": stats, "ct_data": options["ct_data"], "titles": len(titles)}, set())

    def heldout_text(self, data):
        # The npm texts are not bundled corpus text, but a software or web source may hold them word for word.
        return HeldOutText(tuple(sorted({" ".join(e.tokens) for e in (*data.ct_pool, *data.ct_test)})))

    def baseline_context(self, data):
        # Article titles of the bundled corpus (titles.txt of the task folder), as word tuples: the gazetteer's.
        path = data.tdir / "titles.txt"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        return {"titles": [tuple(ln.split()) for ln in lines]}

    def baseline_hits(self, train, test, *, titles=()):
        out = {"majority": majority_hits([t for e in train for t in e.tags], [e.tags for e in test]),
               "lexicon": lexicon_ct_hits(train, test),
               "run_rule": run_rule_ct_hits(train, test)}
        if titles:
            out["gazetteer"] = gazetteer_ct_hits(titles, test)
        return out

    # ---- serving
    def tag(self, predictor, words: Sequence[str], head: str | None = None) -> list[str]:
        """One tag per word; words past the model's max length (never scored) are N."""
        head = head or self.name
        predictor.need(head)
        ids, first = query_input(predictor.tok, words, predictor.max_len)
        if not first:
            return ["N"] * len(words)
        w, b = predictor.heads[head]
        with torch.inference_mode():
            h = predictor.unit_vectors(head, torch.tensor(ids), None, torch.tensor(first))
            pred = torch.addmm(b, h, w).argmax(-1).tolist()
        return [WHP_TAGS[t] for t in pred] + ["N"] * (len(words) - len(first))

    def bracket(self, predictor, query: str, head: str | None = None) -> str:
        words = query.split()
        return tags_to_brackets(words, self.tag(predictor, words, head))

    def add_predict_arguments(self, parser):
        parser.add_argument("query", nargs="?", help="a CT query; prints it with [ ] around the predicted concepts")

    def predict_usage(self):
        return "a query (CT)"

    def predict_requested(self, args):
        return args.query is not None

    def predict_line(self, predictor, args):
        if not args.query.split():
            raise ValueError("the query is empty")
        return self.bracket(predictor, args.query)


def _convert_bracketed(args) -> int:
    from alignlab.tasks import bracketed
    from alignlab.platform.tasks.task_files import TaskDataError

    try:
        n = bracketed.convert(args.src, args.dst, texts=args.texts)
    except TaskDataError as e:
        print("\n".join(e.problems))
        return 1
    print(f"{args.dst}: {n} CT examples")
    return 0

"""Compatibility re-exports of the task data modules, for callers not yet re-pointed.

File formats and validation live in platform/task_files.py, words and letters in platform/text.py,
CT in objectives/ct_data.py, AD in objectives/ad_data.py and objectives/ad_mining.py.
"""
# TODO(#16 merge): remove this module once callers import from the modules above (and the two task
# names below come from the task registry, platform/task.py).
from __future__ import annotations

from alignlab.objectives.ad_data import (AD_BUILDER_VERSION, AD_FORMAT, AD_MAX_LETTERS, AD_MIN_LETTERS, ADExample,
                                         ad_key, build_ad_dataset, defining_doc_ids, letters_only_ad_baseline,
                                         span_matcher_ad_baseline)
from alignlab.objectives.ad_mining import (ACRONYM_MINOR_WORDS, AcronymPair, find_acronym_pairs, is_initialism,
                                           matches_a_span, schwartz_hearst_long_form, split_sentences)
from alignlab.objectives.ct_data import (CT_FORMAT, CT_PATTERNS, PAPER_CT_TAG_FRACTIONS, STOPWORDS,
                                         TAGS_CONCEPT_FIRST, CTExample, build_ct_dataset, concept_tags,
                                         concepts_from_documents, content_words, ct_key, gazetteer_ct_baseline,
                                         gazetteer_tags, lexicon_ct_baseline, run_rule_ct_baseline, tag_fractions,
                                         tag_sequence_problems, title_words)
from alignlab.platform import task_files
from alignlab.platform.task_files import TaskDataError, majority_baseline, write_jsonl
from alignlab.platform.text import LETTERS, first_letters, occurs_as_word, words_of, words_with_spans

ALPHABET = LETTERS
TAGS = TAGS_CONCEPT_FIRST  # the order this module's TAGS always had
initials = first_letters
_matches_a_span = matches_a_span

_FORMATS = {"ct": CT_FORMAT, "ad": AD_FORMAT}
TASKS = tuple(_FORMATS)


def _format(task: str) -> task_files.TaskFormat:
    if task not in _FORMATS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return _FORMATS[task]


def validate_file(task: str, path) -> list[str]:
    return task_files.validate_file(_format(task), path)


def load_examples(task: str, path) -> list[CTExample] | list[ADExample]:
    return task_files.load_examples(_format(task), path)


def _either_key(obj: dict) -> tuple | None:
    # Without a task, a line is keyed by the shape it has, as before the split.
    for i, key in enumerate((ct_key, ad_key)):
        k = key(obj)
        if k is not None:
            return (i, k)
    return None


def check_disjoint(train_path, test_path) -> list[str]:
    return task_files.check_disjoint(_either_key, train_path, test_path)

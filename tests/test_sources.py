"""Corpus sources: exact rendering of wikitext and link spans, bundled link reconstruction, web text, errors."""
from __future__ import annotations

import bz2
import json
from xml.sax.saxutils import escape

import pytest

from alignlab.platform.sources.documents import CorpusInputError, Document, Link
from alignlab.platform.sources.sources import (build_title_matcher, iter_documents, link_density, read_bundled,
                                            reconstruct_links, surface_form)
from alignlab.platform.sources.text_files import read_web
from alignlab.platform.sources.wikidump import read_wikidump, wikitext_to_text

BRAZIL_WIKITEXT = """{{Infobox country|name={{lang|pt|Brasil}}|capital=[[Brasília]]}}
'''Brazil''' is a country whose largest city is [[São Paulo]].<ref>Census {{cite web|url=x}}</ref> Its capital is [[Brasília|the capital]]<ref name="b"/>.
[[File:Flag of Brazil.svg|thumb|The [[flag]] of Brazil]]
{| class="wikitable"
|-
| [[Rio de Janeiro]] || 6.7 million
|}

== History of [[Portugal|Portuguese]] rule ==
Brazil was a [[Portuguese Empire#Colonies|colony]] until [[1822]]. <!-- hidden --> See [https://example.org the census site].

[[Category:Countries]]
[[fr:Brésil]]
"""
BRAZIL_TEXT = (
    "Brazil is a country whose largest city is São Paulo. Its capital is the capital.\n\n"
    "History of Portuguese rule\n"
    "Brazil was a colony until 1822. See the census site."
)
BRAZIL_LINKS = [
    ("São Paulo", "São Paulo"),
    ("the capital", "Brasília"),
    ("Portuguese", "Portugal"),
    ("colony", "Portuguese Empire"),
    ("1822", "1822"),
]

SWISS_WIKITEXT = (
    "'''Switzerland''' has [[Zürich|Zürich]], [[lake_Geneva|Lake Geneva]] and [[tram]]s; its "
    "''[[Federal Council (Switzerland)|Federal Council]]'' meets in [[Bern]]."
)
SWISS_TEXT = "Switzerland has Zürich, Lake Geneva and trams; its Federal Council meets in Bern."
SWISS_LINKS = [
    ("Zürich", "Zürich"),
    ("Lake Geneva", "Lake Geneva"),
    ("tram", "Tram"),
    ("Federal Council", "Federal Council (Switzerland)"),
    ("Bern", "Bern"),
]


def page(page_id: int, title: str, wikitext: str, *, ns: int = 0, redirect: str | None = None) -> str:
    redirect_el = f'<redirect title="{escape(redirect)}" />' if redirect else ""
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n"
        f"    {redirect_el}\n    <revision>\n      <id>{page_id + 1000}</id>\n"
        f'      <text bytes="{len(wikitext)}" xml:space="preserve">{escape(wikitext)}</text>\n'
        "    </revision>\n  </page>\n"
    )


def dump_xml(pages: list[str], version: str = "0.11") -> str:
    return (
        f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-{version}/" version="{version}" xml:lang="en">\n'
        "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <namespaces>\n"
        '      <namespace key="0" case="first-letter" />\n'
        '      <namespace key="1" case="first-letter">Talk</namespace>\n'
        '      <namespace key="4" case="first-letter">Wikipedia</namespace>\n'
        '      <namespace key="6" case="first-letter">File</namespace>\n'
        '      <namespace key="14" case="first-letter">Category</namespace>\n'
        "    </namespaces>\n  </siteinfo>\n" + "".join(pages) + "</mediawiki>\n"
    )


SAMPLE_PAGES = [
    page(10, "Brazil", BRAZIL_WIKITEXT),
    page(11, "Brasil", "#REDIRECT [[Brazil]]", redirect="Brazil"),
    page(12, "Brazilië", "#redirect [[Brazil]]"),  # redirect known only from its text
    page(13, "Talk:Brazil", "Is [[Brazil]] big?", ns=1),
    page(14, "Wikipedia:About", "About [[Wikipedia]].", ns=4),
    page(15, "Ambiguous", "{{Disambiguation}}<!-- nothing left -->"),
    page(16, "Switzerland", SWISS_WIKITEXT),
]


def write_dump(tmp_path, name: str, xml: str) -> str:
    data = xml.encode("utf-8")
    path = tmp_path / name
    path.write_bytes(bz2.compress(data) if name.endswith(".bz2") else data)
    return path


def spans(doc: Document) -> list[tuple[str, str]]:
    return [(doc.text[link.start : link.end], link.target) for link in doc.links]


# ---- MediaWiki dumps ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "version"), [("tiny-pages-articles.xml", "0.10"), ("tiny-pages-articles.xml.bz2", "0.11")]
)
def test_dump_yields_only_rendered_articles_with_exact_text_and_links(tmp_path, name, version):
    path = write_dump(tmp_path, name, dump_xml(SAMPLE_PAGES, version))
    docs = list(read_wikidump(path, lang="pt"))
    assert [d.doc_id for d in docs] == ["wikidump:10", "wikidump:16"]
    brazil, swiss = docs
    assert (brazil.title, brazil.lang, brazil.kind) == ("Brazil", "pt", "wiki")
    assert brazil.text == BRAZIL_TEXT
    assert spans(brazil) == BRAZIL_LINKS
    assert swiss.text == SWISS_TEXT
    assert spans(swiss) == SWISS_LINKS


def test_piped_link_keeps_anchor_text_and_points_at_target():
    text, links = wikitext_to_text("See [[Portuguese Empire#Colonies|the colonies]] now.")
    assert text == "See the colonies now."
    assert links == (Link(4, 16, "Portuguese Empire"),)


def test_unpiped_link_is_its_title_and_target_gets_capital_and_spaces():
    text, links = wikitext_to_text("A [[new_york|]] and [[são_Paulo]] and [[2001: A Space Odyssey]].")
    assert text == "A and são Paulo and 2001: A Space Odyssey."
    assert links == (Link(6, 15, "São Paulo"), Link(20, 41, "2001: A Space Odyssey"))


def test_non_article_links_keep_text_but_media_category_and_interlanguage_links_vanish():
    wikitext = (
        "[[Image:a.png|left|cap]]x [[Help:Editing|help page]] [[wikt:word|word]] [[:Category:Cats|cats]] "
        "[[:fr:Paris|Paris]] [[de:Berlin]] [[Category:Y]]"
    )
    assert wikitext_to_text(wikitext) == ("x help page word cats Paris", ())


def test_dump_siteinfo_localised_namespaces_are_honoured(tmp_path):
    # German names are not among the built-in defaults: only the dump's <siteinfo> can tell.
    xml = dump_xml([page(1, "Peru", "[[Datei:a.jpg|mini|x]][[Kategorie:Staat]]Ein [[Staat]] in [[Südamerika]].")])
    xml = xml.replace(">File<", ">Datei<").replace(">Category<", ">Kategorie<")
    (doc,) = read_wikidump(write_dump(tmp_path, "dewiki-pages-articles.xml", xml), lang="de")
    assert doc.text == "Ein Staat in Südamerika."
    assert spans(doc) == [("Staat", "Staat"), ("Südamerika", "Südamerika")]


def test_headings_lists_and_entities_become_plain_lines():
    wikitext = "Intro&nbsp;text &amp; more.\n\n=== Part ===\n* one\n* ''two''\n__NOTOC__<math>x^2</math>"
    assert wikitext_to_text(wikitext) == ("Intro text & more.\n\nPart\none\ntwo", ())


def test_streaming_reader_yields_before_reaching_a_later_parse_error(tmp_path):
    xml = dump_xml(SAMPLE_PAGES)
    path = write_dump(tmp_path, "broken.xml", xml[: xml.index(SAMPLE_PAGES[-1])] + "  <page><ti")
    docs = read_wikidump(path)
    assert next(docs).doc_id == "wikidump:10"
    with pytest.raises(CorpusInputError):
        list(docs)


# ---- dump errors --------------------------------------------------------------------------


def test_missing_dump_names_the_path(tmp_path):
    with pytest.raises(CorpusInputError, match=r"nowhere\.xml\.bz2: no such file"):
        list(read_wikidump(tmp_path / "nowhere.xml.bz2"))


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_corrupt_bz2_dump_says_corrupt_bz2(tmp_path, damage):
    data = bz2.compress(dump_xml(SAMPLE_PAGES * 20).encode())
    if damage == "flipped":
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 16]) + data[middle + 16 :]
    else:
        data = data[: len(data) // 2]
    path = tmp_path / "enwiki-pages-articles.xml.bz2"
    path.write_bytes(data)
    with pytest.raises(CorpusInputError, match=r"enwiki-pages-articles\.xml\.bz2: corrupt bz2") as err:
        list(read_wikidump(path))
    assert err.value.path == str(path)


def test_truncated_dump_reports_the_line(tmp_path):
    xml = dump_xml(SAMPLE_PAGES)
    cut = xml[: xml.index("</mediawiki>")]
    path = write_dump(tmp_path, "cut.xml", cut)
    with pytest.raises(CorpusInputError, match="malformed or truncated XML: no element found") as err:
        list(read_wikidump(path))
    assert err.value.where == f"line {cut.count(chr(10)) + 1}"
    assert "cut.xml:line" in str(err.value)


def test_malformed_dump_reports_the_line_of_the_bad_token(tmp_path):
    xml = dump_xml(SAMPLE_PAGES).replace("<title>Switzerland</title>", "<title>Swiss & Co</title>")
    path = write_dump(tmp_path, "bad.xml", xml)
    bad_line = xml[: xml.index("Swiss & Co")].count("\n") + 1
    with pytest.raises(CorpusInputError, match=r"bad\.xml:line \d+: malformed or truncated XML: not well-formed") as e:
        list(read_wikidump(path))
    assert e.value.where == f"line {bad_line}"


@pytest.mark.parametrize("name", ["latin1.xml", "latin1.xml.bz2"])
def test_non_utf8_dump_names_file_line_and_byte(tmp_path, name):
    data = dump_xml(SAMPLE_PAGES).encode("utf-8").replace("Zürich|Zürich".encode(), b"Z\xfcrich|Z\xfcrich")
    offset = data.index(b"\xfc")
    path = tmp_path / name
    path.write_bytes(bz2.compress(data) if name.endswith(".bz2") else data)
    with pytest.raises(CorpusInputError, match=rf"{name.replace('.', '[.]')}:line \d+: not valid UTF-8") as err:
        list(read_wikidump(path))
    bad_line = data[:offset].count(b"\n") + 1
    assert err.value.where == f"line {bad_line}"
    assert f"byte offset {offset}" in err.value.cause


def test_xml_that_is_not_a_mediawiki_export_is_rejected(tmp_path):
    path = write_dump(tmp_path, "rss.xml", "<rss><channel/></rss>")
    with pytest.raises(CorpusInputError, match="not a MediaWiki export"):
        list(read_wikidump(path))


# ---- bundled summaries and link reconstruction ----------------------------------------------


def test_longest_title_wins_at_a_position():
    matcher = build_title_matcher(["New York", "New York City"])
    text = "I moved to New York City from New York."
    assert reconstruct_links(text, matcher) == (Link(11, 24, "New York City"), Link(30, 38, "New York"))


def test_titles_match_whole_words_only_and_case_sensitively():
    matcher = build_title_matcher(["Rome", "Zürich", "São Paulo"])
    text = "Romeo left rome for Rome, Zürichsee and São Paulo's Zürich."
    found = [(text[link.start : link.end], link.target) for link in reconstruct_links(text, matcher)]
    assert found == [("Rome", "Rome"), ("São Paulo", "São Paulo"), ("Zürich", "Zürich")]


def test_qualifier_is_dropped_from_the_surface_but_kept_in_the_target():
    assert surface_form("Metropolis (1927 film)") == "Metropolis"
    matcher = build_title_matcher(["Metropolis (1927 film)"])
    assert reconstruct_links("Metropolis was silent.", matcher) == (Link(0, 10, "Metropolis (1927 film)"),)


def test_ambiguous_surface_links_only_to_an_unqualified_title():
    qualified = ["Mercury (planet)", "Mercury (element)"]
    assert reconstruct_links("Mercury is hot.", build_title_matcher(qualified)) == ()
    with_plain = build_title_matcher([*qualified, "Mercury"])
    assert reconstruct_links("Mercury is hot.", with_plain) == (Link(0, 7, "Mercury"),)


def test_own_title_is_never_linked_and_blocks_shorter_titles_inside_it():
    matcher = build_title_matcher(["New York", "New York City", "Hudson River"])
    text = "New York City lies on the Hudson River in New York."
    links = reconstruct_links(text, matcher, exclude=["New York City"])
    assert [(text[link.start : link.end], link.target) for link in links] == [
        ("Hudson River", "Hudson River"),
        ("New York", "New York"),
    ]


def test_short_and_numeric_titles_are_ignored_and_aliases_link_to_their_title():
    matcher = build_title_matcher(
        ["Ur", "1984", "Pi (letter)", "Charles Chaplin"], aliases={"Charlie Chaplin": "Charles Chaplin"}
    )
    text = "Ur in 1984: Pi and Charlie Chaplin."
    assert reconstruct_links(text, matcher) == (Link(19, 34, "Charles Chaplin"),)


def test_link_density_counts_words_touching_a_link():
    docs = [
        Document("a", "a bb, c d", kind="wiki", links=(Link(2, 4, "Bb"),)),
        Document("b", "e f g h", kind="web"),
    ]
    assert link_density(docs) == pytest.approx(1 / 8)
    assert link_density([]) == 0.0


@pytest.fixture(scope="module")
def bundled_en() -> list[Document]:
    return list(read_bundled(["en"]))


def test_bundled_english_has_sorted_wiki_documents_with_stable_ids(bundled_en):
    head = list(read_bundled(["en"], max_docs_per_lang=25))
    assert head == bundled_en[:25]
    titles = [d.title for d in bundled_en]
    assert titles == sorted(titles) and len(set(titles)) == len(titles) > 5000
    for doc in head:
        assert (doc.lang, doc.kind) == ("en", "wiki")
        assert doc.doc_id == f"bundled:en:{doc.title}"
        assert doc.text and doc.text == doc.text.strip()


def test_bundled_links_are_other_articles_titles_written_without_qualifier(bundled_en):
    titles = {d.title for d in bundled_en}
    num_links = 0
    for doc in bundled_en:
        for link in doc.links:
            anchor = doc.text[link.start : link.end]
            assert link.target in titles and link.target != doc.title
            assert anchor == surface_form(link.target) != surface_form(doc.title)
            num_links += 1
    assert num_links > len(bundled_en)
    assert link_density(bundled_en) > 0.01


def test_bundled_languages_come_in_sorted_order_and_unknown_ones_are_refused():
    docs = list(read_bundled(["fr", "es"], max_docs_per_lang=3))
    assert [d.lang for d in docs] == ["es"] * 3 + ["fr"] * 3
    assert all(d.doc_id.startswith(f"bundled:{d.lang}:") for d in docs)
    with pytest.raises(ValueError, match="'de'"):
        list(read_bundled(["de"]))


# ---- web text -----------------------------------------------------------------------------


def test_text_files_give_one_document_per_blank_line_separated_block(tmp_path):
    (tmp_path / "notes.txt").write_text("First para\nstill first.\n\n\n  \nSecond one.\n", encoding="utf-8")
    docs = list(read_web([tmp_path / "notes.txt"]))
    assert [(d.doc_id, d.text, d.kind, d.lang, d.links) for d in docs] == [
        ("web:notes.txt:1", "First para\nstill first.", "web", "und", ()),
        ("web:notes.txt:6", "Second one.", "web", "und", ()),
    ]


def test_jsonl_lines_give_documents_with_optional_lang_and_id(tmp_path):
    lines = [{"text": "Hola mundo.", "lang": "es", "id": "x1"}, {}, {"text": "   "}, {"text": "Plain."}]
    body = "\n".join("" if not obj else json.dumps(obj) for obj in lines) + "\n"
    (tmp_path / "crawl.jsonl").write_text(body, encoding="utf-8")
    docs = list(read_web([tmp_path / "crawl.jsonl"]))
    assert [(d.doc_id, d.text, d.lang, d.title) for d in docs] == [
        ("web:crawl.jsonl:1", "Hola mundo.", "es", "x1"),
        ("web:crawl.jsonl:4", "Plain.", "und", ""),
    ]


def test_a_directory_means_its_text_and_jsonl_files_in_name_order(tmp_path):
    (tmp_path / "b.txt").write_text("bee\n")
    (tmp_path / "a.jsonl").write_text('{"text": "ay"}\n')
    (tmp_path / "c.csv").write_text("ignored\n")
    assert [d.doc_id for d in read_web([tmp_path])] == ["web:a.jsonl:1", "web:b.txt:1"]


@pytest.mark.parametrize(
    ("line", "cause"),
    [('{"id": 3}', 'string "text" field'), ('{"text": 5}', 'string "text" field'), ("{not json", "not valid JSON")],
)
def test_bad_jsonl_line_is_reported_with_its_number(tmp_path, line, cause):
    (tmp_path / "crawl.jsonl").write_text('{"text": "ok"}\n\n' + line + "\n")
    with pytest.raises(CorpusInputError, match=r"crawl\.jsonl:line 3: ") as err:
        list(read_web([tmp_path / "crawl.jsonl"]))
    assert cause in err.value.cause


def test_non_utf8_web_file_is_reported_with_its_line(tmp_path):
    (tmp_path / "old.txt").write_bytes(b"fine\n\ncaf\xe9 au lait\n")
    with pytest.raises(CorpusInputError, match=r"old\.txt:line 3: not valid UTF-8"):
        list(read_web([tmp_path / "old.txt"]))


def test_unknown_extension_and_missing_web_file_are_refused(tmp_path):
    (tmp_path / "table.csv").write_text("a,b\n")
    with pytest.raises(CorpusInputError, match=r"table\.csv: unknown file extension '\.csv'"):
        list(read_web([tmp_path / "table.csv"]))
    with pytest.raises(CorpusInputError, match=r"gone\.jsonl: no such file"):
        list(read_web([tmp_path / "gone.jsonl"]))


# ---- dispatch -----------------------------------------------------------------------------


def test_iter_documents_reads_dumps_with_language_from_file_name_and_caps_per_language(tmp_path):
    path = write_dump(tmp_path, "frwiki-20240601-pages-articles.xml.bz2", dump_xml(SAMPLE_PAGES))
    docs = list(iter_documents("wikidump", [path], max_docs_per_lang=1))
    assert [(d.doc_id, d.lang) for d in docs] == [("wikidump:10", "fr")]
    assert [d.lang for d in iter_documents("wikidump", [path], langs=("es",))] == ["fr", "fr"]


def test_iter_documents_checks_every_path_before_reading(tmp_path):
    (tmp_path / "ok.txt").write_text("hello\n")
    docs = iter_documents("web", [tmp_path / "ok.txt", tmp_path / "missing.txt"])
    with pytest.raises(CorpusInputError, match=r"missing\.txt: no such file"):
        next(docs)


def test_iter_documents_refuses_unknown_sources_and_missing_or_extra_paths(tmp_path):
    with pytest.raises(ValueError, match="unknown corpus source 'books'"):
        list(iter_documents("books"))
    with pytest.raises(ValueError, match="needs at least one path"):
        list(iter_documents("wikidump"))
    with pytest.raises(ValueError, match="reads no files"):
        list(iter_documents("bundled", [tmp_path]))
    bundled = list(iter_documents("bundled", langs=("es",), max_docs_per_lang=2))
    assert [d.doc_id.split(":")[1] for d in bundled] == ["es", "es"]

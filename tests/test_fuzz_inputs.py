"""Bad input, generated: every input reader fed hypothesis's inputs either reads them or refuses them with its
documented error, naming the file (and the line or record where it has one), and leaves nothing half-written.
Derandomized (the same examples on every run) and without an example database, a few seconds each."""
from __future__ import annotations

import argparse
import bz2
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sources import dump_xml, page

from alignlab.platform.sources.documents import CorpusInputError

FUZZ = settings(max_examples=60, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


@st.composite
def damaged(draw, good: bytes) -> bytes:
    """`good` cut short, with bytes replaced or inserted, or left whole."""
    data = bytearray(good)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["cut", "replace", "insert"]))
        if how == "cut":
            del data[at:]
        elif how == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
    return bytes(data)


# ---- MediaWiki dumps ------------------------------------------------------------------------------------------------

GOOD_DUMP = dump_xml([page(1, "Alpha", "'''Alpha''' is a [[Beta|letter]].\n\n== History ==\nOld."),
                      page(2, "Beta", "{{Infobox|x=1}} Beta [[Category:Letters]] text.")])


@FUZZ
@given(xml=damaged(GOOD_DUMP.encode()), text=st.text(max_size=40), bz=st.booleans())
def test_a_damaged_or_generated_mediawiki_dump_is_read_or_refused_naming_the_file_and_line(tmp_path_factory, xml,
                                                                                          text, bz):
    from alignlab.platform.sources.wikidump import read_wikidump

    path = tmp_path_factory.mktemp("dump") / ("dump.xml.bz2" if bz else "dump.xml")
    body = xml.replace(b"Old.", text.encode("utf-8", "surrogatepass"))
    path.write_bytes(bz2.compress(body) if bz else body)
    try:
        docs = list(read_wikidump(path))
    except CorpusInputError as e:
        assert str(e).startswith(f"{path}") and e.cause, str(e)
        return
    assert all(d.doc_id.startswith("wikidump:") for d in docs)


# ---- task files of the three kinds ----------------------------------------------------------------------------------

def _line(kind: str):
    fields = {"tagging": {"tokens": st.lists(st.text(max_size=6), max_size=4) | JSON,
                          "tags": st.lists(st.sampled_from(["O", "B-X", "I-X", "E-X", "S-X", "x"]), max_size=4) | JSON},
              "sequence": {"text": st.text(max_size=20) | JSON, "label": st.text(max_size=4) | JSON},
              "pair": {"text_a": st.text(max_size=20) | JSON, "text_b": st.text(max_size=20) | JSON,
                       "label": st.text(max_size=4) | JSON}}[kind]
    record = st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d).encode())
    raw = st.binary(max_size=30) | JSON.map(lambda v: json.dumps(v).encode())
    return st.one_of(record, record, raw).map(lambda b: b.replace(b"\n", b" "))


@pytest.mark.parametrize("kind", ["tagging", "sequence", "pair"])
def test_a_generated_task_file_of_each_kind_is_read_or_refused_naming_the_file_and_line(tmp_path, kind):
    from alignlab.platform.tasks.task_files import TaskDataError, load_examples
    from alignlab.platform.tasks.task_kind_data import FORMATS

    @FUZZ
    @given(lines=st.lists(_line(kind), max_size=6))
    def check(lines):
        path = tmp_path / f"{kind}.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            examples = load_examples(FORMATS[kind], path)
        except TaskDataError as e:
            assert e.problems and all(p.startswith(f"{path}:") for p in e.problems), e.problems
            return
        assert len(examples) == sum(1 for line in lines if line.strip())

    check()


# ---- corpus specs (the command line's --source groups) --------------------------------------------------------------

FLAG = st.one_of(
    st.tuples(st.just("--source"), st.sampled_from(["bundled", "wikidump", "web", "software", "nope", ""])),
    st.tuples(st.just("--path"), st.text(max_size=10)),
    st.tuples(st.just("--lang"), st.sampled_from(["en", "es", "", "xx-long", "und"]) | st.text(max_size=4)),
    st.tuples(st.just("--max-non-english-share"), st.sampled_from(["0.2", "-1", "nan", "x", "1e9"])),
    st.tuples(st.just("--tokenizer-sources"), st.sampled_from(["bundled", "web,bundled", "", "nope", "web,web"])),
    st.tuples(st.just("--vocab-size"), st.sampled_from(["8", "0", "-3", "4000", "x"])),
)


@FUZZ
@given(flags=st.lists(FLAG, max_size=6))
def test_generated_corpus_source_flags_are_read_or_refused_in_one_line(flags, capsys):
    from alignlab.platform.corpus.corpus_flags import add_corpus_arguments, corpus_from_args
    from alignlab.platform.presets import Preset
    from alignlab.platform.runtime.errors import Parser

    parser = Parser(prog="alignlab corpus")
    add_corpus_arguments(parser)
    argv = [x for flag in flags for x in flag]
    try:
        args = parser.parse_args(argv)
        corpus_from_args(Preset.named("smoke").corpus, args)
    except SystemExit as e:  # argparse's `PROG: error: ...` and exit 2
        assert e.code == 2 and "error:" in capsys.readouterr().err
    except ValueError as e:
        assert str(e) and "\n" not in str(e).strip(), str(e)


# ---- trial files ----------------------------------------------------------------------------------------------------

TRIAL = json.dumps({"calc_id": "c1", "status": "ok", "ct/accuracy": 0.5}).encode()


@FUZZ
@given(data=damaged(TRIAL) | st.binary(max_size=20))
def test_a_damaged_trial_file_is_read_as_a_row_or_refused_naming_it(tmp_path_factory, data):
    from alignlab.platform.fel.trial_files import DamagedTrialFile, read_trial

    path = tmp_path_factory.mktemp("trials") / "c1.json"
    path.write_bytes(data)
    try:
        row = read_trial(path)
    except DamagedTrialFile as e:
        assert str(e).startswith(f"{path}: trial file "), str(e)
        return
    assert isinstance(row, dict)

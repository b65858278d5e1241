"""Your own corpus: a folder of text, JSONL and parquet documents (`--source web --path DIR`), with optional link
spans that make a document linked (WHP and PAD label it as they label Wikipedia's links)."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from alignlab.platform.sources.documents import CorpusInputError, Link
from alignlab.platform.sources.text_files import read_web


def test_a_folder_of_text_jsonl_and_parquet_documents_is_read_with_its_link_spans(tmp_path):
    (tmp_path / "a.txt").write_text("first plain document\n\nsecond plain document\n")
    text = "  Ray Tune runs Optuna searches on a cluster"
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": text, "links": [[2, 10, "Ray (software)"], [16, 22, "Optuna"]]})
                                      + "\n" + json.dumps({"text": "no links here", "lang": "en"}) + "\n")
    pq.write_table(pa.table({"text": ["PyTorch trains models", "plain row"],
                             "links": [[{"start": 0, "end": 7, "target": "PyTorch"}], None], "id": ["p1", "p2"]}), tmp_path / "c.parquet")
    docs = list(read_web([tmp_path], lang="en"))
    assert [d.doc_id for d in docs] == ["web:a.txt:1", "web:a.txt:3", "web:b.jsonl:1", "web:b.jsonl:2",
                                        "web:c.parquet:1", "web:c.parquet:2"]
    linked = docs[2]
    assert linked.kind == "wiki" and linked.links == (Link(0, 8, "Ray (software)"), Link(14, 20, "Optuna"))
    assert [linked.text[lk.start: lk.end] for lk in linked.links] == ["Ray Tune", "Optuna"]
    assert docs[3].kind == "web" and docs[3].lang == "en"
    assert docs[4].kind == "wiki" and docs[4].links == (Link(0, 7, "PyTorch"),) and docs[4].title == "p1"
    assert docs[5].kind == "web" and docs[0].kind == "web"


@pytest.mark.parametrize("links, cause", [([[5, 3, "X"]], '"links"[0] [5, 3, \'X\'] is empty'),
                                          ([[0, 4, "A"], [2, 6, "B"]], '"links"[1] [2, 6, \'B\']'),
                                          ([[0, 4]], '"links"[0] must be [start, end, target title]')])
def test_a_bad_link_span_is_refused_naming_file_line_and_span(tmp_path, links, cause):
    f = tmp_path / "docs.jsonl"
    f.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "some linked text", "links": links}) + "\n")
    with pytest.raises(CorpusInputError) as e:
        list(read_web([f]))
    assert str(e.value).startswith(f"{f}:line 2: ") and cause.replace("'", '"').split(" ")[0] in str(e.value)


def test_a_parquet_file_without_a_text_column_is_refused_by_name(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(CorpusInputError, match=r'd.parquet: no "text" column \(columns: body\)'):
        list(read_web([tmp_path / "d.parquet"]))

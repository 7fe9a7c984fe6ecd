"""Ids that lie on screen: a paper id holding a bidirectional or invisible format character (Unicode Cf: U+202E shows
`sec4-\\u202e54321` as `sec4-12345`, another paper's id; U+200B is not seen at all) is refused by every reader and by
POST /papers, the record named (file:line, the id's field, the character); a DOI holding one names no work; and text
a terminal shows (list, show, --json) has such characters written out (`\\u202e`), not drawn. Real files in each
input format, a real index, the real CLI on a pty, a real server on 127.0.0.1."""
from __future__ import annotations

import json
import re
import sys
import unicodedata

import httpx
import pytest

import esqbe
from esqbe.core.textsafe import FORMAT_CHARS, NOT_IN_ID, printable, printable_tree
from esqbe.core.workids import identifier_keys, work_keys
from esqbe.ingest.readers import ReadReport, read_papers

from .conftest import LiveServer
from .test_hostile_terminal import _assert_nothing_obeyed, _on_pty
from .test_storage import _papers, _parquet

_ABSTRACT = "We study things with a new method. It works well on two tasks."
#: the right-to-left override, zero-width space, right-to-left isolate, byte-order mark, a tag, a soft hyphen, ZWJ
_LYING = ("sec4-\u202e54321", "a\u200bb", "c\u2067d\u2069", "\ufeffe", "f\U000e0041", "g\u00adh", "i\u200dj")
_FORMAT = re.compile(f"[{FORMAT_CHARS}]")


@pytest.mark.parametrize("name, text, field, bad_lines", [
    ("ids.jsonl", "".join(json.dumps({"id": pid, "title": "T", "abstract": _ABSTRACT}) + "\n"
                          for pid in ("ok-1", *_LYING, "ok-2")), "id", list(range(2, 2 + len(_LYING)))),
    ("ids.csabstruct.jsonl", "".join(json.dumps({"paper_id": pid, "sentences": ["We study things.", "It works."],
                                                 "labels": ["background", "result"]}) + "\n"
                                     for pid in ("ok-1", "x\u202ey", "ok-2")), "paper_id", [2]),
    ("ids.json", json.dumps([{"id": pid, "type": "article-journal", "title": "T", "abstract": _ABSTRACT}
                             for pid in ("ok-1", "x\u202ey", "ok-2")]), "id", None),
    ("ids.bib", f"@article{{ok-1, title={{T}}, abstract={{{_ABSTRACT}}}}}\n\n"
                f"@article{{x\u2066y, title={{T}}, abstract={{{_ABSTRACT}}}}}\n\n"
                f"@article{{ok-2, title={{T}}, abstract={{{_ABSTRACT}}}}}\n", "key", [3]),
    ("ids.ris", f"TY  - JOUR\nID  - ok-1\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n\n"
                f"TY  - JOUR\nID  - x\u200by\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n\n"
                f"TY  - JOUR\nID  - ok-2\nTI  - T\nAB  - {_ABSTRACT}\nER  - \n", "ID", [7]),
    ("ids.openalex.jsonl", "".join(json.dumps({"id": pid, "display_name": "T", "publication_year": 2020,
                                               "abstract_inverted_index": {"We": [0], "study.": [1]}}) + "\n"
                                   for pid in ("https://openalex.org/W1", "https://openalex.org/W2\u202e",
                                               "https://openalex.org/W3")), "id", [2]),
])
def test_every_reader_refuses_format_characters_in_ids(tmp_path, name, text, field, bad_lines):
    """Each lying id is its own error (file:line, the id's field as the format names it, the character by code point
    and name) and the good records around it are read."""
    path = tmp_path / name
    path.write_text(text)
    report = ReadReport()
    papers = list(read_papers(path, None, report=report))
    assert len(papers) == 2 and not any(NOT_IN_ID.search(p.paper_id) for p in papers), [str(e) for e in report.errors]
    errors = report.errors
    assert errors and all(e.field == field and e.source == str(path) for e in errors), [str(e) for e in errors]
    assert all("format character U+" in e.reason and "an id reads as it is typed" in e.reason for e in errors)
    if bad_lines is not None:
        assert [e.line for e in errors] == bad_lines
    if name == "ids.jsonl":
        assert [e.reason.split()[5] for e in errors] == ["U+202E", "U+200B", "U+2067", "U+FEFF", "U+E0041", "U+00AD",
                                                         "U+200D"]
        assert str(errors[0]) == (f"{path}:2: id: invisible or bidirectional format character U+202E "
                                  "(RIGHT-TO-LEFT OVERRIDE) at position 5; an id reads as it is typed")


def test_parquet_and_the_python_api_refuse_them_too(tmp_path):
    """Pre-encoded Parquet (read without a model) and a paper handed to the backend: the same check, as paper_id."""
    papers = _papers(3)
    papers[1].paper.paper_id = "p\u202e1"
    index = esqbe.open_index(str(tmp_path / "ix"))
    report = index.index_files([str(_parquet(tmp_path / "x.parquet", papers))])
    assert report.indexed == 2 and len(report.errors) == 1, report.summary()
    assert "paper_id: invisible or bidirectional format character U+202E" in str(report.errors[0])
    result = index.backend.upsert([papers[1]])
    assert result.added == 0 and len(result.errors) == 1
    assert result.errors[0].startswith("p\u202e1: paper_id: invisible or bidirectional format character U+202E")
    assert sorted(index.backend.paper_ids()) == ["p000000", "p000002"]
    index.close()


def test_post_papers_refuses_a_format_character_in_an_id(tmp_path, encoder):
    """The HTTP path: the lying record is a per-record error naming its id field and the character; the rest indexed."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    app = create_app(str(tmp_path / "ix"), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        records = [{"id": "sec4-12345", "title": "T", "abstract": _ABSTRACT},
                   {"id": "sec4-\u202e54321", "title": "T", "abstract": _ABSTRACT}]
        r = httpx.post(url + "/papers", json={"records": records}, timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["indexed"] == 1, body
        [bad] = [o for o in body["records"] if o["status"] == "error"]
        assert bad["record"] == 1 and bad["field"] == "id" and "U+202E (RIGHT-TO-LEFT OVERRIDE)" in bad["reason"], bad
        assert httpx.get(url + "/papers/sec4-12345", timeout=60).status_code == 200


def test_an_identifier_holding_a_format_character_names_no_work():
    assert work_keys({"external_ids": {"doi": "10.1000/abc", "arxiv": "1706.03762"}}) == ["doi:10.1000/abc",
                                                                                          "arxiv:1706.03762"]
    assert work_keys({"external_ids": {"doi": "10.1000/\u202ecba", "arxiv": "1706.0376\u200b2"}}) == []
    assert identifier_keys("10.1000/\u202ecba") == [] and identifier_keys("10.1000/abc") == ["doi:10.1000/abc"]


@pytest.fixture(scope="module")
def lying_titles(tmp_path_factory, encoder):
    """A real index (an id read from the screen must be the id): a title with U+202E, a sentence with U+200B and
    U+2067, a metadata value with U+FEFF, as an index an older esqbe filled may hold them."""
    path = tmp_path_factory.mktemp("lying") / "ix"
    src = path.parent / "papers.jsonl"
    src.write_text(json.dumps({"id": "sec4-12345", "title": "Results \u202e54321 of the study",
                               "abstract": ["We study things \u200bwith a \u2067new\u2069 method.", "It works well."],
                               "metadata": {"venue": "\ufeffVenue"}}) + "\n")
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 1
    return path


@pytest.mark.parametrize("args", [("list",), ("show", "sec4-12345"), ("show", "sec4-12345", "--json")])
def test_a_terminal_shows_format_characters_written_out(lying_titles, args):
    rc, text = _on_pty(args[0], "--path", lying_titles, *args[1:])
    assert rc == 0, text
    found = _FORMAT.search(text)
    assert found is None, f"U+{ord(found.group()):04X} reached the terminal: {text!r}"
    _assert_nothing_obeyed(text.replace("\n", ""))
    if "--json" in args:
        got = json.loads(text)
        assert got["title"] == "Results \u202e54321 of the study"  # the same JSON: the value is kept as given
        assert got["sentences"][0]["text"] == "We study things \u200bwith a \u2067new\u2069 method."
    else:
        assert "Results \\u202e54321 of the study" in text
    if args[0] == "show" and "--json" not in args:
        assert "We study things \\u200bwith a \\u2067new\\u2069 method." in text and "\\ufeffVenue" in text


def test_printable_writes_format_characters_out():
    assert printable("sec4-\u202e54321 a\u200bb \U000e0041 \u00ad") == "sec4-\\u202e54321 a\\u200bb \\U000e0041 \\xad"
    assert printable("x\u2067y\n", newlines=True) == "x\\u2067y\n"
    assert printable("Müller — ok ✓ 漢字 مرحبا") == "Müller — ok ✓ 漢字 مرحبا"  # letters of any script are letters
    assert printable_tree({"k\u202e": ["v\ufeff"]}) == {"k\\u202e": ["v\\ufeff"]}


def test_the_format_characters_are_unicodes_category_cf():
    """FORMAT_CHARS holds every character the running Python's Unicode database calls Cf (a newer database may add
    some: this test names them), and nothing that is a letter, a mark, a number, punctuation or a symbol."""
    fmt = re.compile(f"[{FORMAT_CHARS}]")
    missing = [f"U+{c:04X}" for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"
               and not fmt.match(chr(c))]
    assert not missing, f"Cf characters FORMAT_CHARS lacks (Unicode {unicodedata.unidata_version}): {missing}"
    listed = [c for c in range(sys.maxunicode + 1) if fmt.match(chr(c))]
    assert {unicodedata.category(chr(c)) for c in listed} <= {"Cf", "Cn"}
    assert all(NOT_IN_ID.match(chr(c)) for c in listed)

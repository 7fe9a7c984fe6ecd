"""Exports that round-trip: a real index of a researcher's library (BibTeX, RIS, CSL-JSON, arXiv,
OpenAlex records) exported by `esqbe query --format` as BibTeX, RIS, CSL-JSON and CSV; bibtexparser, rispy and the
citation-style-language JSON schema (tests/specs/csl-data.json) accept the files, and each of the three reference
formats indexed again gives the same papers: ids (the citation keys they came with), titles, abstracts, authors,
years, venues and DOIs, and the entry type the paper came with where the export is its source's format. (CSV is
no input format of esqbe: its cells are compared with the index instead.)"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import bibtexparser
import pytest
import rispy
from bibtexparser.middlewares import LatexDecodingMiddleware
from click.testing import CliRunner

import esqbe
from cli import main

from .conftest import REPO

DATA = REPO / "tests" / "data" / "library"
SPEC = REPO / "tests" / "specs" / "csl-data.json"

OWN_BIB = r"""@inproceedings{garcia2021asr,
  title = {Streaming {ASR} for Gal{\'i}cian with {BERT}-based Rescoring},
  author = {Garc{\'i}a-Mateo, Carmen and van der Maaten, Laurens},
  booktitle = {Proceedings of Interspeech},
  year = {2021},
  pages = {101--105},
  doi = {10.21437/Interspeech.2021-7},
  abstract = {We build a streaming speech recogniser for Galician. It rescores hypotheses with a BERT model trained on 50\% more text. Word error rates fall by 8\% relative on two test sets.}
}

@phdthesis{roe2019thesis,
  title = {Learning to Rank Scientific Papers},
  author = {Roe, Richard},
  school = {University of Somewhere},
  year = {2019},
  abstract = {This thesis studies ranking of papers by their aspects. We propose faceted similarity. It works on three collections.}
}
"""
OWN_RIS = """TY  - CONF
ID  - smith2020conf
TI  - Contrastive Learning of Table Encoders
AU  - Smith, Jane
AU  - Doe, John
PY  - 2020
T2  - Proceedings of ACL
DO  - 10.18653/v1/2020.acl-main.1
AB  - Table question answering needs labelled data. We pre-train a table encoder with a contrastive loss. It answers eight percent more questions.
ER  -
"""
QUERY = {"id": "the-query", "title": "Ranking papers by aspect", "abstract": "We rank scientific papers by their "
         "method. A contrastive encoder scores sentence pairs. It beats BM25 on three collections."}


@pytest.fixture(scope="module")
def library(tmp_path_factory, encoder):
    """(the index's directory, the papers it holds but the query paper: id -> Paper)."""
    root = tmp_path_factory.mktemp("roundtrip")
    (root / "own.bib").write_text(OWN_BIB)
    (root / "own.ris").write_text(OWN_RIS)
    (root / "query.jsonl").write_text(json.dumps(QUERY) + "\n")
    sources = [DATA / "zotero.bib", DATA / "zotero.ris", DATA / "zotero-csl.json", DATA / "arxiv-snapshot.jsonl",
               DATA / "openalex-works.jsonl", root / "own.bib", root / "own.ris", root / "query.jsonl"]
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(s) for s in sources])
        assert report.stored == 9, report.summary()  # 8 of the library and the query paper
        papers = index.get(sorted(index.backend.paper_ids()))
    papers.pop("the-query")
    return root / "ix", papers


def _export(ix, fmt, *extra) -> str:
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "the-query", "-k", "100", "--format", fmt,
                                  "--no-server", *extra], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout


def _described(paper) -> dict:
    """What must survive the round trip, as the index holds it."""
    meta = paper.metadata or {}
    return {"title": " ".join(paper.title.split()), "abstract": " ".join(" ".join(paper.sentences).split()),
            "authors": [a["name"] for a in meta.get("authors") or []], "year": meta.get("year"),
            "venue": meta.get("venue") or None, "doi": (meta.get("external_ids") or {}).get("doi")}


def _reindexed(tmp_path, encoder, name, text) -> dict:
    path = tmp_path / name
    path.write_text(text)
    with esqbe.open_index(str(tmp_path / f"ix-{name}"), encoder=encoder, config=None) as index:
        report = index.index_files([str(path)])
        assert not report.errors and not report.skipped, report.summary()
        return index.get(sorted(index.backend.paper_ids()))


@pytest.mark.parametrize("fmt,name", [("bibtex", "export.bib"), ("ris", "export.ris"), ("csl-json", "export.json")])
def test_every_reference_format_indexes_again_as_the_same_papers(library, tmp_path, encoder, fmt, name):
    ix, papers = library
    text = _export(ix, fmt)
    again = _reindexed(tmp_path, encoder, name, text)
    assert sorted(again) == sorted(papers)  # the same ids: the citation keys they came with
    for pid, paper in papers.items():
        assert _described(again[pid]) == _described(paper), pid
        assert again[pid].metadata["format"] == fmt
        # a plain url stays a plain url; nothing read back from a reference format claims open access (item 8)
        assert again[pid].metadata.get("url") == (paper.metadata.get("url") or paper.metadata.get("open_access_url")), pid
        assert "open_access_url" not in again[pid].metadata, pid
    assert {papers[p].metadata["url"] for p in ("vaswani2017attention", "ABCD2345", "10.1109/CVPR.2016.90")}
    own = {"bibtex": {"vaswani2017attention": "inproceedings", "garcia2021asr": "inproceedings",
                      "roe2019thesis": "phdthesis", "smith2020conf": "inproceedings", "ABCD2345": "article"},
           "ris": {"smith2020conf": "CONF", "garcia2021asr": "CONF", "roe2019thesis": "THES", "ABCD2345": "JOUR"},
           "csl-json": {"ABCD2345": "article-journal", "garcia2021asr": "paper-conference", "roe2019thesis": "thesis",
                        "smith2020conf": "paper-conference"}}[fmt]
    assert {pid: again[pid].metadata.get("entry_type") for pid in own} == own


def test_bibtex_keeps_booktitle_and_capitals_and_parses(library):
    ix, papers = library
    text = _export(ix, "bibtex")
    parsed = bibtexparser.parse_string(text, append_middleware=[LatexDecodingMiddleware()])
    assert not parsed.failed_blocks and len(parsed.entries) == len(papers)
    entry = {e.key: e for e in parsed.entries}["garcia2021asr"]
    assert entry.entry_type == "inproceedings" and "journal" not in entry.fields_dict
    assert entry.fields_dict["booktitle"].value == "Proceedings of Interspeech"
    assert "title = {Streaming {ASR} for Gal{\\'i}cian with {BERT}-based Rescoring}" in text  # as written
    assert "author = {Garc{\\'i}a-Mateo, Carmen and van der Maaten, Laurens}" in text
    assert "school = {University of Somewhere}" in text  # a field esqbe does not read goes back too
    assert "abstract = {We build a streaming speech recogniser" in text and "50\\% more text" in text
    assert "esqbe rank" not in text and "note =" not in text  # no scores unless asked


def test_ris_has_no_record_numbers_and_rispy_reads_it(library):
    ix, papers = library
    text = _export(ix, "ris")
    lines = text.splitlines()
    assert lines[0].startswith("TY  - ") and not any(line.rstrip().rstrip(".").isdigit() for line in lines)
    records = rispy.loads(text)
    assert sorted(r["id"] for r in records) == sorted(papers)
    smith = next(r for r in records if r["id"] == "smith2020conf")
    assert smith["type_of_reference"] == "CONF" and smith["abstract"].startswith("Table question answering")
    assert "notes" not in smith


def test_csl_json_is_valid_by_the_citation_style_language_schema(library):
    jsonschema = pytest.importorskip("jsonschema")
    ix, papers = library
    items = json.loads(_export(ix, "csl-json"))
    jsonschema.Draft7Validator(json.loads(SPEC.read_text())).validate(items)
    assert sorted(i["id"] for i in items) == sorted(papers)
    bert = next(i for i in items if i["id"] == "ABCD2345")
    assert {"literal": "Google AI Language"} in bert["author"] and bert["issued"] == {"date-parts": [[2019, 6]]}
    assert "custom" not in bert
    scored = json.loads(_export(ix, "csl-json", "--with-scores"))
    jsonschema.Draft7Validator(json.loads(SPEC.read_text())).validate(scored)
    assert [i["custom"]["esqbe_rank"] for i in scored] == list(range(1, len(scored) + 1))


def test_csv_carries_the_abstract_and_scores_only_when_asked(library):
    ix, papers = library
    rows = list(csv.DictReader(io.StringIO(_export(ix, "csv"))))
    assert sorted(r["paper_id"] for r in rows) == sorted(papers) and "rank" not in rows[0]
    for row in rows:
        want = _described(papers[row["paper_id"]])
        assert (row["title"], row["abstract"], row["doi"] or None, row["venue"] or None) == (
            want["title"], want["abstract"], want["doi"], want["venue"])
        assert row["authors"] == "; ".join(want["authors"]) and row["year"] == str(want["year"] or "")
    scored = list(csv.DictReader(io.StringIO(_export(ix, "csv", "--with-scores"))))
    assert [int(r["rank"]) for r in scored] == list(range(1, len(rows) + 1)) and all(r["similarity"] for r in scored)
    bib = _export(ix, "bibtex", "--with-scores")
    assert bib.count("note = {esqbe rank ") == len(papers)


def test_http_query_exports_csl_json_with_abstracts(library, encoder):
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    ix, papers = library
    app = create_app(str(ix), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        r = httpx.post(url + "/query", json={"paper_id": "the-query", "k": 100, "format": "csl-json"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/vnd.citationstyles.csl+json")
        assert r.headers["content-disposition"] == 'attachment; filename="esqbe-hits.json"'
        items = r.json()
        assert {i["id"]: " ".join(i["abstract"].split()) for i in items} == {
            pid: _described(p)["abstract"] for pid, p in papers.items()}
        r = httpx.post(url + "/query", json={"paper_id": "the-query", "k": 3, "format": "ris", "with_scores": True},
                       timeout=120)
        assert [x["notes"][0].split(",")[0] for x in rispy.loads(r.text)] == [f"esqbe rank {i}" for i in (1, 2, 3)]


def test_the_docs_name_every_export_format():
    readme = Path(REPO / "docs" / "library.md").read_text()
    from esqbe.query.export import EXPORT_FORMATS

    assert all(f"`{fmt}`" in readme for fmt in EXPORT_FORMATS) and "--with-scores" in readme

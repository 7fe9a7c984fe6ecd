"""Answers a researcher can act on: hits exported as CSV, BibTeX and RIS from the CLI and
POST /query, parsed back with bibtexparser / rispy; `esqbe config` says where each setting came from."""
from __future__ import annotations

import csv
import io
import json

import bibtexparser
import httpx
import pytest
import rispy
from bibtexparser.middlewares import LatexDecodingMiddleware
from click.testing import CliRunner

from cli import main
from esqbe.query.export import CSV_COLUMNS, export_hits

from .conftest import SAMPLE, LiveServer

# awkward metadata on purpose: LaTeX specials, braces, accents, a paper id that is no BibTeX key
META = [
    {"year": 2019, "venue": "Proc. of A&B {Workshop}", "authors": ["Jörg Müller", "Ada Lovelace"],
     "external_ids": {"doi": "10.1/x_y%z"}},
    {"year": 2020, "authors": [{"name": "Grace Hopper"}], "external_ids": {"arxiv": "2001.00001"},
     "open_access_url": "https://example.org/p.pdf"},
]


@pytest.fixture(scope="module")
def ix(tmp_path_factory, encoder):
    """A real index of 12 sample abstracts, each with metadata (the first two awkward)."""
    import esqbe

    root = tmp_path_factory.mktemp("export")
    lines = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[:12]):
        rec = json.loads(line)
        abstract = rec["abstract"] if "abstract" in rec else rec["sentences"]
        meta = META[i % 2] if i < 6 else {"year": 2000 + i}
        if "arxiv" in meta.get("external_ids", {}):  # one arXiv id names one paper: records sharing it are merged
            meta = {**meta, "external_ids": {"arxiv": f"2001.0000{i}"}}
        lines.append(json.dumps({"id": f"p {i}" if i else "0-first", "title": f"Paper {i}: a {{study}} of #{i}",
                                 "abstract": abstract, **meta}))
    src = root / "papers.jsonl"
    src.write_text("\n".join(lines) + "\n")
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        assert index.index_files([str(src)]).indexed == 12
    return root / "ix"


def _query(ix, *extra):
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "0-first", "-k", "8", *extra],
                           catch_exceptions=False)
    return r


def test_cli_bibtex_parses_back(ix):
    hits = json.loads(_query(ix, "--json").stdout)["hits"]
    r = _query(ix, "--format", "bibtex")
    assert r.exit_code == 0, r.output
    library = bibtexparser.parse_string(r.stdout, append_middleware=[LatexDecodingMiddleware()])
    assert not library.failed_blocks
    assert len(library.entries) == len(hits) == 8
    keys = [e.key for e in library.entries]
    assert keys == [h["paper_id"].replace(" ", "_") for h in hits]  # the ids as keys (a space is no key's)
    for h, entry in zip(hits, library.entries):
        assert "note" not in entry.fields_dict  # esqbe's rank only with --with-scores
        assert entry.fields_dict["title"].value == h["title"]  # braces and specials decode back exactly
        meta = h["metadata"]
        assert entry.fields_dict["year"].value == str(meta["year"])
        if meta.get("authors"):
            want = " and ".join(f"{n.split()[-1]}, {' '.join(n.split()[:-1])}" for n in (a["name"] for a in meta["authors"]))
            assert entry.fields_dict["author"].value == want
        if meta.get("external_ids", {}).get("doi"):
            assert entry.fields_dict["doi"].value == meta["external_ids"]["doi"]
            assert entry.entry_type == "article" and entry.fields_dict["journal"].value == "Proc. of A&B {Workshop}"
    assert sum("doi" in e.fields_dict for e in library.entries) >= 1
    assert len({e.key for e in library.entries}) == 8  # unique keys, made from ids with spaces


def test_cli_ris_and_csv(ix):
    hits = json.loads(_query(ix, "--json").stdout)["hits"]
    records = rispy.loads(_query(ix, "--format", "ris").stdout)
    assert [r["id"] for r in records] == [h["paper_id"] for h in hits]
    first = next(r for r in records if r["id"] in ("p 2", "p 4"))  # META[0]: the query paper is no hit
    assert first["authors"] == ["Müller, Jörg", "Lovelace, Ada"]
    assert first["doi"] == "10.1/x_y%z" and first["year"] == "2019" and first["secondary_title"] == "Proc. of A&B {Workshop}"

    rows = list(csv.DictReader(io.StringIO(_query(ix, "--format", "csv").stdout)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["paper_id"] for r in rows] == [h["paper_id"] for h in hits]
    rows_scored = list(csv.DictReader(io.StringIO(_query(ix, "--format", "csv", "--with-scores").stdout)))
    assert [int(r["rank"]) for r in rows_scored] == list(range(1, 9))
    row = next(r for r in rows if r["paper_id"] in ("p 2", "p 4"))
    assert row["authors"] == "Jörg Müller; Ada Lovelace" and row["doi"] == "10.1/x_y%z"


def test_cli_json_and_format_together_is_a_usage_error(ix):
    r = _query(ix, "--json", "--format", "csv")
    assert r.exit_code == 2 and "--json or --format" in r.output


def test_no_hits_exports_a_header_or_nothing():
    assert list(csv.reader(io.StringIO(export_hits({"hits": []}, "csv")))) == [list(CSV_COLUMNS)]
    assert export_hits({"hits": []}, "bibtex") == "" and export_hits({"hits": []}, "ris") == ""
    assert export_hits({"hits": []}, "csl-json") == "[]\n"


def test_http_query_format_is_a_download(ix, encoder):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    app = create_app(str(ix), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        body = {"paper_id": "0-first", "k": 5}
        as_json = httpx.post(url + "/query", json=body, timeout=60).json()
        r = httpx.post(url + "/query", json={**body, "format": "bibtex"}, timeout=60)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-bibtex")
        assert r.headers["content-disposition"] == 'attachment; filename="esqbe-hits.bib"'
        entries = bibtexparser.parse_string(r.text).entries
        assert [e.key for e in entries] == [h["paper_id"].replace(" ", "_") for h in as_json["hits"]]
        r = httpx.post(url + "/query", json={**body, "format": "ris"}, timeout=60)
        assert r.headers["content-disposition"].endswith('filename="esqbe-hits.ris"')
        assert [x["id"] for x in rispy.loads(r.text)] == [h["paper_id"] for h in as_json["hits"]]
        r = httpx.post(url + "/query", json={**body, "format": "csv"}, timeout=60)
        assert r.headers["content-type"].startswith("text/csv")
        assert [row["paper_id"] for row in csv.DictReader(io.StringIO(r.text))] == [h["paper_id"] for h in as_json["hits"]]
        r = httpx.post(url + "/query", json={**body, "format": "docx"}, timeout=60)
        assert r.status_code == 422


def test_organisation_authors_stay_whole(tmp_path, encoder):
    """An organisation as author (CSL-JSON `{"literal": ...}`, a BibTeX name braced whole, an RIS name without a
    comma) is exported as one name, not turned round into "Language, Google AI"; people still as `Family, Given`."""
    import esqbe

    from .conftest import REPO

    (tmp_path / "org.bib").write_text(
        "@article{orgbib,\n title={A Study of Things},\n author={Doe, Jane and {Google AI Language}},\n year={2019},\n"
        " abstract={We study things with a new method. It works well on two tasks.}\n}\n")
    (tmp_path / "org.ris").write_text(
        "TY  - JOUR\nID  - orgris\nTI  - Another Study\nAU  - Roe, Richard\nAU  - DeepMind Technologies\nPY  - 2020\n"
        "AB  - We train a model on games. It beats the baseline.\nER  - \n")
    (tmp_path / "plain.jsonl").write_text(json.dumps({"id": "plain", "title": "The Query Paper", "abstract":
                                                      "We study things and games. A new method works well."}) + "\n")
    with esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None) as index:
        report = index.index_files([str(tmp_path / "org.bib"), str(tmp_path / "org.ris"), str(tmp_path / "plain.jsonl"),
                                    str(REPO / "tests" / "data" / "library" / "zotero-csl.json")])
        assert report.indexed == 4

    def export(fmt):  # the three others are the hits
        r = CliRunner().invoke(main, ["query", "--path", str(tmp_path / "ix"), "--paper", "plain", "-k", "3",
                                      "--format", fmt, "--no-server"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.stdout

    bib = export("bibtex")
    assert "Language, Google AI" not in bib and "Technologies, DeepMind" not in bib
    assert "author = {Devlin, Jacob and Chang, Ming-Wei and {Google AI Language}}" in bib
    assert "author = {Roe, Richard and {DeepMind Technologies}}" in bib
    library = bibtexparser.parse_string(bib)
    assert not library.failed_blocks and len(library.entries) == 3
    ris = {r["id"]: r for r in rispy.loads(export("ris"))}
    assert ris["ABCD2345"]["authors"] == ["Devlin, Jacob", "Chang, Ming-Wei", "Google AI Language"]
    assert ris["orgbib"]["authors"] == ["Doe, Jane", "Google AI Language"]
    rows = {row["paper_id"]: row for row in csv.DictReader(io.StringIO(export("csv")))}
    assert rows["ABCD2345"]["authors"] == "Jacob Devlin; Ming-Wei Chang; Google AI Language"
    assert rows["orgris"]["authors"] == "Richard Roe; DeepMind Technologies"

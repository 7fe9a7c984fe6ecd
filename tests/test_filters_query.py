"""Filters and metadata end to end: Index.query and `esqbe query` on a real index (real model)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.core.filters import FilterError, coerce_filters, matches

from .conftest import SAMPLE

VENUES = ["ACL", "EMNLP", "NAACL", "ICML"]


@pytest.fixture(scope="module")
def meta_index(tmp_path_factory, encoder):
    """40 sample abstracts as plain JSONL with year, venue, authors and a DOI on some."""
    path = tmp_path_factory.mktemp("meta-index")
    src = path / "papers.jsonl"
    with open(src, "w") as f:
        for i, line in enumerate(SAMPLE.read_text().splitlines()[:40]):
            r = json.loads(line)
            rec = {"id": r["paper_id"], "title": f"Paper {i}", "abstract": r["sentences"], "facets": r["labels"],
                   "year": 2010 + i % 12, "venue": VENUES[i % 4], "authors": [f"Author {i % 5}", f"Author {(i + 1) % 7}"]}
            if i % 3 == 0:
                rec["doi"] = f"10.1000/{i}"
            f.write(json.dumps(rec) + "\n")
    index = esqbe.open_index(str(path / "ix"), encoder=encoder, config=None)
    report = index.index_files([str(src)])
    assert report.indexed == 40
    yield index, path
    index.close()


QID = json.loads(SAMPLE.read_text().splitlines()[0])["paper_id"]


@pytest.mark.parametrize("filters", [
    ["year>=2015"], ["venue in (ACL, EMNLP)"], ["author!='Author 1'"], ["doi exists"], ["year<2014", "venue=ICML"],
    [{"key": "year", "op": ">=", "value": 2018}], "venue not in (ACL)",
])
def test_every_hit_satisfies_the_filter_and_carries_its_metadata(meta_index, filters):
    index, _ = meta_index
    conds = coerce_filters(filters)
    allowed = {pid for pid, ip in index.backend.get([f"csabstruct-train-{i:04d}" for i in range(40)]).items()
               if matches(ip.paper.metadata, conds)} - {QID}
    result = index.query(QID, facet="method", k=40, filters=filters)
    got = {h.paper_id for h in result.hits}
    assert got and got <= allowed
    for h in result.hits:
        assert h.metadata["format"] == "jsonl" and "year" in h.metadata and h.metadata["authors"]
    assert result.to_dict()["query"]["filters"] == [c.to_dict() for c in conds]


def test_selective_filter_returns_the_few_allowed_papers(meta_index):
    index, _ = meta_index
    result = index.query(QID, facet="method", k=10, filters=["year=2011", "venue=EMNLP"])
    expected = {f"csabstruct-train-{i:04d}" for i in range(40) if 2010 + i % 12 == 2011 and VENUES[i % 4] == "EMNLP"} - {QID}
    assert {h.paper_id for h in result.hits} == expected and expected


def test_bad_filters_are_refused_before_searching(meta_index):
    index, _ = meta_index
    with pytest.raises(FilterError, match="expected an operator"):
        index.query(QID, facet="method", filters=["year 2019"])
    with pytest.raises(FilterError, match="engine filter is not JSON"):
        index.query(QID, facet="method", engine_filter="{term")


def test_cli_filter_shows_metadata_and_json(meta_index):
    index, path = meta_index
    ix = str(path / "ix")
    runner = CliRunner()
    r = runner.invoke(main, ["query", "--path", ix, "--paper", QID, "--facet", "method", "-k", "3",
                             "--filter", "venue in (ACL, EMNLP)", "--filter", "year>=2012"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "filtered: venue in (ACL, EMNLP); year>=2012" in r.output
    assert " · Author " in r.output  # year · venue · authors under each hit
    r = runner.invoke(main, ["query", "--path", ix, "--paper", QID, "--facet", "method", "-k", "40", "--json",
                             "--filter", "doi exists"], catch_exceptions=False)
    data = json.loads(r.stdout)  # stderr says why fewer than 40 came back
    assert "hit(s) of the 40 asked" in r.stderr
    assert data["hits"] and all("doi" in h["metadata"] for h in data["hits"])
    assert data["query"]["filters"] == [{"key": "doi", "op": "exists"}]
    r = runner.invoke(main, ["query", "--path", ix, "--paper", QID, "--facet", "method", "--filter", "venue in ACL"])
    assert r.exit_code == 2 and "Invalid value for --filter" in r.output and "expected '(' after 'in'" in r.output
    r = runner.invoke(main, ["query", "--path", ix, "--paper", QID, "--facet", "method", "--filter", "year>3000"])
    assert r.exit_code == 0 and "no hits (no paper satisfies the filters)" in r.output
    r = runner.invoke(main, ["query", "--path", ix, "--paper", QID, "--facet", "method", "--engine-filter", '{"term": {"lang": "en"}}'])
    assert r.exit_code == 1 and "needs the elasticsearch or opensearch backend" in r.output


def test_s2orc_and_s2ag_metadata_come_back_with_hits(tmp_path, encoder):
    """The real samples: S2ORC metadata rows and S2AG `s2orc` records, indexed together, filtered by their
    metadata; each hit carries exactly the metadata the reader produced."""
    from itertools import islice

    from esqbe.ingest.readers import read_papers

    from .conftest import shared_path

    s2orc = shared_path("data", "s2orc", "metadata-sample.jsonl")
    s2ag = shared_path("data", "s2orc", "s2ag-datasets-samples", "s2orc-sample.jsonl.gz")
    papers = list(islice(read_papers(s2orc), 40)) + list(read_papers(s2ag))
    by_id = {p.paper_id: p.metadata for p in papers}
    index = esqbe.open_index(str(tmp_path / "ix"), encoder=encoder, config=None)
    index.add_papers(papers, facets="none")
    q = papers[0].paper_id
    result = index.query(q, k=50, filters=["external_ids.doi exists"])
    assert result.hits and all(h.metadata == by_id[h.paper_id] and h.metadata["external_ids"]["doi"] for h in result.hits)
    assert {h.paper_id for h in result.hits} == {p for p, m in by_id.items() if m["external_ids"].get("doi")} - {q}
    assert any(h.metadata["format"] == "s2ag-s2orc" for h in result.hits)
    result = index.query(q, k=50, filters=["fields_of_study in (Medicine)", "year>=1990"])
    assert result.hits and all("Medicine" in h.metadata["fields_of_study"] and h.metadata["year"] >= 1990 for h in result.hits)
    index.close()


# --- filters that cannot match as written ---------------------------------------------


def test_unknown_key_is_an_error_listing_the_index_keys(meta_index):
    index, _ = meta_index
    with pytest.raises(FilterError) as e:
        index.query(QID, facet="method", filters=["yaer>=2015"])
    msg = str(e.value)
    assert "no paper in the index has the key 'yaer'" in msg
    for key in ("year", "venue", "authors.name", "doi"):
        assert key in msg
    assert "author (= authors.name)" in msg


def test_value_no_paper_has_suggests_near_values_and_the_operator(meta_index):
    index, _ = meta_index
    with pytest.raises(FilterError, match=r"no paper has this value for venue; near values in the index: 'ACL' "
                                          r"\(= is exact; ignoring case and accents: venue~=acl\)"):
        index.query(QID, facet="method", filters=["venue=acl"])
    with pytest.raises(FilterError, match=r"near values in the index: 'Author 0', 'Author 1'.*author\^=Author"):
        index.query(QID, facet="method", filters=["author=Author"])
    with pytest.raises(FilterError, match=r"no paper has this value for year \(its values run from 2010 to 2021\)"):
        index.query(QID, facet="method", filters=["year=1999"])
    # conditions each matching some papers, none together: still "no hits", not an error
    assert index.query(QID, facet="method", filters=["year=2011", "venue=ACL"]).hits == []


def test_case_insensitive_and_prefix_operators(meta_index):
    index, _ = meta_index
    hits = index.query(QID, facet="method", k=40, filters=["venue~=acl"]).hits
    assert hits and {h.metadata["venue"] for h in hits} == {"ACL"}
    hits = index.query(QID, facet="method", k=40, filters=["author^='author 3'"]).hits
    assert hits and all(any(a["name"] == "Author 3" for a in h.metadata["authors"]) for h in hits)
    assert index.query(QID, facet="method", k=40, filters=["venue^=e"]).hits  # EMNLP


def test_filter_errors_on_the_cli_and_over_http(meta_index, encoder):
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    _, path = meta_index
    ix = str(path / "ix")
    r = CliRunner().invoke(main, ["query", "--path", ix, "--paper", QID, "--filter", "venue=arxiv"])
    assert r.exit_code == 1 and "no paper has this value for venue" in r.output and "Traceback" not in r.output
    app = create_app(ix, config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        r = httpx.post(url + "/query", json={"paper_id": QID, "filters": ["yaer>=2015"]}, timeout=60)
        assert r.status_code == 400 and "no paper in the index has the key 'yaer'" in r.json()["error"]["message"]
        r = httpx.post(url + "/query", json={"paper_id": QID, "filters": ["venue=acl"]}, timeout=60)
        assert r.status_code == 400 and "venue~=acl" in r.json()["error"]["message"]
        r = httpx.post(url + "/query", json={"paper_id": QID, "filters": [{"key": "venue", "op": "~=", "value": "icml"}]},
                       timeout=60)
        assert r.status_code == 200 and {h["metadata"]["venue"] for h in r.json()["hits"]} == {"ICML"}

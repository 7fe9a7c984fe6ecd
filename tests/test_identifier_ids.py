"""Every identifier is an id: on a real index of real records, `show`, `query --paper`, `--not`
and POST /query take a paper's DOI (any case, with its resolver address), arXiv id or PubMed id as they take its id,
and `search` lists the paper once."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import esqbe
from cli import main

from .conftest import SAMPLE

IDS = {"doi": "10.1088/1742-6596/Ab.12", "arxiv": "2101.00042", "pubmed": "31415926"}


@pytest.fixture(scope="module")
def ix(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("idents")
    lines = []
    for i, line in enumerate(SAMPLE.read_text().splitlines()[:6]):
        rec = json.loads(line)
        abstract = rec["abstract"] if "abstract" in rec else rec["sentences"]
        extra = {"external_ids": IDS} if i == 0 else {}
        lines.append(json.dumps({"id": f"p{i}", "title": f"Paper {i}", "abstract": abstract, **extra}))
    (root / "papers.jsonl").write_text("\n".join(lines) + "\n")
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        assert index.index_files([str(root / "papers.jsonl")]).indexed == 6
    return root / "ix"


NAMES = ["https://doi.org/10.1088/1742-6596/ab.12", "10.1088/1742-6596/AB.12", "arXiv:2101.00042v2", "31415926"]


@pytest.mark.parametrize("name", NAMES)
def test_show_and_query_take_an_identifier(ix, name):
    r = CliRunner().invoke(main, ["show", name, "--path", str(ix), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["paper_id"] == "p0"
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", name, "-k", "3", "--json", "--no-server"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    hits = [h["paper_id"] for h in json.loads(r.stdout)["hits"]]
    assert hits and "p0" not in hits  # the query paper itself is no hit
    r = CliRunner().invoke(main, ["query", "--path", str(ix), "--paper", "p1", "--not", name, "-k", "10", "--json",
                                  "--no-server"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "p0" not in [h["paper_id"] for h in json.loads(r.stdout)["hits"]]


def test_an_unknown_doi_is_still_not_in_the_index(ix):
    r = CliRunner().invoke(main, ["show", "10.1088/1742-6596/ab.13", "--path", str(ix)], catch_exceptions=False)
    assert r.exit_code != 0 and "not in the index" in r.output


def test_search_lists_a_paper_named_by_its_doi_once(ix):
    with esqbe.open_index(str(ix), config=None) as index:
        from esqbe.index.browse import search_papers

        for name in NAMES[:3]:
            ids = [h["paper_id"] for h in search_papers(index, name, k=10)]
            assert ids[0] == "p0" and ids.count("p0") == 1, (name, ids)


def test_post_query_takes_a_doi(ix, encoder):
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    app = create_app(str(ix), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        r = httpx.post(url + "/query", json={"paper_id": NAMES[1].lower(), "k": 3}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["hits"] and "p0" not in [h["paper_id"] for h in r.json()["hits"]]

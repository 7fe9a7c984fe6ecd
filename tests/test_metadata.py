"""Metadata the readers keep from each input format, on the real shared samples and on plain JSONL."""
import gzip
import json

import pytest

from esqbe.core.filters import matches, parse_filter
from esqbe.ingest.readers import read_papers

from .conftest import SHARED as SHARED_ROOT

SHARED = SHARED_ROOT / "data"
S2ORC = SHARED / "s2orc" / "metadata-sample.jsonl"
S2AG = SHARED / "s2orc" / "s2ag-datasets-samples"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="shared sample data not available")


def _records(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@needs_shared
def test_s2orc_metadata_sample_keeps_every_metadata_field():
    records = {str(r["paper_id"]): r for r in _records(S2ORC)}
    papers = list(read_papers(S2ORC))
    assert len(papers) == 488
    for p in papers:
        r = records[p.paper_id]
        m = p.metadata
        assert m["format"] == "s2orc"
        assert m.get("year") == r["year"]
        assert m.get("venue") == (r["venue"] or None)
        assert m.get("journal") == (r["journal"] or None)
        assert [a["name"] for a in m.get("authors", [])] == [
            " ".join(x for x in [a["first"], *a["middle"], a["last"], a["suffix"]] if x) for a in r["authors"]
        ]
        assert m.get("fields_of_study") == (r["mag_field_of_study"] or None)
        ids = m["external_ids"]
        assert ids["corpus_id"] == p.paper_id
        for ours, theirs in [("doi", "doi"), ("arxiv", "arxiv_id"), ("pubmed", "pubmed_id"), ("pmc", "pmc_id"), ("mag", "mag_id"), ("acl", "acl_id")]:
            assert ids.get(ours) == r[theirs]
        assert m["s2_url"] == r["s2_url"]
    # the sample holds DOIs, arXiv ids and venues: they are all reachable by filters
    assert sum(matches(p.metadata, [parse_filter("external_ids.doi exists")]) for p in papers) == sum(
        1 for p in papers if records[p.paper_id]["doi"])
    assert any(p.metadata["external_ids"].get("arxiv") for p in papers)


@needs_shared
def test_s2ag_abstracts_keep_external_ids_and_open_access():
    records = {str(r["corpusid"]): r for r in _records(S2AG / "abstracts-sample.jsonl.gz")}
    papers = list(read_papers(S2AG / "abstracts-sample.jsonl.gz"))
    assert len(papers) == 100
    with_url = 0
    for p in papers:
        oa = records[p.paper_id]["openaccessinfo"]
        assert p.metadata["external_ids"]["corpus_id"] == p.paper_id
        for ours, theirs in [("doi", "DOI"), ("arxiv", "ArXiv"), ("acl", "ACL"), ("pmc", "PubMedCentral"), ("mag", "MAG")]:
            assert p.metadata["external_ids"].get(ours) == oa["externalids"].get(theirs)
        assert p.metadata.get("open_access_url") == oa["url"]
        assert p.metadata.get("open_access_status") == oa["status"]
        with_url += bool(oa["url"])
    assert with_url > 0


@needs_shared
def test_s2ag_s2orc_keeps_ids_open_access_and_header_authors():
    records = {str(r["corpusid"]): r for r in _records(S2AG / "s2orc-sample.jsonl.gz")}
    papers = list(read_papers(S2AG / "s2orc-sample.jsonl.gz"))
    assert len(papers) == 8
    first = papers[0]
    assert first.metadata["external_ids"] == {"doi": "10.1186/s12859-018-2275-2", "corpus_id": "255784639"}
    assert first.metadata["open_access_url"] == "https://doi.org/10.1186/s12859-018-2275-2"
    assert first.metadata["open_access_status"] == "GOLD" and first.metadata["license"] == "CCBY"
    assert [a["name"] for a in first.metadata["authors"]] == ["Lishuang Li", "Jia Wan", "Jieqiong Zheng", "Jian Wang"]
    for p in papers:
        oa = records[p.paper_id]["content"]["source"]["oainfo"] or {}
        assert p.metadata.get("open_access_url") == oa.get("openaccessurl")
        doi = records[p.paper_id]["externalids"].get("doi")
        assert p.metadata["external_ids"].get("doi") == doi


def test_s2ag_papers_shape_fields_are_kept(tmp_path):
    """The S2AG `papers` record fields (authors with ids, s2fieldsofstudy, journal, publication date)
    on an abstracts-style record that carries them, as the S2 API returns them."""
    rec = {"corpusId": 7, "abstract": "We study things. We find more.", "year": 2021, "venue": "ACL",
           "publicationDate": "2021-08-01", "journal": {"name": "Proc. ACL", "pages": "1-9"},
           "authors": [{"authorId": "42", "name": "Ada L."}, {"authorId": None, "name": "Bo C."}],
           "s2FieldsOfStudy": [{"category": "Computer Science", "source": "s2-fos-model"}],
           "externalIds": {"ACL": "2021.acl-long.1", "ArXiv": "2101.00001", "CorpusId": "7"}}
    path = tmp_path / "s2.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (p,) = read_papers(path)
    assert p.metadata == {
        "format": "s2ag-abstracts", "year": 2021, "publication_date": "2021-08-01", "venue": "ACL", "journal": "Proc. ACL",
        "authors": [{"name": "Ada L.", "id": "42"}, {"name": "Bo C."}], "fields_of_study": ["Computer Science"],
        "external_ids": {"acl": "2021.acl-long.1", "arxiv": "2101.00001", "corpus_id": "7"},
    }
    assert matches(p.metadata, [parse_filter("author_id=42"), parse_filter("venue in (ACL, EMNLP)")])


def test_s2_api_open_access_pdf_is_open_access_and_its_url_the_s2_page(tmp_path):
    """An S2 Graph API paper (`/graph/v1/paper/...?fields=...,url,openAccessPdf`): `openAccessPdf` says the paper is
    open, so it is `open_access_url`; the record's `url` is its Semantic Scholar page."""
    rec = {"paperId": "204e3073870fae3d05bcbc2f6a8e263d9b72e776", "corpusId": 13756489,
           "url": "https://www.semanticscholar.org/paper/204e3073870fae3d05bcbc2f6a8e263d9b72e776",
           "title": "Attention is All you Need", "abstract": "We propose the Transformer. It is fast.", "year": 2017,
           "openAccessPdf": {"url": "https://arxiv.org/pdf/1706.03762", "status": "GREEN"}}
    closed = {**rec, "corpusId": 1, "openAccessPdf": None}
    path = tmp_path / "s2.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps(closed) + "\n")
    p, q = read_papers(path)
    assert p.metadata["open_access_url"] == "https://arxiv.org/pdf/1706.03762"
    assert p.metadata["open_access_status"] == "GREEN"
    assert p.metadata["s2_url"] == rec["url"] and "url" not in p.metadata
    assert "open_access_url" not in q.metadata and "open_access_status" not in q.metadata


def test_plain_jsonl_keeps_extra_keys_and_metadata_object(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "title": "T", "abstract": "One. Two.", "year": 2019, "venue": "EMNLP", "lang": "en",
                    "authors": ["Ann", "Ben"], "metadata": {"split": "train", "score": 0.5}}) + "\n"
        + json.dumps({"id": "b", "abstract": "One.", "metadata": None}) + "\n"
        + json.dumps({"id": "c", "abstract": "One.", "metadata": [1]}) + "\n")
    papers = list(read_papers(path))
    assert [p.paper_id for p in papers] == ["a", "b"]
    assert papers[0].metadata == {"format": "jsonl", "year": 2019, "venue": "EMNLP", "lang": "en",
                                  "authors": [{"name": "Ann"}, {"name": "Ben"}], "split": "train", "score": 0.5}
    assert papers[1].metadata == {"format": "jsonl"}


def test_content_hash_follows_metadata_but_not_bookkeeping():
    from esqbe.domain import Paper

    a = Paper("x", "T", ["s."], metadata={"year": 2019})
    b = Paper("x", "T", ["s."], metadata={"year": 2020})
    c = Paper("x", "T", ["s."], metadata={"year": 2019, "facets_predicted": True})
    assert a.content_hash() != b.content_hash()
    assert a.content_hash() == c.content_hash()

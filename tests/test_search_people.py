"""Finding papers by who wrote them and by identifier, on a real embedded index: `esqbe search`
finds an author's papers (case and accents folded) and puts the paper an exact DOI / arXiv id names first; `~=` and
`^=` filters fold accents; a value no paper has is answered with values that are near it (folded, a prefix, a
word, a few edits away), never the first ones in alphabetical order."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import esqbe
from cli import main
from esqbe.core.filter_check import near_values
from esqbe.core.filters import FilterError

from .conftest import REPO, SAMPLE

DATA = REPO / "tests" / "data" / "library"
OWN_BIB = r"""@inproceedings{garcia2021asr,
  title = {Streaming Speech Recognition for Galician},
  author = {Garc{\'i}a-Mateo, Carmen and Docio-Fernandez, Laura},
  booktitle = {Proceedings of Interspeech},
  year = {2021},
  doi = {10.21437/Interspeech.2021-7},
  abstract = {We build a streaming speech recogniser for Galician. It rescores hypotheses with a language model. Word error rates fall on two test sets.}
}
"""


@pytest.fixture(scope="module")
def ix(tmp_path_factory, encoder):
    root = tmp_path_factory.mktemp("people")
    (root / "own.bib").write_text(OWN_BIB)
    # 30 papers by "Author 0" .. "Author 29": many values, none of them near the typos below
    lines = [json.loads(x) for x in SAMPLE.read_text().splitlines()[:30]]
    (root / "many.jsonl").write_text("\n".join(json.dumps({
        "id": r["paper_id"], "title": r.get("title") or f"Paper {i}", "abstract": r["sentences"],
        "authors": [f"Author {i}"], "venue": "Speech Recognition Letters" if i == 3 else f"Venue {i}"}) for i, r in enumerate(lines)) + "\n")
    with esqbe.open_index(str(root / "ix"), encoder=encoder, config=None) as index:
        index.index_files([str(root / "own.bib"), str(DATA / "zotero.bib"), str(DATA / "zotero-csl.json"),
                           str(root / "many.jsonl")])
    return root / "ix"


def _search(ix, *words) -> list[dict]:
    r = CliRunner().invoke(main, ["search", "--path", str(ix), "--json", *words], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["hits"]


@pytest.mark.parametrize("words", [("García-Mateo",), ("garcia-mateo",), ("Carmen", "Garcia", "Mateo"), ("GARCIA",)])
def test_an_authors_papers_are_found_case_and_accents_folded(ix, words):
    hits = _search(ix, *words)
    assert hits and (hits[0]["paper_id"], hits[0]["match"]) == ("garcia2021asr", "author")


@pytest.mark.parametrize("query,paper", [("10.18653/v1/N19-1423", "ABCD2345"), ("https://doi.org/10.18653/V1/N19-1423",
                                         "ABCD2345"), ("arXiv:1706.03762v5", "vaswani2017attention"),
                                        ("1706.03762", "vaswani2017attention"), ("doi:10.21437/interspeech.2021-7",
                                                                                 "garcia2021asr")])
def test_an_exact_identifier_finds_that_paper_first(ix, query, paper):
    hits = _search(ix, query)
    assert (hits[0]["paper_id"], hits[0]["match"]) == (paper, "identifier")


def test_words_still_rank_by_bm25_and_the_text_output_says_how_each_matched(ix):
    hits = _search(ix, "streaming", "speech", "recognition")
    assert hits[0]["paper_id"] == "garcia2021asr" and hits[0]["match"] == "words"
    r = CliRunner().invoke(main, ["search", "--path", str(ix), "garcia-mateo"], catch_exceptions=False)
    assert r.output.splitlines()[0].split()[:3] == ["1.", "author", "garcia2021asr"]


def test_filters_fold_accents_and_suggest_near_values(ix):
    with esqbe.open_index(str(ix), config=None) as index:
        hits = index.query("vaswani2017attention", k=50, filters=["author~='carmen garcia-mateo'"]).hits
        assert [h.paper_id for h in hits] == ["garcia2021asr"]
        hits = index.query("vaswani2017attention", k=50, filters=["author~='LAURA DOCIO-FERNÁNDEZ'"]).hits
        assert [h.paper_id for h in hits] == ["garcia2021asr"]  # an accent the record does not have: folded too
        assert [h.paper_id for h in index.query("vaswani2017attention", k=50, filters=["author^='CARMEN GARCI'"]).hits] == [
            "garcia2021asr"]
        # `=` is exact (case and accents count, as on the engines' keyword terms): the name as stored matches, the
        # name without its accent is refused with the near value and the folding operator to use instead
        assert [h.paper_id for h in index.query("vaswani2017attention", k=50,
                                                filters=["author='Carmen García-Mateo'"]).hits] == ["garcia2021asr"]
        with pytest.raises(FilterError, match=r"near values in the index: 'Carmen García-Mateo' "
                                              r"\(= is exact; ignoring case and accents: author~=\"Carmen Garcia-Mateo\"\)"):
            index.query("vaswani2017attention", k=5, filters=["author='Carmen Garcia-Mateo'"])
        with pytest.raises(FilterError, match=r"near values in the index: 'Carmen García-Mateo'$"):
            index.query("vaswani2017attention", k=5, filters=["author='Carmen Garcia-Mato'"])  # a typo: 2 edits
        with pytest.raises(FilterError) as e:
            index.query("vaswani2017attention", k=5, filters=["venue=Zzyzx"])
        assert "Venue 0" not in str(e.value) and "none of its" in str(e.value)  # nothing near: no alphabetical list


def test_near_values_are_near_nearest_first():
    stored = ["Aaron Abbot", "Carmen García-Mateo", "Carmen Garcia", "Mateo Ruiz", "Carla Garcés", "Zoe Carmen"]
    assert near_values("carmen garcía-mateo", stored) == ["Carmen García-Mateo"]
    assert near_values("Carmen", stored) == ["Carmen García-Mateo", "Carmen Garcia", "Zoe Carmen"]
    assert near_values("Carmen Garcia-Mato", stored) == ["Carmen García-Mateo"]
    assert near_values("Carla Garces", stored) == ["Carla Garcés"]
    assert near_values("Xavier", stored) == []


def test_http_search_answers_the_same(ix, encoder):
    import httpx

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import LiveServer

    app = create_app(str(ix), config=None, options=ServeOptions(host="127.0.0.1"), encoder=encoder)
    with LiveServer(app) as url:
        body = httpx.get(url + "/search", params={"q": "García-Mateo"}, timeout=60).json()
        assert body["hits"][0]["paper_id"] == "garcia2021asr" and body["hits"][0]["match"] == "author"
        body = httpx.get(url + "/search", params={"q": "10.48550/arXiv.1706.03762"}, timeout=60).json()
        assert body["hits"][0]["paper_id"] == "vaswani2017attention" and body["hits"][0]["match"] == "identifier"

"""Which sentences form a query, and why: the library's `QueryResult.selection`, the JSON
shape (`esqbe query --json`, POST /query), the CLI's text, a text query choosing its sentences by index, and a
text query whose facet the tagger does not find. A real index (given and predicted labels), the real model and
tagger, the real CLI, a real HTTP server."""
from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

from cli import main
from esqbe.query.results import QueryError
from esqbe.query.search import facet_probability

from .conftest import SAMPLE, LiveServer

ROWS = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:30]]
GIVEN = ROWS[:10]
PLAIN = [{"id": r["paper_id"], "title": r.get("title", ""), "abstract": " ".join(r["sentences"])} for r in ROWS[10:]]
TEXT = ("We study machine translation for low-resource languages. "
        "We train a transformer with back-translation on monolingual data. "
        "It improves BLEU by two points on four language pairs.")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, encoder):
    """An index of 10 papers with given labels and 20 whose labels the tagger predicted (with probabilities)."""
    import esqbe

    root = tmp_path_factory.mktemp("selection")
    (root / "given.jsonl").write_text("\n".join(json.dumps(r) for r in GIVEN) + "\n")
    (root / "plain.jsonl").write_text("\n".join(json.dumps(r) for r in PLAIN) + "\n")
    index = esqbe.open_index(str(root / "ix"), encoder=encoder, config=None)
    report = index.index_files([str(root / "given.jsonl"), str(root / "plain.jsonl")])
    assert (report.indexed, report.tagged, report.errors) == (30, 20, [])
    yield index
    index.close()


def _soft_case(index):
    """A predicted-label paper and facet whose query takes a sentence labelled with another facet (its p >= 0.3)."""
    for r in PLAIN:
        paper = index.get([r["id"]])[r["id"]]
        for facet in ("method", "result", "background"):
            p = facet_probability(paper, facet)
            extra = [i for i in range(len(p)) if p[i] >= 0.3 and paper.facets[i] != facet]
            if extra:
                return r["id"], facet, extra
    pytest.fail("no predicted-label paper in the sample has a sentence of another label with p >= 0.3")


def test_the_selection_says_each_query_sentence_its_label_probability_and_why(mixed):
    pid, facet, extra = _soft_case(mixed)
    paper = mixed.get([pid])[pid]
    p = facet_probability(paper, facet)
    res = mixed.query(pid, facet=facet, k=3)
    sel = res.selection
    assert sel.by == "facet" and sel.threshold == 0.3 and f"p({facet}) >= 0.3" in sel.rule
    assert [s.index for s in sel.sentences] == [i for i, _ in res.query_sentences] == [i for i in range(len(p)) if p[i] >= 0.3]
    for s in sel.sentences:
        assert (s.facet, s.why, s.text) == (paper.facets[s.index], "probability", paper.sentences[s.index])
        assert s.probability == pytest.approx(p[s.index], abs=1e-4)
    assert {s.index for s in sel.sentences if s.facet != facet} == set(extra)  # in the query though labelled otherwise

    # given labels: the labelled sentences, no probability
    gid = GIVEN[0]["paper_id"]
    res = mixed.query(gid, facet="method", k=3)
    assert res.selection.rule == "sentences labelled method" and res.selection.threshold is None
    assert [(s.facet, s.why, s.probability) for s in res.selection.sentences] == [("method", "label", None)] * len(res.query_sentences)
    # chosen, and all
    assert [(s.index, s.why) for s in mixed.query(gid, sentences=[2, 0], k=3).selection.sentences] == [(2, "chosen"), (0, "chosen")]
    assert {s.why for s in mixed.query(gid, k=3).selection.sentences} == {"all"}

    # the JSON shape carries the same
    d = mixed.query(pid, facet=facet, k=3).to_dict()
    assert d["query"]["selection"] == {"by": "facet", "rule": sel.rule, "threshold": 0.3}
    assert [(s["index"], s["facet"], s["why"]) for s in d["query"]["sentences"]] == \
        [(s.index, s.facet, "probability") for s in sel.sentences]
    assert [s["probability"] for s in d["query"]["sentences"]] == [s.probability for s in sel.sentences]


def test_a_text_query_chooses_its_sentences_by_index(mixed):
    res = mixed.query(text=TEXT, sentences=[0, 2], k=3)
    assert [i for i, _ in res.query_sentences] == [0, 2]
    assert [s.why for s in res.selection.sentences] == ["chosen", "chosen"]
    assert all(s.facet != "unlabeled" for s in res.selection.sentences)  # the tagger labelled them, to show
    with pytest.raises(QueryError, match="has sentences 0..2; no sentence 5"):
        mixed.query(text=TEXT, sentences=[5], k=3)


def test_a_text_query_whose_facet_the_tagger_does_not_find_lists_its_sentences_and_how_to_pick(mixed):
    text = "Parsing is a core task of natural language processing. Many downstream systems depend on accurate parsers."
    with pytest.raises(QueryError) as e:
        mixed.query(text=text, facet="result", k=3)
    msg = str(e.value)
    assert msg.startswith("the query text has no result sentence: the tagger labels its 2 sentence(s) ")
    assert '[0] background (p(result) 0.' in msg and '"Parsing is a core task' in msg and "[1] " in msg
    assert "--sentences 0,2" in msg and '"sentences": [0, 2]' in msg


@pytest.fixture(scope="module")
def cli_index(mixed):
    return mixed.settings.path


def test_the_cli_shows_the_rule_and_each_sentence_with_label_and_probability(mixed, cli_index):
    pid, facet, extra = _soft_case(mixed)
    r = CliRunner().invoke(main, ["query", "--path", cli_index, "--paper", pid, "--facet", facet, "-k", "2"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    res = mixed.query(pid, facet=facet, k=2)
    assert f"  query = sentences whose predicted p({facet}) >= 0.3" in r.output
    for s in res.selection.sentences:
        assert f"  [{s.index}] ({s.facet}, p({facet}) {s.probability:.2f}) {s.text}\n" in r.output
    j = CliRunner().invoke(main, ["query", "--path", cli_index, "--paper", pid, "--facet", facet, "-k", "2", "--json"],
                           catch_exceptions=False)
    got = json.loads(j.output)["query"]
    assert [(s["index"], s["facet"], s["why"]) for s in got["sentences"]] == \
        [(s.index, s.facet, s.why) for s in res.selection.sentences]

    r = CliRunner().invoke(main, ["query", "--path", cli_index, "--text", TEXT, "--sentences", "0,2", "-k", "2", "--json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert [(s["index"], s["why"]) for s in json.loads(r.output)["query"]["sentences"]] == [(0, "chosen"), (2, "chosen")]


def test_http_query_says_which_sentences_and_why_and_a_text_picks_by_index(mixed, encoder, tmp_path_factory):
    import shutil

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    pid, facet, _ = _soft_case(mixed)
    want = mixed.query(pid, facet=facet, k=3).to_dict()["query"]
    path = tmp_path_factory.mktemp("selection-http") / "ix"
    shutil.copytree(mixed.settings.path, path)
    with LiveServer(create_app(str(path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1"))) as url:
        got = httpx.post(url + "/query", json={"paper_id": pid, "facet": facet, "k": 3}, timeout=60).json()["query"]
        assert got["sentences"] == want["sentences"] and got["selection"] == want["selection"]
        # GET /papers says the same before any query runs (what the page marks)
        before = httpx.get(url + f"/papers/{pid}", timeout=60).json()["facet_queries"][facet]
        assert before["rule"] == want["selection"]["rule"] and before["threshold"] == 0.3
        assert [(s["index"], s["facet"], s["probability"], s["why"]) for s in before["sentences"]] == \
            [(s["index"], s["facet"], s["probability"], s["why"]) for s in want["sentences"]]
        r = httpx.post(url + "/query", json={"text": TEXT, "sentences": [1], "k": 3}, timeout=60)
        assert r.status_code == 200, r.text
        assert [(s["index"], s["why"]) for s in r.json()["query"]["sentences"]] == [(1, "chosen")]
        bad = httpx.post(url + "/query", json={"text": "Parsing is a core task of natural language processing. "
                                                        "Many downstream systems depend on accurate parsers.",
                                                "facet": "result", "k": 3}, timeout=60)
        assert bad.status_code == 400 and '"sentences": [0, 2]' in bad.json()["error"]["message"]

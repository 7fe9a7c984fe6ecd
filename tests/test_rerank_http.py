"""POST /rerank through a real `esqbe serve` app on 127.0.0.1 over a real embedded index, called with the
exact bodies each engine builds from the templates `esqbe engine install-reranker` installs
(esqbe.backends.engines.reranker), its answer read the way each engine's parser reads it: the scores equal esqbe's
own rescoring of the same candidates; unknown ids score lowest and are counted; the perimeter and the grammar
refuse what they must."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

import esqbe
from esqbe.backends.engines.reranker import (
    es_inference_body,
    es_request_body,
    os_connector_body,
    os_request_body,
)
from esqbe.index.rerank import MAX_RERANK_DOCUMENTS, MAX_RERANK_QUERY_CHARS, parse_rerank_query

from .conftest import LiveServer

TOKEN = "s3cret-rerank-token"
Q, A, B = "csabstruct-train-0000", "csabstruct-train-0001", "csabstruct-train-0002"


@pytest.fixture(scope="module")
def index_path(index_dir_30, tmp_path_factory):
    path = tmp_path_factory.mktemp("serve-rerank") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def server(index_path, encoder):
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    app = create_app(str(index_path), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", token=TOKEN, max_body_bytes=64 * 1024))
    with LiveServer(app) as url:
        yield url


@pytest.fixture(scope="module")
def ids(index_path, encoder):
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        return [p.paper.paper_id for p in index.iter_papers()]


def _expected(index_path, encoder, query: str, candidates: list[str]) -> dict[str, float]:
    """esqbe's own rescoring of exactly those candidates: `Index.query(..., restrict_to=candidates)`."""
    q = parse_rerank_query(query)
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        result = index.query(q.paper_id, facet=q.facet, sentences=q.sentences, text=q.text, restrict_to=candidates,
                             k=len(candidates))
    return {h.paper_id: h.score for h in result.hits}


def _call_as_elasticsearch(url: str, query: str, documents: list[str]) -> tuple[list[float], httpx.Response]:
    """The `custom` service as installed: its url, headers (the secret put in) and request template; the answer read
    by its json_parser paths ($.results[*].index / relevance_score)."""
    body = es_inference_body(url, TOKEN)
    settings = body["service_settings"]
    headers = {k: v.replace("${api_key}", settings["secret_parameters"]["api_key"]) for k, v in settings["headers"].items()}
    r = httpx.post(settings["url"], content=es_request_body(body, query, documents), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    index, score = [x["index"] for x in results], [x["relevance_score"] for x in results]
    out = [0.0] * len(documents)
    for i, s in zip(index, score, strict=True):
        out[i] = s
    return out, r


def _call_as_opensearch(url: str, query: str, documents: list[str]) -> tuple[list[float], httpx.Response]:
    """The connector as installed: its action's url, headers (the credential put in), the Cohere pre-process
    parameters in its request body; the Cohere post-process reads results[*] by index."""
    body = os_connector_body(url, TOKEN)
    action = body["actions"][0]
    headers = {k: v.replace("${credential.esqbe_token}", body["credential"]["esqbe_token"])
               for k, v in action["headers"].items()}
    r = httpx.post(action["url"], content=os_request_body(body, query, documents), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    by_index = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    return [by_index[i] for i in range(len(documents))], r


@pytest.mark.parametrize("call", [_call_as_elasticsearch, _call_as_opensearch], ids=["elasticsearch", "opensearch"])
@pytest.mark.parametrize("query", [f"paper:{Q} facet:method", f"paper:{Q} sentences:0,2", f"paper:{Q}",
                                   "facet:method We propose a novel method that encodes citations with a graph neural network. We train it with a contrastive loss on pairs of papers.",
                                   "We study citation recommendation with graph neural networks."])
def test_scores_in_input_order_equal_esqbes_rescoring(server, index_path, encoder, ids, call, query):
    candidates = ids[1:16][::-1]  # an engine's order, not esqbe's
    scores, r = call(server, query, candidates)
    expected = _expected(index_path, encoder, query, candidates)
    # a paper's stored vectors: the same numbers; a pasted text is encoded again (float noise of the batch)
    tol = 1e-9 if query.startswith("paper:") else 1e-5
    assert scores == pytest.approx([expected[c] for c in candidates], abs=tol)
    if query.startswith("paper:"):
        assert sorted(candidates, key=lambda c: -scores[candidates.index(c)]) == sorted(expected, key=lambda c: -expected[c])
    assert r.headers["X-Esqbe-Rerank-Unknown"] == "0"


def test_unknown_ids_and_the_query_paper_score_lowest(server, index_path, encoder, caplog):
    docs = [A, "no-such-paper", Q, B, "no-such-paper", "another-missing"]
    import logging

    with caplog.at_level(logging.WARNING, logger="esqbe.server"):
        scores, r = _call_as_elasticsearch(server, f"paper:{Q} facet:method", docs)
    assert r.headers["X-Esqbe-Rerank-Unknown"] == "2" and r.json()["unknown"] == 2
    assert any("2 of 6 documents are not in the index" in m and "'no-such-paper'" in m for m in caplog.messages)
    assert r.headers["X-Esqbe-Rerank-Unranked"] == "1"  # the query paper itself: a query never returns it
    known = [scores[0], scores[3]]
    assert scores[1] == scores[2] == scores[4] == scores[5] < min(known)
    expected = _expected(index_path, encoder, f"paper:{Q} facet:method", [A, B])
    assert known == pytest.approx([expected[A], expected[B]])
    # nothing known at all: every document gets the same score, still no error
    scores, r = _call_as_opensearch(server, f"paper:{Q}", ["x1", "x2"])
    assert scores[0] == scores[1] and r.headers["X-Esqbe-Rerank-Unknown"] == "2"


def test_the_perimeter(server):
    body = es_request_body(es_inference_body(server, TOKEN), f"paper:{Q}", [A])
    ok = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(server + "/rerank", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 401
    r = httpx.post(server + "/rerank", content=body, headers={**ok, "Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = httpx.post(server + "/rerank", content=body, headers={**ok, "Host": "evil.example"})
    assert r.status_code == 400
    r = httpx.post(server + "/rerank", content=body, headers={**ok, "Content-Type": "text/plain"})
    assert r.status_code == 415
    big = json.dumps({"query": f"paper:{Q}", "documents": ["x" * 100] * 1000})  # past the 64 KiB body limit
    r = httpx.post(server + "/rerank", content=big, headers=ok)
    assert r.status_code == 413


@pytest.mark.parametrize("query,status,match", [
    ("", 422, ""),
    ("   ", 400, "empty"),
    ("paper:", 400, "no value"),
    (f"paper:{Q} facet:methods", 400, "not a facet"),
    (f"paper:{Q} facet:method sentences:0", 400, "not both"),
    (f"paper:{Q} paper:{A}", 400, "twice"),
    (f"paper:{Q} sentences:0,x", 400, "indices"),
    (f"paper:{Q} sentences:1,1", 400, "twice"),
    (f"paper:{Q} sentences:-1", 400, "indices"),
    (f"paper:{Q} k:5", 400, "unknown term"),
    (f"paper:{Q} rescorer:ot", 400, "unknown term"),
    (f"paper:{Q} sentences:" + ",".join(map(str, range(65))), 413, "at most"),
    ("facet:method", 400, "needs a text"),
    ("paper:a\x00b", 400, "control"),
    ("word " * 6000, 422, "at most 20000 characters"),
])
def test_malformed_and_oversized_queries_are_refused(server, query, status, match):
    r = httpx.post(server + "/rerank", json={"query": query, "documents": [A, B]},
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == status, r.text
    assert match.lower() in r.text.lower() and "Traceback" not in r.text


@pytest.mark.parametrize("documents,status,match", [
    ([], 400, "no documents"),
    ("csabstruct-train-0001", 422, ""),
    ([A, None], 400, "documents[1]"),
    ([A, {"id": B}], 400, "documents[1]"),
    ([A, ""], 400, "documents[1]"),
    ([A, "two words"], 400, "documents[1]"),
    ([A, "x" * 600], 400, "documents[1]"),
    ([A, True], 400, "documents[1]"),
    (["p"] * (MAX_RERANK_DOCUMENTS + 1), 422, "at most 1000 items"),
])
def test_malformed_and_oversized_document_lists_are_refused(server, documents, status, match):
    r = httpx.post(server + "/rerank", json={"query": f"paper:{Q}", "documents": documents},
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == status, r.text
    assert match.lower() in r.text.lower()


def test_no_model_or_other_field_chosen_by_the_request(server):
    r = httpx.post(server + "/rerank", json={"query": f"paper:{Q}", "documents": [A], "model": "../../etc"},
                   headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 422


def test_csfcube_dev_bm25_reranked_through_the_endpoint_equals_esqbes_rescoring(tmp_path, encoder):
    """On CSFCube dev's abstracts (the first 80, given labels): a BM25 search for a query paper's title, its hits
    reranked through POST /rerank as Elasticsearch would call it, ranks them as esqbe's own rescoring does."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    from .conftest import shared_path

    src = shared_path("data", "csfcube-dev", "abstracts-csfcube-preds.jsonl")
    lines = src.read_text(encoding="utf-8").splitlines()[:80]
    (tmp_path / "papers.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "index"
    with esqbe.open_index(str(path), encoder=encoder, config=None) as index:
        assert index.index_files([str(tmp_path / "papers.jsonl")]).indexed == 80
        qid = json.loads(lines[0])["paper_id"]
        title = index.get([qid])[qid].title
        bm25 = [p.paper_id for p, _ in index.search(title, k=31) if p.paper_id != qid][:30]
        assert len(bm25) >= 10
        own = index.query(qid, facet="method", restrict_to=bm25, k=len(bm25))
    app = create_app(str(path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", token=TOKEN))
    with LiveServer(app) as url:
        scores, _ = _call_as_elasticsearch(url, f"paper:{qid} facet:method", bm25)
    reranked = [pid for _, pid in sorted(zip(scores, bm25, strict=True), key=lambda x: -x[0])]
    assert reranked == [h.paper_id for h in own.hits]


def test_the_request_deadline_bounds_a_call(index_path, encoder, ids):
    """Past the server's per-request deadline the call is given up (504), the reader freed: the engine's own
    timeout is not the only bound."""
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    app = create_app(str(index_path), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", token=TOKEN, request_timeout=1e-6))
    with LiveServer(app) as url:
        r = httpx.post(url + "/rerank", json={"query": f"paper:{Q} facet:method", "documents": ids[1:30]},
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == 504, r.text
    assert "Traceback" not in r.text


def test_the_python_api_is_the_same(index_path, encoder, ids):
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        got = index.rerank(f"paper:{Q} sentences:0,2", [*ids[5:10], "missing"])
        direct = index.query(Q, sentences=[0, 2], restrict_to=ids[5:10], k=5)
    assert got.scores[:5] == [next(h.score for h in direct.hits if h.paper_id == p) for p in ids[5:10]]
    assert got.unknown == ["missing"] and got.scores[5] < min(got.scores[:5])


@pytest.mark.parametrize("query", [
    'facet:method We propose a novel method, "GraphCite", that encodes citations with a graph\\neural network.\n'
    'We train it with a "contrastive" loss on pairs of papers.\t(C:\\data\r\n)',
    '{"method": "graph neural networks for citation recommendation"}',  # JSON-looking: ml-commons leaves it unescaped
    '["contrastive", "loss"] \\u0022 </script> & \' =',
])
def test_the_opensearch_connector_carries_quotes_backslashes_and_newlines(server, index_path, encoder, ids, query):
    """A free-text rerank query with `"`, `\\`, newlines and tabs, put through the installed connector's pre-process
    function and request template as ml-commons does (os_request_body): the body is JSON, esqbe receives the text
    exactly as typed, and scores the candidates as its own rescoring of that text does."""
    candidates = ids[1:9]
    sent = os_request_body(os_connector_body(server, TOKEN), query, candidates)
    assert json.loads(sent) == {"query": query, "documents": candidates}
    scores, r = _call_as_opensearch(server, query, candidates)
    expected = _expected(index_path, encoder, query, candidates)
    assert scores == pytest.approx([expected[c] for c in candidates], abs=1e-5)


def test_the_openapi_document_publishes_the_bounds_the_server_enforces(server):
    """/openapi.json's RerankRequest carries the documents-per-call and query-length bounds; a request at each
    bound is answered, one past it gets the documented 422 naming the bound."""
    doc = httpx.get(server + "/openapi.json").json()
    props = doc["components"]["schemas"]["RerankRequest"]["properties"]
    assert (props["documents"]["minItems"], props["documents"]["maxItems"]) == (1, MAX_RERANK_DOCUMENTS)
    assert (props["query"]["minLength"], props["query"]["maxLength"]) == (1, MAX_RERANK_QUERY_CHARS)
    assert {"200", "422"} <= set(doc["paths"]["/rerank"]["post"]["responses"])
    assert not {"404", "409"} & set(doc["paths"]["/rerank"]["post"]["responses"])  # the index's content: fallbacks
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def post(query, documents):
        return httpx.post(server + "/rerank", json={"query": query, "documents": documents}, headers=auth, timeout=60)

    at = f"paper:{Q}".ljust(props["query"]["maxLength"])  # trailing spaces: still a valid grammar query
    assert post(at, [A] * props["documents"]["maxItems"]).status_code == 200
    r = post(at, [A] * (props["documents"]["maxItems"] + 1))
    assert r.status_code == 422 and f"documents: List should have at most {MAX_RERANK_DOCUMENTS} items" in r.text
    r = post(at + " ", [A])
    assert r.status_code == 422 and f"query: String should have at most {MAX_RERANK_QUERY_CHARS} characters" in r.text


def test_the_servers_stats_say_rerank_is_answered_and_its_bounds(server):
    """Any server's GET /stats: POST /rerank answered, behind the token, with the bounds the route enforces; an
    embedded index has no cluster reranker to report."""
    from esqbe.index.rerank import MAX_PAPER_ID_CHARS, MAX_RERANK_SENTENCES

    stats = httpx.get(server + "/stats", timeout=60).json()
    rerank = dict(stats["server"]["rerank"])
    assert isinstance(rerank.pop("fallbacks"), dict)  # counted: the fallback tests below
    from esqbe.core.limits import MAX_QUERY_SENTENCES

    assert 1 <= rerank.pop("max_text_sentences") <= MAX_QUERY_SENTENCES  # the server's one count
    assert rerank == {
        "enabled": True, "token_required": True, "request_timeout_s": stats["server"]["rerank"]["request_timeout_s"],
        "max_documents": MAX_RERANK_DOCUMENTS, "max_query_chars": MAX_RERANK_QUERY_CHARS,
        "max_sentences": MAX_RERANK_SENTENCES, "max_id_chars": MAX_PAPER_ID_CHARS}
    assert stats["server"]["rerank"]["request_timeout_s"] > 0 and "reranker" not in stats


# --- a well-formed query is answered whatever the index holds --------------------------------------
H = {"Authorization": f"Bearer {TOKEN}"}
#: sentiment background and results, no method sentence by the tagger (the issue's "facet:method We separate
#: subjective sentences ..." kind of text)
NO_METHOD = ("Sentiment analysis of reviews has attracted much attention in recent years. "
             "Accuracy improved by four points over the baseline.")


def _post(server, query, documents):
    r = httpx.post(server + "/rerank", json={"query": query, "documents": documents}, headers=H, timeout=120)
    assert r.status_code == 200, r.text
    return [x["relevance_score"] for x in sorted(r.json()["results"], key=lambda x: x["index"])], r


def test_a_facet_the_text_lacks_falls_back_to_its_most_probable_sentence(server, index_path, encoder, ids):
    import numpy as np

    from esqbe.domain import Paper
    from esqbe.query.results import FacetNotFoundError
    from esqbe.query.search import facet_probability, query_sentences

    candidates = ids[1:12]
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        assert index.tagger is not None
        with pytest.raises(FacetNotFoundError):  # what answered 400 before: the query as asked has no method sentence
            index.query(None, facet="method", text=NO_METHOD, restrict_to=candidates, k=len(candidates))
        paper = Paper("q", "", query_sentences(NO_METHOD))
        paper.metadata = {"facet_probs": index.tagger.tag_with_probabilities([paper])[1][0]}
        best = int(np.argmax(facet_probability(paper, "method")))
        direct = index.query(None, text=NO_METHOD, sentences=[best], restrict_to=candidates, k=len(candidates))
    scores, r = _post(server, f"facet:method {NO_METHOD}", candidates)
    assert r.headers["X-Esqbe-Rerank-Fallback"] == "facet_most_probable"
    expected = {h.paper_id: h.score for h in direct.hits}
    assert scores == pytest.approx([expected[c] for c in candidates], abs=1e-5)


def test_a_facet_the_paper_lacks_falls_back_to_all_its_sentences(server, index_path, encoder, ids):
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        papers = index.get(ids)
        lacking = next((pid, f) for pid in ids for f in ("background", "method", "result")
                       if f not in papers[pid].facets)
        candidates = [i for i in ids[:12] if i != lacking[0]]
        direct = index.query(lacking[0], restrict_to=candidates, k=len(candidates))
    scores, r = _post(server, f"paper:{lacking[0]} facet:{lacking[1]}", candidates)
    assert r.headers["X-Esqbe-Rerank-Fallback"] == "facet_all_sentences"
    expected = {h.paper_id: h.score for h in direct.hits}
    assert scores == pytest.approx([expected[c] for c in candidates], abs=1e-9)


def test_sentence_indices_past_the_paper_are_dropped(server, index_path, encoder, ids):
    candidates = ids[1:10]
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        n = len(index.get([Q])[Q].sentences)
        direct = index.query(Q, sentences=[0], restrict_to=candidates, k=len(candidates))
        every = index.query(Q, restrict_to=candidates, k=len(candidates))
    scores, r = _post(server, f"paper:{Q} sentences:0,{n + 5}", candidates)
    assert r.headers["X-Esqbe-Rerank-Fallback"] == "sentences_out_of_range"
    assert scores == pytest.approx([{h.paper_id: h.score for h in direct.hits}[c] for c in candidates], abs=1e-9)
    scores, r = _post(server, f"paper:{Q} sentences:{n},{n + 1}", candidates)  # none left: every sentence
    assert scores == pytest.approx([{h.paper_id: h.score for h in every.hits}[c] for c in candidates], abs=1e-9)


def test_a_query_paper_not_in_the_index_keeps_the_engines_order_and_stats_count_the_fallbacks(server, ids):
    before = httpx.get(server + "/stats", timeout=60).json()["server"]["rerank"]["fallbacks"]
    scores, r = _post(server, "paper:nope-nope facet:method", [ids[1], ids[2], "missing"])
    assert r.headers["X-Esqbe-Rerank-Fallback"] == "query_paper_missing"
    assert scores[0] == scores[1] > scores[2]  # known ids tie (the engine's order stands); unknown still lowest
    after = httpx.get(server + "/stats", timeout=60).json()["server"]["rerank"]["fallbacks"]
    assert after.get("query_paper_missing", 0) == before.get("query_paper_missing", 0) + 1
    # as asked: no fallback header
    _, r = _post(server, f"paper:{Q}", ids[1:4])
    assert "X-Esqbe-Rerank-Fallback" not in r.headers

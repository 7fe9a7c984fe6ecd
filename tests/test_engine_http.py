"""The engine backends over a real loopback socket, against the canned engine of tests/fakes/engines.py served by
`EngineHTTPServer`: credentials on every request (the version probe included), wrong credentials, retries and
the timeout of the version probe, least-privilege keys without `monitor`, and the CLI end to end (index, query,
rescore) with such a key. Fakes checking what is sent, NOT integration tests (those need a running engine:
tests/test_engine_integration.py, tests/test_engine_secured.py)."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

pytest.importorskip("jsonschema")
es_client = pytest.importorskip("elasticsearch")
os_client = pytest.importorskip("opensearchpy")

from esqbe.backends.engines.elasticsearch import ElasticsearchBackend  # noqa: E402
from esqbe.backends.engines.opensearch import OpenSearchBackend  # noqa: E402
from esqbe.backends.engines.versions import parse_version  # noqa: E402
from esqbe.domain import FirstStageRequest  # noqa: E402
from esqbe.errors import BackendError  # noqa: E402

from .fakes.bodies import os_knn_specs, vectors_in  # noqa: E402
from .fakes.engines import INDEX, META, CannedEngine, make_papers  # noqa: E402
from .fakes.wire import EngineHTTPServer  # noqa: E402


@pytest.fixture
def engine_server():
    """engine_server(engine, version) -> (server, canned); servers are stopped after the test."""
    servers = []

    def start(engine: str, version: str):
        server = EngineHTTPServer(CannedEngine(engine, version))
        servers.append(server)
        return server, server.canned

    yield start
    for server in servers:
        server.close()


# ------------------------------------------------------------------------------------------------
# an API key and a username at once are refused on both backends


@pytest.mark.parametrize("cls", [ElasticsearchBackend, OpenSearchBackend])
def test_api_key_and_username_together_are_refused(cls):
    """opensearch-py used to keep only the basic auth (it lower-cases the custom header, then http_auth
    overwrites `authorization`) and elasticsearch-py raises a ValueError: both now get the same clear error."""
    with pytest.raises(BackendError, match="both an API key and a username"):
        cls("http://127.0.0.1:9", "papers", api_key="a2V5OnNlY3JldA==", username="elastic", password="pw")


@pytest.mark.parametrize("backend", ["elasticsearch", "opensearch"])
def test_cli_reports_api_key_and_username_as_one_error_line(backend):
    from click.testing import CliRunner

    from cli import main

    result = CliRunner().invoke(main, ["stats", "--backend", backend, "--url", "http://127.0.0.1:9", "--index", "papers",
                                       "--api-key", "a2V5OnNlY3JldA==", "--username", "elastic", "--password", "pw"])
    assert result.exit_code == 1, result.output
    assert "both an API key and a username" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------------------------------
# credentials on every request (the version probe included), over a real socket

ES_KEY = base64.b64encode(b"esqbe-id:esqbe-secret").decode()
AUTH_CASES = [
    ("elasticsearch", "9.2.0", {"api_key": ES_KEY}, f"ApiKey {ES_KEY}"),
    ("elasticsearch", "8.19.5", {"username": "elastic", "password": "pw"}, "Basic " + base64.b64encode(b"elastic:pw").decode()),
    ("opensearch", "3.5.0", {"username": "admin", "password": "pw"}, "Basic " + base64.b64encode(b"admin:pw").decode()),
    ("opensearch", "2.19.3", {"api_key": "os-key"}, "ApiKey os-key"),
]


def _http_backend(server, engine, **options):
    cls = ElasticsearchBackend if engine == "elasticsearch" else OpenSearchBackend
    backend = cls(server.url, INDEX, **options)
    backend.retry_wait_initial = backend.retry_wait_max = 0.0
    return backend


def _full_session(backend):
    """What `esqbe index`, `query`, `stats` and `delete` send, in order."""
    papers = make_papers(4)
    backend.ensure(META)
    backend.upsert(papers)
    out = backend.first_stage(FirstStageRequest(text="graphs", vectors=papers[0].vectors, k=3))
    backend.stats()
    backend.delete(["p3"])
    return out


@pytest.mark.parametrize("engine,version,options,expected", AUTH_CASES, ids=lambda x: x if isinstance(x, str) else None)
def test_every_request_carries_the_configured_authorization(engine_server, engine, version, options, expected):
    server, canned = engine_server(engine, version)
    canned.require_auth = expected  # anything else answers 401, as a cluster with security on does
    canned.bm25_hits = lambda body: [("p1", 2.0), ("p2", 1.0)]
    backend = _http_backend(server, engine, **options)
    out = _full_session(backend)
    assert [c.paper_id for c in out][:2] == ["p1", "p2"] and out[0].paper is not None
    assert canned.requests[0]["endpoint"] == "info"  # the version probe is the first request
    assert {r["endpoint"] for r in canned.requests} >= {"info", "_mapping", "index", "_mget", "_bulk", "_refresh", "_msearch", "_search"}
    assert [r["path"] for r in canned.requests if r["headers"].get("authorization") != expected] == []
    backend.close()


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_wrong_credentials_fail_at_once_with_a_clear_error(engine_server, engine, version):
    server, canned = engine_server(engine, version)
    canned.require_auth = "Basic " + base64.b64encode(b"elastic:right").decode()
    backend = _http_backend(server, engine, username="elastic", password="wrong")
    with pytest.raises(BackendError, match=r"authentication failed \(401\)"):
        backend.meta()
    assert len(canned.requests) == 1  # a 401 is not retried


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_version_probe_is_retried_on_429_and_503(engine_server, engine, version):
    server, canned = engine_server(engine, version)
    canned.failures["info"] = [429, 503, 429, 503]  # more than the transport's own 3 retries: esqbe's backoff retries
    backend = _http_backend(server, engine)
    assert backend.meta() is None
    assert [r["endpoint"] for r in canned.requests] == ["info"] * 5 + ["_mapping"]
    assert str(backend.info()) == f"{engine} {version}"


@pytest.mark.parametrize("engine,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_version_probe_uses_the_request_timeout(engine_server, engine, version):
    """A probe past `request_timeout` is cut off and tried again (it used to wait the transport's default)."""
    server, canned = engine_server(engine, version)
    server.delays["info"] = [1.5]
    backend = _http_backend(server, engine, request_timeout=0.3)
    assert backend.meta() is None
    assert [r["endpoint"] for r in canned.requests][:2] == ["info", "info"]


@pytest.mark.parametrize("engine,version,created", [
    ("elasticsearch", "9.2.0", (9, 0, 0)),
    ("elasticsearch", "8.19.5", (8, 11, 0)),  # a 9.x client and an 8.x server: compatibility found by trying
    ("opensearch", "2.19.3", (2, 19, 3)),
])
def test_least_privilege_key_without_monitor_still_works(engine_server, caplog, engine, version, created):
    """A key with read/write/view_index_metadata/create_index on the esqbe index only: GET / answers 403."""
    key = "ApiKey bGVhc3Q6cHJpdmlsZWdl"
    server, canned = engine_server(engine, version)
    canned.require_auth = key
    canned.forbidden = frozenset({"info", "_license", "_cat/plugins"})
    canned.bm25_hits = lambda body: [("p1", 2.0)]
    options = {"api_key": key.split()[1]}
    first = _http_backend(server, engine, **options)
    with caplog.at_level("WARNING", logger="esqbe.backends"):
        out = _full_session(first)
    assert [c.paper_id for c in out] == ["p1"]
    assert "GET / answered 403" in caplog.text and "monitor" in caplog.text
    info = first.info()
    assert not info.exact and info.version[:2] == (8, 11) if engine == "elasticsearch" else info.version[:2] == (2, 12)
    assert "version unknown" in first.stats()["engine"]
    # a later session on the existing index reads the lower bound from the index's creation version
    second = _http_backend(server, engine, **options)
    assert second.meta() == META
    assert second.info().version == created and not second.info().exact
    if engine == "elasticsearch":
        client_major = int(es_client.__versionstr__.split(".")[0])
        server_major = parse_version(version)[0]
        last = canned.requests[-1]["headers"]["accept"]
        assert f"compatible-with={min(client_major, server_major)}" in last


# ------------------------------------------------------------------------------------------------
# the CLI end to end over HTTP with a least-privilege API key (what tests/test_engine_secured.py runs on a real
# secured cluster), against the engine-like server whose kNN answers are exact cosines


def exact_knn_hits(canned: CannedEngine):
    """kNN answers computed from the stored documents: per paper, the best cosine of the searched path's
    sentences, as the engines score it ((1 + cos) / 2), best first, `k` (or `size`) of them; an exact
    `script_score` search (what `esqbe index` calibrates num_candidates against) scores 1 + cos."""

    def answer(body):
        if "script_score" in json.dumps(body):  # exact search (esqbe.backends.engines.exact): 1 + cosine, every document
            nested = body["query"]["nested"]
            params = nested["query"]["script_score"]["script"]["params"]
            q = np.asarray(params.get("query_vector") or params["query_value"], dtype=np.float32)
            best = {pid: float((np.asarray([r["vector"] for r in src[nested["path"]]], dtype=np.float32) @ q).max())
                    for pid, src in canned.sources.items() if src.get(nested["path"])}
            return [(pid, 1 + c) for pid, c in sorted(best.items(), key=lambda kv: -kv[1])[: body["size"]]]
        (field, vector), = vectors_in(body)
        path = field.split(".")[0]
        q = np.asarray(vector, dtype=np.float32)
        best = {}
        for pid, src in canned.sources.items():
            rows = [r["vector"] for r in src.get(path) or ()]
            if rows:
                best[pid] = float((np.asarray(rows, dtype=np.float32) @ q).max())
        spec = body["knn"] if "knn" in body else next(s for _, s in os_knn_specs(body))
        flt = json.dumps(spec.get("filter") or {})
        ranked = sorted(((pid, c) for pid, c in best.items() if not spec.get("filter") or f'"{pid}"' in flt), key=lambda kv: -kv[1])
        return [(pid, (1 + c) / 2) for pid, c in ranked[: min(spec["k"], body["size"])]]

    return answer


@pytest.mark.parametrize("engine,version", [("elasticsearch", "8.19.5")])  # one engine: it loads the model (~10 s)
def test_cli_index_query_rescore_with_a_least_privilege_key_over_http(engine_server, tmp_path, engine, version):
    """The CLI path of the secured integration test, here against a server that demands the key on every
    request and refuses GET / (no monitor privilege); with kNN-only fusion the ranking must be the embedded
    backend's, scores included (exact kNN on both sides; the canned engine has no BM25, so BM25 is left out
    of the fusion and of the final score)."""
    from tests.test_engine_secured import _cli, index_query_rescore

    from .conftest import SAMPLE

    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:8]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ids = [json.loads(line)["paper_id"] for line in lines]
    key = base64.b64encode(b"least:privilege").decode()
    server, canned = engine_server(engine, version)
    canned.require_auth = f"ApiKey {key}"
    canned.forbidden = frozenset({"info", "_license", "_cat/plugins"})
    canned.knn_hits = exact_knn_hits(canned)
    result, stats = index_query_rescore(engine, server.url, ["--api-key", key], sample, ids, index="esqbe-it",
                                        query_args=("--fusion", "knn", "--bm25-weight", "0"))
    assert stats["papers"] == len(ids) and "version unknown" in stats["engine"]
    assert {r["headers"].get("authorization") for r in canned.requests} == {f"ApiKey {key}"}
    embedded = _cli("index", "--path", str(tmp_path / "embedded"), "--json", str(sample))
    assert embedded.exit_code == 0, embedded.output
    ref = _cli("query", "--path", str(tmp_path / "embedded"), "--paper", ids[0], "--facet", "method", "--rescorer", "summax",
               "-k", "5", "--json", "--fusion", "knn", "--bm25-weight", "0")
    want = json.loads(ref.output[ref.output.index("{"):])["hits"]
    assert [h["paper_id"] for h in result["hits"]] == [h["paper_id"] for h in want], ([(h["paper_id"], h["score"]) for h in result["hits"]], [(h["paper_id"], h["score"]) for h in want])
    # same ranking; scores agree to float16 precision (the embedded backend keeps float16 rows, the engine a float32 copy)
    assert [h["score"] for h in result["hits"]] == pytest.approx([h["score"] for h in want], abs=1e-3)


def test_vectors_fallback_with_unknown_version_asks_es_to_rehydrate(engine_server):
    """A least-privilege key on ES 9.2 (GET / refused, index created by 9.x: version known only as >= 9.0):
    the _mget answer lacks the vectors, so the search with exclude_vectors: false is tried."""
    key = "ApiKey bGVhc3Q6cHJpdmlsZWdl"
    server, canned = engine_server("elasticsearch", "9.2.0")
    canned.require_auth, canned.forbidden = key, frozenset({"info"})
    papers = make_papers(3)
    backend = _http_backend(server, "elasticsearch", api_key=key.split()[1])
    backend.ensure(META)
    backend.upsert(papers)
    del canned.sources["p1"]["vectors_b64"]
    fresh = _http_backend(server, "elasticsearch", api_key=key.split()[1])
    got = fresh.get(["p1"])
    assert not fresh.info().exact
    assert np.array_equal(got["p1"].vectors, papers[1].vectors)

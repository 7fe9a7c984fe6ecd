""" engine object names (`engine install-reranker` / `uninstall-reranker --name`, `--index`) checked
against the engines' naming rules before any request, and every name percent-encoded as a URL path segment. Against
the canned engine on a real loopback socket (tests/fakes/engines.py, the real clients): it records every request,
so "nothing was sent" is checked on the wire. A contract test, NOT an integration test."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

pytest.importorskip("elasticsearch")
pytest.importorskip("opensearchpy")

from cli import main  # noqa: E402
from esqbe.backends.engines.names import (  # noqa: E402
    check_index_name,
    check_inference_id,
    check_pipeline_name,
    path_segment,
)
from esqbe.errors import ParameterError  # noqa: E402

from .fakes.wire import EngineHTTPServer  # noqa: E402
from .test_rerank_install import RerankEngine, _make_index, _run  # noqa: E402


@pytest.fixture
def engine():
    servers = []

    def start(kind: str, version: str):
        server = EngineHTTPServer(RerankEngine(kind, version))
        servers.append(server)
        _make_index(kind, server.url)  # install-reranker needs an esqbe index
        server.canned.requests.clear()
        return server.url, server.canned

    yield start
    for s in servers:
        s.close()


HOSTILE = ["*", "../..", "../../_security/user/x", "a,b", "_all", ".", "x/y", "a b", "x?y", "x#y", "x%2Fy"]


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
@pytest.mark.parametrize("command", ["install-reranker", "uninstall-reranker"])
@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_reranker_name_is_refused_before_anything_is_sent(engine, kind, version, command, name):
    url, canned = engine(kind, version)
    args = ["engine", command, "--backend", kind, "--url", url, "--index", "papers", "--name", name]
    if command == "install-reranker":
        args += ["--server-url", "http://esqbe:8000"]
    r = CliRunner().invoke(main, args, env={})
    assert r.exit_code != 0
    assert "--name" in r.output and "Traceback" not in r.output
    assert canned.requests == []  # not even GET /


@pytest.mark.parametrize("index", ["*", "_all", "a,b", "../x", "papers/_doc", "-x", "+x", "..", "a:b", "a" * 256])
def test_a_hostile_index_name_is_refused_before_anything_is_sent(engine, index):
    url, canned = engine("opensearch", "3.5.0")
    r = CliRunner().invoke(main, ["stats", "--backend", "opensearch", "--url", url, "--index", index], env={})
    assert r.exit_code != 0 and "--index" in r.output and "Traceback" not in r.output
    assert canned.requests == []


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_an_index_name_its_companions_cannot_carry_is_refused_before_it_is_made(kind, version):
    """An esqbe index names its watches' and aliases' indexes after it (`NAME-esqbe-watches`): a name that fits the
    engines' 255 bytes but not with that suffix is refused before the index is created, naming the bound; the longest
    name that fits is made, and so are its companions."""
    from esqbe.backends.engines.elasticsearch import ElasticsearchBackend
    from esqbe.backends.engines.names import COMPANION_SUFFIXES, MAX_INDEX_NAME_BYTES
    from esqbe.backends.engines.opensearch import OpenSearchBackend

    from .fakes.engines import META, make_papers

    server = EngineHTTPServer(RerankEngine(kind, version))  # an engine holding no index yet
    url, canned = server.url, server.canned
    most = MAX_INDEX_NAME_BYTES - max(len(x) for x in COMPANION_SUFFIXES)
    cls = ElasticsearchBackend if kind == "elasticsearch" else OpenSearchBackend
    too_long = cls(url, "p" * (most + 1))
    with pytest.raises(ParameterError, match=f"at most {most} bytes"):
        too_long.ensure(META)
    too_long.close()
    assert not any(r["method"] == "PUT" for r in canned.requests)  # nothing created
    fits = cls(url, "p" * most)
    fits.ensure(META)
    fits.upsert(make_papers())  # written with its aliases' companion index
    fits.close()
    made = {r["path"].split("/")[1] for r in canned.requests if r["method"] == "PUT" and r["endpoint"] == "index"}
    assert made == {"p" * most, "p" * most + "-esqbe-aliases"}, made
    assert all(len(name.encode()) <= MAX_INDEX_NAME_BYTES for name in made)
    server.close()
    assert check_index_name("p" * (most + 1)) == "p" * (most + 1)  # an existing index or alias of that name is read


def test_an_odd_but_valid_opensearch_name_goes_encoded_and_round_trips(engine):
    """OpenSearch documents no rule for pipeline ids: a name with `+` and `@` is valid; on the wire it is one
    percent-encoded path segment, and install, stats and uninstall all find it."""
    url, canned = engine("opensearch", "3.5.0")
    name = "Esqbe+Rerank@v2"
    base = ["--backend", "opensearch", "--url", url, "--index", "papers", "--name", name]
    out = _run(["engine", "install-reranker", *base, "--server-url", "http://esqbe:8000"])
    assert out["search_pipeline"] == {"id": name, "status": "created"}
    paths = [r["path"] for r in canned.sent()]
    assert "/_search/pipeline/Esqbe%2BRerank%40v2" in paths
    assert not any(name in p for p in paths)  # never raw in a path
    assert set(canned.pipelines) == {name}
    assert _run(["engine", "uninstall-reranker", *base]) == {"search_pipeline": True, "model": True, "connector": True}
    assert not canned.pipelines


def test_a_valid_elasticsearch_inference_id_with_dots_is_sent_as_is(engine):
    url, canned = engine("elasticsearch", "9.2.0")
    base = ["--backend", "elasticsearch", "--url", url, "--index", "papers", "--name", "esqbe.rerank_v2-x"]
    assert _run(["engine", "install-reranker", *base, "--server-url", "http://esqbe:8000"]) == \
        {"inference_endpoint": {"id": "esqbe.rerank_v2-x", "status": "created"}}
    assert "/_inference/rerank/esqbe.rerank_v2-x" in [r["path"] for r in canned.sent()]
    # an OpenSearch-valid name is not an Elasticsearch inference id: refused by ES's own rule, nothing sent
    n = len(canned.requests)
    r = CliRunner().invoke(main, ["engine", "uninstall-reranker", "--backend", "elasticsearch", "--url", url,
                                  "--name", "Esqbe+Rerank"], env={})
    assert r.exit_code != 0 and "inference endpoint id" in r.output and len(canned.requests) == n


def test_the_rules():
    for ok in ("papers", "esqbe-2026.11", ".hidden-x", "ü" * 127):
        assert check_index_name(ok) == ok
    for bad in ("ü" * 128, "Papers"):  # 256 bytes; capitals only where esqbe creates the index
        with pytest.raises(ParameterError):
            check_index_name(bad, creating=True)
    assert check_index_name("Papers") == "Papers"  # an existing alias may have capitals
    for bad in ("-a", "a-", "A", "a" * 65, "a/b", ".a", "a.", "a b", ""):
        with pytest.raises(ParameterError):
            check_inference_id(bad)
    assert check_inference_id("a" * 64)
    for bad in ("*", "a*", "a,b", "_x", "..", "a\tb", "a\x00b", "é" * 128):
        with pytest.raises(ParameterError):
            check_pipeline_name(bad)
    assert path_segment("a/b*,c?#%") == "a%2Fb%2A%2Cc%3F%23%25"
    assert path_segment("é") == "%C3%A9"
    for bad in ("", ".", ".."):
        with pytest.raises(ParameterError):
            path_segment(bad)

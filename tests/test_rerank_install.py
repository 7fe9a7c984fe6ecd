"""`esqbe engine install-reranker` / `uninstall-reranker` against a canned engine on a real loopback
socket (the real elasticsearch-py / opensearch-py clients put the requests on the wire): what is sent, in what order,
with which credentials, validated against the request schemas cut from the engines' official API specifications
(tests/specs/rerank-requests.strict.schema.json, scripts/cut_rerank_specs.py), and idempotent on a second run.
A contract test of what is sent, NOT an integration test: the live one is in tests/test_engine_integration.py."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from click.testing import CliRunner

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("elasticsearch")
pytest.importorskip("opensearchpy")

from cli import main  # noqa: E402
from esqbe.backends.engines.reranker import (  # noqa: E402
    es_inference_body,
    os_connector_body,
    os_model_body,
    os_pipeline_body,
)

from .fakes.engines import CannedEngine  # noqa: E402
from .fakes.wire import EngineHTTPServer  # noqa: E402

SCHEMA = Path(__file__).resolve().parent / "specs" / "rerank-requests.strict.schema.json"
TOKEN = "a-server-token-of-16+"


@cache
def _doc() -> dict:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def spec_errors(key: str, body) -> list[str]:
    doc = _doc()
    v = jsonschema.Draft202012Validator({"$schema": doc["$schema"], "$defs": doc["$defs"], **doc[key]})
    return [f"{e.json_path}: {e.message[:160]}" for e in v.iter_errors(body)]


class RerankEngine(CannedEngine):
    """The canned engine plus the inference API (ES) and ML Commons / search pipelines (OpenSearch), kept in dicts."""

    def __init__(self, engine, version):
        super().__init__(engine, version)
        self.endpoints: dict[str, dict] = {}
        self.connectors: dict[str, dict] = {}
        self.models: dict[str, dict] = {}
        self.pipelines: dict[str, dict] = {}
        self.model_states: dict[str, str] = {}
        self.n = 0

    def handle(self, method, target, headers, body):
        path = target.split("?")[0]
        if not path.startswith(("/_inference/", "/_plugins/_ml/", "/_search/pipeline/")):
            return super().handle(method, target, headers, body)
        data = json.loads(body) if body else None
        self.requests.append({"method": method, "path": target, "body": data, "endpoint": "rerank",
                              "headers": {k.lower(): v for k, v in headers.items()}})
        segs = [unquote(s) for s in path.strip("/").split("/")]  # the engine decodes each path segment
        missing = 404, {"error": {"type": "resource_not_found_exception", "reason": "not found"}, "status": 404}
        if segs[0] == "_inference":
            name = segs[2]
            if method == "GET":
                if name not in self.endpoints:
                    return missing
                shown = {k: v for k, v in self.endpoints[name]["service_settings"].items() if k != "secret_parameters"}
                return 200, {"endpoints": [{"inference_id": name, "task_type": "rerank", "service": "custom",
                                            "service_settings": shown}]}
            if method == "PUT":
                if name in self.endpoints:
                    return 400, {"error": {"type": "resource_already_exists_exception", "reason": "exists"}, "status": 400}
                self.endpoints[name] = data
                return 200, {"inference_id": name, "task_type": "rerank", "service": "custom"}
            if method == "DELETE":
                return (200, {"acknowledged": True}) if self.endpoints.pop(name, None) else missing
        if segs[0] == "_search":
            name = segs[2]
            if method == "PUT":
                self.pipelines[name] = data
                return 200, {"acknowledged": True}
            if method == "GET":
                return (200, {name: self.pipelines[name]}) if name in self.pipelines else missing
            if method == "DELETE":
                return (200, {"acknowledged": True}) if self.pipelines.pop(name, None) else missing
        kind, rest = segs[2], segs[3:]
        store = self.connectors if kind == "connectors" else self.models
        if rest == ["_create"] or rest == ["_register"]:
            self.n += 1
            new_id = f"{kind[0]}{self.n}"
            store[new_id] = data
            if kind == "models":
                self.model_states[new_id] = "DEPLOYED" if "deploy=true" in target else "REGISTERED"
            return 200, ({"connector_id": new_id} if kind == "connectors" else
                         {"task_id": "t", "model_id": new_id, "status": "CREATED"})
        if rest == ["_search"]:
            name = data["query"]["term"]["name.keyword"]
            return 200, {"hits": {"hits": [{"_id": i, "_source": {**v, "algorithm": "REMOTE"}}
                                           for i, v in store.items() if v["name"] == name]}}
        if len(rest) == 2 and rest[1] == "_undeploy":
            return 200, {}
        if len(rest) == 1 and method == "GET":  # get model / get connector: the stored body and its state
            if rest[0] not in store:
                return missing
            return 200, {**store[rest[0]], **({"model_state": self.model_states[rest[0]]} if kind == "models" else {})}
        if len(rest) == 1 and method == "DELETE":
            return (200, {"result": "deleted"}) if store.pop(rest[0], None) else missing
        return 400, {"error": {"type": "illegal_argument_exception", "reason": f"canned: {method} {path}"}, "status": 400}

    def sent(self, endpoint="rerank"):
        return [r for r in self.requests if r["endpoint"] == endpoint]


@pytest.fixture
def engine():
    servers = []

    def start(kind: str, version: str, index: str | None = "papers"):
        """A canned engine, holding the esqbe index `index` (None: no index) written by esqbe's own backend."""
        server = EngineHTTPServer(RerankEngine(kind, version))
        servers.append(server)
        if index is not None:
            _make_index(kind, server.url, index)
            server.canned.requests.clear()
        return server.url, server.canned

    yield start
    for s in servers:
        s.close()


def _make_index(kind: str, url: str, index: str = "papers") -> None:
    from esqbe.backends.engines.elasticsearch import ElasticsearchBackend
    from esqbe.backends.engines.opensearch import OpenSearchBackend

    from .fakes.engines import META, make_papers

    backend = (ElasticsearchBackend if kind == "elasticsearch" else OpenSearchBackend)(url, index)
    backend.ensure(META)
    backend.upsert(make_papers())
    backend.close()


def _run(args, env=None):
    """The command's JSON output; for `engine` commands (given --json) the `parts` of it: what was done."""
    engine = args[0] == "engine"
    r = CliRunner().invoke(main, [*args, "--json"] if engine and "--json" not in args else args, env=env or {},
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    return out["parts"] if engine and "parts" in out else out


def test_bodies_are_valid_for_the_official_specs():
    for token in (None, TOKEN):
        assert not spec_errors("es_inference_put_custom", es_inference_body("http://esqbe:8000", token))
        assert not spec_errors("os_ml_create_connector", os_connector_body("http://esqbe:8000", token))
    assert not spec_errors("os_ml_register_model", os_model_body("abc"))
    assert not spec_errors("os_search_pipeline_put", os_pipeline_body("abc", "paper_id"))
    # the cut is strict: a misspelt key is caught
    bad = es_inference_body("http://esqbe:8000")
    bad["service_settings"]["respone"] = bad["service_settings"].pop("response")
    assert spec_errors("es_inference_put_custom", bad)
    assert spec_errors("os_search_pipeline_put", {"response_processors": [{"rerank": {
        "ml_opensearch": {"model_id": "m"}, "context": {"document_field": ["paper_id"]}}}]})


def test_elasticsearch_install_is_one_put_with_the_token_as_a_secret_and_idempotent(engine):
    url, canned = engine("elasticsearch", "9.2.0")
    args = ["engine", "install-reranker", "--backend", "elasticsearch", "--url", url, "--index", "papers",
            "--server-url", "http://esqbe:8000/"]
    out = _run(args, env={"ESQBE_TOKEN": TOKEN})
    assert out == {"inference_endpoint": {"id": "esqbe-rerank", "status": "created"}}
    puts = [r for r in canned.sent() if r["method"] == "PUT"]
    assert [r["path"] for r in puts] == ["/_inference/rerank/esqbe-rerank"]
    assert puts[0]["body"] == es_inference_body("http://esqbe:8000", TOKEN)
    assert puts[0]["body"]["service_settings"]["url"] == "http://esqbe:8000/rerank"
    assert not spec_errors("es_inference_put_custom", puts[0]["body"])
    # again without a token: the stored endpoint is the same apart from the secret, which cannot be read back,
    # so with no token it is kept; with one it is replaced (delete, then put)
    out = _run(args, env={"ESQBE_TOKEN": TOKEN})
    assert out["inference_endpoint"]["status"] == "replaced" and len(canned.endpoints) == 1
    canned.endpoints.clear()
    _run(args)
    n = len(canned.sent())
    assert _run(args) == {"inference_endpoint": {"id": "esqbe-rerank", "status": "unchanged"}}
    assert [r["method"] for r in canned.sent()[n:]] == ["GET"]
    assert _run(["engine", "uninstall-reranker", "--backend", "elasticsearch", "--url", url]) == \
        {"inference_endpoint": True}
    assert not canned.endpoints
    assert _run(["engine", "uninstall-reranker", "--backend", "elasticsearch", "--url", url]) == \
        {"inference_endpoint": False}


def test_opensearch_install_creates_connector_model_and_pipeline_and_replaces_them(engine):
    url, canned = engine("opensearch", "3.5.0")
    args = ["engine", "install-reranker", "--backend", "opensearch", "--url", url, "--index", "papers",
            "--server-url", "http://esqbe:8000", "--id-field", "content_hash"]  # any mapped field
    out = _run(args, env={"ESQBE_TOKEN": TOKEN})
    assert {k: v["status"] for k, v in out.items()} == {"connector": "created", "model": "created",
                                                        "search_pipeline": "created"}
    made = {r["path"].split("?")[0]: r for r in canned.sent() if r["method"] in ("POST", "PUT") and r["body"]
            and "_search" not in r["path"].split("/")[-1]}
    connector = made["/_plugins/_ml/connectors/_create"]["body"]
    assert connector == os_connector_body("http://esqbe:8000", TOKEN)
    assert connector["credential"] == {"esqbe_token": TOKEN}
    assert "deploy=true" in [r["path"] for r in canned.sent() if "_register" in r["path"]][0]
    model = made["/_plugins/_ml/models/_register"]["body"]
    assert model == os_model_body(out["connector"]["id"])
    pipeline = made["/_search/pipeline/esqbe-rerank"]["body"]
    assert pipeline == os_pipeline_body(out["model"]["id"], "content_hash")
    for key, body in (("os_ml_create_connector", connector), ("os_ml_register_model", model),
                      ("os_search_pipeline_put", pipeline)):
        assert not spec_errors(key, body), key
    # a second run leaves one of each, the old ones undeployed and deleted first
    out2 = _run(args, env={"ESQBE_TOKEN": TOKEN})
    assert {k: v["status"] for k, v in out2.items()} == {"connector": "replaced", "model": "replaced",
                                                         "search_pipeline": "replaced"}
    assert len(canned.connectors) == len(canned.models) == len(canned.pipelines) == 1
    assert any(r["path"].endswith(f"/models/{out['model']['id']}/_undeploy") for r in canned.sent())
    removed = _run(["engine", "uninstall-reranker", "--backend", "opensearch", "--url", url])
    assert removed == {"search_pipeline": True, "model": True, "connector": True}
    assert not (canned.connectors or canned.models or canned.pipelines)


def test_install_needs_an_engine_and_a_server_url():
    r = CliRunner().invoke(main, ["engine", "install-reranker", "--server-url", "http://esqbe:8000"])
    assert r.exit_code != 0 and "--backend elasticsearch or opensearch" in r.output
    r = CliRunner().invoke(main, ["engine", "install-reranker", "--backend", "elasticsearch", "--url",
                                  "http://127.0.0.1:9", "--server-url", "ftp://x"])
    assert r.exit_code != 0 and "--server-url" in r.output


def test_the_documented_searches_are_valid_for_the_specs():
    """docs/engines.md's searches through the reranker: the retriever tree on Elasticsearch, the search with
    `ext.rerank` on OpenSearch, against the strict search-body schemas of tests/specs."""
    import re

    from .fakes.specs import schema_errors

    text = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text(encoding="utf-8")
    section = text[text.index("## esqbe as the cluster's reranker"):text.index("## Tests")]
    blocks = [json.loads(b.split("\n", 1)[1]) for b in re.findall(r"```json\n(POST [^\n]+\n\{.*?\n\})\n```", section, re.S)]
    assert len(blocks) == 2
    es, os_ = blocks
    assert es["retriever"]["text_similarity_reranker"]["inference_id"] == "esqbe-rerank"
    assert not schema_errors("elasticsearch", "search", es)
    assert os_["ext"]["rerank"]["query_context"]["query_text"].startswith("paper:")
    assert not schema_errors("opensearch", "search", os_)


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_stats_reports_the_reranker(engine, kind, version):
    url, canned = engine(kind, version)
    stats = ["stats", "--backend", kind, "--url", url, "--index", "papers", "--json"]
    part = "inference_endpoint" if kind == "elasticsearch" else "search_pipeline"
    assert _run(stats)["reranker"][part] is None
    installed = _run(["engine", "install-reranker", "--backend", kind, "--url", url, "--server-url", "http://esqbe:8000"])
    reranker = _run(stats)["reranker"]
    if kind == "elasticsearch":
        assert reranker == {"inference_endpoint": "esqbe-rerank", "service": "custom", "task_type": "rerank",
                            "calls": "http://esqbe:8000/rerank"}
    else:  # followed as the engine calls it: pipeline -> its model -> the model's connector -> the URL
        assert reranker == {"search_pipeline": "esqbe-rerank", "model": installed["model"]["id"],
                            "model_state": "DEPLOYED", "connector": installed["connector"]["id"],
                            "calls": "http://esqbe:8000/rerank", "document_fields": ["paper_id"]}
        canned.models.clear()  # the pipeline names a model that is gone: said so
        assert _run(stats)["reranker"]["model_state"] == "missing"


@pytest.mark.parametrize("show_paths", [False, True])
def test_the_servers_stats_report_the_installed_reranker_and_the_endpoints_bounds(engine, encoder, show_paths):
    """GET /stats of a real `esqbe serve` over an engine index: what of the reranker the cluster has (the URL it
    calls only with --show-paths, as the engine's own URL), and POST /rerank's bounds, equal to what the route and
    /openapi.json enforce."""
    import httpx

    from esqbe.backends.engines.opensearch import OpenSearchBackend
    from esqbe.domain import IndexMeta
    from esqbe.index.rerank import MAX_PAPER_ID_CHARS, MAX_RERANK_DOCUMENTS, MAX_RERANK_QUERY_CHARS
    from esqbe.server.app import create_app
    from esqbe.server.options import ServeOptions
    from esqbe.settings.config import load_settings

    from .conftest import LiveServer
    from .fakes.engines import make_papers

    url, canned = engine("opensearch", "3.5.0", index=None)
    backend = OpenSearchBackend(url, "papers")
    backend.ensure(IndexMeta(encoder.name, encoder.dim, "contextual", encoder.fingerprint))  # the server's model
    backend.upsert(make_papers(dim=encoder.dim))
    backend.close()
    installed = _run(["engine", "install-reranker", "--backend", "opensearch", "--url", url,
                      "--server-url", "http://esqbe:8000"])
    settings = load_settings(None).replace(backend="opensearch", url=url, index="papers")
    app = create_app(settings=settings, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", token=TOKEN, warm=False, readers=1, show_paths=show_paths))
    with LiveServer(app) as server:
        stats = httpx.get(server + "/stats", timeout=60).json()
        spec = httpx.get(server + "/openapi.json", timeout=60).json()["components"]["schemas"]["RerankRequest"]
    reranker = stats["reranker"]
    assert (reranker["search_pipeline"], reranker["model"], reranker["connector"], reranker["model_state"]) == \
        ("esqbe-rerank", installed["model"]["id"], installed["connector"]["id"], "DEPLOYED")
    assert reranker.get("calls") == ("http://esqbe:8000/rerank" if show_paths else None)
    rerank = stats["server"]["rerank"]
    assert rerank == {"enabled": True, "token_required": True, "request_timeout_s": ServeOptions().request_timeout,
                      "max_documents": MAX_RERANK_DOCUMENTS, "max_query_chars": MAX_RERANK_QUERY_CHARS,
                      "max_sentences": 64, "max_id_chars": MAX_PAPER_ID_CHARS, "fallbacks": {},
                      "max_text_sentences": 64}
    assert (rerank["max_documents"], rerank["max_query_chars"]) == \
        (spec["properties"]["documents"]["maxItems"], spec["properties"]["query"]["maxLength"])


def test_the_connector_emulation_evaluates_only_the_installed_script():
    """os_request_body (what the tests send esqbe as OpenSearch's connector would) evaluates the installed painless
    pre-process function term by term; a connector with another function (the built-in Cohere one that passed the
    query raw) or a changed script is refused rather than emulated wrongly."""
    from esqbe.backends.engines.reranker import OS_PRE_PROCESS, os_request_body

    body = os_connector_body("http://esqbe:8000", TOKEN)
    assert body["actions"][0]["pre_process_function"] == OS_PRE_PROCESS
    assert json.loads(os_request_body(body, 'a "b" \\ c', ["p1"])) == {"query": 'a "b" \\ c', "documents": ["p1"]}
    for script in ("connector.pre_process.cohere.rerank", OS_PRE_PROCESS.replace("params.query_text", "params.q"),
                   OS_PRE_PROCESS + " return '';"):
        body["actions"][0]["pre_process_function"] = script
        with pytest.raises(ValueError):
            os_request_body(body, "q", ["p1"])


# --- install-reranker as an operator's tool ---------------------------------------------------------
def _invoke(args, env=None):
    return CliRunner().invoke(main, args, env=env or {})


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_dry_run_prints_every_request_in_order_sends_nothing_and_redacts_the_token(engine, kind, version):
    url, canned = engine(kind, version)
    args = ["engine", "install-reranker", "--backend", kind, "--url", url, "--index", "papers",
            "--server-url", "http://esqbe:8000"]
    r = _invoke([*args, "--dry-run", "--json"], env={"ESQBE_TOKEN": TOKEN})
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["dry_run"] is True and canned.requests == []  # nothing sent, not even GET /
    assert TOKEN not in r.output and "<redacted>" in r.output
    text = _invoke([*args, "--dry-run"], env={"ESQBE_TOKEN": TOKEN})
    assert text.exit_code == 0 and TOKEN not in text.output and text.output.startswith("Dry run: nothing sent")
    assert canned.requests == []
    # the plan is what an install over an earlier one sends: same methods and paths, in order (ids aside)
    _run(args, env={"ESQBE_TOKEN": TOKEN})
    canned.requests.clear()
    _run(args, env={"ESQBE_TOKEN": TOKEN})
    sent = [(x["method"], x["path"]) for x in canned.sent()]
    planned = [(x["method"], x["path"]) for x in plan["requests"]]

    def shape(reqs):
        import re as _re
        return [(m, _re.sub(r"/(c|m)\d+(/|$)", r"/ID\2", _re.sub(r"/(EARLIER_)?(MODEL|CONNECTOR)_ID", "/ID", p)))
                for m, p in reqs]
    assert shape(planned) == shape(sent)
    written = [x for x in plan["requests"] if x["method"] in ("PUT", "POST") and x["body"] and "_search" not in x["path"]]
    assert written and all(x["when"] for x in plan["requests"])


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_install_refuses_a_missing_index_or_one_not_esqbes_before_writing(engine, kind, version):
    url, canned = engine(kind, version, index=None)
    base = ["engine", "install-reranker", "--backend", kind, "--url", url, "--server-url", "http://esqbe:8000"]
    r = _invoke([*base, "--index", "papers"])
    assert r.exit_code != 0 and "does not exist" in r.output and "404" in r.output and "Traceback" not in r.output
    assert not [x for x in canned.requests if x["method"] in ("PUT", "POST", "DELETE")]
    from esqbe.backends.engines.elasticsearch import ElasticsearchBackend
    from esqbe.backends.engines.opensearch import OpenSearchBackend

    plain = (ElasticsearchBackend if kind == "elasticsearch" else OpenSearchBackend)(url, "theirs")
    plain.client.indices.create(index="theirs", body={"mappings": {"properties": {"title": {"type": "text"}}}})
    plain.close()
    canned.requests.clear()
    r = _invoke([*base, "--index", "theirs"])
    assert r.exit_code != 0 and "not an esqbe index" in r.output and "esqbe attach" in r.output
    assert not [x for x in canned.requests if x["method"] in ("PUT", "DELETE") or "_plugins" in x["path"]]
    if kind == "opensearch":  # an id field the index does not have: named, nothing written
        url, canned = engine(kind, version)
        r = _invoke(["engine", "install-reranker", "--backend", kind, "--url", url, "--server-url",
                     "http://esqbe:8000", "--index", "papers", "--id-field", "pid"])
        assert r.exit_code != 0 and "--id-field" in r.output and "paper_id" in r.output
        assert not [x for x in canned.requests if "_plugins" in x["path"] or "_search/pipeline" in x["path"]]


def test_an_unreachable_cluster_is_reported_within_the_connect_timeout():
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a silent one: a listener that never accepts, its queue full, so the kernel drops the next handshakes
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(silent.getsockname())
        fillers.append(c)
    for url, timeout in ((f"http://127.0.0.1:{port}", "5"), (f"http://127.0.0.1:{silent.getsockname()[1]}", "1")):
        t = time.perf_counter()
        r = _invoke(["engine", "install-reranker", "--backend", "elasticsearch", "--url", url, "--index", "papers",
                     "--server-url", "http://esqbe:8000", "--connect-timeout", timeout])
        elapsed = time.perf_counter() - t
        assert r.exit_code != 0 and "cannot connect to" in r.output and "Traceback" not in r.output, r.output
        assert elapsed < float(timeout) + 1.5, elapsed
    for c in (*fillers, silent):
        c.close()
    r = _invoke(["engine", "install-reranker", "--backend", "elasticsearch", "--url", "http://elastic:S3CRET@127.0.0.1:"
                 f"{port}", "--server-url", "http://esqbe:8000"])
    assert r.exit_code != 0 and "S3CRET" not in r.output and "***@127.0.0.1" in r.output


@pytest.mark.parametrize("kind,version", [("elasticsearch", "9.2.0"), ("opensearch", "3.5.0")])
def test_the_outcome_is_a_readable_summary(engine, kind, version):
    url, canned = engine(kind, version)
    base = ["--backend", kind, "--url", url, "--index", "papers"]
    r = _invoke(["engine", "install-reranker", *base, "--server-url", "http://esqbe:8000"])
    assert r.exit_code == 0, r.output
    first, *rest = r.output.splitlines()
    assert first.startswith(f"esqbe's reranker in {kind} at {url}") and "http://esqbe:8000/rerank" in first
    assert "{" not in first and any("created" in line for line in rest)
    assert ("search_pipeline=esqbe-rerank" if kind == "opensearch" else "inference_id") in r.output
    r = _invoke(["engine", "uninstall-reranker", *base])
    assert r.exit_code == 0 and "removed" in r.output and "{" not in r.output


@pytest.mark.parametrize("command", ["install-reranker", "uninstall-reranker"])
def test_help_shows_only_the_options_that_apply(command):
    r = _invoke(["engine", command, "--help"])
    assert r.exit_code == 0
    assert "--path" not in r.output and "embedded" not in r.output
    for flag in ("--url", "--index", "--backend", "--dry-run", "--json", "--connect-timeout", "--name"):
        assert flag in r.output

"""esqbe's POST /rerank installed in an engine as its reranker: the request bodies that create it (Elasticsearch: an
inference endpoint of the `custom` service, task type `rerank`; OpenSearch: an ML Commons HTTP connector with a
painless pre-process function (OS_PRE_PROCESS) and the Cohere rerank post-process function, a remote model over it,
a search pipeline with the `rerank` processor), and the engines' template substitution, so a test sends esqbe
exactly the body the engine would build from them."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from ...errors import BackendError, ParameterError
from .client import _exc_reason
from .names import check_reranker_name, path_segment

#: the request template of the Elasticsearch `custom` service: `${query}` becomes the query as a JSON string and
#: `${input}` the documents as a JSON array of strings (templates are not quoted, the service encodes them)
ES_REQUEST_TEMPLATE = '{"query": ${query}, "documents": ${input}}'
#: JSON paths the `custom` service reads from esqbe's answer
ES_JSON_PARSER = {"reranked_index": "$.results[*].index", "relevance_score": "$.results[*].relevance_score"}
#: the OpenSearch connector's pre-process function, a painless script (not the built-in
#: `connector.pre_process.cohere.rerank`, which hands the query over as a plain string parameter: ml-commons escapes
#: such a string for JSON only when it does not itself parse as a JSON object or array, so a free-text query such as
#: `{"method": "graph"}` went into the quoted `"${parameters.query}"` raw and broke the body). ml-commons (2.12+,
#: ConnectorUtils.escapeMLInput) escapes the rerank processor's `query_text` and `text_docs` for a JSON string before
#: a custom script runs, so the script puts them between quotes as they come; it returns the whole request as one
#: object, which ml-commons parses (gson), serialises again (convertScriptStringToJsonString: gson.toJson, so every
#: character is escaped by a JSON writer) and, being JSON, does not escape a second time
#: (escapeRemoteInferenceInputData). Only the three terms `os_request_body` evaluates may appear in it.
OS_PRE_PROCESS = ("return '{\"parameters\": {\"body\": {\"query\": \"' + params.query_text + '\", \"documents\": [\"' "
                  "+ params.text_docs.join('\", \"') + '\"]}}}';")
#: the connector's request body: the object the pre-process function built
OS_REQUEST_TEMPLATE = "${parameters.body}"
OS_POST_PROCESS = "connector.post_process.cohere.rerank"
#: the document field the engines send to esqbe: the paper id esqbe indexed (or the id field given to `esqbe attach`)
DEFAULT_ID_FIELD = "paper_id"


def rerank_url(server_url: str) -> str:
    """esqbe's POST /rerank under `server_url` (http or https, a host, no query or fragment)."""
    parts = urlsplit(server_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ParameterError(f"--server-url: expected http(s)://HOST[:PORT][/PATH] of `esqbe serve` (got {server_url!r})")
    return server_url.strip().rstrip("/") + "/rerank"


def es_inference_body(server_url: str, token: str | None = None) -> dict:
    """The body of `PUT _inference/rerank/{id}`: the `custom` service calling esqbe's POST /rerank, the token (if
    the server has one) as a secret parameter the engine stores encrypted and sends as `Authorization: Bearer`."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer ${api_key}"
    return {"service": "custom",
            "service_settings": {"url": rerank_url(server_url), "headers": headers,
                                 "secret_parameters": {"api_key": token} if token else {},
                                 "request": ES_REQUEST_TEMPLATE, "response": {"json_parser": dict(ES_JSON_PARSER)}}}


def es_request_body(body: dict, query: str, documents: Sequence[str]) -> bytes:
    """What the `custom` service of `body` sends esqbe for a rerank of `documents` against `query`: its request
    template with `${query}` and `${input}` replaced by their JSON."""
    template = body["service_settings"]["request"]
    return template.replace("${query}", json.dumps(query)).replace("${input}", json.dumps(list(documents))).encode()


def os_connector_body(server_url: str, token: str | None = None, name: str = "esqbe-rerank") -> dict:
    """The body of `POST _plugins/_ml/connectors/_create`: an HTTP connector to esqbe's POST /rerank with the painless
    pre-process function OS_PRE_PROCESS (a text_similarity input in, any text escaped) and the Cohere rerank
    post-process function (one score per document out, in input order)."""
    headers = {"Content-Type": "application/json"}
    # the spec has `version` an integer and `credential` required (the blueprints' "version": "1" is refused by it)
    body: dict = {"name": name, "description": "esqbe aspect reranking (esqbe engine install-reranker)", "version": 1,
                  "protocol": "http", "parameters": {}, "credential": {}}
    if token:
        headers["Authorization"] = "Bearer ${credential.esqbe_token}"
        body["credential"] = {"esqbe_token": token}
    body["actions"] = [{"action_type": "predict", "method": "POST", "url": rerank_url(server_url), "headers": headers,
                        "request_body": OS_REQUEST_TEMPLATE, "pre_process_function": OS_PRE_PROCESS,
                        "post_process_function": OS_POST_PROCESS}]
    return body


def os_request_body(body: dict, query: str, documents: Sequence[str]) -> bytes:
    """What the connector of `body` sends esqbe for the rerank processor's `query_text` and `text_docs`, by
    ml-commons' steps for a painless pre-process function (ConnectorUtils.processInput, 2.12 to 3.x): the inputs
    escaped for a JSON string (escapeMLInput: gson's escape without its quotes), the installed script evaluated on
    them, its output parsed and every non-string parameter serialised again (convertScriptStringToJsonString), the
    parameters that are not JSON escaped (escapeRemoteInferenceInputData), then put into the request body template."""
    action = body["actions"][0]

    def gson_escape(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)[1:-1]

    script_out = _painless_return(action["pre_process_function"],
                                  {"query_text": gson_escape(query), "text_docs": [gson_escape(d) for d in documents]})
    parameters = json.loads(script_out)["parameters"]
    strings = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"))
               for k, v in parameters.items()}
    out = action["request_body"]
    for key, value in strings.items():
        if not _is_json_container(value):  # Apache commons-text escapeJson
            value = json.dumps(value, ensure_ascii=False)[1:-1].replace("/", "\\/")
        out = out.replace("${parameters." + key + "}", value)
    return out.encode()


_PAINLESS_TERM = re.compile(r"\s*(?:'([^'\\]*)'|params\.(query_text)|params\.text_docs\.join\('([^'\\]*)'\))\s*(\+|;\s*$)")


def _painless_return(script: str, params: dict) -> str:
    """The value of a painless `return T + T + ... ;` whose terms are single-quoted literals, `params.query_text` and
    `params.text_docs.join('SEP')`: what the installed pre-process function is. Anything else is refused, so a
    changed script fails the tests that call this instead of being emulated wrongly."""
    rest = script.strip()
    if not rest.startswith("return "):
        raise ValueError("not a `return ...;` script")
    rest, out = rest[len("return "):], []
    while rest:
        m = _PAINLESS_TERM.match(rest)
        if not m:
            raise ValueError(f"cannot evaluate the painless script at {rest[:40]!r}")
        literal, field_, sep = m.group(1), m.group(2), m.group(3)
        out.append(literal if literal is not None else params["query_text"] if field_ else sep.join(params["text_docs"]))
        rest = rest[m.end():]
        if m.group(4).startswith(";"):
            break
    if rest.strip():
        raise ValueError("text after the return statement")
    return "".join(out)


def _is_json_container(text: str) -> bool:
    try:
        return isinstance(json.loads(text), (dict, list))
    except ValueError:
        return False


def os_model_body(connector_id: str, name: str = "esqbe-rerank") -> dict:
    """The body of `POST _plugins/_ml/models/_register` for the remote model over the connector."""
    return {"name": name, "function_name": "remote", "description": "esqbe aspect reranking", "connector_id": connector_id}


def os_pipeline_body(model_id: str, id_field: str = DEFAULT_ID_FIELD) -> dict:
    """The body of `PUT _search/pipeline/{id}`: the `rerank` response processor calling the model with each hit's
    `id_field` as its document (the query comes from the search's `ext.rerank.query_context`).

    Zero hits, as neural-search and ml-commons handle them (read in their source): RescoringRerankProcessor.rerank
    returns the response untouched when the search's *total* hits are 0 (esqbe is not called); a page past the end
    (total > 0, no hits on the page) goes on with an empty document list, which ml-commons refuses before the
    connector (TextSimilarityInputDataSet: "No text documents provided") and the search would fail. Hence
    `ignore_failure`: any failure of the processor (that one, esqbe down or slow) leaves the engine's own order
    instead of failing the cluster's search."""
    return {"description": "esqbe aspect reranking (esqbe engine install-reranker)",
            "response_processors": [{"rerank": {"ignore_failure": True, "ml_opensearch": {"model_id": model_id},
                                                "context": {"document_fields": [id_field]}}}]}


# --- installing ---------------------------------------------------------------------------------------------
class DryRun:
    """A stand-in for the backend in `install_reranker` / `uninstall_reranker` (`--dry-run`): nothing is sent; each
    request is recorded with when it would be sent, and answered as if every part of an earlier install existed
    (so the plan shows the deletes too) with placeholders for the ids the engine would give."""

    def __init__(self, engine: str, url: str):
        self.name, self.url = engine, url
        self.requests: list[dict] = []

    def answer(self, method: str, path: str, body: dict | None) -> dict | None:
        if path.startswith("/_inference/") and method == "GET":
            return {"endpoints": [{"service": "custom", "service_settings": {}}]}  # an earlier one: replaced
        if path.endswith("/_create"):
            return {"connector_id": "CONNECTOR_ID"}
        if path.endswith("/_register?deploy=true"):
            return {"model_id": "MODEL_ID"}
        if path.endswith("/_search"):
            kind = "model_id" if "/models/" in path else "connector_id"
            return {"hits": {"hits": [{"_id": f"EARLIER_{kind.upper()}", "_source": {"algorithm": "REMOTE"}}]}}
        return {}


#: when a request of the plan is sent (dry run), by (method, path prefix)
_WHEN = [(("GET", "/_inference/"), "always: is an endpoint of that name there, and the same?"),
         (("DELETE", "/_inference/"), "only where an endpoint of that name exists (and differs, or a token is given)"),
         (("PUT", "/_inference/"), "unless the same endpoint exists"),
         (("DELETE", "/_search/pipeline/"), "always (a missing pipeline is no error)"),
         (("POST", "/_plugins/_ml/models/_search"), "always: earlier models of that name"),
         (("POST", "/_plugins/_ml/connectors/_search"), "always: earlier connectors of that name"),
         (("POST", "/_plugins/_ml/models/EARLIER"), "for each earlier model found"),
         (("DELETE", "/_plugins/_ml/"), "for each earlier model / connector found")]


def _when(method: str, path: str) -> str:
    return next((w for (m, prefix), w in _WHEN if m == method and path.startswith(prefix)), "always")


def redact(value, secrets: Sequence[str]):
    """`value` (a request body) with every string holding one of `secrets` replaced by "<redacted>"."""
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str) and any(s and s in value for s in secrets):
        return "<redacted>"
    return value


def _request(backend, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False):
    """One engine request on the backend's own client (its credentials, TLS and retries); a 404 is None when
    `missing_ok`, every other failure a BackendError naming the call. On a DryRun: recorded, not sent."""
    if isinstance(backend, DryRun):
        backend.requests.append({"method": method, "path": path, "body": body, "when": _when(method, path)})
        return backend.answer(method, path, body)

    def send():
        if backend.name == "elasticsearch":
            headers = {"accept": "application/json", **({"content-type": "application/json"} if body is not None else {})}
            return backend._body(backend.client.perform_request(method, path, headers=headers, body=body))
        return backend.client.transport.perform_request(method, path, body=body)

    try:
        return backend._call(send)
    except Exception as e:
        if missing_ok and backend._status(e) == 404:
            return None
        raise BackendError(f"{backend.name} at {backend.url}: {method} {path} failed: {_exc_reason(e)}") from e


def install_reranker(backend, server_url: str, *, token: str | None = None, name: str = "esqbe-rerank",
                     id_field: str = DEFAULT_ID_FIELD) -> dict:
    """Create esqbe's reranker in the engine of `backend`, idempotently: what exists under `name` and already
    calls this server the same way is kept ("unchanged"), anything else under that name is replaced.
    Elasticsearch: the inference endpoint `rerank/{name}`; OpenSearch: connector, model (registered and
    deployed) and search pipeline, all named `name`. Returns what was done, per part."""
    check_reranker_name(backend.name, name)
    if backend.name == "elasticsearch":
        body = es_inference_body(server_url, token)
        path = f"/_inference/rerank/{path_segment(name)}"
        found = _request(backend, "GET", path, missing_ok=True)
        current = next(iter((found or {}).get("endpoints") or []), None)
        same = current is not None and token is None and _es_same(current, body)  # a stored secret cannot be read
        if same:
            return {"inference_endpoint": {"id": name, "status": "unchanged"}}
        if current is not None:
            _request(backend, "DELETE", path, missing_ok=True)
        _request(backend, "PUT", path, body)
        return {"inference_endpoint": {"id": name, "status": "replaced" if current is not None else "created"}}
    out: dict = {}
    removed = uninstall_reranker(backend, name=name)
    connector = _request(backend, "POST", "/_plugins/_ml/connectors/_create", os_connector_body(server_url, token, name))
    connector_id = connector["connector_id"]
    out["connector"] = {"id": connector_id, "status": "replaced" if removed.get("connector") else "created"}
    model = _request(backend, "POST", "/_plugins/_ml/models/_register?deploy=true", os_model_body(connector_id, name))
    model_id = model.get("model_id")
    if not model_id:
        raise BackendError(f"opensearch at {backend.url}: registering the model gave no model_id ({str(model)[:200]})")
    out["model"] = {"id": model_id, "status": "replaced" if removed.get("model") else "created"}
    _request(backend, "PUT", f"/_search/pipeline/{path_segment(name)}", os_pipeline_body(model_id, id_field))
    out["search_pipeline"] = {"id": name, "status": "replaced" if removed.get("search_pipeline") else "created"}
    return out


def _es_same(current: dict, body: dict) -> bool:
    settings, want = current.get("service_settings") or {}, body["service_settings"]
    return current.get("service") == body["service"] and all(settings.get(k) == want[k] for k in ("url", "request", "response"))


def uninstall_reranker(backend, *, name: str = "esqbe-rerank") -> dict:
    """Remove what `install_reranker` created under `name` (absent parts are no error). Returns what was removed."""
    check_reranker_name(backend.name, name)
    if backend.name == "elasticsearch":
        gone = _request(backend, "DELETE", f"/_inference/rerank/{path_segment(name)}", missing_ok=True)
        return {"inference_endpoint": gone is not None}
    removed = {"search_pipeline": _request(backend, "DELETE", f"/_search/pipeline/{path_segment(name)}",
                                           missing_ok=True) is not None}
    query = {"query": {"term": {"name.keyword": name}}, "size": 100}
    models = _request(backend, "POST", "/_plugins/_ml/models/_search", query, missing_ok=True) or {}
    model_ids = [h["_id"] for h in (models.get("hits") or {}).get("hits", [])
                 if (h.get("_source") or {}).get("algorithm", "REMOTE").upper() == "REMOTE"]
    for mid in model_ids:
        _request(backend, "POST", f"/_plugins/_ml/models/{path_segment(mid)}/_undeploy", missing_ok=True)
        _request(backend, "DELETE", f"/_plugins/_ml/models/{path_segment(mid)}", missing_ok=True)
    removed["model"] = bool(model_ids)
    connectors = _request(backend, "POST", "/_plugins/_ml/connectors/_search", query, missing_ok=True) or {}
    connector_ids = [h["_id"] for h in (connectors.get("hits") or {}).get("hits", [])]
    for cid in connector_ids:
        _request(backend, "DELETE", f"/_plugins/_ml/connectors/{path_segment(cid)}", missing_ok=True)
    removed["connector"] = bool(connector_ids)
    return removed


def reranker_status(backend, *, name: str = "esqbe-rerank") -> dict:
    """What of esqbe's reranker exists under `name` (for `esqbe stats` and GET /stats), followed the way the engine
    calls it. Elasticsearch: the inference endpoint, its service and task type, the URL it calls. OpenSearch: the
    search pipeline, the model its rerank processor names (and the model's state), the model's connector and the URL
    that calls, the document fields sent. A part not there is None."""
    check_reranker_name(backend.name, name)
    if backend.name == "elasticsearch":
        found = _request(backend, "GET", f"/_inference/rerank/{path_segment(name)}", missing_ok=True)
        current = next(iter((found or {}).get("endpoints") or []), None) or {}
        return {"inference_endpoint": name if current else None, "service": current.get("service"),
                "task_type": current.get("task_type"), "calls": (current.get("service_settings") or {}).get("url")}
    out: dict = {"search_pipeline": None, "model": None, "model_state": None, "connector": None, "calls": None,
                 "document_fields": None}
    found = _request(backend, "GET", f"/_search/pipeline/{path_segment(name)}", missing_ok=True) or {}
    pipeline = found.get(name) if isinstance(found.get(name), dict) else None
    if pipeline is None:
        return out
    out["search_pipeline"] = name
    rerank: dict = next((p["rerank"] for p in pipeline.get("response_processors") or []
                         if isinstance(p, dict) and isinstance(p.get("rerank"), dict)), {})
    out["document_fields"] = (rerank.get("context") or {}).get("document_fields")
    model_id = (rerank.get("ml_opensearch") or {}).get("model_id")
    if not isinstance(model_id, str) or not model_id:
        return out
    out["model"] = model_id
    model = _request(backend, "GET", f"/_plugins/_ml/models/{path_segment(model_id)}", missing_ok=True)
    if not model:
        out["model_state"] = "missing"
        return out
    out["model_state"] = model.get("model_state")
    connector_id = model.get("connector_id")
    if not isinstance(connector_id, str) or not connector_id:
        return out
    out["connector"] = connector_id
    connector = _request(backend, "GET", f"/_plugins/_ml/connectors/{path_segment(connector_id)}", missing_ok=True) or {}
    out["calls"] = next((a.get("url") for a in connector.get("actions") or []
                         if isinstance(a, dict) and a.get("action_type", "").lower() == "predict"), None)
    return out

"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis), over a real index
with the real model: whatever is sent, the answer is documented JSON with a documented status, never a
server error. Bounded: a fixed number of examples per operation, derandomized, and a time budget."""
from __future__ import annotations

import shutil
import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from esqbe.server.app import create_app  # noqa: E402
from esqbe.server.options import ServeOptions  # noqa: E402

from .conftest import LiveServer  # noqa: E402

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OPERATIONS = ["POST /query", "POST /graph", "GET /papers/{paper_id}", "GET /search", "POST /papers", "DELETE /papers/{paper_id}",
              "GET /stats", "GET /health", "POST /watches", "GET /watches", "GET /watches/{name}.atom",
              "POST /rerank"]
EXAMPLES = 25
BUDGET_S = 120  # per operation; far above what it takes here (a few seconds)


@pytest.fixture(scope="module")
def server_url(index_dir_30, encoder, tmp_path_factory):
    """A real server over HTTP (schemathesis' in-process ASGI calls run the app's lifespan on every request),
    private and on loopback: every request goes through the perimeter (Host, token, Origin, content types)."""
    path = tmp_path_factory.mktemp("fuzz") / "index"
    shutil.copytree(index_dir_30, path)
    app = create_app(str(path), config=None, encoder=encoder,
                     options=ServeOptions(host="127.0.0.1", token=TOKEN, private=True, max_body_bytes=256 * 1024,
                                          max_batch_records=20, write_lock_timeout=5))
    with LiveServer(app) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(server_url):
    """The schema as the server documents it. A request the schema forbids must be refused: schemathesis counts
    400, 401, 403, 404, 405, 406, 409, 415, 422, 428, 429 as refusals, not 413, which the perimeter answers to a body
    past `max_body_bytes` before it reads it (a negative example can be a 766 KB body). 413 is a refusal too, and
    status_code_conformance still holds it to the statuses each operation documents (each with a body documents
    413: test_every_operation_with_a_body_documents_413)."""
    from schemathesis.config._checks import NegativeDataRejectionConfig

    schema = schemathesis.openapi.from_url(server_url + "/openapi.json")
    refusals = NegativeDataRejectionConfig().expected_statuses
    schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(expected_statuses=[*refusals, "413"])
    return schema


def test_every_operation_with_a_body_documents_413(server_url):
    """The perimeter refuses any body past the limit with 413 whichever operation it is for, so each operation that
    takes a body documents 413, and answers it to a real over-limit body (JSON, as the schema asks)."""
    import httpx

    doc = httpx.get(server_url + "/openapi.json", timeout=30).json()
    with_body = [(m.upper(), path) for path, ops in doc["paths"].items() for m, op in ops.items() if "requestBody" in op]
    assert {f"{m} {p}" for m, p in with_body} == {"POST /query", "POST /graph", "POST /papers", "POST /watches",
                                                  "POST /rerank"}
    big = b'{"text": "' + b"a" * (300 * 1024) + b'"}'
    for method, path in with_body:
        assert "413" in doc["paths"][path][method.lower()]["responses"], (method, path)
        r = httpx.request(method, server_url + path, content=big, timeout=30,
                          headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 413, (method, path, r.status_code, r.text[:200])
        assert r.json()["error"]["status"] == 413


def test_the_schema_lists_every_operation(api_schema):
    labels = {op.ok().label for op in api_schema.get_all_operations()}
    assert labels == set(OPERATIONS)


@pytest.mark.parametrize("label,mode", [(op, "positive") for op in OPERATIONS] +
                         [(op, "negative") for op in ("POST /query", "POST /graph", "GET /search", "POST /papers",
                                                                        "POST /watches", "POST /rerank")])
def test_every_answer_is_documented(label, mode, api_schema, server_url):
    """positive: requests the schema allows; negative: requests it forbids (which must be refused with 4xx).
    (The other operations take nothing a request could get wrong but the path, which any string fits.)"""
    operation = api_schema.find_operation_by_label(label)
    start = time.monotonic()
    seen = []

    @given(case=operation.as_strategy(GenerationMode(mode)))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def fuzz(case):
        if time.monotonic() - start > BUDGET_S:
            return
        # every check but "schema-valid data is accepted": a valid query can still be unanswerable (its paper has
        # no sentence of the facet asked for: 400), which the other checks hold to the documented statuses
        response = case.call_and_validate(base_url=server_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                                          excluded_checks=[positive_data_acceptance])
        seen.append(response.status_code)
        assert response.status_code < 500

    fuzz()
    assert seen, "no example ran"


def _edges():
    """Each declared, HTTP-settable number of each rescorer: its bounds (accepted) and just past them (refused)."""
    from esqbe.rescore.rescorers import available_rescorers, rescorer_params

    for name in available_rescorers():
        for p in rescorer_params(name):
            if p.http and p.type in (int, float):
                step = 1 if p.type is int else p.low / 2
                yield name, p.name, [p.low, p.high], [p.low - step, p.high * 2, "many", None, True]


@pytest.mark.parametrize("rescorer,param,inside,outside", list(_edges()))
def test_rescorer_parameter_bounds_over_http(rescorer, param, inside, outside, server_url):
    """The negative cases of the rescorers' declared bounds (the schema's minimum/maximum), and the bounds
    themselves answered in time (a worst-case parameter is bounded to seconds: no 5xx, no deadline)."""
    import httpx

    body = {"paper_id": "csabstruct-train-0000", "rescorer": rescorer, "k": 3}
    for value in outside:
        r = httpx.post(server_url + "/query", json={**body, "rescorer_params": {param: value}}, timeout=60, headers=AUTH)
        assert r.status_code == 422 and param in r.json()["error"]["message"], (value, r.text)
    for value in inside:
        r = httpx.post(server_url + "/query", json={**body, "rescorer_params": {param: value}}, timeout=60, headers=AUTH)
        assert r.status_code == 200, (value, r.text)

"""POST /query with `examples` and `avoid` on a real server app over a real index: the same ranking as
the Python API, every refusal with its status, and every bound in the OpenAPI schema."""
from __future__ import annotations

import pytest

import esqbe
from esqbe.core.limits import MAX_AVOID, MAX_EXAMPLE_SENTENCES, MAX_EXAMPLES

from .test_server import _client, _error, _ready

A, B, C, NO_RESULT = "csabstruct-train-0000", "csabstruct-train-0001", "csabstruct-train-0002", "csabstruct-train-0005"


@pytest.fixture(scope="module")
def client(index_copy, encoder):
    with _client(index_copy, encoder, max_query_sentences=8) as c:
        yield _ready(c)


def test_examples_and_avoid_rank_as_the_python_api(client, index_copy, encoder):
    body = {"examples": [{"paper_id": A}, {"paper_id": B, "sentences": [0, 2]}], "avoid": [{"paper_id": C}],
            "facet": "method", "k": 30}
    r = client.post("/query", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    with esqbe.open_index(str(index_copy), encoder=encoder, config=None, create=False) as index:
        direct = index.query(examples=[A, {"paper_id": B, "sentences": [0, 2]}], avoid=[C], facet="method", k=30)
    assert [(h["paper_id"], round(h["score"], 6)) for h in data["hits"]] == \
        [(h.paper_id, round(h.score, 6)) for h in direct.hits]
    assert not {A, B, C} & {h["paper_id"] for h in data["hits"]}
    assert [e["paper_id"] for e in data["query"]["examples"]] == [A, B] and data["query"]["avoid"][0]["paper_id"] == C
    hit = data["hits"][0]
    assert len(hit["example_similarities"]) == 2 and hit["avoided"][0]["paper_id"] == C
    assert {m["example"] for h in data["hits"] for m in h["matches"]} == {0, 1}
    # a pasted text is one more example; a single paper with papers to avoid needs no `examples`
    r = client.post("/query", json={"examples": [{"paper_id": A, "facet": "method"},
                                                 {"text": "We train a parser. It is fast."}], "k": 3})
    assert r.status_code == 200, r.text
    assert r.json()["query"]["examples"][1]["paper_id"] is None
    r = client.post("/query", json={"paper_id": A, "facet": "method", "avoid": [{"paper_id": C}], "k": 3})
    assert r.status_code == 200 and r.json()["query"]["avoid"][0]["paper_id"] == C


def test_bad_examples(client):
    q = lambda **body: client.post("/query", json=body)  # noqa: E731
    _error(q(examples=[{"paper_id": A}, {"paper_id": A}]), 400, "given twice")
    _error(q(examples=[{"paper_id": A}, {"paper_id": B}], avoid=[{"paper_id": B}]), 400, "both an example and to avoid")
    _error(q(examples=[{"paper_id": A}], avoid=[{"paper_id": C}, {"paper_id": C}]), 400, "given twice")
    _error(q(examples=[{"paper_id": A}, {"paper_id": "nope-1"}], avoid=[{"paper_id": "nope-2"}]), 404,
           "nope-1, nope-2 are not in the index")
    _error(q(examples=[{"paper_id": A}], avoid=[{"paper_id": NO_RESULT}], facet="result"), 400, "no sentence labelled")
    _error(q(examples=[]), 422, "at least 1")
    _error(q(examples=[{"paper_id": f"p{i}"} for i in range(MAX_EXAMPLES + 1)]), 422, f"at most {MAX_EXAMPLES}")
    _error(q(examples=[{"paper_id": A}], avoid=[{"paper_id": f"p{i}"} for i in range(MAX_AVOID + 1)]), 422,
           f"at most {MAX_AVOID}")
    _error(q(examples=[{"paper_id": A}], paper_id=B), 422, "not both")
    _error(q(examples=[{"paper_id": A, "facet": "method", "sentences": [0]}]), 422, "either facet or sentences")
    _error(q(examples=[{"paper_id": A, "text": "x"}]), 422, "exactly one")
    _error(q(examples=[{"paper_id": A}], avoid=[{"text": "x"}]), 422, "paper_id")
    _error(q(examples=[{"paper_id": A, "sentences": [0, 1, 2, 3]}, {"paper_id": B, "sentences": [0, 1, 2, 3, 4]}]),
           413, "at most 8")  # the server's max_query_sentences, all examples together
    _error(q(examples=[{"paper_id": A}, {"text": "   "}]), 400, "no sentences")


def test_every_bound_is_in_the_schema(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    props = schema["QueryRequest"]["properties"]
    assert props["examples"]["maxItems"] == MAX_EXAMPLES and props["examples"]["minItems"] == 1
    assert props["avoid"]["maxItems"] == MAX_AVOID
    example = schema["ExampleRequest"]["properties"]
    assert example["sentences"]["maxItems"] == MAX_EXAMPLE_SENTENCES and example["paper_id"]["maxLength"] == 512
    assert {"maxLength", "type"} <= set(example["text"]["anyOf"][0])
    assert schema["AvoidRequest"]["properties"]["paper_id"]["maxLength"] == 512
    assert props["avoid_weight"]["maximum"] == 4.0 and set(props["avoid_rule"]["enum"]) == {"margin", "rocchio"}
    hit = schema["Hit"]["properties"]
    assert "example_similarities" in hit and "avoided" in hit
